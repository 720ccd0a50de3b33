// Small readings and writings of API objects shared by the controller and the local control
// plane: metav1.Time values (RFC 3339, whole seconds, UTC) and a pod's GPU request.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "operator/kube/client.h"

namespace kt::kube {

// "2026-11-30T22:38:58Z".
std::string rfc3339(std::chrono::system_clock::time_point t);
std::string now_rfc3339();
// nullopt for "" or text that is not "YYYY-MM-DDTHH:MM:SS…".
std::optional<std::chrono::system_clock::time_point> parse_rfc3339(const std::string& text);

// One line of a watch stream, {"type": "ADDED", "object": {...}}, as the REST client reads it.
// Throws kt::Error naming what is wrong: not JSON (or nested deeper than api::parse_json allows),
// an unknown type, an object that is not an object, or one without the metadata the informer
// keys its cache by (metadata.name, and namespace and resourceVersion when present, strings; a
// BOOKMARK carries only resourceVersion). An ERROR event's object is a metav1.Status.
WatchEvent parse_watch_event(const std::string& line);
// The frame parse_watch_event reads back: {"type": ..., "object": ...} on one line, no newline.
std::string watch_event_line(const WatchEvent& event);

// resourceVersions are opaque to clients, but every API server (etcd's revision) and the local
// store issue increasing integers, which is what client-go's MutationCache compares too.
// -1 for "" or text that is not a non-negative integer of at most 18 digits.
std::int64_t version_number(const std::string& version);
// metadata.resourceVersion of `object` as version_number() reads it (-1 when absent).
std::int64_t resource_version_number(const Object& object);

// What a pod asks for of `resource` ("cpu" in cores, "memory" in bytes, "nvidia.com/gpu"): per
// container its requests, or its limits when it has no request (the API server's defaulting),
// summed over containers.
double pod_request(const Object& pod, const std::string& resource);
// The nvidia.com/gpu a pod asks for: per container its requests, or its limits when it has no
// request (the API server's defaulting), summed over containers.
double pod_gpu_request(const Object& pod);

}  // namespace kt::kube

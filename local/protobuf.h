// Kubernetes' protobuf encoding of request bodies (application/vnd.kubernetes.protobuf), decoded
// to the JSON the Store keeps, for the kinds clients send that way to `kubetrain local serve`:
// client-go's typed clients (Helm's release storage among them) create and update Secrets,
// ConfigMaps and Namespaces in protobuf whatever the server prefers, while accepting JSON
// answers. Format: the 4 bytes "k8s\0", then a runtime.Unknown {typeMeta {apiVersion, kind},
// raw} whose `raw` is the object's message (k8s.io/api core/v1 generated.proto; field numbers
// there). Fields this decoder does not know are skipped, as protobuf readers do.
#pragma once

#include <string>
#include <string_view>

#include "operator/kube/client.h"

namespace kt::local {

inline constexpr const char* kProtobufContentType = "application/vnd.kubernetes.protobuf";

// The object as JSON; throws ApiError 415 for a kind it cannot decode and 400 for a malformed
// body (truncated, wrong magic, nesting deeper than 32).
kube::Object decode_kubernetes_protobuf(std::string_view body);

}  // namespace kt::local

// The Kubernetes object API as kubetrain's operator sees it: JSON objects in typed collections,
// read, written and watched through one interface. Two implementations:
//   * local::Store  (local/) — the in-process local control plane (`kubetrain run`);
//   * kube::RestClient (operator/kube/) — HTTP to a real API server or `kubetrain local serve`.
// The controller (operator/controller/) only ever talks to a `Client`, so the same reconciler runs
// in-process and against a cluster. This header knows nothing of TrainingJobs or of HTTP.
//
// Semantics follow the Kubernetes API conventions (api-conventions.md):
//   * `metadata.resourceVersion` is an opaque string; update() with a stale one throws Conflict;
//   * create() of an existing name throws AlreadyExists (also HTTP 409, a different reason);
//   * update() ignores `status` when the resource has a status subresource; update_status()
//     changes only `status`; `metadata.generation` increases on every spec change;
//   * watch() from a resourceVersion older than the server keeps throws Gone (410) or yields an
//     Error event with code 410; bookmarks carry only `metadata.resourceVersion`.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/error.h"

namespace kt::kube {

using Object = nlohmann::json;

// A collection of objects (group/version/plural), e.g. {"", "v1", "pods", "Pod", true}.
struct Resource {
  std::string group;    // "" for the core group
  std::string version;  // "v1", "v1alpha1"
  std::string plural;   // "pods", "trainingjobs"
  std::string kind;     // "Pod", "TrainingJob"
  bool namespaced = true;

  std::string api_version() const { return group.empty() ? version : group + "/" + version; }
  bool operator==(const Resource&) const = default;
};

// The collections the operator uses.
extern const Resource kPods;
extern const Resource kServices;
extern const Resource kConfigMaps;
extern const Resource kNodes;
extern const Resource kEvents;
extern const Resource kPersistentVolumeClaims;
extern const Resource kLeases;  // coordination.k8s.io/v1
extern const Resource kRoles;   // rbac.authorization.k8s.io/v1: the Lease's owner
// Gang scheduling's PodGroups: scheduler-plugins' coscheduling and Volcano's.
extern const Resource kCoschedulingPodGroups;  // scheduling.x-k8s.io/v1alpha1
extern const Resource kVolcanoPodGroups;       // scheduling.volcano.sh/v1beta1
// A pod's gang, as each gang scheduler reads it: coscheduling's label and Volcano's annotation
// name a PodGroup (whose spec.minMember sizes the gang); Kueue's plain pod groups name the group
// in a label and size it in an annotation.
inline constexpr const char* kCoschedulingPodGroupLabel = "scheduling.x-k8s.io/pod-group";
inline constexpr const char* kVolcanoGroupAnnotation = "scheduling.k8s.io/group-name";
inline constexpr const char* kKueuePodGroupLabel = "kueue.x-k8s.io/pod-group-name";
inline constexpr const char* kKueuePodGroupTotalCountAnnotation =
    "kueue.x-k8s.io/pod-group-total-count";
extern const Resource kTrainingJobs;  // kubetrain.dev/v1alpha1
extern const Resource kCustomResourceDefinitions;  // apiextensions.k8s.io/v1

// An API failure, classified as the API server's Status object does (`reason`, `code`).
class ApiError : public kt::Error {
 public:
  ApiError(int code, std::string reason, const std::string& message,
           std::optional<int> retry_after_seconds = std::nullopt)
      : kt::Error(message), code_(code), reason_(std::move(reason)),
        retry_after_seconds_(retry_after_seconds) {}
  int code() const { return code_; }                  // 404, 409, 410, 422, 429, 500, ...
  const std::string& reason() const { return reason_; }  // "NotFound", "Conflict", ...
  std::optional<int> retry_after_seconds() const { return retry_after_seconds_; }
  // metav1.StatusDetails (name, group, kind, causes) when the server gave them; null otherwise.
  const Object& details() const { return details_; }
  ApiError& with_details(Object details) {
    details_ = std::move(details);
    return *this;
  }

  bool not_found() const { return reason_ == "NotFound"; }
  bool conflict() const { return reason_ == "Conflict"; }            // stale resourceVersion
  bool already_exists() const { return reason_ == "AlreadyExists"; }  // create of a taken name
  bool gone() const { return code_ == 410; }
  bool invalid() const { return code_ == 422; }
  bool too_many_requests() const { return code_ == 429; }
  bool server_error() const { return code_ >= 500; }

 private:
  int code_;
  std::string reason_;
  std::optional<int> retry_after_seconds_;
  Object details_;
};

struct ListOptions {
  std::string label_selector;    // "a=b,c!=d,e in (f,g),h,!i" (equality- and set-based)
  std::string field_selector;    // "metadata.name=x", "spec.nodeName=y", "status.phase!=z"
  std::int64_t limit = 0;        // 0: no pagination
  std::string continue_token;    // from the previous page
  std::string resource_version;  // "" (most recent) or "0" (any)
};

struct ObjectList {
  std::vector<Object> items;
  std::string resource_version;  // of the collection, to start a watch from
  std::string continue_token;    // "" on the last page
};

enum class WatchEventType { Added, Modified, Deleted, Bookmark, Error };

struct WatchEvent {
  WatchEventType type;
  Object object;  // the object; for Error, a metav1.Status ({"code": 410, "reason": "Expired"})
};

struct WatchOptions {
  std::string resource_version;  // start after this version ("" = from now, after a synthetic
                                 // ADDED for every existing object, as the API server does)
  std::string label_selector;
  std::string field_selector;
  bool allow_bookmarks = true;
  int timeout_seconds = 0;       // the server ends the watch after this long (0: server default)
};

// One open watch. next() blocks up to `timeout` for the next event; std::nullopt means nothing
// arrived in time. ended() is true once the stream closed (server timeout, error, stop()); after
// that next() returns std::nullopt at once. stop() may be called from another thread.
class Watch {
 public:
  virtual ~Watch() = default;
  virtual std::optional<WatchEvent> next(std::chrono::milliseconds timeout) = 0;
  virtual bool ended() const = 0;
  virtual void stop() = 0;
};

enum class Propagation { Background, Foreground, Orphan };

// The API. `ns` is the namespace ("" for cluster-scoped resources, or for list/watch across all
// namespaces). Every call may throw ApiError; RestClient also throws kt::Error for transport
// failures (connection refused, timeout), which callers treat like a 5xx.
class Client {
 public:
  virtual ~Client() = default;

  virtual Object get(const Resource& r, const std::string& ns, const std::string& name) = 0;
  virtual ObjectList list(const Resource& r, const std::string& ns, const ListOptions& opts) = 0;
  virtual Object create(const Resource& r, const std::string& ns, const Object& obj) = 0;
  // PUT: `obj.metadata.resourceVersion` must be current (else Conflict); "" means unconditional.
  virtual Object update(const Resource& r, const std::string& ns, const Object& obj) = 0;
  virtual Object update_status(const Resource& r, const std::string& ns, const Object& obj) = 0;
  // RFC 7386 JSON merge patch of the object (or, with `status_subresource`, of its status).
  virtual Object merge_patch(const Resource& r, const std::string& ns, const std::string& name,
                             const Object& patch, bool status_subresource = false) = 0;
  virtual void remove(const Resource& r, const std::string& ns, const std::string& name,
                      Propagation propagation = Propagation::Background) = 0;
  virtual std::unique_ptr<Watch> watch(const Resource& r, const std::string& ns,
                                       const WatchOptions& opts) = 0;
};

}  // namespace kt::kube

// The local control plane (docs/ARCHITECTURE.md §6): an in-memory object store with the Kubernetes API's
// semantics, behind the same kube::Client interface as the REST client, so that the reconciler
// runs unchanged in `kubetrain run` and the HTTP front end (`kubetrain local serve`) can serve it.
//
// What it implements (api-conventions.md, the API server's behaviour):
//  * one global, monotonically increasing resourceVersion (decimal string); uid;
//    creationTimestamp; metadata.generation = 1 on create, +1 when anything but metadata and
//    status changes; generateName;
//  * AlreadyExists (409) on create of a taken name, Conflict (409) on a stale resourceVersion,
//    NotFound (404) for a missing object or an unknown resource, Invalid (422) for bad metadata,
//    BadRequest (400) when the body's namespace or kind disagrees with the request;
//  * the status subresource for resources registered with one (pods, nodes, services,
//    trainingjobs and CRDs that declare it): create() drops the status, update() keeps the stored
//    status, update_status() changes only the status;
//  * RFC 7386 merge patch of the object or of its status;
//  * label selectors (=, ==, !=, in, notin, exists, !exists) and field selectors
//    (metadata.name, metadata.namespace, spec.nodeName, status.phase; =, ==, !=; kube/selectors.h);
//  * list pagination (limit / continue);
//  * watch from a resourceVersion with a bounded history (older: ApiError 410 "Expired"), a
//    synthetic ADDED per existing object when started from "" or "0", DELETED when a modified
//    object leaves the selector, bookmarks when allowed, and the timeout (watch_hub.h);
//  * deletion with ownerReference garbage collection: Background and Foreground delete the
//    dependents (transitively), Orphan removes the owner's reference from them;
//  * CRDs: creating a CustomResourceDefinition registers the resource it defines, and its
//    storage version's structural schema applies to that resource (schema.h: defaults, pruning,
//    validation with field paths; CEL rules are the operator's).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "operator/kube/client.h"
#include "local/watch_hub.h"

namespace kt::local {

struct StoreOptions {
  size_t history_limit = 10000;  // watch events kept for watches that resume from a version
  size_t history_limit_bytes = size_t{256} << 20;  // ... and at most about this much of them
  std::chrono::milliseconds bookmark_interval{std::chrono::seconds(10)};
  int default_watch_timeout_seconds = 1800;  // when a watch asks for 0
};

// Called before every request with its verb ("get", "list", "create", "update",
// "update_status", "patch", "delete", "watch"), resource, namespace and name ("" for
// collections); a returned error is thrown instead of serving the request. For fault injection.
using FaultHook = std::function<std::optional<kube::ApiError>(
    const std::string& verb, const kube::Resource& resource, const std::string& ns,
    const std::string& name)>;

// While a DryRun is alive on a thread, that thread's writes to every Store are dry runs, as the
// API's `dryRun=All` asks: validated, defaulted and admitted exactly as real writes and answered
// with the object they would store, while nothing is stored, recorded for watches, collected or
// registered, and no resourceVersion is spent.
class DryRun {
 public:
  explicit DryRun(bool on = true);
  ~DryRun();
  DryRun(const DryRun&) = delete;
  DryRun& operator=(const DryRun&) = delete;
  static bool active();

 private:
  bool previous_;
};

class Store : public kube::Client {
 public:
  // Registers the built-in resources (builtin_resources.h).
  explicit Store(StoreOptions options = {});
  ~Store() override;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Makes a resource servable without a CRD object (e.g. kTrainingJobs in tests).
  void register_resource(const kube::Resource& resource, bool status_subresource);
  void set_fault(FaultHook hook);
  // The current (latest) resourceVersion.
  std::string resource_version() const;

  kube::Object get(const kube::Resource& r, const std::string& ns,
                   const std::string& name) override;
  kube::ObjectList list(const kube::Resource& r, const std::string& ns,
                        const kube::ListOptions& opts) override;
  kube::Object create(const kube::Resource& r, const std::string& ns,
                      const kube::Object& obj) override;
  kube::Object update(const kube::Resource& r, const std::string& ns,
                      const kube::Object& obj) override;
  kube::Object update_status(const kube::Resource& r, const std::string& ns,
                             const kube::Object& obj) override;
  kube::Object merge_patch(const kube::Resource& r, const std::string& ns, const std::string& name,
                           const kube::Object& patch, bool status_subresource = false) override;
  void remove(const kube::Resource& r, const std::string& ns, const std::string& name,
              kube::Propagation propagation = kube::Propagation::Background) override;
  std::unique_ptr<kube::Watch> watch(const kube::Resource& r, const std::string& ns,
                                     const kube::WatchOptions& opts) override;

 private:
  struct Kind {
    kube::Resource resource;
    bool status_subresource = false;
    std::map<std::string, kube::Object> objects;  // key "ns/name" (cluster-scoped: "/name")
    kube::Object schema;  // openAPIV3Schema: a CRD's, or builtin_schemas.h's (null: none)
    bool builtin = false;
  };

  Kind& kind_of(const kube::Resource& r);  // throws NotFound; needs mutex_
  void fault(const std::string& verb, const kube::Resource& r, const std::string& ns,
             const std::string& name);
  kube::Object write(Kind& kind, const std::string& ns, kube::Object obj, bool status_only,
                     bool check_version);
  // `obj_bytes`: obj's size when the caller has it (0: measured here).
  void record(const Kind& kind, kube::WatchEventType type, const kube::Object& obj,
              const kube::Object& old_obj, size_t obj_bytes = 0);
  void remove_locked(Kind& kind, const std::string& key, kube::Propagation propagation);
  void collect_if_orphaned(Kind& kind, const std::string& key);
  static size_t check_size(const kube::Resource& r, const std::string& name,
                           const kube::Object& object);
  void register_locked(const kube::Resource& resource, bool status_subresource);
  void register_crd(const kube::Object& crd);
  void admit(Kind& kind, kube::Object& object, bool create);
  void apply_schema(const Kind& kind, kube::Object& object);
  std::string next_version() { return std::to_string(++version_); }

  const StoreOptions options_;
  mutable std::mutex mutex_;  // guards everything below; taken before any watch's own mutex
  std::map<std::string, Kind> kinds_;  // by "group/plural"
  int64_t version_ = 0;
  int64_t uid_counter_ = 0;
  WatchHub watches_;  // the change history and the open watches
  FaultHook fault_;
};

}  // namespace kt::local

// Reads from informer caches, writes to the API: controller-runtime's cache and delegating
// client (no LIST in a steady-state reconcile; docs/OPERATIONS.md §2).
//
//   Cache cache(rest, {.resources = {{kTrainingJobs, "default"},
//                                    {kPods, "default", "", {"kubetrain.dev/job-name"},
//                                     {"spec.nodeName"}}}});
//   cache.informer(kPods)->add_handler(...);   // before start(): enqueue keys
//   CachingClient client(rest, cache);          // the reconciler's Client
//   cache.start();
//   client.list(kPods, "default", {.label_selector = "kubetrain.dev/job-name=a"});  // an index
//
// Cache is one Informer per cached collection (namespace, label selector, indexes on labels
// and fields). CachingClient answers get() and list() of a collection the cache holds from it:
// label and field selectors are evaluated on the cached objects (selectors.h), an equality
// requirement on an indexed label or field reads only that index's objects, and every answer
// is a copy. It passes through to the wrapped client every write and watch, and the reads the
// cache cannot answer: a collection it does not hold, another namespace, a label selector that
// does not imply the informer's, a paginated list, or one whose informer has not synced within
// `sync_timeout`. get() of a name the cache lacks is NotFound when the informer sees the whole
// collection, else (a label-filtered informer: the object may lack the label) asked of the API.
//
// Staleness. The cache lags the API by the watch latency. Reads of objects this client wrote
// are not stale: each write's answer is kept (client-go's MutationCache) and read instead of the
// informer's copy until the informer has seen that resourceVersion (or `mutation_ttl` passed).
// Writes by others can still be read stale; the reconciler copes as any controller must: creates
// use deterministic names (AlreadyExists means "it exists": look again), and updates carry the
// resourceVersion read (a stale one is a Conflict, retried through the work queue).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "operator/kube/client.h"
#include "operator/kube/informer.h"

namespace kt::kube {

struct CachedResource {
  Resource resource;
  std::string ns;              // "" = every namespace (and cluster-scoped collections)
  std::string label_selector;  // "" = every object of the collection
  std::vector<std::string> indexed_labels;  // label keys: lists by "key=value" read an index
  std::vector<std::string> indexed_fields;  // field-selector fields, e.g. "spec.nodeName"
  Informer::Transform transform;            // may be empty (Informer::set_transform)
};

struct CacheOptions {
  std::vector<CachedResource> resources;
  InformerTiming timing;
  // How long a read waits for its informer's first list before it asks the API instead.
  std::chrono::milliseconds sync_timeout{std::chrono::seconds(10)};
  // How long a write's answer may stand in for the informer's copy.
  std::chrono::milliseconds mutation_ttl{std::chrono::seconds(30)};
};

class Cache {
 public:
  Cache(Client& client, CacheOptions options);
  ~Cache();  // stop()
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;

  // The informer of `resource`, or nullptr when it is not cached. Add handlers before start().
  Informer* informer(const Resource& resource);
  const Informer* informer(const Resource& resource) const;
  void start();  // idempotent; returns at once
  void stop();   // idempotent
  bool has_synced() const;
  const CacheOptions& options() const { return options_; }

  // Index names as Informer::add_index knows them.
  static std::string label_index(const std::string& key) { return "label:" + key; }
  static std::string field_index(const std::string& field) { return "field:" + field; }

 private:
  const CacheOptions options_;
  std::vector<std::unique_ptr<Informer>> informers_;  // as options_.resources
  std::mutex start_mutex_;
  bool started_ = false;
};

class CachingClient : public Client {
 public:
  CachingClient(Client& api, Cache& cache);

  Object get(const Resource& r, const std::string& ns, const std::string& name) override;
  ObjectList list(const Resource& r, const std::string& ns, const ListOptions& opts) override;
  Object create(const Resource& r, const std::string& ns, const Object& obj) override;
  Object update(const Resource& r, const std::string& ns, const Object& obj) override;
  Object update_status(const Resource& r, const std::string& ns, const Object& obj) override;
  Object merge_patch(const Resource& r, const std::string& ns, const std::string& name,
                     const Object& patch, bool status_subresource = false) override;
  void remove(const Resource& r, const std::string& ns, const std::string& name,
              Propagation propagation = Propagation::Background) override;
  std::unique_ptr<Watch> watch(const Resource& r, const std::string& ns,
                               const WatchOptions& opts) override;

  // Requests the calling thread has sent to the API through any CachingClient (reads the cache
  // answered are not counted): the manager's API-requests-per-reconcile figure.
  static std::int64_t api_requests_on_this_thread();

 private:
  struct Written {
    Object object;
    std::int64_t version;
    std::chrono::steady_clock::time_point at;
  };
  // The informer that can answer a read of `r` in `ns`, synced; nullptr: ask the API.
  const Informer* reader(const Resource& r, const std::string& ns);
  void remember(const Resource& r, const Object& written);
  void forget(const Resource& r, const std::string& ns, const std::string& name);
  // Our newer write of the object with key `key`, if it is still newer than what `informer`
  // holds (`cached_version`: the informer's copy's, -1 for none). Drops writes it has seen.
  std::optional<Object> newer_write(const Informer& informer, const Resource& r,
                                    const std::string& key, std::int64_t cached_version);

  Client& api_;
  Cache& cache_;
  std::mutex written_mutex_;
  std::map<std::string, std::map<std::string, Written>> written_;  // by plural.group, key
};

}  // namespace kt::kube

// A shared-informer-like cache of one collection (client-go's Reflector + Indexer): list
// (paginated), then watch from the list's resourceVersion with bookmarks and a random 5–10 min
// server timeout; watch again from the last seen version when a watch ends; list again on 410
// Gone or an ERROR event, emitting the difference to the cache as events (so deletions missed
// while disconnected arrive as Deleted); exponential backoff 0.8 s → 30 s on errors
// (docs/KUBE.md). Handlers run on the informer's thread and should only enqueue keys.
//
//   Informer pods(client, kPods, "default", "kubetrain.dev/job-name");
//   pods.add_handler([&](WatchEventType, const Object& pod) { queue.add(owner_key(pod)); });
//   pods.start();                 // returns at once; has_synced() after the first list has
//                                 // reached the handlers
//   ...
//   pods.stop();
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "operator/kube/client.h"

namespace kt::kube {

// Timing knobs; the defaults are client-go's reflector's. Tests shorten them.
struct InformerTiming {
  std::chrono::milliseconds initial_backoff{800};
  std::chrono::milliseconds max_backoff{30'000};
  int min_watch_timeout_seconds = 300;
  int max_watch_timeout_seconds = 600;
  std::int64_t page_size = 500;
};

class Informer {
 public:
  Informer(Client& client, Resource resource, std::string ns, std::string label_selector);
  Informer(Client& client, Resource resource, std::string ns, std::string label_selector,
           InformerTiming timing);
  ~Informer();  // stops
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  // The values an object is indexed under (none: not in the index).
  using IndexFunc = std::function<std::vector<std::string>(const Object&)>;
  using Predicate = std::function<bool(const Object&)>;

  // Before start(). Called for Added, Modified and Deleted (with the last known object).
  void add_handler(std::function<void(WatchEventType, const Object&)> handler);
  // Before start(). Applied to every object listed or watched before it is cached or handed to
  // a handler (client-go's SetTransform): drop the fields no reader needs (a Node's images,
  // managedFields) so that 10,000 nodes do not cost their full size. It must keep metadata's
  // name, namespace and resourceVersion.
  using Transform = std::function<void(Object&)>;
  void set_transform(Transform transform);
  // Before start(). A second index of the same name replaces the first.
  void add_index(const std::string& name, IndexFunc values);
  void start();
  void stop();  // idempotent; returns after the informer's thread ended
  bool has_synced() const;
  // Whether the first list arrived within `timeout` (has_synced() at the end).
  bool wait_for_sync(std::chrono::milliseconds timeout) const;
  // Copies, never references into the cache. `ns` "" for cluster-scoped resources, or for every
  // namespace in list(); `keep` filters before copying (null keeps all).
  std::vector<Object> list() const;
  std::vector<Object> list(const std::string& ns, const Predicate& keep) const;
  std::optional<Object> get(const std::string& ns, const std::string& name) const;
  // The objects indexed under `value` by index `index` (which must exist), in namespace `ns`
  // ("" for all), that `keep` keeps.
  std::vector<Object> by_index(const std::string& index, const std::string& value,
                               const std::string& ns, const Predicate& keep) const;
  bool has_index(const std::string& index) const { return indexes_.count(index) > 0; }
  // The newest resourceVersion the informer has seen (list, event or bookmark), "" before the
  // first list: client-go's LastSyncResourceVersion.
  std::string last_resource_version() const;

  const Resource& resource() const { return resource_; }
  const std::string& ns() const { return namespace_; }
  const std::string& label_selector() const { return label_selector_; }

  // Counters for tests and logs.
  int lists() const { return lists_.load(); }
  int watches() const { return watches_.load(); }

 private:
  void run();
  std::string list_and_sync();           // returns the list's resourceVersion
  void watch_from(std::string& version);  // until the watch ends; throws to request a relist
  void apply(WatchEventType type, const Object& object);
  void set_version(const std::string& version);
  void index_locked(const std::string& key, const Object* old_object, const Object* new_object);
  void reindex_locked();
  void emit(WatchEventType type, const Object& object);
  bool sleep_unless_stopped(std::chrono::milliseconds duration);

  Client& client_;
  const Resource resource_;
  const std::string namespace_;
  const std::string label_selector_;
  const InformerTiming timing_;
  std::vector<std::function<void(WatchEventType, const Object&)>> handlers_;
  Transform transform_;

  struct Index {
    IndexFunc values;
    std::map<std::string, std::set<std::string>> keys;  // value -> object keys
  };

  mutable std::mutex cache_mutex_;
  mutable std::condition_variable synced_cv_;  // with cache_mutex_
  std::map<std::string, Object> cache_;  // by "ns/name" (or "name")
  std::map<std::string, Index> indexes_;  // by name; the set of names is fixed at start()
  std::string version_;                   // last_resource_version()
  std::atomic<bool> synced_{false};

  std::mutex stop_mutex_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  Watch* current_watch_ = nullptr;  // guarded by stop_mutex_, so that stop() can end it
  std::thread thread_;
  std::atomic<int> lists_{0};
  std::atomic<int> watches_{0};
};

// "ns/name", or "name" for an object without a namespace: the cache and work-queue key.
std::string object_key(const Object& object);

}  // namespace kt::kube

// The Store's watches (store.h): the bounded history of changes that a watch can resume from,
// and the open watches, each with its own queue of events filtered by namespace and selectors
// as the API server's watch filter does (an object that leaves the selector is DELETED for the
// watcher, one that enters it ADDED), bookmarks when allowed, and a deadline.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "operator/kube/client.h"

namespace kt::local {

// What one watch asks for.
struct WatchSubscription {
  std::string kind_key;     // the Store's key of the watched resource ("group/plural")
  kube::Resource resource;  // the kind its bookmarks name
  std::string ns;           // "" = all
  std::string label_selector, field_selector;  // selectors.h; already checked well-formed
  bool allow_bookmarks = true;
  std::chrono::milliseconds bookmark_interval{0};
  std::chrono::steady_clock::time_point deadline;  // when the watch ends
};

// Not synchronized: the Store calls every member under its own mutex, which is taken before
// any watch's own mutex (a watch's reader takes only the latter).
class WatchHub {
 public:
  // The history keeps at most `history_limit` changes and about `history_limit_bytes` of their
  // objects (the oldest go first; a watch from before them is 410 Expired).
  WatchHub(std::size_t history_limit, std::size_t history_limit_bytes)
      : history_limit_(history_limit), history_limit_bytes_(history_limit_bytes) {}

  // Records a change at `version` (the object's new resourceVersion) and offers it to the open
  // watches of `kind_key`; the others learn the version for their bookmarks.
  // `old_object`: the object before a modification (null otherwise); `bytes`: the size of both.
  void publish(int64_t version, const std::string& kind_key, kube::WatchEventType type,
               const kube::Object& object, const kube::Object& old_object, std::size_t bytes);

  // A watch from "" or "0": ADDED for each of `objects` that it selects, then the changes.
  std::unique_ptr<kube::Watch> watch_from_list(const WatchSubscription& subscription,
                                               int64_t latest_version,
                                               const std::map<std::string, kube::Object>& objects);
  // A watch from `resource_version`: the recorded changes after it, then the new ones.
  // ApiError 400 when it is not a number, 410 Expired when it is older than the history kept.
  std::unique_ptr<kube::Watch> watch_from_version(const WatchSubscription& subscription,
                                                  int64_t latest_version,
                                                  const std::string& resource_version);

  // Ends every open watch (the Store is going away).
  void end_all();

 private:
  struct WatchState;  // one open watch's queue (watch_hub.cpp)
  class StoreWatch;   // the kube::Watch that reads it
  struct Change {
    int64_t rv;
    std::string kind_key;
    kube::WatchEventType type;
    kube::Object object;
    kube::Object old_object;  // before a modification (null otherwise)
    std::size_t bytes;        // of object and old_object
  };

  // A watch's state before it is offered its first events and registered.
  std::shared_ptr<WatchState> new_state(const WatchSubscription& subscription,
                                        int64_t latest_version);

  const std::size_t history_limit_, history_limit_bytes_;
  std::deque<Change> history_;
  std::size_t history_bytes_ = 0;  // the sum of history_'s Change::bytes
  int64_t history_floor_ = 0;  // the newest version dropped from history_
  std::vector<std::weak_ptr<WatchState>> watches_;
};

}  // namespace kt::local

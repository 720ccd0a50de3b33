// The Store's watches (watch_hub.h): each open watch's state and queue, the kube::Watch that
// reads it, and the history that watches resume from.
#include "local/watch_hub.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <stdexcept>

#include "operator/kube/selectors.h"

namespace kt::local {

using kube::ApiError;
using kube::matches_field_selector;
using kube::matches_label_selector;
using kube::Object;
using kube::WatchEvent;
using kube::WatchEventType;

// One open watch: what it asked for, the events waiting for its reader, and whether it ended;
// all but the subscription guarded by `mutex`.
struct WatchHub::WatchState : WatchSubscription {
  explicit WatchState(const WatchSubscription& subscription) : WatchSubscription(subscription) {}

  std::mutex mutex;
  std::condition_variable cv;
  std::deque<WatchEvent> queue;
  int64_t latest_version = 0;  // every event up to this version has been offered
  std::chrono::steady_clock::time_point last_sent = std::chrono::steady_clock::now();
  bool ended = false;

  bool matches(const Object& obj) const {
    if (!ns.empty() && obj["metadata"].value("namespace", "") != ns) return false;
    return matches_label_selector(obj, label_selector) &&
           matches_field_selector(obj, field_selector);
  }

  // Translates one store event for this watch (the API server's watch filter: an object that
  // leaves the selector is DELETED for the watcher, one that enters it ADDED). Needs `mutex`.
  void offer(int64_t version, WatchEventType type, const Object& obj, const Object& old_obj) {
    latest_version = std::max(latest_version, version);
    if (ended) return;
    const bool now = matches(obj);
    const bool before = type == WatchEventType::Modified && !old_obj.is_null() && matches(old_obj);
    std::optional<WatchEventType> out;
    if (type == WatchEventType::Modified) {
      if (now && before)
        out = WatchEventType::Modified;
      else if (now)
        out = WatchEventType::Added;
      else if (before)
        out = WatchEventType::Deleted;
    } else if (now) {
      out = type;
    }
    if (out) {
      queue.push_back({*out, obj});
      cv.notify_all();
    }
  }
};

class WatchHub::StoreWatch : public kube::Watch {
 public:
  explicit StoreWatch(std::shared_ptr<WatchState> state) : state_(std::move(state)) {}
  ~StoreWatch() override { stop(); }

  std::optional<WatchEvent> next(std::chrono::milliseconds timeout) override {
    auto& s = *state_;
    std::unique_lock<std::mutex> lock(s.mutex);
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto now = std::chrono::steady_clock::now();
      if (s.ended) return std::nullopt;
      if (!s.queue.empty()) {
        WatchEvent event = std::move(s.queue.front());
        s.queue.pop_front();
        s.last_sent = now;
        return event;
      }
      if (now >= s.deadline) {
        s.ended = true;
        return std::nullopt;
      }
      const auto bookmark_at = s.last_sent + s.bookmark_interval;
      if (s.allow_bookmarks && now >= bookmark_at) {
        s.last_sent = now;
        Object bookmark = {{"apiVersion", s.resource.api_version()},
                           {"kind", s.resource.kind},
                           {"metadata", {{"resourceVersion", std::to_string(s.latest_version)}}}};
        return WatchEvent{WatchEventType::Bookmark, std::move(bookmark)};
      }
      if (now >= until) return std::nullopt;
      auto wake = std::min(until, s.deadline);
      if (s.allow_bookmarks) wake = std::min(wake, bookmark_at);
      s.cv.wait_until(lock, wake);
    }
  }

  bool ended() const override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->ended;
  }

  void stop() override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->ended = true;
    state_->queue.clear();
    state_->cv.notify_all();
  }

 private:
  std::shared_ptr<WatchState> state_;
};

std::shared_ptr<WatchHub::WatchState> WatchHub::new_state(const WatchSubscription& subscription,
                                                          int64_t latest_version) {
  auto state = std::make_shared<WatchState>(subscription);
  state->latest_version = latest_version;
  return state;
}

std::unique_ptr<kube::Watch> WatchHub::watch_from_list(
    const WatchSubscription& subscription, int64_t latest_version,
    const std::map<std::string, Object>& objects) {
  auto state = new_state(subscription, latest_version);
  {
    std::lock_guard<std::mutex> wl(state->mutex);
    for (const auto& [_, obj] : objects)
      if (state->matches(obj)) state->queue.push_back({WatchEventType::Added, obj});
  }
  watches_.push_back(state);
  return std::make_unique<StoreWatch>(state);
}

std::unique_ptr<kube::Watch> WatchHub::watch_from_version(const WatchSubscription& subscription,
                                                          int64_t latest_version,
                                                          const std::string& resource_version) {
  auto state = new_state(subscription, latest_version);
  int64_t from = 0;
  try {
    size_t used = 0;
    from = std::stoll(resource_version, &used);
    if (used != resource_version.size()) throw std::invalid_argument("trailing");
  } catch (const std::exception&) {
    throw ApiError(400, "BadRequest", "invalid resourceVersion \"" + resource_version + "\"");
  }
  if (from < history_floor_)
    throw ApiError(410, "Expired",
                   "too old resource version: " + resource_version + " (" +
                       std::to_string(history_floor_ + 1) + ")");
  {
    std::lock_guard<std::mutex> wl(state->mutex);
    for (const auto& entry : history_)
      if (entry.rv > from && entry.kind_key == state->kind_key)
        state->offer(entry.rv, entry.type, entry.object, entry.old_object);
  }
  watches_.push_back(state);
  return std::make_unique<StoreWatch>(state);
}

void WatchHub::publish(int64_t version, const std::string& kind_key, WatchEventType type,
                       const Object& object, const Object& old_object, std::size_t bytes) {
  history_.push_back({version, kind_key, type, object, old_object, bytes});
  history_bytes_ += bytes;
  while (history_.size() > history_limit_ ||
         (history_bytes_ > history_limit_bytes_ && history_.size() > 1)) {
    history_floor_ = history_.front().rv;
    history_bytes_ -= history_.front().bytes;
    history_.pop_front();
  }
  std::erase_if(watches_, [](const auto& w) { return w.expired(); });
  for (auto& weak : watches_) {
    auto w = weak.lock();
    if (!w) continue;
    std::lock_guard<std::mutex> wl(w->mutex);
    if (w->kind_key == kind_key)
      w->offer(version, type, object, old_object);
    else
      w->latest_version = version;  // bookmarks may advance past other resources' events
  }
}

void WatchHub::end_all() {
  for (auto& weak : watches_)
    if (auto w = weak.lock()) {
      std::lock_guard<std::mutex> wl(w->mutex);
      w->ended = true;
      w->cv.notify_all();
    }
}

}  // namespace kt::local

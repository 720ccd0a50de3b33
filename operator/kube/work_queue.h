// A rate-limited work queue with client-go's semantics (k8s.io/client-go/util/workqueue):
//   * a key added while queued is queued once ("dirty" set);
//   * a key is never handed to two workers at once: added while a worker holds it, it is queued
//     again only when that worker calls done() ("processing" set);
//   * add_rate_limited() waits the larger of a per-key exponential backoff (5 ms · 2^failures,
//     at most 1000 s) and an overall token bucket (10 per second, burst 100), like client-go's
//     DefaultControllerRateLimiter; forget() resets the key's failures.
//
//   while (auto key = queue.get()) {             // blocks; std::nullopt once shut down
//     if (reconcile(*key)) queue.forget(*key); else queue.add_rate_limited(*key);
//     queue.done(*key);
//   }
//
// shut_down() wakes every get(); keys still queued or delayed are dropped (reconcilers are
// level-triggered, so the next start converges anyway). Metrics: workqueue_depth,
// workqueue_adds_total, workqueue_retries_total, workqueue_queue_duration_seconds (add to get)
// and workqueue_work_duration_seconds (get to done), with label name=<name>.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "operator/kube/metrics.h"

namespace kt::kube {

struct RateLimits {
  std::chrono::milliseconds base_delay{5};
  std::chrono::milliseconds max_delay{1000 * 1000};
  double qps = 10;
  int burst = 100;
};

class WorkQueue {
 public:
  explicit WorkQueue(std::string name = "", KubeMetrics* metrics = nullptr,
                     RateLimits limits = {});
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  void add(const std::string& key);
  void add_rate_limited(const std::string& key);
  void add_after(const std::string& key, std::chrono::milliseconds delay);
  void forget(const std::string& key);
  int num_requeues(const std::string& key) const;
  std::optional<std::string> get();
  void done(const std::string& key);
  void shut_down();
  std::size_t depth() const;  // keys ready to be handed out (not the delayed ones)

  // The delay add_rate_limited() would apply next and records the failure (for tests).
  std::chrono::milliseconds when(const std::string& key);

 private:
  using Clock = std::chrono::steady_clock;

  void add_locked(const std::string& key);
  void promote_ready_locked(Clock::time_point now);
  void update_depth_locked();

  const std::string name_;
  KubeMetrics* const metrics_;
  const RateLimits limits_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::string> queue_;
  std::set<std::string> dirty_;       // queued or to be queued after done()
  std::set<std::string> processing_;  // handed out, not yet done()
  std::map<std::string, Clock::time_point> delayed_;  // key -> earliest ready time
  std::map<std::string, int> failures_;
  std::map<std::string, Clock::time_point> queued_at_;   // in queue_ since (queue duration)
  std::map<std::string, Clock::time_point> started_at_;  // handed out at (work duration)
  double tokens_;
  Clock::time_point tokens_at_;
  bool shutting_down_ = false;
};

}  // namespace kt::kube

#include "operator/kube/work_queue.h"

#include <algorithm>
#include <cmath>

namespace kt::kube {

WorkQueue::WorkQueue(std::string name, KubeMetrics* metrics, RateLimits limits)
    : name_(std::move(name)), metrics_(metrics), limits_(limits),
      tokens_(limits.burst), tokens_at_(Clock::now()) {
  // Every series of the queue from the start at 0, as client-go's, so that rates read 0, not
  // "no data", before the first retry.
  if (metrics_) {
    metrics_->workqueue_adds.with({name_});
    metrics_->workqueue_retries.with({name_});
    metrics_->workqueue_queue_duration.with({name_});
    metrics_->workqueue_work_duration.with({name_});
  }
  update_depth_locked();
}

void WorkQueue::add(const std::string& key) {
  std::lock_guard lock(mutex_);
  add_locked(key);
}

void WorkQueue::add_locked(const std::string& key) {
  if (shutting_down_ || dirty_.count(key)) return;
  if (metrics_) metrics_->workqueue_adds.with({name_}).inc();
  dirty_.insert(key);
  if (processing_.count(key)) return;  // queued again by done()
  queue_.push_back(key);
  queued_at_[key] = Clock::now();
  update_depth_locked();
  changed_.notify_one();
}

std::chrono::milliseconds WorkQueue::when(const std::string& key) {
  std::lock_guard lock(mutex_);
  // Per key: base · 2^failures, capped (client-go's ItemExponentialFailureRateLimiter).
  const int failures = failures_[key]++;
  const double exponential =
      static_cast<double>(limits_.base_delay.count()) * std::pow(2.0, std::min(failures, 62));
  const auto per_key = std::chrono::milliseconds(static_cast<std::int64_t>(
      std::min(exponential, static_cast<double>(limits_.max_delay.count()))));
  // Overall: a token bucket; a reservation beyond the tokens waits for them to refill.
  const auto now = Clock::now();
  const double elapsed = std::chrono::duration<double>(now - tokens_at_).count();
  tokens_ = std::min<double>(limits_.burst, tokens_ + elapsed * limits_.qps);
  tokens_at_ = now;
  tokens_ -= 1;
  const auto bucket = std::chrono::milliseconds(
      tokens_ >= 0 ? 0 : static_cast<std::int64_t>(std::ceil(-tokens_ / limits_.qps * 1000)));
  return std::max(per_key, bucket);
}

void WorkQueue::add_rate_limited(const std::string& key) {
  const auto delay = when(key);
  {
    std::lock_guard lock(mutex_);
    if (shutting_down_) return;
    if (metrics_) metrics_->workqueue_retries.with({name_}).inc();
  }
  add_after(key, delay);
}

void WorkQueue::add_after(const std::string& key, std::chrono::milliseconds delay) {
  std::lock_guard lock(mutex_);
  if (shutting_down_) return;
  if (delay.count() <= 0) {
    add_locked(key);
    return;
  }
  const auto ready = Clock::now() + delay;
  auto [it, inserted] = delayed_.emplace(key, ready);
  if (!inserted && ready < it->second) it->second = ready;  // the earliest request wins
  changed_.notify_all();  // a waiting get() may now have an earlier deadline
}

void WorkQueue::forget(const std::string& key) {
  std::lock_guard lock(mutex_);
  failures_.erase(key);
}

int WorkQueue::num_requeues(const std::string& key) const {
  std::lock_guard lock(mutex_);
  auto it = failures_.find(key);
  return it == failures_.end() ? 0 : it->second;
}

void WorkQueue::promote_ready_locked(Clock::time_point now) {
  for (auto it = delayed_.begin(); it != delayed_.end();) {
    if (it->second <= now) {
      const std::string key = it->first;
      it = delayed_.erase(it);
      add_locked(key);
    } else {
      ++it;
    }
  }
}

std::optional<std::string> WorkQueue::get() {
  std::unique_lock lock(mutex_);
  for (;;) {
    if (shutting_down_) return std::nullopt;
    promote_ready_locked(Clock::now());
    if (!queue_.empty()) break;
    // Sleep until something is added, the earliest delayed key is due, or shut_down(); the
    // 1 s cap bounds the wait even if a notification were missed.
    auto deadline = Clock::now() + std::chrono::seconds(1);
    for (const auto& [key, ready] : delayed_) deadline = std::min(deadline, ready);
    changed_.wait_until(lock, deadline);
  }
  std::string key = std::move(queue_.front());
  queue_.pop_front();
  processing_.insert(key);
  dirty_.erase(key);
  update_depth_locked();
  const auto now = Clock::now();
  if (const auto queued = queued_at_.find(key); queued != queued_at_.end()) {
    if (metrics_)
      metrics_->workqueue_queue_duration.with({name_}).observe(
          std::chrono::duration<double>(now - queued->second).count());
    queued_at_.erase(queued);
  }
  started_at_[key] = now;
  return key;
}

void WorkQueue::done(const std::string& key) {
  std::lock_guard lock(mutex_);
  processing_.erase(key);
  const auto now = Clock::now();
  if (const auto started = started_at_.find(key); started != started_at_.end()) {
    if (metrics_)
      metrics_->workqueue_work_duration.with({name_}).observe(
          std::chrono::duration<double>(now - started->second).count());
    started_at_.erase(started);
  }
  if (dirty_.count(key) && !shutting_down_) {
    queue_.push_back(key);
    queued_at_[key] = now;
    update_depth_locked();
    changed_.notify_one();
  }
}

void WorkQueue::shut_down() {
  std::lock_guard lock(mutex_);
  shutting_down_ = true;
  queue_.clear();
  queued_at_.clear();
  delayed_.clear();
  update_depth_locked();
  changed_.notify_all();
}

std::size_t WorkQueue::depth() const {
  std::lock_guard lock(mutex_);
  return queue_.size();
}

void WorkQueue::update_depth_locked() {
  if (metrics_) metrics_->workqueue_depth.with({name_}).set(static_cast<double>(queue_.size()));
}

}  // namespace kt::kube

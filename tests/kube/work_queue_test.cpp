// The work queue's client-go semantics: dedup, one worker per key, backoff, delays, shutdown.
#include "operator/kube/work_queue.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

using namespace std::chrono_literals;
using kt::kube::RateLimits;
using kt::kube::WorkQueue;

TEST(WorkQueue, AddingAQueuedKeyQueuesItOnce) {
  WorkQueue queue;
  queue.add("a");
  queue.add("a");
  queue.add("b");
  EXPECT_EQ(queue.depth(), 2u);
  EXPECT_EQ(queue.get(), "a");
  EXPECT_EQ(queue.get(), "b");
  EXPECT_EQ(queue.depth(), 0u);
}

TEST(WorkQueue, KeyAddedWhileProcessingIsHandedOutOnlyAfterDone) {
  WorkQueue queue;
  queue.add("a");
  ASSERT_EQ(queue.get(), "a");
  queue.add("a");  // while a worker holds it
  queue.add("a");
  EXPECT_EQ(queue.depth(), 0u) << "a key being processed must not be handed to another worker";
  queue.done("a");
  EXPECT_EQ(queue.depth(), 1u) << "re-added once, after done()";
  EXPECT_EQ(queue.get(), "a");
  queue.done("a");
  EXPECT_EQ(queue.depth(), 0u);
}

// Also: no add is lost. Each add of a key bumps its generation first; a worker notes the
// generation it sees when it starts on the key, and, when it finishes, that generation is
// covered. client-go's promise (a key added while queued or held is processed again, after the
// add) means every generation gets covered, so the test drains on that condition, not on time.
TEST(WorkQueue, ConcurrentWorkersNeverProcessOneKeyAtOnce) {
  WorkQueue queue;
  std::mutex mutex;
  std::condition_variable covered_changed;
  std::set<std::string> in_flight;
  std::map<std::string, int> generation, covered;  // guarded by mutex
  std::atomic<int> overlaps{0}, processed{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&] {
      while (auto key = queue.get()) {
        int seen = 0;
        {
          std::lock_guard lock(mutex);
          if (!in_flight.insert(*key).second) overlaps++;
          seen = generation[*key];
        }
        std::this_thread::sleep_for(200us);
        {
          std::lock_guard lock(mutex);
          in_flight.erase(*key);
          covered[*key] = std::max(covered[*key], seen);
        }
        covered_changed.notify_all();
        processed++;
        queue.done(*key);
      }
    });
  }
  std::mt19937 random(7);
  for (int i = 0; i < 3000; ++i) {
    const std::string key = "key-" + std::to_string(random() % 5);
    {
      std::lock_guard lock(mutex);
      ++generation[key];
    }
    queue.add(key);
    if (i % 50 == 0) std::this_thread::sleep_for(1ms);
  }
  // Drain: until every add has been seen by a finished processing of its key.
  bool drained = false;
  {
    std::unique_lock lock(mutex);
    drained = covered_changed.wait_for(lock, 20s, [&] { return covered == generation; });
  }
  queue.shut_down();
  for (auto& w : workers) w.join();
  EXPECT_TRUE(drained) << "an add was lost: no processing started after it";
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_GT(processed.load(), 5);  // work happened, deduplicated well below 3000
}

TEST(WorkQueue, PerKeyBackoffDoublesFromFiveMillisecondsAndForgetResetsIt) {
  WorkQueue queue;
  EXPECT_EQ(queue.when("a"), 5ms);
  EXPECT_EQ(queue.when("a"), 10ms);
  EXPECT_EQ(queue.when("a"), 20ms);
  EXPECT_EQ(queue.when("a"), 40ms);
  EXPECT_EQ(queue.num_requeues("a"), 4);
  EXPECT_EQ(queue.when("b"), 5ms) << "backoff is per key";
  queue.forget("a");
  EXPECT_EQ(queue.num_requeues("a"), 0);
  EXPECT_EQ(queue.when("a"), 5ms);
}

TEST(WorkQueue, PerKeyBackoffIsCappedAtMaxDelay) {
  WorkQueue queue("", nullptr, RateLimits{5ms, 1000s, 1e9, 1'000'000});
  std::chrono::milliseconds last{0};
  for (int i = 0; i < 40; ++i) last = queue.when("a");
  EXPECT_EQ(last, std::chrono::milliseconds(1000s));
}

TEST(WorkQueue, TokenBucketDelaysBeyondTheBurst) {
  // 1 per second, burst 3: three failures of distinct keys pass with the per-key 5 ms, the
  // fourth waits ~1 s for a token, the fifth ~2 s (less whatever refilled meanwhile).
  WorkQueue queue("", nullptr, RateLimits{5ms, 1000s, 1, 3});
  for (int i = 0; i < 3; ++i) EXPECT_EQ(queue.when("k" + std::to_string(i)), 5ms);
  const auto fourth = queue.when("k3");
  const auto fifth = queue.when("k4");
  EXPECT_GE(fourth, 700ms);
  EXPECT_LE(fourth, 1000ms);
  EXPECT_GE(fifth, 1700ms);
  EXPECT_LE(fifth, 2000ms);
}

TEST(WorkQueue, AddRateLimitedHandsTheKeyOutAfterItsBackoff) {
  WorkQueue queue("", nullptr, RateLimits{100ms, 1000s, 10, 100});
  const auto start = std::chrono::steady_clock::now();
  queue.add_rate_limited("a");
  EXPECT_EQ(queue.depth(), 0u) << "not ready before its delay";
  EXPECT_EQ(queue.get(), "a");
  EXPECT_GE(std::chrono::steady_clock::now() - start, 95ms);
  EXPECT_EQ(queue.num_requeues("a"), 1);
}

TEST(WorkQueue, AddAfterHandsKeysOutInReadyOrder) {
  WorkQueue queue;
  queue.add_after("late", 300ms);
  queue.add_after("early", 100ms);
  queue.add("now");
  EXPECT_EQ(queue.get(), "now");
  EXPECT_EQ(queue.get(), "early");
  EXPECT_EQ(queue.get(), "late");
}

TEST(WorkQueue, AddAfterKeepsTheEarliestRequest) {
  WorkQueue queue;
  const auto start = std::chrono::steady_clock::now();
  queue.add_after("a", 10s);
  queue.add_after("a", 50ms);
  EXPECT_EQ(queue.get(), "a");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(WorkQueue, ShutDownWakesBlockedWorkersAndStopsAccepting) {
  WorkQueue queue;
  std::atomic<bool> returned{false};
  std::optional<std::string> got = "unset";
  std::thread worker([&] {
    got = queue.get();
    returned = true;
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(returned.load());
  queue.shut_down();
  worker.join();
  EXPECT_EQ(got, std::nullopt);
  queue.add("a");
  EXPECT_EQ(queue.depth(), 0u);
  EXPECT_EQ(queue.get(), std::nullopt);
}

TEST(WorkQueue, CountsAddsRetriesAndDepth) {
  kt::telemetry::Registry registry;
  kt::kube::KubeMetrics metrics(registry);
  WorkQueue queue("trainingjob", &metrics);
  queue.add("a");
  queue.add("a");  // deduplicated: not an add
  queue.add("b");
  queue.add_rate_limited("c");
  EXPECT_EQ(metrics.workqueue_adds.with({"trainingjob"}).value(), 2);
  EXPECT_EQ(metrics.workqueue_retries.with({"trainingjob"}).value(), 1);
  EXPECT_EQ(metrics.workqueue_depth.with({"trainingjob"}).value(), 2);
  const std::string text = registry.expose();
  EXPECT_NE(text.find("workqueue_depth{name=\"trainingjob\"} 2"), std::string::npos) << text;
}

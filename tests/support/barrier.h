// A barrier for ranks that are threads of a test, which gives up after a deadline (throwing
// kt::Error) so that a rank left waiting fails the test instead of hanging it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "api/error.h"

namespace kt::test {

class TimedBarrier {
 public:
  explicit TimedBarrier(int ranks, std::chrono::seconds deadline = std::chrono::seconds(10))
      : ranks_(ranks), deadline_(deadline) {}
  void arrive_and_wait() {
    std::unique_lock lock(mutex_);
    const int generation = generation_;
    if (++arrived_ == ranks_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, deadline_, [&] { return generation_ != generation; }))
      throw Error("barrier timed out: a rank never arrived");
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int ranks_, arrived_ = 0, generation_ = 0;
  std::chrono::seconds deadline_;
};

}  // namespace kt::test

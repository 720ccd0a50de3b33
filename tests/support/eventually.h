// Waiting in tests for something another thread or process makes true, with a deadline.
#pragma once

#include <chrono>
#include <functional>
#include <thread>

namespace kt::test {

// Polls `condition` every `poll` until it holds or `timeout` passes; returns its last value, so
// a condition that turns true at the deadline still counts.
inline bool eventually(const std::function<bool()>& condition,
                       std::chrono::milliseconds timeout = std::chrono::seconds(20),
                       std::chrono::milliseconds poll = std::chrono::milliseconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(poll);
  }
  return condition();
}

}  // namespace kt::test

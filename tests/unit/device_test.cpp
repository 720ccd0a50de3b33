#include "worker/device.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

namespace kt {
namespace {

using worker::Device;
using worker::MemoryKind;
using worker::Stream;

TEST(Device, AllocationsAreAlignedZeroedAndCountedByKind) {
  auto device = Device::cpu();
  const size_t before = device->bytes_in_use()[MemoryKind::kWorkspace];
  {
    auto buffer = device->allocate_floats(1001, MemoryKind::kWorkspace);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.data()) % 64, 0u);
    for (size_t i = 0; i < buffer.size(); ++i) ASSERT_EQ(buffer.data()[i], 0.0f);
    EXPECT_EQ(device->bytes_in_use()[MemoryKind::kWorkspace], before + 1001 * sizeof(float));
    auto moved = std::move(buffer);
    EXPECT_EQ(buffer.data(), nullptr);
    EXPECT_EQ(device->bytes_in_use()[MemoryKind::kWorkspace], before + 1001 * sizeof(float));
  }
  EXPECT_EQ(device->bytes_in_use()[MemoryKind::kWorkspace], before);
}

TEST(Stream, RunsTasksInOrderOnItsOwnThread) {
  Stream stream("test");
  std::vector<int> order;
  const auto caller = std::this_thread::get_id();
  std::thread::id worker;
  for (int i = 0; i < 100; ++i)
    stream.enqueue([&, i] {
      order.push_back(i);
      worker = std::this_thread::get_id();
    });
  stream.synchronize();
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
  EXPECT_NE(worker, caller);
}

TEST(Stream, RethrowsATaskFailureAtSynchronize) {
  Stream stream("test");
  stream.enqueue([] { throw std::runtime_error("disk full"); });
  int after = 0;
  stream.enqueue([&] { after = 1; });  // later work still runs
  EXPECT_THROW(stream.synchronize(), std::runtime_error);
  EXPECT_EQ(after, 1);
  EXPECT_NO_THROW(stream.synchronize());
}

TEST(Stream, EventsOrderWorkAcrossStreams) {
  Stream producer("producer"), consumer("consumer");
  // The producer's task is held until the test opens `gate`, so its event cannot be ready, and
  // the consumer, waiting on it, cannot run its task, while the test looks.
  std::promise<void> gate;
  const std::shared_future<void> opened = gate.get_future().share();
  std::atomic<int> value{0}, seen{-1};
  producer.enqueue([&value, opened] {
    opened.wait();
    value = 42;
  });
  const auto produced = producer.record();
  consumer.wait(produced);
  consumer.enqueue([&] { seen = value.load(); });
  const auto consumed = consumer.record();
  EXPECT_FALSE(produced.ready());
  EXPECT_FALSE(consumed.ready());
  EXPECT_EQ(seen, -1);
  gate.set_value();
  consumer.synchronize();
  EXPECT_EQ(seen, 42);
  EXPECT_TRUE(produced.ready());
  EXPECT_TRUE(consumed.ready());
  worker::Event never_recorded;
  EXPECT_TRUE(never_recorded.ready());
}

}  // namespace
}  // namespace kt

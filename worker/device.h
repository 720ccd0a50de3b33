// The device a rank computes on. Now: the CPU — an allocator that tracks bytes by kind, streams
// that are worker threads running tasks in order, and events recorded on a stream. The CUDA
// device (worker/cuda_device.h) has the same shape over cudaMalloc'd memory, cudaStream_t and
// cudaEvent_t.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "worker/memory_kind.h"

namespace kt::worker {

// This machine's CPU model ("model name" in /proc/cpuinfo), or "unknown".
std::string cpu_model_name();

// An owning, 64-byte aligned, zero-initialised float buffer on a device.
class DeviceBuffer;

class Device {
 public:
  static std::shared_ptr<Device> cpu();
  // Host memory the offload engine keeps state in (pinned memory on CUDA). On the CPU backend it
  // is the same DRAM as cpu(), tracked apart so that metrics show what the engine moved out.
  static std::shared_ptr<Device> host();
  const std::string& name() const { return name_; }  // "cpu", later "cuda:0"

  DeviceBuffer allocate_floats(size_t count, MemoryKind kind);
  // Bytes in use per kind (for metrics and the plan's memory check).
  std::map<MemoryKind, size_t> bytes_in_use() const;

 private:
  friend class DeviceBuffer;
  explicit Device(std::string name) : name_(std::move(name)) {}
  void release(size_t bytes, MemoryKind kind);

  std::string name_;
  mutable std::mutex mutex_;
  std::map<MemoryKind, size_t> in_use_;
};

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  float* data() const { return data_; }
  size_t size() const { return count_; }

 private:
  friend class Device;
  Device* device_ = nullptr;
  float* data_ = nullptr;
  size_t count_ = 0;
  MemoryKind kind_ = MemoryKind::kWorkspace;
};

// A point in a stream's work: done when everything enqueued before it has run (cudaEvent_t's
// CPU analogue). Cheap to copy; every copy sees the same point.
class Event {
 public:
  Event() = default;
  bool ready() const;
  void synchronize() const;  // blocks until ready

 private:
  friend class Stream;
  std::shared_future<void> done_;
};

// Work that completes in order on its own thread (a CUDA stream's CPU analogue). Owned by whoever
// created it; the destructor finishes queued work, then joins.
class Stream {
 public:
  explicit Stream(std::string name);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  void enqueue(std::function<void()> task);
  // An event that becomes ready when the work enqueued so far has run.
  Event record();
  // Work enqueued after this waits until `event` is ready (which may belong to another stream).
  void wait(const Event& event);
  // Blocks until everything enqueued so far has run. Rethrows the first exception a task threw.
  void synchronize();

 private:
  void run();

  std::string name_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> queue_;
  size_t enqueued_ = 0, completed_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace kt::worker

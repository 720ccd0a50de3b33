#include "worker/device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>

namespace kt::worker {

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(std::min(line.size(), colon + 2));
    }
  return "unknown";
}

std::shared_ptr<Device> Device::cpu() {
  static std::shared_ptr<Device> device(new Device("cpu"));
  return device;
}

std::shared_ptr<Device> Device::host() {
  static std::shared_ptr<Device> device(new Device("host"));
  return device;
}

DeviceBuffer Device::allocate_floats(size_t count, MemoryKind kind) {
  DeviceBuffer buffer;
  const size_t bytes = (count * sizeof(float) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes == 0 ? 64 : bytes);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, bytes);
  buffer.device_ = this;
  buffer.data_ = static_cast<float*>(p);
  buffer.count_ = count;
  buffer.kind_ = kind;
  std::lock_guard lock(mutex_);
  in_use_[kind] += count * sizeof(float);
  return buffer;
}

std::map<MemoryKind, size_t> Device::bytes_in_use() const {
  std::lock_guard lock(mutex_);
  return in_use_;
}

void Device::release(size_t bytes, MemoryKind kind) {
  std::lock_guard lock(mutex_);
  in_use_[kind] -= bytes;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept {
  *this = std::move(other);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    this->~DeviceBuffer();
    device_ = other.device_;
    data_ = other.data_;
    count_ = other.count_;
    kind_ = other.kind_;
    other.device_ = nullptr;
    other.data_ = nullptr;
    other.count_ = 0;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_) {
    device_->release(count_ * sizeof(float), kind_);
    std::free(data_);
    data_ = nullptr;
  }
}

Stream::Stream(std::string name) : name_(std::move(name)), thread_([this] { run(); }) {}

Stream::~Stream() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void Stream::enqueue(std::function<void()> task) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(task));
    ++enqueued_;
  }
  changed_.notify_all();
}

bool Event::ready() const {
  return !done_.valid() || done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

void Event::synchronize() const {
  if (done_.valid()) done_.wait();
}

Event Stream::record() {
  auto promise = std::make_shared<std::promise<void>>();
  Event event;
  event.done_ = promise->get_future().share();
  enqueue([promise] { promise->set_value(); });
  return event;
}

void Stream::wait(const Event& event) {
  enqueue([event] { event.synchronize(); });
}

void Stream::synchronize() {
  std::unique_lock lock(mutex_);
  const size_t target = enqueued_;
  changed_.wait(lock, [&] { return completed_ >= target; });
  if (error_) {
    auto error = error_;
    error_ = nullptr;
    std::rethrow_exception(error);
  }
}

void Stream::run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued has run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      task();
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    {
      std::lock_guard lock(mutex_);
      ++completed_;
    }
    changed_.notify_all();
  }
}

}  // namespace kt::worker

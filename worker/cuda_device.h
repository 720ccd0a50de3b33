// The CUDA device of a rank (docs/WORKER.md, "The CUDA runtime"): the CPU Device's shape
// (worker/device.h) over cudaMalloc'd memory, cudaStream_t and cudaEvent_t. Device memory and
// pinned host memory come from caching allocators (worker/caching_allocator.h), so that after the
// first step a training step makes no cudaMalloc/cudaFree/cudaHostAlloc call. No CUDA header here:
// CPU-only code may include it (it only links where the CUDA path is built: target kt_cuda_device).
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <string>

#include "worker/caching_allocator.h"

struct CUstream_st;
struct CUevent_st;

namespace kt::worker {

// A point in a stream's work (cudaEvent_t without timing).
class CudaEvent {
 public:
  CudaEvent();
  ~CudaEvent();
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  bool ready() const;        // cudaEventQuery
  void synchronize() const;  // blocks the host until the event's work is done
  CUevent_st* handle() const { return event_; }

 private:
  CUevent_st* event_ = nullptr;
};

// A non-blocking stream (no implicit synchronisation with the legacy default stream).
class CudaStream {
 public:
  explicit CudaStream(std::string name);
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  void record(CudaEvent& event);      // event := the work enqueued so far
  void wait(const CudaEvent& event);  // later work waits for `event` (any stream's)
  void synchronize();
  CUstream_st* handle() const { return stream_; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  CUstream_st* stream_ = nullptr;
};

// The streams of a rank, one per kind of work, so that copies and communication overlap compute
// (SynergyScale's stream-level partitioning; Oases' communication stream).
enum class StreamRole {
  kCompute,
  kTensorParallelComm,
  kDataParallelComm,
  kHostToDevice,
  kDeviceToHost
};
constexpr size_t kStreamRoles = 5;
const char* to_string(StreamRole role);

class CudaDevice {
 public:
  // Number of usable CUDA devices; 0 when there is no driver or no device (never throws).
  static int device_count();
  // Why device_count() is 0, in words (the CUDA error string), or "" when devices exist.
  static std::string unavailable_reason();

  explicit CudaDevice(int ordinal);  // makes `ordinal` current on the calling thread
  ~CudaDevice();
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  const std::string& name() const { return name_; }  // "cuda:0"
  int ordinal() const { return ordinal_; }
  std::string product() const;  // "NVIDIA H200", from cudaGetDeviceProperties
  size_t total_memory_bytes() const;
  // "0000:3B:00.0": the same for every process on this GPU (CUDA_VISIBLE_DEVICES renumbers
  // ordinals, not bus ids).
  std::string pci_bus_id() const;
  int compute_capability() const;  // major·10 + minor: 90 for an H100/H200

  CudaStream& stream(StreamRole role) { return *streams_[static_cast<size_t>(role)]; }

  void* allocate(size_t bytes, MemoryKind kind) { return device_memory_.allocate(bytes, kind); }
  void deallocate(void* ptr) { device_memory_.deallocate(ptr); }
  // Page-locked host memory for the offload engine's transfers (cudaHostAlloc).
  void* allocate_pinned(size_t bytes, MemoryKind kind) {
    return pinned_memory_.allocate(bytes, kind);
  }
  void deallocate_pinned(void* ptr) { pinned_memory_.deallocate(ptr); }
  void release_cached() { device_memory_.release_cached(); }  // cudaFree of whole free segments
  AllocatorStats device_memory_stats() const { return device_memory_.stats(); }
  AllocatorStats pinned_memory_stats() const { return pinned_memory_.stats(); }

  // Asynchronous copies on `stream` (cudaMemcpyAsync, kind inferred by unified addressing).
  void copy(void* dst, const void* src, size_t bytes, CudaStream& stream);
  void synchronize();  // the whole device

 private:
  int ordinal_;
  std::string name_;
  std::array<std::unique_ptr<CudaStream>, kStreamRoles> streams_;
  CachingAllocator device_memory_;
  CachingAllocator pinned_memory_;
};

}  // namespace kt::worker

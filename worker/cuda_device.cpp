#include "worker/cuda_device.h"

#include <cuda_runtime.h>

#include "kernels/cuda/check.h"

namespace kt::worker {

CudaEvent::CudaEvent() {
  cudaEvent_t event = nullptr;
  KT_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  event_ = event;
}
CudaEvent::~CudaEvent() {
  cudaEventDestroy(event_);
}
bool CudaEvent::ready() const {
  const cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) {
    cudaGetLastError();  // not an error: clear it
    return false;
  }
  KT_CUDA_CHECK(status);
  return true;
}
void CudaEvent::synchronize() const {
  KT_CUDA_CHECK(cudaEventSynchronize(event_));
}

CudaStream::CudaStream(std::string name) : name_(std::move(name)) {
  cudaStream_t stream = nullptr;
  KT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  stream_ = stream;
}
CudaStream::~CudaStream() {
  cudaStreamDestroy(stream_);
}
void CudaStream::record(CudaEvent& event) {
  KT_CUDA_CHECK(cudaEventRecord(event.handle(), stream_));
}
void CudaStream::wait(const CudaEvent& event) {
  KT_CUDA_CHECK(cudaStreamWaitEvent(stream_, event.handle(), 0));
}
void CudaStream::synchronize() {
  KT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

const char* to_string(StreamRole role) {
  switch (role) {
    case StreamRole::kCompute:
      return "compute";
    case StreamRole::kTensorParallelComm:
      return "tp-comm";
    case StreamRole::kDataParallelComm:
      return "dp-comm";
    case StreamRole::kHostToDevice:
      return "h2d";
    case StreamRole::kDeviceToHost:
      return "d2h";
  }
  return "?";
}

int CudaDevice::device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

std::string CudaDevice::unavailable_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
  }
  return count == 0 ? "no CUDA device" : "";
}

namespace {
RawMemory device_raw_memory(int ordinal) {
  return {[ordinal](size_t bytes) -> void* {
            KT_CUDA_CHECK(cudaSetDevice(ordinal));
            void* ptr = nullptr;
            const cudaError_t status = cudaMalloc(&ptr, bytes);
            if (status == cudaErrorMemoryAllocation) {
              cudaGetLastError();  // out of memory: the allocator frees its cache and retries
              return nullptr;
            }
            KT_CUDA_CHECK(status);
            return ptr;
          },
          [](void* ptr) { KT_CUDA_CHECK(cudaFree(ptr)); }};
}
RawMemory pinned_raw_memory() {
  return {[](size_t bytes) -> void* {
            void* ptr = nullptr;
            const cudaError_t status = cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable);
            if (status == cudaErrorMemoryAllocation) {
              cudaGetLastError();
              return nullptr;
            }
            KT_CUDA_CHECK(status);
            return ptr;
          },
          [](void* ptr) { KT_CUDA_CHECK(cudaFreeHost(ptr)); }};
}
int set_device(int ordinal) {
  KT_CUDA_CHECK(cudaSetDevice(ordinal));
  return ordinal;
}
}  // namespace

CudaDevice::CudaDevice(int ordinal)
    : ordinal_(set_device(ordinal)),
      name_("cuda:" + std::to_string(ordinal)),
      device_memory_(name_, device_raw_memory(ordinal)),
      pinned_memory_(name_ + " pinned host", pinned_raw_memory()) {
  for (size_t i = 0; i < kStreamRoles; ++i)
    streams_[i] = std::make_unique<CudaStream>(name_ + "/" + to_string(static_cast<StreamRole>(i)));
}

CudaDevice::~CudaDevice() {
  cudaDeviceSynchronize();
}

std::string CudaDevice::product() const {
  cudaDeviceProp prop{};
  KT_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal_));
  return prop.name;
}

size_t CudaDevice::total_memory_bytes() const {
  cudaDeviceProp prop{};
  KT_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal_));
  return prop.totalGlobalMem;
}

int CudaDevice::compute_capability() const {
  cudaDeviceProp prop{};
  KT_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal_));
  return prop.major * 10 + prop.minor;
}

std::string CudaDevice::pci_bus_id() const {
  char id[32] = {};
  KT_CUDA_CHECK(cudaDeviceGetPCIBusId(id, sizeof id, ordinal_));
  return id;
}

void CudaDevice::copy(void* dst, const void* src, size_t bytes, CudaStream& stream) {
  KT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream.handle()));
}

void CudaDevice::synchronize() {
  KT_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace kt::worker

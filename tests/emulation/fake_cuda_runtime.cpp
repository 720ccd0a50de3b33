// The CUDA runtime calls the CUDA model makes, emulated on the host for gpu_tests' model tests
// (tests/emulation/README.md): "device" memory is host memory, every copy and memset happens at
// once, streams and events are tokens (everything is already complete when enqueued). Declared by
// the toolkit's own cuda_runtime_api.h, so the signatures are the real ones; linked instead of
// libcudart.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>

namespace {
thread_local cudaError_t g_last = cudaSuccess;

cudaError_t ok() { return cudaSuccess; }
}  // namespace

extern "C" {

cudaError_t CUDARTAPI cudaGetDeviceCount(int* count) {
  *count = 1;
  return ok();
}
cudaError_t CUDARTAPI cudaSetDevice(int) { return ok(); }
cudaError_t CUDARTAPI cudaGetDeviceProperties(cudaDeviceProp* prop, int) {
  std::memset(prop, 0, sizeof *prop);
  std::strncpy(prop->name, "emulated on the host", sizeof prop->name - 1);
  prop->major = 9;
  prop->minor = 0;
  prop->totalGlobalMem = size_t{8} << 30;
  return ok();
}
cudaError_t CUDARTAPI cudaDeviceGetPCIBusId(char* id, int len, int) {
  std::strncpy(id, "0000:00:00.0", static_cast<size_t>(len));
  return ok();
}
cudaError_t CUDARTAPI cudaDeviceSynchronize() { return ok(); }
cudaError_t CUDARTAPI cudaGetLastError() {
  const cudaError_t last = g_last;
  g_last = cudaSuccess;
  return last;
}
const char* CUDARTAPI cudaGetErrorString(cudaError_t error) {
  return error == cudaSuccess ? "no error" : "emulated CUDA error";
}
const char* CUDARTAPI cudaGetErrorName(cudaError_t error) {
  return error == cudaSuccess ? "cudaSuccess" : "cudaErrorEmulated";
}

cudaError_t CUDARTAPI cudaMalloc(void** ptr, size_t bytes) {
  *ptr = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  return *ptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t CUDARTAPI cudaFree(void* ptr) {
  std::free(ptr);
  return ok();
}
cudaError_t CUDARTAPI cudaHostAlloc(void** ptr, size_t bytes, unsigned int) {
  return cudaMalloc(ptr, bytes);
}
cudaError_t CUDARTAPI cudaFreeHost(void* ptr) { return cudaFree(ptr); }

cudaError_t CUDARTAPI cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  std::memmove(dst, src, bytes);
  return ok();
}
cudaError_t CUDARTAPI cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind,
                                      cudaStream_t) {
  std::memmove(dst, src, bytes);
  return ok();
}
cudaError_t CUDARTAPI cudaMemset(void* ptr, int value, size_t bytes) {
  std::memset(ptr, value, bytes);
  return ok();
}
cudaError_t CUDARTAPI cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t) {
  std::memset(ptr, value, bytes);
  return ok();
}

cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  *stream = reinterpret_cast<cudaStream_t>(new char);
  return ok();
}
cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t stream) {
  delete reinterpret_cast<char*>(stream);
  return ok();
}
cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t) { return ok(); }
cudaError_t CUDARTAPI cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) { return ok(); }

cudaError_t CUDARTAPI cudaEventCreate(cudaEvent_t* event) {
  *event = reinterpret_cast<cudaEvent_t>(new char);
  return ok();
}
cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  return cudaEventCreate(event);
}
cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t event) {
  delete reinterpret_cast<char*>(event);
  return ok();
}
cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t, cudaStream_t) { return ok(); }
cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t) { return ok(); }
cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t) { return ok(); }
cudaError_t CUDARTAPI cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 0.0f;
  return ok();
}

}  // extern "C"

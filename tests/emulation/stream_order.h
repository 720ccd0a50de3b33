// Stream-order checking in the emulated CUDA runtime (tests/emulation/README.md). The emulation
// runs every operation at once, in issue order, so a missing event wait cannot change a result
// there. Instead, fake_cuda_runtime.cpp keeps a vector clock per stream and per event, as CUDA
// orders work: a stream's operations after its earlier ones, after the events it waits for
// (cudaStreamWaitEvent), and after whatever the host had synchronised with (cudaStreamSynchronize,
// cudaEventSynchronize, cudaDeviceSynchronize, cudaFree) when it enqueued them. Every byte of
// memory from cudaMalloc and cudaHostAlloc remembers its last write and the reads since; an
// access that is not ordered after a conflicting one (write/write, write/read, read/write) on
// another stream, or by the host, is a race: printed once per pair of operations and counted.
//
// The host is one agent for all its threads: ordering between host threads (mutexes, condition
// variables) is ThreadSanitizer's business, not this checker's.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <vector>

struct CUstream_st;

namespace kt::emulation {

struct Access {
  const void* ptr;  // null or 0 bytes: no access (an optional operand)
  size_t bytes;
  bool write;  // read-modify-write counts as a write
};
inline Access reads(const void* ptr, size_t bytes) {
  return {ptr, bytes, false};
}
inline Access writes(const void* ptr, size_t bytes) {
  return {ptr, bytes, true};
}

// One operation (`what`: a kernel's name) enqueued on `stream` that makes these accesses.
void device_op(CUstream_st* stream, const char* what, std::initializer_list<Access> accesses);
void device_op(CUstream_st* stream, const char* what, const std::vector<Access>& accesses);
// Host code's own access to memory a stream may touch (pinned buffers): `what` names it.
void host_access(const char* what, Access access);

// Races found so far in this process.
size_t stream_order_races();

}  // namespace kt::emulation

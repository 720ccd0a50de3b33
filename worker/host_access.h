// Declares host code's own reads and writes of memory that CUDA streams also touch (pinned
// buffers), so that the stream-order checker of the emulated build (tests/emulation/README.md)
// can see them: a host read of a buffer whose device→host copy the host has not waited for is a
// race there. In every other build these compile to nothing.
#pragma once

#include <cstddef>

namespace kt::worker {

#ifdef KT_CUDA_EMULATED
// The checker's entry point, which this header only declares: the emulated CUDA runtime
// (tests/emulation/fake_cuda_runtime.cpp), linked into every KT_CUDA_EMULATED program, defines it.
void emulated_host_access(const char* what, const void* ptr, size_t bytes, bool write);
#endif

inline void host_reads([[maybe_unused]] const char* what, [[maybe_unused]] const void* ptr,
                       [[maybe_unused]] size_t bytes) {
#ifdef KT_CUDA_EMULATED
  emulated_host_access(what, ptr, bytes, /*write=*/false);
#endif
}

inline void host_writes([[maybe_unused]] const char* what, [[maybe_unused]] const void* ptr,
                        [[maybe_unused]] size_t bytes) {
#ifdef KT_CUDA_EMULATED
  emulated_host_access(what, ptr, bytes, /*write=*/true);
#endif
}

}  // namespace kt::worker

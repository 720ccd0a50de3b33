// Declares host code's own reads and writes of memory that CUDA streams also touch (pinned
// buffers), so that the stream-order checker of the emulated build (tests/emulation/README.md)
// can see them: a host read of a buffer whose device→host copy the host has not waited for is a
// race there. In every other build these compile to nothing.
#pragma once

#include <cstddef>

#ifdef KT_CUDA_EMULATED
#include "tests/emulation/stream_order.h"
#endif

namespace kt::worker {

inline void host_reads([[maybe_unused]] const char* what, [[maybe_unused]] const void* ptr,
                       [[maybe_unused]] size_t bytes) {
#ifdef KT_CUDA_EMULATED
  emulation::host_access(what, emulation::reads(ptr, bytes));
#endif
}

inline void host_writes([[maybe_unused]] const char* what, [[maybe_unused]] const void* ptr,
                        [[maybe_unused]] size_t bytes) {
#ifdef KT_CUDA_EMULATED
  emulation::host_access(what, emulation::writes(ptr, bytes));
#endif
}

}  // namespace kt::worker

// What a block of device memory is for, as in kubetrain_worker_memory_bytes{kind}.
#pragma once

namespace kt::worker {

enum class MemoryKind { kParams, kGrads, kOptimizer, kActivations, kWorkspace };
const char* to_string(MemoryKind kind);

}  // namespace kt::worker

// Activation recompute, one meaning on both devices (the CPU model, worker/gpt.h, and the CUDA
// model, worker/cuda_gpt.h), for the Plan's `recompute` (api::Recompute):
//   kNone:      every layer keeps all its activations for its backward.
//   kFull:      each layer keeps its input (its checkpoint); before the layer's backward its
//               forward is re-run from that input into one working set shared by all layers,
//               the attention projection's GEMM and TP all-reduce included.
//   kCommAware: communication-aware recompute (Oases, IEEE TPDS 2025): each layer also keeps the
//               TP-summed outputs of the two ops that an all-reduce follows, the row-parallel
//               attention projection and fc2, so the re-run does neither GEMM and no
//               communication — only LayerNorms, qkv, attention, fc and GELU.
// A layer's checkpoint is what the window offload streams to host memory and back (and what
// the planner's pcieBytesPerStep and memory model count): its input, then with commAware the
// summed attention projection and the summed fc2 output, each B·T·C.
#pragma once

#include "api/enums.h"

namespace kt::worker {

// The tensors of a layer's activation checkpoint, in the order the offload engines lay them out.
enum class CheckpointTensor : int { kInput, kAttentionProjection, kFc2 };

// How many B·T·C tensors a layer's checkpoint holds: 0 without recompute.
constexpr int checkpoint_tensors(api::Recompute mode) {
  return mode == api::Recompute::kNone ? 0 : mode == api::Recompute::kCommAware ? 3 : 1;
}

}  // namespace kt::worker

// The one count of a GPT's model FLOPs, for the planner's predicted MFU and both workers' measured
// MFU. Header-only and free of other types, so the GPU-only build uses it too.
#pragma once

#include <cstdint>

namespace kt::api {

// Model FLOPs per trained token, forward and backward: 6 per parameter (2 forward, 4 backward)
// plus attention's 12 · layers · channels · seq_len (QKᵀ and AV), as llm.c and Megatron-LM count
// them; recomputation is not model work. The whole model: all parameters and all channels. One
// rank of a TP group of t: the parameters it holds and its C/t channels of attention.
inline double gpt_flops_per_token(double parameters, int64_t layers, int64_t channels,
                                  int64_t seq_len) {
  return 6.0 * parameters +
         12.0 * static_cast<double>(layers) * static_cast<double>(channels) *
             static_cast<double>(seq_len);
}

}  // namespace kt::api

// The CPU worker's activation layout: what one lane (a micro-batch, or one of its Oases
// sub-batches) of a rank's model allocates, in floats. Part of the contract because two sides
// must agree on it: the worker allocates it (worker/gpt.cpp) and the planner charges it to the
// rank's memory (planner/cost_model.cpp), which sets the pod's memory limit.
//
// B, T: the lane's sequences and tokens per sequence; C: channels; Cl = C/t, NHl = heads/t,
// Fl = ffn/t, Vl = padded vocabulary/t (0 on a pipeline stage without the logits); L: the
// model's (or stage's) layers; Lw: layers of working set (L, or 1 when recomputing); Lp: layers
// of the attention and MLP projections (L, or 1 with full recomputation). The layer inputs
// (residual3) are kept for every layer. Per-layer tensors are stacked along a leading L.
#pragma once

#include <array>
#include <cstdint>

namespace kt::api {

inline constexpr int kCpuActivationTensors = 22;

// In the order of the worker's Acts struct: encoded, ln1, ln1_mean, ln1_rstd, qkv, atty,
// preatt, att, attproj, residual2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu, fcproj, residual3,
// lnf, lnf_mean, lnf_rstd, logits, losses.
inline std::array<int64_t, kCpuActivationTensors> cpu_activation_sizes(
    int64_t L, int64_t C, int64_t B, int64_t T, int64_t Cl, int64_t NHl, int64_t Fl, int64_t Vl,
    int64_t Lw, int64_t Lp) {
  const int64_t BT = B * T;
  return {BT * C,      Lw * BT * C,  Lw * BT,          Lw * BT,          Lw * BT * 3 * Cl,
          Lw * BT * Cl, Lw * B * NHl * T * T, Lw * B * NHl * T * T, Lp * BT * C, Lw * BT * C,
          Lw * BT * C,  Lw * BT,      Lw * BT,          Lw * BT * Fl,     Lw * BT * Fl,
          Lp * BT * C,  L * BT * C,   BT * C,           BT,               BT,
          BT * Vl,      BT};
}

inline int64_t cpu_activation_floats(int64_t L, int64_t C, int64_t B, int64_t T, int64_t Cl,
                                     int64_t NHl, int64_t Fl, int64_t Vl, int64_t Lw,
                                     int64_t Lp) {
  int64_t n = 0;
  for (const int64_t s : cpu_activation_sizes(L, C, B, T, Cl, NHl, Fl, Vl, Lw, Lp)) n += s;
  return n;
}

}  // namespace kt::api

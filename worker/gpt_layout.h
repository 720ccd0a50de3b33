// GPT-2's parameters as both models lay them out (the CPU model, worker/gpt.h, and the CUDA
// model, worker/cuda_gpt.h): the 16 tensors in llm.c's order and shapes, one buffer for all, so
// llm.c checkpoints import and export; which tensors AdamW decays; the offload units; and the
// initialisation. Header-only and free of the Plan types, so the GPU-only build can use it.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "worker/tensor_view.h"

namespace kt::api {
struct ModelDims;
}

namespace kt::worker {

struct GptConfig {
  int64_t max_seq_len = 0;   // maxT: rows of wpe
  int64_t vocab = 0;         // V
  int64_t padded_vocab = 0;  // Vp
  int64_t layers = 0;        // L
  int64_t heads = 0;         // NH
  int64_t channels = 0;      // C
  int64_t ffn = 0;           // F (4C in GPT-2)
  static GptConfig from(const api::ModelDims& m);  // worker/gpt.cpp
};

inline constexpr int kNumParamTensors = 16;
inline constexpr std::array<const char*, kNumParamTensors> kParamNames = {
    "wte",  "wpe",  "ln1w", "ln1b", "qkvw",    "qkvb",    "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw", "fcprojb", "lnfw",     "lnfb"};

// Elements of each tensor on one rank of a TP group of size t (t = 1: the whole model). Sharded:
// wte's rows (Vp/t), the heads of qkv and attproj (C/t channels), the ffn units of fc and fcproj.
inline std::array<int64_t, kNumParamTensors> gpt_param_sizes(const GptConfig& c, int64_t t = 1) {
  const int64_t C = c.channels, L = c.layers, maxT = c.max_seq_len;
  const int64_t Vl = c.padded_vocab / t, Cl = C / t, Fl = c.ffn / t;
  return {Vl * C,     maxT * C, L * C, L * C, L * 3 * Cl * C, L * 3 * Cl,
          L * C * Cl, L * C,    L * C, L * C, L * Fl * C,     L * Fl,
          L * C * Fl, L * C,    C,     C};
}

// Whether AdamW decays a tensor: the matrices (wte, wpe, qkvw, attprojw, fcw, fcprojw) yes,
// biases and LayerNorm parameters no.
inline bool gpt_decays(int tensor_index) {
  return tensor_index == 0 || tensor_index == 1 || tensor_index == 4 || tensor_index == 6 ||
         tensor_index == 10 || tensor_index == 12;
}

// The offload units (SynergyScale's unit of placement): 0 = wte, wpe, lnfw, lnfb; l + 1 = layer
// l, one slice of each of the 12 stacked per-layer tensors (2..13, shaped (L, ...)).
struct ParamSlice {
  int tensor;
  int64_t offset;  // elements from the start of the parameter (or gradient) buffer
  int64_t count;
};
inline std::vector<ParamSlice> gpt_unit_slices(const std::array<int64_t, kNumParamTensors>& sizes,
                                               int64_t layers, int64_t unit) {
  std::vector<ParamSlice> out;
  int64_t offset = 0;
  for (int i = 0; i < kNumParamTensors; ++i) {
    const bool layer_tensor = i >= 2 && i <= 13;
    if (unit == 0 && !layer_tensor) out.push_back({i, offset, sizes[i]});
    if (unit > 0 && layer_tensor) {
      const int64_t per_layer = sizes[i] / layers;
      out.push_back({i, offset + (unit - 1) * per_layer, per_layer});
    }
    offset += sizes[i];
  }
  return out;
}

// GPT-2's initialisation (Radford et al. 2019; llm.c) of the whole logical tensor `tensor_index`
// (n elements), drawing from `rng` through `normal` (N(0, 1)) in element order: weights
// N(0, 0.02), the residual projections (attprojw, fcprojw) N(0, 0.02/√(2L)), biases 0, LayerNorm
// weights 1; wte's padded vocabulary rows 0 (never targets). Both models draw tensor by tensor
// with one generator, so a seed gives the same model on the CPU and on CUDA at any TP degree.
inline void gpt_initial_values(const GptConfig& c, int tensor_index, int64_t n,
                               std::mt19937_64& rng, std::normal_distribution<float>& normal,
                               float* out) {
  const std::string name = kParamNames[tensor_index];
  const float residual_std = 0.02f / std::sqrt(2.0f * static_cast<float>(c.layers));
  const bool layernorm_weight = name == "ln1w" || name == "ln2w" || name == "lnfw";
  const bool bias = name.back() == 'b';  // qkvb, fcb, ...: biases and LayerNorm biases
  for (int64_t j = 0; j < n; ++j) {
    if (layernorm_weight)
      out[j] = 1.0f;
    else if (bias)
      out[j] = 0.0f;
    else if (name == "attprojw" || name == "fcprojw")
      out[j] = residual_std * normal(rng);
    else
      out[j] = 0.02f * normal(rng);
  }
  if (tensor_index == 0)
    for (int64_t j = c.vocab * c.channels; j < n; ++j) out[j] = 0.0f;
}

// The 16 tensors of a whole (unsharded) model over `base` (llm.c's order and shapes).
inline std::vector<TensorView> gpt_whole_views(const GptConfig& c, float* base) {
  const int64_t Vp = c.padded_vocab, C = c.channels, L = c.layers, F = c.ffn;
  const std::vector<std::vector<int64_t>> shapes = {
      {Vp, C}, {c.max_seq_len, C}, {L, C},    {L, C},    {L, 3 * C, C}, {L, 3 * C},
      {L, C, C}, {L, C},           {L, C},    {L, C},    {L, F, C},     {L, F},
      {L, C, F}, {L, C},           {C},       {C}};
  std::vector<TensorView> out;
  for (int i = 0; i < kNumParamTensors; ++i) {
    out.push_back({kParamNames[i], shapes[i], base, {}, {}});
    base += out.back().numel();
  }
  return out;
}

// The tensors rank r of a TP group of t holds over `base` (gpt_param_sizes(c, t) floats), with
// their place in the logical tensors (Megatron's split): wte's rows, the q, k and v rows of the
// rank's heads and their columns of attproj, the rank's ffn units of fc (rows) and fcproj
// (columns); everything else replicated. t = 1: gpt_whole_views.
inline std::vector<TensorView> gpt_rank_views(const GptConfig& c, int64_t t, int64_t r,
                                              float* base) {
  if (t == 1) return gpt_whole_views(c, base);
  const int64_t Vp = c.padded_vocab, C = c.channels, L = c.layers, F = c.ffn;
  const int64_t Vl = Vp / t, Cl = C / t, Fl = F / t;
  const auto sizes = gpt_param_sizes(c, t);
  std::vector<TensorView> out;
  auto add = [&](int i, std::vector<int64_t> shape, std::vector<int64_t> logical = {},
                 std::vector<int64_t> offset = {}) {
    out.push_back({kParamNames[i], std::move(shape), base, std::move(logical), std::move(offset)});
    base += sizes[i];
  };
  add(0, {Vl, C}, {Vp, C}, {r * Vl, 0});
  add(1, {c.max_seq_len, C});
  add(2, {L, C});
  add(3, {L, C});
  add(4, {L, 3, Cl, C}, {L, 3, C, C}, {0, 0, r * Cl, 0});  // q, k, v rows of this rank's heads
  add(5, {L, 3, Cl}, {L, 3, C}, {0, 0, r * Cl});
  add(6, {L, C, Cl}, {L, C, C}, {0, 0, r * Cl});
  add(7, {L, C});
  add(8, {L, C});
  add(9, {L, C});
  add(10, {L, Fl, C}, {L, F, C}, {0, r * Fl, 0});
  add(11, {L, Fl}, {L, F}, {0, r * Fl});
  add(12, {L, C, Fl}, {L, C, F}, {0, 0, r * Fl});
  add(13, {L, C});
  add(14, {C});
  add(15, {C});
  return out;
}

// Walks the slice that `view` holds of its row-major logical tensor (view.offset and view.shape
// per dimension) one innermost row at a time: fn(offset in the logical tensor, offset in
// view.data, length). A view without logical shape is one row: the whole tensor.
template <class Fn>
void gpt_for_each_slice_row(const TensorView& view, Fn fn) {
  if (view.logical_shape.empty()) {
    fn(int64_t{0}, int64_t{0}, view.numel());
    return;
  }
  const auto& L = view.logical_shape;
  const auto& S = view.shape;
  const size_t dims = S.size();
  std::vector<int64_t> index(dims, 0);
  for (int64_t in_view = 0;; in_view += S.back()) {
    int64_t in_logical = 0;
    for (size_t d = 0; d < dims; ++d)
      in_logical = in_logical * L[d] + view.offset[d] + (d + 1 < dims ? index[d] : 0);
    fn(in_logical, in_view, S.back());
    int d = static_cast<int>(dims) - 2;  // advance all but the last index
    for (; d >= 0; --d) {
      if (++index[d] < S[d]) break;
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

// view.data := the slice `view` holds of the logical tensor at `logical`.
inline void gpt_copy_slice(const float* logical, const TensorView& view) {
  gpt_for_each_slice_row(view, [&](int64_t from, int64_t to, int64_t n) {
    std::memcpy(view.data + to, logical + from, static_cast<size_t>(n) * sizeof(float));
  });
}

// The inverse: the slice in view.data written into its place in the logical tensor.
inline void gpt_paste_slice(const TensorView& view, float* logical) {
  gpt_for_each_slice_row(view, [&](int64_t to, int64_t from, int64_t n) {
    std::memcpy(logical + to, view.data + from, static_cast<size_t>(n) * sizeof(float));
  });
}

// GPT-2's initialisation of rank r's parameters (TP group of t) at `base`: every rank draws every
// whole logical tensor and keeps its slice, so every TP degree starts from the same model.
inline void gpt_init_rank(const GptConfig& c, int64_t t, int64_t r, uint64_t seed, float* base) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto views = gpt_rank_views(c, t, r, base);
  for (int i = 0; i < kNumParamTensors; ++i) {
    const TensorView& v = views[static_cast<size_t>(i)];
    int64_t n = 1;
    for (int64_t d : (v.logical_shape.empty() ? v.shape : v.logical_shape)) n *= d;
    std::vector<float> whole(static_cast<size_t>(n));
    gpt_initial_values(c, i, n, rng, normal, whole.data());
    gpt_copy_slice(whole.data(), v);
  }
}

}  // namespace kt::worker

// GPT-2's parameters as both models lay them out (the CPU model, worker/gpt.h, and the CUDA
// model, worker/cuda_gpt.h): the 16 tensors in llm.c's order and shapes, one buffer for all, so
// llm.c checkpoints import and export; which tensors AdamW decays; the offload units; and the
// initialisation. Header-only and free of the Plan types, so the GPU-only build can use it.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

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

}  // namespace kt::worker

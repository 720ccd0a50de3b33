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

// ---- The parameter table ---------------------------------------------------------------------
// GPT-2's 16 parameter tensors in llm.c's order (ParameterTensors in train_gpt2.c). Everything
// about a tensor is said once, here: sizes, offsets, the offload units' slices, the TP sharding,
// AdamW's decay mask, which gradients the backward overwrites rather than accumulates into, the
// initialisation, and the llm.c names and shapes of checkpoints and model files all derive from
// kParams.
enum Param : int {
  kWte, kWpe,  // token and position embeddings (wte is also the LM head)
  kLn1w, kLn1b, kQkvw, kQkvb, kAttprojw, kAttprojb,  // per layer: attention block
  kLn2w, kLn2b, kFcw, kFcb, kFcprojw, kFcprojb,      // per layer: MLP block
  kLnfw, kLnfb,  // the final LayerNorm
};
inline constexpr int kNumParamTensors = 16;

// A dimension of a parameter's shape, in the model's sizes.
enum class Dim : uint8_t {
  kVp,    // padded vocabulary
  kMaxT,  // rows of wpe
  kL,     // layers (the stacked per-layer tensors' first dimension)
  kC,     // channels
  kF,     // ffn units
  kThree  // q, k and v: llm.c merges it with the next dimension (3C)
};

enum class Init : uint8_t {
  kNormal,    // N(0, 0.02)
  kResidual,  // N(0, 0.02/√(2L)): the projections into the residual stream
  kOne,       // LayerNorm weights
  kZero       // biases
};

struct ParamSpec {
  const char* name;         // llm.c's
  bool per_layer;           // stacked (L, ...): layer l's slice belongs to offload unit l + 1
  std::array<Dim, 4> dims;  // logical shape; only the first `rank` are used
  int rank;
  int tp_dim;               // the dimension split across TP ranks (Megatron's split); -1: replicated
  bool decay;               // AdamW decays it (the matrices)
  bool matmul_weight;       // its gradient is overwritten by its matmul's first backward
  Init init;
};

inline constexpr std::array<ParamSpec, kNumParamTensors> kParams = {{
    // name      per_layer  dims                                      rank tp  decay matmul init
    {"wte",      false, {Dim::kVp, Dim::kC},                           2, 0,  true,  true,  Init::kNormal},
    {"wpe",      false, {Dim::kMaxT, Dim::kC},                         2, -1, true,  false, Init::kNormal},
    {"ln1w",     true,  {Dim::kL, Dim::kC},                            2, -1, false, false, Init::kOne},
    {"ln1b",     true,  {Dim::kL, Dim::kC},                            2, -1, false, false, Init::kZero},
    {"qkvw",     true,  {Dim::kL, Dim::kThree, Dim::kC, Dim::kC},      4, 2,  true,  true,  Init::kNormal},
    {"qkvb",     true,  {Dim::kL, Dim::kThree, Dim::kC},               3, 2,  false, false, Init::kZero},
    {"attprojw", true,  {Dim::kL, Dim::kC, Dim::kC},                   3, 2,  true,  true,  Init::kResidual},
    {"attprojb", true,  {Dim::kL, Dim::kC},                            2, -1, false, false, Init::kZero},
    {"ln2w",     true,  {Dim::kL, Dim::kC},                            2, -1, false, false, Init::kOne},
    {"ln2b",     true,  {Dim::kL, Dim::kC},                            2, -1, false, false, Init::kZero},
    {"fcw",      true,  {Dim::kL, Dim::kF, Dim::kC},                   3, 1,  true,  true,  Init::kNormal},
    {"fcb",      true,  {Dim::kL, Dim::kF},                            2, 1,  false, false, Init::kZero},
    {"fcprojw",  true,  {Dim::kL, Dim::kC, Dim::kF},                   3, 2,  true,  true,  Init::kResidual},
    {"fcprojb",  true,  {Dim::kL, Dim::kC},                            2, -1, false, false, Init::kZero},
    {"lnfw",     false, {Dim::kC},                                     1, -1, false, false, Init::kOne},
    {"lnfb",     false, {Dim::kC},                                     1, -1, false, false, Init::kZero},
}};

inline int64_t gpt_dim(const GptConfig& c, Dim d) {
  switch (d) {
    case Dim::kVp: return c.padded_vocab;
    case Dim::kMaxT: return c.max_seq_len;
    case Dim::kL: return c.layers;
    case Dim::kC: return c.channels;
    case Dim::kF: return c.ffn;
    case Dim::kThree: return 3;
  }
  return 0;
}

// Tensor i's logical shape (q, k, v as their own dimension, as TP splits them).
inline std::vector<int64_t> gpt_logical_shape(const GptConfig& c, int i) {
  const ParamSpec& p = kParams[static_cast<size_t>(i)];
  std::vector<int64_t> shape;
  for (int d = 0; d < p.rank; ++d) shape.push_back(gpt_dim(c, p.dims[static_cast<size_t>(d)]));
  return shape;
}

// Its shape in llm.c's files (3 and the next dimension merged: qkvw (L, 3C, C)).
inline std::vector<int64_t> gpt_llmc_shape(const GptConfig& c, int i) {
  const ParamSpec& p = kParams[static_cast<size_t>(i)];
  std::vector<int64_t> shape;
  for (int d = 0; d < p.rank; ++d) {
    const int64_t n = gpt_dim(c, p.dims[static_cast<size_t>(d)]);
    if (d > 0 && p.dims[static_cast<size_t>(d - 1)] == Dim::kThree)
      shape.back() *= n;
    else
      shape.push_back(n);
  }
  return shape;
}

// Elements of each tensor on one rank of a TP group of size t (t = 1: the whole model).
inline std::array<int64_t, kNumParamTensors> gpt_param_sizes(const GptConfig& c, int64_t t = 1) {
  std::array<int64_t, kNumParamTensors> sizes{};
  for (int i = 0; i < kNumParamTensors; ++i) {
    int64_t n = 1;
    for (int64_t d : gpt_logical_shape(c, i)) n *= d;
    sizes[static_cast<size_t>(i)] = kParams[static_cast<size_t>(i)].tp_dim >= 0 ? n / t : n;
  }
  return sizes;
}

inline bool gpt_decays(int i) {
  return kParams[static_cast<size_t>(i)].decay;
}

// Whether rank r of a TP group of t > 1 holds a slice of tensor i rather than all of it.
inline bool gpt_tp_sharded(int i, int64_t t) {
  return t > 1 && kParams[static_cast<size_t>(i)].tp_dim >= 0;
}

// The offload units (SynergyScale's unit of placement): 0 = the tensors that are not per layer
// (wte, wpe, lnfw, lnfb); l + 1 = layer l, one slice of each of the 12 stacked per-layer tensors.
// Pipeline parallelism (Narayanan et al. SC21): this rank's stage holds layers [first_layer,
// first_layer + the config's layers) of a model of `model_layers`; the first stage embeds the
// tokens, the last holds the final LayerNorm and the LM head. Every stage keeps the tensors that
// are not per layer (wte, wpe, lnfw, lnfb: offload unit 0) so that the layout stays llm.c's: the
// first and the last stage use and train them (their gradients summed between the two, so both
// copies stay equal), the ones between never read them. `in_flight`: the micro-batches whose
// activations are kept at once (1F1B: p − s on stage s).
struct PipelineStage {
  int64_t first_layer = 0;
  int64_t model_layers = 0;  // 0: the config's layers (no stages)
  bool first = true, last = true;
  int in_flight = 1;
};

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
    const bool layer_tensor = kParams[static_cast<size_t>(i)].per_layer;
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
  const float residual_std = 0.02f / std::sqrt(2.0f * static_cast<float>(c.layers));
  const Init init = kParams[static_cast<size_t>(tensor_index)].init;
  for (int64_t j = 0; j < n; ++j) {
    switch (init) {
      case Init::kOne: out[j] = 1.0f; break;
      case Init::kZero: out[j] = 0.0f; break;
      case Init::kResidual: out[j] = residual_std * normal(rng); break;
      case Init::kNormal: out[j] = 0.02f * normal(rng); break;
    }
  }
  if (tensor_index == kWte)
    for (int64_t j = c.vocab * c.channels; j < n; ++j) out[j] = 0.0f;
}

// The 16 tensors of a whole (unsharded) model over `base` (llm.c's order and shapes).
inline std::vector<TensorView> gpt_whole_views(const GptConfig& c, float* base) {
  std::vector<TensorView> out;
  for (int i = 0; i < kNumParamTensors; ++i) {
    out.push_back({kParams[static_cast<size_t>(i)].name, gpt_llmc_shape(c, i), base, {}, {}});
    base += out.back().numel();
  }
  return out;
}

// The tensors rank r of a TP group of t holds over `base` (gpt_param_sizes(c, t) floats), with
// their place in the logical tensors (Megatron's split): wte's rows, the q, k and v rows of the
// rank's heads and their columns of attproj, the rank's ffn units of fc (rows) and fcproj
// (columns); everything else replicated. A pipeline stage holds `layers` of the model's
// c.layers, from `first_layer` (layers < 0: all): its per-layer tensors are that block of
// rows (gpt_param_sizes of its own layer count). t = 1 and every layer: gpt_whole_views.
inline std::vector<TensorView> gpt_rank_views(const GptConfig& c, int64_t t, int64_t r, float* base,
                                              int64_t first_layer = 0, int64_t layers = -1) {
  if (layers < 0) layers = c.layers;
  const bool staged = layers != c.layers;
  if (t == 1 && !staged) return gpt_whole_views(c, base);
  GptConfig local = c;
  local.layers = layers;
  const auto sizes = gpt_param_sizes(local, t);
  std::vector<TensorView> out;
  for (int i = 0; i < kNumParamTensors; ++i) {
    const ParamSpec& p = kParams[static_cast<size_t>(i)];
    const bool split = t > 1 && p.tp_dim >= 0, cut = staged && p.per_layer;
    if (!split && !cut) {
      out.push_back({p.name, gpt_llmc_shape(c, i), base, {}, {}});
    } else {
      const std::vector<int64_t> logical = gpt_logical_shape(c, i);
      std::vector<int64_t> shape = logical, offset(logical.size(), 0);
      if (split) {
        shape[static_cast<size_t>(p.tp_dim)] /= t;
        offset[static_cast<size_t>(p.tp_dim)] = r * shape[static_cast<size_t>(p.tp_dim)];
      }
      if (cut) {  // the stacked layers are the first dimension
        shape[0] = layers;
        offset[0] = first_layer;
      }
      out.push_back({p.name, std::move(shape), base, logical, std::move(offset)});
    }
    base += sizes[static_cast<size_t>(i)];
  }
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

// GPT-2's initialisation of the slices `views` hold (gpt_rank_views of the model `c`): every rank
// draws every whole logical tensor and keeps its slice, so every TP degree and pipeline layout
// starts from the same model.
inline void gpt_init_views(const GptConfig& c, uint64_t seed,
                           const std::vector<TensorView>& views) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int i = 0; i < kNumParamTensors; ++i) {
    const TensorView& v = views[static_cast<size_t>(i)];
    int64_t n = 1;
    for (int64_t d : (v.logical_shape.empty() ? v.shape : v.logical_shape)) n *= d;
    std::vector<float> whole(static_cast<size_t>(n));
    gpt_initial_values(c, i, n, rng, normal, whole.data());
    gpt_copy_slice(whole.data(), v);
  }
}

// The same for rank r's parameters (TP group of t) at `base`.
inline void gpt_init_rank(const GptConfig& c, int64_t t, int64_t r, uint64_t seed, float* base) {
  gpt_init_views(c, seed, gpt_rank_views(c, t, r, base));
}

}  // namespace kt::worker

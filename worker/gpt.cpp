#include "worker/gpt.h"

#include <cmath>
#include <cstring>
#include <random>

#include "api/error.h"
#include "kernels/ops.h"

namespace kt::worker {

namespace k = kernels::cpu;

GptConfig GptConfig::from(const api::ModelDims& m) {
  return {m.seq_len, m.vocab, m.padded_vocab(), m.layers, m.heads, m.hidden, m.ffn_hidden};
}

struct Gpt::Params {
  float *wte, *wpe, *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb,
      *fcprojw, *fcprojb, *lnfw, *lnfb;
};

// Activations of a B×T batch; per-layer tensors are stacked along a leading L.
struct Gpt::Acts {
  float* encoded;    // (B,T,C)
  float* ln1;        // (L,B,T,C)
  float* ln1_mean;   // (L,B,T)
  float* ln1_rstd;   // (L,B,T)
  float* qkv;        // (L,B,T,3C)
  float* atty;       // (L,B,T,C)
  float* preatt;     // (L,B,NH,T,T)
  float* att;        // (L,B,NH,T,T)
  float* attproj;    // (L,B,T,C)
  float* residual2;  // (L,B,T,C)
  float* ln2;        // (L,B,T,C)
  float* ln2_mean;   // (L,B,T)
  float* ln2_rstd;   // (L,B,T)
  float* fch;        // (L,B,T,F)
  float* fch_gelu;   // (L,B,T,F)
  float* fcproj;     // (L,B,T,C)
  float* residual3;  // (L,B,T,C)
  float* lnf;        // (B,T,C)
  float* lnf_mean;   // (B,T)
  float* lnf_rstd;   // (B,T)
  float* logits;     // (B,T,Vp)
  float* losses;     // (B,T)
};

namespace {

// Per-rank activation sizes; Cl = C/t attention channels, NHl heads, Fl ffn units, Vl vocab rows.
std::array<int64_t, 22> activation_sizes(const GptConfig& c, int64_t B, int64_t T, int64_t Cl,
                                         int64_t NHl, int64_t Fl, int64_t Vl) {
  const int64_t BT = B * T, L = c.layers, C = c.channels;
  return {BT * C,
          L * BT * C,
          L * BT,
          L * BT,
          L * BT * 3 * Cl,
          L * BT * Cl,
          L * B * NHl * T * T,
          L * B * NHl * T * T,
          L * BT * C,
          L * BT * C,
          L * BT * C,
          L * BT,
          L * BT,
          L * BT * Fl,
          L * BT * Fl,
          L * BT * C,
          L * BT * C,
          BT * C,
          BT,
          BT,
          BT * Vl,
          BT};
}

int64_t total(const std::array<int64_t, 22>& sizes) {
  int64_t n = 0;
  for (int64_t s : sizes) n += s;
  return n;
}

}  // namespace

Gpt::Gpt(const GptConfig& config, int64_t B, int64_t T, std::shared_ptr<Device> device,
         TensorParallel tp)
    : config_(config), B_(B), T_(T), device_(std::move(device)), tp_(tp) {
  const auto& c = config_;
  KT_CHECK(T <= c.max_seq_len, "sequence length exceeds the model's positions");
  KT_CHECK(c.channels % c.heads == 0, "heads must divide channels");
  const int64_t t = tp_.size;
  KT_CHECK(t >= 1 && tp_.rank >= 0 && tp_.rank < t, "bad tensor-parallel rank");
  KT_CHECK(t == 1 || tp_.group != nullptr, "tensor parallelism needs a TP communicator");
  KT_CHECK(c.heads % t == 0 && c.ffn % t == 0 && c.padded_vocab % t == 0,
           "the TP degree must divide heads, ffn and the padded vocabulary");
  Cl_ = c.channels / t;
  NHl_ = c.heads / t;
  Fl_ = c.ffn / t;
  Vl_ = c.padded_vocab / t;
  vocab_offset_ = tp_.rank * Vl_;
  const int64_t C = c.channels, L = c.layers, maxT = c.max_seq_len;
  param_sizes_ = {Vl_ * C,     maxT * C, L * C, L * C, L * 3 * Cl_ * C, L * 3 * Cl_,
                  L * C * Cl_, L * C,    L * C, L * C, L * Fl_ * C,     L * Fl_,
                  L * C * Fl_, L * C,    C,     C};
  for (int64_t s : param_sizes_) num_params_ += s;
  params_ = device_->allocate_floats(num_params_, MemoryKind::kParams);
  grads_ = device_->allocate_floats(num_params_, MemoryKind::kGrads);
  const int64_t acts = total(activation_sizes(c, B, T, Cl_, NHl_, Fl_, Vl_));
  acts_ = device_->allocate_floats(acts, MemoryKind::kActivations);
  grad_acts_ = device_->allocate_floats(acts, MemoryKind::kActivations);
  targets_.resize(B * T);
  if (t > 1) ce_scratch_.resize(3 * B * T);
}

Gpt::Params Gpt::params_at(float* base) const {
  float* p[kNumParamTensors];
  for (int i = 0; i < kNumParamTensors; ++i) {
    p[i] = base;
    base += param_sizes_[i];
  }
  return {p[0], p[1], p[2],  p[3],  p[4],  p[5],  p[6],  p[7],
          p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15]};
}

Gpt::Acts Gpt::acts_at(float* base) const {
  const auto sizes = activation_sizes(config_, B_, T_, Cl_, NHl_, Fl_, Vl_);
  float* a[22];
  for (int i = 0; i < 22; ++i) {
    a[i] = base;
    base += sizes[i];
  }
  return {a[0],  a[1],  a[2],  a[3],  a[4],  a[5],  a[6],  a[7],  a[8],  a[9],  a[10],
          a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21]};
}

std::vector<TensorView> Gpt::views(float* base) const {
  const auto& c = config_;
  const int64_t Vp = c.padded_vocab, C = c.channels, L = c.layers, F = c.ffn;
  const int64_t r = tp_.rank;
  std::vector<TensorView> out;
  auto add = [&](int i, std::vector<int64_t> shape, std::vector<int64_t> logical = {},
                 std::vector<int64_t> offset = {}) {
    out.push_back({kParamNames[i], std::move(shape), base, std::move(logical), std::move(offset)});
    base += param_sizes_[i];
  };
  if (tp_.size == 1) {
    const std::vector<std::vector<int64_t>> shapes = {{Vp, C},       {c.max_seq_len, C},
                                                      {L, C},        {L, C},
                                                      {L, 3 * C, C}, {L, 3 * C},
                                                      {L, C, C},     {L, C},
                                                      {L, C},        {L, C},
                                                      {L, F, C},     {L, F},
                                                      {L, C, F},     {L, C},
                                                      {C},           {C}};
    for (int i = 0; i < kNumParamTensors; ++i) add(i, shapes[i]);
    return out;
  }
  add(0, {Vl_, C}, {Vp, C}, {r * Vl_, 0});
  add(1, {c.max_seq_len, C});
  add(2, {L, C});
  add(3, {L, C});
  add(4, {L, 3, Cl_, C}, {L, 3, C, C}, {0, 0, r * Cl_, 0});  // q, k, v rows of this rank's heads
  add(5, {L, 3, Cl_}, {L, 3, C}, {0, 0, r * Cl_});
  add(6, {L, C, Cl_}, {L, C, C}, {0, 0, r * Cl_});
  add(7, {L, C});
  add(8, {L, C});
  add(9, {L, C});
  add(10, {L, Fl_, C}, {L, F, C}, {0, r * Fl_, 0});
  add(11, {L, Fl_}, {L, F}, {0, r * Fl_});
  add(12, {L, C, Fl_}, {L, C, F}, {0, 0, r * Fl_});
  add(13, {L, C});
  add(14, {C});
  add(15, {C});
  return out;
}

bool Gpt::sharded(int tensor_index) const {
  if (tp_.size == 1) return false;
  return tensor_index == 0 || tensor_index == 4 || tensor_index == 5 || tensor_index == 6 ||
         tensor_index == 10 || tensor_index == 11 || tensor_index == 12;
}

bool Gpt::decays(int tensor_index) {
  // wte, wpe, qkvw, attprojw, fcw, fcprojw
  return tensor_index == 0 || tensor_index == 1 || tensor_index == 4 || tensor_index == 6 ||
         tensor_index == 10 || tensor_index == 12;
}

double Gpt::flops_per_micro_step() const {
  const double tokens = static_cast<double>(B_ * T_);
  return 6.0 * num_params_ * tokens + 12.0 * config_.layers * config_.channels * T_ * tokens;
}

namespace {

// Copies the slice of a row-major logical tensor that `view` holds (offset/shape per dim).
void copy_slice(const std::vector<float>& logical, const TensorView& view) {
  const auto& L = view.logical_shape;
  const auto& S = view.shape;
  const size_t dims = S.size();
  std::vector<int64_t> index(dims, 0);
  int64_t out = 0;
  const int64_t inner = S.back();
  for (;;) {
    int64_t src = 0;
    for (size_t d = 0; d < dims; ++d)
      src = src * L[d] + view.offset[d] + (d + 1 < dims ? index[d] : 0);
    std::memcpy(view.data + out, logical.data() + src, inner * sizeof(float));
    out += inner;
    // advance all but the last index
    int d = static_cast<int>(dims) - 2;
    for (; d >= 0; --d) {
      if (++index[d] < S[d]) break;
      index[d] = 0;
    }
    if (d < 0) break;
  }
}

}  // namespace

void Gpt::init_weights(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float residual_std = 0.02f / std::sqrt(2.0f * config_.layers);
  auto views_now = parameter_views();
  for (int i = 0; i < kNumParamTensors; ++i) {
    const std::string name = kParamNames[i];
    TensorView& t = views_now[i];
    const bool layernorm_weight = name == "ln1w" || name == "ln2w" || name == "lnfw";
    const bool bias = name.back() == 'b';  // qkvb, fcb, ...: biases and LayerNorm biases
    int64_t n = 1;
    for (int64_t d : (t.logical_shape.empty() ? t.shape : t.logical_shape)) n *= d;
    std::vector<float> full(n);
    for (int64_t j = 0; j < n; ++j) {
      if (layernorm_weight)
        full[j] = 1.0f;
      else if (bias)
        full[j] = 0.0f;
      else if (name == "attprojw" || name == "fcprojw")
        full[j] = residual_std * normal(rng);
      else
        full[j] = 0.02f * normal(rng);
    }
    if (i == 0)  // the padded vocabulary rows are never targets; llm.c keeps them at zero
      std::fill(full.begin() + config_.vocab * config_.channels, full.end(), 0.0f);
    if (t.logical_shape.empty())
      std::memcpy(t.data, full.data(), n * sizeof(float));
    else
      copy_slice(full, t);
  }
}

void Gpt::zero_grad() {
  // wte (written first by the LM head's dW), qkvw, attprojw, fcw and fcprojw are overwritten by
  // their matmul's first backward; everything else is accumulated into and must start at zero.
  auto grads = gradient_views();
  for (int i = 0; i < kNumParamTensors; ++i) {
    const bool matmul_weight = i == 0 || i == 4 || i == 6 || i == 10 || i == 12;
    if (!matmul_weight) std::memset(grads[i].data, 0, grads[i].numel() * sizeof(float));
  }
  overwrite_weight_grads_ = true;
}

float Gpt::evaluate(const int32_t* inputs, const int32_t* targets) {
  forward(inputs, targets, nullptr, 0.0f);
  return mean_loss_;
}

float Gpt::train_micro_step(const int32_t* inputs, const int32_t* targets, float loss_scale) {
  // Backward kernels accumulate into the activation gradients, so they start at zero — all but
  // dlogits, which the fused cross-entropy writes in full, and dlosses, which nothing reads.
  Acts grad = acts_at(grad_acts_.data());
  std::memset(grad_acts_.data(), 0, (grad.logits - grad_acts_.data()) * sizeof(float));
  // d(mean loss · loss_scale)/d(loss of one token) = loss_scale / (B·T)
  forward(inputs, targets, grad.logits, loss_scale / static_cast<float>(B_ * T_));
  backward(inputs);
  return mean_loss_;
}

void Gpt::tp_allreduce(float* data, int64_t count, ReduceOp op) {
  if (tp_.size > 1) tp_.group->allreduce(data, static_cast<size_t>(count), op);
}

void Gpt::vocab_parallel_cross_entropy(float* losses, float* dlogits, const float* logits,
                                       const int32_t* targets, float dloss) {
  // Each rank holds logits for vocabulary rows [offset, offset + Vl). The softmax needs the
  // row's global max and sum: one all-reduce (max) of B·T floats, one (sum) of 2·B·T floats
  // carrying the sums of exponentials and the target's logit (0 on the ranks that lack it).
  const int64_t BT = B_ * T_, V = config_.vocab, lo = vocab_offset_;
  const int64_t valid = std::max<int64_t>(0, std::min(Vl_, V - lo));  // real vocabulary here
  float* row_max = ce_scratch_.data();
  float* sums = row_max + BT;  // [sum of exp (BT) | target logit (BT)]
#pragma omp parallel for
  for (int64_t i = 0; i < BT; ++i) {
    float m = -INFINITY;
    for (int64_t v = 0; v < valid; ++v) m = std::max(m, logits[i * Vl_ + v]);
    row_max[i] = m;
  }
  tp_allreduce(row_max, BT, ReduceOp::kMax);
#pragma omp parallel for
  for (int64_t i = 0; i < BT; ++i) {
    const float* x = logits + i * Vl_;
    float sum = 0;
    for (int64_t v = 0; v < valid; ++v) sum += std::exp(x[v] - row_max[i]);
    sums[i] = sum;
    const int64_t target = targets[i] - lo;
    sums[BT + i] = target >= 0 && target < Vl_ ? x[target] : 0.0f;
  }
  tp_allreduce(sums, 2 * BT);
#pragma omp parallel for
  for (int64_t i = 0; i < BT; ++i) {
    losses[i] = std::log(sums[i]) - (sums[BT + i] - row_max[i]);
    if (!dlogits) continue;
    const float* x = logits + i * Vl_;
    float* d = dlogits + i * Vl_;
    const float norm = dloss / sums[i];
    for (int64_t v = 0; v < valid; ++v) d[v] = std::exp(x[v] - row_max[i]) * norm;
    for (int64_t v = valid; v < Vl_; ++v) d[v] = 0;
    const int64_t target = targets[i] - lo;
    if (target >= 0 && target < Vl_) d[target] -= dloss;
  }
}

void Gpt::forward(const int32_t* inputs, const int32_t* targets, float* dlogits, float dloss) {
  const auto& c = config_;
  const int64_t B = B_, T = T_, BT = B * T, C = c.channels, Cl = Cl_, Fl = Fl_, NHl = NHl_;
  const int64_t V = c.vocab, Vl = Vl_;
  const bool first = tp_.rank == 0;  // adds the row-parallel biases (once, before the sum)
  for (int64_t i = 0; i < BT; ++i) {
    if (inputs[i] < 0 || inputs[i] >= V || targets[i] < 0 || targets[i] >= V)
      throw Error("token out of range [0, " + std::to_string(V) + ") at position " +
                  std::to_string(i));
  }
  const Params p = params_at(params_.data());
  const Acts a = acts_at(acts_.data());
  if (tp_.size == 1) {
    k::embedding_forward(a.encoded, inputs, p.wte, p.wpe, B, T, C);
  } else {
    // Vocab-parallel lookup: rows this rank holds, zeros elsewhere, summed over the TP group;
    // the (replicated) positions are added after the sum.
#pragma omp parallel for
    for (int64_t i = 0; i < BT; ++i) {
      const int64_t row = inputs[i] - vocab_offset_;
      float* out = a.encoded + i * C;
      if (row >= 0 && row < Vl)
        std::memcpy(out, p.wte + row * C, C * sizeof(float));
      else
        std::memset(out, 0, C * sizeof(float));
    }
    tp_allreduce(a.encoded, BT * C);
#pragma omp parallel for
    for (int64_t i = 0; i < BT; ++i)
      for (int64_t ch = 0; ch < C; ++ch) a.encoded[i * C + ch] += p.wpe[(i % T) * C + ch];
  }
  for (int64_t l = 0; l < c.layers; ++l) {
    const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * BT * C;
    float* ln1 = a.ln1 + l * BT * C;
    float* ln1_mean = a.ln1_mean + l * BT;
    float* ln1_rstd = a.ln1_rstd + l * BT;
    float* qkv = a.qkv + l * BT * 3 * Cl;
    float* atty = a.atty + l * BT * Cl;
    float* preatt = a.preatt + l * B * NHl * T * T;
    float* att = a.att + l * B * NHl * T * T;
    float* attproj = a.attproj + l * BT * C;
    float* residual2 = a.residual2 + l * BT * C;
    float* ln2 = a.ln2 + l * BT * C;
    float* ln2_mean = a.ln2_mean + l * BT;
    float* ln2_rstd = a.ln2_rstd + l * BT;
    float* fch = a.fch + l * BT * Fl;
    float* fch_gelu = a.fch_gelu + l * BT * Fl;
    float* fcproj = a.fcproj + l * BT * C;
    float* residual3 = a.residual3 + l * BT * C;
    k::layernorm_forward(ln1, ln1_mean, ln1_rstd, residual, p.ln1w + l * C, p.ln1b + l * C, BT, C);
    k::matmul_forward(qkv, ln1, p.qkvw + l * 3 * Cl * C, p.qkvb + l * 3 * Cl, BT, C, 3 * Cl);
    k::attention_forward(atty, preatt, att, qkv, B, T, Cl, NHl);
    k::matmul_forward(attproj, atty, p.attprojw + l * C * Cl, first ? p.attprojb + l * C : nullptr,
                      BT, Cl, C);
    tp_allreduce(attproj, BT * C);  // row-parallel: sum the partial projections
    k::residual_forward(residual2, residual, attproj, BT * C);
    k::layernorm_forward(ln2, ln2_mean, ln2_rstd, residual2, p.ln2w + l * C, p.ln2b + l * C, BT, C);
    k::matmul_forward(fch, ln2, p.fcw + l * Fl * C, p.fcb + l * Fl, BT, C, Fl);
    k::gelu_forward(fch_gelu, fch, BT * Fl);
    k::matmul_forward(fcproj, fch_gelu, p.fcprojw + l * C * Fl, first ? p.fcprojb + l * C : nullptr,
                      BT, Fl, C);
    tp_allreduce(fcproj, BT * C);  // row-parallel fc2
    k::residual_forward(residual3, residual2, fcproj, BT * C);
  }
  const float* last = a.residual3 + (c.layers - 1) * BT * C;
  k::layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, last, p.lnfw, p.lnfb, BT, C);
  k::matmul_forward(a.logits, a.lnf, p.wte, nullptr, BT, C, Vl);
  if (tp_.size == 1)
    k::softmax_cross_entropy(a.losses, dlogits, a.logits, targets, BT, V, Vl, dloss);
  else
    vocab_parallel_cross_entropy(a.losses, dlogits, a.logits, targets, dloss);
  double sum = 0;
  for (int64_t i = 0; i < BT; ++i) sum += a.losses[i];
  mean_loss_ = static_cast<float>(sum / BT);
}

void Gpt::backward(const int32_t* inputs) {
  const auto& c = config_;
  const int64_t B = B_, T = T_, BT = B * T, C = c.channels, Cl = Cl_, Fl = Fl_, NHl = NHl_;
  const int64_t Vl = Vl_, L = c.layers;
  const Params p = params_at(params_.data());
  const Params g = params_at(grads_.data());
  const Acts a = acts_at(acts_.data());
  const Acts d = acts_at(grad_acts_.data());  // d.logits already holds dloss/dlogits
  const bool acc = !overwrite_weight_grads_;
  overwrite_weight_grads_ = false;
  k::matmul_backward(d.lnf, g.wte, nullptr, d.logits, a.lnf, p.wte, BT, C, Vl, acc);
  tp_allreduce(d.lnf, BT * C);  // the LM head is column-parallel over the vocabulary
  const float* last = a.residual3 + (L - 1) * BT * C;
  float* dlast = d.residual3 + (L - 1) * BT * C;
  k::layernorm_backward(dlast, g.lnfw, g.lnfb, d.lnf, last, p.lnfw, a.lnf_mean, a.lnf_rstd, BT, C);
  for (int64_t l = L - 1; l >= 0; --l) {
    const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * BT * C;
    float* dresidual = l == 0 ? d.encoded : d.residual3 + (l - 1) * BT * C;
    const int64_t lc = l * BT * C, lf = l * BT * Fl, lq = l * BT * 3 * Cl, la = l * BT * Cl;
    const int64_t lh = l * B * NHl * T * T;
    k::residual_backward(d.residual2 + lc, d.fcproj + lc, d.residual3 + lc, BT * C);
    k::matmul_backward(d.fch_gelu + lf, g.fcprojw + l * C * Fl, g.fcprojb + l * C, d.fcproj + lc,
                       a.fch_gelu + lf, p.fcprojw + l * C * Fl, BT, Fl, C, acc);
    k::gelu_backward(d.fch + lf, a.fch + lf, d.fch_gelu + lf, BT * Fl);
    k::matmul_backward(d.ln2 + lc, g.fcw + l * Fl * C, g.fcb + l * Fl, d.fch + lf, a.ln2 + lc,
                       p.fcw + l * Fl * C, BT, C, Fl, acc);
    tp_allreduce(d.ln2 + lc, BT * C);  // column-parallel fc1: sum the input gradients
    k::layernorm_backward(d.residual2 + lc, g.ln2w + l * C, g.ln2b + l * C, d.ln2 + lc,
                          a.residual2 + lc, p.ln2w + l * C, a.ln2_mean + l * BT,
                          a.ln2_rstd + l * BT, BT, C);
    k::residual_backward(dresidual, d.attproj + lc, d.residual2 + lc, BT * C);
    k::matmul_backward(d.atty + la, g.attprojw + l * C * Cl, g.attprojb + l * C, d.attproj + lc,
                       a.atty + la, p.attprojw + l * C * Cl, BT, Cl, C, acc);
    k::attention_backward(d.qkv + lq, d.preatt + lh, d.att + lh, d.atty + la, a.qkv + lq,
                          a.att + lh, B, T, Cl, NHl);
    k::matmul_backward(d.ln1 + lc, g.qkvw + l * 3 * Cl * C, g.qkvb + l * 3 * Cl, d.qkv + lq,
                       a.ln1 + lc, p.qkvw + l * 3 * Cl * C, BT, C, 3 * Cl, acc);
    tp_allreduce(d.ln1 + lc, BT * C);  // column-parallel qkv
    k::layernorm_backward(dresidual, g.ln1w + l * C, g.ln1b + l * C, d.ln1 + lc, residual,
                          p.ln1w + l * C, a.ln1_mean + l * BT, a.ln1_rstd + l * BT, BT, C);
  }
  if (tp_.size == 1) {
    k::embedding_backward(g.wte, g.wpe, d.encoded, inputs, B, T, C);
    return;
  }
  for (int64_t i = 0; i < BT; ++i) {  // vocab-parallel: only the rows this rank holds
    const int64_t row = inputs[i] - vocab_offset_;
    const float* dout = d.encoded + i * C;
    float* dpos = g.wpe + (i % T) * C;
    for (int64_t ch = 0; ch < C; ++ch) dpos[ch] += dout[ch];
    if (row < 0 || row >= Vl) continue;
    float* drow = g.wte + row * C;
    for (int64_t ch = 0; ch < C; ++ch) drow[ch] += dout[ch];
  }
}

}  // namespace kt::worker

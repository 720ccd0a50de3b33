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

std::array<int64_t, 22> activation_sizes(const GptConfig& c, int64_t B, int64_t T) {
  const int64_t BT = B * T, L = c.layers, C = c.channels, F = c.ffn;
  return {BT * C,
          L * BT * C,
          L * BT,
          L * BT,
          L * BT * 3 * C,
          L * BT * C,
          L * B * c.heads * T * T,
          L * B * c.heads * T * T,
          L * BT * C,
          L * BT * C,
          L * BT * C,
          L * BT,
          L * BT,
          L * BT * F,
          L * BT * F,
          L * BT * C,
          L * BT * C,
          BT * C,
          BT,
          BT,
          BT * c.padded_vocab,
          BT};
}

int64_t total(const std::array<int64_t, 22>& sizes) {
  int64_t n = 0;
  for (int64_t s : sizes) n += s;
  return n;
}

}  // namespace

Gpt::Gpt(const GptConfig& config, int64_t B, int64_t T, std::shared_ptr<Device> device)
    : config_(config), B_(B), T_(T), device_(std::move(device)) {
  const auto& c = config_;
  KT_CHECK(T <= c.max_seq_len, "sequence length exceeds the model's positions");
  KT_CHECK(c.channels % c.heads == 0, "heads must divide channels");
  const int64_t Vp = c.padded_vocab, C = c.channels, L = c.layers, F = c.ffn, maxT = c.max_seq_len;
  param_sizes_ = {Vp * C, maxT * C, L * C,     L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C,
                  L * C,  L * C,    L * F * C, L * F, L * C * F,     L * C,     C,         C};
  for (int64_t s : param_sizes_) num_params_ += s;
  params_ = device_->allocate_floats(num_params_, MemoryKind::kParams);
  grads_ = device_->allocate_floats(num_params_, MemoryKind::kGrads);
  const int64_t acts = total(activation_sizes(c, B, T));
  acts_ = device_->allocate_floats(acts, MemoryKind::kActivations);
  grad_acts_ = device_->allocate_floats(acts, MemoryKind::kActivations);
  targets_.resize(B * T);
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
  const auto sizes = activation_sizes(config_, B_, T_);
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
  const std::vector<std::vector<int64_t>> shapes = {{Vp, C},       {c.max_seq_len, C},
                                                    {L, C},        {L, C},
                                                    {L, 3 * C, C}, {L, 3 * C},
                                                    {L, C, C},     {L, C},
                                                    {L, C},        {L, C},
                                                    {L, F, C},     {L, F},
                                                    {L, C, F},     {L, C},
                                                    {C},           {C}};
  std::vector<TensorView> out;
  for (int i = 0; i < kNumParamTensors; ++i) {
    out.push_back({kParamNames[i], shapes[i], base, {}, {}});
    base += param_sizes_[i];
  }
  return out;
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
    for (int64_t j = 0; j < t.numel(); ++j) {
      if (layernorm_weight)
        t.data[j] = 1.0f;
      else if (bias)
        t.data[j] = 0.0f;
      else if (name == "attprojw" || name == "fcprojw")
        t.data[j] = residual_std * normal(rng);
      else
        t.data[j] = 0.02f * normal(rng);
    }
  }
  // The padded vocabulary rows are never targets; llm.c keeps them at zero.
  for (int64_t j = config_.vocab * config_.channels; j < config_.padded_vocab * config_.channels;
       ++j)
    params_.data()[j] = 0.0f;
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

void Gpt::forward(const int32_t* inputs, const int32_t* targets, float* dlogits, float dloss) {
  const auto& c = config_;
  const int64_t B = B_, T = T_, BT = B * T, C = c.channels, F = c.ffn, NH = c.heads;
  const int64_t V = c.vocab, Vp = c.padded_vocab;
  for (int64_t i = 0; i < BT; ++i) {
    if (inputs[i] < 0 || inputs[i] >= V || targets[i] < 0 || targets[i] >= V)
      throw Error("token out of range [0, " + std::to_string(V) + ") at position " +
                  std::to_string(i));
  }
  const Params p = params_at(params_.data());
  const Acts a = acts_at(acts_.data());
  k::embedding_forward(a.encoded, inputs, p.wte, p.wpe, B, T, C);
  for (int64_t l = 0; l < c.layers; ++l) {
    const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * BT * C;
    float* ln1 = a.ln1 + l * BT * C;
    float* ln1_mean = a.ln1_mean + l * BT;
    float* ln1_rstd = a.ln1_rstd + l * BT;
    float* qkv = a.qkv + l * BT * 3 * C;
    float* atty = a.atty + l * BT * C;
    float* preatt = a.preatt + l * B * NH * T * T;
    float* att = a.att + l * B * NH * T * T;
    float* attproj = a.attproj + l * BT * C;
    float* residual2 = a.residual2 + l * BT * C;
    float* ln2 = a.ln2 + l * BT * C;
    float* ln2_mean = a.ln2_mean + l * BT;
    float* ln2_rstd = a.ln2_rstd + l * BT;
    float* fch = a.fch + l * BT * F;
    float* fch_gelu = a.fch_gelu + l * BT * F;
    float* fcproj = a.fcproj + l * BT * C;
    float* residual3 = a.residual3 + l * BT * C;
    k::layernorm_forward(ln1, ln1_mean, ln1_rstd, residual, p.ln1w + l * C, p.ln1b + l * C, BT, C);
    k::matmul_forward(qkv, ln1, p.qkvw + l * 3 * C * C, p.qkvb + l * 3 * C, BT, C, 3 * C);
    k::attention_forward(atty, preatt, att, qkv, B, T, C, NH);
    k::matmul_forward(attproj, atty, p.attprojw + l * C * C, p.attprojb + l * C, BT, C, C);
    k::residual_forward(residual2, residual, attproj, BT * C);
    k::layernorm_forward(ln2, ln2_mean, ln2_rstd, residual2, p.ln2w + l * C, p.ln2b + l * C, BT, C);
    k::matmul_forward(fch, ln2, p.fcw + l * F * C, p.fcb + l * F, BT, C, F);
    k::gelu_forward(fch_gelu, fch, BT * F);
    k::matmul_forward(fcproj, fch_gelu, p.fcprojw + l * C * F, p.fcprojb + l * C, BT, F, C);
    k::residual_forward(residual3, residual2, fcproj, BT * C);
  }
  const float* last = a.residual3 + (c.layers - 1) * BT * C;
  k::layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, last, p.lnfw, p.lnfb, BT, C);
  k::matmul_forward(a.logits, a.lnf, p.wte, nullptr, BT, C, Vp);
  k::softmax_cross_entropy(a.losses, dlogits, a.logits, targets, BT, V, Vp, dloss);
  double sum = 0;
  for (int64_t i = 0; i < BT; ++i) sum += a.losses[i];
  mean_loss_ = static_cast<float>(sum / BT);
}

void Gpt::backward(const int32_t* inputs) {
  const auto& c = config_;
  const int64_t B = B_, T = T_, BT = B * T, C = c.channels, F = c.ffn, NH = c.heads;
  const int64_t Vp = c.padded_vocab, L = c.layers;
  const Params p = params_at(params_.data());
  const Params g = params_at(grads_.data());
  const Acts a = acts_at(acts_.data());
  const Acts d = acts_at(grad_acts_.data());  // d.logits already holds dloss/dlogits
  const bool acc = !overwrite_weight_grads_;
  overwrite_weight_grads_ = false;
  k::matmul_backward(d.lnf, g.wte, nullptr, d.logits, a.lnf, p.wte, BT, C, Vp, acc);
  const float* last = a.residual3 + (L - 1) * BT * C;
  float* dlast = d.residual3 + (L - 1) * BT * C;
  k::layernorm_backward(dlast, g.lnfw, g.lnfb, d.lnf, last, p.lnfw, a.lnf_mean, a.lnf_rstd, BT, C);
  for (int64_t l = L - 1; l >= 0; --l) {
    const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * BT * C;
    float* dresidual = l == 0 ? d.encoded : d.residual3 + (l - 1) * BT * C;
    const int64_t lc = l * BT * C, lf = l * BT * F;
    k::residual_backward(d.residual2 + lc, d.fcproj + lc, d.residual3 + lc, BT * C);
    k::matmul_backward(d.fch_gelu + lf, g.fcprojw + l * C * F, g.fcprojb + l * C, d.fcproj + lc,
                       a.fch_gelu + lf, p.fcprojw + l * C * F, BT, F, C, acc);
    k::gelu_backward(d.fch + lf, a.fch + lf, d.fch_gelu + lf, BT * F);
    k::matmul_backward(d.ln2 + lc, g.fcw + l * F * C, g.fcb + l * F, d.fch + lf, a.ln2 + lc,
                       p.fcw + l * F * C, BT, C, F, acc);
    k::layernorm_backward(d.residual2 + lc, g.ln2w + l * C, g.ln2b + l * C, d.ln2 + lc,
                          a.residual2 + lc, p.ln2w + l * C, a.ln2_mean + l * BT,
                          a.ln2_rstd + l * BT, BT, C);
    k::residual_backward(dresidual, d.attproj + lc, d.residual2 + lc, BT * C);
    k::matmul_backward(d.atty + lc, g.attprojw + l * C * C, g.attprojb + l * C, d.attproj + lc,
                       a.atty + lc, p.attprojw + l * C * C, BT, C, C, acc);
    const int64_t la = l * B * NH * T * T;
    k::attention_backward(d.qkv + l * BT * 3 * C, d.preatt + la, d.att + la, d.atty + lc,
                          a.qkv + l * BT * 3 * C, a.att + la, B, T, C, NH);
    k::matmul_backward(d.ln1 + lc, g.qkvw + l * 3 * C * C, g.qkvb + l * 3 * C,
                       d.qkv + l * BT * 3 * C, a.ln1 + lc, p.qkvw + l * 3 * C * C, BT, C, 3 * C,
                       acc);
    k::layernorm_backward(dresidual, g.ln1w + l * C, g.ln1b + l * C, d.ln1 + lc, residual,
                          p.ln1w + l * C, a.ln1_mean + l * BT, a.ln1_rstd + l * BT, BT, C);
  }
  k::embedding_backward(g.wte, g.wpe, d.encoded, inputs, B, T, C);
}

}  // namespace kt::worker

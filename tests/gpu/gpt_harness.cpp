#include "tests/gpu/gpt_harness.h"

#include <cuda_runtime.h>

#include <cmath>
#include <random>

#include "kernels/cuda/check.h"

namespace kt::gpu_harness {

namespace cu = kernels::cuda;
using cu::bf16;
using worker::MemoryKind;

int64_t GptDims::parameters() const {
  return 12 * L * C * C + 13 * L * C + (Vp + T) * C + 2 * C;  // + lnf
}

void* GptBf16::alloc(size_t bytes, MemoryKind kind) {
  void* p = device_.allocate(bytes, kind);
  allocations_.push_back(p);
  return p;
}

GptBf16::~GptBf16() {
  cudaStreamSynchronize(ctx_.stream());
  for (void* p : allocations_) device_.deallocate(p);
}

GptBf16::GptBf16(worker::CudaDevice& device, const cu::Context& ctx, const GptDims& dims,
                 uint64_t seed)
    : device_(device), ctx_(ctx), d_(dims) {
  try {
    build(seed);
  } catch (...) {  // e.g. out of memory: give back what was taken, then report
    for (void* p : allocations_) device_.deallocate(p);
    throw;
  }
}

void GptBf16::build(uint64_t seed) {
  const int64_t L = d_.L, C = d_.C, BT = d_.B * d_.T;
  // llm.c's parameter order; one block per kind of state.
  int64_t at = 0;
  auto take = [&](int64_t n) {
    const int64_t o = at;
    at += n;
    return o;
  };
  off_.wte = take(d_.Vp * C);
  off_.wpe = take(d_.T * C);
  off_.ln1w = take(L * C);
  off_.ln1b = take(L * C);
  off_.qkvw = take(L * 3 * C * C);
  off_.qkvb = take(L * 3 * C);
  off_.attprojw = take(L * C * C);
  off_.attprojb = take(L * C);
  off_.ln2w = take(L * C);
  off_.ln2b = take(L * C);
  off_.fcw = take(L * 4 * C * C);
  off_.fcb = take(L * 4 * C);
  off_.fcprojw = take(L * C * 4 * C);
  off_.fcprojb = take(L * C);
  off_.lnfw = take(C);
  off_.lnfb = take(C);
  off_.total = at;
  KT_CHECK(off_.total == d_.parameters(), "parameter count");
  const size_t P = static_cast<size_t>(off_.total);

  master_ = static_cast<float*>(alloc(P * 4, MemoryKind::kParams));
  params16_ = static_cast<bf16*>(alloc(P * 2, MemoryKind::kParams));
  grads_ = static_cast<float*>(alloc(P * 4, MemoryKind::kGrads));
  m_ = static_cast<float*>(alloc(P * 4, MemoryKind::kOptimizer));
  v_ = static_cast<float*>(alloc(P * 4, MemoryKind::kOptimizer));

  auto act16 = [&](int64_t n) {
    return static_cast<bf16*>(alloc(n * 2, MemoryKind::kActivations));
  };
  auto act32 = [&](int64_t n) {
    return static_cast<float*>(alloc(n * 4, MemoryKind::kActivations));
  };
  const int64_t att = d_.B * d_.NH * d_.T * d_.T;
  res_.push_back(act16(BT * C));
  for (int64_t l = 0; l < L; ++l) {
    ln1_.push_back(act16(BT * C));
    qkv_.push_back(act16(BT * 3 * C));
    atty_.push_back(act16(BT * C));
    res2_.push_back(act16(BT * C));
    ln2_.push_back(act16(BT * C));
    fch_.push_back(act16(BT * 4 * C));
    fchg_.push_back(act16(BT * 4 * C));
    res_.push_back(act16(BT * C));
    ln1_mean_.push_back(act32(BT));
    ln1_rstd_.push_back(act32(BT));
    ln2_mean_.push_back(act32(BT));
    ln2_rstd_.push_back(act32(BT));
    att_.push_back(act32(att));
  }
  lnf_ = act16(BT * C);
  logits_ = act16(BT * d_.Vp);
  proj_tmp_ = act16(BT * C);
  dres_ = act16(BT * C);
  dtmp_c_ = act16(BT * C);
  dtmp_3c_ = act16(BT * 3 * C);
  dtmp_4c_a_ = act16(BT * 4 * C);
  dtmp_4c_b_ = act16(BT * 4 * C);
  lnf_mean_ = act32(BT);
  lnf_rstd_ = act32(BT);
  losses_ = act32(BT);
  enc32_ = act32(BT * C);
  qkv32_ = act32(BT * 3 * C);
  atty32_ = act32(BT * C);
  preatt_ = act32(att);
  datt_ = act32(att);
  dpreatt_ = act32(att);
  dqkv32_ = act32(BT * 3 * C);
  dc32_ = act32(BT * C);
  tokens_ = static_cast<int32_t*>(alloc(BT * 4, MemoryKind::kWorkspace));
  targets_ = static_cast<int32_t*>(alloc(BT * 4, MemoryKind::kWorkspace));

  // GPT-2 initialisation: N(0, 0.02), residual projections N(0, 0.02/√(2L)), LayerNorm 1/0.
  std::vector<float> host(P, 0.0f);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const float proj_scale = 1.0f / std::sqrt(2.0f * static_cast<float>(L));
  auto fill = [&](int64_t o, int64_t n, float scale) {
    for (int64_t i = 0; i < n; ++i) host[o + i] = normal(rng) * scale;
  };
  fill(off_.wte, d_.V * C, 1.0f);  // padding rows stay 0
  fill(off_.wpe, d_.T * C, 1.0f);
  fill(off_.qkvw, L * 3 * C * C, 1.0f);
  fill(off_.attprojw, L * C * C, proj_scale);
  fill(off_.fcw, L * 4 * C * C, 1.0f);
  fill(off_.fcprojw, L * C * 4 * C, proj_scale);
  for (int64_t o : {off_.ln1w, off_.ln2w})
    for (int64_t i = 0; i < L * C; ++i) host[o + i] = 1.0f;
  for (int64_t i = 0; i < C; ++i) host[off_.lnfw + i] = 1.0f;
  KT_CUDA_CHECK(cudaMemcpy(master_, host.data(), P * 4, cudaMemcpyHostToDevice));
  KT_CUDA_CHECK(cudaMemset(m_, 0, P * 4));
  KT_CUDA_CHECK(cudaMemset(v_, 0, P * 4));
  KT_CUDA_CHECK(cudaDeviceSynchronize());
  cu::cast_to_bf16(ctx_, params16_, master_, off_.total);
  KT_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));
}

float GptBf16::step(const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets,
                    float learning_rate, bool read_loss) {
  const int64_t L = d_.L, C = d_.C, NH = d_.NH, B = d_.B, T = d_.T, BT = B * T;
  const cu::Context& x = ctx_;
  cudaStream_t s = x.stream();
  KT_CHECK(static_cast<int64_t>(tokens.size()) == BT && static_cast<int64_t>(targets.size()) == BT,
           "tokens and targets must hold B·T values");
  KT_CUDA_CHECK(cudaMemcpyAsync(tokens_, tokens.data(), BT * 4, cudaMemcpyHostToDevice, s));
  KT_CUDA_CHECK(cudaMemcpyAsync(targets_, targets.data(), BT * 4, cudaMemcpyHostToDevice, s));
  auto zero = [&](void* p, size_t bytes) { KT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, s)); };
  const bf16* p16 = params16_;
  auto w = [&](int64_t o, int64_t l, int64_t n) { return p16 + o + l * n; };
  auto g = [&](int64_t o, int64_t l, int64_t n) { return grads_ + o + l * n; };

  // ---- forward
  cu::embedding_forward(x, enc32_, tokens_, master_ + off_.wte, master_ + off_.wpe, B, T, C);
  cu::cast_to_bf16(x, res_[0], enc32_, BT * C);
  for (int64_t l = 0; l < L; ++l) {
    cu::layernorm_forward(x, ln1_[l], ln1_mean_[l], ln1_rstd_[l], res_[l], w(off_.ln1w, l, C),
                          w(off_.ln1b, l, C), BT, C);
    cu::matmul_forward_bf16(x, qkv_[l], ln1_[l], w(off_.qkvw, l, 3 * C * C), w(off_.qkvb, l, 3 * C),
                            BT, C, 3 * C);
    cu::cast_to_float(x, qkv32_, qkv_[l], BT * 3 * C);
    cu::attention_forward(x, atty32_, preatt_, att_[l], qkv32_, B, T, C, NH);
    cu::cast_to_bf16(x, atty_[l], atty32_, BT * C);
    cu::matmul_forward_bf16(x, proj_tmp_, atty_[l], w(off_.attprojw, l, C * C),
                            w(off_.attprojb, l, C), BT, C, C);
    cu::residual_forward(x, res2_[l], res_[l], proj_tmp_, BT * C);
    cu::layernorm_forward(x, ln2_[l], ln2_mean_[l], ln2_rstd_[l], res2_[l], w(off_.ln2w, l, C),
                          w(off_.ln2b, l, C), BT, C);
    cu::matmul_forward_bf16(x, fch_[l], ln2_[l], w(off_.fcw, l, 4 * C * C), w(off_.fcb, l, 4 * C),
                            BT, C, 4 * C);
    cu::gelu_forward(x, fchg_[l], fch_[l], BT * 4 * C);
    cu::matmul_forward_bf16(x, proj_tmp_, fchg_[l], w(off_.fcprojw, l, 4 * C * C),
                            w(off_.fcprojb, l, C), BT, 4 * C, C);
    cu::residual_forward(x, res_[l + 1], res2_[l], proj_tmp_, BT * C);
  }
  cu::layernorm_forward(x, lnf_, lnf_mean_, lnf_rstd_, res_[L], p16 + off_.lnfw, p16 + off_.lnfb,
                        BT, C);
  cu::matmul_forward_bf16(x, logits_, lnf_, p16 + off_.wte, nullptr, BT, C, d_.Vp);
  // losses, and dlogits in place of the logits (mean loss: dloss = 1/BT)
  cu::softmax_cross_entropy(x, losses_, logits_, logits_, targets_, BT, d_.V, d_.Vp,
                            1.0f / static_cast<float>(BT));

  // ---- backward: parameter gradients fp32 (zeroed, then accumulated), activation grads bf16
  zero(grads_, static_cast<size_t>(off_.total) * 4);
  zero(dtmp_c_, BT * C * 2);
  cu::matmul_backward_bf16(x, dtmp_c_, grads_ + off_.wte, nullptr, logits_, lnf_, p16 + off_.wte,
                           BT, C, d_.Vp);
  zero(dres_, BT * C * 2);
  cu::layernorm_backward(x, dres_, grads_ + off_.lnfw, grads_ + off_.lnfb, dtmp_c_, res_[L],
                         p16 + off_.lnfw, lnf_mean_, lnf_rstd_, BT, C);
  for (int64_t l = L - 1; l >= 0; --l) {
    // res[l+1] = res2 + fcproj: dres is the gradient of both; the MLP adds into it.
    zero(dtmp_4c_a_, BT * 4 * C * 2);
    cu::matmul_backward_bf16(x, dtmp_4c_a_, g(off_.fcprojw, l, 4 * C * C), g(off_.fcprojb, l, C),
                             dres_, fchg_[l], w(off_.fcprojw, l, 4 * C * C), BT, 4 * C, C);
    zero(dtmp_4c_b_, BT * 4 * C * 2);
    cu::gelu_backward(x, dtmp_4c_b_, fch_[l], dtmp_4c_a_, BT * 4 * C);
    zero(dtmp_c_, BT * C * 2);
    cu::matmul_backward_bf16(x, dtmp_c_, g(off_.fcw, l, 4 * C * C), g(off_.fcb, l, 4 * C),
                             dtmp_4c_b_, ln2_[l], w(off_.fcw, l, 4 * C * C), BT, C, 4 * C);
    cu::layernorm_backward(x, dres_, g(off_.ln2w, l, C), g(off_.ln2b, l, C), dtmp_c_, res2_[l],
                           w(off_.ln2w, l, C), ln2_mean_[l], ln2_rstd_[l], BT, C);
    // res2 = res[l] + attproj: dres is the gradient of both; attention adds into it.
    zero(dtmp_c_, BT * C * 2);
    cu::matmul_backward_bf16(x, dtmp_c_, g(off_.attprojw, l, C * C), g(off_.attprojb, l, C), dres_,
                             atty_[l], w(off_.attprojw, l, C * C), BT, C, C);
    cu::cast_to_float(x, dc32_, dtmp_c_, BT * C);
    cu::cast_to_float(x, qkv32_, qkv_[l], BT * 3 * C);  // recast: one fp32 qkv buffer for all L
    zero(dqkv32_, BT * 3 * C * 4);
    cu::attention_backward(x, dqkv32_, dpreatt_, datt_, dc32_, qkv32_, att_[l], B, T, C, NH);
    cu::cast_to_bf16(x, dtmp_3c_, dqkv32_, BT * 3 * C);
    zero(dtmp_c_, BT * C * 2);
    cu::matmul_backward_bf16(x, dtmp_c_, g(off_.qkvw, l, 3 * C * C), g(off_.qkvb, l, 3 * C),
                             dtmp_3c_, ln1_[l], w(off_.qkvw, l, 3 * C * C), BT, C, 3 * C);
    cu::layernorm_backward(x, dres_, g(off_.ln1w, l, C), g(off_.ln1b, l, C), dtmp_c_, res_[l],
                           w(off_.ln1w, l, C), ln1_mean_[l], ln1_rstd_[l], BT, C);
  }
  cu::cast_to_float(x, dc32_, dres_, BT * C);
  cu::embedding_backward(x, grads_ + off_.wte, grads_ + off_.wpe, dc32_, tokens_, B, T, C);

  // ---- AdamW over all parameters, writing the bf16 copy
  kernels::AdamWStep adam;
  adam.learning_rate = learning_rate;
  adam.t = ++step_;
  const cu::AdamWTensor all{master_, grads_, m_, v_, params16_, off_.total};
  cu::adamw_update_multi(x, &all, 1, adam);

  if (!read_loss) return NAN;
  std::vector<float> losses(BT);
  KT_CUDA_CHECK(cudaMemcpyAsync(losses.data(), losses_, BT * 4, cudaMemcpyDeviceToHost, s));
  KT_CUDA_CHECK(cudaStreamSynchronize(s));
  double sum = 0;
  for (float l : losses) sum += l;
  return static_cast<float>(sum / BT);
}

}  // namespace kt::gpu_harness

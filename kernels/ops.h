// The compute kernels of the worker, one family per section, llm.c style: every op is a
// *_forward / *_backward pair with the same arguments, shapes in comments, and gradients
// accumulated (+=) into d* buffers. Letters: B batch, T time, C channels, NH heads, hs = C/NH,
// F ffn hidden, OC output channels, V vocabulary, Vp padded vocabulary, BT = B·T.
//
// kt::kernels::cpu holds the fast CPU versions (oneDNN sgemm, OpenMP, vectorised loops);
// kernels/reference.h the plain loops, as templates, that tests run in float32 and float64 to
// check them. A CUDA family will live in kt::kernels::cuda with the same signatures over device
// pointers.
#pragma once

#include <cstdint>
#include <string>

namespace kt::kernels {

// AdamW hyper-parameters of one update (decoupled weight decay, Loshchilov & Hutter 2019).
struct AdamWStep {
  float learning_rate = 6e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;  // GPT-3 (Brown et al. 2020, Appendix B)
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t t = 1;            // 1-based step, for bias correction
  float grad_scale = 1.0f;  // multiplies every gradient first (gradient clipping)
};

#define KT_KERNEL_FAMILY                                                                          \
  /* out (BT,OC) = inp (BT,C) · weight (OC,C)ᵀ + bias (OC); bias may be null */                \
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,       \
                      int64_t BT, int64_t C, int64_t OC);                                         \
  /* dweight is accumulated into, or overwritten when accumulate_dweight is false (the first */ \
  /* micro-batch of a step: no memset of the weight gradients, no read of them)               */ \
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,              \
                       const float* inp, const float* weight, int64_t BT, int64_t C, int64_t OC,  \
                       bool accumulate_dweight = true);                                           \
  /* out (BT,C), mean (BT), rstd (BT) */                                                          \
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,                  \
                         const float* weight, const float* bias, int64_t BT, int64_t C);          \
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,           \
                          const float* inp, const float* weight, const float* mean,               \
                          const float* rstd, int64_t BT, int64_t C);                              \
  /* GELU, tanh approximation (Hendrycks & Gimpel 2016), as GPT-2 */                              \
  void gelu_forward(float* out, const float* inp, int64_t N);                                     \
  void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t N);                \
  /* out = a + b */                                                                               \
  void residual_forward(float* out, const float* a, const float* b, int64_t N);                   \
  void residual_backward(float* da, float* db, const float* dout, int64_t N);                     \
  /* out (B,T,C) = wte[tokens] (Vp,C) + wpe[t] (T,C) */                                           \
  void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,   \
                         int64_t B, int64_t T, int64_t C);                                        \
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,     \
                          int64_t B, int64_t T, int64_t C);                                       \
  /* causal self-attention: inp (B,T,3C) holds q,k,v; out (B,T,C); preatt, att (B,NH,T,T) */      \
  void attention_forward(float* out, float* preatt, float* att, const float* inp, int64_t B,      \
                         int64_t T, int64_t C, int64_t NH);                                       \
  void attention_backward(float* dinp, float* dpreatt, float* datt, const float* dout,            \
                          const float* inp, const float* att, int64_t B, int64_t T, int64_t C,    \
                          int64_t NH);                                                            \
  /* Fused softmax + cross-entropy over the first V of Vp logits per row. losses (BT). When   */  \
  /* dlogits is not null it receives (softmax - onehot(target)) · dloss for the first V       */ \
  /* columns and 0 for the padding; dlogits may alias logits.                                 */  \
  void softmax_cross_entropy(float* losses, float* dlogits, const float* logits,                  \
                             const int32_t* targets, int64_t BT, int64_t V, int64_t Vp,           \
                             float dloss);                                                        \
  /* AdamW over N parameters; m and v are the moments */                                          \
  void adamw_update(float* params, const float* grads, float* m, float* v, int64_t N,             \
                    const AdamWStep& step);                                                       \
  /* Σ x² in double (for the global gradient norm) */                                           \
  double sum_of_squares(const float* x, int64_t N);

namespace cpu {
KT_KERNEL_FAMILY

// Mixed-precision AdamW, the offload engine's CPU update: fp32 master weights and moments;
// gradients in fp32 (`grads`) or bf16 (`grads_bf16`; exactly one is non-null); the updated
// weights also written as bf16 into `params_bf16` when it is non-null (the device copy to send).
// Same formula as adamw_update; 28 bytes per parameter with bf16 in and out.
void adamw_update_mixed(float* master, const float* grads, const uint16_t* grads_bf16, float* m,
                        float* v, uint16_t* params_bf16, int64_t N, const AdamWStep& step);

// bf16 matmuls (kernels/cpu/matmul_bf16.cpp), the fp32 pair's shapes and semantics: the weight
// is a bf16 copy (raw bits, kernels/bf16.h), inp and dout are rounded to bf16 on the way in,
// products are summed in fp32 and the outputs (out, dinp, dweight, dbias) are fp32.
void matmul_forward_bf16(float* out, const float* inp, const uint16_t* weight, const float* bias,
                         int64_t BT, int64_t C, int64_t OC);
void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const uint16_t* weight, int64_t BT, int64_t C,
                          int64_t OC, bool accumulate_dweight = true);
// out[i] = bf16(in[i]), round to nearest even
void to_bf16(uint16_t* out, const float* in, int64_t N);
// The instructions bf16 matmuls run on here: "AMX-BF16", "AVX512-BF16", or "" when the CPU has
// neither (oneDNN would emulate bf16 with fp32 instructions, slower than the fp32 path).
std::string bf16_matmul_isa();
}  // namespace cpu

#undef KT_KERNEL_FAMILY

}  // namespace kt::kernels

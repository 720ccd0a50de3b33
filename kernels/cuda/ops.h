// The CUDA kernel family: the same ops as kernels/ops.h (kt::kernels::cpu) over device pointers,
// enqueued on the Context's stream and asynchronous. Letters as in kernels/ops.h: B batch, T time,
// C channels, NH heads, hs = C/NH, OC output channels, V vocabulary, Vp padded vocabulary.
//
// Accumulation follows the CPU family: d* gradient buffers are accumulated into (+=) unless a
// comment says otherwise. This header includes no CUDA header, so CPU-only code may include it;
// the stream is the runtime's `cudaStream_t` (a `CUstream_st*`), declared opaquely below.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/ops.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace kt::kernels::cuda {

using StreamHandle = CUstream_st*;

// A bfloat16 value as stored in memory (same layout as CUDA's __nv_bfloat16).
struct bf16 {
  uint16_t bits;
};

// What every kernel needs: the stream it runs on, a cuBLASLt handle and its workspace, and a
// scratch buffer. One per stream that runs kernels; creating one allocates the workspace and the
// scratch (do it before training steps).
class Context {
 public:
  explicit Context(StreamHandle stream);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  StreamHandle stream() const { return stream_; }
  void* blas_handle() const { return blas_handle_; }  // a cublasLtHandle_t
  void* workspace() const { return workspace_; }
  size_t workspace_bytes() const { return workspace_bytes_; }
  // Device scratch for kernels on this stream (column-reduction partials), 8 MiB.
  float* scratch() const { return scratch_; }
  size_t scratch_bytes() const { return scratch_bytes_; }

 private:
  StreamHandle stream_;
  void* blas_handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  float* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
};

// ---- float32: the kt::kernels::cpu family over device pointers --------------------------------
// out (BT,OC) = inp (BT,C) · weight (OC,C)ᵀ + bias (OC); bias may be null. cuBLASLt, true fp32
// arithmetic (no TF32), bias fused as the GEMM epilogue.
void matmul_forward(const Context& ctx, float* out, const float* inp, const float* weight,
                    const float* bias, int64_t BT, int64_t C, int64_t OC);
// dinp (BT,C) += dout·weight; dweight (OC,C) += doutᵀ·inp (overwritten when !accumulate_dweight);
// dbias (OC) += Σ_rows dout (may be null).
void matmul_backward(const Context& ctx, float* dinp, float* dweight, float* dbias,
                     const float* dout, const float* inp, const float* weight, int64_t BT,
                     int64_t C, int64_t OC, bool accumulate_dweight = true);
void layernorm_forward(const Context& ctx, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int64_t BT, int64_t C);
void layernorm_backward(const Context& ctx, float* dinp, float* dweight, float* dbias,
                        const float* dout, const float* inp, const float* weight, const float* mean,
                        const float* rstd, int64_t BT, int64_t C);
void gelu_forward(const Context& ctx, float* out, const float* inp, int64_t N);
void gelu_backward(const Context& ctx, float* dinp, const float* inp, const float* dout, int64_t N);
void residual_forward(const Context& ctx, float* out, const float* a, const float* b, int64_t N);
void residual_backward(const Context& ctx, float* da, float* db, const float* dout, int64_t N);
// tokens (B,T) live in device memory.
void embedding_forward(const Context& ctx, float* out, const int32_t* tokens, const float* wte,
                       const float* wpe, int64_t B, int64_t T, int64_t C);
// dwte by atomicAdd (a token's row gets its sum in no fixed order: not bit-reproducible run to
// run, unlike every other kernel here); dwpe deterministic.
void embedding_backward(const Context& ctx, float* dwte, float* dwpe, const float* dout,
                        const int32_t* tokens, int64_t B, int64_t T, int64_t C);
// Causal self-attention with the attention matrix materialised, like the CPU family: inp
// (B,T,3C) = q,k,v; out (B,T,C); preatt, att (B,NH,T,T), the masked part written as 0.
void attention_forward(const Context& ctx, float* out, float* preatt, float* att, const float* inp,
                       int64_t B, int64_t T, int64_t C, int64_t NH);
// dinp (B,T,3C) is accumulated into; dpreatt and datt (B,NH,T,T) are scratch that this call
// overwrites (on the CPU they accumulate; the model zeroes them before every call anyway).
void attention_backward(const Context& ctx, float* dinp, float* dpreatt, float* datt,
                        const float* dout, const float* inp, const float* att, int64_t B, int64_t T,
                        int64_t C, int64_t NH);
// As kt::kernels::cpu::softmax_cross_entropy; targets (BT) in device memory.
void softmax_cross_entropy(const Context& ctx, float* losses, float* dlogits, const float* logits,
                           const int32_t* targets, int64_t BT, int64_t V, int64_t Vp, float dloss);
void adamw_update(const Context& ctx, float* params, const float* grads, float* m, float* v,
                  int64_t N, const AdamWStep& step);
// *result (one double in device memory) += Σ x²  (zero it first for a fresh sum).
void sum_of_squares(const Context& ctx, double* result, const float* x, int64_t N);

// ---- bfloat16 compute with float32 master state ------------------------------------------------
void cast_to_bf16(const Context& ctx, bf16* out, const float* inp, int64_t N);  // round to nearest
void cast_to_float(const Context& ctx, float* out, const bf16* inp, int64_t N);
// out (BT,OC) = inp (BT,C) · weight (OC,C)ᵀ + bias (OC): bf16 operands, fp32 accumulation,
// bf16 result, bias (bf16, may be null) fused as the cuBLASLt epilogue.
void matmul_forward_bf16(const Context& ctx, bf16* out, const bf16* inp, const bf16* weight,
                         const bf16* bias, int64_t BT, int64_t C, int64_t OC);
// dinp (BT,C) += dout·weight (bf16; overwritten when !accumulate_dinp: then dinp's old contents,
// even NaN, are never read); dweight (OC,C) fp32 += doutᵀ·inp (overwritten when
// !accumulate_dweight); dbias (OC) fp32 += Σ_rows dout (may be null).
void matmul_backward_bf16(const Context& ctx, bf16* dinp, float* dweight, float* dbias,
                          const bf16* dout, const bf16* inp, const bf16* weight, int64_t BT,
                          int64_t C, int64_t OC, bool accumulate_dweight = true,
                          bool accumulate_dinp = true);
// bf16 storage of activations and parameter copies, fp32 arithmetic inside; statistics (mean,
// rstd), parameter gradients and losses stay fp32. Same semantics as the fp32 versions above.
void layernorm_forward(const Context& ctx, bf16* out, float* mean, float* rstd, const bf16* inp,
                       const bf16* weight, const bf16* bias, int64_t BT, int64_t C);
void layernorm_backward(const Context& ctx, bf16* dinp, float* dweight, float* dbias,
                        const bf16* dout, const bf16* inp, const bf16* weight, const float* mean,
                        const float* rstd, int64_t BT, int64_t C);
void gelu_forward(const Context& ctx, bf16* out, const bf16* inp, int64_t N);
// !accumulate: dinp = gelu'(inp)·dout, and dinp may then be dout itself (in place).
void gelu_backward(const Context& ctx, bf16* dinp, const bf16* inp, const bf16* dout, int64_t N,
                   bool accumulate = true);
void residual_forward(const Context& ctx, bf16* out, const bf16* a, const bf16* b, int64_t N);
void residual_backward(const Context& ctx, bf16* da, bf16* db, const bf16* dout, int64_t N);
// bf16 tables and output (the two rows summed in fp32, rounded once); gradients fp32 from bf16
// dout, same order-free dwte accumulation as the fp32 version.
void embedding_forward(const Context& ctx, bf16* out, const int32_t* tokens, const bf16* wte,
                       const bf16* wpe, int64_t B, int64_t T, int64_t C);
void embedding_backward(const Context& ctx, float* dwte, float* dwpe, const bf16* dout,
                        const int32_t* tokens, int64_t B, int64_t T, int64_t C);
void softmax_cross_entropy(const Context& ctx, float* losses, bf16* dlogits, const bf16* logits,
                           const int32_t* targets, int64_t BT, int64_t V, int64_t Vp, float dloss);

// ---- tensor parallelism: the vocabulary split over the TP ranks (Megatron's vocab-parallel
// embedding and cross-entropy; rank r holds wte rows [vocab_lo, vocab_lo + vocab_rows)).
// Embedding of the rows held here (0 for other tokens), plus wpe unless it is null: summed over
// the ranks, with wpe passed on one of them, it is embedding_forward's output.
void embedding_forward_rows(const Context& ctx, bf16* out, const int32_t* tokens, const bf16* wte,
                            const bf16* wpe, int64_t B, int64_t T, int64_t C, int64_t vocab_lo,
                            int64_t vocab_rows);
// dwte (vocab_rows, C) += only the rows held here; dwpe (T, C) += as embedding_backward.
void embedding_backward_rows(const Context& ctx, float* dwte, float* dwpe, const bf16* dout,
                             const int32_t* tokens, int64_t B, int64_t T, int64_t C,
                             int64_t vocab_lo, int64_t vocab_rows);
// Softmax cross-entropy over logits split by columns: this rank's logits (BT, Vl) cover
// vocabulary [vocab_lo, vocab_lo + Vl) of which the first `valid` are real tokens. Three steps
// with an all-reduce after each of the first two:
//   1. row_max (BT) := max over the valid columns here        → all-reduce max
//   2. sums (2·BT) := Σ exp(x − row_max) here | the target's logit if held here, else 0
//                                                              → all-reduce sum
//   3. losses (BT) := log Σ − (target logit − max); dlogits (BT, Vl) := (softmax − onehot)·dloss
//      on the valid columns, 0 on the rest (dlogits may alias logits).
void vocab_parallel_ce_max(const Context& ctx, float* row_max, const bf16* logits, int64_t BT,
                           int64_t valid, int64_t Vl);
void vocab_parallel_ce_sums(const Context& ctx, float* sums, const bf16* logits,
                            const float* row_max, const int32_t* targets, int64_t BT,
                            int64_t vocab_lo, int64_t valid, int64_t Vl);
void vocab_parallel_ce_finish(const Context& ctx, float* losses, bf16* dlogits, const bf16* logits,
                              const float* row_max, const float* sums, const int32_t* targets,
                              int64_t BT, int64_t vocab_lo, int64_t valid, int64_t Vl, float dloss);

// Causal self-attention without the T×T matrix (FlashAttention-2 style: tiles of 64 queries
// against tiles of 64 keys on the tensor cores, online softmax; kernels/cuda/flash_attention.cu).
// qkv (B,T,3C) bf16 [q | k | v, each C = NH·hs, head h at columns h·hs..]; out (B,T,C) bf16;
// lse (B,NH,T) fp32: each query row's log-sum-exp of its scaled scores, saved for the backward.
// Scale 1/sqrt(hs). Same math as attention_forward (kernels/reference.h); any T ≥ 1. bf16
// tensors 16-byte aligned. A head size the kernels are not built for throws kt::Error.
bool flash_attention_supported(int64_t head_size);  // hs 32, 64 and 128
void attention_forward_bf16(const Context& ctx, bf16* out, float* lse, const bf16* qkv, int64_t B,
                            int64_t T, int64_t C, int64_t NH);
// dqkv (B,T,3C) bf16 is OVERWRITTEN (not accumulated); needs the forward's out and lse.
// `scratch`: device memory of attention_backward_bf16_scratch_bytes(B,T,C,NH) bytes (the rows'
// D = Σ dO·O, fp32), owned by the caller. Deterministic: dQ and dK/dV come from two kernels that
// each own their rows (no atomics), so repeated calls give bit-identical dqkv.
size_t attention_backward_bf16_scratch_bytes(int64_t B, int64_t T, int64_t C, int64_t NH);
void attention_backward_bf16(const Context& ctx, bf16* dqkv, void* scratch, const bf16* dout,
                             const bf16* qkv, const bf16* out, const float* lse, int64_t B,
                             int64_t T, int64_t C, int64_t NH);
// Multi-tensor AdamW: one launch updates every tensor of the list (fp32 master params, grads and
// moments), and writes the bf16 copy of each updated parameter when params_bf16[i] is not null.
struct AdamWTensor {
  float* params;
  const float* grads;
  float* m;
  float* v;
  bf16* params_bf16;  // may be null
  int64_t N;
};
// `tensors` is a host array of `count` entries; it is copied to the device with the launch.
void adamw_update_multi(const Context& ctx, const AdamWTensor* tensors, int count,
                        const AdamWStep& step);

}  // namespace kt::kernels::cuda

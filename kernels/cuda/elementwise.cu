// Memory-bound CUDA kernels: casts, GELU, residual, embedding, column sums, the sum of squares
// and multi-tensor AdamW. Grid-stride loops; shapes from launch_shape.h; GELU and AdamW element
// math from kernels/math.h (the same functions the CPU kernels call).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/internal.h"
#include "kernels/cuda/launch_shape.h"
#include "kernels/cuda/ops.h"
#include "kernels/math.h"

namespace kt::kernels::cuda {
namespace {

#define KT_GRID_STRIDE(i, N)                                                             \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (N); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

__global__ void cast_to_bf16_kernel(__nv_bfloat16* out, const float* inp, int64_t N) {
  KT_GRID_STRIDE(i, N) out[i] = __float2bfloat16_rn(inp[i]);
}
__global__ void cast_to_float_kernel(float* out, const __nv_bfloat16* inp, int64_t N) {
  KT_GRID_STRIDE(i, N) out[i] = __bfloat162float(inp[i]);
}

// Element kernels over T = float or __nv_bfloat16 storage; arithmetic in float.
template <class T>
__global__ void gelu_forward_kernel(T* out, const T* inp, int64_t N) {
  KT_GRID_STRIDE(i, N) {
    const float x = ld(inp[i]);
    st(&out[i], math::gelu_from_tanh(x, tanhf(math::gelu_tanh_argument(x))));
  }
}
template <class T>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, int64_t N,
                                     bool accumulate) {
  KT_GRID_STRIDE(i, N) {  // dinp may alias dout: each element is read before it is written
    const float x = ld(inp[i]);
    const float grad = math::gelu_grad_from_tanh(x, tanhf(math::gelu_tanh_argument(x)));
    const float d = grad * ld(dout[i]);
    st(&dinp[i], accumulate ? ld(dinp[i]) + d : d);
  }
}

template <class T>
__global__ void residual_forward_kernel(T* out, const T* a, const T* b, int64_t N) {
  KT_GRID_STRIDE(i, N) st(&out[i], ld(a[i]) + ld(b[i]));
}
template <class T>
__global__ void residual_backward_kernel(T* da, T* db, const T* dout, int64_t N) {
  KT_GRID_STRIDE(i, N) {
    const float d = ld(dout[i]);
    st(&da[i], ld(da[i]) + d);
    st(&db[i], ld(db[i]) + d);
  }
}

// out (B,T,C) = wte[tokens] + wpe[t] (the sum in fp32, one rounding when Real is bf16)
constexpr int64_t kAllRows = INT64_MAX;  // the whole table

// With vocabulary rows [lo, lo + rows) only (a TP rank's slice of wte, row 0 = token lo): tokens
// outside contribute 0; wpe may be null (its rows then not added).
template <class Real>
__global__ void embedding_forward_kernel(Real* out, const int32_t* tokens, const Real* wte,
                                         const Real* wpe, int64_t BT, int64_t T, int64_t C,
                                         int64_t lo, int64_t rows) {
  KT_GRID_STRIDE(i, BT * C) {
    const int64_t bt = i / C, c = i % C;
    const int64_t row = static_cast<int64_t>(tokens[bt]) - lo;
    const float token = row >= 0 && row < rows ? ld(wte[row * C + c]) : 0.0f;
    st(out + i, token + (wpe ? ld(wpe[(bt % T) * C + c]) : 0.0f));
  }
}
// dwte: rows repeat when a token repeats, so the adds are atomic (order not fixed).
template <class Grad>
__global__ void embedding_backward_wte_kernel(float* dwte, const Grad* dout, const int32_t* tokens,
                                              int64_t BT, int64_t C, int64_t lo, int64_t rows) {
  KT_GRID_STRIDE(i, BT * C) {
    const int64_t bt = i / C, c = i % C;
    const int64_t row = static_cast<int64_t>(tokens[bt]) - lo;
    if (row >= 0 && row < rows) atomicAdd(&dwte[row * C + c], ld(dout[i]));
  }
}
// dwpe (T,C) += Σ_b dout (b,t,c): one thread per (t,c).
template <class Grad>
__global__ void embedding_backward_wpe_kernel(float* dwpe, const Grad* dout, int64_t B, int64_t T,
                                              int64_t C) {
  KT_GRID_STRIDE(i, T * C) {
    float acc = 0.0f;
    for (int64_t b = 0; b < B; ++b) acc += ld(dout[b * T * C + i]);
    dwpe[i] += acc;
  }
}

// One column term for column_reduce: the element itself.
template <class In>
struct ElementTerm {
  const In* in;
  int64_t cols;
  __device__ void operator()(int64_t r, int64_t c, float* acc) const {
    acc[0] += ld(in[r * cols + c]);
  }
};

__global__ void sum_of_squares_kernel(double* result, const float* x, int64_t N) {
  double acc = 0;
  KT_GRID_STRIDE(i, N) acc += static_cast<double>(x[i]) * x[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) atomicAdd(result, acc);
}

// Multi-tensor AdamW: up to kAdamWGroup tensors per launch, passed by value (no H2D copy of the
// list). Block j handles chunk j of the concatenated chunk lists.
constexpr int kAdamWGroup = 24;
struct AdamWGroup {
  AdamWTensor tensors[kAdamWGroup];
  int64_t first_chunk[kAdamWGroup + 1];
  int count;
};

__global__ void adamw_multi_kernel(AdamWGroup group, math::AdamWConstants k) {
  const int64_t chunk = blockIdx.x;
  int t = 0;
  while (t + 1 < group.count && group.first_chunk[t + 1] <= chunk) ++t;
  const AdamWTensor& tensor = group.tensors[t];
  const int64_t begin = (chunk - group.first_chunk[t]) * kAdamWChunk;
  const int64_t end = min(tensor.N, begin + kAdamWChunk);
  __nv_bfloat16* out16 = native(tensor.params_bf16);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float m = tensor.m[i], v = tensor.v[i];
    const float p = math::adamw_element(tensor.params[i], tensor.grads[i], m, v, k);
    tensor.m[i] = m;
    tensor.v[i] = v;
    tensor.params[i] = p;
    if (out16) out16[i] = __float2bfloat16_rn(p);
  }
}

template <class Kernel, class... Args>
void launch_elementwise(const Context& ctx, int64_t N, Kernel kernel, Args... args) {
  if (N <= 0) return;
  const LaunchShape s = elementwise_shape(N);
  kernel<<<static_cast<unsigned>(s.grid), s.block, 0, ctx.stream()>>>(args...);
  KT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void cast_to_bf16(const Context& ctx, bf16* out, const float* inp, int64_t N) {
  launch_elementwise(ctx, N, cast_to_bf16_kernel, native(out), inp, N);
}
void cast_to_float(const Context& ctx, float* out, const bf16* inp, int64_t N) {
  launch_elementwise(ctx, N, cast_to_float_kernel, out, native(inp), N);
}
void gelu_forward(const Context& ctx, float* out, const float* inp, int64_t N) {
  launch_elementwise(ctx, N, gelu_forward_kernel<float>, out, inp, N);
}
void gelu_forward(const Context& ctx, bf16* out, const bf16* inp, int64_t N) {
  launch_elementwise(ctx, N, gelu_forward_kernel<__nv_bfloat16>, native(out), native(inp), N);
}
void gelu_backward(const Context& ctx, float* dinp, const float* inp, const float* dout,
                   int64_t N) {
  launch_elementwise(ctx, N, gelu_backward_kernel<float>, dinp, inp, dout, N, true);
}
void gelu_backward(const Context& ctx, bf16* dinp, const bf16* inp, const bf16* dout, int64_t N,
                   bool accumulate) {
  launch_elementwise(ctx, N, gelu_backward_kernel<__nv_bfloat16>, native(dinp), native(inp),
                     native(dout), N, accumulate);
}
void residual_forward(const Context& ctx, float* out, const float* a, const float* b, int64_t N) {
  launch_elementwise(ctx, N, residual_forward_kernel<float>, out, a, b, N);
}
void residual_forward(const Context& ctx, bf16* out, const bf16* a, const bf16* b, int64_t N) {
  launch_elementwise(ctx, N, residual_forward_kernel<__nv_bfloat16>, native(out), native(a),
                     native(b), N);
}
void residual_backward(const Context& ctx, float* da, float* db, const float* dout, int64_t N) {
  launch_elementwise(ctx, N, residual_backward_kernel<float>, da, db, dout, N);
}
void residual_backward(const Context& ctx, bf16* da, bf16* db, const bf16* dout, int64_t N) {
  launch_elementwise(ctx, N, residual_backward_kernel<__nv_bfloat16>, native(da), native(db),
                     native(dout), N);
}
void embedding_forward(const Context& ctx, float* out, const int32_t* tokens, const float* wte,
                       const float* wpe, int64_t B, int64_t T, int64_t C) {
  launch_elementwise(ctx, B * T * C, embedding_forward_kernel<float>, out, tokens, wte, wpe, B * T,
                     T, C, int64_t{0}, kAllRows);
}
void embedding_backward(const Context& ctx, float* dwte, float* dwpe, const float* dout,
                        const int32_t* tokens, int64_t B, int64_t T, int64_t C) {
  launch_elementwise(ctx, B * T * C, embedding_backward_wte_kernel<float>, dwte, dout, tokens,
                     B * T, C, int64_t{0}, kAllRows);
  launch_elementwise(ctx, T * C, embedding_backward_wpe_kernel<float>, dwpe, dout, B, T, C);
}
void embedding_forward(const Context& ctx, bf16* out, const int32_t* tokens, const bf16* wte,
                       const bf16* wpe, int64_t B, int64_t T, int64_t C) {
  embedding_forward_rows(ctx, out, tokens, wte, wpe, B, T, C, 0, kAllRows);
}
void embedding_backward(const Context& ctx, float* dwte, float* dwpe, const bf16* dout,
                        const int32_t* tokens, int64_t B, int64_t T, int64_t C) {
  embedding_backward_rows(ctx, dwte, dwpe, dout, tokens, B, T, C, 0, kAllRows);
}
void embedding_forward_rows(const Context& ctx, bf16* out, const int32_t* tokens, const bf16* wte,
                            const bf16* wpe, int64_t B, int64_t T, int64_t C, int64_t vocab_lo,
                            int64_t vocab_rows) {
  launch_elementwise(ctx, B * T * C, embedding_forward_kernel<__nv_bfloat16>, native(out), tokens,
                     native(wte), native(wpe), B * T, T, C, vocab_lo, vocab_rows);
}
void embedding_backward_rows(const Context& ctx, float* dwte, float* dwpe, const bf16* dout,
                             const int32_t* tokens, int64_t B, int64_t T, int64_t C,
                             int64_t vocab_lo, int64_t vocab_rows) {
  launch_elementwise(ctx, B * T * C, embedding_backward_wte_kernel<__nv_bfloat16>, dwte,
                     native(dout), tokens, B * T, C, vocab_lo, vocab_rows);
  launch_elementwise(ctx, T * C, embedding_backward_wpe_kernel<__nv_bfloat16>, dwpe, native(dout),
                     B, T, C);
}
void sum_of_squares(const Context& ctx, double* result, const float* x, int64_t N) {
  launch_elementwise(ctx, N, sum_of_squares_kernel, result, x, N);
}

namespace detail {
void column_sum_accumulate(const Context& ctx, float* out, const float* in, int64_t rows,
                           int64_t cols) {
  column_reduce<1>(ctx, out, nullptr, ElementTerm<float>{in, cols}, rows, cols);
}
void column_sum_accumulate(const Context& ctx, float* out, const bf16* in, int64_t rows,
                           int64_t cols) {
  column_reduce<1>(ctx, out, nullptr, ElementTerm<__nv_bfloat16>{native(in), cols}, rows, cols);
}
}  // namespace detail

void adamw_update_multi(const Context& ctx, const AdamWTensor* tensors, int count,
                        const AdamWStep& step) {
  const math::AdamWConstants k{step.learning_rate,
                               step.beta1,
                               step.beta2,
                               step.eps,
                               step.weight_decay,
                               step.grad_scale,
                               1.0f - std::pow(step.beta1, static_cast<float>(step.t)),
                               1.0f - std::pow(step.beta2, static_cast<float>(step.t))};
  for (int first = 0; first < count; first += kAdamWGroup) {
    AdamWGroup group{};
    group.count = 0;
    int64_t chunks = 0;
    for (int i = first; i < std::min(count, first + kAdamWGroup); ++i) {
      if (tensors[i].N <= 0) continue;
      group.tensors[group.count] = tensors[i];
      group.first_chunk[group.count] = chunks;
      chunks += adamw_chunks(tensors[i].N);
      ++group.count;
    }
    group.first_chunk[group.count] = chunks;
    if (chunks == 0) continue;
    KT_CHECK(chunks <= kMaxGridX, "AdamW group has too many chunks");
    adamw_multi_kernel<<<static_cast<unsigned>(chunks), 256, 0, ctx.stream()>>>(group, k);
    KT_CUDA_CHECK_LAUNCH();
  }
}

void adamw_update(const Context& ctx, float* params, const float* grads, float* m, float* v,
                  int64_t N, const AdamWStep& step) {
  const AdamWTensor tensor{params, grads, m, v, nullptr, N};
  adamw_update_multi(ctx, &tensor, 1, step);
}

}  // namespace kt::kernels::cuda

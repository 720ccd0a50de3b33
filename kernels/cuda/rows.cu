// Row kernels: layernorm forward/backward and fused softmax + cross-entropy. One block per row
// (launch_shape.h row_shape), block reductions in float; the formulas are kernels/reference.h's.
#include <cuda_runtime.h>

#include <cfloat>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch_shape.h"
#include "kernels/cuda/ops.h"

namespace kt::kernels::cuda {
namespace {

// Kernels over T = float or __nv_bfloat16 storage for activations and the parameter copies;
// statistics, parameter gradients and losses are float; arithmetic in float.

// out (BT,C), mean (BT), rstd (BT); two passes over the row (mean, then the centred variance:
// no cancellation from E[x²] − E[x]²).
template <class T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* inp,
                                         const T* weight, const T* bias, int64_t C) {
  const int64_t row = blockIdx.x;
  const T* x = inp + row * C;
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) sum += ld(x[c]);
  const float m = block_sum(sum) / static_cast<float>(C);
  float var = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) var += (ld(x[c]) - m) * (ld(x[c]) - m);
  const float s = rsqrtf(block_sum(var) / static_cast<float>(C) + 1e-5f);
  T* o = out + row * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    st(&o[c], (ld(x[c]) - m) * s * ld(weight[c]) + ld(bias[c]));
  if (threadIdx.x == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

template <class T>
__global__ void layernorm_backward_dinp_kernel(T* dinp, const T* dout, const T* inp,
                                               const T* weight, const float* mean,
                                               const float* rstd, int64_t C) {
  const int64_t row = blockIdx.x;
  const T* x = inp + row * C;
  const T* dy = dout + row * C;
  const float m = mean[row], s = rstd[row];
  float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float dnorm = ld(weight[c]) * ld(dy[c]);
    dnorm_sum += dnorm;
    dnorm_norm_sum += dnorm * (ld(x[c]) - m) * s;
  }
  const float dnorm_mean = block_sum(dnorm_sum) / static_cast<float>(C);
  const float dnorm_norm_mean = block_sum(dnorm_norm_sum) / static_cast<float>(C);
  T* dx = dinp + row * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float norm = (ld(x[c]) - m) * s;
    st(&dx[c], ld(dx[c]) + (ld(weight[c]) * ld(dy[c]) - dnorm_mean - norm * dnorm_norm_mean) * s);
  }
}

// The column terms of layernorm's parameter gradients for column_reduce: dy·norm (dweight) and
// dy (dbias); deterministic two-stage sums.
template <class T>
struct LayernormParamTerms {
  const T* dout;
  const T* inp;
  const float* mean;
  const float* rstd;
  int64_t C;
  __device__ void operator()(int64_t r, int64_t c, float* acc) const {
    const float dy = ld(dout[r * C + c]);
    acc[0] += dy * (ld(inp[r * C + c]) - mean[r]) * rstd[r];
    acc[1] += dy;
  }
};

// losses (BT); dlogits (BT,Vp) = (softmax − onehot)·dloss over the first V columns, 0 beyond.
// Each element is read and then written by the same thread, so dlogits may alias logits.
template <class T>
__global__ void softmax_cross_entropy_kernel(float* losses, T* dlogits, const T* logits,
                                             const int32_t* targets, int64_t V, int64_t Vp,
                                             float dloss) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * Vp;
  float maxval = -FLT_MAX;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) maxval = fmaxf(maxval, ld(x[v]));
  maxval = block_max(maxval);
  float sum = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) sum += expf(ld(x[v]) - maxval);
  sum = block_sum(sum);
  const int32_t target = targets[row];
  if (threadIdx.x == 0) losses[row] = logf(sum) - (ld(x[target]) - maxval);
  if (!dlogits) return;
  __syncthreads();  // thread 0 has read x[target] before anyone overwrites it (aliasing)
  T* d = dlogits + row * Vp;
  const float inv_sum = 1.0f / sum;
  for (int64_t v = threadIdx.x; v < Vp; v += blockDim.x) {
    if (v < V) {
      const float p = expf(ld(x[v]) - maxval) * inv_sum;
      st(&d[v], (p - (v == target ? 1.0f : 0.0f)) * dloss);
    } else {
      st(&d[v], 0.0f);
    }
  }
}

template <class T>
void launch_layernorm_forward(const Context& ctx, T* out, float* mean, float* rstd, const T* inp,
                              const T* weight, const T* bias, int64_t BT, int64_t C) {
  if (BT <= 0) return;
  const LaunchShape s = row_shape(BT, C);
  KT_CHECK(launchable(s), "layernorm_forward: unlaunchable shape");
  layernorm_forward_kernel<<<static_cast<unsigned>(s.grid), s.block, 0, ctx.stream()>>>(
      out, mean, rstd, inp, weight, bias, C);
  KT_CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_layernorm_backward(const Context& ctx, T* dinp, float* dweight, float* dbias,
                               const T* dout, const T* inp, const T* weight, const float* mean,
                               const float* rstd, int64_t BT, int64_t C) {
  if (BT <= 0) return;
  const LaunchShape s = row_shape(BT, C);
  KT_CHECK(launchable(s), "layernorm_backward: unlaunchable shape");
  layernorm_backward_dinp_kernel<<<static_cast<unsigned>(s.grid), s.block, 0, ctx.stream()>>>(
      dinp, dout, inp, weight, mean, rstd, C);
  KT_CUDA_CHECK_LAUNCH();
  column_reduce<2>(ctx, dweight, dbias, LayernormParamTerms<T>{dout, inp, mean, rstd, C}, BT, C);
}

template <class T>
void launch_softmax_cross_entropy(const Context& ctx, float* losses, T* dlogits, const T* logits,
                                  const int32_t* targets, int64_t BT, int64_t V, int64_t Vp,
                                  float dloss) {
  if (BT <= 0) return;
  const LaunchShape s = row_shape(BT, Vp);
  KT_CHECK(launchable(s), "softmax_cross_entropy: unlaunchable shape");
  softmax_cross_entropy_kernel<<<static_cast<unsigned>(s.grid), s.block, 0, ctx.stream()>>>(
      losses, dlogits, logits, targets, V, Vp, dloss);
  KT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void layernorm_forward(const Context& ctx, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int64_t BT, int64_t C) {
  launch_layernorm_forward(ctx, out, mean, rstd, inp, weight, bias, BT, C);
}
void layernorm_forward(const Context& ctx, bf16* out, float* mean, float* rstd, const bf16* inp,
                       const bf16* weight, const bf16* bias, int64_t BT, int64_t C) {
  launch_layernorm_forward(ctx, native(out), mean, rstd, native(inp), native(weight), native(bias),
                           BT, C);
}
void layernorm_backward(const Context& ctx, float* dinp, float* dweight, float* dbias,
                        const float* dout, const float* inp, const float* weight, const float* mean,
                        const float* rstd, int64_t BT, int64_t C) {
  launch_layernorm_backward(ctx, dinp, dweight, dbias, dout, inp, weight, mean, rstd, BT, C);
}
void layernorm_backward(const Context& ctx, bf16* dinp, float* dweight, float* dbias,
                        const bf16* dout, const bf16* inp, const bf16* weight, const float* mean,
                        const float* rstd, int64_t BT, int64_t C) {
  launch_layernorm_backward(ctx, native(dinp), dweight, dbias, native(dout), native(inp),
                            native(weight), mean, rstd, BT, C);
}
void softmax_cross_entropy(const Context& ctx, float* losses, float* dlogits, const float* logits,
                           const int32_t* targets, int64_t BT, int64_t V, int64_t Vp, float dloss) {
  launch_softmax_cross_entropy(ctx, losses, dlogits, logits, targets, BT, V, Vp, dloss);
}
void softmax_cross_entropy(const Context& ctx, float* losses, bf16* dlogits, const bf16* logits,
                           const int32_t* targets, int64_t BT, int64_t V, int64_t Vp, float dloss) {
  launch_softmax_cross_entropy(ctx, losses, native(dlogits), native(logits), targets, BT, V, Vp,
                               dloss);
}

}  // namespace kt::kernels::cuda

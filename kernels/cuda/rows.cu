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

// out (BT,C), mean (BT), rstd (BT); two passes over the row (mean, then the centred variance:
// no cancellation from E[x²] − E[x]²).
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                                         const float* weight, const float* bias, int64_t C) {
  const int64_t row = blockIdx.x;
  const float* x = inp + row * C;
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) sum += x[c];
  const float m = block_sum(sum) / static_cast<float>(C);
  float var = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) var += (x[c] - m) * (x[c] - m);
  const float s = rsqrtf(block_sum(var) / static_cast<float>(C) + 1e-5f);
  float* o = out + row * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = (x[c] - m) * s * weight[c] + bias[c];
  if (threadIdx.x == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

__global__ void layernorm_backward_dinp_kernel(float* dinp, const float* dout, const float* inp,
                                               const float* weight, const float* mean,
                                               const float* rstd, int64_t C) {
  const int64_t row = blockIdx.x;
  const float* x = inp + row * C;
  const float* dy = dout + row * C;
  const float m = mean[row], s = rstd[row];
  float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float dnorm = weight[c] * dy[c];
    dnorm_sum += dnorm;
    dnorm_norm_sum += dnorm * (x[c] - m) * s;
  }
  const float dnorm_mean = block_sum(dnorm_sum) / static_cast<float>(C);
  const float dnorm_norm_mean = block_sum(dnorm_norm_sum) / static_cast<float>(C);
  float* dx = dinp + row * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float norm = (x[c] - m) * s;
    dx[c] += (weight[c] * dy[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
  }
}

// dweight (C) += Σ_rows dy·norm, dbias (C) += Σ_rows dy: one thread per column, deterministic.
__global__ void layernorm_backward_params_kernel(float* dweight, float* dbias, const float* dout,
                                                 const float* inp, const float* mean,
                                                 const float* rstd, int64_t BT, int64_t C) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float dw = 0.0f, db = 0.0f;
  for (int64_t i = 0; i < BT; ++i) {
    const float dy = dout[i * C + c];
    dw += dy * (inp[i * C + c] - mean[i]) * rstd[i];
    db += dy;
  }
  dweight[c] += dw;
  dbias[c] += db;
}

// losses (BT); dlogits (BT,Vp) = (softmax − onehot)·dloss over the first V columns, 0 beyond.
// Each element is read and then written by the same thread, so dlogits may alias logits.
__global__ void softmax_cross_entropy_kernel(float* losses, float* dlogits, const float* logits,
                                             const int32_t* targets, int64_t V, int64_t Vp,
                                             float dloss) {
  const int64_t row = blockIdx.x;
  const float* x = logits + row * Vp;
  float maxval = -FLT_MAX;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) maxval = fmaxf(maxval, x[v]);
  maxval = block_max(maxval);
  float sum = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) sum += expf(x[v] - maxval);
  sum = block_sum(sum);
  const int32_t target = targets[row];
  if (threadIdx.x == 0) losses[row] = logf(sum) - (x[target] - maxval);
  if (!dlogits) return;
  __syncthreads();  // thread 0 has read x[target] before anyone overwrites it (aliasing)
  float* d = dlogits + row * Vp;
  const float inv_sum = 1.0f / sum;
  for (int64_t v = threadIdx.x; v < Vp; v += blockDim.x) {
    if (v < V) {
      const float p = expf(x[v] - maxval) * inv_sum;
      d[v] = (p - (v == target ? 1.0f : 0.0f)) * dloss;
    } else {
      d[v] = 0.0f;
    }
  }
}

}  // namespace

void layernorm_forward(const Context& ctx, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int64_t BT, int64_t C) {
  if (BT <= 0) return;
  const LaunchShape s = row_shape(BT, C);
  KT_CHECK(launchable(s), "layernorm_forward: unlaunchable shape");
  layernorm_forward_kernel<<<static_cast<unsigned>(s.grid), s.block, 0, ctx.stream()>>>(
      out, mean, rstd, inp, weight, bias, C);
  KT_CUDA_CHECK_LAUNCH();
}

void layernorm_backward(const Context& ctx, float* dinp, float* dweight, float* dbias,
                        const float* dout, const float* inp, const float* weight, const float* mean,
                        const float* rstd, int64_t BT, int64_t C) {
  if (BT <= 0) return;
  const LaunchShape s = row_shape(BT, C);
  KT_CHECK(launchable(s), "layernorm_backward: unlaunchable shape");
  layernorm_backward_dinp_kernel<<<static_cast<unsigned>(s.grid), s.block, 0, ctx.stream()>>>(
      dinp, dout, inp, weight, mean, rstd, C);
  KT_CUDA_CHECK_LAUNCH();
  const LaunchShape p = column_shape(C);
  layernorm_backward_params_kernel<<<static_cast<unsigned>(p.grid), p.block, 0, ctx.stream()>>>(
      dweight, dbias, dout, inp, mean, rstd, BT, C);
  KT_CUDA_CHECK_LAUNCH();
}

void softmax_cross_entropy(const Context& ctx, float* losses, float* dlogits, const float* logits,
                           const int32_t* targets, int64_t BT, int64_t V, int64_t Vp, float dloss) {
  if (BT <= 0) return;
  const LaunchShape s = row_shape(BT, Vp);
  KT_CHECK(launchable(s), "softmax_cross_entropy: unlaunchable shape");
  softmax_cross_entropy_kernel<<<static_cast<unsigned>(s.grid), s.block, 0, ctx.stream()>>>(
      losses, dlogits, logits, targets, V, Vp, dloss);
  KT_CUDA_CHECK_LAUNCH();
}

}  // namespace kt::kernels::cuda

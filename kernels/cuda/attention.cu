// Causal self-attention with the (B,NH,T,T) attention matrix materialised, mirroring the CPU
// family (kernels/cpu/attention.cpp) so that Gpt's activation layout and recompute stay the same
// on both devices. Why not a flash-style kernel or cuDNN's fused SDPA: the model stores att for
// backward today, the installed cuDNN 9 has only the backend C API (no cudnn_frontend headers),
// and a correct, readable kernel first is the order METHOD.md asks for. This costs O(T²) memory
// and bandwidth per head; a flash-style kernel (no att buffer) is the planned replacement and
// needs the model to stop keeping att (docs/WORKER.md).
//
// Forward and the query side of backward: one block per (b, h, t) query row, one warp per key
// for the dot products, threads over channels for the weighted sums. Backward key/value
// side: one block per (b, h, t2) key row summing over queries t ≥ t2, so no atomics anywhere and
// the result is deterministic.
#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch_shape.h"
#include "kernels/cuda/ops.h"

namespace kt::kernels::cuda {
namespace {

// inp (B,T,3C) rows are [q | k | v], head h at channel offset h·hs of each part.
__global__ void attention_forward_kernel(float* out, float* preatt, float* att, const float* inp,
                                         int64_t T, int64_t C, int64_t NH, float scale) {
  extern __shared__ float shared[];
  const int64_t hs = C / NH;
  float* q = shared;       // hs
  float* w = shared + hs;  // T: scores, then weights
  const int64_t t = blockIdx.x % T, bh = blockIdx.x / T, h = bh % NH, b = bh / NH;
  const float* base = inp + b * T * 3 * C;
  for (int64_t i = threadIdx.x; i < hs; i += blockDim.x) q[i] = base[t * 3 * C + h * hs + i];
  __syncthreads();
  // Scores: one warp per key row, lanes over the channels (coalesced reads of k).
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  float maxval = -FLT_MAX;
  for (int64_t t2 = warp; t2 <= t; t2 += warps) {
    const float* k = base + t2 * 3 * C + C + h * hs;
    float dot = 0.0f;
    for (int64_t i = lane; i < hs; i += 32) dot += q[i] * k[i];
    dot = warp_sum(dot) * scale;  // every lane holds the sum
    if (lane == 0) w[t2] = dot;
    maxval = fmaxf(maxval, dot);
  }
  maxval = block_max(maxval);  // its barriers publish w to the whole block
  float* pre = preatt + (bh * T + t) * T;
  float* a = att + (bh * T + t) * T;
  float sum = 0.0f;
  for (int64_t t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
    pre[t2] = w[t2];
    w[t2] = expf(w[t2] - maxval);
    sum += w[t2];
  }
  const float inv_sum = 1.0f / block_sum(sum);  // block_sum's barriers publish w
  for (int64_t t2 = threadIdx.x; t2 < T; t2 += blockDim.x) {
    if (t2 <= t) {
      w[t2] *= inv_sum;
      a[t2] = w[t2];
    } else {
      a[t2] = 0.0f;
      pre[t2] = 0.0f;
    }
  }
  __syncthreads();
  float* o = out + (b * T + t) * C + h * hs;
  for (int64_t i = threadIdx.x; i < hs; i += blockDim.x) {
    float acc = 0.0f;
    for (int64_t t2 = 0; t2 <= t; ++t2) acc += w[t2] * base[t2 * 3 * C + 2 * C + h * hs + i];
    o[i] = acc;
  }
}

// Query side: datt[t2] = v[t2]·dout[t]; dpreatt[t2] = att[t2]·(datt[t2] − Σ att·datt);
// dq += scale · Σ_t2 dpreatt[t2]·k[t2]. Writes whole rows of datt and dpreatt (0 beyond t).
__global__ void attention_backward_query_kernel(float* dinp, float* dpreatt, float* datt,
                                                const float* dout, const float* inp,
                                                const float* att, int64_t T, int64_t C, int64_t NH,
                                                float scale) {
  extern __shared__ float shared[];
  const int64_t hs = C / NH;
  float* d = shared;        // hs: dout row of this head
  float* dp = shared + hs;  // T: dpreatt row
  const int64_t t = blockIdx.x % T, bh = blockIdx.x / T, h = bh % NH, b = bh / NH;
  const float* base = inp + b * T * 3 * C;
  for (int64_t i = threadIdx.x; i < hs; i += blockDim.x) d[i] = dout[(b * T + t) * C + h * hs + i];
  __syncthreads();
  const float* a = att + (bh * T + t) * T;
  float* da = datt + (bh * T + t) * T;
  float* dpre = dpreatt + (bh * T + t) * T;
  // datt: one warp per key row, lanes over the channels (coalesced reads of v).
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  float weighted = 0.0f;
  for (int64_t t2 = warp; t2 <= t; t2 += warps) {
    const float* v = base + t2 * 3 * C + 2 * C + h * hs;
    float dot = 0.0f;
    for (int64_t i = lane; i < hs; i += 32) dot += v[i] * d[i];
    dot = warp_sum(dot);
    if (lane == 0) {
      dp[t2] = dot;  // datt for now
      weighted += a[t2] * dot;
    }
  }
  weighted = block_sum(weighted);  // its barriers publish dp to the whole block
  for (int64_t t2 = threadIdx.x; t2 < T; t2 += blockDim.x) {
    if (t2 <= t) {
      da[t2] = dp[t2];
      dp[t2] = a[t2] * (dp[t2] - weighted);
      dpre[t2] = dp[t2];
    } else {
      da[t2] = 0.0f;
      dpre[t2] = 0.0f;
    }
  }
  __syncthreads();
  float* dq = dinp + (b * T + t) * 3 * C + h * hs;
  for (int64_t i = threadIdx.x; i < hs; i += blockDim.x) {
    float acc = 0.0f;
    for (int64_t t2 = 0; t2 <= t; ++t2) acc += dp[t2] * base[t2 * 3 * C + C + h * hs + i];
    dq[i] += acc * scale;
  }
}

// Key/value side for key row t2: dk += scale · Σ_{t≥t2} dpreatt[t][t2]·q[t];
// dv += Σ_{t≥t2} att[t][t2]·dout[t].
__global__ void attention_backward_key_kernel(float* dinp, const float* dpreatt, const float* dout,
                                              const float* inp, const float* att, int64_t T,
                                              int64_t C, int64_t NH, float scale) {
  const int64_t hs = C / NH;
  const int64_t t2 = blockIdx.x % T, bh = blockIdx.x / T, h = bh % NH, b = bh / NH;
  const float* base = inp + b * T * 3 * C;
  for (int64_t i = threadIdx.x; i < hs; i += blockDim.x) {
    float dk = 0.0f, dv = 0.0f;
    for (int64_t t = t2; t < T; ++t) {
      const int64_t at = (bh * T + t) * T + t2;
      dk += dpreatt[at] * base[t * 3 * C + h * hs + i];
      dv += att[at] * dout[(b * T + t) * C + h * hs + i];
    }
    float* row = dinp + (b * T + t2) * 3 * C;
    row[C + h * hs + i] += dk * scale;
    row[2 * C + h * hs + i] += dv;
  }
}

void check_shape(const LaunchShape& s, const char* what) {
  KT_CHECK(launchable(s),
           std::string(what) + ": unlaunchable shape (T too long for shared memory?)");
}

}  // namespace

void attention_forward(const Context& ctx, float* out, float* preatt, float* att, const float* inp,
                       int64_t B, int64_t T, int64_t C, int64_t NH) {
  if (B * T <= 0) return;
  const int64_t hs = C / NH;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  const LaunchShape s = attention_row_shape(B, NH, T, hs);
  check_shape(s, "attention_forward");
  if (s.shared_bytes > kDefaultSharedBytes)
    KT_CUDA_CHECK(cudaFuncSetAttribute(attention_forward_kernel,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(s.shared_bytes)));
  attention_forward_kernel<<<static_cast<unsigned>(s.grid), s.block, s.shared_bytes,
                             ctx.stream()>>>(out, preatt, att, inp, T, C, NH, scale);
  KT_CUDA_CHECK_LAUNCH();
}

void attention_backward(const Context& ctx, float* dinp, float* dpreatt, float* datt,
                        const float* dout, const float* inp, const float* att, int64_t B, int64_t T,
                        int64_t C, int64_t NH) {
  if (B * T <= 0) return;
  const int64_t hs = C / NH;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  const LaunchShape q = attention_row_shape(B, NH, T, hs);
  check_shape(q, "attention_backward");
  if (q.shared_bytes > kDefaultSharedBytes)
    KT_CUDA_CHECK(cudaFuncSetAttribute(attention_backward_query_kernel,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(q.shared_bytes)));
  attention_backward_query_kernel<<<static_cast<unsigned>(q.grid), q.block, q.shared_bytes,
                                    ctx.stream()>>>(dinp, dpreatt, datt, dout, inp, att, T, C, NH,
                                                    scale);
  KT_CUDA_CHECK_LAUNCH();
  const LaunchShape k = attention_key_shape(B, NH, T, hs);
  check_shape(k, "attention_backward");
  attention_backward_key_kernel<<<static_cast<unsigned>(k.grid), k.block, 0, ctx.stream()>>>(
      dinp, dpreatt, dout, inp, att, T, C, NH, scale);
  KT_CUDA_CHECK_LAUNCH();
}

}  // namespace kt::kernels::cuda

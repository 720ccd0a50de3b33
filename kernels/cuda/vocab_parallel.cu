// The vocabulary-parallel cross-entropy (kernels/cuda/ops.h): one block per row, block reductions
// in float, the formulas of kernels/reference.h's softmax_cross_entropy split at the all-reduces.
#include <cuda_runtime.h>

#include <cfloat>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch_shape.h"
#include "kernels/cuda/ops.h"

namespace kt::kernels::cuda {
namespace {

__global__ void ce_max_kernel(float* row_max, const __nv_bfloat16* logits, int64_t valid,
                              int64_t Vl) {
  const int64_t row = blockIdx.x;
  const __nv_bfloat16* x = logits + row * Vl;
  float m = -FLT_MAX;
  for (int64_t v = threadIdx.x; v < valid; v += blockDim.x) m = fmaxf(m, ld(x[v]));
  m = block_max(m);
  if (threadIdx.x == 0) row_max[row] = m;
}

__global__ void ce_sums_kernel(float* sums, const __nv_bfloat16* logits, const float* row_max,
                               const int32_t* targets, int64_t BT, int64_t lo, int64_t valid,
                               int64_t Vl) {
  const int64_t row = blockIdx.x;
  const __nv_bfloat16* x = logits + row * Vl;
  const float m = row_max[row];
  float sum = 0.0f;
  for (int64_t v = threadIdx.x; v < valid; v += blockDim.x) sum += expf(ld(x[v]) - m);
  sum = block_sum(sum);
  if (threadIdx.x == 0) {
    const int64_t t = static_cast<int64_t>(targets[row]) - lo;
    sums[row] = sum;
    sums[BT + row] = t >= 0 && t < valid ? ld(x[t]) : 0.0f;
  }
}

__global__ void ce_finish_kernel(float* losses, __nv_bfloat16* dlogits,
                                 const __nv_bfloat16* logits, const float* row_max,
                                 const float* sums, const int32_t* targets, int64_t BT, int64_t lo,
                                 int64_t valid, int64_t Vl, float dloss) {
  const int64_t row = blockIdx.x;
  const float m = row_max[row], sum = sums[row];
  if (threadIdx.x == 0) losses[row] = logf(sum) - (sums[BT + row] - m);
  if (!dlogits) return;
  const __nv_bfloat16* x = logits + row * Vl;
  __nv_bfloat16* d = dlogits + row * Vl;
  const int64_t t = static_cast<int64_t>(targets[row]) - lo;
  const float inv_sum = 1.0f / sum;
  for (int64_t v = threadIdx.x; v < Vl; v += blockDim.x) {
    if (v < valid) {
      const float p = expf(ld(x[v]) - m) * inv_sum;  // read, then written by this thread only
      st(&d[v], (p - (v == t ? 1.0f : 0.0f)) * dloss);
    } else {
      st(&d[v], 0.0f);
    }
  }
}

LaunchShape checked_rows(int64_t BT, int64_t Vl, const char* what) {
  const LaunchShape s = row_shape(BT, Vl);
  KT_CHECK(launchable(s), std::string(what) + ": unlaunchable shape");
  return s;
}

}  // namespace

void vocab_parallel_ce_max(const Context& ctx, float* row_max, const bf16* logits, int64_t BT,
                           int64_t valid, int64_t Vl) {
  if (BT <= 0) return;
  const LaunchShape s = checked_rows(BT, Vl, "vocab_parallel_ce_max");
  ce_max_kernel<<<static_cast<unsigned>(s.grid), s.block, 0, ctx.stream()>>>(
      row_max, native(logits), valid, Vl);
  KT_CUDA_CHECK_LAUNCH();
}

void vocab_parallel_ce_sums(const Context& ctx, float* sums, const bf16* logits,
                            const float* row_max, const int32_t* targets, int64_t BT,
                            int64_t vocab_lo, int64_t valid, int64_t Vl) {
  if (BT <= 0) return;
  const LaunchShape s = checked_rows(BT, Vl, "vocab_parallel_ce_sums");
  ce_sums_kernel<<<static_cast<unsigned>(s.grid), s.block, 0, ctx.stream()>>>(
      sums, native(logits), row_max, targets, BT, vocab_lo, valid, Vl);
  KT_CUDA_CHECK_LAUNCH();
}

void vocab_parallel_ce_finish(const Context& ctx, float* losses, bf16* dlogits, const bf16* logits,
                              const float* row_max, const float* sums, const int32_t* targets,
                              int64_t BT, int64_t vocab_lo, int64_t valid, int64_t Vl,
                              float dloss) {
  if (BT <= 0) return;
  const LaunchShape s = checked_rows(BT, Vl, "vocab_parallel_ce_finish");
  ce_finish_kernel<<<static_cast<unsigned>(s.grid), s.block, 0, ctx.stream()>>>(
      losses, native(dlogits), native(logits), row_max, sums, targets, BT, vocab_lo, valid, Vl,
      dloss);
  KT_CUDA_CHECK_LAUNCH();
}

}  // namespace kt::kernels::cuda

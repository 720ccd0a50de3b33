// Device-side helpers shared by the .cu files of kernels/cuda: block reductions and bf16 access.
#pragma once

#include <cuda_bf16.h>

#include <cfloat>

#include "kernels/cuda/check.h"
#include "kernels/cuda/launch_shape.h"
#include "kernels/cuda/ops.h"

namespace kt::kernels::cuda {

__host__ __device__ inline __nv_bfloat16* native(bf16* p) {
  return reinterpret_cast<__nv_bfloat16*>(p);
}
__host__ __device__ inline const __nv_bfloat16* native(const bf16* p) {
  return reinterpret_cast<const __nv_bfloat16*>(p);
}

// Loads as float and stores from float for either storage type (fp32 or bf16, round to nearest).
__device__ inline float ld(float x) {
  return x;
}
__device__ inline float ld(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ inline void st(float* p, float v) {
  *p = v;
}
__device__ inline void st(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16_rn(v);
}

template <class Real>
__device__ inline Real warp_sum(Real x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}
__device__ inline float warp_max(float x) {
  for (int offset = 16; offset > 0; offset /= 2)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// Sum (or max) of one value per thread over the block, returned to every thread. blockDim.x must
// be a multiple of 32 (launch_shape.h guarantees it). Uses 32 values of shared memory and two
// barriers, so consecutive calls are safe.
template <class Real>
__device__ inline Real block_sum(Real x) {
  __shared__ Real partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  x = warp_sum(x);
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = x;
  __syncthreads();
  x = lane < warps ? partial[lane] : Real(0);
  return warp_sum(x);
}
__device__ inline float block_max(float x) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  x = warp_max(x);
  __syncthreads();
  if (lane == 0) partial[warp] = x;
  __syncthreads();
  x = lane < warps ? partial[lane] : -FLT_MAX;
  return warp_max(x);
}

// Deterministic two-stage column sums (launch_shape.h column_reduction): out_k[c] += Σ_r term_k(r,
// c) for k < kTerms, where term(r, c, acc) adds its kTerms values into acc.
template <int kTerms, class Term>
__global__ void column_partial_kernel(float* partial, Term term, int64_t rows, int64_t cols,
                                      int64_t rows_per_chunk) {
  __shared__ float tile[kTerms][kColumnRowsPerBlock][kColumnTile];
  const int64_t c = blockIdx.x * static_cast<int64_t>(kColumnTile) + threadIdx.x;
  const int64_t r0 = blockIdx.y * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  float acc[kTerms] = {};
  if (c < cols)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColumnRowsPerBlock) term(r, c, acc);
  for (int k = 0; k < kTerms; ++k) tile[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  for (int k = 0; k < kTerms; ++k) {
    float sum = 0.0f;
    for (int y = 0; y < kColumnRowsPerBlock; ++y) sum += tile[k][y][threadIdx.x];
    partial[(k * static_cast<int64_t>(gridDim.y) + blockIdx.y) * cols + c] = sum;
  }
}

template <int kTerms>
__global__ void column_finish_kernel(float* out0, float* out1, const float* partial, int64_t chunks,
                                     int64_t cols) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  for (int k = 0; k < kTerms; ++k) {
    float sum = 0.0f;
    for (int64_t chunk = 0; chunk < chunks; ++chunk)
      sum += partial[(k * chunks + chunk) * cols + c];
    float* out = k == 0 ? out0 : out1;
    out[c] += sum;
  }
}

template <int kTerms, class Term>
void column_reduce(const Context& ctx, float* out0, float* out1, Term term, int64_t rows,
                   int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  const ColumnReduction plan = column_reduction(
      rows, cols, static_cast<int64_t>(ctx.scratch_bytes() / sizeof(float)), kTerms);
  KT_CHECK(plan.chunks * cols * kTerms * static_cast<int64_t>(sizeof(float)) <=
               static_cast<int64_t>(ctx.scratch_bytes()),
           "column reduction: " + std::to_string(cols) + " columns do not fit the scratch");
  const dim3 grid(static_cast<unsigned>((cols + kColumnTile - 1) / kColumnTile),
                  static_cast<unsigned>(plan.chunks));
  const dim3 block(kColumnTile, kColumnRowsPerBlock);
  column_partial_kernel<kTerms>
      <<<grid, block, 0, ctx.stream()>>>(ctx.scratch(), term, rows, cols, plan.rows_per_chunk);
  KT_CUDA_CHECK_LAUNCH();
  const LaunchShape s = column_shape(cols);
  column_finish_kernel<kTerms><<<static_cast<unsigned>(s.grid), s.block, 0, ctx.stream()>>>(
      out0, out1, ctx.scratch(), plan.chunks, cols);
  KT_CUDA_CHECK_LAUNCH();
}

}  // namespace kt::kernels::cuda

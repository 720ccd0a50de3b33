// Device-side helpers shared by the .cu files of kernels/cuda: block reductions and bf16 access.
#pragma once

#include <cuda_bf16.h>

#include <cfloat>

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

}  // namespace kt::kernels::cuda

// Element-wise math written once for the CPU kernels and the CUDA kernels: plain
// inline functions of scalars, `__host__ __device__` when nvcc compiles them. The CPU tests of
// kernels/cpu therefore cover the very arithmetic the GPU runs; kernels/reference.h stays the
// independent float64 specification both are checked against.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define KT_HOST_DEVICE __host__ __device__
#else
#define KT_HOST_DEVICE
#endif

namespace kt::kernels::math {

// GELU, tanh approximation (Hendrycks & Gimpel 2016), as GPT-2: gelu(x) = ½x(1 + tanh(u)),
// u = √(2/π)(x + 0.044715x³). The caller supplies th = tanh(gelu_tanh_argument(x)) so that each
// backend uses its own tanh (a vectorisable one on the CPU, tanhf on the GPU).
constexpr float kGeluScale = 0.7978845608028654f;  // √(2/π)

KT_HOST_DEVICE inline float gelu_tanh_argument(float x) {
  return kGeluScale * (x + 0.044715f * x * x * x);
}
KT_HOST_DEVICE inline float gelu_from_tanh(float x, float th) {
  return 0.5f * x * (1.0f + th);
}
// d gelu / dx
KT_HOST_DEVICE inline float gelu_grad_from_tanh(float x, float th) {
  const float sech2 = 1.0f - th * th;
  return 0.5f * (1.0f + th) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
}

// One AdamW element (Loshchilov & Hutter 2019, decoupled weight decay) with bias correction;
// bc1 = 1 − β1^t and bc2 = 1 − β2^t are computed once per update by the caller. Updates m and v
// in place and returns the new parameter.
struct AdamWConstants {
  float learning_rate, beta1, beta2, eps, weight_decay, grad_scale, bc1, bc2;
};
KT_HOST_DEVICE inline float adamw_element(float param, float grad, float& m, float& v,
                                          const AdamWConstants& k) {
  const float g = grad * k.grad_scale;
  const float mi = k.beta1 * m + (1.0f - k.beta1) * g;
  const float vi = k.beta2 * v + (1.0f - k.beta2) * g * g;
  m = mi;
  v = vi;
  return param -
         k.learning_rate * ((mi / k.bc1) / (sqrtf(vi / k.bc2) + k.eps) + k.weight_decay * param);
}

}  // namespace kt::kernels::math

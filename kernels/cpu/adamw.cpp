// AdamW (Loshchilov & Hutter 2019, decoupled weight decay) with bias correction, memory-bound:
// 28 bytes per parameter (read p, g, m, v; write p, m, v).
#include <cmath>

#include "kernels/cpu/simd.h"
#include "kernels/ops.h"

namespace kt::kernels::cpu {

KT_SIMD_CLONES void adamw_update(float* params, const float* grads, float* m, float* v, int64_t N,
                                 const AdamWStep& s) {
  const float bc1 = 1.0f - std::pow(s.beta1, static_cast<float>(s.t));
  const float bc2 = 1.0f - std::pow(s.beta2, static_cast<float>(s.t));
  const float b1 = s.beta1, b2 = s.beta2, lr = s.learning_rate, wd = s.weight_decay;
  const float eps = s.eps, scale = s.grad_scale;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const float g = grads[i] * scale;
    const float mi = b1 * m[i] + (1 - b1) * g;
    const float vi = b2 * v[i] + (1 - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    params[i] -= lr * ((mi / bc1) / (std::sqrt(vi / bc2) + eps) + wd * params[i]);
  }
}

}  // namespace kt::kernels::cpu

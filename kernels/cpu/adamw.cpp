// AdamW (Loshchilov & Hutter 2019, decoupled weight decay) with bias correction, memory-bound:
// 28 bytes per parameter (read p, g, m, v; write p, m, v).
#include <cmath>

#include "kernels/cpu/simd.h"
#include "kernels/math.h"
#include "kernels/ops.h"

namespace kt::kernels::cpu {

KT_SIMD_CLONES void adamw_update(float* params, const float* grads, float* m, float* v, int64_t N,
                                 const AdamWStep& s) {
  const math::AdamWConstants k{s.learning_rate,
                               s.beta1,
                               s.beta2,
                               s.eps,
                               s.weight_decay,
                               s.grad_scale,
                               1.0f - std::pow(s.beta1, static_cast<float>(s.t)),
                               1.0f - std::pow(s.beta2, static_cast<float>(s.t))};
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < N; ++i)
    params[i] = math::adamw_element(params[i], grads[i], m[i], v[i], k);
}

}  // namespace kt::kernels::cpu

// AdamW (Loshchilov & Hutter 2019, decoupled weight decay) with bias correction, memory-bound:
// 28 bytes per parameter (read p, g, m, v; write p, m, v).
#include <cmath>

#include "kernels/bf16.h"
#include "kernels/cpu/simd.h"
#include "kernels/math.h"
#include "kernels/ops.h"

namespace kt::kernels::cpu {

namespace {

math::AdamWConstants constants(const AdamWStep& s) {
  return {s.learning_rate, s.beta1,        s.beta2, s.eps, s.weight_decay, s.grad_scale,
          1.0f - std::pow(s.beta1, static_cast<float>(s.t)),
          1.0f - std::pow(s.beta2, static_cast<float>(s.t))};
}

}  // namespace

KT_SIMD_CLONES void adamw_update(float* params, const float* grads, float* m, float* v, int64_t N,
                                 const AdamWStep& s) {
  const math::AdamWConstants k = constants(s);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < N; ++i)
    params[i] = math::adamw_element(params[i], grads[i], m[i], v[i], k);
}

namespace {

// One loop per input/output combination, so that each vectorises without branches inside.
template <bool kBf16Grads, bool kBf16Out>
KT_SIMD_CLONES void adamw_mixed_loop(float* master, const float* grads, const uint16_t* grads_bf16,
                                     float* m, float* v, uint16_t* params_bf16, int64_t N,
                                     const AdamWStep& s) {
  const math::AdamWConstants k = constants(s);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    float g;
    if constexpr (kBf16Grads)
      g = bf16_to_float(grads_bf16[i]);
    else
      g = grads[i];
    const float p = math::adamw_element(master[i], g, m[i], v[i], k);
    master[i] = p;
    if constexpr (kBf16Out) params_bf16[i] = float_to_bf16(p);
  }
}

}  // namespace

void adamw_update_mixed(float* master, const float* grads, const uint16_t* grads_bf16, float* m,
                        float* v, uint16_t* params_bf16, int64_t N, const AdamWStep& s) {
  if (grads_bf16 && params_bf16)
    adamw_mixed_loop<true, true>(master, grads, grads_bf16, m, v, params_bf16, N, s);
  else if (grads_bf16)
    adamw_mixed_loop<true, false>(master, grads, grads_bf16, m, v, params_bf16, N, s);
  else if (params_bf16)
    adamw_mixed_loop<false, true>(master, grads, grads_bf16, m, v, params_bf16, N, s);
  else
    adamw_mixed_loop<false, false>(master, grads, grads_bf16, m, v, params_bf16, N, s);
}

}  // namespace kt::kernels::cpu

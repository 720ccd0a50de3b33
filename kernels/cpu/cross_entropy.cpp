// Fused softmax + cross-entropy: one pass for the max, one for exp and the sum (the
// exponentials are kept in dlogits), one to normalise into the gradient.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/simd.h"
#include "kernels/ops.h"

namespace kt::kernels::cpu {

KT_SIMD_CLONES void softmax_cross_entropy(float* losses, float* dlogits, const float* logits,
                                          const int32_t* targets, int64_t BT, int64_t V, int64_t Vp,
                                          float dloss) {
#pragma omp parallel for
  for (int64_t i = 0; i < BT; ++i) {
    const float* x = logits + i * Vp;
    float maxval = -INFINITY;
#pragma omp simd reduction(max : maxval)
    for (int64_t v = 0; v < V; ++v) maxval = std::max(maxval, x[v]);
    const int32_t target = targets[i];
    float sum = 0;
    if (dlogits) {
      float* d = dlogits + i * Vp;
      const float target_logit = x[target];  // read before d overwrites it when aliased
#pragma omp simd reduction(+ : sum)
      for (int64_t v = 0; v < V; ++v) {
        d[v] = fast_exp(x[v] - maxval);
        sum += d[v];
      }
      losses[i] = std::log(sum) - (target_logit - maxval);
      const float norm = dloss / sum;
#pragma omp simd
      for (int64_t v = 0; v < V; ++v) d[v] *= norm;
      d[target] -= dloss;
#pragma omp simd
      for (int64_t v = V; v < Vp; ++v) d[v] = 0;
    } else {
#pragma omp simd reduction(+ : sum)
      for (int64_t v = 0; v < V; ++v) sum += fast_exp(x[v] - maxval);
      losses[i] = std::log(sum) - (x[target] - maxval);
    }
  }
}

}  // namespace kt::kernels::cpu

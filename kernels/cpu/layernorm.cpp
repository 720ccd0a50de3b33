#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/simd.h"
#include "kernels/ops.h"

namespace kt::kernels::cpu {

KT_SIMD_CLONES void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                      const float* weight, const float* bias, int64_t BT,
                                      int64_t C) {
  const float eps = 1e-5f;
#pragma omp parallel for
  for (int64_t i = 0; i < BT; ++i) {
    const float* x = inp + i * C;
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < C; ++c) sum += x[c];
    const float m = sum / C;
    float var = 0;
#pragma omp simd reduction(+ : var)
    for (int64_t c = 0; c < C; ++c) var += (x[c] - m) * (x[c] - m);
    const float s = 1.0f / std::sqrt(var / C + eps);
    float* y = out + i * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) y[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[i] = m;
    rstd[i] = s;
  }
}

KT_SIMD_CLONES void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                       const float* inp, const float* weight, const float* mean,
                                       const float* rstd, int64_t BT, int64_t C) {
  // dweight and dbias sum over rows: each thread accumulates its own copy, then they are added.
  const int threads = omp_get_max_threads();
  std::vector<float> partial(static_cast<size_t>(threads) * 2 * C, 0.0f);
#pragma omp parallel
  {
    float* my_dweight = partial.data() + static_cast<size_t>(omp_get_thread_num()) * 2 * C;
    float* my_dbias = my_dweight + C;
#pragma omp for
    for (int64_t i = 0; i < BT; ++i) {
      const float* x = inp + i * C;
      const float* dy = dout + i * C;
      const float m = mean[i], s = rstd[i];
      float dnorm_mean = 0, dnorm_norm_mean = 0;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
      for (int64_t c = 0; c < C; ++c) {
        const float dnorm = weight[c] * dy[c];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * (x[c] - m) * s;
      }
      dnorm_mean /= C;
      dnorm_norm_mean /= C;
      float* dx = dinp + i * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float norm = (x[c] - m) * s;
        my_dbias[c] += dy[c];
        my_dweight[c] += norm * dy[c];
        dx[c] += (weight[c] * dy[c] - dnorm_mean - norm * dnorm_norm_mean) * s;
      }
    }
  }
  for (int t = 0; t < threads; ++t) {
    const float* w = partial.data() + static_cast<size_t>(t) * 2 * C;
    for (int64_t c = 0; c < C; ++c) {
      dweight[c] += w[c];
      dbias[c] += w[C + c];
    }
  }
}

}  // namespace kt::kernels::cpu

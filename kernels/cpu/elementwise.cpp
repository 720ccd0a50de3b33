// GELU, residual, embedding, the sum of squares: memory-bound loops.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/simd.h"
#include "kernels/math.h"
#include "kernels/ops.h"

namespace kt::kernels::cpu {
KT_SIMD_CLONES void gelu_forward(float* out, const float* inp, int64_t N) {
#pragma omp parallel for simd
  for (int64_t i = 0; i < N; ++i) {
    const float x = inp[i];
    out[i] = math::gelu_from_tanh(x, fast_tanh(math::gelu_tanh_argument(x)));
  }
}

KT_SIMD_CLONES void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t N) {
#pragma omp parallel for simd
  for (int64_t i = 0; i < N; ++i) {
    const float x = inp[i];
    dinp[i] += math::gelu_grad_from_tanh(x, fast_tanh(math::gelu_tanh_argument(x))) * dout[i];
  }
}

KT_SIMD_CLONES void residual_forward(float* out, const float* a, const float* b, int64_t N) {
#pragma omp parallel for simd
  for (int64_t i = 0; i < N; ++i) out[i] = a[i] + b[i];
}

KT_SIMD_CLONES void residual_backward(float* da, float* db, const float* dout, int64_t N) {
#pragma omp parallel for simd
  for (int64_t i = 0; i < N; ++i) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

KT_SIMD_CLONES void embedding_forward(float* out, const int32_t* tokens, const float* wte,
                                      const float* wpe, int64_t B, int64_t T, int64_t C) {
#pragma omp parallel for
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const float* e = wte + static_cast<int64_t>(tokens[bt]) * C;
    const float* p = wpe + (bt % T) * C;
    float* o = out + bt * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
  }
}

KT_SIMD_CLONES void embedding_backward(float* dwte, float* dwpe, const float* dout,
                                       const int32_t* tokens, int64_t B, int64_t T, int64_t C) {
  // Rows of dwte repeat when a token repeats: parallel over channels keeps writes disjoint.
#pragma omp parallel for
  for (int64_t c0 = 0; c0 < C; c0 += 16) {
    const int64_t c1 = std::min(C, c0 + 16);
    for (int64_t bt = 0; bt < B * T; ++bt) {
      float* de = dwte + static_cast<int64_t>(tokens[bt]) * C;
      float* dp = dwpe + (bt % T) * C;
      const float* d = dout + bt * C;
      for (int64_t c = c0; c < c1; ++c) {
        de[c] += d[c];
        dp[c] += d[c];
      }
    }
  }
}

KT_SIMD_CLONES double sum_of_squares(const float* x, int64_t N) {
  double acc = 0;
#pragma omp parallel for simd reduction(+ : acc)
  for (int64_t i = 0; i < N; ++i) acc += static_cast<double>(x[i]) * x[i];
  return acc;
}

}  // namespace kt::kernels::cpu

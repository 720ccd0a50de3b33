// Causal self-attention, llm.c's layout: q, k, v interleaved per token in (B,T,3C); the
// pre-softmax and softmax matrices kept for the backward. Parallel over (batch, head): every
// write of one (b, h) pair lands in its own slice, so the backward needs no atomics.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/simd.h"
#include "kernels/ops.h"

namespace kt::kernels::cpu {

KT_SIMD_CLONES void attention_forward(float* out, float* preatt, float* att, const float* inp,
                                      int64_t B, int64_t T, int64_t C, int64_t NH) {
  const int64_t hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel for collapse(2)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const float* q = inp + (b * T + t) * C3 + h * hs;
        float* pre = preatt + ((b * NH + h) * T + t) * T;
        float* a = att + ((b * NH + h) * T + t) * T;
        float maxval = -INFINITY;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const float* k = inp + (b * T + t2) * C3 + C + h * hs;
          float dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int64_t i = 0; i < hs; ++i) dot += q[i] * k[i];
          pre[t2] = dot * scale;
          maxval = std::max(maxval, pre[t2]);
        }
        float sum = 0;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          a[t2] = fast_exp(pre[t2] - maxval);
          sum += a[t2];
        }
        const float inv = 1.0f / sum;
        for (int64_t t2 = 0; t2 <= t; ++t2) a[t2] *= inv;
        for (int64_t t2 = t + 1; t2 < T; ++t2) a[t2] = pre[t2] = 0;
        float* o = out + (b * T + t) * C + h * hs;
#pragma omp simd
        for (int64_t i = 0; i < hs; ++i) o[i] = 0;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const float* v = inp + (b * T + t2) * C3 + 2 * C + h * hs;
          const float w = a[t2];
#pragma omp simd
          for (int64_t i = 0; i < hs; ++i) o[i] += w * v[i];
        }
      }
}

KT_SIMD_CLONES void attention_backward(float* dinp, float* dpreatt, float* datt, const float* dout,
                                       const float* inp, const float* att, int64_t B, int64_t T,
                                       int64_t C, int64_t NH) {
  const int64_t hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel for collapse(2)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const float* a = att + ((b * NH + h) * T + t) * T;
        float* da = datt + ((b * NH + h) * T + t) * T;
        float* dpre = dpreatt + ((b * NH + h) * T + t) * T;
        const float* q = inp + (b * T + t) * C3 + h * hs;
        float* dq = dinp + (b * T + t) * C3 + h * hs;
        const float* d = dout + (b * T + t) * C + h * hs;
        // Through the weighted sum of values.
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const float* v = inp + (b * T + t2) * C3 + 2 * C + h * hs;
          float* dv = dinp + (b * T + t2) * C3 + 2 * C + h * hs;
          const float w = a[t2];
          float dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int64_t i = 0; i < hs; ++i) {
            dot += v[i] * d[i];
            dv[i] += w * d[i];
          }
          da[t2] += dot;
        }
        // Through the softmax: dpre_j = a_j (da_j − Σ_i a_i da_i), O(T) instead of O(T²).
        float weighted = 0;
        for (int64_t t2 = 0; t2 <= t; ++t2) weighted += a[t2] * da[t2];
        for (int64_t t2 = 0; t2 <= t; ++t2) dpre[t2] += a[t2] * (da[t2] - weighted);
        // Through q·k.
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const float* k = inp + (b * T + t2) * C3 + C + h * hs;
          float* dk = dinp + (b * T + t2) * C3 + C + h * hs;
          const float g = dpre[t2] * scale;
#pragma omp simd
          for (int64_t i = 0; i < hs; ++i) {
            dq[i] += k[i] * g;
            dk[i] += q[i] * g;
          }
        }
      }
}

}  // namespace kt::kernels::cpu

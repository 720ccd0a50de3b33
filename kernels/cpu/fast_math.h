// Branch-free exp and tanh for float that GCC vectorises inside `omp simd` loops (libm's expf
// and tanhf are scalar calls unless -ffast-math, which we do not want: it breaks inf/NaN).
// exp: Cody-Waite range reduction x = n·ln2 + r, |r| ≤ ln2/2, a degree-6 Taylor polynomial for
// e^r (truncation error < 2.5e-8 relative on that range), and 2^n built in the exponent bits.
// Relative error about 1e-7 over the float range; inputs below -87 give ~0, above 88 are clamped.
#pragma once

#include <bit>
#include <cstdint>

namespace kt::kernels::cpu {

#pragma omp declare simd notinbranch
inline float fast_exp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // n = round(x / ln2): adding and subtracting 1.5·2^23 rounds to nearest in float arithmetic.
  const float shifter = 12582912.0f;
  const float n = (x * 1.44269504088896341f + shifter) - shifter;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // ln2 = 0.693359375 - 2.1219e-4
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

// tanh(x) = 1 - 2 / (e^{2x} + 1); saturates cleanly at ±1 for large |x|.
#pragma omp declare simd notinbranch
inline float fast_tanh(float x) { return 1.0f - 2.0f / (fast_exp(2.0f * x) + 1.0f); }

}  // namespace kt::kernels::cpu

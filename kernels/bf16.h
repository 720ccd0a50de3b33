// bfloat16 as raw bits (uint16_t): the upper half of an IEEE float32. Conversions usable on the
// host and, compiled by nvcc, on the device. Round to nearest even (what cuda_bf16.h's
// __float2bfloat16 does); NaN stays a (quiet) NaN.
#pragma once

#include <cstdint>
#include <cstring>

#ifndef KT_HOST_DEVICE  // also defined by kernels/math.h
#if defined(__CUDACC__)
#define KT_HOST_DEVICE __host__ __device__
#else
#define KT_HOST_DEVICE
#endif
#endif

namespace kt::kernels {

KT_HOST_DEVICE inline float bf16_to_float(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

KT_HOST_DEVICE inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  // Branch-free, so that loops over it vectorise.
  const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(nan ? (bits >> 16) | 0x0040u : rounded);
}

}  // namespace kt::kernels

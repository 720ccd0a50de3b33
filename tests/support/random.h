// Seeded random inputs for the kernel and model tests: the caller owns the generator, so a
// failure reproduces from the seed it prints.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

namespace kt::test {

// A seed for a test on fresh random inputs: a new one each run, or KT_TEST_SEED's value to replay
// a failure (the tests print the seed they used when they fail).
inline uint32_t fresh_seed() {
  if (const char* fixed = std::getenv("KT_TEST_SEED"))
    return static_cast<uint32_t>(std::strtoul(fixed, nullptr, 10));
  return std::random_device{}();
}

// n draws from N(0, scale²).
inline std::vector<float> random_normal(std::mt19937& rng, size_t n, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> out(n);
  for (auto& x : out) x = dist(rng);
  return out;
}

// n token ids drawn uniformly from [0, vocab).
inline std::vector<int32_t> random_tokens(std::mt19937& rng, size_t n, int32_t vocab) {
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  std::vector<int32_t> out(n);
  for (auto& x : out) x = dist(rng);
  return out;
}

}  // namespace kt::test

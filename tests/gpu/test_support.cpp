// The GPU tests' and benchmarks' shared helpers (test_support.h).
#include "tests/gpu/test_support.h"

#include <cstdio>
#include <cstring>

#include "tests/support/random.h"

namespace kt::gpu_test {

int g_checks = 0, g_failures = 0;
unsigned g_seed = 0;
CudaDevice* g_device = nullptr;

void check(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok) {
    ++g_failures;
    std::printf("FAIL  %s (seed %u)\n", what.c_str(), g_seed);
  }
}

void expect_close(const F& got, const D& want, double tol, const std::string& what) {
  const double err = rel_error(got, want);
  const bool ok = err < tol;  // NaN fails
  if (ok) std::printf("ok    %-44s rel err %.2e (tol %.0e)\n", what.c_str(), err, tol);
  check(ok, what + ": rel err " + std::to_string(err) + " ≥ " + std::to_string(tol));
}

uint16_t to_bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16_bits(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
F round_bf16(const F& x) {
  F out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = from_bf16_bits(to_bf16_bits(x[i]));
  return out;
}

std::mt19937 g_rng;
F random(size_t n, float scale) {
  return test::random_normal(g_rng, n, scale);
}
std::vector<int32_t> random_tokens(size_t n, int32_t vocab) {
  return test::random_tokens(g_rng, n, vocab);
}
D widen(const F& x) {
  return D(x.begin(), x.end());
}

std::pair<std::vector<int32_t>, std::vector<int32_t>> random_batch(int64_t BT, int64_t V) {
  const auto sequence = random_tokens(BT + 1, static_cast<int32_t>(V));
  return {std::vector<int32_t>(sequence.begin(), sequence.end() - 1),
          std::vector<int32_t>(sequence.begin() + 1, sequence.end())};
}

AdamWStep clipped_adam_step(int64_t step, double norm) {
  AdamWStep adam;
  adam.learning_rate = 2e-3f;
  adam.t = static_cast<int>(step) + 1;
  adam.grad_scale = norm > 1.0 ? static_cast<float>(1.0 / norm) : 1.0f;
  return adam;
}

DpRun train_steps(
    CudaDevice& device, const GptConfig& c, int64_t B, int64_t T, const CudaGptOptions& options,
    float loss_scale, int64_t steps,
    const std::function<std::pair<std::vector<int32_t>, std::vector<int32_t>>(int64_t step)>&
        batch_of,
    worker::Communicator* tp_group, worker::Communicator* dp_group) {
  DpRun r;
  CudaGpt gpt(device, c, B, T, options);
  gpt.init_weights(g_seed);
  for (int64_t s = 0; s < steps; ++s) {
    const auto [tok, tgt] = batch_of(s);
    gpt.zero_grad();
    gpt.train_micro_step(tok.data(), tgt.data(), loss_scale, true);
    r.losses.push_back(gpt.mean_loss());
    double sharded = 0, replicated = 0;
    gpt.grad_sums_of_squares(&sharded, &replicated);
    if (dp_group && gpt.distributed_optimizer()) {
      double sums[2] = {sharded, replicated};
      worker::allreduce_doubles(*dp_group, sums, 2);
      sharded = sums[0];
      replicated = sums[1];
    }
    float sharded32 = static_cast<float>(sharded);
    if (tp_group) tp_group->allreduce(&sharded32, 1);
    const double norm = std::sqrt(static_cast<double>(sharded32) + replicated);
    if (s == 0) {
      r.grads1.resize(gpt.num_parameters());
      gpt.get_gradients(r.grads1.data());
    }
    gpt.update(clipped_adam_step(s, norm), 0.1f);
  }
  gpt.synchronize();  // the CPU optimizer's last copies counted, before get_parameters' own
  r.h2d = gpt.h2d_bytes();
  r.d2h = gpt.d2h_bytes();
  r.weights.resize(gpt.num_parameters());
  gpt.get_parameters(r.weights.data());
  return r;
}

}  // namespace kt::gpu_test

// Tensor parallelism in the model: t ranks (threads) holding slices compute the same loss and
// the same gradients (slice by slice) as one rank holding everything.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "tests/support/rel_error.h"
#include "thread_comm.h"
#include "worker/gpt.h"

namespace kt {
namespace {

using worker::Gpt;
using worker::GptConfig;
using worker::TensorView;

// Reads the slice `view` describes out of the logical tensor `full` (row-major).
std::vector<float> slice_of(const TensorView& full, const TensorView& view) {
  std::vector<float> out;
  const auto& S = view.shape;
  const auto& Lg = view.logical_shape;
  std::vector<int64_t> index(S.size(), 0);
  for (;;) {
    int64_t src = 0;
    for (size_t d = 0; d < S.size(); ++d) src = src * Lg[d] + view.offset[d] + index[d];
    out.push_back(full.data[src]);
    int d = static_cast<int>(S.size()) - 1;
    for (; d >= 0; --d) {
      if (++index[d] < S[d]) break;
      index[d] = 0;
    }
    if (d < 0) break;
  }
  return out;
}

void check_tensor_parallel(int t, int sub_batches = 1,
                           api::Recompute recompute = api::Recompute::kNone,
                           api::Precision precision = api::Precision::kFp32) {
  // 4 heads, ffn 32, vocab 70 padded to 128: divisible by 2 and 4.
  const GptConfig config{16, 70, 128, 2, 4, 16, 32};
  const int64_t B = 4, T = 6;
  std::mt19937 rng(t * 101);
  std::uniform_int_distribution<int32_t> tok(0, 69);
  std::vector<int32_t> x(B * T), y(B * T);
  for (auto& v : x) v = tok(rng);
  for (auto& v : y) v = tok(rng);

  Gpt whole(config, B, T, worker::Device::cpu(), {}, 1, api::Recompute::kNone, precision);
  whole.init_weights(5);
  whole.zero_grad();
  const float loss = whole.train_micro_step(x.data(), y.data(), 1.0f);
  const auto whole_params = whole.parameter_views();
  const auto whole_grads = whole.gradient_views();

  test::ThreadGroup group(t);
  std::vector<float> losses(t);
  std::vector<std::string> failures(t);
  std::vector<std::thread> threads;
  for (int r = 0; r < t; ++r) {
    threads.emplace_back([&, r] {
      auto comm = group.member(r);
      Gpt part(config, B, T, worker::Device::cpu(), {r, t, comm.get()}, sub_batches, recompute,
               precision);
      part.init_weights(5);
      part.zero_grad();
      losses[r] = part.train_micro_step(x.data(), y.data(), 1.0f);
      const auto params = part.parameter_views();
      const auto grads = part.gradient_views();
      for (int i = 0; i < worker::kNumParamTensors; ++i) {
        const bool sharded = part.sharded(i);
        const auto want_p = sharded ? slice_of(whole_params[i], params[i])
                                    : std::vector<float>(whole_params[i].data,
                                                         whole_params[i].data + params[i].numel());
        const std::vector<float> got_p(params[i].data, params[i].data + params[i].numel());
        if (got_p != want_p) failures[r] += std::string(" param ") + worker::kParams[i].name;
        const auto want_g = sharded ? slice_of(whole_grads[i], grads[i])
                                    : std::vector<float>(whole_grads[i].data,
                                                         whole_grads[i].data + grads[i].numel());
        const std::vector<float> got_g(grads[i].data, grads[i].data + grads[i].numel());
        const double err = test::rel_error(got_g, want_g);
        if (err > 1e-5)
          failures[r] +=
              std::string(" grad ") + worker::kParams[i].name + " (" + std::to_string(err) + ")";
      }
      const auto stats = comm->stats();
      // Per sub-batch: 4 per layer (6 with full recompute) + embedding + LM head, and the
      // cross-entropy's max and sums. None with one rank.
      const int64_t per_layer = recompute == api::Recompute::kFull ? 6 : 4;
      const int64_t expected = t == 1 ? 0 : sub_batches * (per_layer * config.layers + 2 + 2);
      if (stats.allreduces != expected)
        failures[r] += " allreduces=" + std::to_string(stats.allreduces);
    });
  }
  for (auto& th : threads) th.join();
  for (int r = 0; r < t; ++r) {
    EXPECT_NEAR(losses[r], loss, 1e-6 * std::fabs(loss)) << "rank " << r;
    EXPECT_EQ(failures[r], "") << "rank " << r;
  }
}

// bf16 matmuls: the column-parallel slices are the same dot products, the row-parallel partial
// sums are exact bf16 products summed in fp32 — reassociation only, as in fp32. (Before each
// thread ran oneDNN with its own scratchpad, TP ranks as threads corrupted each other's sums.)
TEST(TensorParallel, Bf16RanksEqualOneBf16Rank) {
  check_tensor_parallel(2, 1, api::Recompute::kNone, api::Precision::kBf16);
  check_tensor_parallel(4, 1, api::Recompute::kNone, api::Precision::kBf16);
  check_tensor_parallel(2, 2, api::Recompute::kCommAware, api::Precision::kBf16);
}
TEST(TensorParallel, TwoRanksEqualOne) {
  check_tensor_parallel(2);
}
TEST(TensorParallel, FourRanksEqualOne) {
  check_tensor_parallel(4);
}
// The Oases schedule: two half-batches, each all-reduce issued while the other half computes.
TEST(TensorParallel, OverlappedTwoSubBatchesEqualOne) {
  check_tensor_parallel(2, 2);
}
TEST(TensorParallel, OverlappedFourRanksEqualOne) {
  check_tensor_parallel(4, 2);
}
// Recomputation: full (re-running the layer's all-reduces) and commAware (keeping the summed
// projections, so the recompute needs no all-reduce), alone and with TP and the overlap.
TEST(TensorParallel, FullRecomputeEqualsStoredActivations) {
  check_tensor_parallel(1, 1, api::Recompute::kFull);
  check_tensor_parallel(2, 1, api::Recompute::kFull);
  check_tensor_parallel(2, 2, api::Recompute::kFull);
}
TEST(TensorParallel, CommAwareRecomputeEqualsStoredActivations) {
  check_tensor_parallel(1, 1, api::Recompute::kCommAware);
  check_tensor_parallel(2, 1, api::Recompute::kCommAware);
  check_tensor_parallel(4, 2, api::Recompute::kCommAware);
}

}  // namespace
}  // namespace kt

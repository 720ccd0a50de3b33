// Data and tensor parallelism through the whole training loop: TP=2, DP=2 and TP=2 × DP=2 runs
// (ranks as threads over in-process communicators) give the single-rank run's losses and
// parameters, step after step, with the same global batch and seed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <thread>
#include <vector>

#include "planner/planner.h"
#include "test_util.h"
#include "thread_comm.h"
#include "worker/gpt.h"
#include "worker/trainer.h"

namespace kt {
namespace {

api::Plan plan_for(const std::string& parallelism) {
  const auto job = test::job_from_yaml(
      "apiVersion: kubetrain.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: par}\nspec:\n"
      "  model: {preset: tiny}\n"
      "  training: {steps: 6, globalBatchSize: 8, microBatchSize: 2, learningRate: 0.003, "
      "warmupSteps: 2, seed: 3}\n"
      "  parallelism: {" +
      parallelism + "}\n");
  const auto four_cores = test::inventory_from_yaml(
      "kind: Inventory\nnodes:\n- name: box\n  cpu: {cores: 4}\n  memory: 16Gi\n");
  return planner::best_plan(job, four_cores);
}

struct RunResult {
  std::vector<double> losses;
  std::vector<std::vector<worker::TensorView>> params;  // per rank (views copied to storage)
  std::vector<std::vector<std::vector<float>>> values;
};

RunResult run(const api::Plan& plan, const std::string& checkpoint_dir = "", int stop_after = 0) {
  const int tp = static_cast<int>(plan.config.tp), dp = static_cast<int>(plan.config.dp);
  const int world = tp * dp;
  RunResult out;
  out.params.resize(world);
  out.values.resize(world);
  std::vector<std::unique_ptr<test::ThreadGroup>> tp_groups, dp_groups;
  for (int i = 0; i < dp; ++i) tp_groups.push_back(std::make_unique<test::ThreadGroup>(tp));
  for (int i = 0; i < tp; ++i) dp_groups.push_back(std::make_unique<test::ThreadGroup>(dp));
  test::ThreadGroup world_group(world);
  std::vector<worker::TrainResult> results(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      worker::ProcessGroups groups;
      groups.world = world_group.member(r, "world");
      groups.tp = tp_groups[r / tp]->member(r % tp, "tp");
      groups.dp = dp_groups[r % tp]->member(r / tp, "dp");
      worker::TrainOptions options;
      options.log_every = 0;
      options.groups = world > 1 ? &groups : nullptr;
      options.checkpoint_dir = checkpoint_dir;
      if (stop_after > 0 && r == world - 1)  // one rank "gets SIGTERM"
        options.on_step = [stop_after](const worker::StepReport& report) {
          if (report.step == stop_after) worker::request_stop();
        };
      options.on_finish = [&, r](const std::vector<worker::TensorView>& params) {
        out.params[r] = params;
        for (const auto& v : params) out.values[r].emplace_back(v.data, v.data + v.numel());
      };
      results[r] = worker::train(plan, options, [](const std::string&) {});
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 1; r < world; ++r) EXPECT_EQ(results[r].losses, results[0].losses) << "rank " << r;
  out.losses = results[0].losses;
  return out;
}

// The value of the logical tensor at the slice position of element j of `view`.
float logical_at(const std::vector<float>& full, const worker::TensorView& view, int64_t j) {
  const auto& S = view.shape;
  int64_t src = 0, rest = j;
  std::vector<int64_t> index(S.size());
  for (int d = static_cast<int>(S.size()) - 1; d >= 0; --d) {
    index[d] = rest % S[d];
    rest /= S[d];
  }
  for (size_t d = 0; d < S.size(); ++d)
    src = src * view.logical_shape[d] + view.offset[d] + index[d];
  return full[src];
}

void expect_same_training(const std::string& parallelism) {
  SCOPED_TRACE(parallelism);
  const RunResult single = run(plan_for("tensorParallel: 1, dataParallel: 1, overlap: off"));
  const api::Plan plan = plan_for(parallelism);
  const RunResult parallel = run(plan);
  ASSERT_EQ(parallel.losses.size(), single.losses.size());
  for (size_t i = 0; i < single.losses.size(); ++i)
    EXPECT_NEAR(parallel.losses[i], single.losses[i], 2e-5 * std::fabs(single.losses[i]))
        << "step " << i + 1;
  // Every rank's parameters equal the single run's (its slice of them, under TP).
  for (size_t r = 0; r < parallel.params.size(); ++r) {
    for (size_t i = 0; i < parallel.params[r].size(); ++i) {
      const auto& view = parallel.params[r][i];
      double num = 0, den = 0, max_abs = 0;
      for (int64_t j = 0; j < view.numel(); ++j) {
        const float want = view.logical_shape.empty() ? single.values[0][i][j]
                                                      : logical_at(single.values[0][i], view, j);
        const double diff = double(parallel.values[r][i][j]) - want;
        num += diff * diff;
        den += std::pow(double(want), 2);
        max_abs = std::max(max_abs, std::fabs(diff));
      }
      // Relative to the tensor, or absolutely tiny: the key bias has an exactly zero gradient
      // (softmax ignores a constant added to every key), so AdamW turns rounding noise of
      // ~1e-9 into steps of ±lr there, and its values are pure noise of size ~lr·steps in both
      // runs. Every other tensor meets 1e-5 relative.
      EXPECT_TRUE(std::sqrt(num / std::max(den, 1e-30)) < 1e-5 || max_abs < 2e-5)
          << "rank " << r << " " << view.name << ": relative "
          << std::sqrt(num / std::max(den, 1e-30)) << ", max abs " << max_abs;
    }
  }
}

TEST(ParallelTraining, ShardedCheckpointResumesTwoByTwoExactly) {
  const api::Plan plan = plan_for("tensorParallel: 2, dataParallel: 2, overlap: on");
  const RunResult straight = run(plan);
  const std::string dir = ::testing::TempDir() + "kt-sharded-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const RunResult first = run(plan, dir, 3);
  ASSERT_EQ(first.losses.size(), 3u);
  EXPECT_TRUE(std::filesystem::exists(dir + "/step-00000003/rank-00000.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/step-00000003/rank-00001.safetensors"));
  const RunResult second = run(plan, dir);
  ASSERT_EQ(first.losses.size() + second.losses.size(), straight.losses.size());
  for (size_t i = 0; i < straight.losses.size(); ++i) {
    const double got = i < 3 ? first.losses[i] : second.losses[i - 3];
    EXPECT_EQ(got, straight.losses[i]) << "step " << i + 1;
  }
  std::filesystem::remove_all(dir);
}

TEST(ParallelTraining, TensorParallelTwoEqualsOneRank) {
  expect_same_training("tensorParallel: 2, dataParallel: 1, overlap: off");
}
TEST(ParallelTraining, DataParallelTwoEqualsOneRank) {
  expect_same_training("tensorParallel: 1, dataParallel: 2, overlap: off");
}
TEST(ParallelTraining, TwoByTwoEqualsOneRank) {
  expect_same_training("tensorParallel: 2, dataParallel: 2, overlap: off");
}
// The Oases schedule (2 sub-batches, all-reduces issued asynchronously) against one rank.
TEST(ParallelTraining, OverlappedTensorParallelEqualsOneRank) {
  expect_same_training("tensorParallel: 2, dataParallel: 1, overlap: on");
}
TEST(ParallelTraining, RecomputeModesEqualOneRank) {
  expect_same_training("tensorParallel: 2, dataParallel: 1, overlap: off, recompute: full");
  expect_same_training("tensorParallel: 2, dataParallel: 1, overlap: on, recompute: commAware");
  expect_same_training("tensorParallel: 1, dataParallel: 2, overlap: off, recompute: full");
}
TEST(ParallelTraining, OverlappedTwoByTwoEqualsOneRank) {
  expect_same_training("tensorParallel: 2, dataParallel: 2, overlap: on");
}

}  // namespace
}  // namespace kt

// Data and tensor parallelism and the offload engine through the whole training loop: TP=2,
// DP=2 and TP=2 × DP=2 runs (ranks as threads over in-process communicators), and optimizer and
// window offload, give the single-rank, all-on-device run's losses and parameters, step after
// step, with the same global batch and seed; the offload engine moves exactly the bytes the
// planner predicts.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <thread>
#include <vector>

#include "planner/planner.h"
#include "test_util.h"
#include "thread_comm.h"
#include "worker/gpt.h"
#include "worker/offload.h"
#include "worker/pipeline_order.h"
#include "worker/trainer.h"

namespace kt {
namespace {

constexpr const char* kTiny = "preset: tiny";
// Four layers, so that a window of 1 or 2 slots streams several layers.
constexpr const char* kFourLayers =
    "layers: 4, hidden: 64, heads: 4, ffnHidden: 256, vocab: 256, seqLen: 32";
// Eight, so that each of two (or four) pipeline stages streams several.
constexpr const char* kEightLayers =
    "layers: 8, hidden: 64, heads: 4, ffnHidden: 256, vocab: 256, seqLen: 32";

api::Plan plan_for(const std::string& parallelism, const std::string& model = kTiny,
                   const std::string& precision = "fp32", int steps = 6, int cores = 4) {
  const auto job = test::job_from_yaml(
      "apiVersion: kubetrain.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: par}\nspec:\n"
      "  model: {" + model + "}\n"
      "  training: {steps: " + std::to_string(steps) +
      ", globalBatchSize: 8, microBatchSize: 2, learningRate: 0.003, "
      "warmupSteps: 2, seed: 3, precision: " + precision + "}\n"
      "  parallelism: {" +
      parallelism + "}\n");
  const auto box = test::inventory_from_yaml(
      "kind: Inventory\nnodes:\n- name: box\n  cpu: {cores: " + std::to_string(cores) +
      "}\n  memory: 16Gi\n");
  return planner::best_plan(job, box);
}

struct RunResult {
  std::vector<double> losses;
  std::vector<std::vector<worker::TensorView>> params;  // per rank (views copied to storage)
  std::vector<std::vector<std::vector<float>>> values;
  std::vector<int64_t> transfer_bytes;  // rank 0's offload copies per step, both directions
  std::vector<int64_t> dp_allreduces;   // rank 0's DP all-reduces so far, after each step
  std::vector<int64_t> dp_collectives;  // ... and DP collectives of every kind
};

RunResult run(const api::Plan& plan, const std::string& checkpoint_dir = "", int stop_after = 0) {
  const int tp = static_cast<int>(plan.config.tp), dp = static_cast<int>(plan.config.dp);
  const int pp = static_cast<int>(plan.config.pp);
  const int per_stage = tp * dp, world = per_stage * pp;
  RunResult out;
  out.params.resize(world);
  out.values.resize(world);
  // worker/comm.h's layout (worker::rank_places): a thread group per key.
  const int cut_tp = static_cast<int>(plan.config.cut_tp);
  const int cut_stage = static_cast<int>(api::cut_stage(plan.config, plan.model.layers));
  auto places_of = [&](int r) {
    const auto p = worker::rank_places(r, world, tp, dp, pp, cut_tp, cut_stage);
    return std::vector<worker::GroupPlace>{p.world,     p.tp,  p.dp,  p.pp,
                                           p.embedding, p.tp2, p.dp2, p.cut};
  };
  std::map<std::string, std::unique_ptr<test::ThreadGroup>> thread_groups;
  for (int r = 0; r < world; ++r)
    for (const worker::GroupPlace& place : places_of(r))
      if (place.size > 0 && !thread_groups.count(place.key))
        thread_groups[place.key] = std::make_unique<test::ThreadGroup>(place.size);
  std::vector<worker::TrainResult> results(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      worker::ProcessGroups groups;
      std::unique_ptr<worker::Communicator>* slots[] = {
          &groups.world,     &groups.tp,  &groups.dp,  &groups.pp,
          &groups.embedding, &groups.tp2, &groups.dp2, &groups.cut};
      const auto places = places_of(r);
      for (size_t i = 0; i < places.size(); ++i)
        if (places[i].size > 0)
          *slots[i] = thread_groups.at(places[i].key)->member(places[i].rank, places[i].name);
      worker::TrainOptions options;
      options.log_every = 0;
      options.groups = world > 1 ? &groups : nullptr;
      options.checkpoint_dir = checkpoint_dir;
      options.poison_evicted = true;  // a read before the parameters landed shows as NaN
      options.on_step = [&, r, stop_after](const worker::StepReport& report) {
        if (r == 0) out.transfer_bytes.push_back(report.h2d_bytes + report.d2h_bytes);
        if (r == 0 && report.comm.count("dp")) {
          out.dp_allreduces.push_back(report.comm.at("dp").allreduces);
          out.dp_collectives.push_back(report.comm.at("dp").collectives);
        }
        // one rank "gets SIGTERM"
        if (stop_after > 0 && r == world - 1 && report.step == stop_after) worker::request_stop();
      };
      options.on_finish = [&, r](const std::vector<worker::TensorView>& params) {
        out.params[r] = params;
        for (const auto& v : params) out.values[r].emplace_back(v.data, v.data + v.numel());
      };
      try {
        results[r] = worker::train(plan, options, [](const std::string&) {});
      } catch (const std::exception& e) {  // e.g. a NaN loss from a parameter read too early
        ADD_FAILURE() << "rank " << r << ": " << e.what();
        std::fflush(nullptr);
        std::_Exit(1);  // the other ranks would wait for this one forever
      }
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

// The tolerances that separate two layouts of one run: fp32 reassociation. In bf16 a master
// weight or activation that moved by one fp32 ulp can round to the neighbouring bf16 value (2⁻⁸
// relative), and AdamW's m/√v turns the small gradient differences that follow into steps of up
// to ±lr where a gradient is near zero: the losses still agree to ~1e-5 over the 6 steps
// (measured: ≤ 1.3e-5), the parameters only to a few 1e-3 (≤ 4.5e-3 relative, ≤ 3e-3 ≈ lr
// absolute). A stale or misplaced bf16 weight moves the loss by far more than 5e-5.
struct Tolerance {
  double loss = 2e-5, params = 1e-5, params_abs = 2e-5;
};
Tolerance tolerance_for(const api::Plan& plan) {
  if (plan.precision == api::Precision::kBf16) return {5e-5, 1e-2, 5e-3};
  return {};
}

RunResult expect_same_training(const api::Plan& plan, const std::string& model = kTiny) {
  const RunResult single = run(plan_for("tensorParallel: 1, dataParallel: 1, overlap: off", model,
                                        std::string(api::to_string(plan.precision))));
  const RunResult parallel = run(plan);
  const Tolerance tol = tolerance_for(plan);
  EXPECT_EQ(parallel.losses.size(), single.losses.size());
  if (parallel.losses.size() != single.losses.size()) return parallel;
  for (size_t i = 0; i < single.losses.size(); ++i)
    EXPECT_NEAR(parallel.losses[i], single.losses[i], tol.loss * std::fabs(single.losses[i]))
        << "step " << i + 1;
  // Every rank's parameters equal the single run's (its slice of them, under TP).
  for (size_t r = 0; r < parallel.params.size(); ++r) {
    for (size_t v = 0; v < parallel.params[r].size(); ++v) {
      const auto& view = parallel.params[r][v];
      size_t i = 0;  // the same tensor of the single run (a pipeline stage holds fewer)
      while (single.params[0][i].name != view.name) ++i;
      double num = 0, den = 0, max_abs = 0;
      for (int64_t j = 0; j < view.numel(); ++j) {
        const float want = view.logical_shape.empty() ? single.values[0][i][j]
                                                      : logical_at(single.values[0][i], view, j);
        const double diff = double(parallel.values[r][v][j]) - want;
        num += diff * diff;
        den += std::pow(double(want), 2);
        max_abs = std::max(max_abs, std::fabs(diff));
      }
      // Relative to the tensor, or absolutely tiny: the key bias has an exactly zero gradient
      // (softmax ignores a constant added to every key), so AdamW turns rounding noise of
      // ~1e-9 into steps of ±lr there, and its values are pure noise of size ~lr·steps in both
      // runs. Every other tensor meets 1e-5 relative.
      EXPECT_TRUE(std::sqrt(num / std::max(den, 1e-30)) < tol.params || max_abs < tol.params_abs)
          << "rank " << r << " " << view.name << ": relative "
          << std::sqrt(num / std::max(den, 1e-30)) << ", max abs " << max_abs;
    }
  }
  return parallel;
}

// The stage count a parallelism string asks for (1 without pipelineParallel).
int64_t stages_in(const std::string& parallelism) {
  const auto at = parallelism.find("pipelineParallel: ");
  return at == std::string::npos ? 1 : std::stoll(parallelism.substr(at + 18));
}

RunResult expect_same_training(const std::string& parallelism, const std::string& model = kTiny) {
  SCOPED_TRACE(parallelism);
  const api::Plan plan = plan_for(parallelism, model);
  EXPECT_EQ(plan.config.pp, stages_in(parallelism));
  return expect_same_training(plan, model);
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

// Resharding resume: a run stopped at step 3 under layout `from` resumes under layout `to` (its
// checkpoint's slices reassembled, the AdamW moments and the data cursor carried over) and then
// trains like an uninterrupted run under `to` — the same losses and parameters, within the
// reassociation that separates the layouts (as TP 2 vs TP 1 above).
void expect_resharded_resume(const api::Plan& before, const api::Plan& after) {
  const std::string dir = ::testing::TempDir() + "kt-reshard-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const RunResult first = run(before, dir, 3);
  ASSERT_EQ(first.losses.size(), 3u);
  const RunResult resumed = run(after, dir);
  const RunResult straight = run(after);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(first.losses.size() + resumed.losses.size(), straight.losses.size());
  for (size_t i = 0; i < straight.losses.size(); ++i) {
    const double got = i < 3 ? first.losses[i] : resumed.losses[i - 3];
    EXPECT_NEAR(got, straight.losses[i], 2e-5 * std::fabs(straight.losses[i])) << "step " << i + 1;
  }
  for (size_t r = 0; r < straight.values.size(); ++r)
    for (size_t i = 0; i < straight.values[r].size(); ++i) {
      double num = 0, den = 0, max_abs = 0;
      for (size_t j = 0; j < straight.values[r][i].size(); ++j) {
        const double diff = double(resumed.values[r][i][j]) - straight.values[r][i][j];
        num += diff * diff;
        den += std::pow(double(straight.values[r][i][j]), 2);
        max_abs = std::max(max_abs, std::fabs(diff));
      }
      // The key bias is noise of size lr·steps in every run (expect_same_training says why).
      EXPECT_TRUE(std::sqrt(num / std::max(den, 1e-30)) < 1e-5 || max_abs < 2e-5)
          << "rank " << r << " " << straight.params[r][i].name << ": relative "
          << std::sqrt(num / std::max(den, 1e-30)) << ", max abs " << max_abs;
    }
}

void expect_resharded_resume(const std::string& from, const std::string& to,
                             const std::string& model = kTiny) {
  SCOPED_TRACE(from + " -> " + to);
  const api::Plan before = plan_for(from, model), after = plan_for(to, model);
  EXPECT_EQ(before.config.pp, stages_in(from));
  EXPECT_EQ(after.config.pp, stages_in(to));
  expect_resharded_resume(before, after);
}

TEST(ParallelTraining, ResumesAtAnotherTensorParallelDegree) {
  expect_resharded_resume("tensorParallel: 2, dataParallel: 1, overlap: on",
                          "tensorParallel: 1, dataParallel: 1, overlap: off");
  expect_resharded_resume("tensorParallel: 1, dataParallel: 1, overlap: off",
                          "tensorParallel: 2, dataParallel: 1, overlap: off");
}
TEST(ParallelTraining, ResumesFromTensorToDataParallel) {
  expect_resharded_resume("tensorParallel: 2, dataParallel: 1, overlap: off",
                          "tensorParallel: 1, dataParallel: 2, overlap: off");
}
TEST(ParallelTraining, ResumesWithAnotherOffloadAndRecompute) {
  expect_resharded_resume(
      "tensorParallel: 1, dataParallel: 1, recompute: full, offload: window, offloadWindow: 1, "
      "gpuUpdateFraction: 0.05",
      "tensorParallel: 1, dataParallel: 1, recompute: none, offload: none", kFourLayers);
  expect_resharded_resume(
      "tensorParallel: 2, dataParallel: 1, recompute: commAware, overlap: on",
      "tensorParallel: 1, dataParallel: 1, recompute: none, offload: optimizer, "
      "gpuUpdateFraction: 0.5",
      kFourLayers);
}

TEST(ParallelTraining, TensorParallelTwoEqualsOneRank) {
  expect_same_training("tensorParallel: 2, dataParallel: 1, overlap: off");
}
TEST(ParallelTraining, DataParallelTwoEqualsOneRank) {
  expect_same_training("tensorParallel: 1, dataParallel: 2, overlap: off");
}
// The DP sum is bucketed by offload unit (the embeddings and final LayerNorm, each layer): a
// step all-reduces L + 1 packed buckets and the loss, not each of a layer's 12 tensors.
TEST(ParallelTraining, DataParallelSumsOneBucketPerUnit) {
  const api::Plan plan = plan_for("tensorParallel: 1, dataParallel: 2, overlap: off");
  const RunResult r = run(plan);
  ASSERT_GE(r.dp_allreduces.size(), 2u);
  for (size_t i = 1; i < r.dp_allreduces.size(); ++i)
    EXPECT_EQ(r.dp_allreduces[i] - r.dp_allreduces[i - 1], plan.model.layers + 2) << "step " << i;
}
// The distributed optimizer (ZeRO-1; docs/WORKER.md): each DP rank keeps and updates one shard of
// the moments; the gradients reduce-scattered, the parameters all-gathered — the same training as
// one rank, in fp32 and bf16, with TP too; a step makes one reduce-scatter and one all-gather per
// unit.
api::Plan with_distributed_optimizer(const std::string& parallelism,
                                     const std::string& precision = "fp32") {
  api::Plan plan = plan_for(parallelism, kTiny, precision);
  plan.config.distributed_optimizer = true;  // (the planner picks it only where memory asks)
  return plan;
}
// Pipeline stages (1F1B over the 4 micro-batches of a step; worker/trainer.cpp's
// PipelineSchedule): every layout gives the single rank's losses and parameters; each rank is
// checked on the layers its stage holds (and the first and the last on the tied embedding,
// whose gradient the two sum).
TEST(ParallelTraining, PipelineStagesEqualOneRank) {
  expect_same_training("tensorParallel: 1, dataParallel: 1, pipelineParallel: 2, overlap: off");
  expect_same_training("tensorParallel: 1, dataParallel: 1, pipelineParallel: 2, overlap: off",
                       kFourLayers);
  // Four stages of one layer each: two stages between the first and the last.
  expect_same_training("tensorParallel: 1, dataParallel: 1, pipelineParallel: 4, overlap: off",
                       kFourLayers);
  // Fewer micro-batches than stages (m 2 < p 4): no steady state, every stage all warm-up.
  api::Plan few = plan_for("tensorParallel: 1, dataParallel: 1, pipelineParallel: 4, overlap: off",
                           kFourLayers);
  few.config.micro_batch = 4;
  few.config.grad_accum = 2;
  expect_same_training(few, kFourLayers);
}
TEST(ParallelTraining, PipelineTensorAndDataParallelEqualOneRank) {
  const api::Plan plan =
      plan_for("tensorParallel: 2, dataParallel: 2, pipelineParallel: 2, overlap: on", kFourLayers,
               "fp32", 6, 8);
  ASSERT_EQ(plan.config.pp, 2);
  ASSERT_EQ(plan.world, 8);
  expect_same_training(plan, kFourLayers);
}
TEST(ParallelTraining, PipelineStagesWithRecomputeAndDistributedOptimizerEqualOneRank) {
  expect_same_training(
      "tensorParallel: 1, dataParallel: 1, pipelineParallel: 2, overlap: off, recompute: full",
      kFourLayers);
  api::Plan sharded = plan_for(
      "tensorParallel: 1, dataParallel: 2, pipelineParallel: 2, overlap: off, recompute: commAware",
      kFourLayers);
  sharded.config.distributed_optimizer = true;
  expect_same_training(sharded, kFourLayers);
  // Four stages: the two between leave the tied embedding alone, sharded or not.
  api::Plan four = plan_for("tensorParallel: 1, dataParallel: 2, pipelineParallel: 4, overlap: off",
                            kFourLayers, "fp32", 6, 8);
  ASSERT_EQ(four.config.pp, 4);
  four.config.distributed_optimizer = true;
  expect_same_training(four, kFourLayers);
}
// Virtual stages (the interleaved schedule, worker/pipeline_order.h): each stage holds chunks of
// layers that are not consecutive (stage s chunk c: virtual stage c·p + s), activations wrap
// from the last stage to the first's next chunk — the same training as one rank.
api::Plan with_virtual_stages(const std::string& parallelism, int64_t v,
                              const std::string& model = kFourLayers, int cores = 4) {
  api::Plan plan = plan_for(parallelism, model, "fp32", 6, cores);
  plan.config.virtual_stages = v;
  return plan;
}
TEST(ParallelTraining, VirtualStagesEqualOneRank) {
  {  // 2 stages × 2 chunks of one layer: rank 0 holds layers 0 and 2, rank 1 layers 1 and 3
    const api::Plan plan = with_virtual_stages(
        "tensorParallel: 1, dataParallel: 1, pipelineParallel: 2, overlap: off", 2);
    ASSERT_EQ(plan.config.grad_accum % 2, 0);
    expect_same_training(plan, kFourLayers);
  }
  {  // with TP, DP (and the overlap) in every chunk, and the distributed optimizer
    api::Plan plan = with_virtual_stages(
        "tensorParallel: 2, dataParallel: 2, pipelineParallel: 2, overlap: on", 2, kFourLayers, 8);
    ASSERT_EQ(plan.world, 8);
    plan.config.distributed_optimizer = true;
    expect_same_training(plan, kFourLayers);
  }
  {  // 2 stages × 2 chunks with recompute, 4 micro-batches of 2 groups
    api::Plan plan = with_virtual_stages(
        "tensorParallel: 1, dataParallel: 1, pipelineParallel: 2, overlap: off, recompute: full",
        2);
    expect_same_training(plan, kFourLayers);
  }
}
// Offload optimizer with virtual stages: a stage's units are its copy of the embeddings', then its
// chunks' layers chunk after chunk, the first gpuUnits on the device (api::chunk_device_units):
// with 2 chunks of one layer, gpuUnits 2 keeps the first chunk's layer on the device and the
// second's on the CPU; the plan's per-layer placement says so and survives its JSON.
TEST(ParallelTraining, VirtualStagesWithOffloadEqualOneRank) {
  {
    const api::Plan planned = plan_for(
        "tensorParallel: 1, dataParallel: 1, pipelineParallel: 2, virtualStages: 2, overlap: off, "
        "offload: optimizer, gpuUpdateFraction: 0.5",
        kFourLayers);
    ASSERT_EQ(planned.config.virtual_stages, 2);
    ASSERT_EQ(planned.config.offload, api::OffloadMode::kOptimizer);
    // Layers 0 and 1 are their stages' first chunk's, 2 and 3 their second's.
    EXPECT_EQ(planned.layers[0].update, planned.layers[1].update);
    EXPECT_EQ(planned.layers[2].update, planned.layers[3].update);
    const api::Plan read = api::decode_plan(api::to_json(planned));
    EXPECT_EQ(read.config.gpu_units, planned.config.gpu_units);
    const RunResult r = expect_same_training(planned, kFourLayers);
    ASSERT_FALSE(r.transfer_bytes.empty());
    EXPECT_GT(r.transfer_bytes.back(), 0);
  }
  for (int64_t gpu_units : {0, 1, 2}) {
    SCOPED_TRACE(gpu_units);
    api::Plan plan = with_virtual_stages(
        "tensorParallel: 1, dataParallel: 2, pipelineParallel: 2, overlap: off, offload: optimizer",
        2);
    plan.config.gpu_units = gpu_units;
    plan.config.distributed_optimizer = gpu_units == 1;
    expect_same_training(plan, kFourLayers);
  }
}
TEST(ParallelTraining, VirtualStageCheckpointsResumeAtAnyLayout) {
  const std::string pipelined =
      "tensorParallel: 1, dataParallel: 1, pipelineParallel: 2, overlap: off";
  expect_resharded_resume(
      with_virtual_stages(pipelined, 2),
      plan_for("tensorParallel: 2, dataParallel: 1, overlap: off", kFourLayers));
  expect_resharded_resume(plan_for(pipelined, kFourLayers), with_virtual_stages(pipelined, 2));
}
// Offload optimizer inside each stage: every stage keeps its first gpuUnits units (its copy of the
// embeddings' unit, then its layers) on the device and updates the rest on the CPU; the first and
// the last stage's embeddings, summed between them, go home and back too where they are
// CPU-updated; with the distributed optimizer each DP rank offloads its shard.
TEST(ParallelTraining, PipelineStagesWithOffloadEqualOneRank) {
  {  // half of each stage's units on the CPU, as the planner plans it
    const api::Plan planned = plan_for(
        "tensorParallel: 1, dataParallel: 1, pipelineParallel: 2, virtualStages: 1, overlap: off, "
        "offload: optimizer, gpuUpdateFraction: 0.5",
        kFourLayers);
    ASSERT_EQ(planned.config.pp, 2);
    ASSERT_EQ(planned.config.offload, api::OffloadMode::kOptimizer);
    // Every stage places its units alike (the plan says it per layer).
    EXPECT_EQ(planned.layers[0].update, planned.layers[2].update);
    EXPECT_EQ(planned.layers[1].update, planned.layers[3].update);
    const api::Plan read = api::decode_plan(api::to_json(planned));
    EXPECT_EQ(read.config.gpu_units, planned.config.gpu_units);
    const RunResult r = expect_same_training(planned, kFourLayers);
    ASSERT_FALSE(r.transfer_bytes.empty());
    EXPECT_GT(r.transfer_bytes.back(), 0);  // the CPU units went home and back
  }
  for (int64_t gpu_units : {0, 1, 2}) {  // every unit (the embeddings too), then layers only
    SCOPED_TRACE(gpu_units);
    api::Plan four = plan_for(
        "tensorParallel: 1, dataParallel: 2, pipelineParallel: 2, overlap: off, offload: "
        "optimizer",
        kFourLayers, "fp32", 6, 4);
    ASSERT_EQ(four.config.pp, 2);
    four.config.gpu_units = gpu_units;
    four.config.distributed_optimizer = gpu_units == 1;
    expect_same_training(four, kFourLayers);
  }
  {  // four stages: the two between neither sum nor update their CPU-updated copy of unit 0
    api::Plan four = plan_for(
        "tensorParallel: 1, dataParallel: 1, pipelineParallel: 4, overlap: off, offload: "
        "optimizer",
        kFourLayers);
    ASSERT_EQ(four.config.pp, 4);
    four.config.gpu_units = 0;
    expect_same_training(four, kFourLayers);
  }
}
// Each stage writes its layers (the first also the tensors that are not per layer) as shards of
// one checkpoint, which resumes at any layout, and any checkpoint resumes in stages.
TEST(ParallelTraining, PipelineCheckpointsResumeAtAnyLayout) {
  expect_resharded_resume("tensorParallel: 1, dataParallel: 1, pipelineParallel: 2, overlap: off",
                          "tensorParallel: 1, dataParallel: 1, overlap: off", kFourLayers);
  expect_resharded_resume("tensorParallel: 2, dataParallel: 1, overlap: off",
                          "tensorParallel: 1, dataParallel: 2, pipelineParallel: 2, overlap: off",
                          kFourLayers);
  expect_resharded_resume("tensorParallel: 1, dataParallel: 1, pipelineParallel: 4, overlap: off",
                          "tensorParallel: 2, dataParallel: 1, pipelineParallel: 2, overlap: off",
                          kFourLayers);
}
// Oases' cutpoint: the layers after the cut at another TP degree (so another DP degree) on the
// same ranks, the activations re-sharded at the cut and the tied embedding summed in both TP
// layouts, train as one rank does.
api::Plan with_cutpoint(const std::string& parallelism, int64_t layer, int64_t cut_tp,
                        const std::string& model = kFourLayers, int cores = 4) {
  api::Plan plan = plan_for(parallelism, model, "fp32", 6, cores);
  plan.config.cut_layer = layer;
  plan.config.cut_tp = cut_tp;
  return plan;
}
// A cutpoint with offload optimizer: the model's first gpuUnits units (the embeddings', then the
// layers in order) on the device, each segment its part (api::part_device_units) — the layers
// after the cut, or some before it too, updated by the CPU; sharded too.
TEST(ParallelTraining, CutpointWithOffloadEqualsOneRank) {
  {
    const api::Plan planned = plan_for(
        "tensorParallel: 1, dataParallel: 2, overlap: off, cutpointLayer: 2, "
        "cutpointTensorParallel: 2, offload: optimizer, gpuUpdateFraction: 0.5",
        kFourLayers);
    ASSERT_EQ(planned.config.cut_layer, 2);
    ASSERT_EQ(planned.config.offload, api::OffloadMode::kOptimizer);
    ASSERT_GE(planned.config.gpu_units, 1);
    EXPECT_EQ(api::not_yet_executable(planned), "");
    const RunResult r = expect_same_training(planned, kFourLayers);
    ASSERT_FALSE(r.transfer_bytes.empty());
    EXPECT_GT(r.transfer_bytes.back(), 0);  // the CPU units went home and back
  }
  for (int64_t gpu_units : {1, 2, 4}) {
    SCOPED_TRACE(gpu_units);
    api::Plan plan =
        with_cutpoint("tensorParallel: 2, dataParallel: 1, overlap: off, offload: optimizer", 1, 1);
    plan.config.gpu_units = gpu_units;
    plan.config.distributed_optimizer = gpu_units == 2;
    expect_same_training(plan, kFourLayers);
  }
}
TEST(ParallelTraining, CutpointEqualsOneRank) {
  {  // TP widens at the cut: DP 2 → TP 2 (the two ranks' samples gathered at the cut), as the
     // planner plans it when asked
    SCOPED_TRACE("tp 1 x dp 2, then tp 2 from layer 2");
    const api::Plan planned = plan_for(
        "tensorParallel: 1, dataParallel: 2, overlap: off, cutpointLayer: 2, "
        "cutpointTensorParallel: 2",
        kFourLayers);
    ASSERT_EQ(planned.config.cut_layer, 2);
    ASSERT_EQ(planned.config.cut_tp, 2);
    expect_same_training(planned, kFourLayers);
  }
  {  // TP narrows at the cut: TP 2 → DP 2 (each rank takes its half of the samples)
    SCOPED_TRACE("tp 2, then tp 1 x dp 2 from layer 1");
    expect_same_training(with_cutpoint("tensorParallel: 2, dataParallel: 1, overlap: off", 1, 1),
                         kFourLayers);
  }
  {  // Four ranks, TP 2 × DP 2 → TP 4, with the Oases overlap on both sides and recompute
    SCOPED_TRACE("tp 2 x dp 2 overlapped, then tp 4 from layer 3");
    api::Plan plan = with_cutpoint(
        "tensorParallel: 2, dataParallel: 2, overlap: on, recompute: commAware", 3, 4);
    ASSERT_EQ(plan.world, 4);
    expect_same_training(plan, kFourLayers);
  }
  {  // With the distributed optimizer: each segment shards over its own DP group (4 and 2), the
     // embeddings' shard taken from the world sum; and the other way round (2 and 4)
    SCOPED_TRACE("tp 1 x dp 4 sharded, then tp 2 x dp 2 sharded from layer 2");
    api::Plan plan = with_cutpoint("tensorParallel: 1, dataParallel: 4, overlap: off", 2, 2);
    ASSERT_EQ(plan.world, 4);
    plan.config.distributed_optimizer = true;
    expect_same_training(plan, kFourLayers);
    api::Plan back = with_cutpoint("tensorParallel: 2, dataParallel: 2, overlap: off", 2, 1);
    back.config.distributed_optimizer = true;
    expect_same_training(back, kFourLayers);
  }
  {  // Four ranks, TP 4 → TP 1 × DP 4 on the tiny model (its two layers split 1 + 1)
    SCOPED_TRACE("tp 4, then tp 1 x dp 4 from layer 1");
    api::Plan plan = plan_for("tensorParallel: 4, dataParallel: 1, overlap: off", kTiny, "fp32",
                              6, 4);
    ASSERT_EQ(plan.world, 4);
    plan.config.micro_batch = 8;  // 2 sequences per rank after the cut
    plan.config.grad_accum = 1;
    plan.config.cut_layer = 1;
    plan.config.cut_tp = 1;
    expect_same_training(plan, kTiny);
  }
}
// A cutpoint's checkpoint holds the layers before the cut in their TP layout and those after in
// theirs; it resumes at any layout, and any checkpoint resumes with a cutpoint.
TEST(ParallelTraining, CutpointCheckpointsResumeAtAnyLayout) {
  {  // sharded in both segments (the full moments gathered for the save), as the planner plans it
    const api::Plan sharded = plan_for(
        "tensorParallel: 1, dataParallel: 4, overlap: off, distributedOptimizer: on, "
        "cutpointLayer: 2, cutpointTensorParallel: 2",
        kFourLayers);
    ASSERT_EQ(sharded.config.cut_layer, 2);
    ASSERT_TRUE(sharded.config.distributed_optimizer);
    expect_resharded_resume(
        sharded, plan_for("tensorParallel: 1, dataParallel: 1, overlap: off", kFourLayers));
  }
  expect_resharded_resume(with_cutpoint("tensorParallel: 1, dataParallel: 2, overlap: off", 2, 2),
                          plan_for("tensorParallel: 1, dataParallel: 1, overlap: off",
                                   kFourLayers));
  expect_resharded_resume(plan_for("tensorParallel: 2, dataParallel: 1, overlap: off",
                                   kFourLayers),
                          with_cutpoint("tensorParallel: 2, dataParallel: 1, overlap: off", 1, 1));
}
// Per-stage TP: a cutpoint between pipeline stages — the stages from the cut on run at another
// TP degree (so another DP degree and micro-batch) on their own ranks; the first of them
// re-shards the activations it receives, the last the targets, and the first and the last stage
// sum the tied embedding across their two TP layouts — train as one rank does.
api::Plan with_stage_cut(const std::string& parallelism, int64_t layer, int64_t cut_tp,
                         int cores = 4) {
  api::Plan plan = with_cutpoint(parallelism, layer, cut_tp, kFourLayers, cores);
  plan.config.virtual_stages = 1;  // (the planner may interleave two stages' four layers)
  EXPECT_EQ(plan.config.pp, stages_in(parallelism));
  EXPECT_EQ(api::cut_stage(plan.config, plan.model.layers) * plan.model.layers / plan.config.pp,
            layer);
  return plan;
}
TEST(ParallelTraining, PerStageTensorParallelEqualsOneRank) {
  {  // TP widens between the stages: stage 0 at TP 1 × DP 2, stage 1 at TP 2
    SCOPED_TRACE("pp 2: tp 1 x dp 2, then tp 2");
    expect_same_training(
        with_stage_cut("tensorParallel: 1, dataParallel: 2, pipelineParallel: 2, overlap: off", 2,
                       2),
        kFourLayers);
  }
  {  // TP narrows: stage 0 at TP 2, stage 1 at TP 1 × DP 2 (each rank half the samples)
    SCOPED_TRACE("pp 2: tp 2, then tp 1 x dp 2");
    expect_same_training(
        with_stage_cut("tensorParallel: 2, dataParallel: 1, pipelineParallel: 2, overlap: off", 2,
                       1),
        kFourLayers);
  }
  {  // Four stages, the cut after the first: the two between at TP 1 hold no embeddings, and
     // the last stage re-shards the targets apart from the first after the cut
    SCOPED_TRACE("pp 4: tp 2, then tp 1 x dp 2 from stage 1");
    expect_same_training(
        with_stage_cut("tensorParallel: 2, dataParallel: 1, pipelineParallel: 4, overlap: off", 1,
                       1, 8),
        kFourLayers);
  }
  {  // With the distributed optimizer (each stage shards over its own DP group) and recompute
    SCOPED_TRACE("pp 2 sharded: tp 1 x dp 2, then tp 2, recompute full");
    api::Plan plan = with_stage_cut(
        "tensorParallel: 1, dataParallel: 2, pipelineParallel: 2, overlap: off, recompute: full", 2,
        2);
    plan.config.distributed_optimizer = true;
    expect_same_training(plan, kFourLayers);
  }
  {  // With offload optimizer: each stage's first gpuUnits units on the device, the rest on the
     // CPU (the embeddings' unit stays on the device: it is summed across the stages there)
    SCOPED_TRACE("pp 2 offload: tp 2, then tp 1 x dp 2");
    api::Plan plan = with_stage_cut(
        "tensorParallel: 2, dataParallel: 1, pipelineParallel: 2, overlap: off, offload: optimizer",
        2, 1);
    plan.config.gpu_units = 2;
    ASSERT_EQ(api::not_yet_executable(plan), "");
    const RunResult r = expect_same_training(plan, kFourLayers);
    ASSERT_FALSE(r.transfer_bytes.empty());
    EXPECT_GT(r.transfer_bytes.back(), 0);
  }
  {  // With the offload window: each stage streams its two layers through one slot
    SCOPED_TRACE("pp 2 window: tp 1 x dp 2, then tp 2");
    api::Plan plan = with_stage_cut(
        "tensorParallel: 1, dataParallel: 2, pipelineParallel: 2, overlap: off, offload: window, "
        "recompute: full",
        2, 2);
    plan.config.gpu_units = 1;
    plan.config.window = 1;
    ASSERT_EQ(plan.config.offload, api::OffloadMode::kWindow);
    const RunResult r = expect_same_training(plan, kFourLayers);
    ASSERT_FALSE(r.transfer_bytes.empty());
    EXPECT_GT(r.transfer_bytes.back(), 0);
  }
}
// Its checkpoints hold each stage's layers in that stage's TP layout: they resume at any layout,
// and any checkpoint resumes with per-stage TP.
TEST(ParallelTraining, PerStageTensorParallelCheckpointsResumeAtAnyLayout) {
  expect_resharded_resume(
      with_stage_cut("tensorParallel: 1, dataParallel: 2, pipelineParallel: 2, overlap: off", 2, 2),
      plan_for("tensorParallel: 2, dataParallel: 1, overlap: off", kFourLayers));
  expect_resharded_resume(
      plan_for("tensorParallel: 1, dataParallel: 2, pipelineParallel: 2, overlap: off",
               kFourLayers),
      with_stage_cut("tensorParallel: 2, dataParallel: 1, pipelineParallel: 2, overlap: off", 2,
                     1));
}
TEST(ParallelTraining, DistributedOptimizerEqualsOneRank) {
  const api::Plan dp2 =
      with_distributed_optimizer("tensorParallel: 1, dataParallel: 2, overlap: off");
  const RunResult r = expect_same_training(dp2);
  ASSERT_GE(r.dp_allreduces.size(), 2u);
  for (size_t i = 1; i < r.dp_allreduces.size(); ++i) {
    // The loss and the gradient norm's shard sums; then per unit a reduce-scatter, an all-gather.
    EXPECT_EQ(r.dp_allreduces[i] - r.dp_allreduces[i - 1], 2) << "step " << i;
    EXPECT_EQ(r.dp_collectives[i] - r.dp_collectives[i - 1], 2 + 2 * (dp2.model.layers + 1))
        << "step " << i;
  }
  expect_same_training(
      with_distributed_optimizer("tensorParallel: 2, dataParallel: 2, overlap: on"));
  expect_same_training(
      with_distributed_optimizer("tensorParallel: 1, dataParallel: 2, overlap: off", "bf16"));
}
// Composed with offload optimizer (the SynergyScale split per shard): each DP rank keeps the
// master weights, gradients and moments of its shard of every CPU-updated unit in host memory
// and updates only those; the all-gather brings every unit's new values to the device.
TEST(ParallelTraining, DistributedOptimizerWithOffloadEqualsOneRank) {
  {  // The planner plans the two together when a job asks, and the worker runs its plan.
    const api::Plan asked = plan_for(
        "tensorParallel: 1, dataParallel: 2, overlap: off, offload: optimizer, "
        "gpuUpdateFraction: 0.5, distributedOptimizer: on");
    EXPECT_TRUE(asked.config.distributed_optimizer);
    EXPECT_EQ(asked.config.offload, api::OffloadMode::kOptimizer);
    expect_same_training(asked);
  }
  for (const char* parallelism :
       {"tensorParallel: 1, dataParallel: 2, overlap: off, offload: optimizer, "
        "gpuUpdateFraction: 0.5",
        "tensorParallel: 2, dataParallel: 2, overlap: on, offload: optimizer, "
        "gpuUpdateFraction: 0"}) {
    SCOPED_TRACE(parallelism);
    api::Plan plan = with_distributed_optimizer(parallelism);
    ASSERT_EQ(plan.config.offload, api::OffloadMode::kOptimizer);
    const RunResult r = expect_same_training(plan);
    // Each rank moves its shards home and back: about 2/d of what the unsharded engine moves.
    api::Plan plain = plan;
    plain.config.distributed_optimizer = false;
    const RunResult unsharded = run(plain);
    ASSERT_FALSE(r.transfer_bytes.empty());
    ASSERT_FALSE(unsharded.transfer_bytes.empty());
    EXPECT_LT(r.transfer_bytes.back(), unsharded.transfer_bytes.back() * 0.6);
    EXPECT_GT(r.transfer_bytes.back(), unsharded.transfer_bytes.back() * 0.4);
  }
  expect_resharded_resume(
      with_distributed_optimizer(
          "tensorParallel: 1, dataParallel: 2, overlap: off, offload: optimizer, "
          "gpuUpdateFraction: 0.5"),
      plan_for("tensorParallel: 1, dataParallel: 1, overlap: off"));
}
// Its checkpoints hold the full moments (gathered for the save), so they resume at any layout,
// and a restore's full moments are cut into the shards.
TEST(ParallelTraining, DistributedOptimizerCheckpointsResumeAtAnyLayout) {
  {
    SCOPED_TRACE("DP 2 sharded -> one rank");
    expect_resharded_resume(
        with_distributed_optimizer("tensorParallel: 1, dataParallel: 2, overlap: off"),
        plan_for("tensorParallel: 1, dataParallel: 1, overlap: off"));
  }
  {
    SCOPED_TRACE("TP 2 -> DP 2 sharded");
    expect_resharded_resume(
        plan_for("tensorParallel: 2, dataParallel: 1, overlap: off"),
        with_distributed_optimizer("tensorParallel: 1, dataParallel: 2, overlap: off"));
  }
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

// ---- the offload engine ---------------------------------------------------------------------

// Copies per step by hand (per rank, fp32 = 4 bytes): optimizer offload sends each CPU-updated
// parameter's gradient down and its new value up once per step; a window of W slots over S
// streamed layers, per micro-batch, fetches S − W layers in the forward and again in the backward,
// sends S layers' gradients down and S activation checkpoints down and up, and per step fetches
// the W layers left in the slots again after the CPU update.
struct Dims {
  int64_t L, C, F, Vp, T, t;
  int64_t layer() const { return (4 * C * C + 2 * C * F + 3 * C + F) / t + 6 * C; }
  int64_t embedding() const { return Vp / t * C + T * C + 2 * C; }
};
Dims dims_of(const api::Plan& p) {
  return {p.model.layers, p.model.hidden, p.model.ffn_hidden, p.model.padded_vocab(),
          p.model.seq_len, p.config.tp};
}
int64_t optimizer_bytes(const api::Plan& p) {
  const Dims d = dims_of(p);
  const int64_t gpu = p.config.gpu_units;
  const int64_t cpu_params = (gpu == 0 ? d.embedding() : 0) + std::min(d.L, d.L + 1 - gpu) * d.layer();
  return 2 * 4 * cpu_params;
}
// Rank 0's (of the first stage, with pipeline stages: its stage's layers stream, with virtual
// stages each chunk's through its own slots).
int64_t window_bytes(const api::Plan& p) {
  const Dims d = dims_of(p);
  const int pp = static_cast<int>(p.config.pp), v = static_cast<int>(p.config.virtual_stages);
  const int64_t G = p.config.grad_accum, chunk_layers = d.L / pp / v;
  const int64_t act = p.config.micro_batch * d.T * d.C *
                      (p.config.recompute == api::Recompute::kCommAware ? 3 : 1);
  // A chunk's sweep that follows one of the same direction (1F1B's warm-up forwards and drain
  // backwards; interleaved, its groups of micro-batches) fetches its first W layers anew, but
  // for those the last sweep's end left in the slots.
  std::vector<int64_t> turns(static_cast<size_t>(v), 0);
  std::vector<int> last(static_cast<size_t>(v), -1);
  for (const worker::PipelineOp& op : worker::pipeline_order(pp, 0, v, G).ops) {
    const auto k = static_cast<size_t>(op.chunk);
    turns[k] += last[k] == static_cast<int>(op.forward) ? 1 : 0;
    last[k] = static_cast<int>(op.forward);
  }
  int64_t floats = 0;
  for (int k = 0; k < v; ++k) {  // the stage's first gpuUnits − 1 layers are resident
    const int64_t resident =
        std::clamp<int64_t>(p.config.gpu_units - 1 - k * chunk_layers, 0, chunk_layers);
    const int64_t S = chunk_layers - resident, W = std::min(p.config.window, S);
    const int64_t refetched = W - std::max<int64_t>(0, 2 * W - S);
    floats += G * (2 * (S - W) * d.layer() + S * d.layer() + 2 * S * act) + W * d.layer() +
              turns[static_cast<size_t>(k)] * refetched * d.layer();
  }
  return 4 * floats;
}

void expect_bytes_per_step(const RunResult& result, int64_t expected, double predicted) {
  EXPECT_EQ(static_cast<double>(expected), predicted) << "the planner's pcieBytesPerStep";
  ASSERT_FALSE(result.transfer_bytes.empty());
  for (size_t i = 0; i < result.transfer_bytes.size(); ++i)
    EXPECT_EQ(result.transfer_bytes[i], expected) << "step " << i + 1;
}

std::string optimizer_offload(double fraction, int dp) {
  return "tensorParallel: 1, dataParallel: " + std::to_string(dp) +
         ", overlap: off, offload: optimizer, gpuUpdateFraction: " + std::to_string(fraction);
}

TEST(Offload, OptimizerOffloadEqualsTheDeviceRun) {
  for (double f : {0.0, 0.5}) {
    const api::Plan plan = plan_for(optimizer_offload(f, 1), kFourLayers);
    ASSERT_EQ(plan.config.offload, api::OffloadMode::kOptimizer);
    const RunResult r = expect_same_training(plan, kFourLayers);
    expect_bytes_per_step(r, optimizer_bytes(plan), plan.predicted.pcie_bytes_per_step);
  }
  // f = 1: every unit on the device through the same engine; nothing moves.
  api::Plan all = plan_for(optimizer_offload(0.5, 1), kFourLayers);
  all.config.gpu_units = all.model.layers + 1;
  const RunResult r = expect_same_training(all, kFourLayers);
  expect_bytes_per_step(r, 0, 0);
}

TEST(Offload, OptimizerOffloadWithDataParallelEqualsOneRank) {
  const api::Plan plan = plan_for(optimizer_offload(0.5, 2), kFourLayers);
  const RunResult r = expect_same_training(plan, kFourLayers);
  expect_bytes_per_step(r, optimizer_bytes(plan), plan.predicted.pcie_bytes_per_step);
}

std::string window_offload(int window, int dp, const std::string& recompute = "full") {
  // A small GPU fraction: only the embeddings stay, all four layers stream.
  return "tensorParallel: 1, dataParallel: " + std::to_string(dp) +
         ", overlap: off, recompute: " + recompute + ", offload: window, offloadWindow: " +
         std::to_string(window) + ", gpuUpdateFraction: 0.05";
}

TEST(Offload, WindowEqualsTheDeviceRun) {
  for (int w : {1, 2}) {
    const api::Plan plan = plan_for(window_offload(w, 1), kFourLayers);
    ASSERT_EQ(plan.config.offload, api::OffloadMode::kWindow);
    ASSERT_EQ(plan.config.window, w);
    ASSERT_EQ(plan.config.gpu_units, 1) << "every layer streams";
    const RunResult r = expect_same_training(plan, kFourLayers);
    expect_bytes_per_step(r, window_bytes(plan), plan.predicted.pcie_bytes_per_step);
  }
  // W = L: every streamed layer keeps a slot (the planner calls that optimizer offload, but the
  // engine must still get it right).
  api::Plan all = plan_for(window_offload(1, 1), kFourLayers);
  all.config.window = all.model.layers;
  const RunResult r = expect_same_training(all, kFourLayers);
  ASSERT_FALSE(r.transfer_bytes.empty());
  EXPECT_EQ(r.transfer_bytes.back(), window_bytes(all));
}

TEST(Offload, WindowWithDataParallelEqualsOneRank) {
  for (int w : {1, 2}) {
    const api::Plan plan = plan_for(window_offload(w, 2), kFourLayers);
    const RunResult r = expect_same_training(plan, kFourLayers);
    expect_bytes_per_step(r, window_bytes(plan), plan.predicted.pcie_bytes_per_step);
  }
}

// commAware checkpoints three tensors per layer; with TP = 2 and the Oases schedule, two
// sub-batches are in flight at every layer boundary.
TEST(Offload, WindowWithOverlappedTensorParallelEqualsOneRank) {
  const api::Plan plan = plan_for(
      "tensorParallel: 2, dataParallel: 1, overlap: on, recompute: commAware, offload: window, "
      "offloadWindow: 1, gpuUpdateFraction: 0.05",
      kFourLayers);
  ASSERT_EQ(plan.config.sub_batches, 2);
  const RunResult r = expect_same_training(plan, kFourLayers);
  expect_bytes_per_step(r, window_bytes(plan), plan.predicted.pcie_bytes_per_step);
}

// Window offload inside each pipeline stage: a stage streams its own layers through its slots,
// and 1F1B's forwards and backwards of several micro-batches in flight each keep their streamed
// layers' activation checkpoints in host memory (one per slot); a forward after a forward (the
// warm-up) or a backward after a backward (the drain) brings the other end of the stage back into
// the slots. The same training as one rank, and rank 0 moves the bytes the planner predicts.
TEST(Offload, WindowInPipelineStagesEqualsOneRank) {
  for (int w : {1, 2}) {
    SCOPED_TRACE(w);
    const api::Plan plan = plan_for(
        "tensorParallel: 1, dataParallel: 1, pipelineParallel: 2, overlap: off, recompute: full, "
        "offload: window, offloadWindow: " + std::to_string(w) + ", gpuUpdateFraction: 0.05",
        kEightLayers);
    ASSERT_EQ(plan.config.pp, 2);
    ASSERT_EQ(plan.config.offload, api::OffloadMode::kWindow);
    ASSERT_EQ(plan.config.window, w);
    ASSERT_EQ(plan.config.gpu_units, 1) << "each stage streams its 4 layers";
    ASSERT_GE(plan.config.grad_accum, 2) << "a warm-up forward and a drain backward";
    // Every stage places its layers alike, streamed ones not resident (the plan says it per
    // layer, and its JSON keeps it).
    EXPECT_FALSE(plan.layers[0].resident);
    EXPECT_EQ(api::decode_plan(api::to_json(plan)).config.gpu_units, 1);
    const RunResult r = expect_same_training(plan, kEightLayers);
    expect_bytes_per_step(r, window_bytes(plan), plan.predicted.pcie_bytes_per_step);
  }
  // TP 2 × DP 2 in each stage, the Oases overlap and commAware's three checkpoints per layer
  // (on four layers, two streamed per stage: eight layers split over TP 2 reassociate past the
  // fp32 tolerance, with or without offload — measured 2.8e-5 absolute on fcprojw either way).
  {
    const api::Plan plan = plan_for(
        "tensorParallel: 2, dataParallel: 2, pipelineParallel: 2, overlap: on, recompute: "
        "commAware, offload: window, offloadWindow: 1, gpuUpdateFraction: 0.05",
        kFourLayers, "fp32", 6, 8);
    ASSERT_EQ(plan.world, 8);
    ASSERT_EQ(plan.config.offload, api::OffloadMode::kWindow);
    ASSERT_EQ(plan.config.gpu_units, 1);
    const RunResult r = expect_same_training(plan, kFourLayers);
    expect_bytes_per_step(r, window_bytes(plan), plan.predicted.pcie_bytes_per_step);
  }
  // Virtual stages: 8 layers in 2 stages × 2 chunks of 2, each chunk streaming its layers through
  // its own slot; the interleaved schedule runs a chunk's forwards (and backwards) in groups of
  // 2 micro-batches, each group's second sweep refetching. With gpuUnits 3 the first chunk keeps
  // both its layers on the device and streams nothing, the second streams its two.
  for (const auto& [fraction, gpu_units] : {std::pair{"0.05", 1}, std::pair{"0.4", 3}}) {
    SCOPED_TRACE(fraction);
    const api::Plan plan = plan_for(
        std::string("tensorParallel: 1, dataParallel: 1, pipelineParallel: 2, virtualStages: 2, "
                    "overlap: off, recompute: full, offload: window, offloadWindow: 1, "
                    "gpuUpdateFraction: ") +
            fraction,
        kEightLayers);
    ASSERT_EQ(plan.config.virtual_stages, 2);
    ASSERT_EQ(plan.config.offload, api::OffloadMode::kWindow);
    ASSERT_EQ(plan.config.gpu_units, gpu_units);
    const RunResult r = expect_same_training(plan, kEightLayers);
    expect_bytes_per_step(r, window_bytes(plan), plan.predicted.pcie_bytes_per_step);
  }
  {  // four stages: the first keeps 4 micro-batches in flight, the two between stream too
    api::Plan plan = plan_for(
        "tensorParallel: 1, dataParallel: 1, pipelineParallel: 4, overlap: off, recompute: full, "
        "offload: window, offloadWindow: 1, gpuUpdateFraction: 0.05",
        kEightLayers);
    ASSERT_EQ(plan.config.pp, 4);
    ASSERT_EQ(plan.config.offload, api::OffloadMode::kWindow);
    ASSERT_EQ(plan.config.grad_accum, 4);
    const RunResult r = expect_same_training(plan, kEightLayers);
    expect_bytes_per_step(r, window_bytes(plan), plan.predicted.pcie_bytes_per_step);
  }
}

// The offload window across Oases' cutpoint: each segment streams its part of the layers past the
// model's first gpuUnits units (api::part_device_units) through W slots of its own — the
// embeddings' unit on the device, where the cutpoint sums it over every rank. The same training
// as one rank; rank 0 moves each segment's window bytes (at its own TP degree and micro-batch),
// as predicted.
int64_t cut_window_bytes(const api::Plan& p) {
  const int64_t k = p.config.cut_layer, L = p.model.layers;
  api::Plan first = p, second = p;
  first.model.layers = k;
  first.config.gpu_units = api::part_device_units(p.config.gpu_units, 0, k);
  second.model.layers = L - k;
  second.config.tp = p.config.cut_tp;
  second.config.micro_batch = p.config.micro_batch * p.config.cut_tp / p.config.tp;
  second.config.gpu_units = api::part_device_units(p.config.gpu_units, k, L - k);
  return window_bytes(first) + window_bytes(second);
}
TEST(Offload, WindowAcrossACutpointEqualsOneRank) {
  // (On four layers: eight split over TP 2 reassociate past the fp32 tolerance with or without
  // offload, the cutpoint's too — measured 4.2e-5 absolute on fcprojw either way.)
  {  // DP 2 → TP 2 at layer 2 of 4; every layer streams, 2 per segment
    const api::Plan plan = plan_for(
        "tensorParallel: 1, dataParallel: 2, overlap: off, cutpointLayer: 2, "
        "cutpointTensorParallel: 2, recompute: full, offload: window, offloadWindow: 1, "
        "gpuUpdateFraction: 0.05",
        kFourLayers);
    ASSERT_EQ(plan.config.cut_layer, 2);
    ASSERT_EQ(plan.config.offload, api::OffloadMode::kWindow);
    ASSERT_EQ(plan.config.gpu_units, 1);
    EXPECT_EQ(api::not_yet_executable(plan), "");
    const RunResult r = expect_same_training(plan, kFourLayers);
    expect_bytes_per_step(r, cut_window_bytes(plan), plan.predicted.pcie_bytes_per_step);
  }
  {  // TP 2 → DP 2 at layer 2 of 4, commAware; the first 3 units resident: only the second
     // segment streams (the first's engine updates its layers on the device)
    api::Plan plan = plan_for(
        "tensorParallel: 2, dataParallel: 1, overlap: off, cutpointLayer: 2, "
        "cutpointTensorParallel: 1, recompute: commAware, offload: window, offloadWindow: 1, "
        "gpuUpdateFraction: 0.05",
        kFourLayers);
    ASSERT_EQ(plan.config.cut_layer, 2);
    ASSERT_EQ(plan.config.offload, api::OffloadMode::kWindow);
    plan.config.gpu_units = 3;
    const RunResult r = expect_same_training(plan, kFourLayers);
    ASSERT_FALSE(r.transfer_bytes.empty());
    EXPECT_EQ(r.transfer_bytes.back(), cut_window_bytes(plan));
  }
}

// The distributed optimizer with the offload window (CPU ranks): each DP rank keeps the whole
// master of a streamed layer (its slot loads from it) and every micro-batch's gradients summed in
// host memory, reduce-scatters the sums, updates its shard of the master with its shard of the
// moments, and all-gathers the new shards into every rank's master. The same training as one
// rank; the bytes over the "PCIe" are the window's, as predicted (the gathers are host to host).
TEST(Offload, WindowWithDistributedOptimizerEqualsOneRank) {
  {
    const api::Plan plan = plan_for(
        "tensorParallel: 1, dataParallel: 2, overlap: off, recompute: full, offload: window, "
        "offloadWindow: 1, gpuUpdateFraction: 0.05, distributedOptimizer: on",
        kFourLayers);
    ASSERT_TRUE(plan.config.distributed_optimizer);
    ASSERT_EQ(plan.config.offload, api::OffloadMode::kWindow);
    ASSERT_EQ(plan.config.gpu_units, 1);
    EXPECT_EQ(api::not_yet_executable(plan), "");
    const RunResult r = expect_same_training(plan, kFourLayers);
    expect_bytes_per_step(r, window_bytes(plan), plan.predicted.pcie_bytes_per_step);
    // Less host memory than the unsharded window: the streamed layers' moments are sharded.
    const api::Plan unsharded = plan_for(
        "tensorParallel: 1, dataParallel: 2, overlap: off, recompute: full, offload: window, "
        "offloadWindow: 1, gpuUpdateFraction: 0.05, distributedOptimizer: off",
        kFourLayers);
    ASSERT_EQ(unsharded.config.gpu_units, plan.config.gpu_units);
    EXPECT_LT(plan.predicted.host_bytes_per_node, unsharded.predicted.host_bytes_per_node);
  }
  // In pipeline stages (PP 2 × DP 2, each stage's 2 layers streamed through 1 slot). (On four
  // layers: eight in PP 2 × DP 2 reassociate past the fp32 tolerance with or without offload and
  // sharding — measured 6.8e-5 absolute on fcprojw either way.)
  {
    const api::Plan plan = plan_for(
        "tensorParallel: 1, dataParallel: 2, pipelineParallel: 2, overlap: off, recompute: full, "
        "offload: window, offloadWindow: 1, gpuUpdateFraction: 0.05, distributedOptimizer: on",
        kFourLayers);
    ASSERT_TRUE(plan.config.distributed_optimizer);
    ASSERT_EQ(plan.config.pp, 2);
    ASSERT_EQ(plan.config.gpu_units, 1);
    const RunResult r = expect_same_training(plan, kFourLayers);
    expect_bytes_per_step(r, window_bytes(plan), plan.predicted.pcie_bytes_per_step);
  }
  {  // in bf16: the shards' new values reach the slots' bf16 copies
    const api::Plan plan = plan_for(
        "tensorParallel: 1, dataParallel: 2, overlap: off, recompute: full, offload: window, "
        "offloadWindow: 2, gpuUpdateFraction: 0.05, distributedOptimizer: on",
        kFourLayers, "bf16");
    ASSERT_TRUE(plan.config.distributed_optimizer);
    ASSERT_EQ(plan.precision, api::Precision::kBf16);
    expect_same_training(plan, kFourLayers);
  }
  {  // across a cutpoint (DP 2 → TP 2 at layer 2: only the first segment is sharded over DP 2)
    api::Plan plan = with_cutpoint(
        "tensorParallel: 1, dataParallel: 2, overlap: off, recompute: full, offload: window, "
        "offloadWindow: 1, gpuUpdateFraction: 0.05",
        2, 2);
    plan.config.distributed_optimizer = true;
    const RunResult r = expect_same_training(plan, kFourLayers);
    ASSERT_FALSE(r.transfer_bytes.empty());
    EXPECT_EQ(r.transfer_bytes.back(), cut_window_bytes(plan));
  }
}

TEST(Offload, RefusesAPlanWhoseOffloadDoesNotFitHostMemory) {
  const api::Plan plan = plan_for(window_offload(1, 1), kFourLayers);
  worker::TrainOptions options;
  options.log_every = 0;
  options.host_memory_bytes = 1 << 20;  // a node with 1 MiB free
  bool stepped = false;
  options.on_step = [&](const worker::StepReport&) { stepped = true; };
  try {
    worker::train(plan, options, [](const std::string&) {});
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("host memory"), std::string::npos) << what;
    EXPECT_NE(what.find("1.0 MiB"), std::string::npos) << what;
  }
  EXPECT_FALSE(stepped) << "refused before training";
  EXPECT_GT(worker::offload_host_bytes(plan), 0);
}

// ---- bf16 on the CPU (docs/WORKER.md, "bf16 on the CPU") --------------------------------------
// Every layout and the offload engine in bf16 equal one bf16 rank (tolerance_for says how near);
// bf16 trains like fp32; checkpoints carry over between the precisions.

TEST(Bf16, TensorParallelAndOverlapEqualOneBf16Rank) {
  for (const char* layout : {"tensorParallel: 2, dataParallel: 1, overlap: off",
                             "tensorParallel: 2, dataParallel: 1, overlap: on",
                             "tensorParallel: 1, dataParallel: 2, overlap: off"}) {
    SCOPED_TRACE(layout);
    const api::Plan plan = plan_for(layout, kTiny, "bf16");
    ASSERT_EQ(plan.precision, api::Precision::kBf16);
    expect_same_training(plan);
  }
}

TEST(Bf16, OffloadEqualsOneBf16Rank) {
  const api::Plan optimizer = plan_for(optimizer_offload(0.5, 1), kFourLayers, "bf16");
  ASSERT_EQ(optimizer.config.offload, api::OffloadMode::kOptimizer);
  expect_same_training(optimizer, kFourLayers);
  const api::Plan window = plan_for(window_offload(1, 1), kFourLayers, "bf16");
  ASSERT_EQ(window.config.offload, api::OffloadMode::kWindow);
  expect_same_training(window, kFourLayers);
}

// The largest relative gap between two loss curves, step by step, and their mean gap.
std::pair<double, double> curve_gap(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0, sum = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double gap = std::fabs(a[i] - b[i]) / std::fabs(b[i]);
    worst = std::max(worst, gap);
    sum += gap;
  }
  return {worst, sum / static_cast<double>(a.size())};
}

// 200 steps on the same batches: the bf16 curve stays within 2 % of the fp32 one at every step
// and within 1 % on average, while both learn (the loss falls well below its start).
TEST(Bf16, TrainsLikeFp32For200Steps) {
  for (const char* model : {kTiny, kFourLayers}) {
    SCOPED_TRACE(model);
    const std::string layout = "tensorParallel: 1, dataParallel: 1, overlap: off";
    const RunResult fp32 = run(plan_for(layout, model, "fp32", 200));
    const RunResult bf16 = run(plan_for(layout, model, "bf16", 200));
    ASSERT_EQ(fp32.losses.size(), 200u);
    ASSERT_EQ(bf16.losses.size(), 200u);
    const auto [worst, mean] = curve_gap(bf16.losses, fp32.losses);
    std::printf("%s: bf16 vs fp32 over 200 steps: largest gap %.3f %%, mean %.3f %%; "
                "loss %.4f -> %.4f (fp32 %.4f -> %.4f)\n",
                model, 100 * worst, 100 * mean, bf16.losses.front(), bf16.losses.back(),
                fp32.losses.front(), fp32.losses.back());
    EXPECT_LT(worst, 0.02);
    EXPECT_LT(mean, 0.01);
    EXPECT_LT(bf16.losses.back(), 0.8 * bf16.losses.front()) << "bf16 learns";
    EXPECT_NE(bf16.losses, fp32.losses) << "the bf16 run computed in bf16";
  }
}

// A checkpoint holds fp32 master weights and moments whatever the run's precision: an fp32 run
// resumes in bf16 and a bf16 run in fp32, and each then trains like an uninterrupted run in its
// new precision (bf16's tolerance).
TEST(Bf16, CheckpointsCarryOverBetweenPrecisions) {
  const std::string layout = "tensorParallel: 1, dataParallel: 1, overlap: off";
  for (const auto& [from, to] : {std::pair{"fp32", "bf16"}, std::pair{"bf16", "fp32"}}) {
    SCOPED_TRACE(std::string(from) + " -> " + to);
    const std::string dir = ::testing::TempDir() + "kt-precision-" + std::to_string(::getpid());
    std::filesystem::remove_all(dir);
    const RunResult first = run(plan_for(layout, kTiny, from), dir, 3);
    ASSERT_EQ(first.losses.size(), 3u);
    const RunResult resumed = run(plan_for(layout, kTiny, to), dir);
    std::filesystem::remove_all(dir);
    ASSERT_EQ(resumed.losses.size(), 3u) << "resumed at step 3, not from scratch";
    // The uninterrupted reference: `from` for 3 steps, then `to` — which is what the resumed run
    // did if the weights, moments and data cursor carried over.
    const RunResult straight = run(plan_for(layout, kTiny, to));
    const RunResult straight_from = run(plan_for(layout, kTiny, from));
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(first.losses[i], straight_from.losses[i]);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_NEAR(resumed.losses[i], straight.losses[i + 3], 1e-2 * straight.losses[i + 3])
          << "step " << i + 4;
  }
}

}  // namespace
}  // namespace kt

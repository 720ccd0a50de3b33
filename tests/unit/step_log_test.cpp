// The measured phases of a step (PhaseMeter), the run record a worker keeps next to its
// checkpoints (StepLog, read by `kubetrain report`), and the trainer's figures behind both: where
// a run starts, the data's loss floor, and the offload engine's measured copies.
#include "worker/step_log.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "planner/planner.h"
#include "test_util.h"
#include "worker/data.h"
#include "worker/trainer.h"

namespace kt {
namespace {

namespace fs = std::filesystem;

api::Plan small_plan(int steps, const std::string& extra = "") {
  const auto job = test::job_from_yaml(
      "apiVersion: kubetrain.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: tiny}\nspec:\n"
      "  model: {preset: tiny}\n"
      "  training: {steps: " +
      std::to_string(steps) +
      ", globalBatchSize: 8, learningRate: 0.005, warmupSteps: 2, seed: 3}\n"
      "  resources: {gpusPerNode: 1}\n" +
      extra);
  return planner::best_plan(job, test::cluster("cpu-local"));
}

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() /
          ("kt-steplog-" + name + "-" + std::to_string(::getpid()) + "-" +
           std::to_string(std::rand())))
      .string();
}

std::vector<nlohmann::json> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

TEST(PhaseMeter, CommunicationIsPerStep_ComputeIsTheRest_TransfersOnlyWhereMeasured) {
  worker::PhaseMeter meter;
  worker::StepReport r;
  r.seconds = 1.0;
  r.optimizer_seconds = 0.1;
  r.cpu_optimizer_seconds = 0.3;
  r.comm["dp"].seconds = 0.5;
  r.comm["dp"].exposed_seconds = 0.2;
  auto phases = meter.step(r);
  EXPECT_DOUBLE_EQ(phases.at("dp_comm_total"), 0.5);
  EXPECT_DOUBLE_EQ(phases.at("dp_comm_exposed"), 0.2);
  EXPECT_DOUBLE_EQ(phases.at("tp_comm_total"), 0.0);  // no TP group: none spent
  EXPECT_DOUBLE_EQ(phases.at("optimizer_gpu"), 0.1);
  EXPECT_DOUBLE_EQ(phases.at("optimizer_cpu_total"), 0.3);
  EXPECT_DOUBLE_EQ(phases.at("compute"), 1.0 - 0.2 - 0.1);
  EXPECT_EQ(phases.count("transfer_total"), 0u) << "not measured, so not reported";

  // StepReport::comm is cumulative: the second step reports only its own part.
  r.comm["dp"].seconds = 0.9;
  r.comm["dp"].exposed_seconds = 0.25;
  r.transfer_seconds = 0.4;
  r.exposed_transfer_seconds = 0.15;
  phases = meter.step(r);
  EXPECT_NEAR(phases.at("dp_comm_total"), 0.4, 1e-12);
  EXPECT_NEAR(phases.at("dp_comm_exposed"), 0.05, 1e-12);
  EXPECT_DOUBLE_EQ(phases.at("transfer_total"), 0.4);
  EXPECT_DOUBLE_EQ(phases.at("transfer_exposed"), 0.15);
  EXPECT_NEAR(phases.at("compute"), 1.0 - 0.05 - 0.15 - 0.1, 1e-12);

  // Exposed time can exceed the step only through clock skew: compute never goes negative.
  r.comm["dp"].exposed_seconds = 5.0;
  EXPECT_EQ(meter.step(r).at("compute"), 0.0);
}

TEST(StepLog, WritesOneObjectPerLine_AppendsAcrossProcesses_AndNullsNonFiniteNumbers) {
  const api::Plan plan = small_plan(4);
  const std::string path = temp_path("lines");
  {
    worker::StepLog log(path);
    log.start(plan, {0, 2.5});
    worker::StepReport r;
    r.step = 1;
    r.total_steps = 4;
    r.loss = std::numeric_limits<double>::quiet_NaN();
    r.seconds = 0.5;
    log.step(r, {{"compute", 0.4}});
    log.checkpoint(1, 0.02);
    log.checkpoint_failed(2, "ENOSPC");
  }
  {
    worker::StepLog log(path);  // a restart appends
    log.start(plan, {1, std::nullopt});
    log.end(4, true);
  }
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_EQ(lines[0]["kind"], "start");
  EXPECT_EQ(lines[0]["resumed_from"], 0);
  EXPECT_EQ(lines[0]["total_steps"], 4);
  EXPECT_EQ(lines[0]["plan_hash"], plan.plan_hash);
  EXPECT_EQ(lines[0]["loss_floor"], 2.5);
  EXPECT_EQ(lines[0]["predicted_phase_seconds"].size(), 10u);
  EXPECT_DOUBLE_EQ(lines[0]["predicted_phase_seconds"]["compute"].get<double>(),
                   plan.predicted.time.compute);
  EXPECT_EQ(lines[1]["kind"], "step");
  EXPECT_TRUE(lines[1]["loss"].is_null()) << "JSON has no NaN";
  EXPECT_EQ(lines[1]["phase_seconds"]["compute"], 0.4);
  EXPECT_EQ(lines[2]["kind"], "checkpoint");
  EXPECT_EQ(lines[3]["reason"], "ENOSPC");
  EXPECT_EQ(lines[4]["resumed_from"], 1);
  EXPECT_TRUE(lines[4]["loss_floor"].is_null());
  EXPECT_EQ(lines[5]["how"], "finished");
  for (const auto& line : lines) EXPECT_GT(line["time"].get<double>(), 1.7e9);
  fs::remove(path);
}

TEST(StepLog, LongRunsLogEveryKthStep_KeepingTheFirstAndTheLast) {
  const api::Plan plan = small_plan(100'000);
  const std::string path = temp_path("thin");
  {
    worker::StepLog log(path);
    log.start(plan, {50'000, std::nullopt});  // 50,000 steps left: every 3rd
    worker::StepReport r;
    r.total_steps = 100'000;
    for (int64_t s = 50'001; s <= 100'000; ++s) {
      r.step = s;
      log.step(r, {});
    }
  }
  const auto lines = read_lines(path);
  EXPECT_LE(static_cast<int64_t>(lines.size()) - 1, worker::StepLog::kMaxStepLines + 1);
  EXPECT_GT(static_cast<int64_t>(lines.size()) - 1, worker::StepLog::kMaxStepLines / 2);
  EXPECT_EQ(lines.back()["step"], 100'000);
  fs::remove(path);
}

// A step log where nothing can be written (a read-only checkpoint volume) is a warning naming the
// path, not an error: it once stopped a worker that would otherwise have trained, each save
// reporting its own failure. Its records are dropped.
TEST(StepLog, AMissingDirectoryIsMade_AnUnwritableOneIsAWarningNamingThePath) {
  const std::string dir = temp_path("made") + "/checkpoints";
  { worker::StepLog log(dir + "/steps.jsonl"); }
  EXPECT_TRUE(fs::exists(dir + "/steps.jsonl"));
  fs::remove_all(fs::path(dir).parent_path());
  testing::internal::CaptureStderr();
  {
    worker::StepLog log("/proc/kt-no-such/steps.jsonl");
    log.checkpoint(5, 0.1);  // dropped, without a second warning
  }
  const std::string warning = testing::internal::GetCapturedStderr();
  EXPECT_NE(warning.find("/proc/kt-no-such/steps.jsonl: cannot keep the step log"),
            std::string::npos) << warning;
  EXPECT_NE(warning.find("training goes on"), std::string::npos) << warning;
  EXPECT_EQ(warning.find("stops here"), std::string::npos) << warning;
}

TEST(TrainerReports, WhereTheRunStarts_TheLossFloor_AndTheOffloadEnginesCopies) {
  const api::Plan plan = small_plan(
      3, "  parallelism: {offload: window, recompute: full}\n  checkpoint: {intervalSteps: 2}\n");
  ASSERT_EQ(plan.config.offload, api::OffloadMode::kWindow);
  worker::TrainOptions options;
  options.log_every = 0;
  options.checkpoint_dir = temp_path("ckpt");
  std::vector<worker::RunStart> starts;
  std::vector<worker::StepReport> steps;
  options.on_start = [&](const worker::RunStart& s) { starts.push_back(s); };
  options.on_step = [&](const worker::StepReport& r) {
    steps.push_back(r);
    if (r.step == 2) worker::request_stop();
  };
  worker::train(plan, options, [](const std::string&) {});
  options.on_step = [&](const worker::StepReport& r) { steps.push_back(r); };
  worker::train(plan, options, [](const std::string&) {});

  ASSERT_EQ(starts.size(), 2u);
  EXPECT_EQ(starts[0].resumed_from, 0);
  EXPECT_EQ(starts[1].resumed_from, 2);
  const worker::SyntheticMarkov chain(static_cast<int>(plan.model.vocab), 1, 8,
                                      static_cast<uint64_t>(plan.training.seed), 0, 1);
  ASSERT_TRUE(starts[0].loss_floor.has_value());
  EXPECT_DOUBLE_EQ(*starts[0].loss_floor, chain.entropy_rate());
  ASSERT_EQ(steps.size(), 3u);
  for (const auto& r : steps) {
    EXPECT_GT(r.h2d_bytes, 0) << "window offload streams every layer";
    EXPECT_GT(r.transfer_seconds, 0.0) << "step " << r.step;
    EXPECT_GE(r.exposed_transfer_seconds, 0.0);
    EXPECT_LE(r.exposed_transfer_seconds, r.seconds);
  }
  fs::remove_all(options.checkpoint_dir);
}

}  // namespace
}  // namespace kt

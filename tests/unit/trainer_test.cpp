// The training loop end to end on the CPU: it learns the synthetic chain down to its entropy
// rate, resumes from a checkpoint with exactly the same losses, and refuses plans it cannot run.
#include "worker/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <numeric>
#include <string>

#include "api/error.h"
#include "planner/planner.h"
#include "test_util.h"
#ifdef KUBETRAIN_WITH_CUDA
#include "worker/cuda_device.h"
#include "worker/gradient_reducer.h"
#endif
#include "worker/checkpoint.h"
#include "worker/data.h"

namespace kt {
namespace {

namespace fs = std::filesystem;

api::Plan tiny_plan(int steps, const std::string& extra = "", int global_batch = 16) {
  const auto job = test::job_from_yaml(
      "apiVersion: kubetrain.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: tiny}\nspec:\n"
      "  model: {preset: tiny}\n"
      "  training: {steps: " +
      std::to_string(steps) + ", globalBatchSize: " + std::to_string(global_batch) +
      ", learningRate: 0.005, warmupSteps: 20, seed: 7}\n" +
      (extra.find("resources:") == std::string::npos ? "  resources: {gpusPerNode: 1}\n" : "") +
      extra);
  return planner::best_plan(job, test::cluster("cpu-local"));
}

std::string temp_dir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() /
      ("kt-" + name + "-" + std::to_string(::getpid()) + "-" + std::to_string(std::rand()));
  fs::remove_all(dir);
  return dir.string();
}

void quiet(const std::string&) {}

TEST(Trainer, LearnsTheSyntheticChainDownToItsEntropyRate) {
  const api::Plan plan = tiny_plan(800, "", 32);
  worker::TrainOptions options;
  options.log_every = 0;
  const auto result = worker::train(plan, options, quiet);
  ASSERT_EQ(result.losses.size(), 800u);
  // The same generator the trainer uses (worker/trainer.cpp: order 1, 8 successors).
  const worker::SyntheticMarkov chain(static_cast<int>(plan.model.vocab), 1, 8,
                                      static_cast<uint64_t>(plan.training.seed), 0, 1);
  const double entropy = chain.entropy_rate();
  const double last = std::accumulate(result.losses.end() - 20, result.losses.end(), 0.0) / 20;
  EXPECT_LT(result.losses.front(), std::log(256.0) + 0.1);
  EXPECT_LT(last - entropy, 0.15) << "mean loss of the last 20 steps " << last << ", entropy rate "
                                  << entropy;
  EXPECT_GT(last - entropy, -0.05) << "a loss below the entropy rate means the data leak";
}

TEST(Trainer, ResumeContinuesWithIdenticalLosses) {
  const api::Plan plan = tiny_plan(24, "  checkpoint: {intervalSteps: 5, keep: 2}\n");
  worker::TrainOptions straight;
  straight.log_every = 0;
  straight.checkpoint_dir = temp_dir("straight");
  const auto reference = worker::train(plan, straight, quiet);

  worker::TrainOptions interrupted = straight;
  interrupted.checkpoint_dir = temp_dir("interrupted");
  interrupted.on_step = [](const worker::StepReport& r) {
    if (r.step == 13) worker::request_stop();  // like SIGTERM during step 13
  };
  const auto first = worker::train(plan, interrupted, quiet);
  EXPECT_TRUE(first.interrupted);
  EXPECT_EQ(first.steps_done, 13);
  interrupted.on_step = nullptr;
  const auto second = worker::train(plan, interrupted, quiet);
  EXPECT_FALSE(second.interrupted);
  EXPECT_EQ(second.steps_done, 24);
  ASSERT_EQ(first.losses.size() + second.losses.size(), reference.losses.size());
  for (size_t i = 0; i < reference.losses.size(); ++i) {
    const double got =
        i < first.losses.size() ? first.losses[i] : second.losses[i - first.losses.size()];
    EXPECT_EQ(got, reference.losses[i]) << "step " << i + 1;
  }
  // Run again with nothing left to do: no step, and the final loss is the last checkpoint's
  // (it was 0, so that `kubetrain run` of a finished job said "loss ... -> 0.0000").
  const auto again = worker::train(plan, interrupted, quiet);
  EXPECT_EQ(again.steps_done, 24);
  EXPECT_TRUE(again.losses.empty());
  EXPECT_FLOAT_EQ(again.last_loss, reference.last_loss);
  fs::remove_all(straight.checkpoint_dir);
  fs::remove_all(interrupted.checkpoint_dir);
}

// A full disk during training (latest.tmp is /dev/full: writes fail with ENOSPC, also for root):
// the failure is reported with its errno, training goes on, and the next interval saves again.
TEST(Trainer, FailedCheckpointWrite_IsReported_TrainingGoesOn_AndTheNextIntervalSavesAgain) {
  const api::Plan plan = tiny_plan(15, "  checkpoint: {intervalSteps: 5, keep: 2}\n");
  worker::TrainOptions options;
  options.log_every = 0;
  options.checkpoint_dir = temp_dir("disk-full");
  fs::create_directories(options.checkpoint_dir);
  const std::string full = options.checkpoint_dir + "/latest.tmp";
  fs::create_symlink("/dev/full", full);
  std::vector<std::pair<int64_t, std::string>> failures;
  std::vector<int64_t> saved;
  options.on_checkpoint_failure = [&](int64_t step, const std::string& reason,
                                      const std::string& message) {
    failures.emplace_back(step, reason);
    EXPECT_NE(message.find("No space left on device"), std::string::npos) << message;
    fs::remove(full);  // space again before the next interval
  };
  options.on_checkpoint = [&](int64_t step, double) { saved.push_back(step); };
  std::vector<std::string> lines;
  const auto result =
      worker::train(plan, options, [&](const std::string& line) { lines.push_back(line); });
  EXPECT_EQ(result.steps_done, 15);
  EXPECT_EQ(failures, (std::vector<std::pair<int64_t, std::string>>{{5, "ENOSPC"}}));
  EXPECT_EQ(saved, (std::vector<int64_t>{10, 15}));
  EXPECT_EQ(result.checkpoint_failures, 1);
  EXPECT_EQ(result.checkpoint_error, "") << "the last save succeeded";
  bool logged = false;
  for (const auto& line : lines) logged |= line.find("checkpoint at step 5 failed (ENOSPC") == 0;
  EXPECT_TRUE(logged);

  // Stopped (SIGTERM) while the disk is full: interrupted as usual (the worker exits 143), the
  // failure recorded.
  fs::remove_all(options.checkpoint_dir);
  fs::create_directories(options.checkpoint_dir);
  fs::create_symlink("/dev/full", full);
  options.on_checkpoint_failure = nullptr;
  options.on_step = [](const worker::StepReport& r) {
    if (r.step == 3) worker::request_stop();
  };
  const auto stopped = worker::train(plan, options, quiet);
  EXPECT_TRUE(stopped.interrupted);
  EXPECT_EQ(stopped.steps_done, 3);
  EXPECT_NE(stopped.checkpoint_error.find("No space left on device"), std::string::npos);
  fs::remove_all(options.checkpoint_dir);
}

TEST(Trainer, SecondWriterToACheckpointDirectory_IsRefused) {
  const api::Plan plan = tiny_plan(5, "  checkpoint: {intervalSteps: 5, keep: 2}\n");
  worker::TrainOptions options;
  options.log_every = 0;
  options.checkpoint_dir = temp_dir("locked");
  options.checkpoint_lock_wait = std::chrono::milliseconds(0);
  {
    const auto other =
        worker::CheckpointLock::acquire(options.checkpoint_dir, std::chrono::milliseconds(0));
    try {
      worker::train(plan, options, quiet);
      FAIL() << "trained into a directory another writer holds";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("is in use by another writer"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(worker::train(plan, options, quiet).steps_done, 5) << "free once the holder is gone";
  fs::remove_all(options.checkpoint_dir);
}

// A plan edited by hand (with its hash recomputed) is checked as strictly as the planner checks
// a job: each value it would never emit is a field error naming the plan's field.
TEST(Trainer, RefusesPlanValuesThePlannerNeverEmits_NamingTheField) {
  auto expect_field = [](const api::Plan& plan, const std::string& path, const std::string& words) {
    try {
      worker::check_plan_values(plan);
      FAIL() << "expected " << path << ": " << words;
    } catch (const FieldError& e) {
      EXPECT_EQ(e.path(), path) << e.what();
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  const api::Plan good = tiny_plan(10);
  EXPECT_NO_THROW(worker::check_plan_values(good));
  api::Plan p = good;
  p.cpu_threads = 100000;
  expect_field(p, "plan.offload.cpuThreads", "100000 is not in [1, 4096]");
  p = good;
  p.model.heads = 128;  // hidden 64
  expect_field(p, "plan.model.heads", "128 does not divide hidden 64");
  p = good;
  p.model.seq_len = 1000000000;
  expect_field(p, "plan.model.seqLen", "1000000000 exceeds the limit");
  p = good;
  p.config.micro_batch = int64_t{1} << 40;
  expect_field(p, "plan.batch.micro", "is not in [1, 16777216]");
  p = good;
  p.config.tp = 3;
  p.config.dp = 1;
  p.world = 3;
  expect_field(p, "plan.tp", "3 does not divide the model's heads 4");
  p = good;
  p.training.learning_rate = std::nan("");
  expect_field(p, "plan.training.learningRate", "finite");
  p = good;
  p.checkpoint.keep = 0;
  expect_field(p, "plan.checkpoint.keep", "must be >= 1");
  p = good;
  p.model.seq_len = int64_t{1} << 20;       // both at their limits: B·NH·T² attention scores of
  p.config.micro_batch = int64_t{1} << 24;  // 2^71 bytes
  expect_field(p, "plan.model", "beyond what any machine addresses");

  // Within every bound, but more than this machine's memory: refused before an allocation
  // could be an OOM kill (on the CPU, whose device memory this is).
  p = good;
  p.model.seq_len = 1000000;
  try {
    worker::check_executable(p);
    FAIL() << "a plan of petabytes was accepted";
  } catch (const FieldError& e) {
    EXPECT_EQ(e.path(), "plan.model");
    EXPECT_NE(std::string(e.what()).find("seqLen 1000000 and batch.micro"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("more than this machine's"), std::string::npos)
        << e.what();
  }
}

TEST(Trainer, RefusesPlansItCannotExecute) {
  auto expect_refusal = [](const api::Plan& plan, const std::string& words) {
    try {
      worker::check_executable(plan);
      FAIL() << "expected a refusal mentioning " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  // The same plan for CUDA ranks (bf16, as the CUDA workers run).
  auto on_cuda = [](api::Plan plan) {
    plan.device = api::DeviceKind::kCuda;
    plan.precision = api::Precision::kBf16;
    return plan;
  };
  // A GPU plan the CUDA workers run (the worker built without CUDA refuses it for that alone).
  auto expect_runs_on_cuda = [](const api::Plan& plan) {
#ifdef KUBETRAIN_WITH_CUDA
    EXPECT_NO_THROW(worker::check_executable(plan));
#endif
    EXPECT_EQ(api::not_yet_executable(plan), "");
  };
  // Pipeline stages run on CPU and CUDA ranks without offload, with offload optimizer or with
  // the window, and only where the stages divide the layers and the ranks make up the world.
  api::Plan staged = tiny_plan(10);
  staged.config.pp = 2;
  expect_refusal(staged, "tp × dp × pp = 2 ≠ world 1");
  staged.world = 2;
  EXPECT_NO_THROW(worker::check_executable(staged));
  api::Plan staged_offload =
      tiny_plan(10, "  parallelism: {offload: optimizer, gpuUpdateFraction: 0.5}\n");
  staged_offload.config.pp = 2;
  staged_offload.world = 2;
  staged_offload.config.gpu_units = 1;  // of each stage's 2 units
  EXPECT_NO_THROW(worker::check_executable(staged_offload));
  staged_offload.config.gpu_units = 3;
  expect_refusal(staged_offload, "offload gpuUnits 3 is not in [0, 2] (a stage's units)");
  api::Plan staged_window = tiny_plan(10, "  parallelism: {offload: window, recompute: full}\n");
  staged_window.config.pp = 2;
  staged_window.world = 2;
  staged_window.config.gpu_units = 1;  // the stage's copy of the embeddings; its layer streams
  staged_window.config.window = 1;
  EXPECT_NO_THROW(worker::check_executable(staged_window));
  api::Plan staged_gpu_window = on_cuda(staged_window);
  expect_runs_on_cuda(staged_gpu_window);
  staged_window.config.gpu_units = 2;  // nothing of the stage's 1 layer left to stream
  expect_refusal(staged_window, "window offload needs the embeddings on the device, at least one "
                                "streamed layer and one slot (gpuUnits 2, window 1)");

  api::Plan staged_gpu = on_cuda(staged);
#ifdef KUBETRAIN_WITH_CUDA
  EXPECT_NO_THROW(worker::check_executable(staged_gpu));
#endif
  api::Plan staged_gpu_offload = on_cuda(staged_offload);
  staged_gpu_offload.config.gpu_units = 2;
  expect_runs_on_cuda(staged_gpu_offload);
  // A cutpoint runs on CPU and CUDA ranks without stages or offload (with or without the
  // distributed optimizer), where its TP degree nests with the plan's and splits the micro-batch.
  api::Plan cut = tiny_plan(10);
  cut.world = 2;
  cut.config.dp = 2;
  cut.global_batch *= 2;
  cut.config.cut_layer = 1;
  cut.config.cut_tp = 2;
  EXPECT_NO_THROW(worker::check_executable(cut));
  api::Plan cut_gpu = on_cuda(cut);
  expect_runs_on_cuda(cut_gpu);
  api::Plan cut_zero = cut;
  cut_zero.config.distributed_optimizer = true;
  EXPECT_NO_THROW(worker::check_executable(cut_zero));
  // With offload optimizer too, where the embeddings' unit stays on the device (each segment its
  // part of the model's units), and with the window; not with the embeddings on the CPU.
  api::Plan cut_gpu_offload = cut_gpu;
  cut_gpu_offload.config.offload = api::OffloadMode::kOptimizer;
  cut_gpu_offload.config.gpu_units = 1;
  expect_runs_on_cuda(cut_gpu_offload);
  api::Plan cut_offload =
      tiny_plan(10, "  parallelism: {offload: optimizer, gpuUpdateFraction: 0.5}\n", 32);
  cut_offload.world = 2;
  cut_offload.config.dp = 2;
  cut_offload.global_batch *= 2;
  cut_offload.config.cut_layer = 1;
  cut_offload.config.cut_tp = 2;
  ASSERT_GE(cut_offload.config.gpu_units, 1);
  EXPECT_NO_THROW(worker::check_executable(cut_offload));
  api::Plan cut_cpu_embeddings = cut_offload;
  cut_cpu_embeddings.config.gpu_units = 0;
  expect_refusal(cut_cpu_embeddings, "sum a cutpoint's embeddings over every rank on the device");
  api::Plan cut_window = cut_offload;  // each segment streaming its layers past its device units
  cut_window.config.offload = api::OffloadMode::kWindow;
  cut_window.config.window = 1;
  cut_window.config.gpu_units = 1;
  expect_refusal(cut_window, "window offload streams each layer's activation checkpoint");
  cut_window.config.recompute = api::Recompute::kFull;
  EXPECT_NO_THROW(worker::check_executable(cut_window));
  api::Plan cut_gpu_window = on_cuda(cut_window);
  expect_runs_on_cuda(cut_gpu_window);
  api::Plan cut_same = cut;
  cut_same.config.cut_tp = 1;
  expect_refusal(cut_same, "cutpoint at layer 1 to TP 1 after TP 1");
  api::Plan cut_outside = cut;
  cut_outside.config.cut_layer = 2;
  expect_refusal(cut_outside, "plan.cutpoint.layer: 2 is not in [1, 1]");
  api::Plan three = tiny_plan(10);  // 2 layers
  three.config.pp = 3;
  three.world = 3;
  expect_refusal(three, "3 pipeline stages do not divide the model's 2 layers");
  // The distributed optimizer runs on CPU and CUDA ranks without offload, with offload optimizer
  // or with the window.
  api::Plan sharded = tiny_plan(10);
  sharded.config.distributed_optimizer = true;
  EXPECT_NO_THROW(worker::check_executable(sharded));
  api::Plan sharded_offload =
      tiny_plan(10, "  parallelism: {offload: optimizer, gpuUpdateFraction: 0.5}\n");
  sharded_offload.config.distributed_optimizer = true;
  EXPECT_NO_THROW(worker::check_executable(sharded_offload));
  api::Plan sharded_window = tiny_plan(10, "  parallelism: {offload: window, recompute: full}\n");
  sharded_window.config.distributed_optimizer = true;
  EXPECT_NO_THROW(worker::check_executable(sharded_window));
  api::Plan sharded_gpu_window = on_cuda(sharded_window);
  expect_runs_on_cuda(sharded_gpu_window);
  api::Plan sharded_gpu = on_cuda(sharded);
#ifdef KUBETRAIN_WITH_CUDA
  EXPECT_NO_THROW(worker::check_executable(sharded_gpu));
#endif
  api::Plan sharded_gpu_offload = on_cuda(sharded_offload);
  expect_runs_on_cuda(sharded_gpu_offload);
  api::Plan window = tiny_plan(10, "  parallelism: {offload: window, recompute: full}\n");
  window.config.recompute = api::Recompute::kNone;
  expect_refusal(window, "needs recompute");
  EXPECT_NO_THROW(worker::check_executable(
      tiny_plan(10, "  parallelism: {offload: optimizer, gpuUpdateFraction: 0.5}\n")));
  EXPECT_NO_THROW(worker::check_executable(tiny_plan(10)));

  // device: cuda — one GPU per rank (DP, TP with or without the overlap), bf16, any recompute,
  // every offload mode.
  api::Plan gpu = on_cuda(tiny_plan(10));
#ifdef KUBETRAIN_WITH_CUDA
  EXPECT_NO_THROW(worker::check_executable(gpu));
  api::Plan fp32 = gpu;
  fp32.precision = api::Precision::kFp32;
  expect_refusal(fp32, "trains in bf16");
  for (api::Recompute mode : {api::Recompute::kFull, api::Recompute::kCommAware}) {
    api::Plan recompute = gpu;
    recompute.config.recompute = mode;
    EXPECT_NO_THROW(worker::check_executable(recompute));
  }
  api::Plan window_gpu = gpu;  // streams layers through slots; needs recompute, as on the CPU
  window_gpu.config.offload = api::OffloadMode::kWindow;
  window_gpu.config.gpu_units = 1;
  window_gpu.config.window = 1;
  expect_refusal(window_gpu, "needs recompute");
  window_gpu.config.recompute = api::Recompute::kFull;
  EXPECT_NO_THROW(worker::check_executable(window_gpu));
  api::Plan data_parallel = gpu;  // one GPU per rank, gradients summed by NCCL or the host
  data_parallel.world = 2;
  data_parallel.config.dp = 2;
  data_parallel.global_batch *= 2;
  EXPECT_NO_THROW(worker::check_executable(data_parallel));
  api::Plan tensor_parallel = gpu;  // Megatron TP, all-reduces not overlapped
  tensor_parallel.world = 2;
  tensor_parallel.config.tp = 2;
  EXPECT_NO_THROW(worker::check_executable(tensor_parallel));
  api::Plan overlapped = tensor_parallel;  // the Oases schedule: 2 lanes
  overlapped.config.sub_batches = 2;
  EXPECT_NO_THROW(worker::check_executable(overlapped));
  overlapped.config.sub_batches = 3;
  expect_refusal(overlapped, "2 sub-batches of an even micro-batch");
#else
  expect_refusal(gpu, "built without the CUDA path");
#endif
}

#ifdef KUBETRAIN_WITH_CUDA
// A CUDA plan goes to the CUDA runtime: where there is no GPU (CI) the worker says so and why;
// on a GPU machine it trains (the GPU checks themselves are tests/gpu).
TEST(Trainer, CudaPlanNeedsAGpuAndSaysWhy) {
  api::Plan gpu = tiny_plan(2);
  gpu.device = api::DeviceKind::kCuda;
  gpu.precision = api::Precision::kBf16;
  worker::TrainOptions options;
  options.log_every = 0;
  if (worker::CudaDevice::device_count() == 0) {
    try {
      worker::train(gpu, options, [](const std::string&) {});
      FAIL() << "a CUDA plan trained without a CUDA device";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no usable CUDA device"), std::string::npos)
          << e.what();
    }
  } else {
    const auto result = worker::train(gpu, options, [](const std::string&) {});
    EXPECT_EQ(result.steps_done, 2);
    EXPECT_TRUE(std::isfinite(result.last_loss));
  }
}
#endif

#ifdef KUBETRAIN_WITH_CUDA
// The DP reducer choice every rank makes from the gathered facts: NCCL only with one GPU per rank
// and libnccl everywhere; forcing NCCL where it cannot run is an error that says why.
TEST(Trainer, DataParallelCudaPicksNcclOnlyWithOneGpuPerRank) {
  const std::vector<std::vector<float>> own = {{1, 2}, {1, 3}, {4, 2}};
  const std::vector<std::vector<float>> shared = {{1, 2}, {5, 6}, {1, 2}};
  EXPECT_EQ(worker::choose_reducer("auto", own, "").backend, "nccl");
  const auto on_shared = worker::choose_reducer("auto", shared, "");
  EXPECT_EQ(on_shared.backend, "host");
  EXPECT_EQ(on_shared.reason, "ranks 0 and 2 share a GPU");
  const auto no_lib = worker::choose_reducer("auto", own, "cannot load libnccl.so.2");
  EXPECT_EQ(no_lib.backend, "host");
  EXPECT_EQ(no_lib.reason, "cannot load libnccl.so.2");
  EXPECT_EQ(worker::choose_reducer("host", own, "").backend, "host");
  EXPECT_EQ(worker::choose_reducer("nccl", own, "").backend, "nccl");
  auto expect_error = [](const std::string& mode, const std::vector<std::vector<float>>& keys,
                         const std::string& words) {
    try {
      worker::choose_reducer(mode, keys, "");
      FAIL() << "expected an error mentioning " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  expect_error("nccl", shared, "share a GPU");
  expect_error("gloo", own, "expected nccl, host or auto");
}
#endif

TEST(Trainer, LearningRateWarmsUpThenDecaysToATenth) {
  api::TrainingSpec t;
  t.steps = 110;
  t.learning_rate = 1e-3;
  t.warmup_steps = 10;
  EXPECT_DOUBLE_EQ(worker::learning_rate_at(t, 0), 1e-4);
  EXPECT_DOUBLE_EQ(worker::learning_rate_at(t, 9), 1e-3);
  EXPECT_NEAR(worker::learning_rate_at(t, 10), 1e-3, 1e-12);
  EXPECT_NEAR(worker::learning_rate_at(t, 109), 1e-4, 1e-12);
  for (int64_t s = 11; s < 110; ++s)
    EXPECT_LE(worker::learning_rate_at(t, s), worker::learning_rate_at(t, s - 1));
}

}  // namespace
}  // namespace kt

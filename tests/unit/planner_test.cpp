#include "planner/planner.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "api/error.h"
#include "api/quantity.h"
#include "test_util.h"
#include "tests/support/random.h"

namespace kt {
namespace {

using api::OffloadMode;
using api::Recompute;

const char* kGpt1_2b = "{layers: 24, hidden: 2048, heads: 16, vocab: 50257, seqLen: 1024}";
const char* kGpt5b = "{layers: 24, hidden: 4096, heads: 32, vocab: 50257, seqLen: 1024}";

const api::Alternative& alternative(const api::Plan& plan, const std::string& name) {
  for (const auto& a : plan.alternatives)
    if (a.name == name) return a;
  throw std::runtime_error("no alternative " + name);
}

std::string plan_error(const api::TrainingJob& job, const api::Inventory& inv) {
  try {
    planner::best_plan(job, inv);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// One node group with the given GPU product and overrides.
api::Inventory gpu_cluster(const std::string& product, int nodes, int gpus, double memory_gib,
                           double pcie_gbps, double busbw_gbps, double inter_gbps) {
  char yaml[1024];
  std::snprintf(yaml, sizeof yaml,
                "kind: Inventory\nnodes:\n- name: n\n  replicas: %d\n"
                "  gpu: {product: %s, count: %d, memory: %.3fGi}\n  cpu: {cores: 32}\n"
                "  memory: 512Gi\n  annotations: {kubetrain.dev/pcie-gbps: '%g', "
                "kubetrain.dev/intra-busbw-gbps: '%g', kubetrain.dev/inter-node-gbps: '%g'}\n",
                nodes, product.c_str(), gpus, memory_gib, pcie_gbps, busbw_gbps, inter_gbps);
  return test::inventory_from_yaml(yaml);
}

TEST(Planner, OnTheOasesTestbedA1_2bGptOverlapsAndBeatsMegatronBy1_3x) {
  const auto job = test::gpt_job(kGpt1_2b);
  const auto plan = planner::best_plan(job, test::cluster("3090x32-pcie"));
  EXPECT_EQ(plan.config.sub_batches, 2) << "expected the overlapped schedule";
  EXPECT_GT(plan.config.tp, 1);
  const auto& megatron = alternative(plan, "megatron");
  ASSERT_TRUE(megatron.feasible) << megatron.reason;
  EXPECT_EQ(megatron.config.tp, 4);
  EXPECT_EQ(megatron.config.sub_batches, 1);
  EXPECT_GE(plan.predicted.tokens_per_second, 1.3 * megatron.predicted.tokens_per_second);
  // The chosen plan is never slower than any baseline: they are points of the same space.
  for (const auto& a : plan.alternatives) {
    if (a.feasible) {
      EXPECT_GE(plan.predicted.tokens_per_second, a.predicted.tokens_per_second * (1 - 1e-9))
          << a.name;
    }
  }
}

TEST(Planner, OnOneV100A5bGptNeedsWindowOffload) {
  const auto v100 = test::cluster("v100-32gb-single");
  const std::string none =
      plan_error(test::gpt_job(kGpt5b, "  parallelism: {offload: none}\n", 8), v100);
  EXPECT_NE(none.find("no plan fits"), std::string::npos) << none;
  EXPECT_NE(none.find("per GPU with the best plan"), std::string::npos) << none;
  const auto plan =
      planner::best_plan(test::gpt_job(kGpt5b, "  parallelism: {offload: window}\n", 8), v100);
  EXPECT_EQ(plan.config.offload, OffloadMode::kWindow);
  EXPECT_LE(plan.predicted.memory.total(), plan.predicted.device_capacity_bytes);
  int64_t streamed = 0;
  for (const auto& l : plan.layers) streamed += l.resident ? 0 : 1;
  EXPECT_GT(streamed, 0);
  EXPECT_LT(plan.config.window, streamed);
  // Left to itself the planner offloads too.
  EXPECT_NE(planner::best_plan(test::gpt_job(kGpt5b, "", 8), v100).config.offload,
            OffloadMode::kNone);
}

TEST(Planner, OnOneH200Gpt2SmallNeedsNoOffload) {
  const auto plan =
      planner::best_plan(test::gpt_job("{preset: gpt2-124m}"), test::cluster("h200-single"));
  EXPECT_EQ(plan.config.offload, OffloadMode::kNone);
  EXPECT_EQ(plan.world, 1);
  EXPECT_EQ(plan.device, api::DeviceKind::kCuda);
  EXPECT_EQ(plan.precision, api::Precision::kBf16);
  EXPECT_DOUBLE_EQ(plan.gpu_update_fraction, 1.0);
}

TEST(Planner, MoreMemoryBandwidthOrFasterLinksNeverPredictSlower) {
  struct Case {
    const char* model;
    std::string product;
    int nodes, gpus, batch;
    double memory, pcie, busbw, inter;
  };
  const Case cases[] = {
      {kGpt1_2b, "RTX-3090", 2, 4, 64, 24, 25, 10, 12.5},
      {kGpt5b, "V100-SXM2-32GB", 1, 1, 8, 32, 12, 130, 50},
      {"{preset: gpt-7b}", "A100-SXM-80GB", 2, 8, 64, 40, 25, 230, 25},
  };
  for (const auto& c : cases) {
    const auto job = test::gpt_job(c.model, "", c.batch);
    const double base = planner::best_plan(job, gpu_cluster(c.product, c.nodes, c.gpus, c.memory,
                                                            c.pcie, c.busbw, c.inter))
                            .predicted.tokens_per_second;
    const double scales[] = {1.25, 1.5, 2.0, 4.0};
    for (double k : scales) {
      SCOPED_TRACE(c.product + " ×" + std::to_string(k));
      const double more_memory =
          planner::best_plan(
              job, gpu_cluster(c.product, c.nodes, c.gpus, c.memory * k, c.pcie, c.busbw, c.inter))
              .predicted.tokens_per_second;
      const double more_pcie =
          planner::best_plan(
              job, gpu_cluster(c.product, c.nodes, c.gpus, c.memory, c.pcie * k, c.busbw, c.inter))
              .predicted.tokens_per_second;
      const double more_busbw =
          planner::best_plan(
              job, gpu_cluster(c.product, c.nodes, c.gpus, c.memory, c.pcie, c.busbw * k, c.inter))
              .predicted.tokens_per_second;
      const double more_inter =
          planner::best_plan(
              job, gpu_cluster(c.product, c.nodes, c.gpus, c.memory, c.pcie, c.busbw, c.inter * k))
              .predicted.tokens_per_second;
      EXPECT_GE(more_memory, base * (1 - 1e-12));
      EXPECT_GE(more_pcie, base * (1 - 1e-12));
      EXPECT_GE(more_busbw, base * (1 - 1e-12));
      EXPECT_GE(more_inter, base * (1 - 1e-12));
    }
  }
}

TEST(Planner, ExplicitHintsAreObeyed) {
  const auto job = test::gpt_job(
      "{preset: gpt2-350m}",
      "  parallelism: {tensorParallel: 2, overlap: off, recompute: full, offload: optimizer, "
      "gpuUpdateFraction: 0.5}\n  training: {steps: 10, globalBatchSize: 64, microBatchSize: 2}\n"
      "  resources: {maxNodes: 2}\n");
  const auto plan = planner::best_plan(job, test::cluster("h100x32"));
  EXPECT_EQ(plan.config.tp, 2);
  EXPECT_EQ(plan.config.sub_batches, 1);
  EXPECT_EQ(plan.config.recompute, Recompute::kFull);
  EXPECT_EQ(plan.config.offload, OffloadMode::kOptimizer);
  EXPECT_EQ(plan.config.micro_batch, 2);
  EXPECT_LE(plan.config.nodes, 2);
  EXPECT_GE(plan.gpu_update_fraction, 0.5);
  EXPECT_LT(plan.gpu_update_fraction, 0.6);
  EXPECT_EQ(plan.embeddings.update, api::UpdateDevice::kGpu);
  EXPECT_EQ(plan.layers.back().update, api::UpdateDevice::kCpu);
  EXPECT_EQ(plan.world, plan.config.tp * plan.config.dp);
  EXPECT_EQ(static_cast<int64_t>(plan.placement.size()), plan.config.nodes);
}

TEST(Planner, AForcedChoiceThatCannotFitSaysWhy) {
  // gpt-7b without recompute or offload at micro-batch 32 on one H200.
  const auto job =
      test::gpt_job("{preset: gpt-7b}",
                    "  parallelism: {recompute: none, offload: none}\n"
                    "  training: {steps: 10, globalBatchSize: 32, microBatchSize: 32}\n");
  const std::string e = plan_error(job, test::cluster("h200-single"));
  EXPECT_EQ(e.rfind("no plan fits with recompute=none, offload=none, microBatchSize=32: needs ", 0),
            0u)
      << e;
  EXPECT_NE(e.find(" per GPU with the best plan (TP 1 × DP 1, micro-batch 32"), std::string::npos)
      << e;
  EXPECT_NE(e.find("nodes have 141.0 GiB"), std::string::npos) << e;
  // A tensor-parallel degree the node cannot hold.
  const std::string tp =
      plan_error(test::gpt_job("{preset: gpt2-124m}", "  parallelism: {tensorParallel: 4}\n"),
                 test::cluster("h200-single"));
  EXPECT_EQ(tp,
            "spec.parallelism.tensorParallel: 4 does not divide the 1 ranks per node (TP groups "
            "stay inside a node)");
}

// Offload optimizer and the window are planned inside pipeline stages (each stage's units alike),
// the window with virtual stages where the job asks for them.
TEST(Planner, PipelineStagesWithForcedOffloadSayWhatToChange) {
  const api::Plan staged = planner::best_plan(
      test::gpt_job("{preset: tiny}", "  parallelism: {pipelineParallel: 2, offload: optimizer}\n"),
      test::cluster("cpu-local"));
  EXPECT_EQ(staged.config.pp, 2);
  EXPECT_EQ(staged.config.offload, OffloadMode::kOptimizer);
  EXPECT_LE(staged.config.gpu_units, 2);  // of a stage's units: its copy of unit 0, its layer
  EXPECT_EQ(api::not_yet_executable(staged), "");
  // The window too, each stage streaming its own layers (here 2 of a stage's 2)...
  const std::string four = "{layers: 4, hidden: 64, heads: 4, ffnHidden: 256, vocab: 256, seqLen: 32}";
  const api::Plan window = planner::best_plan(
      test::gpt_job(four, "  parallelism: {pipelineParallel: 2, offload: window, recompute: full}\n"),
      test::cluster("cpu-local"));
  EXPECT_EQ(window.config.pp, 2);
  EXPECT_EQ(window.config.offload, OffloadMode::kWindow);
  EXPECT_EQ(window.config.gpu_units, 1);
  EXPECT_EQ(window.config.window, 1);
  EXPECT_EQ(api::not_yet_executable(window), "");
  // ... and with virtual stages where the job asks for them (each chunk streaming its layer).
  const api::Plan interleaved = planner::best_plan(
      test::gpt_job(four,
                    "  parallelism: {pipelineParallel: 2, virtualStages: 2, offload: window, "
                    "recompute: full}\n"),
      test::cluster("cpu-local"));
  EXPECT_EQ(interleaved.config.virtual_stages, 2);
  EXPECT_EQ(interleaved.config.offload, OffloadMode::kWindow);
  EXPECT_EQ(api::not_yet_executable(interleaved), "");
}

// The distributed optimizer with the offload window, where a job asks for both: on CPU ranks and
// on GPUs (CostModel.WindowOffloadWithTheDistributedOptimizer has its host memory).
TEST(Planner, DistributedOptimizerWithTheWindow) {
  const std::string four =
      "{layers: 4, hidden: 64, heads: 4, ffnHidden: 256, vocab: 256, seqLen: 32}";
  const std::string asked =
      "  parallelism: {dataParallel: 2, offload: window, recompute: full, distributedOptimizer: ";
  const api::Plan cpu =
      planner::best_plan(test::gpt_job(four, asked + "on}\n"), test::cluster("cpu-local"));
  EXPECT_TRUE(cpu.config.distributed_optimizer);
  EXPECT_EQ(cpu.config.offload, OffloadMode::kWindow);
  EXPECT_EQ(api::not_yet_executable(cpu), "");
  const std::string gpu_asked =
      "  parallelism: {offload: window, recompute: full, "
      "gpuUpdateFraction: 0.5, offloadWindow: 2, distributedOptimizer: ";
  const api::Plan gpu = planner::best_plan(
      test::gpt_job("{preset: gpt-7b}", gpu_asked + "on}\n", 512), test::cluster("3090x32-pcie"));
  EXPECT_TRUE(gpu.config.distributed_optimizer);
  EXPECT_EQ(gpu.config.offload, OffloadMode::kWindow);
  EXPECT_EQ(api::not_yet_executable(gpu), "");
}

// A forced dataParallel that no shape gives names why (a plan's ranks are whole nodes' GPUs) and
// what would work: the tensorParallel that gives it, else the nearest degrees that fit.
TEST(Planner, AForcedDataParallelThatFitsNoShapeSaysWhatWould) {
  const auto inv = gpu_cluster("NVIDIA-H100-80GB-HBM3", 4, 8, 80, 25, 150, 25);
  // gpt2-124m (12 heads): TP 1, 2 or 4 on 8 GPUs, so at least DP 2.
  const std::string one =
      plan_error(test::gpt_job("{preset: gpt2-124m}", "  parallelism: {dataParallel: 1}\n"), inv);
  EXPECT_EQ(one.rfind("no valid configuration with dataParallel=1: dataParallel 1 fits no shape: a "
                      "plan's ranks are its nodes times every free GPU of a node",
                      0),
            0u)
      << one;
  EXPECT_NE(one.find("(8, 16, 24, 32 here)"), std::string::npos) << one;
  EXPECT_NE(one.find("the nearest dataParallel that fits: 2"), std::string::npos) << one;
  // 16 heads (TP up to 8): DP 1 is TP 8 on one node (a plan), unless TP is forced.
  const char* k16Heads = "{layers: 2, hidden: 1024, heads: 16, vocab: 50257, seqLen: 256}";
  const api::Plan dp1 = planner::best_plan(
      test::gpt_job(k16Heads, "  parallelism: {dataParallel: 1}\n"), inv);
  EXPECT_EQ(dp1.config.tp, 8);
  EXPECT_EQ(dp1.config.dp, 1);
  const std::string forced_tp = plan_error(
      test::gpt_job(k16Heads, "  parallelism: {dataParallel: 1, tensorParallel: 2}\n"), inv);
  EXPECT_NE(forced_tp.find("tensorParallel {2}"), std::string::npos) << forced_tp;
  EXPECT_NE(forced_tp.find("the nearest dataParallel that fits: 4"), std::string::npos)
      << forced_tp;
  // 64 ranks of data parallelism are more than the 32 GPUs: 32 is the nearest.
  const std::string many =
      plan_error(test::gpt_job(k16Heads, "  parallelism: {dataParallel: 64}\n"), inv);
  EXPECT_NE(many.find("the nearest dataParallel that fits: 32"), std::string::npos) << many;
}

// offload: window with a gpuUpdateFraction that leaves too few layers to stream names that, not
// the first node count tried (whose batch did not divide): the furthest candidate's reason.
TEST(Planner, WindowWithAFractionThatLeavesNoWindowSaysSo) {
  const auto inv = gpu_cluster("NVIDIA-H100-80GB-HBM3", 4, 8, 80, 25, 150, 25);
  const auto job = test::gpt_job(
      "{preset: tiny}",
      "  parallelism: {offload: window, gpuUpdateFraction: 0.5}\n"
      "  training: {steps: 10, globalBatchSize: 8}\n");
  const std::string e = plan_error(job, inv);
  EXPECT_NE(e.find("offload: window streams 1 of the 2 layers here (gpuUpdateFraction 0.5); a "
                   "window needs at least 2 streamed layers"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("leave gpuUpdateFraction out"), std::string::npos) << e;
  EXPECT_EQ(e.find("not divisible"), std::string::npos) << e;
  // As it says: without the fraction there is a window plan.
  const api::Plan plan = planner::best_plan(
      test::gpt_job("{preset: tiny}",
                    "  parallelism: {offload: window}\n"
                    "  training: {steps: 10, globalBatchSize: 8}\n"),
      inv);
  EXPECT_EQ(plan.config.offload, OffloadMode::kWindow);
}

TEST(Planner, AModelThatFitsNowhereNamesTheNearestMiss) {
  // 60 B parameters with 16 GiB of host memory: neither the GPU nor the host can hold it.
  const auto job =
      test::gpt_job("{layers: 48, hidden: 10240, heads: 80, vocab: 50257, seqLen: 2048}", "", 8);
  const auto inv = test::inventory_from_yaml(
      "kind: Inventory\nnodes:\n- name: small\n  gpu: {product: NVIDIA-L4, count: 1}\n"
      "  cpu: {cores: 8}\n  memory: 16Gi\n");
  const std::string e = plan_error(job, inv);
  EXPECT_EQ(e.rfind("no plan fits: needs ", 0), 0u) << e;
  EXPECT_NE(e.find("with the best plan"), std::string::npos) << e;
}

TEST(Planner, CpuNodesGetCpuPlansForEveryForcedMode) {
  const auto cpu = test::cluster("cpu-local");
  const auto auto_plan = planner::best_plan(test::gpt_job("{preset: tiny}", "", 8), cpu);
  EXPECT_EQ(auto_plan.device, api::DeviceKind::kCpu);
  EXPECT_EQ(auto_plan.precision, api::Precision::kFp32);
  EXPECT_EQ(auto_plan.config.offload, OffloadMode::kNone);
  EXPECT_EQ(auto_plan.hardware, "cpu");

  const char* modes[] = {
      "{tensorParallel: 2}",
      "{tensorParallel: 2, overlap: on}",
      "{tensorParallel: 2, overlap: on, recompute: commAware}",
      "{tensorParallel: 2, recompute: full}",
      "{dataParallel: 2}",
      "{tensorParallel: 2, dataParallel: 1, offload: optimizer, gpuUpdateFraction: 0.5}",
      "{offload: optimizer, gpuUpdateFraction: 0}",
      "{offload: window, offloadWindow: 1}",
      "{dataParallel: 2, offload: window}",
  };
  for (const char* mode : modes) {
    SCOPED_TRACE(mode);
    const auto plan = planner::best_plan(
        test::gpt_job("{preset: tiny}", std::string("  parallelism: ") + mode + "\n", 8), cpu);
    EXPECT_EQ(plan.device, api::DeviceKind::kCpu);
    EXPECT_EQ(plan.world, plan.config.nodes * plan.config.procs_per_node);
    EXPECT_EQ(plan.world, plan.config.tp * plan.config.dp);
    EXPECT_LE(plan.config.procs_per_node, 2);
  }
  const auto window = planner::best_plan(
      test::gpt_job("{preset: tiny}", "  parallelism: {offload: window, offloadWindow: 1}\n", 8),
      cpu);
  EXPECT_EQ(window.config.offload, OffloadMode::kWindow);
  EXPECT_EQ(window.config.window, 1);
  EXPECT_FALSE(window.layers.back().resident);
  const auto overlap = planner::best_plan(
      test::gpt_job("{preset: tiny}", "  parallelism: {tensorParallel: 2, overlap: on}\n", 8), cpu);
  EXPECT_EQ(overlap.config.sub_batches, 2);
  EXPECT_EQ(overlap.config.tp, 2);
}

TEST(Planner, CpuOnlyIgnoresGpus) {
  const auto plan =
      planner::best_plan(test::gpt_job("{preset: tiny}", "  resources: {cpuOnly: true}\n", 8),
                         test::cluster("h200-single"));
  EXPECT_EQ(plan.device, api::DeviceKind::kCpu);
  EXPECT_LE(plan.config.procs_per_node, 16);
}

TEST(Planner, NodeSelectorThatMatchesNothingNamesTheField) {
  try {
    planner::best_plan(
        test::gpt_job("{preset: tiny}", "  resources: {nodeSelector: {pool: x}}\n", 8),
        test::cluster("cpu-local"));
    FAIL();
  } catch (const FieldError& e) {
    EXPECT_EQ(e.path(), "spec.resources.nodeSelector");
  }
}

TEST(Planner, ExplanationSaysWhatBindsAndComparesTheRunnerUp) {
  const auto plan = planner::best_plan(test::gpt_job(kGpt1_2b), test::cluster("3090x32-pcie"));
  ASSERT_GE(plan.explanation.size(), 3u);
  EXPECT_EQ(plan.explanation[0].rfind("Chosen: 8 node(s) × 4 RTX-3090", 0), 0u)
      << plan.explanation[0];
  bool binds = false, runner = false;
  for (const auto& line : plan.explanation) {
    binds |= line.rfind("Memory binds", 0) == 0 || line.rfind("Time binds", 0) == 0;
    runner |= line.rfind("Runner-up: ", 0) == 0;
  }
  EXPECT_TRUE(binds);
  EXPECT_TRUE(runner);
  ASSERT_EQ(plan.alternatives.size(), 4u);
  EXPECT_EQ(plan.alternatives[0].name, "megatron");
  EXPECT_EQ(plan.alternatives[1].name, "zero-offload");
  EXPECT_EQ(plan.alternatives[2].name, "stronghold");
  EXPECT_EQ(plan.alternatives[3].name, "oases");
}

bool explains(const api::Plan& plan, const std::string& prefix) {
  for (const auto& line : plan.explanation)
    if (line.rfind(prefix, 0) == 0) return true;
  return false;
}

TEST(Planner, SaysMemoryBindsWhenARecomputeOrOffloadFreeplanWouldBeFaster) {
  const auto big = planner::best_plan(test::gpt_job("{preset: gpt2-1.5b}", "", 512),
                                      test::cluster("3090x32-pcie"));
  EXPECT_TRUE(explains(big, "Memory binds: ")) << big.explanation[1];
  const auto small = planner::best_plan(test::gpt_job("{preset: gpt2-124m}", "", 64),
                                        test::cluster("h200-single"));
  EXPECT_TRUE(explains(small, "Time binds: ")) << small.explanation[1];
}

TEST(Planner, PlansAreDeterministic) {
  const auto job = test::gpt_job("{preset: gpt2-774m}");
  EXPECT_EQ(planner::best_plan(job, test::cluster("h100x32")).plan_hash,
            planner::best_plan(job, test::cluster("h100x32")).plan_hash);
}

// GPT-3 175B on 128 × 8 H100-80GB (docs/PLANNER.md §15): with TP and DP alone no plan fits (an
// eighth of the model per GPU, the rest offloaded beyond the hosts' memory); with pipeline stages
// and the distributed optimizer it plans, TP inside a node as Megatron-LM does, and says why.
TEST(Planner, Gpt3OnAThousandH100sPlansWithPipelineStagesAndTheDistributedOptimizer) {
  const auto job =
      test::gpt_job("{layers: 96, hidden: 12288, heads: 96, vocab: 50257, seqLen: 2048}", "", 1536);
  const api::Plan plan = planner::best_plan(job, test::cluster("h100x1024"));
  EXPECT_EQ(plan.config.tp, 8);
  EXPECT_GT(plan.config.pp, 1);
  EXPECT_EQ(96 % plan.config.pp, 0);
  EXPECT_EQ(plan.config.tp * plan.config.pp * plan.config.dp, plan.world);
  EXPECT_LE(plan.predicted.memory.total(), plan.predicted.device_capacity_bytes);
  bool said = false, runs = false;
  for (const auto& line : plan.explanation) {
    // (the widened space: stages, the distributed optimizer and cutpoints)
    said |= line.find(
                "No plan without pipeline stages, a distributed optimizer or a cutpoint "
                "fits these nodes: 8 stages") == 0;
    runs |= line.find("refuse") != std::string::npos;
  }
  EXPECT_TRUE(said);
  // The CUDA workers run it (stages and the distributed optimizer, without offload).
  EXPECT_FALSE(runs);
  EXPECT_EQ(plan.config.offload, api::OffloadMode::kNone);
  EXPECT_EQ(api::not_yet_executable(plan), "");
  const auto& megatron = plan.alternatives.front();
  EXPECT_EQ(megatron.name, "megatron");
  EXPECT_TRUE(megatron.feasible) << megatron.reason;
  EXPECT_GT(megatron.config.pp, 1);
  EXPECT_TRUE(megatron.config.distributed_optimizer);
  // The contract carries the stages; it round-trips, and the hash covers them.
  const api::Json doc = api::to_json(plan);
  EXPECT_EQ(doc["pipeline"]["stages"], plan.config.pp);
  const api::Plan back = api::decode_plan(doc);
  EXPECT_EQ(back.config.pp, plan.config.pp);
  EXPECT_EQ(back.config.distributed_optimizer, plan.config.distributed_optimizer);
  api::Plan other = plan;
  other.config.pp = 1;
  EXPECT_NE(api::compute_plan_hash(other), plan.plan_hash);
}

// Virtual stages (the interleaved schedule; docs/PLANNER.md §15): the planner tries every count
// that divides a stage's layers and takes one where it pays — GPT-3 175B in 8 stages with full
// recompute (whose activations leave room for the extra micro-batches in flight): the bubble's
// share of the step falls faster than the transfers grow. Held to 1F1B, the explanation says what
// interleaving would have given; the plan carries the count, and the workers run it.
TEST(Planner, VirtualStagesWhereTheyPay) {
  const std::string model = "{layers: 96, hidden: 12288, heads: 96, vocab: 50257, seqLen: 2048}";
  const std::string forced =
      "  parallelism: {tensorParallel: 8, pipelineParallel: 8, recompute: full";
  const api::Plan interleaved =
      planner::best_plan(test::gpt_job(model, forced + "}\n", 1536), test::cluster("h100x1024"));
  ASSERT_GT(interleaved.config.virtual_stages, 1);
  EXPECT_EQ(12 % interleaved.config.virtual_stages, 0);
  EXPECT_EQ(interleaved.config.grad_accum % 8, 0);
  EXPECT_EQ(api::not_yet_executable(interleaved), "");
  const api::Plan plain = planner::best_plan(
      test::gpt_job(model, forced + ", virtualStages: 1}\n", 1536), test::cluster("h100x1024"));
  EXPECT_EQ(plain.config.virtual_stages, 1);
  EXPECT_LT(interleaved.predicted.step_seconds, plain.predicted.step_seconds);
  // More micro-batches' activations in flight: p + (p − 1)/v stages' worth, not p.
  EXPECT_GT(interleaved.predicted.memory.activations, plain.predicted.memory.activations);
  auto says = [](const api::Plan& plan, const std::string& text) {
    for (const auto& line : plan.explanation)
      if (line.find(text) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(says(interleaved, "virtual stages per pipeline stage cut the bubble"));
  EXPECT_TRUE(says(plain, "Virtual stages would pay"));
  // The contract: pipeline.virtualStages, round-tripped, in the hash.
  const api::Json doc = api::to_json(interleaved);
  EXPECT_EQ(doc["pipeline"]["virtualStages"], interleaved.config.virtual_stages);
  EXPECT_EQ(api::decode_plan(doc).config.virtual_stages, interleaved.config.virtual_stages);
  api::Plan other = interleaved;
  other.config.virtual_stages = 1;
  EXPECT_NE(api::compute_plan_hash(other), interleaved.plan_hash);
  // Without full recompute the extra activations do not fit next to the 1F1B plan's 77.8 GiB.
  const api::Plan tight =
      planner::best_plan(test::gpt_job(model, "", 1536), test::cluster("h100x1024"));
  EXPECT_EQ(tight.config.virtual_stages, 1);
  EXPECT_TRUE(says(tight, "Virtual stages would cut the bubble"));
}
// A virtual-stage count the job fixes must fit the stages: named in the error.
TEST(Planner, VirtualStagesThatDoNotDivideAreRefusedByField) {
  const auto errors = api::validate(test::gpt_job(
      "{preset: gpt2-124m}", "  parallelism: {pipelineParallel: 4, virtualStages: 2}\n"));
  ASSERT_EQ(errors.size(), 1u) << "12 layers in 4 × 2 chunks accepted";
  EXPECT_EQ(errors[0].path(), "spec.parallelism.virtualStages");
  EXPECT_NE(errors[0].problem().find("do not divide the model's 12 layers"), std::string::npos)
      << errors[0].problem();
}

// The megatron baseline shards the optimizer (and adds stages) where Megatron-LM would, which
// the first tier of the search leaves out; where it beats that tier's best the widened space is
// searched too, so that no feasible baseline is faster than the chosen plan. GPT-2 XL on the
// Oases testbed: offload optimizer alone no longer fits with fp32 gradients; the sharded
// optimizer with every shard updated on the CPU does, faster than the megatron baseline. GPT-3
// 175B with 4 TiB per node: the window plan that fits without stages is half the speed of the
// megatron baseline's stages; the widened search takes stages.
TEST(Planner, NoBaselineIsFasterThanTheChosenPlan_WidenedWhereOneWas) {
  const auto xl = planner::best_plan(test::gpt_job("{preset: gpt2-1.5b}", "", 512),
                                     test::cluster("3090x32-pcie"));
  EXPECT_TRUE(xl.config.distributed_optimizer);
  bool said = false;
  for (const auto& line : xl.explanation)
    said |= line.find(
                "The megatron baseline beat every plan without pipeline stages or a "
                "distributed optimizer") == 0;
  EXPECT_TRUE(said);
  api::TrainingJob gpt3 =
      test::gpt_job("{layers: 96, hidden: 12288, heads: 96, vocab: 50257, seqLen: 2048}", "", 1536);
  api::Inventory roomy = test::cluster("h100x1024");
  for (auto& node : roomy.nodes) node.memory_bytes = 4.0 * 1024 * 1024 * 1024 * 1024;
  const auto big = planner::best_plan(gpt3, roomy);
  EXPECT_GT(big.config.pp, 1);
  for (const api::Plan& plan : {xl, big}) {
    for (const auto& a : plan.alternatives) {
      if (!a.feasible) continue;
      EXPECT_GE(plan.predicted.tokens_per_second, a.predicted.tokens_per_second * (1 - 1e-9))
          << a.name;
    }
  }
}

// Where a plan without them fits (and no baseline beats it), there are no stages and no sharded
// optimizer — and the plan's document has neither key (so plans made before they existed keep
// their hash).
TEST(Planner, PipelinesOnlyWhereNothingElseFits_OrWhenAsked) {
  const auto inv = gpu_cluster("NVIDIA-H100-80GB-HBM3", 4, 8, 80, 25, 150, 25);
  const api::Plan plain = planner::best_plan(test::gpt_job("{preset: gpt-7b}", "", 64), inv);
  EXPECT_EQ(plain.config.pp, 1);
  EXPECT_FALSE(plain.config.distributed_optimizer);
  const api::Json doc = api::to_json(plain);
  EXPECT_FALSE(doc.contains("pipeline"));
  EXPECT_FALSE(doc.contains("distributedOptimizer"));
  const api::Plan asked = planner::best_plan(
      test::gpt_job("{preset: gpt-7b}",
                    "  parallelism: {pipelineParallel: 4, distributedOptimizer: on}\n", 64),
      inv);
  EXPECT_EQ(asked.config.pp, 4);
  EXPECT_TRUE(asked.config.distributed_optimizer);
}

// Oases' cutpoint: GPT-7B on 4 × 8 H100s (examples/clusters/h100x32.yaml), global batch 2048. With
// `cutpoint: on` the search tries every layer and every other TP degree that nests, and finds a
// model split between two degrees predicted faster than any single degree; unset, a plan that fits
// without one has none; forced values are obeyed; the plan says it, and round-trips as the worker
// reads it.
TEST(Planner, CutpointsWhereAsked_SplitTheModelBetweenTwoTensorParallelDegrees) {
  const auto inv = test::cluster("h100x32");
  const api::Plan plain = planner::best_plan(test::gpt_job("{preset: gpt-7b}", "", 2048), inv);
  EXPECT_EQ(plain.config.cut_layer, 0);
  EXPECT_FALSE(api::to_json(plain).contains("cutpoint"));
  const api::Plan cut = planner::best_plan(
      test::gpt_job("{preset: gpt-7b}", "  parallelism: {cutpoint: on}\n", 2048), inv);
  ASSERT_GT(cut.config.cut_layer, 0);
  EXPECT_NE(cut.config.cut_tp, cut.config.tp);
  EXPECT_LT(cut.predicted.step_seconds, plain.predicted.step_seconds);
  bool explained = false;
  for (const auto& line : cut.explanation)
    explained |= line.find("Oases' cutpoint: layers 0-" + std::to_string(cut.config.cut_layer - 1) +
                           " at TP " + std::to_string(cut.config.tp)) == 0;
  EXPECT_TRUE(explained);
  const api::Plan read = api::decode_plan(api::to_json(cut));  // checks the hash too
  EXPECT_EQ(read.config.cut_layer, cut.config.cut_layer);
  EXPECT_EQ(read.config.cut_tp, cut.config.cut_tp);
  EXPECT_EQ(api::not_yet_executable(cut), "");  // the CUDA workers run it

  const api::Plan forced = planner::best_plan(
      test::gpt_job("{preset: gpt-7b}",
                    "  parallelism: {cutpointLayer: 8, cutpointTensorParallel: 8}\n", 512),
      inv);
  EXPECT_EQ(forced.config.cut_layer, 8);
  EXPECT_EQ(forced.config.cut_tp, 8);
  // Sharded, the cutpoint's explanation says so.
  const api::Plan sharded = planner::best_plan(
      test::gpt_job("{preset: gpt-7b}",
                    "  parallelism: {cutpointLayer: 8, cutpointTensorParallel: 8, "
                    "distributedOptimizer: on}\n",
                    512),
      inv);
  EXPECT_TRUE(sharded.config.distributed_optimizer);
  bool says_sharded = false;
  for (const auto& line : sharded.explanation)
    says_sharded |= line.rfind("Oases' cutpoint: ", 0) == 0 &&
                    line.find(
                        "each segment shards its optimizer state over its data-parallel "
                        "ranks (ZeRO-1).") != std::string::npos;
  EXPECT_TRUE(says_sharded);
  const auto errors =
      api::validate(test::gpt_job("{preset: gpt-7b}", "  parallelism: {cutpointLayer: 32}\n", 512));
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(std::string(errors[0].what())
                .find("spec.parallelism.cutpointLayer: 32 is not inside the model's 32 layers"),
            std::string::npos)
      << errors[0].what();
  // A plan edited to a cutpoint that cannot re-shard is refused where it is read.
  api::Json doc = api::to_json(cut);
  doc["cutpoint"]["tp"] = 3;
  doc.erase("planHash");
  try {
    api::decode_plan(doc);
    ADD_FAILURE() << "a cutpoint to TP 3 was accepted";
  } catch (const FieldError& e) {
    EXPECT_NE(std::string(e.what()).find("plan.cutpoint.tp"), std::string::npos) << e.what();
  }
}

// Cutpoints with offload optimizer (where the job asks for cutpoints): the model's first gpuUnits
// units on the GPU, each segment its part — GPT-7B on the Oases testbed (8 × 4 RTX 3090 on PCIe),
// cut at layer 16 as asked, with offload forced: a plan with both, the embeddings on the GPU
// (the workers sum a cutpoint's embeddings there), that round-trips and runs.
TEST(Planner, CutpointsWithOffloadOptimizerWhereAsked) {
  const api::Plan plan = planner::best_plan(
      test::gpt_job("{preset: gpt-7b}", "  parallelism: {cutpointLayer: 16, offload: optimizer}\n",
                    512),
      test::cluster("3090x32-pcie"));
  EXPECT_EQ(plan.config.cut_layer, 16);
  EXPECT_EQ(plan.config.offload, api::OffloadMode::kOptimizer);
  EXPECT_GE(plan.config.gpu_units, 1);
  EXPECT_LE(plan.config.gpu_units, 32);  // some layers on the CPU
  EXPECT_EQ(api::not_yet_executable(plan), "");
  const api::Plan read = api::decode_plan(api::to_json(plan));
  EXPECT_EQ(read.config.gpu_units, plan.config.gpu_units);
  EXPECT_EQ(read.config.cut_layer, 16);
  // The predicted host traffic is the CPU units' of both segments.
  EXPECT_GT(plan.predicted.pcie_bytes_per_step, 0);
  // A hand-made plan with the embeddings on the CPU is refused with the field to change.
  api::Plan cpu_embeddings = plan;
  cpu_embeddings.config.gpu_units = 0;
  EXPECT_NE(api::not_yet_executable(cpu_embeddings).find("gpuUpdateFraction"), std::string::npos);
  // The window too: each segment streams its part of the layers past the first gpuUnits units,
  // through slots of its own (more bytes over PCIe than offload optimizer moves).
  const api::Plan window = planner::best_plan(
      test::gpt_job("{preset: gpt-7b}",
                    "  parallelism: {cutpointLayer: 16, offload: window, recompute: full}\n", 512),
      test::cluster("3090x32-pcie"));
  EXPECT_EQ(window.config.cut_layer, 16);
  EXPECT_EQ(window.config.offload, api::OffloadMode::kWindow);
  EXPECT_GE(window.config.window, 1);
  EXPECT_EQ(api::not_yet_executable(window), "");
  EXPECT_GT(window.predicted.pcie_bytes_per_step, plan.predicted.pcie_bytes_per_step);
}

// Whatever the search chooses — cutpoints with every offload mode, stages and the distributed
// optimizer among its choices wherever the first tier finds nothing — a worker of this version
// can execute: jobs from 350 M to 13 B parameters on five example clusters, with cutpoints left to
// the planner, asked for, or forced with each offload mode.
TEST(Planner, EveryPlanChosenIsExecutable) {
  const char* models[] = {"{preset: gpt2-350m}", "{preset: gpt2-1.5b}", "{preset: gpt-7b}", kGpt5b,
                          "{layers: 40, hidden: 5120, heads: 40, vocab: 50257, seqLen: 2048}"};
  const char* clusters[] = {"h200-single", "v100-32gb-single", "3090x32-pcie", "3090x32-nvlink",
                            "h100x32"};
  int64_t planned = 0, cut = 0, cut_offload = 0, widened = 0;
  for (const char* model : models)
    for (const char* cluster : clusters)
      for (const char* parallelism :
           {"", "  parallelism: {cutpoint: on}\n", "  parallelism: {cutpointLayer: 6}\n",
            "  parallelism: {cutpointLayer: 6, offload: optimizer}\n",
            "  parallelism: {cutpointLayer: 6, offload: optimizer, distributedOptimizer: on}\n",
            "  parallelism: {cutpointLayer: 6, offload: window, recompute: full}\n"})
        for (int batch : {64, 512}) {
          SCOPED_TRACE(std::string(model) + " on " + cluster + " " + parallelism + " batch " +
                       std::to_string(batch));
          api::Plan plan;
          try {
            plan = planner::best_plan(test::gpt_job(model, parallelism, batch),
                                      test::cluster(cluster));
          } catch (const Error&) {
            continue;  // nothing fits: said elsewhere
          }
          ++planned;
          cut += plan.config.cut_layer > 0;
          cut_offload += plan.config.cut_layer > 0 && plan.config.offload != OffloadMode::kNone;
          widened += plan.config.pp > 1 || plan.config.distributed_optimizer;
          EXPECT_EQ(api::not_yet_executable(plan), "");
          EXPECT_NO_THROW(api::decode_plan(api::to_json(plan)));  // valid as written
        }
  EXPECT_GE(planned, 150);     // (188 when written)
  EXPECT_GE(cut, 70);          // cutpoints among them (89),
  EXPECT_GE(cut_offload, 60);  // with offload (76),
  EXPECT_GE(widened, 25);      // and the widened tier's plans (34)
}

// Fresh random jobs — model shapes, batches and any mix of the parallelism hints (degrees,
// stages, virtual stages, cutpoints forced or asked, offload modes, windows, fractions, the
// distributed optimizer, recompute, overlap) — on the example clusters and on clusters of random
// GPU nodes: each is refused by validate(), or planned, or refused by the planner with kt::Error;
// never an internal error (a KT_CHECK aborts the process: the operator's). A plan made is
// executable and decodes.
TEST(Planner, RandomJobsArePlannedOrRefusedNeverCrash) {
  const uint32_t seed = test::fresh_seed();
  std::fprintf(stderr,
               "Planner.RandomJobsArePlannedOrRefusedNeverCrash: seed %u "
               "(KT_TEST_SEED replays it)\n",
               seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const auto pick = [&](auto... values) {
    const std::vector<std::common_type_t<decltype(values)...>> v{values...};
    return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
  };
  const auto maybe = [&] { return std::uniform_int_distribution<int>(0, 2)(rng) == 0; };
  const char* clusters[] = {"h200-single", "v100-32gb-single", "3090x32-pcie", "h100x32",
                            "cpu-local"};
  std::vector<api::Inventory> inventories;
  for (const char* c : clusters) inventories.push_back(test::cluster(c));
  int planned = 0, refused = 0, invalid = 0;
  for (int trial = 0; trial < 150; ++trial) {
    const int64_t heads = pick(2, 4, 8, 16), layers = pick(2, 3, 4, 6, 8, 12, 24);
    const int64_t hidden = heads * pick(16, 32, 64, 128);
    std::string model =
        "{layers: " + std::to_string(layers) + ", hidden: " + std::to_string(hidden) +
        ", heads: " + std::to_string(heads) + ", vocab: " + std::to_string(pick(257, 5000, 50257)) +
        ", seqLen: " + std::to_string(pick(32, 128, 1024)) + "}";
    std::string hints;
    const auto hint = [&](const std::string& field, const std::string& value) {
      hints += (hints.empty() ? "" : ", ") + field + ": " + value;
    };
    if (maybe()) hint("tensorParallel", std::to_string(pick(1, 2, 4, 8)));
    if (maybe()) hint("dataParallel", std::to_string(pick(1, 2, 4, 16)));
    if (maybe()) hint("pipelineParallel", std::to_string(pick(1, 2, 3, 4)));
    if (maybe()) hint("virtualStages", std::to_string(pick(1, 2, 3)));
    if (maybe()) hint("distributedOptimizer", pick("on", "off"));
    if (maybe()) hint("cutpoint", pick("on", "off"));
    if (maybe())
      hint("cutpointLayer", std::to_string(std::uniform_int_distribution<int64_t>(
                                1, std::max<int64_t>(1, layers - 1))(rng)));
    if (maybe()) hint("cutpointTensorParallel", std::to_string(pick(1, 2, 4, 8)));
    if (maybe()) hint("overlap", pick("on", "off"));
    if (maybe()) hint("recompute", pick("none", "commAware", "full"));
    if (maybe()) hint("offload", pick("none", "optimizer", "window"));
    if (maybe()) hint("offloadWindow", std::to_string(pick(1, 2, 3)));
    if (maybe()) hint("gpuUpdateFraction", pick("0", "0.25", "0.5", "1"));
    const int batch = pick(4, 16, 64, 512);
    const std::string extra = hints.empty() ? "" : "  parallelism: {" + hints + "}\n";
    // An example cluster, or one of random nodes: any GPU kind, count, memory and host memory.
    const size_t cluster = std::uniform_int_distribution<size_t>(0, inventories.size())(rng);
    std::string nodes = cluster < inventories.size() ? clusters[cluster] : "";
    if (nodes.empty())
      nodes =
          "kind: Inventory\nnodes:\n- name: n\n  replicas: " + std::to_string(pick(1, 2, 3, 8)) +
          "\n  gpu: {product: " +
          pick("H200", "H100-SXM", "A100-PCIe-40GB", "L4", "RTX-3090", "T4") +
          ", count: " + std::to_string(pick(1, 2, 3, 4, 8)) +
          "}\n  cpu: {cores: " + std::to_string(pick(4, 32)) +
          "}\n  memory: " + pick("16Gi", "128Gi", "1Ti") + "\n";
    const api::Inventory inventory =
        cluster < inventories.size() ? inventories[cluster] : test::inventory_from_yaml(nodes);
    SCOPED_TRACE(model + " " + extra + "batch " + std::to_string(batch) + " on " + nodes);
    api::TrainingJob job;
    try {
      job = test::gpt_job(model, extra, batch);
    } catch (const Error&) {
      ++invalid;
      continue;
    }
    if (!api::validate(job).empty()) {
      ++invalid;
      continue;
    }
    try {
      const api::Plan plan = planner::best_plan(job, inventory);
      ++planned;
      EXPECT_EQ(api::not_yet_executable(plan), "");
      EXPECT_NO_THROW(api::decode_plan(api::to_json(plan)));
    } catch (const Error& e) {
      ++refused;
      EXPECT_FALSE(std::string(e.what()).empty());
    }
  }
  EXPECT_GE(planned, 15);  // the draws reach plans,
  EXPECT_GE(refused, 5);   // the planner's refusals
  EXPECT_GE(invalid, 5);   // and validate()'s
}

}  // namespace
}  // namespace kt

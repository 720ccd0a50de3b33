#include "planner/cost_model.h"

#include <gtest/gtest.h>

#include <random>

#include "api/hardware.h"
#include "api/quantity.h"
#include "planner/explain.h"
#include "planner/search.h"
#include "tests/support/random.h"

namespace kt {
namespace {

using api::OffloadMode;
using api::Recompute;
using planner::ParallelConfig;
using planner::Problem;

// GPT 1.2B (L=24, h=2048, 16 heads, s=1024) on a node of 4 RTX 3090 on PCIe.
Problem problem_3090() {
  Problem p;
  p.model = {24, 2048, 16, 8192, 50257, 1024};
  p.global_batch = 64;
  p.hw = *api::find_profile("RTX-3090");
  p.cpu_cores_per_node = 32;
  p.host_memory_per_node = 256 * api::kGiB;
  return p;
}

ParallelConfig config(int64_t tp, int64_t micro, int64_t sub_batches, Recompute rc) {
  ParallelConfig c;
  c.nodes = 1;
  c.procs_per_node = 4;
  c.tp = tp;
  c.dp = 4 / tp;
  c.micro_batch = micro;
  c.grad_accum = 64 / c.dp / micro;
  c.sub_batches = sub_batches;
  c.recompute = rc;
  c.gpu_units = 25;
  return c;
}

TEST(CostModel, AllReduceCountsPerMicroBatch) {
  const Problem p = problem_3090();
  const int64_t L = p.model.layers;
  // Per layer: 2 forward + 2 backward, +2 for a full recompute's forward; plus one for the
  // vocab-parallel embedding and one for the LM head's input gradient. ×2 when overlapped.
  EXPECT_EQ(planner::time_micro_batch(p, config(2, 4, 1, Recompute::kNone)).allreduces, 4 * L + 2);
  EXPECT_EQ(planner::time_micro_batch(p, config(2, 4, 1, Recompute::kCommAware)).allreduces,
            4 * L + 2);
  EXPECT_EQ(planner::time_micro_batch(p, config(2, 4, 1, Recompute::kFull)).allreduces, 6 * L + 2);
  EXPECT_EQ(planner::time_micro_batch(p, config(2, 4, 2, Recompute::kFull)).allreduces,
            2 * (6 * L + 2));
  EXPECT_EQ(planner::time_micro_batch(p, config(2, 4, 2, Recompute::kCommAware)).allreduces,
            2 * (4 * L + 2));
}

TEST(CostModel, WithoutOverlapTheMicroBatchIsComputePlusComm) {
  const Problem p = problem_3090();
  const auto t = planner::time_micro_batch(p, config(4, 4, 1, Recompute::kNone));
  EXPECT_NEAR(t.forward + t.backward, t.compute + t.tp_comm, 1e-12);
  EXPECT_GT(t.tp_comm, 0);
}

TEST(CostModel, OverlapHidesAllReduceBehindTheOtherSubBatch) {
  const Problem p = problem_3090();
  const auto serial = planner::time_micro_batch(p, config(4, 4, 1, Recompute::kNone));
  const auto overlapped = planner::time_micro_batch(p, config(4, 4, 2, Recompute::kNone));
  const double wall_serial = serial.forward + serial.backward;
  const double wall_overlap = overlapped.forward + overlapped.backward;
  EXPECT_LT(wall_overlap, wall_serial * 0.8);
  // It can never beat the busier of the two streams.
  EXPECT_GE(wall_overlap, std::max(overlapped.compute, overlapped.tp_comm));
  // The two half-size sub-batches do the same arithmetic.
  EXPECT_NEAR(overlapped.compute, serial.compute, serial.compute * 1e-12);
}

// The profile's interference: compute beside an all-reduce slows by that fraction of the time
// they share, so the overlapped schedule gets slower as it grows (and never the serial one).
TEST(CostModel, OverlapPaysTheProfilesInterference) {
  Problem p = problem_3090();
  double previous = 0;
  for (double interference : {0.0, 0.15, 0.75, 2.0}) {
    p.hw.overlap_interference = interference;
    const auto o = planner::time_micro_batch(p, config(4, 4, 2, Recompute::kNone));
    const auto s = planner::time_micro_batch(p, config(4, 4, 1, Recompute::kNone));
    EXPECT_GT(o.forward + o.backward, previous) << interference;
    previous = o.forward + o.backward;
    p.hw.overlap_interference = 0;
    const auto s0 = planner::time_micro_batch(p, config(4, 4, 1, Recompute::kNone));
    EXPECT_DOUBLE_EQ(s.forward + s.backward, s0.forward + s0.backward) << "serial: no overlap";
    p.hw.overlap_interference = interference;
  }
}

TEST(CostModel, CommAwareRecomputeIsCheaperThanFull) {
  const Problem p = problem_3090();
  const auto full = planner::time_micro_batch(p, config(4, 4, 1, Recompute::kFull));
  const auto aware = planner::time_micro_batch(p, config(4, 4, 1, Recompute::kCommAware));
  const auto none = planner::time_micro_batch(p, config(4, 4, 1, Recompute::kNone));
  EXPECT_LT(aware.tp_comm, full.tp_comm);
  EXPECT_NEAR(aware.tp_comm, none.tp_comm, 1e-12);
  EXPECT_LT(aware.compute, full.compute);
  EXPECT_GT(aware.compute, none.compute);
}

TEST(CostModel, MemoryByKindWithoutOffload) {
  const Problem p = problem_3090();
  const auto c = config(1, 1, 1, Recompute::kFull);
  const auto ev = planner::evaluate(p, c);
  const double params = static_cast<double>(api::parameter_count(p.model));
  EXPECT_DOUBLE_EQ(ev.predicted.memory.params, 2 * params);
  EXPECT_DOUBLE_EQ(ev.predicted.memory.grads, 4 * params);  // fp32, as both workers keep them
  EXPECT_DOUBLE_EQ(ev.predicted.memory.optimizer, 12 * params);
  EXPECT_DOUBLE_EQ(ev.predicted.pcie_bytes_per_step, 0);
  EXPECT_EQ(ev.predicted.host_bytes_per_node, 0);
  // Activations: L layers of 2sbh checkpoints + one layer's working set + fp32 logits + the
  // embedding output.
  const auto& m = p.model;
  const double s = m.seq_len, h = m.hidden;
  const double expected = m.layers * 2 * s * h +
                          planner::layer_activation_bytes(m, 1, 1, Recompute::kNone) +
                          s * m.padded_vocab() * 4 + 2 * s * h * 2;
  EXPECT_DOUBLE_EQ(ev.predicted.memory.activations, expected);
}

// ZeRO-Offload's paper moves 4 B per parameter (fp16 gradients down, fp16 parameters up); the
// workers' gradients are fp32, so 6.
TEST(CostModel, ZeroOffloadMovesFp32GradientsDownAndBf16ParametersUp) {
  const Problem p = problem_3090();
  auto c = config(1, 1, 1, Recompute::kFull);
  c.offload = OffloadMode::kOptimizer;
  c.gpu_units = 0;  // everything updated on the CPU
  const auto ev = planner::evaluate(p, c);
  const double params = static_cast<double>(api::parameter_count(p.model));
  EXPECT_DOUBLE_EQ(ev.predicted.pcie_bytes_per_step, 6 * params);  // fp32 grads down, bf16 up
  EXPECT_DOUBLE_EQ(ev.predicted.memory.optimizer, 0);
  EXPECT_GT(ev.predicted.time.optimizer_cpu_total, 0);
  EXPECT_GE(ev.predicted.host_bytes_per_node, 4 * 16 * params);  // 4 ranks × 16 B/param
}

TEST(CostModel, WindowOffloadPcieBytesFollowTheFormula) {
  const Problem p = problem_3090();
  auto c = config(1, 1, 1, Recompute::kFull);
  c.offload = OffloadMode::kWindow;
  c.gpu_units = 5;  // embeddings + layers 0..3 resident
  c.window = 3;
  const auto ev = planner::evaluate(p, c);
  const auto& m = p.model;
  const double S = m.layers - 4, W = 3, lay = planner::layer_unit_params(m, 1);
  const double act = planner::layer_activation_bytes(m, 1, 1, Recompute::kFull);
  // Layers up twice (bf16), their fp32 gradients down, the activation checkpoints down and up.
  const double per_micro = 2 * (S - W) * lay * 2 + S * lay * 4 + 2 * S * act;
  EXPECT_NEAR(ev.predicted.pcie_bytes_per_step, c.grad_accum * per_micro + W * lay * 2, 1.0);
  // Fewer layers resident on the device than without offload.
  auto plain = config(1, 1, 1, Recompute::kFull);
  EXPECT_LT(ev.predicted.memory.total(), planner::evaluate(p, plain).predicted.memory.total());
}

// In pipeline stages each stage streams its own layers; its host memory keeps a checkpoint per
// micro-batch in flight, and 1F1B's back-to-back forwards and backwards refetch a sweep's first
// slots.
TEST(CostModel, WindowOffloadInPipelineStages) {
  const Problem p = problem_3090();
  auto c = config(1, 1, 1, Recompute::kFull);
  c.offload = OffloadMode::kWindow;
  c.gpu_units = 1;  // a stage's embeddings' copy resident, its layers streamed
  c.window = 2;
  const auto& m = p.model;
  const double lay = planner::layer_unit_params(m, 1);
  const double act = planner::layer_activation_bytes(m, 1, 1, Recompute::kFull);
  const auto one = planner::evaluate(p, c);
  auto staged = c;
  staged.pp = 2;
  staged.dp = c.dp / 2;
  staged.grad_accum = 2 * c.grad_accum;  // the same global batch
  ASSERT_GE(staged.grad_accum, 3);
  const auto two = planner::evaluate(p, staged);
  const double S = static_cast<double>(m.layers / 2), W = 2;
  const double per_micro = 2 * (S - W) * lay * 2 + S * lay * 4 + 2 * S * act;
  // One turn each way on the first stage of two (min(p − 1, m − 1)), W layers each.
  EXPECT_NEAR(two.predicted.pcie_bytes_per_step,
              staged.grad_accum * per_micro + W * lay * 2 + 2 * 1 * W * lay * 2, 1.0);
  // Host: half the streamed layers per rank, but their checkpoints twice (2 in flight).
  const double streamed_one = static_cast<double>(m.layers), streamed_two = S;
  EXPECT_NEAR(two.predicted.host_bytes_per_node - one.predicted.host_bytes_per_node,
              c.procs_per_node * ((streamed_two - streamed_one) * lay * (16 + 2) +
                                  (2 * streamed_two - streamed_one) * act),
              1e3);
}

// With the distributed optimizer a GPU rank keeps a streamed layer's fp32 gradient accumulator and
// bf16 copy whole in host memory, and 1/d of its master, moments, gradient shard and bf16 shard
// (18 B): 4 + 18/d + 2 bytes per parameter instead of 16 + 2.
TEST(CostModel, WindowOffloadWithTheDistributedOptimizer) {
  const Problem p = problem_3090();
  auto c = config(1, 1, 1, Recompute::kFull);
  c.offload = OffloadMode::kWindow;
  c.gpu_units = 1;
  c.window = 2;
  ASSERT_EQ(c.dp, 4);
  const auto plain = planner::evaluate(p, c);
  c.distributed_optimizer = true;
  const auto sharded = planner::evaluate(p, c);
  const double streamed =
      static_cast<double>(p.model.layers) * planner::layer_unit_params(p.model, 1);
  EXPECT_NEAR(plain.predicted.host_bytes_per_node - sharded.predicted.host_bytes_per_node,
              c.procs_per_node * streamed * (16 - (4 + 18.0 / 4)), 1e3);
  // The same bytes over PCIe: the window moves whole layers either way.
  EXPECT_DOUBLE_EQ(sharded.predicted.pcie_bytes_per_step, plain.predicted.pcie_bytes_per_step);
}

TEST(CostModel, MoreGpuUpdateFractionNeedsMoreDeviceMemory) {
  const Problem p = problem_3090();
  auto c = config(2, 2, 1, Recompute::kFull);
  c.offload = OffloadMode::kOptimizer;
  double previous = 0;
  for (int64_t k = 0; k <= p.model.layers; ++k) {
    c.gpu_units = k;
    const double total = planner::evaluate(p, c).predicted.memory.total();
    EXPECT_GT(total, previous) << k;
    previous = total;
  }
}

// `model` in fp32 on a CPU node of 2 cores and 24 GiB (this project's build machine).
Problem problem_cpu(const api::ModelDims& model) {
  Problem p;
  p.model = model;
  p.global_batch = 8;
  p.hw = api::cpu_profile();
  p.cpu_device = true;
  p.precision = api::Precision::kFp32;
  p.cpu_cores_per_node = 2;
  p.host_memory_per_node = 24 * api::kGiB;
  return p;
}

TEST(CostModel, CpuRanksUseHostMemoryAsDeviceMemory) {
  const Problem p = problem_cpu(api::find_model_preset("tiny")->dims);
  ParallelConfig c;
  c.procs_per_node = 2;
  c.tp = 2;
  c.micro_batch = 8;
  c.gpu_units = p.model.layers + 1;
  const auto ev = planner::evaluate(p, c);
  EXPECT_TRUE(ev.fits);
  EXPECT_DOUBLE_EQ(ev.predicted.device_capacity_bytes, 0.85 * 24 * api::kGiB / 2);
  EXPECT_GT(ev.predicted.tokens_per_second, 0);
}

// A recompute pass at the profile's measured rate: full recompute adds every layer's forward
// FLOPs, (8bsh² + 4bshf + 4bs²h)·L, at ratio × the micro-batch's rate — and nothing else moves.
TEST(CostModel, RecomputeRunsAtTheProfilesRecomputeRate) {
  Problem p = problem_3090();
  const ParallelConfig one_rank = [] {
    ParallelConfig c = config(1, 2, 1, Recompute::kNone);
    c.procs_per_node = 1;
    c.dp = 1;
    return c;
  }();
  ParallelConfig full = one_rank;
  full.recompute = Recompute::kFull;
  const double b = 2, s = p.model.seq_len, h = p.model.hidden, f = p.model.ffn_hidden;
  const double layer_forward_flops = 8 * b * s * h * h + 4 * b * s * h * f + 4 * b * s * s * h;
  const double rate = p.hw.peak_bf16_flops * p.hw.achieved_fraction;
  for (double ratio : {1.0, 1.3, 0.7}) {
    p.hw.recompute_rate_ratio = ratio;
    const auto none_t = planner::time_micro_batch(p, one_rank);
    const auto full_t = planner::time_micro_batch(p, full);
    const double added = (full_t.forward + full_t.backward) - (none_t.forward + none_t.backward);
    EXPECT_NEAR(added, p.model.layers * layer_forward_flops / (ratio * rate), added * 1e-9)
        << ratio;
    EXPECT_NEAR(full_t.forward, none_t.forward, none_t.forward * 1e-12) << "the forward is not";
  }
}

// On a CPU rank the offload engine's copy lanes and CPU AdamW run on the cores the compute
// keeps busy: nothing of them is hidden. On a GPU node the same lanes hide behind the backward.
TEST(CostModel, OnCpuRanksTheOffloadLanesAddToTheStep_OnGpusTheyHide) {
  const Problem p = problem_cpu({4, 256, 4, 1024, 256, 128});
  ParallelConfig c;
  c.micro_batch = 8;
  c.offload = OffloadMode::kOptimizer;
  c.gpu_units = 3;  // embeddings and layers 0-1 on the device, layers 2-3 on the CPU
  const auto t = planner::evaluate(p, c).predicted.time;
  EXPECT_GT(t.optimizer_cpu_total, 0);
  EXPECT_GT(t.transfer_total, 0);
  EXPECT_NEAR(t.optimizer_cpu_exposed + t.transfer_exposed,
              t.optimizer_cpu_total + t.transfer_total + 2e-3 /* per-step hand-off */, 1e-9);

  Problem gpu = problem_3090();
  ParallelConfig g = config(4, 4, 1, Recompute::kNone);
  g.offload = OffloadMode::kOptimizer;
  g.gpu_units = 12;
  const auto tg = planner::evaluate(gpu, g).predicted.time;
  EXPECT_GT(tg.optimizer_cpu_total, 0);
  EXPECT_LT(tg.optimizer_cpu_exposed, tg.optimizer_cpu_total);
}

// ---- pipeline stages and the distributed optimizer (docs/PLANNER.md §15) ---------------------

// GPT with 8 layers on H100s; `links_free`: point-to-point and all-reduces cost nothing.
Problem problem_h100(bool links_free) {
  Problem p;
  p.model = {8, 4096, 32, 16384, 50257, 2048};
  p.global_batch = 64;
  p.hw = *api::find_profile("NVIDIA-H100-80GB-HBM3");
  p.cpu_cores_per_node = 112;
  p.host_memory_per_node = 2048 * api::kGiB;
  p.ignore_memory = true;
  if (links_free) {
    p.hw.inter_node_bandwidth = p.hw.intra_allreduce_busbw = 1e30;
    p.hw.allreduce_latency = 0;
  }
  return p;
}

ParallelConfig pipeline(int64_t pp, int64_t micro_batches) {
  ParallelConfig c;
  c.nodes = pp;
  c.procs_per_node = 1;
  c.pp = pp;
  c.micro_batch = 64 / micro_batches;
  c.grad_accum = micro_batches;
  c.gpu_units = 8 / pp + 1;
  return c;
}

// 1F1B: m + p − 1 slots of one stage's micro-batch (the bubble (p − 1)/m), the stage being a
// plain model of L/p layers; then the device AdamW of the stage's parameters.
TEST(CostModel, PipelineStepIsMPlusPMinusOneStageSlots) {
  const Problem p = problem_h100(true);
  for (int64_t pp : {2, 4, 8})
    for (int64_t m : {4, 16, 64}) {
      const ParallelConfig c = pipeline(pp, m);
      Problem stage = p;
      stage.model.layers = 8 / pp;
      ParallelConfig plain = c;
      plain.pp = 1;
      plain.nodes = 1;
      const auto t = planner::time_micro_batch(stage, plain);
      const auto ev = planner::evaluate(p, c);
      const double slots = static_cast<double>(m + pp - 1) * (t.forward + t.backward);
      EXPECT_NEAR(ev.predicted.step_seconds - ev.predicted.time.optimizer_gpu, slots, slots * 1e-9)
          << "pp " << pp << " m " << m;
    }
}

// Each stage sends b·s·h activations forward and the same gradients back per micro-batch.
TEST(CostModel, PipelineStagesPayTheirPointToPointPerMicroBatch) {
  Problem free_links = problem_h100(true), real = problem_h100(false);
  real.hw.allreduce_latency = 0;
  const ParallelConfig c = pipeline(4, 16);
  const double diff = planner::evaluate(real, c).predicted.step_seconds -
                      planner::evaluate(free_links, c).predicted.step_seconds;
  // Stages on different nodes: one rank per node sends over the node's NICs; and once per step
  // the first and last stages sum their tied word embeddings' gradients (2 ranks, fp32).
  const double bytes = 4.0 * 2048 * 4096 * 2;  // micro-batch 4, bf16
  const double embedding_sum = 50304.0 * 4096 * 4 / real.hw.inter_node_bandwidth;
  EXPECT_NEAR(diff, (16 + 4 - 1) * 2 * bytes / real.hw.inter_node_bandwidth + embedding_sum,
              diff * 1e-6);
}

// The CPU workers' sends return at once: only the fill's and the drain's hops (p − 1 each way)
// wait for a transfer, not two per micro-batch slot.
TEST(CostModel, OnCpuRanksPipelineSendsCostOnlyTheFillAndDrainHops) {
  Problem real = problem_cpu({4, 256, 4, 1024, 256, 128});
  real.hw.allreduce_latency = 1e-3;
  Problem free_links = real;
  free_links.hw.allreduce_latency = 0;
  free_links.hw.intra_allreduce_busbw = 1e30;
  ParallelConfig c;
  c.procs_per_node = 2;
  c.pp = 2;
  c.micro_batch = 1;
  c.grad_accum = 8;
  c.gpu_units = 3;
  const double diff = planner::evaluate(real, c).predicted.step_seconds -
                      planner::evaluate(free_links, c).predicted.step_seconds;
  const double hop = 1e-3 + 1.0 * 128 * 256 * 4 / real.hw.intra_allreduce_busbw;
  const double embedding_sum =
      planner::allreduce_seconds(256.0 * 256 * 4, 2, real.hw.inter_node_bandwidth, 1e-3) *
          real.hw.dp_comm_scale -
      planner::allreduce_seconds(256.0 * 256 * 4, 2, real.hw.inter_node_bandwidth, 0) *
          real.hw.dp_comm_scale;
  EXPECT_NEAR(diff, 2 * hop + embedding_sum, 1e-9);
}

// A stage holds its L/p layers and the (tied) embeddings, and the first stage the activations
// of min(p, m) micro-batches in flight.
TEST(CostModel, PipelineStageHoldsItsLayersAndTheMicroBatchesInFlight) {
  const Problem p = problem_h100(true);
  const ParallelConfig one = pipeline(1, 16), four = pipeline(4, 16), few = pipeline(4, 2);
  const auto m1 = planner::evaluate_memory(p, one).predicted.memory;
  const auto m4 = planner::evaluate_memory(p, four).predicted.memory;
  const double emb = planner::embedding_unit_params(p.model, 1);
  const double lay = planner::layer_unit_params(p.model, 1);
  EXPECT_NEAR(m1.params, (emb + 8 * lay) * 2, 1);
  EXPECT_NEAR(m4.params, (emb + 2 * lay) * 2, 1);
  const double act = planner::layer_activation_bytes(p.model, 4, 1, Recompute::kNone);
  const double rest = m1.activations - 8 * act;  // logits and embedding output
  EXPECT_NEAR(m4.activations, 4 * 2 * act + rest, 1);
  const double act32 = planner::layer_activation_bytes(p.model, 32, 1, Recompute::kNone);
  const double rest32 =
      planner::evaluate_memory(p, pipeline(1, 2)).predicted.memory.activations - 8 * act32;
  EXPECT_NEAR(planner::evaluate_memory(p, few).predicted.memory.activations, 2 * 2 * act32 + rest32,
              1)
      << "2 micro-batches: only 2 in flight";
}

// ZeRO-1: optimizer state and AdamW divided over DP; the reduce-scatter moves half of what the
// all-reduce of the fp32 gradients did (NCCL's), the all-gather half of an all-reduce of the
// bf16 weights: 3/4 of the plain plan's DP bytes.
TEST(CostModel, DistributedOptimizerShardsTheOptimizerStateOverDataParallel) {
  Problem p = problem_h100(false);
  p.hw.allreduce_latency = 0;  // bytes only
  ParallelConfig c;
  c.nodes = 4;
  c.procs_per_node = 8;
  c.tp = 8;
  c.dp = 4;
  c.micro_batch = 4;
  c.grad_accum = 4;
  c.gpu_units = 9;
  ParallelConfig zero = c;
  zero.distributed_optimizer = true;
  const auto plain = planner::evaluate(p, c).predicted,
             sharded = planner::evaluate(p, zero).predicted;
  EXPECT_NEAR(sharded.memory.optimizer, plain.memory.optimizer / 4, 1);
  EXPECT_NEAR(sharded.time.optimizer_gpu, plain.time.optimizer_gpu / 4, 1e-12);
  EXPECT_NEAR(sharded.time.dp_comm_total, 0.75 * plain.time.dp_comm_total, 1e-12);
  EXPECT_EQ(sharded.memory.params, plain.memory.params);
}

// The CPU workers' distributed optimizer (docs/WORKER.md): each unit's reduce-scatter (Gloo's:
// an all-reduce and a slice) runs in the DP lane where the all-reduce ran, and after the update
// an all-gather per unit (half an all-reduce), embeddings first, beside the next forward: DP
// total 1.5 × Σ_units all-reduce(unit); exposed beyond the plain plan's at least the embeddings'
// gather (the forward reads them first) and at most every gather.
TEST(CostModel, OnCpuRanksTheDistributedOptimizersCollectivesAreExposed) {
  const Problem p = problem_cpu({4, 256, 4, 1024, 256, 128});
  ParallelConfig c;
  c.procs_per_node = 2;
  c.dp = 2;
  c.micro_batch = 4;
  c.gpu_units = p.model.layers + 1;
  ParallelConfig zero = c;
  zero.distributed_optimizer = true;
  const auto plain = planner::evaluate(p, c).predicted,
             sharded = planner::evaluate(p, zero).predicted;
  auto unit_allreduce = [&](double params) {
    return planner::allreduce_seconds(4 * params, 2, p.hw.intra_allreduce_busbw,
                                      p.hw.allreduce_latency);
  };
  const double per_step = p.model.layers * unit_allreduce(planner::layer_unit_params(p.model, 1)) +
                          unit_allreduce(planner::embedding_unit_params(p.model, 1));
  EXPECT_NEAR(plain.time.dp_comm_total, per_step, 1e-12);
  EXPECT_NEAR(sharded.time.dp_comm_total, 1.5 * per_step, 1e-12);
  const double gathers_exposed = sharded.time.dp_comm_exposed - plain.time.dp_comm_exposed;
  EXPECT_GE(gathers_exposed,
            0.5 * unit_allreduce(planner::embedding_unit_params(p.model, 1)) - 1e-12);
  EXPECT_LE(gathers_exposed, 0.5 * per_step + 1e-12);
  // Each rank updates half the parameters.
  EXPECT_NEAR(sharded.time.optimizer_gpu, plain.time.optimizer_gpu / 2, 1e-15);
}

// With offload optimizer each DP rank copies home, updates in host memory and brings back its
// shard of the CPU-updated units only (the SynergyScale split per shard): 1/d of the CPU AdamW,
// the copies and the host bytes of the unsharded engine.
TEST(CostModel, TheDistributedOptimizerWithOffloadMovesAndUpdatesAShardPerRank) {
  const Problem p = problem_cpu({4, 256, 4, 1024, 256, 128});
  ParallelConfig c;
  c.procs_per_node = 2;
  c.dp = 2;
  c.micro_batch = 4;
  c.offload = api::OffloadMode::kOptimizer;
  c.gpu_units = 2;  // the embeddings and layer 0 on the device, layers 1..3 on the CPU
  ParallelConfig zero = c;
  zero.distributed_optimizer = true;
  const auto plain = planner::evaluate(p, c).predicted,
             sharded = planner::evaluate(p, zero).predicted;
  ASSERT_GT(plain.time.optimizer_cpu_total, 0);
  EXPECT_NEAR(sharded.time.optimizer_cpu_total, plain.time.optimizer_cpu_total / 2, 1e-12);
  EXPECT_NEAR(sharded.pcie_bytes_per_step, plain.pcie_bytes_per_step / 2, 1e-3);
  EXPECT_LT(sharded.host_bytes_per_node, plain.host_bytes_per_node);
  const double cpu_params = 3 * planner::layer_unit_params(p.model, 1);
  EXPECT_NEAR(plain.host_bytes_per_node - sharded.host_bytes_per_node,
              2 * cpu_params * 16 / 2, 1e-3);  // 2 ranks per node, each half of 16 B/param
}

// Oases' cutpoint as its two segments joined: GPT 1.2B on 4 RTX 3090s, layers [0, k) at TP 1 ×
// DP 4 (micro-batch 1), layers [k, 24) at TP 2 × DP 2 (micro-batch 2). Its compute is the first
// segment's layers, the second's and one LM head (at the second's TP); each layer moved across
// the cut moves its own memory; every prediction is a sum of non-negative phases.
TEST(CostModel, ACutpointCostsItsTwoSegmentsJoined) {
  const Problem p = problem_3090();
  const ParallelConfig first = config(1, 1, 1, Recompute::kNone);   // DP 4, 16 accumulation
  const ParallelConfig second = config(2, 2, 1, Recompute::kNone);  // DP 2, 16 accumulation
  ASSERT_EQ(first.grad_accum, second.grad_accum);
  const double accum = static_cast<double>(first.grad_accum);
  const double L = static_cast<double>(p.model.layers);
  const auto plain1 = planner::evaluate(p, first).predicted;
  const auto plain2 = planner::evaluate(p, second).predicted;
  auto lm_head = [&](const ParallelConfig& c) {
    return accum * 3 * planner::logits_forward_flops(p.model, c.micro_batch, c.tp) /
           planner::rank_flops_per_second(p, c);
  };
  const double layer1 = (plain1.time.compute - lm_head(first)) / L;
  const double layer2 = (plain2.time.compute - lm_head(second)) / L;
  double last_memory = 0;
  for (int64_t k : {1, 6, 12, 23}) {
    SCOPED_TRACE(k);
    ParallelConfig cut = first;
    cut.cut_layer = k;
    cut.cut_tp = 2;
    const auto e = planner::evaluate(p, cut).predicted;
    EXPECT_NEAR(e.time.compute, k * layer1 + (L - k) * layer2 + lm_head(second),
                1e-9 * e.time.compute);
    for (const api::TimePhase& phase : api::kTimePhases)
      EXPECT_GE(e.time.*phase.seconds, 0) << phase.name;
    EXPECT_GT(e.step_seconds, 0);
    // The memory figure of the join is exactly its segments' (no time needed).
    const auto memory_only = planner::evaluate_memory(p, cut);
    EXPECT_NEAR(memory_only.predicted.memory.total(), e.memory.total(), 1.0);
    // TP 1 holds a layer in twice the bytes TP 2 does: memory grows with k.
    EXPECT_GT(e.memory.total(), last_memory);
    last_memory = e.memory.total();
  }
  // One layer across the cut moves exactly one layer's parameters, gradients and moments.
  ParallelConfig a = first, b = first;
  a.cut_layer = 6, b.cut_layer = 7;
  a.cut_tp = b.cut_tp = 2;
  const auto ma = planner::evaluate_memory(p, a).predicted.memory;
  const auto mb = planner::evaluate_memory(p, b).predicted.memory;
  const double moved =
      planner::layer_unit_params(p.model, 1) - planner::layer_unit_params(p.model, 2);
  EXPECT_NEAR(mb.params - ma.params, moved * 2, 1.0);  // 16-bit weights
  EXPECT_NEAR(mb.grads - ma.grads, moved * 4, 1.0);    // fp32 gradients
}

// A cutpoint plan of problem_3090 drawn at random: two nesting TP degrees, recompute, overlap,
// offload (none, optimizer, window: gpuUnits and slots), sharded or not, and a cut layer.
ParallelConfig random_cutpoint(std::mt19937& rng, const Problem& p) {
  const std::pair<int64_t, int64_t> degrees[] = {{1, 2}, {2, 1}, {1, 4}, {4, 1}, {2, 4}, {4, 2}};
  const auto [t1, t2] = degrees[std::uniform_int_distribution<size_t>(0, 5)(rng)];
  const auto draw = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const Recompute rc[] = {Recompute::kNone, Recompute::kCommAware, Recompute::kFull};
  const int64_t b2 = 4 * t2 / t1;
  ParallelConfig c = config(t1, 4, b2 % 2 == 0 ? draw(1, 2) : 1, rc[draw(0, 2)]);
  c.cut_tp = t2;
  c.cut_layer = draw(1, p.model.layers - 1);
  c.distributed_optimizer = draw(0, 1) == 1;
  switch (draw(0, 2)) {
    case 0:
      c.offload = OffloadMode::kNone;
      c.gpu_units = p.model.layers + 1;
      break;
    case 1:
      c.offload = OffloadMode::kOptimizer;
      c.gpu_units = draw(1, p.model.layers);
      break;
    default:
      c.offload = OffloadMode::kWindow;
      c.gpu_units = draw(1, p.model.layers - 1);
      c.window = draw(1, 3);
  }
  return c;
}

std::string describe(const ParallelConfig& c) {
  return "tp " + std::to_string(c.tp) + "→" + std::to_string(c.cut_tp) + " at layer " +
         std::to_string(c.cut_layer) + ", offload " + std::string(api::to_string(c.offload)) +
         " gpuUnits " + std::to_string(c.gpu_units) + " window " + std::to_string(c.window) +
         (c.distributed_optimizer ? " zero1" : "") + ", " +
         std::string(api::to_string(c.recompute)) + ", sub-batches " +
         std::to_string(c.sub_batches);
}

// What the search's pruning of cutpoints rests on (search.cpp): between two consecutive
// breaks a cut's device and host memory are affine in the cut layer, and more units on the
// device never need less device memory nor more host memory.
TEST(CostModel, CutpointMemoryIsAffineBetweenItsBreaks_AndMonotoneInGpuUnits) {
  const uint32_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (KT_TEST_SEED replays it)");
  std::mt19937 rng(seed);
  const Problem p = problem_3090();
  const int64_t L = p.model.layers;
  int64_t spans = 0;
  for (int trial = 0; trial < 200; ++trial) {
    ParallelConfig c = random_cutpoint(rng, p);
    SCOPED_TRACE(describe(c));
    const auto at = [&](int64_t k) {
      ParallelConfig x = c;
      x.cut_layer = k;
      const auto e = planner::evaluate_memory(p, x).predicted;
      return std::pair{e.memory.total(), e.host_bytes_per_node};
    };
    const std::vector<int64_t> breaks = planner::cutpoint_memory_breaks(p, c);
    ASSERT_EQ(breaks.front(), 1);
    ASSERT_EQ(breaks.back(), L - 1);
    for (size_t i = 0; i + 1 < breaks.size(); ++i) {
      const int64_t a = breaks[i], b = breaks[i + 1];
      ASSERT_LT(a, b);
      const auto [device_a, host_a] = at(a);
      const auto [device_b, host_b] = at(b);
      for (int64_t k = a + 1; k < b; ++k) {
        SCOPED_TRACE("k " + std::to_string(k) + " between breaks " + std::to_string(a) + " and " +
                     std::to_string(b));
        const double w = static_cast<double>(k - a) / static_cast<double>(b - a);
        const auto [device, host] = at(k);
        EXPECT_NEAR(device, device_a + w * (device_b - device_a), 1e-9 * device);
        EXPECT_NEAR(host, host_a + w * (host_b - host_a), 1e-9 * std::max(host, 1.0));
        ++spans;
      }
    }
    // gpuUnits up by one at a time, over all the offload mode allows at this cut.
    if (c.offload == OffloadMode::kNone) continue;
    const int64_t top = c.offload == OffloadMode::kWindow ? L - 1 : L;
    double device_before = 0, host_before = 0;
    for (int64_t u = 1; u <= top; ++u) {
      c.gpu_units = u;
      const auto e = planner::evaluate_memory(p, c).predicted;
      SCOPED_TRACE("gpuUnits " + std::to_string(u));
      if (u > 1) {
        EXPECT_GE(e.memory.total(), device_before * (1 - 1e-12));
        EXPECT_LE(e.host_bytes_per_node, host_before * (1 + 1e-12));
      }
      device_before = e.memory.total();
      host_before = e.host_bytes_per_node;
    }
  }
  EXPECT_GT(spans, 200);  // (the draws reach inside spans)
}

// The search drops whole cuts by cutpoint_step_floor: it must never exceed the step the full
// evaluation predicts, for any offload, gpuUnits, window or sharding.
TEST(CostModel, CutpointStepFloorNeverExceedsTheStep) {
  const uint32_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (KT_TEST_SEED replays it)");
  std::mt19937 rng(seed);
  const Problem p = problem_3090();
  double tightest = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const ParallelConfig c = random_cutpoint(rng, p);
    SCOPED_TRACE(describe(c));
    const planner::CutpointSegments s = planner::cutpoint_segments(p, c);
    const double floor =
        planner::cutpoint_step_floor(p, c, planner::time_micro_batch(s.first, s.first_config),
                                     planner::time_micro_batch(s.second, s.second_config));
    const double step = planner::evaluate(p, c).predicted.step_seconds;
    EXPECT_GT(floor, 0);
    EXPECT_LE(floor, step * (1 + 1e-12));
    tightest = std::max(tightest, floor / step);
  }
  EXPECT_GT(tightest, 0.9);  // a floor that prunes: some plans are mostly their micro-batches
}

// The pruned search finds exactly the plan the exhaustive one does: the best cutpoint plan (only
// cutpoints in the space, so that the pruning decides), with each offload mode, where device
// memory binds, where host memory does, and where none does; and the best plan of all.
TEST(Search, CutpointPruningLosesNothing) {
  struct Case {
    const char* name;
    api::ModelDims model;
    double device_gib, host_gib;
    bool ignore_memory;
  };
  const Case cases[] = {
      {"1.2B, 24 GiB GPUs", {24, 2048, 16, 8192, 50257, 1024}, 24, 256, false},
      {"1.2B, 6 GiB GPUs", {24, 2048, 16, 8192, 50257, 1024}, 6, 256, false},
      {"5B, 24 GiB GPUs, 160 GiB host", {24, 4096, 32, 16384, 50257, 1024}, 24, 160, false},
      {"5B, 24 GiB GPUs, 1 TiB host", {24, 4096, 32, 16384, 50257, 1024}, 24, 1024, false},
      {"5B, memory ignored", {24, 4096, 32, 16384, 50257, 1024}, 24, 96, true},
  };
  const std::vector<api::OffloadMode> modes[] = {
      {OffloadMode::kNone},
      {OffloadMode::kOptimizer},
      {OffloadMode::kWindow},
      {OffloadMode::kNone, OffloadMode::kOptimizer, OffloadMode::kWindow}};
  int64_t compared = 0, pruned_fewer = 0;
  for (const Case& k : cases) {
    Problem p = problem_3090();
    p.model = k.model;
    p.memory_budget = k.device_gib * api::kGiB;
    p.host_memory_per_node = k.host_gib * api::kGiB;
    p.ignore_memory = k.ignore_memory;
    for (bool only : {true, false})
      for (const auto& offload : modes) {
        SCOPED_TRACE(std::string(k.name) + (only ? ", cutpoints only" : ", every plan") +
                     ", offload modes " + std::to_string(offload.size()) + " from " +
                     std::string(api::to_string(offload.front())));
        planner::SearchSpace space;
        space.cutpoints = true;
        space.cutpoints_only = only;
        space.offload = offload;
        space.distributed_optimizer = {false, true};
        const planner::SearchResult pruned = planner::search(p, 1, 4, space);
        space.prune_cutpoints = false;
        const planner::SearchResult every = planner::search(p, 1, 4, space);
        ASSERT_EQ(pruned.best.has_value(), every.best.has_value());
        EXPECT_EQ(pruned.nearest_miss.has_value(), every.nearest_miss.has_value());
        EXPECT_LE(pruned.evaluated, every.evaluated);
        if (!every.best) continue;
        const ParallelConfig& a = pruned.best->config;
        const ParallelConfig& b = every.best->config;
        SCOPED_TRACE("exhaustive: " + describe(b) + "; pruned: " + describe(a));
        EXPECT_DOUBLE_EQ(pruned.best->eval.predicted.step_seconds,
                         every.best->eval.predicted.step_seconds);
        EXPECT_EQ(
            std::tie(a.tp, a.dp, a.micro_batch, a.cut_layer, a.cut_tp, a.gpu_units, a.window),
            std::tie(b.tp, b.dp, b.micro_batch, b.cut_layer, b.cut_tp, b.gpu_units, b.window));
        EXPECT_EQ(a.offload, b.offload);
        EXPECT_EQ(a.distributed_optimizer, b.distributed_optimizer);
        ++compared;
        pruned_fewer += pruned.evaluated < every.evaluated / 2;
      }
  }
  EXPECT_GE(compared, 30);      // most spaces have a plan
  EXPECT_GE(pruned_fewer, 10);  // and the pruning prunes
}

// The search's prediction of the plan it chooses is the cost model's for that plan: its cached
// micro-batch timings are those of the plan's own shape (on CPU nodes, where a rank's rate is
// its share of the cores, also of its ranks per node; the compute lower bound keeps the shapes
// of this test from meeting a stale timing, so it checks the invariant, not that key).
TEST(Search, ChosenPlansPredictionIsTheCostModels) {
  Problem cpu = problem_cpu(api::find_model_preset("tiny")->dims);
  cpu.cpu_cores_per_node = 8;
  const Problem gpu = problem_3090();
  for (const Problem* p : std::initializer_list<const Problem*>{&cpu, &gpu})
    for (int64_t max_nodes : {1, 2}) {
      SCOPED_TRACE(std::string(p->cpu_device ? "cpu" : "gpu") + ", nodes " +
                   std::to_string(max_nodes));
      const planner::SearchResult r = planner::search(
          *p, max_nodes, p->cpu_device ? p->cpu_cores_per_node : 4, planner::SearchSpace{});
      ASSERT_TRUE(r.best.has_value());
      EXPECT_DOUBLE_EQ(r.best->eval.predicted.step_seconds,
                       planner::evaluate(*p, r.best->config).predicted.step_seconds);
    }
}

// Per-stage TP (a cut between pipeline stages): random stage cuts on 2 nodes × 4 GPUs — the
// step is never below the 1F1B floor the search prunes with, the pipeline's forward and
// backward lies between the all-fast and the all-slow stage timing's, and the memory is the
// fuller part's.
ParallelConfig random_stage_cut(std::mt19937& rng, const Problem& p) {
  const auto draw = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const std::pair<int64_t, int64_t> degrees[] = {{1, 2}, {2, 1}, {1, 4}, {4, 1}, {2, 4}, {4, 2}};
  const auto [t1, t2] = degrees[static_cast<size_t>(draw(0, 5))];
  const Recompute rc[] = {Recompute::kNone, Recompute::kCommAware, Recompute::kFull};
  ParallelConfig c;
  c.nodes = 2;
  c.procs_per_node = 4;
  c.pp = draw(0, 1) ? 2 : 4;  // of 8 ranks: stages of 4 or 2
  if (c.pp == 4 && (t1 == 4 || t2 == 4)) c.pp = 2;
  c.tp = t1;
  c.dp = 8 / c.pp / t1;
  c.micro_batch = 4;
  c.grad_accum = p.global_batch / c.dp / c.micro_batch;
  c.sub_batches = (4 * t2 / t1) % 2 == 0 && draw(0, 1) ? 2 : 1;
  c.recompute = rc[draw(0, 2)];
  c.distributed_optimizer = draw(0, 1) == 1;
  c.gpu_units = p.model.layers / c.pp + 1;
  c.cut_tp = t2;
  c.cut_layer = draw(1, c.pp - 1) * (p.model.layers / c.pp);
  return c;
}
TEST(CostModel, PerStageTensorParallelJoinsTwoPipelines) {
  const uint32_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (KT_TEST_SEED replays it)");
  std::mt19937 rng(seed);
  Problem p = problem_3090();
  p.ignore_memory = true;
  for (int trial = 0; trial < 200; ++trial) {
    const ParallelConfig c = random_stage_cut(rng, p);
    SCOPED_TRACE(describe(c) + ", pp " + std::to_string(c.pp));
    const planner::StageCutParts parts = planner::stage_cut_parts(p, c);
    ASSERT_EQ(parts.cut_stage * (p.model.layers / c.pp), c.cut_layer);
    EXPECT_EQ(parts.after_config.tp * parts.after_config.dp, c.tp * c.dp);
    EXPECT_EQ(parts.after_config.pp, c.pp - parts.cut_stage);
    const planner::Evaluation a = planner::evaluate(parts.before, parts.before_config);
    const planner::Evaluation b = planner::evaluate(parts.after, parts.after_config);
    const planner::Evaluation joined = planner::evaluate(p, c);
    const double floor = planner::stage_cut_step_floor(
        c, parts.cut_stage, planner::time_micro_batch(parts.before, parts.before_config),
        planner::time_micro_batch(parts.after, parts.after_config));
    EXPECT_GT(floor, 0);
    EXPECT_LE(floor, joined.predicted.step_seconds * (1 + 1e-12));
    // Every stage at the faster part's slot, or every stage at the slower one's (plus the
    // re-shard, at most one all-gather per micro-batch's slot).
    const double m = static_cast<double>(c.grad_accum), slots = m + static_cast<double>(c.pp) - 1;
    const double slot_a = a.forward_backward / (m + static_cast<double>(c.pp) - 1);
    const double slot_b = b.forward_backward / (m + static_cast<double>(parts.after_config.pp) - 1);
    EXPECT_GE(joined.forward_backward, slots * std::min(slot_a, slot_b) * (1 - 1e-9));
    EXPECT_LE(joined.forward_backward,
              slots * std::max(slot_a, slot_b) + m * joined.predicted.time.tp_comm_total);
    EXPECT_GE(joined.predicted.memory.total(),
              std::max(a.predicted.memory.total(), b.predicted.memory.total()));
    EXPECT_GT(joined.predicted.tokens_per_second, 0);
  }
}

// The search with per-stage TP pruned (memory, the 1F1B floor) chooses exactly the plan it
// chooses evaluating every stage cut: stage cuts only, and every plan, without offload or with
// offload optimizer, where memory binds and where it does not.
TEST(Search, StageCutPruningLosesNothing) {
  struct Case {
    const char* name;
    api::ModelDims model;
    double device_gib;
    bool ignore_memory;
  };
  const Case cases[] = {
      {"1.2B, 24 GiB GPUs", {24, 2048, 16, 8192, 50257, 1024}, 24, false},
      {"1.2B, 8 GiB GPUs", {24, 2048, 16, 8192, 50257, 1024}, 8, false},
      {"5B, 24 GiB GPUs", {24, 4096, 32, 16384, 50257, 1024}, 24, false},
      {"5B, memory ignored", {24, 4096, 32, 16384, 50257, 1024}, 24, true},
  };
  int64_t compared = 0, stage_cuts = 0, stage_cut_offload = 0, pruned_fewer = 0;
  for (const Case& k : cases) {
    Problem p = problem_3090();
    p.model = k.model;
    p.memory_budget = k.device_gib * api::kGiB;
    p.ignore_memory = k.ignore_memory;
    for (bool only : {true, false}) {
      SCOPED_TRACE(std::string(k.name) + (only ? ", cutpoints only" : ", every plan"));
      planner::SearchSpace space;
      space.pp = {2, 4};
      space.cutpoints = true;
      space.cutpoints_only = only;
      space.stage_cuts = true;
      space.offload = {OffloadMode::kNone, OffloadMode::kOptimizer, OffloadMode::kWindow};
      space.distributed_optimizer = {false, true};
      const planner::SearchResult pruned = planner::search(p, 2, 4, space);
      space.prune_cutpoints = false;
      const planner::SearchResult every = planner::search(p, 2, 4, space);
      ASSERT_EQ(pruned.best.has_value(), every.best.has_value());
      EXPECT_LE(pruned.evaluated, every.evaluated);
      if (!every.best) continue;
      const ParallelConfig& a = pruned.best->config;
      const ParallelConfig& b = every.best->config;
      SCOPED_TRACE("exhaustive: " + describe(b) + " pp " + std::to_string(b.pp) +
                   "; pruned: " + describe(a) + " pp " + std::to_string(a.pp));
      EXPECT_DOUBLE_EQ(pruned.best->eval.predicted.step_seconds,
                       every.best->eval.predicted.step_seconds);
      EXPECT_EQ(std::tie(a.tp, a.dp, a.pp, a.micro_batch, a.cut_layer, a.cut_tp, a.sub_batches),
                std::tie(b.tp, b.dp, b.pp, b.micro_batch, b.cut_layer, b.cut_tp, b.sub_batches));
      EXPECT_EQ(a.recompute, b.recompute);
      EXPECT_EQ(a.distributed_optimizer, b.distributed_optimizer);
      EXPECT_EQ(std::tie(a.offload, a.gpu_units), std::tie(b.offload, b.gpu_units));
      ++compared;
      stage_cuts += b.cut_layer > 0 && b.pp > 1;
      stage_cut_offload += b.cut_layer > 0 && b.pp > 1 && b.offload != OffloadMode::kNone;
      pruned_fewer += pruned.evaluated < every.evaluated;
    }
  }
  EXPECT_GE(compared, 6);
  EXPECT_GE(stage_cuts, 3);    // the cutpoints-only searches choose a cut between stages
  EXPECT_GE(stage_cut_offload, 1);  // some of them with offload optimizer
  EXPECT_GE(pruned_fewer, 3);  // and the pruning prunes
}

}  // namespace
}  // namespace kt

namespace kt {
namespace {

// The breakdown the plan table prints as "exposed X of Y": no phase's exposed part exceeds its
// total, for every offload mode, parallel layout and device kind (a CPU rank's offload lanes
// are all exposed, so there exposed equals total).
TEST(CostModel, NoPhaseIsExposedBeyondItsTotal) {
  struct Case {
    Problem p;
    ParallelConfig c;
  };
  std::vector<Case> cases;
  const Problem cpu = problem_cpu({4, 256, 4, 1024, 256, 128});
  for (int64_t ranks : {1, 2})
    for (int64_t tp : {int64_t{1}, ranks})
      for (OffloadMode offload : {OffloadMode::kNone, OffloadMode::kOptimizer, OffloadMode::kWindow})
        for (int64_t units : {1, 3, 5})
          for (bool zero : {false, true}) {
            ParallelConfig c;
            c.procs_per_node = ranks;
            c.tp = tp;
            c.dp = ranks / tp;
            c.micro_batch = 8 / c.dp;
            c.offload = offload;
            c.gpu_units = offload == OffloadMode::kNone ? 5 : units;
            if (offload == OffloadMode::kWindow && units > cpu.model.layers) continue;
            c.window = 1;
            c.distributed_optimizer = zero && c.dp > 1;
            cases.push_back({cpu, c});
          }
  // (8 nodes, ZeRO-1, every unit updated on the CPU: the plan that once printed "CPU exposed
  // 0.304 of 0.043", the data-parallel wait counted as CPU AdamW.)
  for (int64_t nodes : {1, 8})
    for (int64_t tp : {1, 2, 4})
      for (OffloadMode offload : {OffloadMode::kNone, OffloadMode::kOptimizer, OffloadMode::kWindow})
        for (int64_t units : {0, 4, 12, 25})
          for (bool zero : {false, true}) {
            ParallelConfig c = config(tp, 4, 1, Recompute::kNone);
            c.nodes = nodes;  // over the network, the data-parallel sums are slow
            c.dp *= nodes;
            c.micro_batch = std::min<int64_t>(4, 64 / c.dp);
            c.grad_accum = 64 / c.dp / c.micro_batch;
            c.offload = offload;
            c.gpu_units = offload == OffloadMode::kNone ? 25 : units;
            if (offload == OffloadMode::kWindow && (units < 1 || units > 24)) continue;
            c.window = 1;
            c.distributed_optimizer = zero;
            cases.push_back({problem_3090(), c});
          }
  for (const Case& k : cases) {
    const auto ev = planner::evaluate(k.p, k.c);
    const auto& t = ev.predicted.time;
    const std::string what = planner::describe_config(k.c) + (k.p.cpu_device ? " (CPU)" : " (GPU)");
    constexpr double eps = 1e-12;
    EXPECT_LE(t.tp_comm_exposed, t.tp_comm_total + eps) << what;
    EXPECT_LE(t.dp_comm_exposed, t.dp_comm_total + eps) << what;
    EXPECT_LE(t.optimizer_cpu_exposed, t.optimizer_cpu_total + eps) << what;
    for (double v : {t.tp_comm_exposed, t.dp_comm_exposed, t.optimizer_cpu_exposed, t.transfer_exposed})
      EXPECT_GE(v, 0) << what;
  }
}

}  // namespace
}  // namespace kt

#include "planner/cost_model.h"

#include <algorithm>
#include <cmath>

#include "api/cpu_activations.h"
#include "api/error.h"
#include "api/flops.h"
#include "api/quantity.h"
// (header-only: the order of a pipeline stage's sweeps, which decides what the window refetches)
#include "worker/pipeline_order.h"

namespace kt::planner {
namespace {
// Gradients are fp32 in both workers whatever the compute precision (the models accumulate them
// so, as Megatron's main_grad): their memory, their DP sums and their copies home.
constexpr double kGradBytes = 4.0;
}  // namespace

namespace {

// Device memory a CUDA rank cannot use for tensors: the CUDA context (~0.5 GiB on Hopper with
// cuBLAS/cuDNN/NCCL loaded) plus a fragmentation reserve of the caching allocator (5 %).
constexpr double kCudaContextBytes = 0.5 * api::kGiB;
constexpr double kFragmentationReserve = 0.05;
// cuBLAS(Lt) workspace, cuDNN attention workspace and NCCL channel buffers.
constexpr double kGpuWorkspaceBytes = 512 * api::kMiB;
// A CPU rank process's own memory before any tensor: the binary and its libraries (oneDNN,
// Gloo, OpenMP), thread stacks, the allocator's arenas, the data loader and the metrics server.
// Measured: kubetrain-worker train of the tiny preset peaks at 210 MiB of PSS (2026-12-07, the
// 2-core build host, docs/PERFORMANCE.md "Memory"); 256 MiB leaves room for more threads.
constexpr double kCpuProcessBytes = 256 * api::kMiB;
// Host memory left to the OS, the kubelet, data loaders and the page cache.
constexpr double kHostUsableFraction = 0.85;
using api::kAdamBytesPerParam;

// Fixed costs of offloading that the lanes above do not see: per step, the hand-off between
// the device stream and the CPU optimizer pool (events, host callbacks, waking the pool); per
// host<->device copy, the launch and completion latency of an async copy. Engineering
// estimates (not from a paper), to be replaced by measurement. They are why a model that fits
// is not offloaded just to hide a sub-millisecond device AdamW.
constexpr double kOffloadStepOverhead = 2e-3;
constexpr double kCopyLatency = 10e-6;

struct Op {
  double comp = 0;  // seconds on the compute stream
  double comm = 0;  // seconds of the TP all-reduce that follows it (0: none)
};

// Runs ops on a compute stream and a communication stream. With one sub-batch every op is
// followed by its blocking all-reduce. With two, the ops of sub-batches A and B alternate on
// the compute stream (A1 B1 A2 B2 ...), each all-reduce goes to the comm stream in issue order,
// and an op waits for its own sub-batch's previous all-reduce: the Oases schedule, whose
// makespan is comp_0 + Σ max(comp_i, comm_{i-1}) + comm_last when the ops are uniform.
// `boundary` ops in, the time at which every sub-batch has finished op boundary-1 is recorded.
// `interference`: compute's slow-down while an all-reduce runs beside it (the profile's
// overlap_interference: NCCL's ring kernels occupy SMs and compete for memory bandwidth; on a
// CPU, Gloo's threads compete for cores and DRAM). 0 would make overlap free.
double simulate_streams(const std::vector<Op>& ops, int64_t sub_batches, size_t boundary,
                        double interference, double* boundary_time) {
  if (sub_batches == 1) {
    double t = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (i == boundary) *boundary_time = t;
      t += ops[i].comp + ops[i].comm;
    }
    if (boundary >= ops.size()) *boundary_time = t;
    return t;
  }
  double compute_free = 0, comm_free = 0;
  double last_comm = 0;  // duration of the all-reduce issued just before this op
  double ready[2] = {0, 0};
  for (size_t i = 0; i < ops.size(); ++i) {
    if (i == boundary) *boundary_time = std::max(ready[0], ready[1]);
    for (int x = 0; x < 2; ++x) {
      const double start = std::max(compute_free, ready[x]);
      // An op is scheduled to hide the all-reduce issued just before it, and runs slower
      // beside it. Charged on durations (not on the simulated overlap) so that every time
      // stays monotone in every duration: a faster link never predicts a slower step.
      const double shared = std::min(ops[i].comp, last_comm);
      const double end = start + ops[i].comp + interference * shared;
      compute_free = end;
      last_comm = ops[i].comm;
      if (ops[i].comm > 0) {
        const double comm_start = std::max(end, comm_free);
        comm_free = comm_start + ops[i].comm;
        ready[x] = comm_free;
      } else {
        ready[x] = end;
      }
    }
  }
  const double total = std::max(ready[0], ready[1]);
  if (boundary >= ops.size()) *boundary_time = total;
  return total;
}

double cpu_threads_per_rank(const Problem& p, const ParallelConfig& c) {
  return std::max<double>(1.0, std::floor(static_cast<double>(p.cpu_cores_per_node) /
                                          static_cast<double>(c.procs_per_node)));
}

// The bus bandwidth of a DP group's all-reduce: the intra-node link while a stage's t·d ranks
// fit in a node (DP groups are the ranks with the same TP position: Megatron's order), else the
// node's NICs, which carry one ring per TP position (t DP groups at once).
double dp_bus_bandwidth(const Problem& p, const ParallelConfig& c) {
  const auto& hw = p.hw;
  if (c.nodes > 1 && c.tp * c.dp > c.procs_per_node)
    return std::min(hw.intra_allreduce_busbw, hw.inter_node_bandwidth / static_cast<double>(c.tp));
  return hw.intra_allreduce_busbw;
}

}  // namespace

double host_link_bandwidth(const Problem& p, const ParallelConfig& c) {
  if (p.cpu_device) return p.hw.host_link_bandwidth / p.hw.transfer_scale;  // host-to-host
  // All GPUs of a node copy to and from the same DRAM, in both directions at once. The DRAM's
  // sustained bandwidth is what the CPU AdamW roofline is built on (params/s per core × 28 B).
  const double dram = static_cast<double>(p.cpu_cores_per_node) * p.hw.cpu_adam_params_per_core *
                      kAdamBytesPerParam;
  return std::min(p.hw.host_link_bandwidth, dram / (2.0 * static_cast<double>(c.procs_per_node))) /
         p.hw.transfer_scale;
}

int64_t bytes_per_element(api::Precision p) {
  return p == api::Precision::kBf16 ? 2 : 4;
}

double layer_forward_flops(const ModelDims& m, double b, int64_t t) {
  const double s = m.seq_len, h = m.hidden, f = m.ffn_hidden;
  // QKV 6bsh², attention scores and values 4bs²h, projection 2bsh², MLP 4bshf.
  return (8 * b * s * h * h + 4 * b * s * h * f + 4 * b * s * s * h) / t;
}

double logits_forward_flops(const ModelDims& m, double b, int64_t t) {
  return 2.0 * b * m.seq_len * m.hidden * static_cast<double>(m.padded_vocab()) / t;
}

double layer_recompute_flops(const ModelDims& m, double b, int64_t t, Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return 0;
    case Recompute::kFull:
      return layer_forward_flops(m, b, t);
    case Recompute::kCommAware: {
      // The outputs of the row-parallel GEMMs (attention projection 2bsh², fc2 2bshf) are the
      // saved post-all-reduce tensors, so those two GEMMs are not recomputed.
      const double s = m.seq_len, h = m.hidden, f = m.ffn_hidden;
      return layer_forward_flops(m, b, t) - (2 * b * s * h * h + 2 * b * s * h * f) / t;
    }
  }
  return 0;
}

double layer_activation_bytes(const ModelDims& m, double b, int64_t t, Recompute r) {
  const double s = m.seq_len, h = m.hidden, a = m.heads;
  switch (r) {
    case Recompute::kNone:
      return s * b * h * (10 + 24.0 / t + 5 * a * s / (h * t));
    case Recompute::kFull:
      return 2 * s * b * h;
    case Recompute::kCommAware:
      return 6 * s * b * h;
  }
  return 0;
}

double allreduce_seconds(double bytes, int64_t ranks, double busbw, double latency) {
  if (ranks <= 1 || bytes <= 0) return 0;
  const double n = static_cast<double>(ranks);
  return 2 * (n - 1) * latency + 2 * (n - 1) / n * bytes / busbw;
}

double embedding_unit_params(const ModelDims& m, int64_t t) {
  const double h = m.hidden;
  return static_cast<double>(m.padded_vocab()) * h / t + m.seq_len * h + 2 * h;
}

double layer_unit_params(const ModelDims& m, int64_t t) {
  const double h = m.hidden, f = m.ffn_hidden;
  return (4 * h * h + 2 * h * f + 3 * h + f) / t + 6 * h;
}

double model_flops_per_token(const ModelDims& m) {
  return api::gpt_flops_per_token(static_cast<double>(api::parameter_count(m)), m.layers, m.hidden,
                                  m.seq_len);
}

double gpu_update_fraction(const ModelDims& m, int64_t t, int64_t gpu_units) {
  const double e = embedding_unit_params(m, t), l = layer_unit_params(m, t);
  const double total = e + m.layers * l;
  if (gpu_units <= 0) return 0;
  return std::min(1.0, (e + (gpu_units - 1) * l) / total);
}

int64_t gpu_units_for_fraction(const ModelDims& m, int64_t t, double f) {
  for (int64_t k = 0; k <= m.layers + 1; ++k)
    if (gpu_update_fraction(m, t, k) >= f - 1e-9) return k;
  return m.layers + 1;
}

double rank_flops_per_second(const Problem& p, const ParallelConfig& c) {
  const auto& hw = p.hw;
  const double peak =
      p.precision == api::Precision::kBf16 ? hw.peak_bf16_flops : hw.peak_fp32_flops;
  const double per_rank = p.cpu_device ? peak * cpu_threads_per_rank(p, c) : peak;
  const double eta = p.precision == api::Precision::kBf16 && hw.achieved_fraction_bf16 > 0
                         ? hw.achieved_fraction_bf16
                         : hw.achieved_fraction;
  return per_rank * eta / hw.compute_scale;
}

double device_capacity(const Problem& p, const ParallelConfig& c) {
  double capacity = p.cpu_device ? kHostUsableFraction * p.host_memory_per_node / c.procs_per_node
                                 : p.hw.memory_bytes;
  if (p.memory_budget > 0) capacity = std::min(capacity, p.memory_budget);
  return capacity;
}

MicroBatchTiming time_micro_batch(const Problem& p, const ParallelConfig& c) {
  const auto& m = p.model;
  const double rate = rank_flops_per_second(p, c);
  const double b = static_cast<double>(c.micro_batch) / c.sub_batches;
  const double s = m.seq_len, h = m.hidden, f = m.ffn_hidden;
  const double ar = allreduce_seconds(b * s * h * bytes_per_element(p.precision), c.tp,
                                      p.hw.intra_allreduce_busbw, p.hw.allreduce_latency) *
                    p.hw.tp_comm_scale;
  const double attn = (8 * b * s * h * h + 4 * b * s * s * h) / c.tp / rate;
  const double mlp = 4 * b * s * h * f / c.tp / rate;
  // A recompute pass runs at its own measured rate (HardwareProfile::recompute_rate_ratio).
  const double recompute_ratio = p.hw.recompute_rate_ratio;
  const double logits = logits_forward_flops(m, b, c.tp) / rate;

  // One pipeline stage's layers (all of them without a pipeline). The stage timed is the last,
  // which also runs the LM head: the slowest, so the one the 1F1B schedule waits for.
  const int64_t stage_layers = m.layers / c.pp;
  thread_local std::vector<Op> ops;  // (kept: the search times thousands of micro-batches)
  ops.clear();
  ops.reserve(6 * stage_layers + 2);
  ops.push_back({0, ar});  // vocab-parallel embedding: all-reduce of the looked-up rows
  for (int64_t l = 0; l < stage_layers; ++l) {
    ops.push_back({attn, ar});  // attention block, row-parallel projection all-reduce
    ops.push_back({mlp, ar});   // MLP block, row-parallel fc2 all-reduce
  }
  const size_t boundary = ops.size();
  // LM head forward + backward (3× the logits GEMM); the gradient of the final LayerNorm
  // output is summed over the vocabulary shards.
  ops.push_back({3 * logits, ar});
  for (int64_t l = 0; l < stage_layers; ++l) {
    if (c.recompute == Recompute::kFull) {
      ops.push_back({attn / recompute_ratio, ar});
      ops.push_back({mlp / recompute_ratio, ar});
    } else if (c.recompute == Recompute::kCommAware) {
      ops.push_back(
          {layer_recompute_flops(m, b, c.tp, Recompute::kCommAware) / (rate * recompute_ratio), 0});
    }
    ops.push_back({2 * mlp, ar});   // fc2, GELU, fc1 backward; all-reduce of the input grad
    ops.push_back({2 * attn, ar});  // attention backward; all-reduce of the input grad
  }

  MicroBatchTiming timing;
  double forward_end = 0;
  const double total =
      simulate_streams(ops, c.sub_batches, boundary, p.hw.overlap_interference, &forward_end);
  timing.forward = forward_end;
  timing.backward = total - forward_end;
  for (const auto& op : ops) {
    timing.compute += op.comp * c.sub_batches;
    timing.tp_comm += op.comm * c.sub_batches;
    if (op.comm > 0) timing.allreduces += c.sub_batches;
  }
  return timing;
}

Evaluation evaluate(const Problem& p, const ParallelConfig& c) {
  if (c.cut_layer > 0 && c.pp > 1) {
    const StageCutParts s = stage_cut_parts(p, c);
    return join_stage_cut(p, c, evaluate(s.before, s.before_config),
                          evaluate(s.after, s.after_config));
  }
  if (c.cut_layer > 0) {
    const CutpointSegments s = cutpoint_segments(p, c);
    return join_cutpoint(p, c, evaluate(s.first, s.first_config),
                         evaluate(s.second, s.second_config));
  }
  return evaluate(p, c, time_micro_batch(p, c));
}

std::pair<ParallelConfig, ParallelConfig> cutpoint_configs(const Problem& p,
                                                           const ParallelConfig& c) {
  KT_CHECK(c.cut_layer > 0 && c.cut_layer < p.model.layers && c.cut_tp > 0 && c.pp == 1,
           "a cutpoint inside the model, without stages");
  // With offload optimizer, the model's first gpuUnits units (the embeddings', then the layers
  // in order) are on the device: each segment its part (api::part_device_units).
  const bool offload = c.offload != api::OffloadMode::kNone;
  const int64_t L = p.model.layers, k = c.cut_layer;
  ParallelConfig first = c;
  first.cut_layer = first.cut_tp = 0;
  first.gpu_units = offload ? api::part_device_units(c.gpu_units, 0, k) : k + 1;
  ParallelConfig second = first;
  second.tp = c.cut_tp;
  second.dp = c.nodes * c.procs_per_node / c.cut_tp;
  second.micro_batch = c.micro_batch * c.cut_tp / c.tp;
  second.gpu_units = offload ? api::part_device_units(c.gpu_units, k, L - k) : L - k + 1;
  // With the window, a segment whose layers are all on the device streams none: its engine
  // updates them there (worker/offload.h), as offload optimizer with every unit on the device.
  for (ParallelConfig* segment : {&first, &second})
    if (segment->offload == api::OffloadMode::kWindow &&
        segment->gpu_units > (segment == &first ? k : L - k))
      segment->offload = api::OffloadMode::kOptimizer;
  return {first, second};
}

CutpointSegments cutpoint_segments(const Problem& p, const ParallelConfig& c) {
  CutpointSegments s;
  std::tie(s.first_config, s.second_config) = cutpoint_configs(p, c);
  s.first = s.second = p;
  s.first.model.layers = c.cut_layer;
  s.second.model.layers = p.model.layers - c.cut_layer;
  return s;
}

std::vector<int64_t> cutpoint_memory_breaks(const Problem& p, const ParallelConfig& c) {
  // Each segment's memory is affine in its layers, its device units and its window's slots
  // (evaluate_memory). Its device units are a prefix of the model's (cutpoint_configs): the first
  // segment holds all of its own up to k = u − 1 (with the window, as optimizer offload from
  // there down), the second those past k until then; the slots, min(W, streamed), saturate
  // at k = u + W − 1 in the first and at k = L − W in the second.
  const int64_t L = p.model.layers, u = c.gpu_units;
  std::vector<int64_t> breaks{1, L - 1};
  if (c.offload != api::OffloadMode::kNone)
    for (int64_t k : {u - 1, u, u + c.window - 1, L - c.window})
      if (k >= 1 && k < L) breaks.push_back(k);
  std::sort(breaks.begin(), breaks.end());
  breaks.erase(std::unique(breaks.begin(), breaks.end()), breaks.end());
  return breaks;
}

CutpointJoints cutpoint_joints(const Problem& p, const ParallelConfig& c) {
  const auto& m = p.model;
  const auto& hw = p.hw;
  const auto [c1, c2] = cutpoint_configs(p, c);
  const double bpe = bytes_per_element(p.precision);
  const double sh = static_cast<double>(m.seq_len) * m.hidden;
  const double b1 = static_cast<double>(c1.micro_batch), b2 = static_cast<double>(c2.micro_batch);
  const double accum = static_cast<double>(c.grad_accum);
  CutpointJoints j;
  j.lm_head = accum * 3 * logits_forward_flops(m, b1, c1.tp) /
              rank_flops_per_second(p, c1);  // the first runs none
  j.emb_allreduce =                          // nor the second its embedding's TP all-reduce
      c2.tp > 1 ? accum *
                      allreduce_seconds(b2 * sh * bpe, c2.tp, hw.intra_allreduce_busbw,
                                        hw.allreduce_latency) *
                      hw.tp_comm_scale
                : 0.0;
  // Each segment's DP sum of the embeddings' unit, replaced by one sum over the world of the
  // unsharded tensors (both layouts at once).
  auto unit0_dp = [&](const ParallelConfig& x) {
    return x.dp > 1 ? allreduce_seconds(embedding_unit_params(m, x.tp) * kGradBytes, x.dp,
                                        dp_bus_bandwidth(p, x), hw.allreduce_latency) *
                          hw.dp_comm_scale
                    : 0.0;
  };
  const double unit0 = static_cast<double>(m.padded_vocab()) * m.hidden + sh + 2.0 * m.hidden;
  const double world_busbw =
      c.nodes > 1 ? std::min(hw.intra_allreduce_busbw,
                             hw.inter_node_bandwidth / static_cast<double>(c.procs_per_node))
                  : hw.intra_allreduce_busbw;
  j.world_sum = allreduce_seconds(unit0 * kGradBytes, c.nodes * c.procs_per_node, world_busbw,
                                  hw.allreduce_latency) *
                hw.dp_comm_scale;
  // The re-shard: an all-gather (half a ring all-reduce) of the wider side's activations over
  // the cut group, inside a node, once per micro-batch (forward or backward).
  const int64_t group = std::max(c1.tp, c2.tp) / std::min(c1.tp, c2.tp);
  j.reshard = accum *
              allreduce_seconds(std::max(b1, b2) * sh * bpe, group, hw.intra_allreduce_busbw,
                                hw.allreduce_latency) /
              2;
  j.dp_saved = unit0_dp(c1) + unit0_dp(c2);
  return j;
}

double cutpoint_step_floor(const Problem& p, const ParallelConfig& c, const MicroBatchTiming& first,
                           const MicroBatchTiming& second) {
  // Each segment's step (evaluate) ends no earlier than its micro-batches' forwards and
  // backwards (the window's streaming only delays them; the DP sums, the optimizer and the
  // copies only add), plus offload's fixed cost; the DRAM roofline only stretches it.
  const double accum = static_cast<double>(c.grad_accum);
  const double overhead = c.offload == api::OffloadMode::kNone ? 0.0 : kOffloadStepOverhead;
  return accum * (first.forward + first.backward + second.forward + second.backward) +
         2 * overhead + cutpoint_joints(p, c).delta();
}

Evaluation join_cutpoint(const Problem& p, const ParallelConfig& c, const Evaluation& first,
                         const Evaluation& second) {
  const auto& m = p.model;
  const auto& hw = p.hw;
  const auto [c1, c2] = cutpoint_configs(p, c);
  const double sh = static_cast<double>(m.seq_len) * m.hidden;
  const double b1 = static_cast<double>(c1.micro_batch), b2 = static_cast<double>(c2.micro_batch);
  const double world = static_cast<double>(c.nodes * c.procs_per_node);
  Evaluation ev = second;  // capacities: the same ranks
  auto& mem = ev.predicted.memory;
  const auto& m1 = first.predicted.memory;
  mem.params += m1.params;
  mem.optimizer += m1.optimizer;
  // The world sum's buffer: the embeddings' unit unsharded, fp32.
  const double unit0 = static_cast<double>(m.padded_vocab()) * m.hidden + sh + 2.0 * m.hidden;
  mem.grads += m1.grads + unit0 * 4;
  // The first segment allocates no logits; the cut keeps each side's activations and their
  // gradients (fp32) for the re-shard.
  mem.activations +=
      m1.activations -
      b1 * m.seq_len * static_cast<double>(m.padded_vocab()) / static_cast<double>(c1.tp) * 4 +
      2 * (b1 + b2) * sh * 4;
  ev.predicted.host_bytes_per_node += first.predicted.host_bytes_per_node;
  ev.device_ratio = mem.total() / ev.predicted.device_capacity_bytes;
  const double host_needed =
      ev.predicted.host_bytes_per_node + (p.cpu_device ? mem.total() * c.procs_per_node : 0);
  ev.host_ratio = host_needed / ev.predicted.host_capacity_bytes;
  ev.fits = p.ignore_memory || (ev.device_ratio <= 1.0 && ev.host_ratio <= 1.0);
  if (first.predicted.step_seconds <= 0 || second.predicted.step_seconds <= 0) {
    ev.predicted.step_seconds = ev.predicted.tokens_per_second = ev.predicted.mfu = 0;
    ev.predicted.time = {};
    return ev;
  }

  // ---- time: the two segments' steps, less what neither runs, plus the joints ----
  const CutpointJoints j = cutpoint_joints(p, c);
  auto& pred = ev.predicted;
  pred.step_seconds = first.predicted.step_seconds + second.predicted.step_seconds - j.lm_head -
                      j.emb_allreduce - j.dp_saved + j.world_sum + j.reshard;
  auto& t = pred.time;
  const auto& t1 = first.predicted.time;
  const auto& t2 = second.predicted.time;
  t.compute = t1.compute + t2.compute - j.lm_head;
  t.tp_comm_total = t1.tp_comm_total + t2.tp_comm_total - j.emb_allreduce;
  t.tp_comm_exposed = std::max(0.0, t1.tp_comm_exposed + t2.tp_comm_exposed - j.emb_allreduce);
  t.dp_comm_total = t1.dp_comm_total + t2.dp_comm_total - j.dp_saved + j.world_sum + j.reshard;
  t.dp_comm_exposed =
      std::max(0.0, t1.dp_comm_exposed + t2.dp_comm_exposed - j.dp_saved + j.world_sum + j.reshard);
  t.transfer_total = t1.transfer_total + t2.transfer_total;
  t.transfer_exposed = t1.transfer_exposed + t2.transfer_exposed;
  t.optimizer_gpu = t1.optimizer_gpu + t2.optimizer_gpu;
  t.optimizer_cpu_total = t1.optimizer_cpu_total + t2.optimizer_cpu_total;
  t.optimizer_cpu_exposed = t1.optimizer_cpu_exposed + t2.optimizer_cpu_exposed;
  pred.pcie_bytes_per_step =
      first.predicted.pcie_bytes_per_step + second.predicted.pcie_bytes_per_step;
  pred.tokens_per_second = static_cast<double>(p.global_batch) * m.seq_len / pred.step_seconds;
  const double peak =
      (p.precision == api::Precision::kBf16 ? hw.peak_bf16_flops : hw.peak_fp32_flops) *
      (p.cpu_device ? cpu_threads_per_rank(p, c) : 1.0);
  pred.mfu = pred.tokens_per_second * model_flops_per_token(m) / (world * peak);
  return ev;
}

namespace {

// The offload window in one model chunk of a stage (the stage itself without virtual stages):
// its resident and streamed layers, its slots, the micro-batches it keeps in flight (a streamed
// layer's checkpoint each, in host memory), and its turns — sweeps that follow a sweep of the
// same direction (1F1B's warm-up forwards, its drain's backwards), each of which first refetches
// the slots' layers the last sweep's end did not leave (worker/offload.h, begin_sweep).
struct WindowChunk {
  int64_t resident = 0, streamed = 0, slots = 0, in_flight = 1, turns = 0;
  int64_t refetched() const { return slots - std::max<int64_t>(0, 2 * slots - streamed); }
};

// Where a configuration puts each offload unit: derived once, used by memory and time.
struct Shape {
  int64_t L;
  double bpe, emb, lay, params_rank;
  bool window;
  int64_t gpu_units, gpu_layers, streamed, slots;
  double gpu_params, cpu_params, pcie, b, act_layer;
  std::vector<WindowChunk> chunks;  // window mode
};

// The first stage's (the longest warm-up: the most in flight, the most turns) chunks.
std::vector<WindowChunk> window_chunks(const ParallelConfig& c, int64_t stage_layers,
                                       int64_t gpu_layers) {
  const int64_t v = c.virtual_stages, m = c.grad_accum, chunk_layers = stage_layers / v;
  std::vector<WindowChunk> chunks(static_cast<size_t>(v));
  for (int64_t k = 0; k < v; ++k) {  // a stage's device units are a prefix, chunk after chunk
    WindowChunk& w = chunks[static_cast<size_t>(k)];
    w.resident = std::clamp<int64_t>(gpu_layers - k * chunk_layers, 0, chunk_layers);
    w.streamed = chunk_layers - w.resident;
    w.slots = std::min(c.window, w.streamed);
  }
  if (c.pp == 1) return chunks;
  if (v == 1) {  // 1F1B: min(p − 1, m − 1) turns each way; min(p, m) in flight
    chunks[0].turns = 2 * std::min(c.pp - 1, m - 1);
    chunks[0].in_flight = std::min(c.pp, m);
    return chunks;
  }
  const worker::PipelineOrder order =
      worker::pipeline_order(static_cast<int>(c.pp), 0, static_cast<int>(v), m);
  std::vector<int> last(static_cast<size_t>(v), -1);  // a chunk's last sweep: 1 forward, 0 back
  for (const worker::PipelineOp& op : order.ops) {
    int& previous = last[static_cast<size_t>(op.chunk)];
    if (previous == static_cast<int>(op.forward)) ++chunks[static_cast<size_t>(op.chunk)].turns;
    previous = static_cast<int>(op.forward);
  }
  for (int64_t k = 0; k < v; ++k)
    chunks[static_cast<size_t>(k)].in_flight = order.in_flight[static_cast<size_t>(k)];
  return chunks;
}

Shape shape_of(const Problem& p, const ParallelConfig& c) {
  using api::OffloadMode;
  const auto& m = p.model;
  Shape sh;
  sh.L = m.layers / c.pp;  // the stage's layers (every stage holds the tied embeddings' unit)
  sh.bpe = bytes_per_element(p.precision);
  // Every model chunk of a stage keeps the tensors that are not per layer (with virtual stages,
  // v copies: worker/gpt_layout.h).
  sh.emb = embedding_unit_params(m, c.tp) * static_cast<double>(c.virtual_stages);
  sh.lay = layer_unit_params(m, c.tp);
  sh.params_rank = sh.emb + sh.L * sh.lay;
  sh.window = c.offload == OffloadMode::kWindow;
  sh.gpu_units = c.offload == OffloadMode::kNone ? sh.L + 1 : c.gpu_units;
  KT_CHECK(sh.gpu_units >= 0 && sh.gpu_units <= sh.L + 1, "gpu_units out of range");
  KT_CHECK(!sh.window || (sh.gpu_units >= 1 && sh.gpu_units <= sh.L && c.window >= 1),
           "window mode needs resident embeddings, a streamed layer and a slot");
  // Layers [0, gpu_layers) are resident and GPU-updated; in window mode the rest are streamed.
  sh.gpu_layers = std::max<int64_t>(0, sh.gpu_units - 1);
  sh.streamed = sh.window ? sh.L - sh.gpu_layers : 0;
  sh.slots = 0;
  if (sh.window) {
    sh.chunks = window_chunks(c, sh.L, sh.gpu_layers);
    for (const WindowChunk& w : sh.chunks) sh.slots += w.slots;  // each chunk's engine its own
  }
  sh.gpu_params = sh.gpu_units == 0 ? 0 : sh.emb + sh.gpu_layers * sh.lay;
  sh.cpu_params = sh.params_rank - sh.gpu_params;
  sh.pcie = host_link_bandwidth(p, c);
  sh.b = static_cast<double>(c.micro_batch);
  // The activation formulas count 16-bit activations.
  sh.act_layer = layer_activation_bytes(m, sh.b, c.tp, c.recompute) * sh.bpe / 2;
  return sh;
}

}  // namespace

std::pair<ParallelConfig, ParallelConfig> stage_cut_configs(const Problem& p,
                                                            const ParallelConfig& c) {
  const int64_t L = p.model.layers;
  KT_CHECK(c.pp > 1 && c.cut_layer > 0 && c.cut_layer < L && c.cut_layer % (L / c.pp) == 0 &&
               c.cut_tp > 0 && c.virtual_stages == 1,
           "per-stage TP: a cut at a stage boundary, one chunk per stage");
  ParallelConfig before = c;
  before.cut_layer = before.cut_tp = 0;
  ParallelConfig after = before;
  after.tp = c.cut_tp;
  after.dp = c.tp * c.dp / c.cut_tp;
  after.micro_batch = c.micro_batch * c.cut_tp / c.tp;
  after.pp = c.pp - api::cut_stage(c, L);
  if (c.offload == api::OffloadMode::kNone) after.gpu_units = L / c.pp + 1;
  return {before, after};
}

StageCutParts stage_cut_parts(const Problem& p, const ParallelConfig& c) {
  StageCutParts s;
  std::tie(s.before_config, s.after_config) = stage_cut_configs(p, c);
  s.cut_stage = api::cut_stage(c, p.model.layers);
  s.before = s.after = p;
  s.after.model.layers = p.model.layers - c.cut_layer;
  return s;
}

Evaluation join_stage_cut(const Problem& p, const ParallelConfig& c, const Evaluation& before,
                          const Evaluation& after) {
  const auto& m = p.model;
  const auto& hw = p.hw;
  const double sh = static_cast<double>(m.seq_len) * m.hidden;
  const double b1 = static_cast<double>(c.micro_batch),
               b2 = static_cast<double>(c.micro_batch * c.cut_tp / c.tp);
  // Memory: each part's first stage is the fullest of its stages. Both end stages keep the
  // logical embeddings' unit (fp32) for their sum; stage s the received activations and their
  // re-sharded copy, with their gradients (fp32).
  const double unit0 = static_cast<double>(m.padded_vocab()) * m.hidden + sh + 2.0 * m.hidden;
  Evaluation a = before, b = after;
  a.predicted.memory.grads += unit0 * 4;
  b.predicted.memory.grads += unit0 * 4;
  b.predicted.memory.activations += 2 * (b1 + b2) * sh * 4;
  for (Evaluation* e : {&a, &b}) {
    e->device_ratio = e->predicted.memory.total() / e->predicted.device_capacity_bytes;
    const double host_needed = e->predicted.host_bytes_per_node +
                               (p.cpu_device ? e->predicted.memory.total() * c.procs_per_node : 0);
    e->host_ratio = host_needed / e->predicted.host_capacity_bytes;
  }
  Evaluation ev = a.device_ratio >= b.device_ratio ? a : b;
  ev.host_ratio = std::max(a.host_ratio, b.host_ratio);
  ev.predicted.host_bytes_per_node =
      std::max(a.predicted.host_bytes_per_node, b.predicted.host_bytes_per_node);
  ev.fits =
      p.ignore_memory || (a.device_ratio <= 1.0 && b.device_ratio <= 1.0 && ev.host_ratio <= 1.0);
  if (before.predicted.step_seconds <= 0 || after.predicted.step_seconds <= 0) {
    ev.predicted.step_seconds = ev.predicted.tokens_per_second = ev.predicted.mfu = 0;
    ev.predicted.time = {};
    return ev;
  }

  // ---- time: 1F1B over stages of two timings ----
  // A stage's micro-batch slot: its forward and backward (with their transfers where the sends
  // block, as in evaluate). Stage s also re-shards each micro-batch: an all-gather of the wider
  // side's activations over its cut group, inside a node (cutpoint_joints' re-shard).
  const int64_t s = api::cut_stage(c, m.layers), pp = c.pp,
                group = std::max(c.tp, c.cut_tp) / std::min(c.tp, c.cut_tp);
  const double reshard = allreduce_seconds(std::max(b1, b2) * sh * bytes_per_element(p.precision),
                                           group, hw.intra_allreduce_busbw, hw.allreduce_latency) /
                         2;
  const double m_ = static_cast<double>(c.grad_accum);
  const double slot_a = before.micro_batch_seconds + (p.cpu_device ? 0 : before.p2p_seconds);
  const double slot_b = after.micro_batch_seconds + (p.cpu_device ? 0 : after.p2p_seconds);
  const double slot_s = slot_b + reshard;
  // Each micro-batch passes every stage once; the slowest stage sets the pace in between
  // (uniform stages: (m + p − 1) slots, evaluate's).
  double forward_backward = (m_ - 1) * std::max(slot_a, slot_s) + static_cast<double>(s) * slot_a +
                            slot_s + static_cast<double>(pp - s - 1) * slot_b;
  if (p.cpu_device)  // the CPU workers' sends return at once: the fill and drain hops only
    forward_backward += static_cast<double>(s) * before.p2p_seconds +
                        static_cast<double>(pp - 1 - s) * after.p2p_seconds;
  // After it, each part's tail (DP sums, optimizer, offload) as in its own pipeline, less its
  // end stages' pair sum of the embeddings, replaced by one sum of the logical unit over both
  // end stages' ranks (a ring across nodes where the stages are on different nodes).
  auto tail = [](const Evaluation& e) {
    return std::max(0.0, e.predicted.step_seconds - e.forward_backward - e.embedding_pair_seconds);
  };
  const double ranks = 2.0 * static_cast<double>(c.tp * c.dp);
  const double busbw =
      c.nodes > 1 ? std::min(hw.intra_allreduce_busbw,
                             hw.inter_node_bandwidth / static_cast<double>(c.procs_per_node))
                  : hw.intra_allreduce_busbw;
  const double embedding_sum = allreduce_seconds(unit0 * kGradBytes, static_cast<int64_t>(ranks),
                                                 busbw, hw.allreduce_latency) *
                               hw.dp_comm_scale;
  auto& pred = ev.predicted;
  pred.step_seconds = forward_backward + std::max(tail(before), tail(after)) + embedding_sum;
  ev.forward_backward = forward_backward;
  // The phases: those of the part whose own step is longer, with the joints added.
  pred.time = (before.predicted.step_seconds >= after.predicted.step_seconds ? before : after)
                  .predicted.time;
  pred.time.tp_comm_total += m_ * reshard;
  pred.time.tp_comm_exposed += m_ * reshard;
  pred.time.dp_comm_total += embedding_sum;
  pred.time.dp_comm_exposed += embedding_sum;
  pred.pcie_bytes_per_step =
      std::max(before.predicted.pcie_bytes_per_step, after.predicted.pcie_bytes_per_step);
  // The same world and tokens as the part at c.tp: MFU in proportion.
  pred.tokens_per_second =
      before.predicted.tokens_per_second * before.predicted.step_seconds / pred.step_seconds;
  pred.mfu = before.predicted.mfu * before.predicted.step_seconds / pred.step_seconds;
  return ev;
}

double stage_cut_step_floor(const ParallelConfig& c, int64_t cut_stage,
                            const MicroBatchTiming& before, const MicroBatchTiming& after) {
  const double a = before.forward + before.backward, b = after.forward + after.backward;
  return (static_cast<double>(c.grad_accum) - 1) * std::max(a, b) +
         static_cast<double>(cut_stage) * a + static_cast<double>(c.pp - cut_stage) * b;
}

// What a CPU rank's model allocates for activations (api/cpu_activations.h, the worker's own
// layout): per lane (the micro-batch, or each of its two Oases sub-batches) the activations and
// their gradients, and the activations of each further micro-batch in flight on a pipeline
// stage, in fp32 whatever the precision; and the vocabulary-parallel cross-entropy's scratch.
double cpu_activation_bytes(const Problem& p, const ParallelConfig& c, const Shape& sh,
                            double in_flight) {
  const auto& m = p.model;
  const int64_t lanes = std::max<int64_t>(1, c.sub_batches);
  const int64_t lane_b = std::max<int64_t>(1, c.micro_batch / lanes);
  const int64_t Lw = c.recompute == Recompute::kNone ? sh.L : 1;
  const int64_t Lp = c.recompute == Recompute::kFull ? 1 : sh.L;
  // Every stage is charged the logits: the last has them, and a stage's memory is the fuller's.
  const double per_lane = static_cast<double>(api::cpu_activation_floats(
      sh.L, m.hidden, lane_b, m.seq_len, m.hidden / c.tp, m.heads / c.tp, m.ffn_hidden / c.tp,
      m.padded_vocab() / c.tp, Lw, Lp));
  const double copies = 1 + std::max(1.0, std::ceil(in_flight));
  const double scratch = c.tp > 1 ? 3.0 * lane_b * m.seq_len : 0;
  return static_cast<double>(lanes) * (copies * per_lane + scratch) * 4;
}

// A CPU rank's memory besides its tensors: the process itself (kCpuProcessBytes); a checkpoint
// save's staging copy of one tensor at a time (the largest: the token embedding); and with data
// parallelism the gradient buckets the DP sum packs (fp32, every gradient of the rank).
double cpu_workspace_bytes(const Problem& p, const ParallelConfig& c, const Shape& sh) {
  const double largest_tensor = static_cast<double>(p.model.padded_vocab()) * p.model.hidden /
                                static_cast<double>(c.tp) * 4;
  const double dp_buckets = c.dp > 1 ? sh.params_rank * 4 : 0;
  return kCpuProcessBytes + largest_tensor + dp_buckets;
}

Evaluation evaluate_memory(const Problem& p, const ParallelConfig& c) {
  using api::OffloadMode;
  if (c.cut_layer > 0 && c.pp > 1) {
    const StageCutParts s = stage_cut_parts(p, c);
    return join_stage_cut(p, c, evaluate_memory(s.before, s.before_config),
                          evaluate_memory(s.after, s.after_config));
  }
  if (c.cut_layer > 0) {
    const CutpointSegments s = cutpoint_segments(p, c);
    return join_cutpoint(p, c, evaluate_memory(s.first, s.first_config),
                         evaluate_memory(s.second, s.second_config));
  }
  const auto& m = p.model;
  const Shape sh = shape_of(p, c);
  const int64_t L = sh.L;
  const int64_t streamed = sh.streamed;
  const int64_t slots = sh.slots;
  const double bpe = sh.bpe;
  const double lay = sh.lay;
  const double params_rank = sh.params_rank;
  const double gpu_params = sh.gpu_params;
  const double cpu_params = sh.cpu_params;
  const double b = sh.b;
  const double act_layer = sh.act_layer;
  const bool window = sh.window;
  Evaluation ev;
  auto& pred = ev.predicted;
  auto& mem = pred.memory;

  // ---- device memory per rank ----
  const double resident_params = params_rank - streamed * lay;
  // A CPU rank's model holds every parameter of its stage in fp32 (and a bf16 copy for the
  // matmuls), whatever is offloaded: the offload engine's host state comes on top (below).
  mem.params = p.cpu_device ? params_rank * (4 + (p.precision == api::Precision::kBf16 ? 2 : 0))
                            : (resident_params + slots * lay) * bpe;
  // Gradients are fp32 in both workers whatever the compute precision (the models accumulate
  // them so, as Megatron's main_grad), for every parameter the device holds: the CUDA engine
  // keeps the CPU-updated units' gradients on the device too and copies them home after the
  // last micro-batch; a window slot holds its layer's; a CPU rank's model holds all of them.
  mem.grads = (p.cpu_device ? params_rank : resident_params + slots * lay) * kGradBytes;
  mem.optimizer = gpu_params * (p.cpu_device                              ? 8   // m, v
                                : p.precision == api::Precision::kBf16 ? 12  // master, m, v
                                                                       : 8);
  if (c.distributed_optimizer) mem.optimizer /= static_cast<double>(c.dp);  // ZeRO-1
  const double act_scale = bpe / 2;
  const int64_t layers_on_device = window ? L - streamed + slots : L;
  // 1F1B: the first stage holds the activations of min(pp, micro-batches) micro-batches in
  // flight (Narayanan et al. SC21 §2.2; Korthikanti et al. 2022 §4.2.3); interleaved over v
  // virtual stages, of min(m·v, pp·v + pp − 1) chunks of 1/v of its layers each, p + (p − 1)/v
  // micro-batches' worth (worker/pipeline_order.h).
  const double v = static_cast<double>(c.virtual_stages);
  const double in_flight = c.virtual_stages > 1
                               ? static_cast<double>(std::min(c.grad_accum * c.virtual_stages,
                                                              c.pp * c.virtual_stages + c.pp - 1)) /
                                     v
                               : static_cast<double>(std::min(c.pp, c.grad_accum));
  double activations = in_flight * layers_on_device * act_layer;
  if (c.recompute != Recompute::kNone)  // the recomputed layer's full working set
    activations += layer_activation_bytes(m, b, c.tp, Recompute::kNone) * act_scale;
  // fp32 logits / probabilities (B, T, V/t) and the embedding output.
  activations += b * m.seq_len * static_cast<double>(m.padded_vocab()) / c.tp * 4;
  activations += 2 * b * m.seq_len * m.hidden * bpe;
  if (p.cpu_device) activations = cpu_activation_bytes(p, c, sh, in_flight);
  mem.activations = activations;
  const double capacity = device_capacity(p, c);
  mem.workspace = p.cpu_device ? cpu_workspace_bytes(p, c, sh) : kGpuWorkspaceBytes;
  // The CUDA distributed optimizer keeps the reduce-scattered shard gradients (fp32) and two
  // buckets each of a unit's packed fp32 gradients and bf16 weights, sized for the widest unit
  // (the embeddings'; worker/cuda_offload.h).
  if (!p.cpu_device && c.distributed_optimizer && c.dp > 1) {
    mem.grads += gpu_params / static_cast<double>(c.dp) * 4;
    mem.workspace += 2 * std::max(lay, sh.emb) * (4 + 2);
  }
  // The caching allocator's fragmentation on a GPU is a share of the device; a CPU rank's
  // allocations are made once, so its slack is a share of what it holds.
  mem.reserve = p.cpu_device ? kFragmentationReserve * mem.total()
                             : kFragmentationReserve * capacity + kCudaContextBytes;
  pred.device_capacity_bytes = capacity;

  // ---- host memory per node ----
  // CPU-updated parameters keep fp32 master, m, v and an fp32 gradient accumulator on the host
  // (16 B/param); streamed layers also keep their 16-bit copy and their activation checkpoints;
  // pinned staging for two layers.
  // The distributed optimizer with offload optimizer keeps each rank's shard of the CPU units'
  // master weights, gradients and moments only (the SynergyScale split per shard); a streamed
  // layer keeps its whole gradient accumulator and what its slot loads from (a CPU rank its
  // whole fp32 master, a GPU rank its bf16 copy, counted below) — and the shard of the rest (a
  // GPU rank's: master, moments, gradients and bf16 values, 18 B).
  const double host_share = c.distributed_optimizer ? 1.0 / static_cast<double>(c.dp) : 1.0;
  const double streamed_params = static_cast<double>(streamed) * lay;
  const double streamed_bytes = !c.distributed_optimizer ? 16
                                : p.cpu_device           ? 8 + 8 * host_share
                                                         : 4 + 18 * host_share;
  double host_rank = (cpu_params - streamed_params) * 16 * host_share +
                     streamed_params * streamed_bytes + streamed * lay * bpe;
  // (A pipeline stage keeps a streamed layer's checkpoint per micro-batch in flight.)
  for (const WindowChunk& w : sh.chunks)
    host_rank += static_cast<double>(w.streamed * w.in_flight) * act_layer;
  if (cpu_params > 0) host_rank += 2 * lay * bpe;
  pred.host_bytes_per_node = host_rank * c.procs_per_node;
  pred.host_capacity_bytes = kHostUsableFraction * p.host_memory_per_node;
  ev.device_ratio = mem.total() / capacity;
  const double host_needed =
      pred.host_bytes_per_node + (p.cpu_device ? mem.total() * c.procs_per_node : 0);
  ev.host_ratio = host_needed / pred.host_capacity_bytes;
  ev.fits = p.ignore_memory || (ev.device_ratio <= 1.0 && ev.host_ratio <= 1.0);

  return ev;
}

Evaluation evaluate(const Problem& p, const ParallelConfig& c, const MicroBatchTiming& timing) {
  using api::OffloadMode;
  if (c.cut_layer > 0) return evaluate(p, c);  // its segments' own timings
  const auto& m = p.model;
  const auto& hw = p.hw;
  const Shape sh = shape_of(p, c);
  const int64_t L = sh.L;
  const int64_t gpu_units = sh.gpu_units;
  const int64_t gpu_layers = sh.gpu_layers;
  const double bpe = sh.bpe;
  const double emb = sh.emb;
  const double lay = sh.lay;
  const double gpu_params = sh.gpu_params;
  const double pcie = sh.pcie;
  const double act_layer = sh.act_layer;
  const bool window = sh.window;
  Evaluation ev = evaluate_memory(p, c);
  auto& pred = ev.predicted;
  // ---- time ----
  const double fwd_layer = timing.forward / L;
  const double bwd_layer = timing.backward / L;
  double micro_batch_seconds = timing.forward + timing.backward;
  double pcie_bytes = 0;
  if (window) {
    // Each chunk (the stage without virtual stages) streams its layers r..n-1 (r resident)
    // through its slots. Forward: the first `slots` streamed layers are still resident from the
    // previous backward; each later one is prefetched into the slot freed by the layer `slots`
    // before it. Backward (reverse): the last `slots` of the forward are resident; earlier ones
    // are fetched again, together with their activation checkpoint; every streamed layer's
    // gradients leave by D2H before its slot is reused. A micro-batch runs the chunks in turn.
    const double load = kCopyLatency + lay * bpe / pcie;
    const double grads_down = kCopyLatency + lay * kGradBytes / pcie;  // fp32 gradients
    const double act_load = kCopyLatency + act_layer / pcie;
    const double v = static_cast<double>(c.virtual_stages);
    micro_batch_seconds = 0;
    for (const WindowChunk& w : sh.chunks) {
      const int64_t n = w.streamed, slots_c = w.slots;
      double clock = static_cast<double>(w.resident) * fwd_layer;  // resident layers first
      double h2d_free = 0, d2h_free = 0;
      std::vector<double> release(static_cast<size_t>(n), 0.0);
      for (int64_t j = 0; j < n; ++j) {
        double ready = 0;
        if (j >= slots_c) {
          const double start = std::max(h2d_free, release[static_cast<size_t>(j - slots_c)]);
          h2d_free = start + load;
          ready = h2d_free;
        }
        clock = std::max(clock, ready) + fwd_layer;
        release[static_cast<size_t>(j)] = clock;
        d2h_free = std::max(d2h_free, clock) + act_load;  // activation checkpoint to the host
      }
      std::vector<double> released_bwd(static_cast<size_t>(n), 0.0);
      for (int64_t j = n - 1; j >= 0; --j) {
        const bool resident_from_forward = j >= n - slots_c;
        double start = h2d_free;
        if (!resident_from_forward && j + slots_c < n)
          start = std::max(start, released_bwd[static_cast<size_t>(j + slots_c)]);
        h2d_free = start + (resident_from_forward ? 0 : load) + act_load;
        clock = std::max(clock, h2d_free) + bwd_layer;
        d2h_free = std::max(d2h_free, clock) + grads_down;  // gradients to the host
        released_bwd[static_cast<size_t>(j)] = d2h_free;
      }
      clock += static_cast<double>(w.resident) * bwd_layer;
      micro_batch_seconds += std::max(clock, (timing.forward + timing.backward) / v);
      // Per micro-batch: n − W layers fetched in the forward and again in the backward, n
      // layers' gradients down, n activation checkpoints down and up. Per step: the W layers
      // left in the slots by the last backward are fetched once more after the CPU update.
      const double reloads = static_cast<double>(n - slots_c), nd = static_cast<double>(n);
      pcie_bytes += static_cast<double>(c.grad_accum) *
                        (2 * reloads * lay * bpe + nd * lay * kGradBytes + 2 * nd * act_layer) +
                    static_cast<double>(slots_c) * lay * bpe;
      // Pipeline stages also run a chunk's sweeps back to back (1F1B's warm-up forwards and
      // drain backwards; interleaved, a chunk's groups of micro-batches): each such sweep first
      // fetches its own first slots' layers (those the last sweep's end did not leave), before
      // its first streamed layer — counted as exposed, spread over the micro-batches.
      const double refetched = static_cast<double>(w.turns * w.refetched());
      pcie_bytes += refetched * lay * bpe;
      micro_batch_seconds += refetched * load / static_cast<double>(c.grad_accum);
    }
  }
  // With a pipeline (1F1B), each micro-batch also passes its activations to the next stage and
  // its input gradients to the one before, point to point (b·s·h elements each way per stage
  // boundary, blocking as Megatron's default schedule's send/recv are; not on CPU ranks, below),
  // and the schedule takes
  // m + pp − 1 micro-batch slots: the bubble (pp − 1)/m (Narayanan et al. SC21 §2.2). With v
  // virtual stages, m·v + pp − 1 chunk slots of 1/v of a micro-batch each, every one with its
  // transfer: the bubble (pp − 1)/(v·m), v times the transfers (SC21 §2.2.2).
  double p2p_seconds = 0;
  if (c.pp > 1) {
    const double bytes = sh.b * m.seq_len * m.hidden * bpe;
    // A stage of tp·dp ranks that spans nodes sends over the NICs, all of a node's ranks at
    // once; stages within a node over the intra-node link.
    const bool across_nodes = c.nodes > 1 && c.tp * c.dp >= c.procs_per_node;
    const double bandwidth =
        across_nodes
            ? hw.inter_node_bandwidth / static_cast<double>(std::min(c.procs_per_node, c.tp * c.dp))
            : hw.intra_allreduce_busbw;
    p2p_seconds = 2 * (hw.allreduce_latency + bytes / bandwidth);
  }
  ev.micro_batch_seconds = micro_batch_seconds;
  ev.p2p_seconds = p2p_seconds;
  const double v_stages = static_cast<double>(c.virtual_stages);
  const double chunk_slots =
      static_cast<double>(c.grad_accum) * v_stages + static_cast<double>(c.pp - 1);
  double forward_backward = chunk_slots * (micro_batch_seconds / v_stages + p2p_seconds);
  // The CPU workers' sends return at once (docs/WORKER.md, "Pipeline stages on CPU ranks"): a
  // transfer delays only the stage that waits for it, which in 1F1B is on the critical path in
  // the fill and the drain — p − 1 hops forward, p − 1 back — and hidden behind the other
  // micro-batches' compute in between.
  if (c.pp > 1 && p.cpu_device)
    forward_backward =
        chunk_slots * micro_batch_seconds / v_stages + static_cast<double>(c.pp - 1) * p2p_seconds;

  // Tail of the step: the last micro-batch's backward frees unit gradients from the top layer
  // down; DP all-reduces them bucket by bucket; GPU-updated units then run AdamW on the device;
  // CPU-updated units go D2H, through CPU AdamW and (optimizer mode) back H2D, overlapped with
  // the rest of the backward and the next step's forward, which must not read a layer early.
  const double dp_busbw = dp_bus_bandwidth(p, c);
  const double backward_start = forward_backward - micro_batch_seconds + timing.forward;
  struct Unit {
    double params;
    double grads_ready;
    double next_use;  // when the next step's forward reads it, relative to the step's end
    bool on_gpu;
    bool streamed;
  };
  std::vector<Unit> units;
  units.reserve(L + 1);
  for (int64_t l = L - 1; l >= 0; --l) {
    const double ready = std::min(forward_backward, backward_start + (L - l) * bwd_layer);
    units.push_back({lay, ready, l * fwd_layer, l + 1 < gpu_units, window && l >= gpu_layers});
  }
  units.push_back({emb, forward_backward, 0.0, gpu_units >= 1, false});

  // The CPU workers' distributed optimizer reduce-scatters each unit's gradients as they become
  // final, in the DP lane as the all-reduce it replaces (Gloo's reduce-scatter is an all-reduce
  // and a slice: the all-reduce's time), and all-gathers the updated shards after the update,
  // unit by unit in the order the next forward reads them, half an all-reduce's time each; the
  // forward waits for a unit's (docs/WORKER.md, "The distributed optimizer").
  // The CUDA workers do the same, and NCCL's reduce-scatter is half the ring all-reduce (the
  // all-gather the other half).
  const bool gather_after_update = c.distributed_optimizer && c.dp > 1;
  const double reduce_scatter_share = gather_after_update && !p.cpu_device ? 0.5 : 1.0;
  double dp_free = 0, dp_total = 0, gpu_ready = forward_backward, zero_gather = 0;
  std::vector<double> gather_seconds(units.size(), 0.0);
  std::vector<double> final_time(units.size());
  for (size_t i = 0; i < units.size(); ++i) {
    double t = units[i].grads_ready;
    if (c.dp > 1) {
      // The gradients are summed in fp32 (both workers, as Megatron's main_grad); the
      // distributed optimizer's all-gather moves the new 16-bit (or fp32) weights.
      const double seconds =
          allreduce_seconds(units[i].params * kGradBytes, c.dp, dp_busbw, hw.allreduce_latency) *
          hw.dp_comm_scale;
      t = std::max(t, dp_free) + seconds * reduce_scatter_share;
      dp_free = t;
      dp_total += seconds * reduce_scatter_share;
      if (gather_after_update) {
        const double gather =
            allreduce_seconds(units[i].params * bpe, c.dp, dp_busbw, hw.allreduce_latency) *
            hw.dp_comm_scale / 2;
        gather_seconds[i] = gather, zero_gather += gather;
      }
    }
    // A pipeline's first and last stages both hold the tied word embeddings: their gradients
    // are summed between the two (Megatron's embedding group), after the DP sum.
    if (c.pp > 1 && i + 1 == units.size()) {
      const double vocab_bytes =
          static_cast<double>(m.padded_vocab()) * m.hidden / c.tp * kGradBytes;
      const double seconds =
          allreduce_seconds(vocab_bytes, 2, hw.inter_node_bandwidth, hw.allreduce_latency) *
          hw.dp_comm_scale;
      t = std::max(t, dp_free) + seconds;
      dp_free = t;
      dp_total += seconds;
      ev.embedding_pair_seconds = seconds;
    }
    final_time[i] = t;
    if (units[i].on_gpu) gpu_ready = std::max(gpu_ready, t);
  }
  // The distributed optimizer (ZeRO-1) reduce-scatters the gradients and all-gathers the updated
  // parameters: 2(d−1)/d of the bytes in all, the all-reduce's (a ring all-reduce is a
  // reduce-scatter and an all-gather; Rajbhandari et al. SC20 §7): the DP lane above carries the
  // reduce-scatters, the all-gathers follow the update; each rank updates 1/d of the parameters.
  const double cores_per_rank = cpu_threads_per_rank(p, c);
  const double device_bandwidth =
      p.cpu_device ? hw.memory_bandwidth * cores_per_rank : hw.memory_bandwidth;
  const double gpu_adam = gpu_params * kAdamBytesPerParam / device_bandwidth /
                          (c.distributed_optimizer ? static_cast<double>(c.dp) : 1.0);
  const double step_device_end = gpu_ready + gpu_adam;
  // The all-gathers from the step's end, embeddings first: what the next forward waits for.
  double gather_lateness = 0, done = 0;
  for (size_t i = units.size(); i-- > 0;) {
    done += gather_seconds[i];
    gather_lateness = std::max(gather_lateness, done - units[i].next_use);
  }

  const double cpu_rate = hw.cpu_adam_params_per_core * cores_per_rank / hw.cpu_optimizer_scale;
  // CPU AdamW needs the global gradient norm (clipping), so it starts once every gradient is
  // final (the worker's offload engine does the same); the copies down start as soon as each
  // unit's gradients are.
  double all_final = forward_backward;
  for (double t : final_time) all_final = std::max(all_final, t);
  double d2h_free = 0, cpu_free = all_final, h2d_free = 0;
  // With the distributed optimizer a rank copies home, updates and brings back its shard of a
  // CPU unit only (the worker's all-gather is the copy back).
  const double shard = c.distributed_optimizer ? 1.0 / static_cast<double>(c.dp) : 1.0;
  double lateness = 0, cpu_total = 0, copy_total = 0, last_final = forward_backward;
  for (size_t i = 0; i < units.size(); ++i) {
    const Unit& u = units[i];
    if (u.on_gpu) continue;
    last_final = std::max(last_final, final_time[i]);
    const double copy = kCopyLatency + u.params * shard * bpe / pcie;  // 16-bit weights up
    const double grads_copy = kCopyLatency + u.params * shard * kGradBytes / pcie;  // fp32 down
    const double d2h = u.streamed ? 0 : grads_copy;  // streamed grads already left (window sim)
    d2h_free = std::max(final_time[i], d2h_free) + d2h;
    const double adam = u.params * shard / cpu_rate;
    cpu_free = std::max(d2h_free, cpu_free) + adam;
    const double h2d = u.streamed ? 0 : copy;  // streamed layers are fetched by the prefetch
    h2d_free = std::max(cpu_free, h2d_free) + h2d;
    const double deadline = step_device_end + u.next_use - (u.streamed ? copy : 0);
    lateness = std::max(lateness, h2d_free - deadline);
    cpu_total += adam;
    copy_total += d2h + h2d;
    if (!u.streamed) pcie_bytes += u.params * shard * (kGradBytes + bpe);
  }
  // Gradients of CPU-updated units must also be final before the step ends.
  lateness = std::max(lateness, last_final - step_device_end);
  lateness = std::max(lateness, 0.0);
  // On a CPU rank the "device" is the rank's own cores, and its compute keeps all of them busy:
  // the offload engine's copy lanes and CPU AdamW pool run on the same cores and take them from
  // the compute rather than hiding beside it. Their whole time adds to the step (measured here,
  // 2 cores: the window plan's step grew by more than its copies and AdamW together, the
  // optimizer-offload plan's by about them; docs/PLANNER.md §8).
  const double copy_window = window ? pcie_bytes / pcie : 0;
  if (p.cpu_device && c.offload != OffloadMode::kNone)
    lateness = std::max(lateness, copy_window + copy_total + cpu_total);
  const double offload_overhead = c.offload == OffloadMode::kNone ? 0.0 : kOffloadStepOverhead;
  double step = step_device_end + std::max(lateness, gather_lateness) + offload_overhead;
  // The node's DRAM serves every rank's copies and every rank's CPU AdamW within one step; when
  // that traffic needs longer than the step, the step stretches to it (a roofline, not a lane).
  double dram_stretch = 0;
  if (!p.cpu_device && c.offload != OffloadMode::kNone) {
    const double dram = static_cast<double>(p.cpu_cores_per_node) * hw.cpu_adam_params_per_core *
                        kAdamBytesPerParam;
    const double bytes =
        static_cast<double>(c.procs_per_node) * (pcie_bytes + sh.cpu_params * kAdamBytesPerParam);
    dram_stretch = std::max(0.0, bytes / dram - step);
  }
  pred.step_seconds = step + dram_stretch;
  ev.forward_backward = forward_backward;

  auto& time = pred.time;
  time.compute = c.grad_accum * timing.compute;
  time.tp_comm_total = c.grad_accum * timing.tp_comm;
  time.tp_comm_exposed =
      c.grad_accum * std::max(0.0, timing.forward + timing.backward - timing.compute);
  time.dp_comm_total = dp_total + zero_gather;
  double dp_exposed = gpu_ready - forward_backward + gather_lateness;
  time.optimizer_gpu = gpu_adam;
  time.optimizer_cpu_total = cpu_total;
  const double window_stall =
      c.grad_accum * (micro_batch_seconds - timing.forward - timing.backward);
  time.transfer_total = copy_total + copy_window;
  // The late tail is CPU AdamW and copies, in proportion (on a CPU rank the window's copies too),
  // up to their own length; lateness beyond it is the wait for the CPU units' gradient sums.
  const double tail_copies = copy_total + (p.cpu_device ? copy_window : 0);
  const double tail_work = cpu_total + tail_copies;
  const double tail_share = tail_work > 0 ? cpu_total / tail_work : 1;
  const double tail_late = std::min(lateness, tail_work);
  time.optimizer_cpu_exposed = tail_late * tail_share;
  time.transfer_exposed =
      window_stall + tail_late * (1 - tail_share) + offload_overhead + dram_stretch;
  time.dp_comm_exposed = dp_exposed + (lateness - tail_late);
  pred.pcie_bytes_per_step = pcie_bytes;

  const double tokens = static_cast<double>(p.global_batch) * m.seq_len;
  pred.tokens_per_second = tokens / pred.step_seconds;
  const double peak =
      (p.precision == api::Precision::kBf16 ? hw.peak_bf16_flops : hw.peak_fp32_flops) *
      (p.cpu_device ? cores_per_rank : 1.0);
  const double world = static_cast<double>(c.nodes * c.procs_per_node);
  pred.mfu = pred.tokens_per_second * model_flops_per_token(m) / (world * peak);
  return ev;
}

}  // namespace kt::planner

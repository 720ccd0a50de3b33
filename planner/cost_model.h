// The planner's cost model (docs/PLANNER.md derives every formula).
//
// Letters, as in the papers: b micro-batch (sequences), s sequence length, h hidden, a heads,
// f ffn hidden, L layers, V padded vocabulary, t tensor-parallel degree, d data-parallel degree,
// P parameters, η achieved fraction of peak. "Rank" is one GPU (or one CPU rank process).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "api/hardware.h"
#include "api/model.h"
#include "api/plan.h"

namespace kt::planner {

using api::ModelDims;
using api::ParallelConfig;
using api::Prediction;
using api::Recompute;

// What a search evaluates candidates against: one model, one homogeneous group of nodes.
struct Problem {
  ModelDims model;
  int64_t global_batch = 1;
  api::Precision precision = api::Precision::kBf16;
  api::HardwareProfile hw;  // resolved for the node group
  bool cpu_device = false;  // ranks are CPU processes (device memory = host memory)
  int64_t cpu_cores_per_node = 1;
  double host_memory_per_node = 0;  // bytes
  double memory_budget = 0;         // per-rank device budget in bytes; 0: the device's memory
  bool ignore_memory = false;       // every configuration "fits" (to see what memory costs)
};

// ---- closed forms (exposed for tests and docs) -----------------------------------------------

int64_t bytes_per_element(api::Precision p);
// Forward FLOPs of one transformer layer for one micro-batch on one rank:
// (8bsh² + 4bshf + 4bs²h)/t  (= (24bsh² + 4bs²h)/t when f = 4h).
double layer_forward_flops(const ModelDims& m, double b, int64_t t);
// Logits forward 2bshV/t.
double logits_forward_flops(const ModelDims& m, double b, int64_t t);
// FLOPs the recompute pass adds per layer: the forward (full); the forward without the two
// row-parallel GEMMs whose post-all-reduce outputs are saved (commAware); 0 (none).
double layer_recompute_flops(const ModelDims& m, double b, int64_t t, Recompute r);
// Stored activation bytes per layer and micro-batch (16-bit activations; Korthikanti et al.
// 2022, eq. 2 with TP): none sbh(10 + 24/t + 5as/(ht)); full 2sbh; commAware 6sbh.
double layer_activation_bytes(const ModelDims& m, double b, int64_t t, Recompute r);
// Ring all-reduce of `bytes` over t ranks: 2(t-1)α + 2(t-1)/t · bytes / busbw.
double allreduce_seconds(double bytes, int64_t ranks, double busbw, double latency);
// Parameters one rank holds: of the embeddings unit (V·h/t + s·h + 2h) and of one layer
// ((4h² + 2hf + 3h + f)/t + 6h: the column/row-parallel parts shard, biases of row-parallel
// layers and LayerNorms are replicated).
double embedding_unit_params(const ModelDims& m, int64_t t);
double layer_unit_params(const ModelDims& m, int64_t t);
// Model FLOPs per token for MFU: 6P + 12·L·h·s (forward + backward, attention included).
double model_flops_per_token(const ModelDims& m);
// Fraction of parameters on the GPU update path when the first `gpu_units` of
// [embeddings, layer 0, ..., layer L-1] are GPU-updated.
double gpu_update_fraction(const ModelDims& m, int64_t t, int64_t gpu_units);
// The smallest unit prefix whose parameter fraction is >= f.
int64_t gpu_units_for_fraction(const ModelDims& m, int64_t t, double f);

// ---- evaluation ------------------------------------------------------------------------------

struct Evaluation {
  Prediction predicted;
  bool fits = false;        // device and host memory
  double device_ratio = 0;  // needed / capacity per rank
  double host_ratio = 0;    // needed / capacity per node
  // Of the step (evaluate, not evaluate_memory), for joining pipelines of two TP degrees: the
  // micro-batches' forward and backward as scheduled (bubble and transfers included), one
  // micro-batch's, one stage-to-stage transfer's, and the first and last stages' sum of the tied
  // embeddings' gradients.
  double forward_backward = 0, micro_batch_seconds = 0, p2p_seconds = 0;
  double embedding_pair_seconds = 0;
};

// The timing of one micro-batch's forward+backward under the TP schedule (with or without the
// 2-sub-batch overlap). Depends only on (t, b, sub-batches, recompute); cached by the search.
struct MicroBatchTiming {
  double forward = 0;      // wall time of the forward pass (incl. exposed TP comm)
  double backward = 0;     // wall time of backward incl. recompute
  double compute = 0;      // sum of compute op time
  double tp_comm = 0;      // sum of TP all-reduce time
  int64_t allreduces = 0;  // TP all-reduces issued per micro-batch (all sub-batches)
};

MicroBatchTiming time_micro_batch(const Problem& p, const ParallelConfig& c);

// The whole prediction. `timing` must come from time_micro_batch for the same config.
Evaluation evaluate(const Problem& p, const ParallelConfig& c, const MicroBatchTiming& timing);
Evaluation evaluate(const Problem& p, const ParallelConfig& c);
// Memory only (O(1)): device and host bytes, capacities, ratios and `fits`; no times.
Evaluation evaluate_memory(const Problem& p, const ParallelConfig& c);

// Oases' cutpoint (c.cut_layer > 0; Li et al. 2023 §4): evaluated as its two segments, each a
// model of its own layers on the same ranks (the first at c.tp, DP c.dp, micro-batch b; the
// second at c.cut_tp, DP world/c.cut_tp, micro-batch b·cut_tp/tp), and joined: the first
// segment runs no LM head, neither segment sums the embeddings' unit over its DP group —
// the worker sums both layouts' copies over the whole world at once — and every micro-batch
// re-shards its activations at the cut (an all-gather over the cut group). docs/PLANNER.md §16.
struct CutpointSegments {
  Problem first, second;
  ParallelConfig first_config, second_config;
};
CutpointSegments cutpoint_segments(const Problem& p, const ParallelConfig& c);
// The same configurations alone (the segments' problems are `p` with `layers` of their own).
std::pair<ParallelConfig, ParallelConfig> cutpoint_configs(const Problem& p,
                                                           const ParallelConfig& c);
// The cutpoint's prediction from its segments' evaluations (evaluate, or evaluate_memory for
// the memory alone: then the times stay 0).
Evaluation join_cutpoint(const Problem& p, const ParallelConfig& c, const Evaluation& first,
                         const Evaluation& second);

// What the join adds to its segments' steps (join_cutpoint): the first segment's LM head and the
// second's embedding TP all-reduce, which neither runs, and the segments' DP sums of the
// embeddings' unit, all taken away; the world sum of that unit and the re-shard, added.
struct CutpointJoints {
  double lm_head = 0, emb_allreduce = 0, dp_saved = 0, world_sum = 0, reshard = 0;
  double delta() const { return world_sum + reshard - lm_head - emb_allreduce - dp_saved; }
};
CutpointJoints cutpoint_joints(const Problem& p, const ParallelConfig& c);
// The cut layers (ascending, 1 and L − 1 among them) between two consecutive of which cutpoint
// plan `c`'s memory — device and host — is affine in its cut layer, at c's gpuUnits and window
// (the search judges a span of cuts from its ends).
std::vector<int64_t> cutpoint_memory_breaks(const Problem& p, const ParallelConfig& c);
// A lower bound on cutpoint plan `c`'s step whose segments' micro-batches time `first` and
// `second` (time_micro_batch of cutpoint_configs): it does not depend on gpuUnits, the window
// or the optimizer's sharding, so the search prunes every such variant of a cut at once.
double cutpoint_step_floor(const Problem& p, const ParallelConfig& c, const MicroBatchTiming& first,
                           const MicroBatchTiming& second);

// Per-stage TP (c.cut_layer > 0 with c.pp > 1; docs/PLANNER.md §17): the stages before the cut
// at c.tp × c.dp, the stages from cut_stage s on at c.cut_tp (DP tp·dp/cut_tp, micro-batch
// b·cut_tp/tp), each stage on its own tp·dp ranks. Evaluated as two uniform pipelines — the
// whole model at c.tp (whose first stage, with the most micro-batches in flight, bounds the
// memory of the stages before the cut, and whose stage timing theirs) and the model of the
// stages after the cut as a pipeline of pp − s stages at c.cut_tp (whose first stage is stage
// s) — and joined: 1F1B with two stage timings, the re-shard at stage s, and the tied
// embeddings summed over both end stages' ranks as logical tensors.
struct StageCutParts {
  Problem before, after;
  ParallelConfig before_config, after_config;
  int64_t cut_stage = 0;
};
StageCutParts stage_cut_parts(const Problem& p, const ParallelConfig& c);
// The same configurations alone (the search keeps the parts' problems): before, after.
std::pair<ParallelConfig, ParallelConfig> stage_cut_configs(const Problem& p,
                                                            const ParallelConfig& c);
// The same configurations alone (the search keeps the parts' problems): before, after.
std::pair<ParallelConfig, ParallelConfig> stage_cut_configs(const Problem& p,
                                                            const ParallelConfig& c);
Evaluation join_stage_cut(const Problem& p, const ParallelConfig& c, const Evaluation& before,
                          const Evaluation& after);
// A lower bound on the step of stage-cut plan `c` from its parts' micro-batch timings
// (time_micro_batch of stage_cut_parts): the 1F1B schedule of its two stage timings alone.
double stage_cut_step_floor(const ParallelConfig& c, int64_t cut_stage,
                            const MicroBatchTiming& before, const MicroBatchTiming& after);

// Per-rank compute rate η·peak for the problem's precision and config (CPU ranks share cores).
double rank_flops_per_second(const Problem& p, const ParallelConfig& c);
// Host<->device bandwidth one rank gets per direction: its PCIe link, or its share of the node's
// DRAM bandwidth when all GPUs copy both ways at once, whichever is smaller.
double host_link_bandwidth(const Problem& p, const ParallelConfig& c);
// Device memory a rank may use.
double device_capacity(const Problem& p, const ParallelConfig& c);

}  // namespace kt::planner

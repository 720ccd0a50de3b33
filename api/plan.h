// The Plan: the only contract between the operator (which makes it) and the worker (which
// executes it); docs/ARCHITECTURE.md §4.2. Stored as JSON in ConfigMap <job>-plan, mounted at
// /etc/kubetrain/plan.json. The worker refuses a Plan it cannot execute.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "api/enums.h"
#include "api/model.h"
#include "api/training_job.h"
#include "api/yaml_json.h"

namespace kt::api {

inline constexpr const char* kPlanKind = "Plan";

// One parallel configuration: what the search chooses. Shared by the plan and its alternatives.
struct ParallelConfig {
  int64_t nodes = 1;
  int64_t procs_per_node = 1;  // ranks per node (GPUs, or CPU rank processes)
  int64_t tp = 1;              // tensor-parallel degree (consecutive ranks inside a node)
  int64_t dp = 1;              // data-parallel degree; nodes·procs_per_node = tp·pp·dp
  // Pipeline stages: layers [s·L/pp, (s+1)·L/pp) on the s-th group of tp·dp consecutive ranks,
  // the 1F1B schedule over the grad_accum micro-batches (Narayanan et al. SC21). The first
  // stage holds the embeddings, the last the LM head (tied: a copy of wte, its gradient summed
  // with the first stage's).
  int64_t pp = 1;
  // Virtual stages (the interleaved 1F1B schedule, SC21 §2.2.2; Megatron's
  // --num-layers-per-virtual-pipeline-stage): each stage holds `virtual_stages` chunks of
  // L/(pp·virtual_stages) layers, rank s chunk c being virtual stage c·pp + s; the bubble shrinks
  // v-fold, the transfers grow v-fold. 1: one chunk of L/pp layers per stage. grad_accum must be a
  // multiple of pp (worker/pipeline_order.h).
  int64_t virtual_stages = 1;
  // The distributed optimizer (ZeRO-1; Megatron's --use-distributed-optimizer): fp32 master
  // weights and AdamW moments sharded over the DP group; gradients reduce-scattered, updated
  // parameters all-gathered.
  bool distributed_optimizer = false;
  // Oases' cutpoint (Li et al. 2023, §4): layers [cut_layer, L) run at tensor-parallel degree
  // cut_tp (data-parallel world / cut_tp) instead of tp (dp), on the same ranks; the activations
  // are re-sharded at the cut (all-gathered over the ranks whose samples the wider TP group
  // joins, or sliced where the TP group narrows). micro_batch is the layers before the cut's;
  // after it each rank computes micro_batch · cut_tp / tp sequences. cut_layer 0: one TP degree.
  // With pipeline stages the cut is at a stage boundary (per-stage TP): the stages from
  // cut_stage() on run at cut_tp (DP tp·dp/cut_tp) on their own tp·dp ranks; the first of them
  // re-shards the activations it receives, the last the targets (docs/WORKER.md).
  int64_t cut_layer = 0;
  int64_t cut_tp = 0;
  int64_t micro_batch = 1;     // sequences per micro-batch per DP rank
  int64_t grad_accum = 1;      // micro-batches per step
  int64_t sub_batches = 1;     // 2: the Oases overlapped schedule
  Recompute recompute = Recompute::kNone;
  OffloadMode offload = OffloadMode::kNone;
  // Offload units in order [embeddings, layer 0, ..., layer L-1]; the first `gpu_units` are
  // resident and updated on the GPU, the rest are updated on the CPU (optimizer mode) or also
  // streamed through `window` device slots (window mode). gpu_units = L+1 with offload none.
  int64_t gpu_units = 0;
  int64_t window = 0;
  bool operator==(const ParallelConfig&) const = default;
};

struct TimeBreakdown {         // seconds per optimizer step, per rank
  double compute = 0;          // forward + backward + recompute, incl. what comm hides behind
  double tp_comm_total = 0;    // all TP all-reduce time, hidden or not
  double tp_comm_exposed = 0;  // the part that adds to the step
  double dp_comm_total = 0;
  double dp_comm_exposed = 0;
  double transfer_total = 0;  // host<->device copies
  double transfer_exposed = 0;
  double optimizer_gpu = 0;
  double optimizer_cpu_total = 0;
  double optimizer_cpu_exposed = 0;
};

// TimeBreakdown's phases by the names the worker's metrics, its run record and the run report
// use (kubetrain_worker_*phase_seconds{phase}), in the order above.
struct TimePhase {
  const char* name;
  double TimeBreakdown::*seconds;
};
inline constexpr std::array<TimePhase, 10> kTimePhases = {{
    {"compute", &TimeBreakdown::compute},
    {"tp_comm_total", &TimeBreakdown::tp_comm_total},
    {"tp_comm_exposed", &TimeBreakdown::tp_comm_exposed},
    {"dp_comm_total", &TimeBreakdown::dp_comm_total},
    {"dp_comm_exposed", &TimeBreakdown::dp_comm_exposed},
    {"transfer_total", &TimeBreakdown::transfer_total},
    {"transfer_exposed", &TimeBreakdown::transfer_exposed},
    {"optimizer_gpu", &TimeBreakdown::optimizer_gpu},
    {"optimizer_cpu_total", &TimeBreakdown::optimizer_cpu_total},
    {"optimizer_cpu_exposed", &TimeBreakdown::optimizer_cpu_exposed},
}};

struct MemoryBreakdown {  // bytes per rank on the device
  double params = 0, grads = 0, optimizer = 0, activations = 0, workspace = 0, reserve = 0;
  double total() const { return params + grads + optimizer + activations + workspace + reserve; }
};

struct Prediction {
  double step_seconds = 0;
  TimeBreakdown time;
  MemoryBreakdown memory;            // per rank, on the device
  double device_capacity_bytes = 0;  // what a rank may use (budget or device memory)
  double host_bytes_per_node = 0;    // offloaded state, pinned buffers
  double host_capacity_bytes = 0;
  double pcie_bytes_per_step = 0;  // per rank, both directions
  double tokens_per_second = 0;    // whole job
  double mfu = 0;                  // model FLOPs (6·P·tokens + attention) / peak
};

struct LayerPlacement {
  bool resident = true;                      // params always on the device
  UpdateDevice update = UpdateDevice::kGpu;  // where AdamW runs
};

struct Alternative {
  std::string name;  // megatron | zero-offload | stronghold | oases
  std::string description;
  bool feasible = false;
  std::string reason;  // why infeasible, or a one-line comparison
  ParallelConfig config;
  Prediction predicted;
};

struct Plan {
  std::string job_name;
  std::string job_namespace = "default";
  ModelDims model;
  int64_t parameters = 0;
  int64_t global_batch = 0;
  ParallelConfig config;
  int64_t world = 1;
  std::vector<std::string> placement;  // node names, index = node rank
  std::string hardware;                // profile name ("H200", "cpu")
  Precision precision = Precision::kBf16;
  // The job left precision to the planner: a CPU worker without bf16 matmuls then trains in fp32
  // with a warning instead of refusing a bf16 plan.
  bool precision_auto = false;
  DeviceKind device = DeviceKind::kCuda;
  double gpu_update_fraction = 1.0;  // parameter fraction updated on the device
  LayerPlacement embeddings;
  std::vector<LayerPlacement> layers;  // per transformer layer
  int64_t cpu_threads = 1;             // CPU optimizer / compute threads per rank
  // Training settings with every default resolved.
  TrainingSpec training;
  DataSpec data;
  CheckpointSpec checkpoint;
  Prediction predicted;
  // The FLOP/s per rank that MFU is against (the profile's peak at the plan's precision, × the
  // rank's cores on a CPU node) and where that figure comes from ("built-in cpu profile",
  // "measured on HOST DATE"). Informational: outside the hash.
  double peak_flops = 0;
  std::string peak_source;
  std::vector<Alternative> alternatives;
  std::vector<std::string> explanation;
  std::string plan_hash;
};

// Offload places every pipeline stage's units alike: its copy of the embeddings' unit, then its
// layers in order — with virtual stages its chunks' layers, chunk after chunk — the first
// gpu_units of them on the device. Layer l's place among its stage's layers (0-based; the
// embeddings' unit comes first, so layer l is on the device iff 1 + place < gpu_units), and the
// device units of chunk `chunk` (a prefix of its units: its copy of the embeddings', then its
// layers).
inline int64_t stage_layer_place(const ParallelConfig& c, int64_t model_layers, int64_t l) {
  const int64_t chunk_layers = model_layers / (c.pp * c.virtual_stages);
  return l / chunk_layers / c.pp * chunk_layers + l % chunk_layers;
}
// The device units of a model part that holds a copy of the embeddings' unit and `layers` layers
// after `before` layers of its stage's (or, with a cutpoint, of the model's) order.
inline int64_t part_device_units(int64_t gpu_units, int64_t before, int64_t layers) {
  if (gpu_units <= 0) return 0;
  return 1 + std::clamp<int64_t>(gpu_units - 1 - before, 0, layers);
}
inline int64_t chunk_device_units(const ParallelConfig& c, int64_t model_layers, int64_t chunk) {
  const int64_t chunk_layers = model_layers / (c.pp * c.virtual_stages);
  return part_device_units(c.gpu_units, chunk * chunk_layers, chunk_layers);
}

// Per-stage TP (a cutpoint with pipeline stages): the first stage at cut_tp; 0 without stages
// or without a cutpoint (a cutpoint without stages runs both TP degrees on every rank).
inline int64_t cut_stage(const ParallelConfig& c, int64_t model_layers) {
  if (c.cut_layer <= 0 || c.pp <= 1) return 0;
  return c.cut_layer / (model_layers / c.pp);
}

// Per-stage TP: the plan as the stages from cut_stage() on run it — their TP degree, DP degree
// and micro-batch, without a cutpoint — for what one of their ranks holds.
Plan after_cut_layout(const Plan& plan);

// " for layers 0-(k−1), TP t₂ × DP d₂ for layers k-(L−1) (Oases' cutpoint)" (or, with stages,
// "(per-stage TP: stages s-(p−1))") for the lines that show a plan's parallelism; "" without a
// cutpoint.
std::string describe_cut(const Plan& plan);

// Why no worker of this version can execute `plan` — now only a cutpoint whose embeddings are
// updated on the CPU (offload optimizer with gpuUnits 0), which the planner does not emit
// (docs/PLANNER.md §15, §16) — naming the spec field to change; empty when the workers run it.
// The worker refuses such a plan with it, and the operator fails the job with it before
// creating pods.
std::string not_yet_executable(const Plan& plan);

Json to_json(const ParallelConfig& c);
Json to_json(const Prediction& p);
Json to_json(const Plan& plan);
// Throws FieldError with paths such as "plan.tp".
Plan decode_plan(const Json& doc);
// FNV-1a 64 of the canonical JSON of what the worker executes (everything but predicted, peak,
// alternatives, explanation and the hash itself), as 16 hex digits.
std::string compute_plan_hash(const Plan& plan);

}  // namespace kt::api

// The TrainingJob custom resource (kubetrain.dev/v1alpha1, docs/ARCHITECTURE.md §4.1): spec, status, the
// defaults, strict decoding with field paths, validation, and the JSON encoding.
//
// "auto" fields are std::nullopt: the planner fills them. Defaults that do not depend on the
// cluster are applied by decode (so `kubetrain validate` shows them); the rest by the planner.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "api/enums.h"
#include "api/error.h"
#include "api/model.h"
#include "api/yaml_json.h"

namespace kt::api {

inline constexpr const char* kGroup = "kubetrain.dev";
inline constexpr const char* kVersion = "v1alpha1";
inline constexpr const char* kApiVersion = "kubetrain.dev/v1alpha1";

struct ObjectMeta {
  std::string name;
  std::string namespace_ = "default";
  std::string uid;
  std::string resource_version;
  int64_t generation = 0;
  std::string creation_timestamp;
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> annotations;
};

struct ModelSpec {
  std::string preset;  // empty: all dims explicit
  // Explicit dims; when a preset is also given these override its values.
  std::optional<int64_t> layers, hidden, heads, ffn_hidden, vocab, seq_len;
};

// The largest values validate() and the CRD's schema (`maximum`) accept outside the model (its
// limits: ModelLimits). Bounds keep every count the planner forms (sequences × tokens, nodes ×
// GPUs, its search over batch divisors) inside int64 and finite.
struct JobLimits {
  static constexpr int64_t kSteps = 1000000000;           // 10^9 optimizer steps
  static constexpr int64_t kGlobalBatchSize = 16777216;   // 2^24 sequences per step
  static constexpr int64_t kNodes = 65536;                // spec.resources.maxNodes
  static constexpr int64_t kGpusPerNode = 1024;
  static constexpr int64_t kParallel = 65536;             // tensorParallel, dataParallel
  static constexpr int64_t kCheckpointKeep = 1000;
  static constexpr int64_t kBackoffLimit = 2147483647;    // int32, as in batch/v1 Job
  // activeDeadlineSeconds and ttlSecondsAfterFinished: int32 seconds (about 68 years), as
  // batch/v1 Job's ttlSecondsAfterFinished; far inside a nanosecond clock's range, so that
  // start + duration cannot overflow (9.2e9 s would).
  static constexpr int64_t kDurationSeconds = 2147483647;
};

struct TrainingSpec {
  int64_t steps = 0;                        // required
  int64_t global_batch_size = 32;           // sequences per optimizer step
  std::optional<int64_t> micro_batch_size;  // auto
  double learning_rate = 6e-4;              // GPT-3 paper's value for 125M-350M
  std::optional<int64_t> warmup_steps;      // default: min(steps/10, 2000), resolved by the planner
  double weight_decay = 0.1;
  double grad_clip = 1.0;              // 0 disables clipping
  std::optional<Precision> precision;  // auto: bf16 on GPUs, fp32 on CPUs
  int64_t seed = 1337;
};

struct DataSpec {
  DataSource source = DataSource::kSynthetic;
  std::string path;  // glob of llm.c token shards (source: tokens)
  Json volume;       // a core/v1 Volume, passed through to the pods
};

struct ResourcesSpec {
  std::optional<int64_t> max_nodes;      // auto: as many as help
  // At least this many nodes (elastic within [minNodes, maxNodes]): a restart that finds fewer
  // usable nodes waits for them instead of planning smaller. Unset: 1.
  std::optional<int64_t> min_nodes;
  std::optional<int64_t> gpus_per_node;  // auto
  bool cpu_only = false;
  std::map<std::string, std::string> node_selector;
  Json tolerations;   // passed through
  Json affinity;      // passed through
  std::string image;  // empty: the operator's default worker image
  Json resources;     // core/v1 ResourceRequirements overrides, passed through
};

struct ParallelismSpec {
  std::optional<int64_t> tensor_parallel;
  std::optional<int64_t> data_parallel;
  // Pipeline stages (1F1B) and the distributed optimizer (ZeRO-1). Unset (auto): the planner
  // uses them only where no plan without them fits (both workers run them; docs/PLANNER.md
  // §15).
  std::optional<int64_t> pipeline_parallel;
  // Virtual stages per pipeline stage (the interleaved schedule; Megatron's
  // --num-layers-per-virtual-pipeline-stage as a count). Unset (auto): the planner tries every
  // count that divides a stage's layers where the micro-batches are a multiple of the stages.
  std::optional<int64_t> virtual_stages;
  std::optional<bool> distributed_optimizer;  // on/off
  std::optional<bool> overlap;  // on/off
  std::optional<Recompute> recompute;
  std::optional<OffloadMode> offload;
  std::optional<int64_t> offload_window;
  std::optional<double> gpu_update_fraction;
  std::optional<double> gpu_memory_budget_bytes;
  // Re-plan on evidence (docs/PLANNER.md §11b): after a warm-up the operator folds the measured
  // phase times into the node kind's figures and switches to a plan they predict >= 10% faster
  // when the rest of the run repays the restart. Unset (auto): on.
  std::optional<bool> autotune;
  // Oases' cutpoint: the layers from cutpoint_layer on at TP cutpoint_tensor_parallel. on: the
  // search tries every cutpoint; off: none; unset (auto): only where nothing without fits.
  // Either number forces that value (and means on).
  std::optional<bool> cutpoint;
  std::optional<int64_t> cutpoint_layer;
  std::optional<int64_t> cutpoint_tensor_parallel;
};

struct CheckpointSpec {
  int64_t interval_steps = 500;  // 0: only at the end and on SIGTERM
  Json volume;
  int64_t keep = 3;
  // The PVC the operator makes when `volume` is unset: deleted with the job (Delete) or kept,
  // so that a job created again under the same name resumes from it (Retain).
  ClaimRetention claim_retention = ClaimRetention::kDelete;
};

// How the gang is admitted (Kubeflow's runPolicy.schedulingPolicy, plus the scheduler).
struct SchedulingPolicy {
  std::optional<GangScheduler> gang_scheduler;  // unset: the operator's --gang-scheduler
  std::string queue;  // Volcano queue or Kueue LocalQueue ("" : the job's kueue.x-k8s.io/queue-name)
  std::optional<int64_t> schedule_timeout_seconds;  // coscheduling's PodGroup; unset: 60
};

struct RunPolicy {
  int64_t backoff_limit = 3;
  std::optional<int64_t> active_deadline_seconds;
  std::optional<int64_t> ttl_seconds_after_finished;
  bool suspend = false;
  CleanPodPolicy clean_pod_policy = CleanPodPolicy::kRunning;
  SchedulingPolicy scheduling;
};

struct TrainingJobSpec {
  ModelSpec model;
  TrainingSpec training;
  DataSpec data;
  ResourcesSpec resources;
  ParallelismSpec parallelism;
  CheckpointSpec checkpoint;
  RunPolicy run_policy;
};

// ---- status ----------------------------------------------------------------------------------

enum class JobPhase {
  kPending,
  kPlanning,
  kStarting,
  kRunning,
  kRestarting,
  kSucceeded,
  kFailed,
  kSuspended
};
std::string_view to_string(JobPhase p);

struct Condition {  // metav1.Condition
  std::string type;
  std::string status;  // "True" | "False" | "Unknown"
  std::string reason;
  std::string message;
  int64_t observed_generation = 0;
  std::string last_transition_time;
};

struct PlanSummary {
  int64_t nodes = 0, gpus_per_node = 0, tp = 0, dp = 0;
  int64_t pp = 1;                      // pipeline stages
  int64_t virtual_stages = 1;          // chunks per stage (interleaved schedule)
  bool distributed_optimizer = false;  // ZeRO-1
  int64_t cut_layer = 0, cut_tp = 0;   // Oases' cutpoint (0: none)
  bool overlap = false;
  Recompute recompute = Recompute::kNone;
  OffloadMode offload = OffloadMode::kNone;
  int64_t offload_window = 0;
  double gpu_update_fraction = 1.0;
  double predicted_step_seconds = 0, predicted_tokens_per_second = 0;
  std::string config_map;
  std::string plan_hash;
};

struct WorkersStatus {
  int64_t desired = 0, ready = 0, succeeded = 0, failed = 0;
};

struct ProgressStatus {
  int64_t step = 0;
  std::optional<double> loss;
  double tokens_per_second = 0;
  std::optional<double> eta_seconds;
  std::optional<double> step_seconds;
};

// One switch of plan while the job ran (status.planHistory, newest last, at most 10 kept).
struct PlanChange {
  std::string time;
  std::string reason;  // Autotune | InventoryChanged | SpecChanged
  std::string message;
  std::string from_plan_hash, to_plan_hash;
  double from_predicted_step_seconds = 0;  // the old plan, as last predicted (with the figures
  double to_predicted_step_seconds = 0;    // the switch was decided on), and the new one
  std::optional<double> measured_step_seconds;  // the old plan's measured step (Autotune)
};

// What autotune last concluded (status.autotune).
struct AutotuneStatus {
  int64_t switches = 0;
  int64_t evaluated_attempt = -1;  // the restart attempt it last looked at (once per attempt)
  std::optional<double> measured_step_seconds;
  std::optional<double> refit_step_seconds;  // the running plan predicted with measured figures
  std::optional<double> best_step_seconds;   // the best plan with measured figures
  std::string message;
};

struct TrainingJobStatus {
  std::optional<JobPhase> phase;
  std::vector<Condition> conditions;
  int64_t observed_generation = 0;
  std::optional<PlanSummary> plan;
  WorkersStatus workers;
  int64_t restarts = 0;
  ProgressStatus progress;
  std::optional<int64_t> last_checkpoint_step;
  std::string start_time, completion_time;
  std::vector<PlanChange> plan_history;
  std::optional<AutotuneStatus> autotune;
};

struct TrainingJob {
  ObjectMeta metadata;
  TrainingJobSpec spec;
  TrainingJobStatus status;
};

// Kueue's label naming the LocalQueue a workload is submitted to.
inline constexpr const char* kKueueQueueLabel = "kueue.x-k8s.io/queue-name";
// The queue of the gang: spec.runPolicy.schedulingPolicy.queue, else the job's Kueue label.
std::string queue_name(const TrainingJob& job);

// Decodes a manifest (already parsed from YAML or JSON). Structural problems (wrong type, unknown
// field, bad enum value) throw FieldError with the path; call validate() for semantic checks.
TrainingJob decode_training_job(const Json& manifest);
// Semantic checks, all problems at once (empty: valid).
std::vector<FieldError> validate(const TrainingJob& job);
// Decodes and validates in one pass, reporting all problems at once as the API server does
// (structural ones — wrong type, unknown field, bad enum value — then the semantic ones about
// other fields); `job` holds what could be decoded. Empty: valid.
std::vector<FieldError> check_training_job(const Json& manifest, TrainingJob& job);
// Reads, decodes and validates a manifest file; throws Error / FieldError / ValidationError.
TrainingJob load_training_job(const std::string& path);

// The model dims a spec asks for (preset plus explicit overrides). Throws FieldError.
ModelDims resolve_model(const ModelSpec& spec);

Json to_json(const TrainingJob& job);
Json to_json(const TrainingJobSpec& spec);
Json to_json(const TrainingJobStatus& status);
TrainingJobStatus decode_status(const Json& status);

}  // namespace kt::api

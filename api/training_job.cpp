#include "api/training_job.h"

#include <cmath>
#include <regex>

#include "api/decode.h"

namespace kt::api {
namespace {

template <class E>
std::optional<E> read_enum(ObjectReader& r, const std::string& key, bool allow_auto) {
  auto text = r.string(key);
  if (!text || (allow_auto && *text == "auto")) return std::nullopt;
  if (auto v = parse_enum<E>(*text)) return v;
  r.fail(r.path_of(key), "unknown value \"" + *text + "\" (one of: " +
                             std::string(allow_auto ? "auto, " : "") + enum_choices<E>() + ")");
  return std::nullopt;
}

std::optional<bool> read_on_off(ObjectReader& r, const std::string& key) {
  if (!r.has(key)) {
    r.raw(key);  // mark as read
    return std::nullopt;
  }
  Json v = r.raw(key);
  if (v.is_boolean()) return v.get<bool>();  // YAML `on`/`off` are plain strings in YAML 1.2
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    if (s == "on") return true;
    if (s == "off") return false;
    if (s == "auto") return std::nullopt;
  }
  r.fail(r.path_of(key), "must be on, off or auto, got " + describe_json(v));
  return std::nullopt;
}

ObjectMeta decode_metadata(ObjectReader r) {
  ObjectMeta m;
  m.name = r.string("name").value_or("");
  m.namespace_ = r.string("namespace").value_or("default");
  m.uid = r.string("uid").value_or("");
  m.resource_version = r.string("resourceVersion").value_or("");
  m.generation = r.integer("generation").value_or(0);
  m.creation_timestamp = r.string("creationTimestamp").value_or("");
  m.labels = r.string_map("labels");
  m.annotations = r.string_map("annotations");
  r.allow_unknown();  // managedFields, ownerReferences, finalizers... belong to the API server
  return m;
}

ModelSpec decode_model(ObjectReader r) {
  ModelSpec m;
  m.preset = r.string("preset").value_or("");
  m.layers = r.integer("layers");
  m.hidden = r.integer("hidden");
  m.heads = r.integer("heads");
  m.ffn_hidden = r.integer("ffnHidden");
  m.vocab = r.integer("vocab");
  m.seq_len = r.integer("seqLen");
  r.finish();
  return m;
}

TrainingSpec decode_training(ObjectReader r) {
  TrainingSpec t;
  t.steps = r.integer("steps").value_or(0);
  t.global_batch_size = r.integer("globalBatchSize").value_or(t.global_batch_size);
  t.micro_batch_size = r.integer_or_auto("microBatchSize");
  t.learning_rate = r.number("learningRate").value_or(t.learning_rate);
  t.warmup_steps = r.integer("warmupSteps");
  t.weight_decay = r.number("weightDecay").value_or(t.weight_decay);
  t.grad_clip = r.number("gradClip").value_or(t.grad_clip);
  t.precision = read_enum<Precision>(r, "precision", true);
  t.seed = r.integer("seed").value_or(t.seed);
  r.finish();
  return t;
}

DataSpec decode_data(ObjectReader r) {
  DataSpec d;
  d.source = read_enum<DataSource>(r, "source", false).value_or(DataSource::kSynthetic);
  d.path = r.string("path").value_or("");
  d.volume = r.raw("volume");
  r.finish();
  return d;
}

ResourcesSpec decode_resources(ObjectReader r) {
  ResourcesSpec s;
  s.max_nodes = r.integer_or_auto("maxNodes");
  s.min_nodes = r.integer("minNodes");
  s.gpus_per_node = r.integer_or_auto("gpusPerNode");
  s.cpu_only = r.boolean("cpuOnly").value_or(false);
  s.node_selector = r.string_map("nodeSelector");
  s.tolerations = r.raw("tolerations");
  s.affinity = r.raw("affinity");
  s.image = r.string("image").value_or("");
  s.resources = r.raw("resources");
  r.finish();
  return s;
}

ParallelismSpec decode_parallelism(ObjectReader r) {
  ParallelismSpec p;
  p.tensor_parallel = r.integer_or_auto("tensorParallel");
  p.data_parallel = r.integer_or_auto("dataParallel");
  p.pipeline_parallel = r.integer_or_auto("pipelineParallel");
  p.virtual_stages = r.integer_or_auto("virtualStages");
  p.distributed_optimizer = read_on_off(r, "distributedOptimizer");
  p.cutpoint = read_on_off(r, "cutpoint");
  p.cutpoint_layer = r.integer_or_auto("cutpointLayer");
  p.cutpoint_tensor_parallel = r.integer_or_auto("cutpointTensorParallel");
  p.overlap = read_on_off(r, "overlap");
  p.recompute = read_enum<Recompute>(r, "recompute", true);
  p.offload = read_enum<OffloadMode>(r, "offload", true);
  p.offload_window = r.integer_or_auto("offloadWindow");
  p.gpu_update_fraction = r.number_or_auto("gpuUpdateFraction");
  p.gpu_memory_budget_bytes = r.quantity_or_auto("gpuMemoryBudget");
  p.autotune = read_on_off(r, "autotune");
  r.finish();
  return p;
}

CheckpointSpec decode_checkpoint(ObjectReader r) {
  CheckpointSpec c;
  c.interval_steps = r.integer("intervalSteps").value_or(c.interval_steps);
  c.volume = r.raw("volume");
  c.keep = r.integer("keep").value_or(c.keep);
  c.claim_retention =
      read_enum<ClaimRetention>(r, "claimRetentionPolicy", false).value_or(c.claim_retention);
  r.finish();
  return c;
}

SchedulingPolicy decode_scheduling_policy(ObjectReader r) {
  SchedulingPolicy p;
  p.gang_scheduler = read_enum<GangScheduler>(r, "gangScheduler", false);
  p.queue = r.string("queue").value_or("");
  p.schedule_timeout_seconds = r.integer("scheduleTimeoutSeconds");
  r.finish();
  return p;
}

RunPolicy decode_run_policy(ObjectReader r) {
  RunPolicy p;
  p.backoff_limit = r.integer("backoffLimit").value_or(p.backoff_limit);
  p.active_deadline_seconds = r.integer("activeDeadlineSeconds");
  p.ttl_seconds_after_finished = r.integer("ttlSecondsAfterFinished");
  p.suspend = r.boolean("suspend").value_or(false);
  p.clean_pod_policy =
      read_enum<CleanPodPolicy>(r, "cleanPodPolicy", false).value_or(CleanPodPolicy::kRunning);
  p.scheduling = decode_scheduling_policy(r.object("schedulingPolicy"));
  r.finish();
  return p;
}

// DNS-1035 label: the job name becomes a Service name and the prefix of pod hostnames
// ("<job>-worker-<rank>", at most 63 characters), so it is limited to 50.
const std::regex kDns1035("^[a-z]([-a-z0-9]*[a-z0-9])?$");

void check_positive(std::vector<FieldError>& errors, const std::string& path,
                    std::optional<int64_t> v) {
  if (v && *v <= 0) errors.emplace_back(path, std::to_string(*v) + " must be > 0");
}

void check_at_most(std::vector<FieldError>& errors, const std::string& path,
                   std::optional<int64_t> v, int64_t max) {
  if (v && *v > max)
    errors.emplace_back(path, std::to_string(*v) + " exceeds the limit of " + std::to_string(max));
}

std::string format_double(double v) {
  return Json(v).dump();
}

}  // namespace

std::string_view to_string(JobPhase p) {
  switch (p) {
    case JobPhase::kPending:
      return "Pending";
    case JobPhase::kPlanning:
      return "Planning";
    case JobPhase::kStarting:
      return "Starting";
    case JobPhase::kRunning:
      return "Running";
    case JobPhase::kRestarting:
      return "Restarting";
    case JobPhase::kSucceeded:
      return "Succeeded";
    case JobPhase::kFailed:
      return "Failed";
    case JobPhase::kSuspended:
      return "Suspended";
  }
  return "?";
}

namespace {

TrainingJob decode_training_job(const Json& manifest, std::vector<FieldError>* errors) {
  ObjectReader r(manifest, "", errors);
  TrainingJob job;
  const auto api_version = r.string("apiVersion");
  if (!api_version)
    r.fail("apiVersion", std::string("required (") + kApiVersion + ")");
  else if (*api_version != kApiVersion)
    r.fail("apiVersion",
           "\"" + *api_version + "\" is not supported (expected " + kApiVersion + ")");
  const auto kind = r.string("kind");
  if (kind.value_or("") != "TrainingJob")
    r.fail("kind",
           "must be TrainingJob, got " + (kind ? "\"" + *kind + "\"" : std::string("nothing")));
  job.metadata = decode_metadata(r.object("metadata"));
  ObjectReader spec = r.object("spec");
  job.spec.model = decode_model(spec.object("model"));
  job.spec.training = decode_training(spec.object("training"));
  job.spec.data = decode_data(spec.object("data"));
  job.spec.resources = decode_resources(spec.object("resources"));
  job.spec.parallelism = decode_parallelism(spec.object("parallelism"));
  job.spec.checkpoint = decode_checkpoint(spec.object("checkpoint"));
  job.spec.run_policy = decode_run_policy(spec.object("runPolicy"));
  spec.finish();
  r.raw("status");  // the API server's and the operator's business, decoded on its own
  r.finish();
  job.status = decode_status(manifest.is_object() && manifest.contains("status")
                                 ? manifest["status"]
                                 : Json());
  return job;
}

// A problem already reported for `path` or a field inside or around it: validate() would only
// repeat it in other words ("steps: must be an integer" then "steps: required").
bool covered(const std::vector<FieldError>& reported, const std::string& path) {
  for (const auto& e : reported) {
    const std::string& p = e.path();
    if (p == "<document>" || path.rfind(p, 0) == 0 || p.rfind(path, 0) == 0) return true;
  }
  return false;
}

}  // namespace

TrainingJob decode_training_job(const Json& manifest) {
  return decode_training_job(manifest, nullptr);
}

std::string queue_name(const TrainingJob& job) {
  if (!job.spec.run_policy.scheduling.queue.empty()) return job.spec.run_policy.scheduling.queue;
  const auto label = job.metadata.labels.find(kKueueQueueLabel);
  return label == job.metadata.labels.end() ? "" : label->second;
}

std::vector<FieldError> check_training_job(const Json& manifest, TrainingJob& job) {
  std::vector<FieldError> errors;
  try {
    job = decode_training_job(manifest, &errors);
  } catch (const FieldError& e) {  // status: written by the operator, decoded strictly
    errors.push_back(e);
    return errors;
  }
  const std::vector<FieldError> structural = errors;
  for (auto& e : validate(job))
    if (!covered(structural, e.path())) errors.push_back(std::move(e));
  return errors;
}

namespace {

// Resolves the dims, reporting every problem to `report` (which throws or collects); nullopt
// when the dims are unusable.
template <class Report>
std::optional<ModelDims> resolve_model_dims(const ModelSpec& spec, Report report) {
  ModelDims dims;
  if (!spec.preset.empty()) {
    const ModelPreset* preset = find_model_preset(spec.preset);
    if (!preset) {
      std::string names;
      for (const auto& p : model_presets()) names += (names.empty() ? "" : ", ") + p.name;
      report("spec.model.preset", "unknown preset \"" + spec.preset + "\" (one of: " + names + ")");
      return std::nullopt;
    }
    dims = preset->dims;
  }
  struct Field {
    const char* name;
    const std::optional<int64_t>& value;
    int64_t& out;
    int64_t max;
  };
  using L = ModelLimits;
  const Field fields[] = {{"layers", spec.layers, dims.layers, L::kLayers},
                          {"hidden", spec.hidden, dims.hidden, L::kHidden},
                          {"heads", spec.heads, dims.heads, L::kHeads},
                          {"ffnHidden", spec.ffn_hidden, dims.ffn_hidden, L::kFfnHidden},
                          {"vocab", spec.vocab, dims.vocab, L::kVocab},
                          {"seqLen", spec.seq_len, dims.seq_len, L::kSeqLen}};
  for (const auto& f : fields) {
    if (f.value) f.out = *f.value;
  }
  // ffnHidden defaults to 4h for explicit models, as in GPT-2.
  if (spec.preset.empty() && !spec.ffn_hidden) dims.ffn_hidden = 4 * dims.hidden;
  bool usable = true;
  for (const auto& f : fields) {
    const std::string path = std::string("spec.model.") + f.name;
    if (f.out == 0 && !f.value) {
      report(path, "required (or set spec.model.preset)");
    } else if (f.out <= 0) {
      report(path, std::to_string(f.out) + " must be > 0");
    } else if (f.out > f.max) {
      report(path, std::to_string(f.out) + " exceeds the limit of " + std::to_string(f.max));
    } else {
      continue;
    }
    usable = false;
  }
  if (!usable) return std::nullopt;
  if (dims.hidden % dims.heads != 0) {
    report("spec.model.heads", std::to_string(dims.heads) + " does not divide hidden " +
                                   std::to_string(dims.hidden));
    return std::nullopt;
  }
  // Each dim is bounded; their product is not: check the total in floating point before any
  // int64 arithmetic forms it.
  const double h = static_cast<double>(dims.hidden), f = static_cast<double>(dims.ffn_hidden);
  const double parameters = static_cast<double>(dims.layers) * (4 * h * h + 2 * h * f) +
                            static_cast<double>(dims.vocab + dims.seq_len) * h;
  if (parameters > L::kParameters) {
    report("spec.model", "the model would have " + format_double(parameters) +
                             " parameters, above the limit of " + format_double(L::kParameters));
    return std::nullopt;
  }
  return dims;
}

}  // namespace

ModelDims resolve_model(const ModelSpec& spec) {
  return *resolve_model_dims(spec, [](const std::string& path, const std::string& problem) {
    throw FieldError(path, problem);
  });
}

std::vector<FieldError> validate(const TrainingJob& job) {
  std::vector<FieldError> errors;
  const auto& meta = job.metadata;
  if (meta.name.empty()) {
    errors.emplace_back("metadata.name", "required");
  } else if (meta.name.size() > 50 || !std::regex_match(meta.name, kDns1035)) {
    errors.emplace_back("metadata.name",
                        "\"" + meta.name +
                            "\" must be at most 50 lowercase letters, digits or '-', start with a "
                            "letter and end with a letter or digit (it names a Service and pods)");
  }
  // A namespace is a DNS-1123 label (at most 63 lowercase letters, digits or '-'); `kubetrain
  // run` also builds paths from it, so nothing else (no '/', no "..") may pass.
  static const std::regex kDns1123Label("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$");
  if (!meta.namespace_.empty() &&
      (meta.namespace_.size() > 63 || !std::regex_match(meta.namespace_, kDns1123Label)))
    errors.emplace_back("metadata.namespace",
                        "\"" + meta.namespace_ +
                            "\" must be at most 63 lowercase letters, digits or '-', starting and "
                            "ending with a letter or digit");
  const std::optional<ModelDims> dims = resolve_model_dims(
      job.spec.model,
      [&](const std::string& path, const std::string& problem) { errors.emplace_back(path, problem); });

  const auto& t = job.spec.training;
  if (t.steps <= 0)
    errors.emplace_back("spec.training.steps", t.steps == 0
                                                   ? "required, must be > 0"
                                                   : std::to_string(t.steps) + " must be > 0");
  if (t.global_batch_size <= 0)
    errors.emplace_back("spec.training.globalBatchSize",
                        std::to_string(t.global_batch_size) + " must be > 0");
  check_positive(errors, "spec.training.microBatchSize", t.micro_batch_size);
  if (t.micro_batch_size && *t.micro_batch_size > 0 && t.global_batch_size > 0 &&
      t.global_batch_size % *t.micro_batch_size != 0)
    errors.emplace_back("spec.training.microBatchSize", std::to_string(*t.micro_batch_size) +
                                                            " does not divide globalBatchSize " +
                                                            std::to_string(t.global_batch_size));
  if (!(t.learning_rate > 0))
    errors.emplace_back("spec.training.learningRate",
                        format_double(t.learning_rate) + " must be > 0");
  if (t.warmup_steps && *t.warmup_steps < 0)
    errors.emplace_back("spec.training.warmupSteps",
                        std::to_string(*t.warmup_steps) + " must be >= 0");
  if (t.weight_decay < 0)
    errors.emplace_back("spec.training.weightDecay",
                        format_double(t.weight_decay) + " must be >= 0");
  if (t.grad_clip < 0)
    errors.emplace_back("spec.training.gradClip",
                        format_double(t.grad_clip) + " must be >= 0 (0 disables clipping)");

  if (job.spec.data.source == DataSource::kTokens && job.spec.data.path.empty())
    errors.emplace_back("spec.data.path", "required when source is tokens");

  using JL = JobLimits;
  check_at_most(errors, "spec.training.steps", t.steps, JL::kSteps);
  check_at_most(errors, "spec.training.globalBatchSize", t.global_batch_size, JL::kGlobalBatchSize);
  check_at_most(errors, "spec.training.microBatchSize", t.micro_batch_size, JL::kGlobalBatchSize);
  if (!std::isfinite(t.learning_rate))
    errors.emplace_back("spec.training.learningRate", format_double(t.learning_rate) + " must be finite");

  const auto& res = job.spec.resources;
  check_at_most(errors, "spec.resources.maxNodes", res.max_nodes, JL::kNodes);
  check_at_most(errors, "spec.resources.gpusPerNode", res.gpus_per_node, JL::kGpusPerNode);
  check_positive(errors, "spec.resources.maxNodes", res.max_nodes);
  check_at_most(errors, "spec.resources.minNodes", res.min_nodes, JL::kNodes);
  check_positive(errors, "spec.resources.minNodes", res.min_nodes);
  if (res.min_nodes && res.max_nodes && *res.min_nodes > *res.max_nodes)
    errors.emplace_back("spec.resources.minNodes", std::to_string(*res.min_nodes) +
                                                       " must be at most maxNodes (" +
                                                       std::to_string(*res.max_nodes) + ")");
  check_positive(errors, "spec.resources.gpusPerNode", res.gpus_per_node);

  const auto& p = job.spec.parallelism;
  check_positive(errors, "spec.parallelism.tensorParallel", p.tensor_parallel);
  check_positive(errors, "spec.parallelism.dataParallel", p.data_parallel);
  check_positive(errors, "spec.parallelism.pipelineParallel", p.pipeline_parallel);
  check_positive(errors, "spec.parallelism.offloadWindow", p.offload_window);
  check_at_most(errors, "spec.parallelism.pipelineParallel", p.pipeline_parallel, JL::kParallel);
  check_positive(errors, "spec.parallelism.virtualStages", p.virtual_stages);
  check_at_most(errors, "spec.parallelism.virtualStages", p.virtual_stages, ModelLimits::kLayers);
  if (p.virtual_stages && *p.virtual_stages > 1 && p.pipeline_parallel && *p.pipeline_parallel == 1)
    errors.emplace_back("spec.parallelism.virtualStages",
                        std::to_string(*p.virtual_stages) +
                            " virtual stages need pipeline stages (pipelineParallel is 1)");
  if (dims && p.virtual_stages && *p.virtual_stages > 0 && p.pipeline_parallel &&
      *p.pipeline_parallel > 0 && dims->layers % (*p.pipeline_parallel * *p.virtual_stages) != 0)
    errors.emplace_back("spec.parallelism.virtualStages",
                        std::to_string(*p.pipeline_parallel) + " stages × " +
                            std::to_string(*p.virtual_stages) +
                            " virtual stages do not divide "
                            "the model's " +
                            std::to_string(dims->layers) + " layers");
  check_positive(errors, "spec.parallelism.cutpointLayer", p.cutpoint_layer);
  check_positive(errors, "spec.parallelism.cutpointTensorParallel", p.cutpoint_tensor_parallel);
  check_at_most(errors, "spec.parallelism.cutpointTensorParallel", p.cutpoint_tensor_parallel,
                JL::kParallel);
  if (dims && p.cutpoint_layer && *p.cutpoint_layer >= dims->layers)
    errors.emplace_back("spec.parallelism.cutpointLayer",
                        std::to_string(*p.cutpoint_layer) + " is not inside the model's " +
                            std::to_string(dims->layers) +
                            " layers (the layers from it on change TP: 1 .. " +
                            std::to_string(dims->layers - 1) + ")");
  if (dims && p.cutpoint_tensor_parallel && *p.cutpoint_tensor_parallel > 0 &&
      dims->heads % *p.cutpoint_tensor_parallel != 0)
    errors.emplace_back("spec.parallelism.cutpointTensorParallel",
                        std::to_string(*p.cutpoint_tensor_parallel) + " does not divide heads " +
                            std::to_string(dims->heads));
  if (p.cutpoint && !*p.cutpoint && (p.cutpoint_layer || p.cutpoint_tensor_parallel))
    errors.emplace_back("spec.parallelism.cutpoint",
                        "is off, but cutpointLayer or cutpointTensorParallel asks for one");
  // With stages the cut is between two of them (per-stage TP), of one chunk each.
  if (dims && p.cutpoint_layer && *p.cutpoint_layer > 0 && p.pipeline_parallel &&
      *p.pipeline_parallel > 1 && dims->layers % *p.pipeline_parallel == 0 &&
      *p.cutpoint_layer % (dims->layers / *p.pipeline_parallel) != 0)
    errors.emplace_back("spec.parallelism.cutpointLayer",
                        std::to_string(*p.cutpoint_layer) + " is inside a pipeline stage: with " +
                            std::to_string(*p.pipeline_parallel) + " stages of " +
                            std::to_string(dims->layers / *p.pipeline_parallel) +
                            " layers the cut is at a stage boundary (a multiple of " +
                            std::to_string(dims->layers / *p.pipeline_parallel) + ")");
  if ((p.cutpoint_layer || p.cutpoint_tensor_parallel || (p.cutpoint && *p.cutpoint)) &&
      p.virtual_stages && *p.virtual_stages > 1)
    errors.emplace_back("spec.parallelism.virtualStages",
                        std::to_string(*p.virtual_stages) +
                            " virtual stages with a cutpoint: a cut between stages needs one "
                            "chunk of layers per stage");
  if (dims && p.pipeline_parallel && *p.pipeline_parallel > 0 &&
      dims->layers % *p.pipeline_parallel != 0)
    errors.emplace_back("spec.parallelism.pipelineParallel",
                        std::to_string(*p.pipeline_parallel) + " does not divide the model's " +
                            std::to_string(dims->layers) + " layers (stages hold equal layers)");
  check_at_most(errors, "spec.parallelism.tensorParallel", p.tensor_parallel, JL::kParallel);
  check_at_most(errors, "spec.parallelism.dataParallel", p.data_parallel, JL::kParallel);
  if (dims && p.tensor_parallel && *p.tensor_parallel > 0) {
    const int64_t tp = *p.tensor_parallel;
    if (dims->heads % tp != 0)
      errors.emplace_back(
          "spec.parallelism.tensorParallel",
          std::to_string(tp) + " does not divide heads " + std::to_string(dims->heads));
    else if (dims->ffn_hidden % tp != 0)
      errors.emplace_back(
          "spec.parallelism.tensorParallel",
          std::to_string(tp) + " does not divide ffnHidden " + std::to_string(dims->ffn_hidden));
  }
  if (dims && p.offload_window && *p.offload_window > dims->layers)
    errors.emplace_back("spec.parallelism.offloadWindow",
                        std::to_string(*p.offload_window) + " exceeds the model's " +
                            std::to_string(dims->layers) + " layers");
  if (p.offload_window && p.offload && *p.offload != OffloadMode::kWindow)
    errors.emplace_back("spec.parallelism.offloadWindow",
                        "is only meaningful with offload: window (offload is " +
                            std::string(to_string(*p.offload)) + ")");
  if (p.gpu_update_fraction) {
    const double f = *p.gpu_update_fraction;
    if (!(f >= 0.0 && f <= 1.0))
      errors.emplace_back("spec.parallelism.gpuUpdateFraction",
                          format_double(f) + " must be between 0 and 1");
    else if (p.offload && *p.offload == OffloadMode::kNone && f < 1.0)
      errors.emplace_back(
          "spec.parallelism.gpuUpdateFraction",
          format_double(f) + " needs offload: optimizer or window (offload is none)");
  }
  if (p.gpu_memory_budget_bytes && !(*p.gpu_memory_budget_bytes > 0))
    errors.emplace_back("spec.parallelism.gpuMemoryBudget", "must be > 0");

  const auto& c = job.spec.checkpoint;
  if (c.interval_steps < 0)
    errors.emplace_back("spec.checkpoint.intervalSteps",
                        std::to_string(c.interval_steps) + " must be >= 0 (0: only at the end)");
  if (c.keep < 1)
    errors.emplace_back("spec.checkpoint.keep", std::to_string(c.keep) + " must be >= 1");
  check_at_most(errors, "spec.checkpoint.keep", c.keep, JL::kCheckpointKeep);

  const auto& rp = job.spec.run_policy;
  if (rp.backoff_limit < 0)
    errors.emplace_back("spec.runPolicy.backoffLimit",
                        std::to_string(rp.backoff_limit) + " must be >= 0");
  check_at_most(errors, "spec.runPolicy.backoffLimit", rp.backoff_limit, JL::kBackoffLimit);
  check_positive(errors, "spec.runPolicy.activeDeadlineSeconds", rp.active_deadline_seconds);
  check_at_most(errors, "spec.runPolicy.activeDeadlineSeconds", rp.active_deadline_seconds,
                JL::kDurationSeconds);
  if (rp.ttl_seconds_after_finished && *rp.ttl_seconds_after_finished < 0)
    errors.emplace_back("spec.runPolicy.ttlSecondsAfterFinished",
                        std::to_string(*rp.ttl_seconds_after_finished) + " must be >= 0");
  check_at_most(errors, "spec.runPolicy.ttlSecondsAfterFinished", rp.ttl_seconds_after_finished,
                JL::kDurationSeconds);
  const SchedulingPolicy& sp = rp.scheduling;
  check_positive(errors, "spec.runPolicy.schedulingPolicy.scheduleTimeoutSeconds",
                 sp.schedule_timeout_seconds);
  check_at_most(errors, "spec.runPolicy.schedulingPolicy.scheduleTimeoutSeconds",
                sp.schedule_timeout_seconds, JL::kBackoffLimit);
  // A Volcano queue and a Kueue LocalQueue are object names (DNS-1123 subdomains).
  static const std::regex kDns1123Subdomain(
      "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$");
  if (!sp.queue.empty() &&
      (sp.queue.size() > 253 || !std::regex_match(sp.queue, kDns1123Subdomain)))
    errors.emplace_back("spec.runPolicy.schedulingPolicy.queue",
                        "\"" + sp.queue.substr(0, 64) +
                            "\" is not a valid queue name (a DNS-1123 subdomain: lower-case "
                            "letters, digits, '-' and '.', at most 253 characters)");
  if (sp.gang_scheduler == GangScheduler::kKueue && queue_name(job).empty())
    errors.emplace_back("spec.runPolicy.schedulingPolicy.queue",
                        std::string("required with gangScheduler Kueue (the LocalQueue to submit "
                                    "to), or the label ") +
                            kKueueQueueLabel + " on the TrainingJob");
  return errors;
}

TrainingJob load_training_job(const std::string& path) {
  const Json doc = load_document(path);
  TrainingJob job;
  auto errors = check_training_job(doc, job);
  if (!errors.empty()) throw ValidationError(std::move(errors));
  return job;
}

// ---- encoding ----------------------------------------------------------------------------------

namespace {

template <class T>
void put(Json& out, const char* key, const std::optional<T>& v) {
  if (v) out[key] = *v;
}
template <class T>
void put_auto(Json& out, const char* key, const std::optional<T>& v) {
  if (v)
    out[key] = *v;
  else
    out[key] = "auto";
}
template <class E>
void put_enum_auto(Json& out, const char* key, const std::optional<E>& v) {
  out[key] = v ? std::string(to_string(*v)) : std::string("auto");
}

}  // namespace

Json to_json(const TrainingJobSpec& s) {
  Json spec = Json::object();
  Json& model = spec["model"] = Json::object();
  if (!s.model.preset.empty()) model["preset"] = s.model.preset;
  put(model, "layers", s.model.layers);
  put(model, "hidden", s.model.hidden);
  put(model, "heads", s.model.heads);
  put(model, "ffnHidden", s.model.ffn_hidden);
  put(model, "vocab", s.model.vocab);
  put(model, "seqLen", s.model.seq_len);

  const auto& t = s.training;
  spec["training"] = {{"steps", t.steps},
                      {"globalBatchSize", t.global_batch_size},
                      {"learningRate", t.learning_rate},
                      {"weightDecay", t.weight_decay},
                      {"gradClip", t.grad_clip},
                      {"seed", t.seed}};
  put_auto(spec["training"], "microBatchSize", t.micro_batch_size);
  put(spec["training"], "warmupSteps", t.warmup_steps);
  put_enum_auto(spec["training"], "precision", t.precision);

  Json& data = spec["data"] = {{"source", std::string(to_string(s.data.source))}};
  if (!s.data.path.empty()) data["path"] = s.data.path;
  if (!s.data.volume.is_null()) data["volume"] = s.data.volume;

  const auto& r = s.resources;
  Json& res = spec["resources"] = {{"cpuOnly", r.cpu_only}};
  put_auto(res, "maxNodes", r.max_nodes);
  if (r.min_nodes) res["minNodes"] = *r.min_nodes;
  put_auto(res, "gpusPerNode", r.gpus_per_node);
  if (!r.node_selector.empty()) res["nodeSelector"] = r.node_selector;
  if (!r.tolerations.is_null()) res["tolerations"] = r.tolerations;
  if (!r.affinity.is_null()) res["affinity"] = r.affinity;
  if (!r.image.empty()) res["image"] = r.image;
  if (!r.resources.is_null()) res["resources"] = r.resources;

  const auto& p = s.parallelism;
  Json& par = spec["parallelism"] = Json::object();
  put_auto(par, "tensorParallel", p.tensor_parallel);
  put_auto(par, "dataParallel", p.data_parallel);
  put_auto(par, "pipelineParallel", p.pipeline_parallel);
  if (p.virtual_stages) par["virtualStages"] = *p.virtual_stages;
  if (p.distributed_optimizer)
    par["distributedOptimizer"] = *p.distributed_optimizer ? "on" : "off";
  if (p.cutpoint) par["cutpoint"] = *p.cutpoint ? "on" : "off";
  put_auto(par, "cutpointLayer", p.cutpoint_layer);
  put_auto(par, "cutpointTensorParallel", p.cutpoint_tensor_parallel);
  par["overlap"] = p.overlap ? (*p.overlap ? "on" : "off") : "auto";
  if (p.autotune) par["autotune"] = *p.autotune ? "on" : "off";
  put_enum_auto(par, "recompute", p.recompute);
  put_enum_auto(par, "offload", p.offload);
  put_auto(par, "offloadWindow", p.offload_window);
  put_auto(par, "gpuUpdateFraction", p.gpu_update_fraction);
  put_auto(par, "gpuMemoryBudget", p.gpu_memory_budget_bytes);

  Json& ckpt = spec["checkpoint"] = {
      {"intervalSteps", s.checkpoint.interval_steps},
      {"keep", s.checkpoint.keep},
      {"claimRetentionPolicy", std::string(to_string(s.checkpoint.claim_retention))}};
  if (!s.checkpoint.volume.is_null()) ckpt["volume"] = s.checkpoint.volume;

  const auto& rp = s.run_policy;
  Json& run = spec["runPolicy"] = {{"backoffLimit", rp.backoff_limit},
                                   {"suspend", rp.suspend},
                                   {"cleanPodPolicy", std::string(to_string(rp.clean_pod_policy))}};
  put(run, "activeDeadlineSeconds", rp.active_deadline_seconds);
  put(run, "ttlSecondsAfterFinished", rp.ttl_seconds_after_finished);
  const SchedulingPolicy& sp = rp.scheduling;
  if (sp.gang_scheduler || !sp.queue.empty() || sp.schedule_timeout_seconds) {
    Json& sched = run["schedulingPolicy"] = Json::object();
    if (sp.gang_scheduler) sched["gangScheduler"] = std::string(to_string(*sp.gang_scheduler));
    if (!sp.queue.empty()) sched["queue"] = sp.queue;
    put(sched, "scheduleTimeoutSeconds", sp.schedule_timeout_seconds);
  }
  return spec;
}

Json to_json(const TrainingJobStatus& s) {
  Json out = Json::object();
  if (s.phase) out["phase"] = std::string(to_string(*s.phase));
  if (!s.conditions.empty()) {
    Json& conds = out["conditions"] = Json::array();
    for (const auto& c : s.conditions)
      conds.push_back({{"type", c.type},
                       {"status", c.status},
                       {"reason", c.reason},
                       {"message", c.message},
                       {"observedGeneration", c.observed_generation},
                       {"lastTransitionTime", c.last_transition_time}});
  }
  out["observedGeneration"] = s.observed_generation;
  if (s.plan) {
    const auto& p = *s.plan;
    out["plan"] = {{"nodes", p.nodes},
                   {"gpusPerNode", p.gpus_per_node},
                   {"tp", p.tp},
                   {"dp", p.dp},
                   {"pp", p.pp},
                   {"distributedOptimizer", p.distributed_optimizer},
                   {"overlap", p.overlap},
                   {"recompute", std::string(to_string(p.recompute))},
                   {"offload",
                    {{"mode", std::string(to_string(p.offload))},
                     {"window", p.offload_window},
                     {"gpuUpdateFraction", p.gpu_update_fraction}}},
                   {"predictedStepSeconds", p.predicted_step_seconds},
                   {"predictedTokensPerSecond", p.predicted_tokens_per_second},
                   {"configMap", p.config_map},
                   {"planHash", p.plan_hash}};
    if (p.cut_layer > 0) out["plan"]["cutpoint"] = {{"layer", p.cut_layer}, {"tp", p.cut_tp}};
    if (p.virtual_stages > 1) out["plan"]["virtualStages"] = p.virtual_stages;
  }
  out["workers"] = {{"desired", s.workers.desired},
                    {"ready", s.workers.ready},
                    {"succeeded", s.workers.succeeded},
                    {"failed", s.workers.failed}};
  out["restarts"] = s.restarts;
  Json& prog = out["progress"] = {{"step", s.progress.step},
                                  {"tokensPerSecond", s.progress.tokens_per_second}};
  put(prog, "loss", s.progress.loss);
  put(prog, "etaSeconds", s.progress.eta_seconds);
  put(prog, "stepSeconds", s.progress.step_seconds);
  put(out, "lastCheckpointStep", s.last_checkpoint_step);
  if (!s.start_time.empty()) out["startTime"] = s.start_time;
  if (!s.completion_time.empty()) out["completionTime"] = s.completion_time;
  if (!s.plan_history.empty()) {
    Json& history = out["planHistory"] = Json::array();
    for (const PlanChange& c : s.plan_history) {
      Json entry = {{"time", c.time},
                    {"reason", c.reason},
                    {"message", c.message},
                    {"fromPlanHash", c.from_plan_hash},
                    {"toPlanHash", c.to_plan_hash},
                    {"fromPredictedStepSeconds", c.from_predicted_step_seconds},
                    {"toPredictedStepSeconds", c.to_predicted_step_seconds}};
      put(entry, "measuredStepSeconds", c.measured_step_seconds);
      history.push_back(std::move(entry));
    }
  }
  if (s.autotune) {
    const AutotuneStatus& a = *s.autotune;
    Json& at = out["autotune"] = {{"switches", a.switches},
                                  {"evaluatedAttempt", a.evaluated_attempt},
                                  {"message", a.message}};
    put(at, "measuredStepSeconds", a.measured_step_seconds);
    put(at, "refitStepSeconds", a.refit_step_seconds);
    put(at, "bestStepSeconds", a.best_step_seconds);
  }
  return out;
}

TrainingJobStatus decode_status(const Json& value) {
  TrainingJobStatus s;
  ObjectReader r(value, "status");
  if (auto phase = r.string("phase")) {
    bool known = false;
    for (int i = 0; i <= static_cast<int>(JobPhase::kSuspended); ++i) {
      if (to_string(static_cast<JobPhase>(i)) == *phase) {
        s.phase = static_cast<JobPhase>(i);
        known = true;
      }
    }
    if (!known) throw FieldError("status.phase", "unknown phase \"" + *phase + "\"");
  }
  Json conds = r.raw("conditions");
  if (conds.is_array()) {
    for (size_t i = 0; i < conds.size(); ++i) {
      ObjectReader c(conds[i], "status.conditions[" + std::to_string(i) + "]");
      Condition cond;
      cond.type = c.string("type").value_or("");
      cond.status = c.string("status").value_or("Unknown");
      cond.reason = c.string("reason").value_or("");
      cond.message = c.string("message").value_or("");
      cond.observed_generation = c.integer("observedGeneration").value_or(0);
      cond.last_transition_time = c.string("lastTransitionTime").value_or("");
      c.finish();
      s.conditions.push_back(cond);
    }
  }
  s.observed_generation = r.integer("observedGeneration").value_or(0);
  if (r.has("plan")) {
    ObjectReader p = r.object("plan");
    PlanSummary ps;
    ps.nodes = p.integer("nodes").value_or(0);
    ps.gpus_per_node = p.integer("gpusPerNode").value_or(0);
    ps.tp = p.integer("tp").value_or(0);
    ps.dp = p.integer("dp").value_or(0);
    ps.pp = p.integer("pp").value_or(1);
    ps.virtual_stages = p.integer("virtualStages").value_or(1);
    ps.distributed_optimizer = p.boolean("distributedOptimizer").value_or(false);
    if (p.has("cutpoint")) {
      ObjectReader cut = p.object("cutpoint");
      ps.cut_layer = cut.integer("layer").value_or(0);
      ps.cut_tp = cut.integer("tp").value_or(0);
      cut.finish();
    }
    ps.overlap = p.boolean("overlap").value_or(false);
    if (auto rc = p.string("recompute"))
      ps.recompute = parse_enum<Recompute>(*rc).value_or(Recompute::kNone);
    ObjectReader off = p.object("offload");
    if (auto mode = off.string("mode"))
      ps.offload = parse_enum<OffloadMode>(*mode).value_or(OffloadMode::kNone);
    ps.offload_window = off.integer("window").value_or(0);
    ps.gpu_update_fraction = off.number("gpuUpdateFraction").value_or(1.0);
    off.finish();
    ps.predicted_step_seconds = p.number("predictedStepSeconds").value_or(0);
    ps.predicted_tokens_per_second = p.number("predictedTokensPerSecond").value_or(0);
    ps.config_map = p.string("configMap").value_or("");
    ps.plan_hash = p.string("planHash").value_or("");
    p.finish();
    s.plan = ps;
  } else {
    r.raw("plan");
  }
  ObjectReader w = r.object("workers");
  s.workers.desired = w.integer("desired").value_or(0);
  s.workers.ready = w.integer("ready").value_or(0);
  s.workers.succeeded = w.integer("succeeded").value_or(0);
  s.workers.failed = w.integer("failed").value_or(0);
  w.finish();
  s.restarts = r.integer("restarts").value_or(0);
  ObjectReader prog = r.object("progress");
  s.progress.step = prog.integer("step").value_or(0);
  s.progress.loss = prog.number("loss");
  s.progress.tokens_per_second = prog.number("tokensPerSecond").value_or(0);
  s.progress.eta_seconds = prog.number("etaSeconds");
  s.progress.step_seconds = prog.number("stepSeconds");
  prog.finish();
  s.last_checkpoint_step = r.integer("lastCheckpointStep");
  s.start_time = r.string("startTime").value_or("");
  s.completion_time = r.string("completionTime").value_or("");
  const Json history = r.raw("planHistory");
  if (history.is_array()) {
    for (size_t i = 0; i < history.size(); ++i) {
      ObjectReader h(history[i], "status.planHistory[" + std::to_string(i) + "]");
      PlanChange c;
      c.time = h.string("time").value_or("");
      c.reason = h.string("reason").value_or("");
      c.message = h.string("message").value_or("");
      c.from_plan_hash = h.string("fromPlanHash").value_or("");
      c.to_plan_hash = h.string("toPlanHash").value_or("");
      c.from_predicted_step_seconds = h.number("fromPredictedStepSeconds").value_or(0);
      c.to_predicted_step_seconds = h.number("toPredictedStepSeconds").value_or(0);
      c.measured_step_seconds = h.number("measuredStepSeconds");
      h.finish();
      s.plan_history.push_back(std::move(c));
    }
  }
  if (r.has("autotune")) {
    ObjectReader a = r.object("autotune");
    AutotuneStatus at;
    at.switches = a.integer("switches").value_or(0);
    at.evaluated_attempt = a.integer("evaluatedAttempt").value_or(-1);
    at.message = a.string("message").value_or("");
    at.measured_step_seconds = a.number("measuredStepSeconds");
    at.refit_step_seconds = a.number("refitStepSeconds");
    at.best_step_seconds = a.number("bestStepSeconds");
    a.finish();
    s.autotune = at;
  } else {
    r.raw("autotune");
  }
  r.finish();
  return s;
}

Json to_json(const TrainingJob& job) {
  Json meta = {{"name", job.metadata.name}, {"namespace", job.metadata.namespace_}};
  if (!job.metadata.uid.empty()) meta["uid"] = job.metadata.uid;
  if (!job.metadata.resource_version.empty())
    meta["resourceVersion"] = job.metadata.resource_version;
  if (job.metadata.generation) meta["generation"] = job.metadata.generation;
  if (!job.metadata.creation_timestamp.empty())
    meta["creationTimestamp"] = job.metadata.creation_timestamp;
  if (!job.metadata.labels.empty()) meta["labels"] = job.metadata.labels;
  if (!job.metadata.annotations.empty()) meta["annotations"] = job.metadata.annotations;
  return {{"apiVersion", kApiVersion},
          {"kind", "TrainingJob"},
          {"metadata", meta},
          {"spec", to_json(job.spec)},
          {"status", to_json(job.status)}};
}

}  // namespace kt::api

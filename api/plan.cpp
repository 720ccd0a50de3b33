#include "api/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "api/decode.h"
#include "api/error.h"

namespace kt::api {
namespace {

template <class E>
E read_enum_field(ObjectReader& r, const std::string& key, E fallback) {
  auto text = r.string(key);
  if (!text) return fallback;
  if (auto v = parse_enum<E>(*text)) return *v;
  throw FieldError(r.path_of(key),
                   "unknown value \"" + *text + "\" (one of: " + enum_choices<E>() + ")");
}

Json placement_json(const LayerPlacement& p) {
  return {{"resident", p.resident}, {"update", std::string(to_string(p.update))}};
}

LayerPlacement decode_placement(ObjectReader r) {
  LayerPlacement p;
  p.resident = r.boolean("resident").value_or(true);
  p.update = read_enum_field(r, "update", UpdateDevice::kGpu);
  r.finish();
  return p;
}

ParallelConfig decode_config(ObjectReader& r, int64_t& global_batch) {
  ParallelConfig c;
  // Bounded as a TrainingJob's counts are (JobLimits), so that nodes × procsPerNode and tp × dp
  // stay inside int64.
  auto required = [&](const char* key, int64_t limit) {
    auto v = r.integer(key);
    if (!v) throw FieldError(r.path_of(key), "required");
    if (*v < 0 || *v > limit)
      throw FieldError(r.path_of(key), std::to_string(*v) + " must be between 0 and " +
                                           std::to_string(limit));
    return *v;
  };
  c.nodes = required("nodes", JobLimits::kNodes);
  c.procs_per_node = required("procsPerNode", JobLimits::kParallel);
  c.tp = required("tp", JobLimits::kParallel);
  c.dp = required("dp", JobLimits::kParallel);
  ObjectReader batch = r.object("batch");
  c.micro_batch = batch.integer("micro").value_or(1);
  c.grad_accum = batch.integer("gradAccum").value_or(1);
  global_batch = batch.integer("global").value_or(0);
  batch.finish();
  ObjectReader overlap = r.object("overlap");
  c.sub_batches = overlap.integer("subBatches").value_or(1);
  overlap.finish();
  c.recompute = read_enum_field(r, "recompute", Recompute::kNone);
  // Absent in plans without a pipeline or a distributed optimizer (their hash stays as it was).
  ObjectReader pipeline = r.object("pipeline");
  c.pp = pipeline.integer("stages").value_or(1);
  if (c.pp < 1 || c.pp > JobLimits::kParallel)
    throw FieldError(pipeline.path_of("stages"), std::to_string(c.pp) + " must be between 1 and " +
                                                     std::to_string(JobLimits::kParallel));
  pipeline.integer("layersPerStage");
  c.virtual_stages = pipeline.integer("virtualStages").value_or(1);
  pipeline.integer("layersPerVirtualStage");
  pipeline.raw("stageTensorParallel");  // what the cutpoint gives each stage (written below)
  if (c.virtual_stages < 1 || c.virtual_stages > ModelLimits::kLayers)
    throw FieldError(pipeline.path_of("virtualStages"), std::to_string(c.virtual_stages) +
                                                            " must be between 1 and " +
                                                            std::to_string(ModelLimits::kLayers));
  pipeline.finish();
  c.distributed_optimizer = r.boolean("distributedOptimizer").value_or(false);
  ObjectReader cut = r.object("cutpoint");
  c.cut_layer = cut.integer("layer").value_or(0);
  c.cut_tp = c.cut_layer > 0 ? cut.integer("tp").value_or(0) : 0;
  cut.integer("tp");
  cut.integer("dp");
  cut.finish();
  if (c.cut_layer < 0 || c.cut_layer > ModelLimits::kLayers)
    throw FieldError(cut.path_of("layer"), std::to_string(c.cut_layer) + " must be between 0 and " +
                                               std::to_string(ModelLimits::kLayers));
  if (c.cut_layer > 0 && (c.cut_tp < 1 || c.cut_tp > JobLimits::kParallel))
    throw FieldError(cut.path_of("tp"), std::to_string(c.cut_tp) + " must be between 1 and " +
                                            std::to_string(JobLimits::kParallel));
  return c;
}

}  // namespace

Plan after_cut_layout(const Plan& plan) {
  Plan after = plan;
  auto& c = after.config;
  c.dp = c.tp * c.dp / c.cut_tp;
  c.micro_batch = c.micro_batch * c.cut_tp / c.tp;
  c.tp = c.cut_tp;
  c.cut_layer = 0, c.cut_tp = 0;
  return after;
}

std::string describe_cut(const Plan& plan) {
  const auto& c = plan.config;
  if (c.cut_layer <= 0) return "";
  const int64_t L = plan.model.layers;
  return " for layers 0-" + std::to_string(c.cut_layer - 1) + ", TP " + std::to_string(c.cut_tp) +
         " × DP " + std::to_string(plan.world / c.pp / c.cut_tp) + " for layers " +
         std::to_string(c.cut_layer) + "-" + std::to_string(L - 1) +
         (c.pp > 1 ? " (per-stage TP: stages " + std::to_string(cut_stage(c, L)) + "-" +
                         std::to_string(c.pp - 1) + ")"
                   : std::string(" (Oases' cutpoint)"));
}

std::string not_yet_executable(const Plan& plan) {
  const auto& c = plan.config;
  if (c.cut_layer > 0 && c.offload == OffloadMode::kOptimizer && c.gpu_units < 1)
    return "it changes the tensor-parallel degree at layer " + std::to_string(c.cut_layer) +
           " (Oases' cutpoint) with the embeddings updated on the CPU, and the workers sum a "
           "cutpoint's embeddings over every rank on the device (set a larger "
           "spec.parallelism.gpuUpdateFraction, or cutpoint: off)";
  return "";
}

Json to_json(const ParallelConfig& c) {
  Json out = {{"nodes", c.nodes},
              {"procsPerNode", c.procs_per_node},
              {"tp", c.tp},
              {"dp", c.dp},
              {"pp", c.pp},
              {"virtualStages", c.virtual_stages},
              {"distributedOptimizer", c.distributed_optimizer},
              {"microBatch", c.micro_batch},
              {"gradAccum", c.grad_accum},
              {"subBatches", c.sub_batches},
              {"recompute", std::string(to_string(c.recompute))},
              {"offload", std::string(to_string(c.offload))},
              {"gpuUnits", c.gpu_units},
              {"window", c.window}};
  if (c.cut_layer > 0) out["cutpoint"] = {{"layer", c.cut_layer}, {"tp", c.cut_tp}};
  return out;
}

namespace {

double number_or_zero(const Json& object, const char* key) {
  if (!object.is_object()) return 0;
  const auto it = object.find(key);
  if (it == object.end() || !it->is_number()) return 0;
  const double x = it->get<double>();
  return std::isfinite(x) ? x : 0;
}

// The parts of a plan's "predicted" the worker reports (to_json(Prediction)'s names).
Prediction decode_prediction(const Json& j) {
  Prediction p;
  p.step_seconds = number_or_zero(j, "stepSeconds");
  p.tokens_per_second = number_or_zero(j, "tokensPerSecond");
  p.mfu = number_or_zero(j, "mfu");
  const Json empty = Json::object();
  const Json& b = j.is_object() && j.contains("breakdownSeconds") ? j["breakdownSeconds"] : empty;
  TimeBreakdown& t = p.time;
  t.compute = number_or_zero(b, "compute");
  t.tp_comm_total = number_or_zero(b, "tpCommTotal");
  t.tp_comm_exposed = number_or_zero(b, "tpCommExposed");
  t.dp_comm_total = number_or_zero(b, "dpCommTotal");
  t.dp_comm_exposed = number_or_zero(b, "dpCommExposed");
  t.transfer_total = number_or_zero(b, "transferTotal");
  t.transfer_exposed = number_or_zero(b, "transferExposed");
  t.optimizer_gpu = number_or_zero(b, "optimizerGpu");
  t.optimizer_cpu_total = number_or_zero(b, "optimizerCpuTotal");
  t.optimizer_cpu_exposed = number_or_zero(b, "optimizerCpuExposed");
  return p;
}

}  // namespace

Json to_json(const Prediction& p) {
  const auto& t = p.time;
  const auto& m = p.memory;
  return {{"stepSeconds", p.step_seconds},
          {"tokensPerSecond", p.tokens_per_second},
          {"mfu", p.mfu},
          {"breakdownSeconds",
           {{"compute", t.compute},
            {"tpCommTotal", t.tp_comm_total},
            {"tpCommExposed", t.tp_comm_exposed},
            {"dpCommTotal", t.dp_comm_total},
            {"dpCommExposed", t.dp_comm_exposed},
            {"transferTotal", t.transfer_total},
            {"transferExposed", t.transfer_exposed},
            {"optimizerGpu", t.optimizer_gpu},
            {"optimizerCpuTotal", t.optimizer_cpu_total},
            {"optimizerCpuExposed", t.optimizer_cpu_exposed}}},
          {"memoryPerRankBytes",
           {{"params", m.params},
            {"grads", m.grads},
            {"optimizer", m.optimizer},
            {"activations", m.activations},
            {"workspace", m.workspace},
            {"reserve", m.reserve},
            {"total", m.total()},
            {"capacity", p.device_capacity_bytes}}},
          {"hostMemoryPerNodeBytes",
           {{"used", p.host_bytes_per_node}, {"capacity", p.host_capacity_bytes}}},
          {"pcieBytesPerStep", p.pcie_bytes_per_step}};
}

static Json executed_part(const Plan& plan) {
  const auto& m = plan.model;
  const auto& c = plan.config;
  Json layers = Json::array();
  for (const auto& l : plan.layers) layers.push_back(placement_json(l));
  const auto& t = plan.training;
  Json data = {{"source", std::string(to_string(plan.data.source))}};
  if (!plan.data.path.empty()) data["path"] = plan.data.path;
  Json out = {
      {"apiVersion", kApiVersion},
      {"kind", kPlanKind},
      {"job", {{"name", plan.job_name}, {"namespace", plan.job_namespace}}},
      {"model",
       {{"layers", m.layers},
        {"hidden", m.hidden},
        {"heads", m.heads},
        {"ffnHidden", m.ffn_hidden},
        {"vocab", m.vocab},
        {"paddedVocab", m.padded_vocab()},
        {"seqLen", m.seq_len},
        {"parameters", plan.parameters}}},
      {"batch",
       {{"global", plan.global_batch}, {"micro", c.micro_batch}, {"gradAccum", c.grad_accum}}},
      {"world", plan.world},
      {"nodes", c.nodes},
      {"procsPerNode", c.procs_per_node},
      {"placement", plan.placement},
      {"hardware", plan.hardware},
      {"tp", c.tp},
      {"dp", c.dp},
      {"overlap", {{"subBatches", c.sub_batches}}},
      {"recompute", std::string(to_string(c.recompute))},
      {"offload",
       {{"mode", std::string(to_string(c.offload))},
        {"window", c.window},
        {"gpuUpdateFraction", plan.gpu_update_fraction},
        {"cpuThreads", plan.cpu_threads},
        {"embeddings", placement_json(plan.embeddings)},
        {"layers", layers}}},
      {"precision", std::string(to_string(plan.precision))},
      {"precisionAuto", plan.precision_auto},
      {"device", std::string(to_string(plan.device))},
      {"training",
       {{"steps", t.steps},
        {"learningRate", t.learning_rate},
        {"warmupSteps", t.warmup_steps.value_or(0)},
        {"weightDecay", t.weight_decay},
        {"gradClip", t.grad_clip},
        {"seed", t.seed}}},
      {"data", data},
      {"checkpoint",
       {{"intervalSteps", plan.checkpoint.interval_steps}, {"keep", plan.checkpoint.keep}}},
  };
  // Only where used, so that the plans made before these existed keep their hash.
  if (c.pp > 1) out["pipeline"] = {{"stages", c.pp}, {"layersPerStage", m.layers / c.pp}};
  if (c.virtual_stages > 1) {
    out["pipeline"]["virtualStages"] = c.virtual_stages;
    out["pipeline"]["layersPerVirtualStage"] = m.layers / (c.pp * c.virtual_stages);
  }
  if (c.pp > 1 && c.cut_layer > 0) {  // per-stage TP: each stage's degree, for people to read
    Json degrees = Json::array();
    for (int64_t s = 0; s < c.pp; ++s)
      degrees.push_back(s < cut_stage(c, m.layers) ? c.tp : c.cut_tp);
    out["pipeline"]["stageTensorParallel"] = degrees;
  }
  if (c.distributed_optimizer) out["distributedOptimizer"] = true;
  if (c.cut_layer > 0)
    out["cutpoint"] = {
        {"layer", c.cut_layer}, {"tp", c.cut_tp}, {"dp", plan.world / c.pp / c.cut_tp}};
  return out;
}

std::string compute_plan_hash(const Plan& plan) {
  const std::string canonical = executed_part(plan).dump();
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64
  for (unsigned char ch : canonical) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

Json to_json(const Plan& plan) {
  Json out = executed_part(plan);
  out["predicted"] = to_json(plan.predicted);
  out["peak"] = {{"flopsPerRank", plan.peak_flops}, {"source", plan.peak_source}};
  Json alts = Json::array();
  for (const auto& a : plan.alternatives) {
    Json alt = {{"name", a.name}, {"description", a.description}, {"feasible", a.feasible}};
    if (!a.reason.empty()) alt["reason"] = a.reason;
    if (a.feasible) {
      alt["config"] = to_json(a.config);
      alt["predicted"] = to_json(a.predicted);
    }
    alts.push_back(alt);
  }
  out["alternatives"] = alts;
  out["explanation"] = plan.explanation;
  out["planHash"] = plan.plan_hash;
  return out;
}

// A cutpoint's layer inside the model, its TP degree dividing the ranks that run it (the world,
// or with pipeline stages a stage's tp·dp), and the two TP groups nested (the smaller divides
// the larger), so that the activations re-shard between whole groups; the micro-batch splits
// evenly where the TP group narrows. With pipeline stages the cut is at a stage boundary: the
// stages from there on run at the second TP degree (per-stage TP).
static void check_cutpoint(const Plan& plan) {
  const auto& c = plan.config;
  if (c.cut_layer >= plan.model.layers)
    throw FieldError("plan.cutpoint.layer", std::to_string(c.cut_layer) +
                                                " must be inside the model's " +
                                                std::to_string(plan.model.layers) + " layers");
  const int64_t stage_layers = plan.model.layers / c.pp;
  if (c.pp > 1 && c.cut_layer % stage_layers)
    throw FieldError("plan.cutpoint.layer",
                     std::to_string(c.cut_layer) + " is inside a pipeline stage: with " +
                         std::to_string(c.pp) + " stages of " + std::to_string(stage_layers) +
                         " layers the cut is at a stage boundary (a multiple of " +
                         std::to_string(stage_layers) + ")");
  const int64_t lo = std::min(c.tp, c.cut_tp), hi = std::max(c.tp, c.cut_tp);
  if (c.cut_tp == c.tp)
    throw FieldError("plan.cutpoint.tp", std::to_string(c.cut_tp) +
                                             " is the TP degree before the cut (tp) already");
  const int64_t ranks = plan.world / c.pp;
  if (ranks % c.cut_tp || hi % lo)
    throw FieldError("plan.cutpoint.tp",
                     std::to_string(c.cut_tp) + " must divide the " +
                         (c.pp > 1 ? "ranks of a stage (" : "world (") + std::to_string(ranks) +
                         ") and divide or be a multiple of tp " + std::to_string(c.tp));
  if (c.cut_tp < c.tp && c.micro_batch % (c.tp / c.cut_tp))
    throw FieldError("plan.cutpoint.tp",
                     "the micro-batch (" + std::to_string(c.micro_batch) +
                         ") does not split over the " + std::to_string(c.tp / c.cut_tp) +
                         " TP groups of " + std::to_string(c.cut_tp) + " after the cut");
}

Plan decode_plan(const Json& doc) {
  ObjectReader r(doc, "plan");
  Plan plan;
  if (r.string("apiVersion").value_or("") != kApiVersion)
    throw FieldError("plan.apiVersion", std::string("must be ") + kApiVersion);
  if (r.string("kind").value_or("") != kPlanKind) throw FieldError("plan.kind", "must be Plan");
  ObjectReader job = r.object("job");
  plan.job_name = job.string("name").value_or("");
  plan.job_namespace = job.string("namespace").value_or("default");
  job.finish();
  ObjectReader model = r.object("model");
  // Bounded as a TrainingJob's dims are (ModelLimits), so that the parameter count cannot
  // overflow.
  auto dim = [&](const char* key, int64_t limit) {
    auto v = model.integer(key);
    if (!v || *v <= 0) throw FieldError(model.path_of(key), "required, must be > 0");
    if (*v > limit)
      throw FieldError(model.path_of(key),
                       std::to_string(*v) + " exceeds the limit of " + std::to_string(limit));
    return *v;
  };
  plan.model = {dim("layers", ModelLimits::kLayers),       dim("hidden", ModelLimits::kHidden),
                dim("heads", ModelLimits::kHeads),         dim("ffnHidden", ModelLimits::kFfnHidden),
                dim("vocab", ModelLimits::kVocab),         dim("seqLen", ModelLimits::kSeqLen)};
  model.integer("paddedVocab");
  plan.parameters = model.integer("parameters").value_or(parameter_count(plan.model));
  model.finish();
  plan.config = decode_config(r, plan.global_batch);
  plan.world = r.integer("world").value_or(plan.config.nodes * plan.config.procs_per_node);
  Json placement = r.raw("placement");
  if (placement.is_array())
    for (const auto& p : placement)
      plan.placement.push_back(p.is_string() ? p.get<std::string>() : "");
  plan.hardware = r.string("hardware").value_or("");
  ObjectReader off = r.object("offload");
  plan.config.offload = read_enum_field(off, "mode", OffloadMode::kNone);
  plan.config.window = off.integer("window").value_or(0);
  plan.gpu_update_fraction = off.number("gpuUpdateFraction").value_or(1.0);
  plan.cpu_threads = off.integer("cpuThreads").value_or(1);
  plan.embeddings = decode_placement(off.object("embeddings"));
  Json layers = off.raw("layers");
  for (size_t i = 0; layers.is_array() && i < layers.size(); ++i)
    plan.layers.push_back(decode_placement(
        ObjectReader(layers[i], "plan.offload.layers[" + std::to_string(i) + "]")));
  off.finish();
  if (!plan.layers.empty() && static_cast<int64_t>(plan.layers.size()) != plan.model.layers)
    throw FieldError("plan.offload.layers", "has " + std::to_string(plan.layers.size()) +
                                                " entries for " +
                                                std::to_string(plan.model.layers) + " layers");
  if (plan.layers.empty()) plan.layers.assign(plan.model.layers, LayerPlacement{});
  // gpuUnits: of every pipeline stage's units (its copy of the embeddings', then its layers —
  // with virtual stages its chunks', chunk after chunk); the stages place their layers alike.
  // (The stage and chunk counts were checked above: they divide the layers.)
  const ParallelConfig& pc = plan.config;
  const int64_t L = plan.model.layers;
  const bool divides = pc.pp >= 1 && pc.virtual_stages >= 1 && L % (pc.pp * pc.virtual_stages) == 0;
  const int64_t stage_layers = divides ? L / pc.pp : 0;
  int64_t gpu_units = plan.embeddings.update == UpdateDevice::kGpu ? 1 : 0;
  std::vector<int64_t> first_stage(static_cast<size_t>(stage_layers), -1);  // place → layer
  for (int64_t l = 0; l < L && divides; ++l) {
    const int64_t place = stage_layer_place(pc, L, l);
    int64_t& first = first_stage[static_cast<size_t>(place)];
    if (first < 0) {
      first = l;
      gpu_units += plan.layers[static_cast<size_t>(l)].update == UpdateDevice::kGpu ? 1 : 0;
      continue;
    }
    const auto& like = plan.layers[static_cast<size_t>(first)];
    if (plan.layers[static_cast<size_t>(l)].update != like.update ||
        plan.layers[static_cast<size_t>(l)].resident != like.resident)
      throw FieldError("plan.offload.layers[" + std::to_string(l) + "]",
                       "is placed unlike layer " + std::to_string(first) +
                           " of the first pipeline stage (every stage places its layers alike)");
  }
  plan.config.gpu_units = gpu_units;
  plan.precision = read_enum_field(r, "precision", Precision::kBf16);
  plan.precision_auto = r.boolean("precisionAuto").value_or(false);
  plan.device = read_enum_field(r, "device", DeviceKind::kCuda);
  ObjectReader t = r.object("training");
  plan.training.steps = t.integer("steps").value_or(0);
  plan.training.learning_rate = t.number("learningRate").value_or(plan.training.learning_rate);
  plan.training.warmup_steps = t.integer("warmupSteps").value_or(0);
  plan.training.weight_decay = t.number("weightDecay").value_or(plan.training.weight_decay);
  plan.training.grad_clip = t.number("gradClip").value_or(plan.training.grad_clip);
  plan.training.seed = t.integer("seed").value_or(plan.training.seed);
  plan.training.global_batch_size = plan.global_batch;
  plan.training.micro_batch_size = plan.config.micro_batch;
  plan.training.precision = plan.precision;
  t.finish();
  ObjectReader data = r.object("data");
  auto source = data.string("source").value_or("synthetic");
  auto parsed = parse_enum<DataSource>(source);
  if (!parsed) throw FieldError("plan.data.source", "unknown value \"" + source + "\"");
  plan.data.source = *parsed;
  plan.data.path = data.string("path").value_or("");
  data.finish();
  ObjectReader ckpt = r.object("checkpoint");
  plan.checkpoint.interval_steps = ckpt.integer("intervalSteps").value_or(0);
  plan.checkpoint.keep = ckpt.integer("keep").value_or(3);
  ckpt.finish();
  // Predictions, alternatives and explanation are informational for the worker (outside the
  // hash): the predicted step is read for its metrics and run record, a value that is not a
  // finite number is left 0.
  plan.predicted = decode_prediction(r.raw("predicted"));
  const Json peak = r.raw("peak");
  if (peak.is_object()) {
    const auto flops = peak.find("flopsPerRank");
    if (flops != peak.end() && flops->is_number() && std::isfinite(flops->get<double>()) &&
        flops->get<double>() > 0)
      plan.peak_flops = flops->get<double>();
    const auto source = peak.find("source");
    if (source != peak.end() && source->is_string())
      plan.peak_source = source->get<std::string>().substr(0, 200);
  }
  r.raw("alternatives");
  Json explanation = r.raw("explanation");
  if (explanation.is_array())
    for (const auto& line : explanation)
      if (line.is_string()) plan.explanation.push_back(line.get<std::string>());
  plan.plan_hash = r.string("planHash").value_or("");
  r.finish();
  if (pc.tp * pc.pp * pc.dp != plan.world)
    throw FieldError("plan.world", std::to_string(plan.world) + " is not tp × pp × dp = " +
                                       std::to_string(pc.tp * pc.pp * pc.dp));
  if (plan.model.layers % pc.pp)
    throw FieldError("plan.pipeline.stages", std::to_string(pc.pp) + " does not divide the " +
                                                 std::to_string(plan.model.layers) + " layers");
  if (pc.virtual_stages > 1) {
    const std::string field = "plan.pipeline.virtualStages";
    const int64_t v = pc.virtual_stages;
    if (pc.pp < 2)
      throw FieldError(field,
                       std::to_string(v) + " virtual stages need at least 2 pipeline stages");
    if (plan.model.layers % (pc.pp * v))
      throw FieldError(field, std::to_string(pc.pp) + " stages × " + std::to_string(v) +
                                  " virtual stages do not divide the " +
                                  std::to_string(plan.model.layers) + " layers");
    if (pc.grad_accum % pc.pp)
      throw FieldError(field, "the interleaved schedule runs micro-batches in groups of the " +
                                  std::to_string(pc.pp) + " stages, and plan.batch.gradAccum " +
                                  std::to_string(pc.grad_accum) + " is not a multiple");
    if (pc.cut_layer > 0) throw FieldError(field, "virtual stages with a cutpoint");
  }
  if (pc.cut_layer > 0) check_cutpoint(plan);
  if (!plan.plan_hash.empty() && plan.plan_hash != compute_plan_hash(plan))
    throw FieldError("plan.planHash", "\"" + plan.plan_hash +
                                          "\" does not match the plan's content (edited by hand?)");
  return plan;
}

}  // namespace kt::api

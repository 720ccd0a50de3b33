#include "planner/planner.h"

#include <algorithm>
#include <map>
#include <optional>
#include <sstream>
#include <tuple>

#include "api/error.h"
#include "api/quantity.h"
#include "planner/cost_model.h"
#include "planner/explain.h"
#include "planner/search.h"

namespace kt::planner {
namespace {

using api::OffloadMode;

// Whether virtual stages (the interleaved schedule; Narayanan et al. SC21 §2.2.2) pay for the
// chosen configuration `c` with stages: the same configuration with the other schedule,
// evaluated — a line for the explanation ("" without stages).
std::string virtual_stages_note(const Problem& problem, const ParallelConfig& c,
                                const Evaluation& chosen) {
  if (c.pp < 2 || c.cut_layer > 0) return "";
  auto bubble = [&](int64_t v) {
    return api::fmt("%.1f",
                    100.0 * static_cast<double>(c.pp - 1) / static_cast<double>(c.grad_accum * v)) +
           " %";
  };
  const double seconds = chosen.predicted.step_seconds;
  if (c.virtual_stages > 1) {
    ParallelConfig plain = c;
    plain.virtual_stages = 1;
    const Evaluation e = evaluate(problem, plain);
    return std::to_string(c.virtual_stages) + " virtual stages per pipeline stage cut the bubble " +
           "from " + bubble(1) + " to " + bubble(c.virtual_stages) + " for " +
           std::to_string(c.virtual_stages) +
           "× the transfers between stages: " + api::fmt("%.3f", seconds) + " s/step against " +
           api::fmt("%.3f", e.predicted.step_seconds) + " with 1F1B" +
           (e.fits ? std::string() : " (which does not fit)") + ".";
  }
  if (c.offload == OffloadMode::kWindow)
    return "Virtual stages (the interleaved schedule) were not evaluated: the workers run them "
           "without offload or with offload optimizer only.";
  if (c.grad_accum % c.pp != 0)
    return "Virtual stages (the interleaved schedule) were not evaluated: its micro-batches run "
           "in groups of the " +
           std::to_string(c.pp) + " stages, and " + std::to_string(c.grad_accum) +
           " is not a multiple.";
  std::optional<std::pair<ParallelConfig, Evaluation>> fastest, leanest;
  for (int64_t v = 2; v <= problem.model.layers / c.pp; ++v) {
    if ((problem.model.layers / c.pp) % v) continue;
    ParallelConfig with = c;
    with.virtual_stages = v;
    const Evaluation e = evaluate(problem, with);
    if (e.fits && (!fastest || e.predicted.step_seconds < fastest->second.predicted.step_seconds))
      fastest.emplace(with, e);
    if (!leanest || e.device_ratio < leanest->second.device_ratio) leanest.emplace(with, e);
  }
  if (!leanest) return "";
  if (!fastest)
    return "Virtual stages would cut the bubble from " + bubble(1) + " to " +
           bubble(leanest->first.virtual_stages) +
           " but do not fit: " + std::to_string(leanest->first.virtual_stages) +
           " per stage need " + api::format_bytes(leanest->second.predicted.memory.total()) +
           " per rank (every chunk keeps its micro-batches' activations and a copy of the "
           "embeddings).";
  if (fastest->second.predicted.step_seconds < seconds)  // (the job fixed virtualStages: 1)
    return "Virtual stages would pay: " + std::to_string(fastest->first.virtual_stages) +
           " per stage would cut the bubble from " + bubble(1) + " to " +
           bubble(fastest->first.virtual_stages) + " and take " +
           api::fmt("%.3f", fastest->second.predicted.step_seconds) + " s/step against " +
           api::fmt("%.3f", seconds) + " (spec.parallelism.virtualStages keeps 1F1B).";
  return "Virtual stages do not pay here: " + std::to_string(fastest->first.virtual_stages) +
         " per stage would cut the bubble from " + bubble(1) + " to " +
         bubble(fastest->first.virtual_stages) + " but take " +
         api::fmt("%.3f", fastest->second.predicted.step_seconds) + " s/step against " +
         api::fmt("%.3f", seconds) + " (each micro-batch crosses " +
         std::to_string(fastest->first.virtual_stages) + "× the stage boundaries).";
}

// Nodes that can host ranks of one kind: same hardware figures, same CPU, memory and free slots.
struct NodeGroup {
  Problem problem;
  int64_t slots = 0;  // free GPUs per node (cores on CPU nodes)
  std::vector<std::string> nodes;
};

std::string group_key(const api::HardwareProfile& hw, int64_t cores, double memory, int64_t slots) {
  std::ostringstream key;
  key << hw.name << '|' << hw.peak_bf16_flops << '|' << hw.peak_fp32_flops << '|' << hw.memory_bytes
      << '|' << hw.host_link_bandwidth << '|' << hw.intra_allreduce_busbw << '|'
      << hw.inter_node_bandwidth << '|' << hw.allreduce_latency << '|'
      << hw.cpu_adam_params_per_core << '|' << hw.achieved_fraction << '|'
      << hw.achieved_fraction_bf16 << '|' << hw.has_bf16 << '|' << hw.compute_scale << '|'
      << hw.tp_comm_scale << '|' << hw.dp_comm_scale << '|' << hw.transfer_scale << '|'
      << hw.cpu_optimizer_scale << '|' << hw.memory_bandwidth << '|' << hw.overlap_interference
      << '|' << hw.recompute_rate_ratio << '|' << cores << '|' << memory << '|' << slots;
  return key.str();
}

bool selector_matches(const api::Node& node, const std::map<std::string, std::string>& selector) {
  for (const auto& [k, v] : selector) {
    auto it = node.labels.find(k);
    if (it == node.labels.end() || it->second != v) return false;
  }
  return true;
}

std::vector<NodeGroup> node_groups(const api::TrainingJob& job, const api::Inventory& inv,
                                   const api::ModelDims& model) {
  const auto& res = job.spec.resources;
  std::vector<const api::Node*> usable;
  int64_t matching = 0;
  for (const auto& node : inv.nodes) {
    if (!node.schedulable || !selector_matches(node, res.node_selector)) continue;
    ++matching;
    usable.push_back(&node);
  }
  if (usable.empty()) {
    if (!res.node_selector.empty())
      throw kt::FieldError("spec.resources.nodeSelector", "no schedulable node of the " +
                                                              std::to_string(inv.nodes.size()) +
                                                              " in the cluster matches");
    throw Error("the cluster has no schedulable node");
  }
  const bool any_gpu = std::any_of(usable.begin(), usable.end(),
                                   [](const api::Node* n) { return !n->is_cpu_node(); });
  const bool cpu = res.cpu_only || !any_gpu;
  std::map<std::string, NodeGroup> groups;
  std::map<std::tuple<std::string, double, double, double, double, double, double, double, double,
                      double, double, bool, int64_t, double, int64_t>,
           std::string, std::less<>>
      keys;
  int64_t total_gpus = 0;
  for (const api::Node* node : usable) {
    if (!cpu && node->is_cpu_node()) continue;
    total_gpus += node->gpu_count;
    const int64_t slots = cpu ? node->cpu_cores : node->free_gpus;
    if (slots <= 0) continue;
    std::optional<api::HardwareProfile> cpu_of_gpu_node;  // a GPU node's CPUs, for a CPU job
    if (cpu && !node->is_cpu_node())
      cpu_of_gpu_node =
          api::apply_overrides(api::apply_cpu_features(api::cpu_profile(), node->labels),
                               node->annotations, "nodes." + node->name);
    const api::HardwareProfile& hw = cpu_of_gpu_node ? *cpu_of_gpu_node : node->hardware;
    // The key's text once per distinct node kind: formatting it for each of 10,000 nodes was
    // most of a plan's time.
    const auto exact = std::tie(hw.name, hw.peak_bf16_flops, hw.peak_fp32_flops, hw.memory_bytes,
                                hw.host_link_bandwidth, hw.intra_allreduce_busbw,
                                hw.inter_node_bandwidth, hw.allreduce_latency,
                                hw.cpu_adam_params_per_core, hw.achieved_fraction,
                                hw.achieved_fraction_bf16, hw.has_bf16, node->cpu_cores,
                                node->memory_bytes, slots);
    auto known = keys.find(exact);
    if (known == keys.end())
      known = keys.emplace(exact, group_key(hw, node->cpu_cores, node->memory_bytes, slots)).first;
    const std::string& key = known->second;
    NodeGroup& g = groups[key];
    if (g.nodes.empty()) {
      g.slots = slots;
      g.problem.model = model;
      g.problem.global_batch = job.spec.training.global_batch_size;
      g.problem.cpu_device = cpu;
      // Unset: bf16 on GPUs, and on CPUs known to have bf16 matmuls (AMX-BF16, AVX512-BF16).
      g.problem.precision = job.spec.training.precision.value_or(
          cpu && !hw.has_bf16 ? api::Precision::kFp32 : api::Precision::kBf16);
      g.problem.hw = hw;
      g.problem.cpu_cores_per_node = node->cpu_cores;
      g.problem.host_memory_per_node = node->memory_bytes;
      g.problem.memory_budget = job.spec.parallelism.gpu_memory_budget_bytes.value_or(0);
    }
    g.nodes.push_back(node->name);
  }
  if (groups.empty())
    throw Error("no node has free GPUs (all " + std::to_string(total_gpus) +
                " GPUs of the matching nodes are requested by running pods)");
  std::vector<NodeGroup> out;
  for (auto& [key, g] : groups) {
    std::sort(g.nodes.begin(), g.nodes.end());
    // CPUs with bf16 and no precision asked for: both precisions are candidates, and the faster
    // prediction wins (bf16 speeds up the matmuls only, which small models hardly have).
    const bool both = g.problem.cpu_device && !job.spec.training.precision && g.problem.hw.has_bf16;
    if (both) {
      NodeGroup fp32 = g;
      fp32.problem.precision = api::Precision::kFp32;
      out.push_back(std::move(fp32));
    }
    out.push_back(std::move(g));
  }
  return out;
}

// The space the user's hints allow (explicit values are obeyed; the rest is auto).
SearchSpace space_from_hints(const api::TrainingJob& job) {
  SearchSpace s;
  const auto& p = job.spec.parallelism;
  const auto& r = job.spec.resources;
  s.min_nodes = r.min_nodes.value_or(1);
  if (p.tensor_parallel) s.tp = {*p.tensor_parallel};
  if (p.data_parallel) s.dp = {*p.data_parallel};
  if (p.pipeline_parallel) s.pp = {*p.pipeline_parallel};
  if (p.virtual_stages) s.virtual_stages = {*p.virtual_stages};
  if (p.distributed_optimizer) s.distributed_optimizer = {*p.distributed_optimizer};
  // A forced cutpoint layer or degree asks for plans with a cutpoint only.
  s.cutpoints_only = p.cutpoint_layer.has_value() || p.cutpoint_tensor_parallel.has_value();
  s.cutpoints = s.cutpoints_only || p.cutpoint.value_or(false);
  s.cut_layer = p.cutpoint_layer.value_or(0);
  s.cut_tp = p.cutpoint_tensor_parallel.value_or(0);
  if (r.gpus_per_node) s.procs_per_node = {*r.gpus_per_node};
  if (job.spec.training.micro_batch_size) s.micro_batch = {*job.spec.training.micro_batch_size};
  if (p.overlap) s.sub_batches = {*p.overlap ? int64_t{2} : int64_t{1}};
  if (p.recompute) s.recompute = {*p.recompute};
  if (p.offload) {
    s.offload = {*p.offload};
  } else if (p.offload_window) {
    s.offload = {OffloadMode::kWindow};
  } else if (p.gpu_update_fraction && *p.gpu_update_fraction < 1.0) {
    s.offload = {OffloadMode::kOptimizer, OffloadMode::kWindow};
  }
  if (p.gpu_update_fraction && !(p.offload && *p.offload == OffloadMode::kNone))
    s.gpu_update_fraction = p.gpu_update_fraction;
  s.window = p.offload_window;
  return s;
}

// Structural reasons why a forced hint admits no configuration at all on a group.
void check_hints(const api::TrainingJob& job, const NodeGroup& g, int64_t max_nodes) {
  const auto& p = job.spec.parallelism;
  const auto& m = g.problem.model;
  const std::string slot = g.problem.cpu_device ? "cores" : "free GPUs";
  const int64_t procs = job.spec.resources.gpus_per_node.value_or(g.slots);
  if (const auto min_nodes = job.spec.resources.min_nodes; min_nodes && *min_nodes > max_nodes)
    throw kt::FieldError("spec.resources.minNodes",
                         "is " + std::to_string(*min_nodes) + " but " +
                             std::to_string(max_nodes) + " schedulable node(s) of kind " +
                             g.problem.hw.name + " with " + slot +
                             " to spare can take the job now (nodes that are cordoned or not "
                             "Ready do not count)");
  if (job.spec.resources.gpus_per_node && *job.spec.resources.gpus_per_node > g.slots)
    throw kt::FieldError("spec.resources.gpusPerNode",
                         std::to_string(*job.spec.resources.gpus_per_node) +
                             " but the nodes have " + std::to_string(g.slots) + " " + slot);
  if (p.tensor_parallel) {
    const int64_t t = *p.tensor_parallel;
    if (procs % t)
      throw kt::FieldError("spec.parallelism.tensorParallel",
                           std::to_string(t) + " does not divide the " + std::to_string(procs) +
                               " ranks per node (TP groups stay inside a node)");
    if (m.padded_vocab() % t)
      throw kt::FieldError("spec.parallelism.tensorParallel",
                           std::to_string(t) + " does not divide the padded vocabulary " +
                               std::to_string(m.padded_vocab()));
  }
  if (p.data_parallel) {
    const int64_t d = *p.data_parallel;
    const int64_t t = p.tensor_parallel.value_or(1);
    if (job.spec.training.global_batch_size % d)
      throw kt::FieldError("spec.parallelism.dataParallel",
                           std::to_string(d) + " does not divide globalBatchSize " +
                               std::to_string(job.spec.training.global_batch_size));
    if (p.tensor_parallel && (d * t) % procs != 0 && d * t > procs)
      throw kt::FieldError("spec.parallelism.dataParallel",
                           "tensorParallel × dataParallel = " + std::to_string(d * t) +
                               " is not a whole number of nodes of " + std::to_string(procs) +
                               " ranks");
    if (p.tensor_parallel && d * t > procs * max_nodes)
      throw kt::FieldError("spec.parallelism.dataParallel",
                           "tensorParallel × dataParallel = " + std::to_string(d * t) +
                               " ranks but at most " + std::to_string(procs * max_nodes) +
                               " are available");
  }
}

std::string hints_summary(const api::TrainingJob& job) {
  const auto& p = job.spec.parallelism;
  std::vector<std::string> parts;
  if (p.tensor_parallel) parts.push_back("tensorParallel=" + std::to_string(*p.tensor_parallel));
  if (p.data_parallel) parts.push_back("dataParallel=" + std::to_string(*p.data_parallel));
  if (p.pipeline_parallel)
    parts.push_back("pipelineParallel=" + std::to_string(*p.pipeline_parallel));
  if (p.virtual_stages) parts.push_back("virtualStages=" + std::to_string(*p.virtual_stages));
  if (p.distributed_optimizer)
    parts.push_back(std::string("distributedOptimizer=") +
                    (*p.distributed_optimizer ? "on" : "off"));
  if (p.cutpoint) parts.push_back(std::string("cutpoint=") + (*p.cutpoint ? "on" : "off"));
  if (p.cutpoint_layer) parts.push_back("cutpointLayer=" + std::to_string(*p.cutpoint_layer));
  if (p.cutpoint_tensor_parallel)
    parts.push_back("cutpointTensorParallel=" + std::to_string(*p.cutpoint_tensor_parallel));
  if (p.overlap) parts.push_back(std::string("overlap=") + (*p.overlap ? "on" : "off"));
  if (p.recompute) parts.push_back("recompute=" + std::string(api::to_string(*p.recompute)));
  if (p.offload) parts.push_back("offload=" + std::string(api::to_string(*p.offload)));
  if (p.offload_window) parts.push_back("offloadWindow=" + std::to_string(*p.offload_window));
  if (p.gpu_update_fraction)
    parts.push_back("gpuUpdateFraction=" + api::Json(*p.gpu_update_fraction).dump());
  if (p.gpu_memory_budget_bytes)
    parts.push_back("gpuMemoryBudget=" + api::format_bytes(*p.gpu_memory_budget_bytes));
  if (job.spec.training.micro_batch_size)
    parts.push_back("microBatchSize=" + std::to_string(*job.spec.training.micro_batch_size));
  if (job.spec.resources.gpus_per_node)
    parts.push_back("gpusPerNode=" + std::to_string(*job.spec.resources.gpus_per_node));
  std::string out;
  for (const auto& s : parts) out += (out.empty() ? "" : ", ") + s;
  return out;
}

struct Baseline {
  const char* name;
  const char* description;
};

std::vector<api::Alternative> baselines(const NodeGroup& g, int64_t max_nodes,
                                        const SearchSpace& resources) {
  const int64_t procs = resources.procs_per_node.empty() ? g.slots : resources.procs_per_node[0];
  std::vector<api::Alternative> out;
  // `wider`: the space tried when nothing fits in `space` (Megatron adds pipeline stages).
  auto run = [&](const char* name, const char* description, SearchSpace space,
                 std::optional<SearchSpace> wider = std::nullopt) {
    space.procs_per_node = resources.procs_per_node;
    api::Alternative alt;
    alt.name = name;
    alt.description = description;
    SearchResult r = search(g.problem, max_nodes, g.slots, space);
    if (!r.best && wider) {
      wider->procs_per_node = resources.procs_per_node;
      SearchResult w = search(g.problem, max_nodes, g.slots, *wider);
      if (w.best || !r.nearest_miss) r = std::move(w);
    }
    if (r.best) {
      alt.feasible = true;
      alt.config = r.best->config;
      alt.predicted = r.best->eval.predicted;
    } else if (r.nearest_miss) {
      alt.reason = describe_miss(*r.nearest_miss, g.problem.cpu_device);
    } else {
      alt.reason = r.empty_reason.empty() ? "no valid configuration" : r.empty_reason;
    }
    out.push_back(std::move(alt));
  };
  const auto& m = g.problem.model;
  {
    SearchSpace s;
    s.megatron_tp = true;
    s.sub_batches = {1};
    s.recompute = {Recompute::kNone, Recompute::kFull};
    s.offload = {OffloadMode::kNone};
    // Where that does not fit, as Megatron-LM trains GPT-3 175B: pipeline stages across nodes
    // and the distributed optimizer (Narayanan et al. SC21, Table 1; --use-distributed-optimizer).
    SearchSpace pipelined = s;
    pipelined.pp.clear();
    pipelined.distributed_optimizer = {true};
    run("megatron",
        "Megatron-LM: TP = the largest degree inside a node that divides the heads, no overlap, "
        "full recompute only if needed, no offload; where that does not fit, pipeline stages "
        "across nodes (1F1B) and the distributed optimizer",
        s, pipelined);
    // Say why TP had to be smaller than the node when the heads forbid it.
    int64_t t = procs;
    while (t > 1 && (m.heads % t || m.ffn_hidden % t || m.padded_vocab() % t || procs % t)) --t;
    if (t < procs && out.back().reason.empty())
      out.back().reason = "TP " + std::to_string(procs) + " does not divide the " +
                          std::to_string(m.heads) + " heads; uses TP " + std::to_string(t);
  }
  {
    SearchSpace s;
    s.tp = {1};
    s.sub_batches = {1};
    s.recompute = {Recompute::kNone, Recompute::kFull};
    s.offload = {OffloadMode::kOptimizer};
    s.gpu_update_fraction = 0.0;
    run("zero-offload",
        "ZeRO-Offload: data parallel, all optimizer state and AdamW on the CPU, fp16 params and "
        "grads on the GPU",
        s);
  }
  {
    SearchSpace s;
    s.tp = {1};
    s.sub_batches = {1};
    s.recompute = {Recompute::kNone, Recompute::kFull};
    s.offload = {OffloadMode::kWindow};
    run("stronghold",
        "STRONGHOLD: a window of resident layers, others' params on the CPU with CPU AdamW", s);
  }
  {
    SearchSpace s;
    for (int64_t t = 2; t <= procs; ++t) s.tp.push_back(t);
    s.sub_batches = {2};
    s.recompute = {Recompute::kCommAware};
    s.offload = {OffloadMode::kNone};
    if (s.tp.empty()) {
      api::Alternative alt{
          "oases", "Oases: overlapped TP with comm-aware recomputation, no offload",
          false,   "needs at least 2 ranks per node for tensor parallelism",
          {},      {}};
      out.push_back(alt);
    } else {
      run("oases", "Oases: overlapped TP (2 sub-batches) with comm-aware recomputation, no offload",
          s);
    }
  }
  return out;
}

// The space widened to pipelines (every stage count that divides the layers), the
// distributed optimizer and cutpoints, where the job left them to the planner.
SearchSpace with_pipelines(const api::TrainingJob& job, SearchSpace space) {
  const auto& p = job.spec.parallelism;
  if (!p.pipeline_parallel) space.pp.clear();
  if (!p.distributed_optimizer) space.distributed_optimizer = {false, true};
  if (!p.cutpoint) space.cutpoints = true;
  return space;
}

}  // namespace

api::Plan best_plan(const api::TrainingJob& job, const api::Inventory& inventory) {
  const api::ModelDims model = api::resolve_model(job.spec.model);
  std::vector<NodeGroup> groups = node_groups(job, inventory, model);
  SearchSpace space = space_from_hints(job);

  const NodeGroup* chosen_group = nullptr;
  std::optional<Candidate> best, nearest, fastest_any;
  std::map<api::Precision, double> best_by_precision;  // tokens/s, for the explanation
  std::string structural_error;
  // Pipelines, the distributed optimizer and the cutpoint form a second tier, searched only where
  // nothing without them fits in memory (or, below, where a baseline with them beats the first
  // tier's best): both workers run them, but a plan without them is preferred (a pipeline only
  // adds time in the cost model: its bubble and its sends; docs/PLANNER.md §15). A hint no
  // shape admits keeps its own error.
  const bool can_widen = !job.spec.parallelism.pipeline_parallel ||
                         !job.spec.parallelism.distributed_optimizer ||
                         !job.spec.parallelism.cutpoint;
  bool widened = false;
  for (int tier = 0; tier < (can_widen ? 2 : 1) && !best; ++tier) {
    if (tier == 1) {
      if (!nearest) break;
      space = with_pipelines(job, space);
      widened = true;
      nearest.reset();
      structural_error.clear();
      best_by_precision.clear();
      chosen_group = nullptr;
    }
    for (const NodeGroup& g : groups) {
      const int64_t max_nodes = std::min<int64_t>(static_cast<int64_t>(g.nodes.size()),
                                                  job.spec.resources.max_nodes.value_or(INT64_MAX));
      try {
        check_hints(job, g, max_nodes);
      } catch (const kt::FieldError& e) {
        if (groups.size() == 1) throw;
        structural_error = e.what();
        continue;
      }
      SearchResult r = search(g.problem, max_nodes, g.slots, space);
      if (structural_error.empty() && !r.best && !r.nearest_miss) structural_error = r.empty_reason;
      if (r.best) {
        double& tps = best_by_precision[g.problem.precision];
        tps = std::max(tps, r.best->eval.predicted.tokens_per_second);
      }
      if (r.best && (!best || r.best->eval.predicted.tokens_per_second >
                                  best->eval.predicted.tokens_per_second)) {
        best = r.best;
        chosen_group = &g;
      }
      if (r.nearest_miss &&
          (!nearest ||
           std::max(r.nearest_miss->eval.device_ratio, r.nearest_miss->eval.host_ratio) <
               std::max(nearest->eval.device_ratio, nearest->eval.host_ratio))) {
        nearest = r.nearest_miss;
        if (!best) chosen_group = &g;
      }
    }
  }
  const std::string hints = hints_summary(job);
  if (!best) {
    const std::string with = hints.empty() ? "" : " with " + hints;
    if (nearest)
      throw Error("no plan fits" + with + ": " +
                  describe_miss(*nearest, chosen_group && chosen_group->problem.cpu_device));
    throw Error("no valid configuration" + with + ": " +
                (structural_error.empty() ? "the search space is empty" : structural_error));
  }
  const NodeGroup& g = *chosen_group;
  const int64_t max_nodes = std::min<int64_t>(static_cast<int64_t>(g.nodes.size()),
                                              job.spec.resources.max_nodes.value_or(INT64_MAX));

  // The baselines, in the same cost model. The megatron one may use the distributed optimizer
  // (and stages), which the first tier leaves out: where it beats that tier's best, the widened
  // space is searched too, so that the chosen plan is never slower than a baseline.
  SearchSpace resources;
  resources.procs_per_node = space.procs_per_node;
  std::vector<api::Alternative> alternatives = baselines(g, max_nodes, resources);
  // Only where the job left the shape to the planner (the baselines pick their own), and with
  // what the baseline used: the distributed optimizer, stages.
  std::string widened_for;
  const auto& asked = job.spec.parallelism;
  if (!widened && !asked.tensor_parallel && !asked.data_parallel && !asked.pipeline_parallel) {
    const api::Alternative* beat = nullptr;
    for (const api::Alternative& a : alternatives)
      if (!beat && a.feasible && a.predicted.step_seconds > 0 &&
          a.predicted.step_seconds < best->eval.predicted.step_seconds * (1 - 1e-9) &&
          (a.config.distributed_optimizer || a.config.pp > 1))
        beat = &a;
    if (beat && !asked.distributed_optimizer && beat->config.distributed_optimizer)
      space.distributed_optimizer = {false, true};
    else if (beat && beat->config.pp <= 1)
      beat = nullptr;                                   // (its sharding was ruled out by the job)
    if (beat && beat->config.pp > 1) space.pp.clear();  // every stage count
    if (beat) {
      if (SearchResult r = search(g.problem, max_nodes, g.slots, space);
          r.best && r.best->eval.predicted.step_seconds < best->eval.predicted.step_seconds) {
        best = r.best;
        widened = true;
        widened_for = beat->name;
      }
    }
  }

  // What memory costs: the fastest plan if every configuration fit.
  Problem unlimited = g.problem;
  unlimited.ignore_memory = true;
  fastest_any = search(unlimited, max_nodes, g.slots, space).best;

  // The runner-up: the fastest plan of a different kind (TP, overlap, recompute, offload).
  SearchSpace other = space;
  other.exclude_kind = kind_of(best->config);
  SearchResult runner = search(g.problem, max_nodes, g.slots, other);

  api::Plan plan;
  const auto& c = best->config;
  plan.job_name = job.metadata.name;
  plan.job_namespace = job.metadata.namespace_;
  plan.model = model;
  plan.parameters = api::parameter_count(model);
  plan.global_batch = job.spec.training.global_batch_size;
  plan.config = c;
  plan.world = c.nodes * c.procs_per_node;
  plan.placement.assign(g.nodes.begin(), g.nodes.begin() + c.nodes);
  plan.hardware = g.problem.hw.name;
  plan.precision = g.problem.precision;
  plan.device = g.problem.cpu_device ? api::DeviceKind::kCpu : api::DeviceKind::kCuda;
  // Offload places the units of every pipeline stage alike: its copy of the embeddings', then
  // its layers, the first gpuUnits of them on the device.
  api::ModelDims stage_model = model;
  stage_model.layers = model.layers / c.pp;
  const int64_t gpu_units = c.offload == OffloadMode::kNone ? stage_model.layers + 1 : c.gpu_units;
  plan.gpu_update_fraction = gpu_update_fraction(stage_model, c.tp, gpu_units);
  plan.embeddings = {true, gpu_units >= 1 ? api::UpdateDevice::kGpu : api::UpdateDevice::kCpu};
  for (int64_t l = 0; l < model.layers; ++l) {
    const bool gpu = api::stage_layer_place(c, model.layers, l) + 1 < gpu_units;
    plan.layers.push_back({gpu || c.offload != OffloadMode::kWindow,
                           gpu ? api::UpdateDevice::kGpu : api::UpdateDevice::kCpu});
  }
  plan.cpu_threads =
      std::max<int64_t>(1, g.problem.cpu_cores_per_node / std::max<int64_t>(1, c.procs_per_node));
  const auto& hw = g.problem.hw;
  plan.peak_flops =
      (plan.precision == api::Precision::kBf16 ? hw.peak_bf16_flops : hw.peak_fp32_flops) *
      (g.problem.cpu_device ? static_cast<double>(plan.cpu_threads) : 1.0);
  plan.peak_source = hw.measured ? hw.source : "built-in " + hw.name + " profile";
  plan.training = job.spec.training;
  plan.training.micro_batch_size = c.micro_batch;
  plan.training.precision = plan.precision;
  if (!plan.training.warmup_steps)
    plan.training.warmup_steps = std::min<int64_t>(plan.training.steps / 10, 2000);
  plan.data = job.spec.data;
  plan.checkpoint = job.spec.checkpoint;
  plan.predicted = best->eval.predicted;
  plan.alternatives = std::move(alternatives);
  plan.explanation = explain(*best, g.problem.hw.name, g.problem.cpu_device, fastest_any,
                             runner.best, plan.alternatives);
  plan.precision_auto = !job.spec.training.precision.has_value();
  if (const std::string line = virtual_stages_note(g.problem, c, best->eval); !line.empty())
    plan.explanation.push_back(line);
  if (g.problem.cpu_device) {
    if (g.problem.hw.has_bf16 && plan.precision_auto && best_by_precision.size() == 2) {
      const bool bf16 = plan.precision == api::Precision::kBf16;
      const api::Precision other = bf16 ? api::Precision::kFp32 : api::Precision::kBf16;
      plan.explanation.push_back(
          std::string(bf16 ? "bf16" : "fp32") + " on the CPU: predicted " +
          api::fmt("%.0f", best_by_precision[plan.precision]) + " tokens/s against " +
          api::fmt("%.0f", best_by_precision[other]) + " in " + (bf16 ? "fp32" : "bf16") +
          " (these CPUs have bf16 matmuls — AMX-BF16 or AVX512-BF16, from their Node Feature "
          "Discovery labels or a measured profile; bf16 keeps fp32 master weights and AdamW). "
          "spec.training.precision decides instead.");
    } else if (plan.precision == api::Precision::kBf16 && !g.problem.hw.has_bf16)
      plan.explanation.push_back(
          "bf16 on the CPU as asked, but nothing says these CPUs have AMX-BF16 or AVX512-BF16 "
          "(no feature.node.kubernetes.io/cpu-cpuid label, no measured profile): the worker "
          "refuses bf16 on a CPU without them.");
  } else if (!g.problem.hw.has_bf16 && plan.precision == api::Precision::kBf16) {
    plan.explanation.push_back(g.problem.hw.name +
                               " has no bf16 tensor cores: predicted with its fp16 peak; the "
                               "worker's bf16 path needs Ampere (sm_80) or newer.");
  }
  if (widened && (c.pp > 1 || c.distributed_optimizer) && c.cut_layer == 0) {
    const std::string refused = api::not_yet_executable(plan);
    plan.explanation.push_back(
        (widened_for.empty()
             ? std::string("No plan without pipeline stages, a distributed optimizer or a "
                           "cutpoint fits these nodes: ")
             : "The " + widened_for +
                   " baseline beat every plan without pipeline stages or a distributed "
                   "optimizer, so they were searched too: ") +
        std::string(
            c.pp > 1 && c.virtual_stages > 1
                ? std::to_string(c.pp) + " stages of " + std::to_string(c.virtual_stages) +
                      " interleaved chunks of " +
                      std::to_string(model.layers / (c.pp * c.virtual_stages)) +
                      " layers (virtual stages, bubble " +
                      api::fmt("%.1f", 100.0 * (c.pp - 1) /
                                           static_cast<double>(c.grad_accum * c.virtual_stages)) +
                      " % against 1F1B's " + api::fmt("%.1f", 100.0 * (c.pp - 1) / c.grad_accum) +
                      " %, each micro-batch crossing " + std::to_string(c.virtual_stages) +
                      "× the stage boundaries)"
            : c.pp > 1 ? std::to_string(c.pp) + " stages of " +
                             std::to_string(model.layers / c.pp) + " layers (1F1B, bubble " +
                             api::fmt("%.1f", 100.0 * (c.pp - 1) / c.grad_accum) + " %)"
                       : std::string("no pipeline")) +
        (c.distributed_optimizer ? ", optimizer state sharded over the " + std::to_string(c.dp) +
                                       " data-parallel ranks (ZeRO-1)"
                                 : std::string()) +
        (refused.empty()
             ? std::string(". The ") + (plan.device == api::DeviceKind::kCpu ? "CPU" : "CUDA") +
                   " workers run it (docs/WORKER.md)."
             : ". The workers of this version refuse such a plan: " + refused + "."));
  }
  if (c.cut_layer > 0 && c.pp > 1) {  // per-stage TP
    const int64_t s = api::cut_stage(c, model.layers), d2 = c.tp * c.dp / c.cut_tp;
    const std::string refused = api::not_yet_executable(plan);
    plan.explanation.push_back(
        "Per-stage TP, " + std::to_string(c.pp) + " stages of " +
        std::to_string(model.layers / c.pp) + " layers (1F1B, bubble " +
        api::fmt("%.1f", 100.0 * (c.pp - 1) / c.grad_accum) + " %): stages 0-" +
        std::to_string(s - 1) + " (layers 0-" + std::to_string(c.cut_layer - 1) + ") at TP " +
        std::to_string(c.tp) + " × DP " + std::to_string(c.dp) + ", stages " + std::to_string(s) +
        "-" + std::to_string(c.pp - 1) + " (layers " + std::to_string(c.cut_layer) + "-" +
        std::to_string(model.layers - 1) + ") at TP " + std::to_string(c.cut_tp) + " × DP " +
        std::to_string(d2) + " (" + std::to_string(c.micro_batch * c.cut_tp / c.tp) +
        " sequences per micro-batch); stage " + std::to_string(s) +
        " re-shards the activations it receives, and the first and the last stage sum the tied "
        "embedding's gradients over their " +
        std::to_string(2 * c.tp * c.dp) + " ranks in both layouts" +
        (c.distributed_optimizer
             ? "; each stage shards its optimizer state over its data-parallel ranks (ZeRO-1)"
             : "") +
        (widened ? " (no plan without pipeline stages, a distributed optimizer or a cutpoint fits)"
                 : "") +
        (refused.empty() ? std::string(".")
                         : ". The workers of this version refuse it: " + refused + "."));
  } else if (c.cut_layer > 0) {
    const int64_t d2 = plan.world / c.cut_tp;
    plan.explanation.push_back(
        "Oases' cutpoint: layers 0-" + std::to_string(c.cut_layer - 1) + " at TP " +
        std::to_string(c.tp) + " × DP " + std::to_string(c.dp) + ", layers " +
        std::to_string(c.cut_layer) + "-" + std::to_string(model.layers - 1) + " at TP " +
        std::to_string(c.cut_tp) + " × DP " + std::to_string(d2) + " on the same ranks (" +
        std::to_string(c.micro_batch * c.cut_tp / c.tp) +
        " sequences per micro-batch after the cut); the activations re-shard at the cut and the "
        "tied embedding's gradients are summed over all " +
        std::to_string(plan.world) + " ranks in both layouts" +
        (c.distributed_optimizer
             ? "; each segment shards its optimizer state over its data-parallel ranks (ZeRO-1)"
             : "") +
        (widened ? " (no plan without pipeline stages, a distributed optimizer or a cutpoint fits)"
                 : "") +
        ".");
  }
  if (!hints.empty()) plan.explanation.push_back("Honoured from spec.parallelism: " + hints + ".");
  plan.plan_hash = api::compute_plan_hash(plan);
  return plan;
}

}  // namespace kt::planner

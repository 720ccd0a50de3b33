#include "planner/explain.h"

#include <cmath>
#include <cstdio>

#include "api/quantity.h"

namespace kt::planner {
namespace {

using api::fmt;

std::string seconds(double s) {
  if (s < 1e-3) return fmt("%.0f µs", s * 1e6);
  if (s < 1) return fmt("%.1f ms", s * 1e3);
  return fmt("%.2f s", s);
}

}  // namespace

std::string describe_config(const ParallelConfig& c) {
  std::string out =
      "TP " + std::to_string(c.tp) + (c.pp > 1 ? " × PP " + std::to_string(c.pp) : std::string()) +
      " × DP " + std::to_string(c.dp) +
      (c.cut_layer > 0 ? " then TP " + std::to_string(c.cut_tp) + " from layer " +
                             std::to_string(c.cut_layer) + " (cutpoint)"
                       : std::string()) +
      (c.distributed_optimizer ? " (distributed optimizer)" : std::string()) + ", micro-batch " +
      std::to_string(c.micro_batch) + " × " + std::to_string(c.grad_accum) +
      " accumulation, overlap " + (c.sub_batches == 2 ? "on" : "off") + ", recompute " +
      std::string(api::to_string(c.recompute)) + ", offload " +
      std::string(api::to_string(c.offload));
  if (c.offload == api::OffloadMode::kWindow) out += " (W=" + std::to_string(c.window) + ")";
  return out;
}

std::string describe_miss(const Candidate& miss, bool cpu_device) {
  const auto& p = miss.eval.predicted;
  const std::string rank = cpu_device ? "rank" : "GPU";
  if (miss.eval.device_ratio >= miss.eval.host_ratio || cpu_device)
    return "needs " + api::format_bytes(p.memory.total()) + " per " + rank +
           " with the best plan (" + describe_config(miss.config) + "); " +
           (cpu_device ? "ranks have " : "nodes have ") +
           api::format_bytes(p.device_capacity_bytes) + (cpu_device ? " each" : "");
  return "needs " + api::format_bytes(p.host_bytes_per_node) +
         " of host memory per node for offloaded state with the best plan (" +
         describe_config(miss.config) + "); nodes have " +
         api::format_bytes(p.host_capacity_bytes) + " usable";
}

std::vector<std::string> explain(const Candidate& chosen, const std::string& hardware,
                                 bool cpu_device,
                                 const std::optional<Candidate>& fastest_any_memory,
                                 const std::optional<Candidate>& runner_up,
                                 const std::vector<api::Alternative>& alternatives) {
  std::vector<std::string> lines;
  const auto& c = chosen.config;
  const auto& p = chosen.eval.predicted;
  const std::string rank = cpu_device ? "rank" : "GPU";
  lines.push_back("Chosen: " + std::to_string(c.nodes) + " node(s) × " +
                  std::to_string(c.procs_per_node) + " " + hardware + " " + rank + "(s); " +
                  describe_config(c) + ".");

  // What binds: memory, when the fastest configuration regardless of memory does not fit.
  if (fastest_any_memory &&
      (fastest_any_memory->eval.device_ratio > 1 || fastest_any_memory->eval.host_ratio > 1) &&
      fastest_any_memory->eval.predicted.step_seconds < p.step_seconds * 0.98) {
    const auto& f = *fastest_any_memory;
    lines.push_back("Memory binds: the fastest configuration (" + describe_config(f.config) + ", " +
                    fmt("%.0f", f.eval.predicted.tokens_per_second) + " tokens/s) needs " +
                    api::format_bytes(f.eval.predicted.memory.total()) + " per " + rank + " but " +
                    api::format_bytes(f.eval.predicted.device_capacity_bytes) + " is available" +
                    (f.eval.host_ratio > 1 ? " (and more host memory than the nodes have)" : "") +
                    ".");
  } else {
    const double step = p.step_seconds;
    lines.push_back(
        "Time binds: the plan uses " + api::format_bytes(p.memory.total()) + " of " +
        api::format_bytes(p.device_capacity_bytes) + " per " + rank + "; its " + seconds(step) +
        " step is " + fmt("%.0f%%", 100 * p.time.compute / step) + " compute, " +
        fmt("%.0f%%", 100 * p.time.tp_comm_exposed / step) + " exposed TP all-reduce, " +
        fmt("%.0f%%", 100 * p.time.dp_comm_exposed / step) + " exposed DP all-reduce, " +
        fmt("%.0f%%", 100 * (p.time.transfer_exposed + p.time.optimizer_cpu_exposed) / step) +
        " exposed offload, " + fmt("%.0f%%", 100 * p.time.optimizer_gpu / step) +
        " device optimizer.");
  }
  if (c.sub_batches == 2 && p.time.tp_comm_total > 0)
    lines.push_back("Overlap hides " +
                    fmt("%.0f%%", 100 * (1 - p.time.tp_comm_exposed / p.time.tp_comm_total)) +
                    " of " + seconds(p.time.tp_comm_total) + " of TP all-reduce per step.");

  if (runner_up) {
    const auto& r = runner_up->eval.predicted;
    struct Delta {
      const char* what;
      double chosen, other;
    };
    const Delta deltas[] = {
        {"compute (incl. recompute)", p.time.compute, r.time.compute},
        {"exposed TP all-reduce", p.time.tp_comm_exposed, r.time.tp_comm_exposed},
        {"exposed DP all-reduce", p.time.dp_comm_exposed, r.time.dp_comm_exposed},
        {"exposed host-device transfer", p.time.transfer_exposed, r.time.transfer_exposed},
        {"exposed CPU optimizer", p.time.optimizer_cpu_exposed, r.time.optimizer_cpu_exposed},
        {"device optimizer", p.time.optimizer_gpu, r.time.optimizer_gpu},
    };
    const Delta* worst = &deltas[0];
    for (const auto& d : deltas)
      if (d.other - d.chosen > worst->other - worst->chosen) worst = &d;
    if (r.tokens_per_second >= p.tokens_per_second * 0.999) {
      lines.push_back("Runner-up: " + describe_config(runner_up->config) + " ties within 0.1% (" +
                      fmt("%.0f", r.tokens_per_second) +
                      " tokens/s); the simpler plan is preferred.");
    } else
      lines.push_back("Runner-up: " + describe_config(runner_up->config) + " at " +
                      fmt("%.0f", r.tokens_per_second) + " tokens/s (" +
                      fmt("%.2f×", r.tokens_per_second / p.tokens_per_second) +
                      "); it loses mostly on " + worst->what + ": " + seconds(worst->other) +
                      " vs " + seconds(worst->chosen) + " per step.");
  } else {
    lines.push_back("Runner-up: none; no other kind of plan fits.");
  }
  std::string baselines;
  for (const auto& a : alternatives) {
    if (!baselines.empty()) baselines += "; ";
    if (a.feasible)
      baselines += a.name + " " + fmt("%.2f×", p.tokens_per_second / a.predicted.tokens_per_second);
    else
      baselines += a.name + " infeasible";
  }
  if (!baselines.empty()) lines.push_back("Speed-up over the baselines: " + baselines + ".");
  return lines;
}

}  // namespace kt::planner

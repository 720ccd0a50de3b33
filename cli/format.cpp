#include "cli/format.h"

#include <cstdio>
#include <sstream>

#include "api/quantity.h"

namespace kt::cli {
namespace {

using api::fmt;

std::string pad(const std::string& s, size_t width) {
  // Width in code points, so that "×" and "µ" do not break the columns.
  size_t cps = 0;
  for (unsigned char ch : s) cps += (ch & 0xC0) != 0x80;
  return cps >= width ? s + " " : s + std::string(width - cps, ' ');
}

std::string gib(double bytes) {
  return fmt("%.1f", bytes / api::kGiB);
}

std::string grouped(double v) {
  const long long n = static_cast<long long>(v + 0.5);
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string config_cell(const api::ParallelConfig& c) {
  std::string s =
      std::to_string(c.nodes) + "×" + std::to_string(c.procs_per_node) + " tp" +
      std::to_string(c.tp) + (c.pp > 1 ? " pp" + std::to_string(c.pp) : "") +
      (c.virtual_stages > 1 ? "×v" + std::to_string(c.virtual_stages) : "") + " dp" +
      std::to_string(c.dp) +
      (c.cut_layer > 0 ? " cut@" + std::to_string(c.cut_layer) + ":tp" + std::to_string(c.cut_tp)
                       : "") +
      (c.distributed_optimizer ? " zero1" : "") + " mb" + std::to_string(c.micro_batch) + "×" +
      std::to_string(c.grad_accum) + (c.sub_batches == 2 ? " overlap" : "") +
      " rc:" + std::string(api::to_string(c.recompute));
  if (c.offload == api::OffloadMode::kOptimizer) s += " off:opt";
  if (c.offload == api::OffloadMode::kWindow) s += " off:win" + std::to_string(c.window);
  return s;
}

}  // namespace

std::string format_plan_table(const api::Plan& plan, const std::string& cluster) {
  std::ostringstream out;
  const auto& c = plan.config;
  const auto& m = plan.model;
  const auto& p = plan.predicted;
  const std::string rank = plan.device == api::DeviceKind::kCpu ? "rank" : "GPU";
  out << "Plan for TrainingJob " << plan.job_namespace << "/" << plan.job_name << " on " << cluster
      << "\n\n";
  out << "  model        L=" << m.layers << " h=" << m.hidden << " heads=" << m.heads
      << " ffn=" << m.ffn_hidden << " vocab=" << m.vocab << " (padded " << m.padded_vocab()
      << ") seq=" << m.seq_len << ", " << api::format_count(static_cast<double>(plan.parameters)) << " parameters\n";
  out << "  hardware     " << c.nodes << " node(s) × " << c.procs_per_node << " " << plan.hardware
      << " = " << plan.world << " rank(s), device " << api::to_string(plan.device) << ", "
      << api::to_string(plan.precision) << "\n";
  if (!plan.peak_source.empty())
    out << "  figures      " << plan.peak_source << " (peak "
        << fmt("%.1f", plan.peak_flops / 1e9) << " GFLOP/s per " << rank << ")\n";
  out << "  parallelism  TP " << c.tp;
  if (c.pp > 1 && c.virtual_stages > 1)
    out << " × PP " << c.pp << " (" << c.virtual_stages << " interleaved chunks of "
        << m.layers / (c.pp * c.virtual_stages) << " layers per stage)";
  else if (c.pp > 1)
    out << " × PP " << c.pp << " (" << m.layers / c.pp << " layers per stage, 1F1B)";
  out << " × DP " << c.dp;
  out << api::describe_cut(plan);
  if (c.distributed_optimizer) out << ", distributed optimizer (ZeRO-1)";
  out << ", overlap " << (c.sub_batches == 2 ? "on (2 sub-batches)" : "off") << ", recompute "
      << api::to_string(c.recompute) << "\n";
  out << "  offload      " << api::to_string(c.offload);
  if (c.offload != api::OffloadMode::kNone)
    out << ", GPU-update fraction " << fmt("%.2f", plan.gpu_update_fraction)
        << (c.offload == api::OffloadMode::kWindow ? ", window " + std::to_string(c.window) : "")
        << ", " << plan.cpu_threads << " CPU thread(s) per rank, "
        << api::format_bytes(p.pcie_bytes_per_step) << " over PCIe per step per rank";
  out << "\n";
  out << "  batch        global " << plan.global_batch << " = DP " << c.dp << " × micro-batch "
      << c.micro_batch << " × " << c.grad_accum << " accumulation step(s)\n";
  out << "  placement    ";
  for (size_t i = 0; i < plan.placement.size(); ++i) {
    if (i == 4 && plan.placement.size() > 5) {
      out << "… (" << plan.placement.size() << " nodes)";
      break;
    }
    out << (i ? ", " : "") << plan.placement[i];
  }
  out << "\n\n";
  out << "  predicted    " << fmt("%.3f", p.step_seconds) << " s/step, "
      << grouped(p.tokens_per_second) << " tokens/s, MFU " << fmt("%.1f%%", 100 * p.mfu) << "\n";
  const auto& t = p.time;
  out << "  step (s)     compute " << fmt("%.3f", t.compute) << " | TP all-reduce exposed "
      << fmt("%.3f", t.tp_comm_exposed) << " of " << fmt("%.3f", t.tp_comm_total)
      << " | DP exposed " << fmt("%.3f", t.dp_comm_exposed) << " of "
      << fmt("%.3f", t.dp_comm_total) << " | transfer exposed " << fmt("%.3f", t.transfer_exposed)
      << " | optimizer GPU " << fmt("%.3f", t.optimizer_gpu) << ", CPU exposed "
      << fmt("%.3f", t.optimizer_cpu_exposed) << " of " << fmt("%.3f", t.optimizer_cpu_total)
      << "\n";
  const auto& mem = p.memory;
  out << "  memory/" << pad(rank + " GiB", 5) << "params " << gib(mem.params) << " | grads "
      << gib(mem.grads) << " | optimizer " << gib(mem.optimizer) << " | activations "
      << gib(mem.activations) << " | workspace " << gib(mem.workspace) << " | reserve "
      << gib(mem.reserve) << " | total " << gib(mem.total()) << " of "
      << gib(p.device_capacity_bytes) << "\n";
  if (p.host_bytes_per_node > 0)
    out << "  host memory  " << api::format_bytes(p.host_bytes_per_node) << " per node of "
        << api::format_bytes(p.host_capacity_bytes) << " usable\n";

  out << "\n  " << pad("plan", 14) << pad("configuration", 52) << pad("s/step", 10)
      << pad("tokens/s", 12) << pad("vs chosen", 11) << pad(rank + " GiB", 9) << "\n";
  out << "  " << pad("chosen", 14) << pad(config_cell(c), 52)
      << pad(fmt("%.3f", p.step_seconds), 10) << pad(grouped(p.tokens_per_second), 12)
      << pad("1.00×", 11) << pad(gib(mem.total()), 9) << "\n";
  for (const auto& a : plan.alternatives) {
    out << "  " << pad(a.name, 14);
    if (a.feasible) {
      out << pad(config_cell(a.config), 52) << pad(fmt("%.3f", a.predicted.step_seconds), 10)
          << pad(grouped(a.predicted.tokens_per_second), 12)
          << pad(fmt("%.2f×", a.predicted.tokens_per_second / p.tokens_per_second), 11)
          << pad(gib(a.predicted.memory.total()), 9);
      if (!a.reason.empty()) out << "(" << a.reason << ")";
    } else {
      out << "infeasible: " << a.reason;
    }
    out << "\n";
  }
  out << "\n  why\n";
  for (const auto& line : plan.explanation) out << "    - " << line << "\n";
  out << "\n  plan hash    " << plan.plan_hash << "\n";
  return out.str();
}

}  // namespace kt::cli

#include "planner/calibration.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "api/error.h"
#include "planner/planner.h"

namespace kt::planner {
namespace {

// Each scale, the predicted phase it corrects and the measured phase it is corrected by. A
// collective hidden behind compute takes longer while it shares the machine with that compute
// (its total grows), but only what is left exposed adds to the step: where the plan predicts an
// exposed part worth measuring, the exposed times are the evidence (without overlap they are
// the totals), else the totals.
struct ScaledPhase {
  const char* label;
  double api::HardwareProfile::*scale;
  double api::TimeBreakdown::*predicted;
  const char* measured;
  double api::TimeBreakdown::*predicted_exposed;  // may be null
  const char* measured_exposed;
};
constexpr ScaledPhase kScaledPhases[] = {
    {"compute", &api::HardwareProfile::compute_scale, &api::TimeBreakdown::compute, "compute",
     nullptr, nullptr},
    {"TP all-reduce", &api::HardwareProfile::tp_comm_scale, &api::TimeBreakdown::tp_comm_total,
     "tp_comm_total", &api::TimeBreakdown::tp_comm_exposed, "tp_comm_exposed"},
    {"DP all-reduce", &api::HardwareProfile::dp_comm_scale, &api::TimeBreakdown::dp_comm_total,
     "dp_comm_total", &api::TimeBreakdown::dp_comm_exposed, "dp_comm_exposed"},
    {"host copies", &api::HardwareProfile::transfer_scale, &api::TimeBreakdown::transfer_total,
     "transfer_total", nullptr, nullptr},
    {"CPU AdamW", &api::HardwareProfile::cpu_optimizer_scale,
     &api::TimeBreakdown::optimizer_cpu_total, "optimizer_cpu_total", nullptr, nullptr},
};

// measured / predicted of one phase in one run; nullopt when the run says nothing about it.
std::optional<double> ratio_of(const PhaseEvidence& run, double api::TimeBreakdown::*predicted,
                               const char* measured, double floor) {
  const double want = run.predicted.*predicted;
  const auto it = run.measured.find(measured);
  if (it == run.measured.end() || !(want >= floor) || !std::isfinite(it->second) ||
      it->second <= 0)
    return std::nullopt;
  return it->second / want;
}

template <typename... Args>
std::string format(const char* fmt, Args... args) {
  char text[256];
  std::snprintf(text, sizeof(text), fmt, args...);
  return text;
}

}  // namespace

Refit refit(const api::HardwareProfile& profile, const std::vector<PhaseEvidence>& runs) {
  Refit out{profile, {}};
  for (const ScaledPhase& phase : kScaledPhases) {
    double log_sum = 0, measured_sum = 0, predicted_sum = 0;
    int n = 0;
    for (const PhaseEvidence& run : runs) {
      const double floor =
          std::max(kMinPhaseSeconds, kMinPhaseShare * run.predicted_step_seconds);
      std::optional<double> ratio;
      if (phase.predicted_exposed)
        ratio = ratio_of(run, phase.predicted_exposed, phase.measured_exposed, floor);
      if (!ratio) ratio = ratio_of(run, phase.predicted, phase.measured, floor);
      if (!ratio) continue;
      log_sum += std::log(*ratio);
      measured_sum += run.predicted.*phase.predicted * *ratio;
      predicted_sum += run.predicted.*phase.predicted;
      ++n;
    }
    if (n == 0) continue;
    const double ratio = std::exp(log_sum / n);
    out.profile.*phase.scale =
        std::clamp(profile.*phase.scale * ratio, 1.0 / kMaxScale, kMaxScale);
    out.changes.push_back(
        std::string(phase.label) +
        (n == 1 ? format(" ×%.3g (%.3g s predicted, measured as %.3g)", ratio, predicted_sum,
                         measured_sum)
                : format(" ×%.3g (geometric mean of %d runs)", ratio, n)));
  }
  return out;
}

Refit refit(const api::HardwareProfile& profile, const api::TimeBreakdown& predicted,
            double predicted_step_seconds, const std::map<std::string, double>& measured) {
  return refit(profile, std::vector<PhaseEvidence>{{predicted, predicted_step_seconds, measured}});
}

int apply_scales(api::Inventory& inventory, const api::HardwareProfile& profile) {
  int applied = 0;
  for (api::Node& node : inventory.nodes) {
    if (node.hardware.name != profile.name) continue;
    for (const ScaledPhase& phase : kScaledPhases)
      node.hardware.*phase.scale = profile.*phase.scale;
    ++applied;
  }
  return applied;
}

std::optional<api::Plan> predict_again(const api::TrainingJob& job, const api::Plan& plan,
                                       const api::Inventory& inventory) {
  api::TrainingJob forced = job;
  const api::ParallelConfig& c = plan.config;
  auto& p = forced.spec.parallelism;
  p.tensor_parallel = c.tp;
  p.data_parallel = c.dp;
  p.overlap = c.sub_batches == 2;
  p.recompute = c.recompute;
  p.offload = c.offload;
  p.offload_window = c.offload == api::OffloadMode::kWindow ? std::optional<int64_t>(c.window)
                                                            : std::nullopt;
  p.gpu_update_fraction = c.offload == api::OffloadMode::kNone
                              ? std::nullopt
                              : std::optional<double>(plan.gpu_update_fraction);
  forced.spec.training.micro_batch_size = c.micro_batch;
  forced.spec.resources.max_nodes = c.nodes;
  forced.spec.resources.min_nodes = c.nodes;
  forced.spec.resources.gpus_per_node = c.procs_per_node;
  try {
    api::Plan again = best_plan(forced, inventory);
    if (again.config == c) return again;
  } catch (const kt::Error&) {
  }
  return std::nullopt;
}

AutotuneDecision decide(const api::TrainingJob& job, const api::Plan& running,
                        const api::Inventory& refit_inventory, int64_t steps_left,
                        double restart_seconds, double min_gain) {
  AutotuneDecision d;
  d.current = predict_again(job, running, refit_inventory);
  try {
    d.best = best_plan(job, refit_inventory);
  } catch (const kt::Error& e) {
    d.reason = std::string("no plan with the measured figures: ") + e.what();
    return d;
  }
  if (!d.current) {
    d.reason = "the running configuration could not be predicted again with the measured "
               "figures; keeping it";
    return d;
  }
  const double now = d.current->predicted.step_seconds, then = d.best->predicted.step_seconds;
  if (d.best->config == running.config) {
    d.reason = format("the running plan is the fastest with the measured figures (%.4g s/step)",
                      now);
    return d;
  }
  const double gain = d.current->predicted.tokens_per_second > 0
                          ? d.best->predicted.tokens_per_second /
                                    d.current->predicted.tokens_per_second -
                                1
                          : 0;
  const double saved = static_cast<double>(std::max<int64_t>(0, steps_left)) * (now - then);
  if (gain < min_gain) {
    d.reason = format("another plan predicts %.4g s/step against %.4g with the measured figures: "
                      "%.3g%% faster, under the %.3g%% that pays a switch",
                      then, now, 100 * gain, 100 * min_gain);
    return d;
  }
  if (saved <= restart_seconds) {
    d.reason = format("another plan predicts %.4g s/step against %.4g, but the steps left save "
                      "%.4g s, not more than a restart costs",
                      then, now, saved);
    return d;
  }
  d.switch_plan = true;
  d.reason = format("with the measured figures the running plan predicts %.4g s/step and another "
                    "%.4g s/step (%.3g%% more tokens/s)",
                    now, then, 100 * gain);
  return d;
}

}  // namespace kt::planner

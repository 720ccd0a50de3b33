// Folding what a running job measured back into its node kind's figures (docs/PLANNER.md §11b),
// and the decision autotune takes with them.
//
// The cost model predicts each phase of a step (compute, TP and DP all-reduces, host copies, CPU
// AdamW) from a hardware profile; the worker measures the same phases (PhaseMeter,
// kubetrain_worker_phase_seconds_total). refit() multiplies each phase's scale in the profile
// (HardwareProfile::compute_scale, ...) by measured / predicted, so that the same configuration
// predicted again with the refit profile gives the measured phase times, and every other
// configuration is predicted with figures that include what this machine actually does (comm
// under load, a CPU optimizer thread beside the compute). A phase the plan barely runs says
// nothing about its rate: its scale is kept.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "api/hardware.h"
#include "api/inventory.h"
#include "api/plan.h"
#include "api/training_job.h"

namespace kt::planner {

// A phase counts as measured when the plan predicts at least this share of its step in it (and
// at least kMinPhaseSeconds): below that, timer noise dominates.
inline constexpr double kMinPhaseShare = 0.03;
inline constexpr double kMinPhaseSeconds = 1e-4;
// Scales stay within [1/kMaxScale, kMaxScale]: a measurement further off is a broken run, not a
// machine.
inline constexpr double kMaxScale = 20;

struct Refit {
  api::HardwareProfile profile;       // the input profile with the measured scales
  std::vector<std::string> changes;   // "compute ×1.31 (0.21 s measured, 0.16 predicted)"
};

// What one run says: its plan's per-step phases as predicted (with the profile being refit),
// and the seconds per step it measured by the worker's phase names (api::kTimePhases:
// "compute", "tp_comm_total", ...).
struct PhaseEvidence {
  api::TimeBreakdown predicted;
  double predicted_step_seconds = 0;
  std::map<std::string, double> measured;
};

// Each scale times the geometric mean, over the runs that measured its phase, of measured /
// predicted (for a collective: of its exposed part where the plan predicts one worth
// measuring, else of its total). One run: refit(profile, {{predicted, step, measured}}).
Refit refit(const api::HardwareProfile& profile, const std::vector<PhaseEvidence>& runs);
Refit refit(const api::HardwareProfile& profile, const api::TimeBreakdown& predicted,
            double predicted_step_seconds, const std::map<std::string, double>& measured);

// Every node whose figures are of `profile`'s kind (same profile name) takes its scales.
// Returns how many nodes did.
int apply_scales(api::Inventory& inventory, const api::HardwareProfile& profile);

// The running plan's configuration predicted again on `inventory` (the planner with every
// choice forced to the plan's): std::nullopt when it no longer fits there.
std::optional<api::Plan> predict_again(const api::TrainingJob& job, const api::Plan& plan,
                                       const api::Inventory& inventory);

struct AutotuneDecision {
  bool switch_plan = false;
  std::optional<api::Plan> current;  // the running configuration, predicted with the refit
  std::optional<api::Plan> best;     // the best plan with the refit
  std::string reason;                // why (either way), for status and the event
};

// Autotune's rule: switch when the best plan with the measured figures predicts at least
// `min_gain` more tokens/s than the running one does with the same figures, and the steps left
// save more time than a restart costs (`restart_seconds`).
AutotuneDecision decide(const api::TrainingJob& job, const api::Plan& running,
                        const api::Inventory& refit_inventory, int64_t steps_left,
                        double restart_seconds, double min_gain = 0.10);

}  // namespace kt::planner

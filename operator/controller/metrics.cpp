#include "operator/controller/metrics.h"

#include "api/training_job.h"

namespace kt::controller {

using telemetry::exponential_buckets;

ControllerMetrics::ControllerMetrics(telemetry::Registry& registry)
    : reconcile_total(registry.counter("controller_runtime_reconcile_total",
                                       "Total number of reconciliations per controller.",
                                       {"controller", "result"})),
      reconcile_errors_total(registry.counter("controller_runtime_reconcile_errors_total",
                                              "Total number of reconciliation errors per "
                                              "controller.",
                                              {"controller"})),
      reconcile_time_seconds(registry.histogram("controller_runtime_reconcile_time_seconds",
                                                "Length of time per reconciliation per controller.",
                                                exponential_buckets(0.0005, 2, 16),
                                                {"controller"})),
      api_requests_per_reconcile(registry.histogram(
          "kubetrain_operator_api_requests_per_reconcile",
          "API requests (reads the informer cache did not answer, and writes) per reconcile.",
          {0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512}, {"controller"})),
      jobs(registry.gauge("kubetrain_jobs", "TrainingJobs by phase.", {"phase"})),
      jobs_created_total(registry
                             .counter("kubetrain_jobs_created_total",
                                      "TrainingJobs whose first worker pods were created.")
                             .with({})),
      jobs_succeeded_total(
          registry.counter("kubetrain_jobs_succeeded_total", "TrainingJobs that succeeded.")
              .with({})),
      jobs_failed_total(
          registry.counter("kubetrain_jobs_failed_total", "TrainingJobs that failed.").with({})),
      jobs_restarted_total(
          registry.counter("kubetrain_jobs_restarted_total", "Whole-gang restarts of TrainingJobs.")
              .with({})),
      planner_duration_seconds(registry
                                   .histogram("kubetrain_planner_duration_seconds",
                                              "Time the planner took per plan.",
                                              exponential_buckets(0.0001, 4, 10))
                                   .with({})),
      time_to_running_seconds(
          registry
              .histogram("kubetrain_job_time_to_running_seconds",
                         "Time from a TrainingJob's creation until all its workers ran.",
                         exponential_buckets(0.5, 2, 14))
              .with({})),
      trainingjob_status_phase(registry.gauge("kubetrain_trainingjob_status_phase",
                                              "The TrainingJob's phase: 1 for the phase it is "
                                              "in, 0 for the others.",
                                              {"namespace", "trainingjob", "phase"})),
      trainingjob_restarts(registry.gauge("kubetrain_trainingjob_restarts",
                                          "Whole-gang restarts of the TrainingJob so far "
                                          "(status.restarts).",
                                          {"namespace", "trainingjob"})) {}

void ControllerMetrics::record_job(const std::string& ns, const std::string& name,
                                   const std::string& phase, int64_t restarts) {
  static constexpr api::JobPhase kPhases[] = {
      api::JobPhase::kPending,    api::JobPhase::kPlanning,  api::JobPhase::kStarting,
      api::JobPhase::kRunning,    api::JobPhase::kRestarting, api::JobPhase::kSucceeded,
      api::JobPhase::kFailed,     api::JobPhase::kSuspended};
  const std::string key = ns + "/" + name;
  std::lock_guard<std::mutex> lock(mutex_);
  if (phase.empty()) {
    for (const api::JobPhase p : kPhases)
      trainingjob_status_phase.remove({ns, name, std::string(api::to_string(p))});
    trainingjob_restarts.remove({ns, name});
  } else {
    for (const api::JobPhase p : kPhases) {
      const std::string value(api::to_string(p));
      trainingjob_status_phase.with({ns, name, value}).set(value == phase ? 1 : 0);
    }
    trainingjob_restarts.with({ns, name}).set(static_cast<double>(restarts));
  }
  auto it = phases_.find(key);
  if (it != phases_.end()) {
    if (it->second == phase) return;
    jobs.with({it->second}).dec();
    phases_.erase(it);
  }
  if (phase.empty()) return;
  phases_[key] = phase;
  jobs.with({phase}).inc();
}

}  // namespace kt::controller

#include "operator/controller/metrics.h"

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
              .with({})) {}

void ControllerMetrics::record_phase(const std::string& job_key, const std::string& phase) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = phases_.find(job_key);
  if (it != phases_.end()) {
    if (it->second == phase) return;
    jobs.with({it->second}).dec();
    phases_.erase(it);
  }
  if (phase.empty()) return;
  phases_[job_key] = phase;
  jobs.with({phase}).inc();
}

}  // namespace kt::controller

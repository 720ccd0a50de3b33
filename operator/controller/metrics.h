// The controller's metrics (DESIGN.md §8), with controller-runtime's names so that stock
// dashboards work. Created once per registry and shared by every Controller using it.
#pragma once

#include <map>
#include <mutex>
#include <string>

#include "telemetry/metrics.h"

namespace kt::controller {

struct ControllerMetrics {
  explicit ControllerMetrics(telemetry::Registry& registry);

  telemetry::Family<telemetry::Counter>& reconcile_total;           // {controller,result}
  telemetry::Family<telemetry::Counter>& reconcile_errors_total;    // {controller}
  telemetry::Family<telemetry::Histogram>& reconcile_time_seconds;  // {controller}
  telemetry::Family<telemetry::Gauge>& jobs;                        // {phase}
  telemetry::Counter& jobs_created_total;
  telemetry::Counter& jobs_succeeded_total;
  telemetry::Counter& jobs_failed_total;
  telemetry::Counter& jobs_restarted_total;
  telemetry::Histogram& planner_duration_seconds;
  telemetry::Histogram& time_to_running_seconds;

  // Keeps kubetrain_jobs{phase} equal to the number of jobs last seen in each phase; an empty
  // phase forgets the job (deleted).
  void record_phase(const std::string& job_key, const std::string& phase);

 private:
  std::mutex mutex_;
  std::map<std::string, std::string> phases_;  // by "ns/name"
};

}  // namespace kt::controller

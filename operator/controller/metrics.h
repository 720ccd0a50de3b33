// The controller's metrics (docs/OPERATIONS.md, "Metrics"), with controller-runtime's names so that
// stock dashboards work. Created once per registry and shared by every Controller using it.
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
  // Requests one reconcile sent to the API server (reads the informer cache answered are not
  // requests): 0 reads in a steady state, writes only when something changed. {controller}
  telemetry::Family<telemetry::Histogram>& api_requests_per_reconcile;
  telemetry::Family<telemetry::Gauge>& jobs;                        // {phase}
  telemetry::Counter& jobs_created_total;
  telemetry::Counter& jobs_succeeded_total;
  telemetry::Counter& jobs_failed_total;
  telemetry::Counter& jobs_restarted_total;
  telemetry::Histogram& planner_duration_seconds;
  telemetry::Histogram& time_to_running_seconds;
  // Per TrainingJob, as kube-state-metrics does for pods: {namespace, trainingjob, phase} 1 for
  // the job's phase and 0 for the others, and {namespace, trainingjob} the gang restarts.
  telemetry::Family<telemetry::Gauge>& trainingjob_status_phase;
  telemetry::Family<telemetry::Gauge>& trainingjob_restarts;

  // Keeps kubetrain_jobs{phase} equal to the number of jobs last seen in each phase, and the
  // job's own series; an empty phase forgets the job (deleted) and ends its series.
  void record_job(const std::string& ns, const std::string& name, const std::string& phase,
                  int64_t restarts);

 private:
  std::mutex mutex_;
  std::map<std::string, std::string> phases_;  // by "ns/name"
};

}  // namespace kt::controller

// Training progress as rank 0's worker metrics report it (docs/METRICS.md), read from the
// Prometheus text exposition of its pod's /metrics.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>

namespace kt::controller {

// Fetches http://host:port/metrics; std::nullopt when it cannot (not up yet, gone). Injected so
// that tests fake it and the controller knows no HTTP.
using MetricsFetcher = std::function<std::optional<std::string>(const std::string& host, int port)>;

struct WorkerProgress {
  std::optional<double> steps;  // kubetrain_worker_steps_total: steps of this process
  std::optional<double> step;   // kubetrain_worker_step: the job's step (resumed ones counted)
  std::optional<double> loss;   // kubetrain_worker_loss
  std::optional<double> tokens_per_second;
  std::optional<double> last_checkpoint_step;
  // Failed checkpoint saves: in a row up to now (0 once one succeeds again), and in all by the
  // errno's name (kubetrain_worker_checkpoint_failures_total{reason}; "" when unlabelled, as in
  // the termination message).
  std::optional<double> checkpoint_consecutive_failures;
  std::map<std::string, double> checkpoint_failures;
  // kubetrain_worker_phase_seconds_total{phase}: this process's seconds in each step phase.
  std::map<std::string, double> phase_seconds;
};

// Reads the samples with rank="0" (or without a rank label) of the worker metrics above. Any
// text is accepted (it comes from whatever answers on a pod's port, or from its termination
// message): lines that are not samples of these metrics, values that are not finite, and
// additions that would overflow a sum are skipped; the two maps keep at most kMaxProgressLabels distinct label values of at most
// kMaxProgressLabelBytes each (the worker emits about ten).
inline constexpr size_t kMaxProgressLabels = 32;
inline constexpr size_t kMaxProgressLabelBytes = 64;
WorkerProgress parse_worker_progress(const std::string& exposition);

}  // namespace kt::controller

// The metric families a training worker exports (docs/METRICS.md describes each
// one for dashboard authors). Units are in the names; times are seconds, sizes bytes.
//
//   Registry registry(worker_labels(job, job_namespace, rank, node_rank));
//   WorkerMetrics metrics(registry);
//   metrics.steps.inc();
//   metrics.step_seconds.observe(step_time);
//   metrics.memory_bytes.with({"cuda:0", "activations"}).set(bytes);
#pragma once

#include <string>
#include <vector>

#include "telemetry/metrics.h"

namespace kt::telemetry {

// The constant labels of every worker sample: trainingjob, namespace, rank, node_rank. Not `job`:
// Prometheus gives every target a `job` label of its own, which would rename ours exported_job.
Labels worker_labels(const std::string& job, const std::string& job_namespace, int rank,
                     int node_rank);

// Bucket bounds of kubetrain_worker_step_seconds: 10 ms · 2^k up to 164 s, which spans a tiny
// model on a CPU to a 7B model on a node.
std::vector<double> step_seconds_buckets();

struct WorkerMetrics {
  explicit WorkerMetrics(Registry& registry);

  Counter& steps;                         // kubetrain_worker_steps_total
  Gauge& step;                            // kubetrain_worker_step (the job's, across restarts)
  Gauge& target_steps;                    // kubetrain_worker_target_steps
  Histogram& step_seconds;                // kubetrain_worker_step_seconds
  Counter& tokens;                        // kubetrain_worker_tokens_total (whole job)
  Gauge& tokens_per_second;               // kubetrain_worker_tokens_per_second (whole job)
  Gauge& loss;                            // kubetrain_worker_loss
  Family<Gauge>& loss_floor;  // kubetrain_worker_loss_floor: set only when the data's is known
  Gauge& mfu_ratio;                       // kubetrain_worker_mfu_ratio
  Family<Gauge>& memory_bytes;            // kubetrain_worker_memory_bytes{device, kind}
  Family<Counter>& transfer_bytes;        // kubetrain_worker_transfer_bytes_total{direction}
  Family<Counter>& comm_seconds;          // kubetrain_worker_comm_seconds_total{group}
  Family<Counter>& comm_exposed_seconds;  // kubetrain_worker_comm_exposed_seconds_total{group}
  Family<Counter>& optimizer_seconds;     // kubetrain_worker_optimizer_seconds_total{device}
  Family<Counter>& phase_seconds;         // kubetrain_worker_phase_seconds_total{phase}
  Gauge& predicted_step_seconds;          // kubetrain_worker_predicted_step_seconds
  Gauge& predicted_tokens_per_second;     // kubetrain_worker_predicted_tokens_per_second (job)
  Family<Gauge>& predicted_phase_seconds;  // kubetrain_worker_predicted_phase_seconds{phase}
  // kubetrain_worker_plan_info{tp, dp, nodes, recompute, offload, overlap, precision, device,
  // plan_hash} 1: the plan being run, to join on or to show in a table.
  Family<Gauge>& plan_info;
  Gauge& checkpoint_seconds;              // kubetrain_worker_checkpoint_seconds
  Gauge& last_checkpoint_step;            // kubetrain_worker_last_checkpoint_step
  Gauge& last_checkpoint_time;  // kubetrain_worker_last_checkpoint_timestamp_seconds (Unix time)
  Family<Counter>& checkpoint_failures;   // kubetrain_worker_checkpoint_failures_total{reason}
  Gauge& checkpoint_consecutive_failures;  // kubetrain_worker_checkpoint_consecutive_failures
};

}  // namespace kt::telemetry

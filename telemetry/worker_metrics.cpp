#include "telemetry/worker_metrics.h"

namespace kt::telemetry {

Labels worker_labels(const std::string& job, const std::string& job_namespace, int rank,
                     int node_rank) {
  return {{"trainingjob", job},
          {"namespace", job_namespace},
          {"rank", std::to_string(rank)},
          {"node_rank", std::to_string(node_rank)}};
}

std::vector<double> step_seconds_buckets() {
  return exponential_buckets(0.01, 2, 15);
}

// Label values (docs/METRICS.md): device "cpu" | "cuda:N"; kind as the plan's memory breakdown
// (params, grads, optimizer, activations, workspace) plus "peak"; direction "h2d" | "d2h";
// group "tp" | "dp" | "pp"; phase as the plan's TimeBreakdown (compute, tp_comm_total, tp_comm_exposed,
// dp_comm_total, dp_comm_exposed, transfer_total, transfer_exposed, optimizer_gpu,
// optimizer_cpu_total, optimizer_cpu_exposed); reason the errno's name ("ENOSPC", "EROFS",
// "EACCES", …) or "other".
WorkerMetrics::WorkerMetrics(Registry& registry)
    : steps(registry
                .counter("kubetrain_worker_steps_total",
                         "Optimizer steps completed since the process started.")
                .with({})),
      step(registry
               .gauge("kubetrain_worker_step",
                      "Steps the job has completed, counting those done before a restart "
                      "resumed it from a checkpoint.")
               .with({})),
      target_steps(registry
                       .gauge("kubetrain_worker_target_steps",
                              "Steps the job trains in all (spec.training.steps).")
                       .with({})),
      step_seconds(registry
                       .histogram("kubetrain_worker_step_seconds",
                                  "Wall time of one optimizer step, in seconds.",
                                  step_seconds_buckets())
                       .with({})),
      tokens(registry
                 .counter("kubetrain_worker_tokens_total",
                          "Tokens trained by the whole job since this process started "
                          "(global batch times sequence length per step).")
                 .with({})),
      tokens_per_second(registry
                            .gauge("kubetrain_worker_tokens_per_second",
                                   "Tokens per second of the whole job over the last step.")
                            .with({})),
      loss(registry
               .gauge("kubetrain_worker_loss",
                      "Mean cross-entropy loss of the last step, in nats per token.")
               .with({})),
      loss_floor(registry.gauge("kubetrain_worker_loss_floor",
                                "Lowest mean loss the training data allows, in nats per token "
                                "(the synthetic data's entropy rate); absent when unknown.")),
      mfu_ratio(registry
                    .gauge("kubetrain_worker_mfu_ratio",
                           "Model FLOPs utilization of the last step: model FLOPs per second "
                           "of this rank divided by its device's peak (0 to 1).")
                    .with({})),
      memory_bytes(registry.gauge("kubetrain_worker_memory_bytes",
                                  "Bytes this rank holds, by device and kind of state.",
                                  {"device", "kind"})),
      transfer_bytes(registry.counter("kubetrain_worker_transfer_bytes_total",
                                      "Bytes copied between host and device memory (offload).",
                                      {"direction"})),
      comm_seconds(registry.counter("kubetrain_worker_comm_seconds_total",
                                    "Seconds spent in collective communication, by group.",
                                    {"group"})),
      comm_exposed_seconds(
          registry.counter("kubetrain_worker_comm_exposed_seconds_total",
                           "Seconds of collective communication not hidden behind compute, "
                           "by group.",
                           {"group"})),
      optimizer_seconds(registry.counter("kubetrain_worker_optimizer_seconds_total",
                                         "Seconds spent in optimizer updates, by the device "
                                         "that ran them.",
                                         {"device"})),
      phase_seconds(registry.counter("kubetrain_worker_phase_seconds_total",
                                     "Seconds of each phase of the steps, measured, per rank "
                                     "(the phases of kubetrain_worker_predicted_phase_seconds; "
                                     "compute is the rest of the step).",
                                     {"phase"})),
      predicted_step_seconds(registry
                                 .gauge("kubetrain_worker_predicted_step_seconds",
                                        "Step time the planner predicted for this plan, in "
                                        "seconds.")
                                 .with({})),
      predicted_tokens_per_second(
          registry
              .gauge("kubetrain_worker_predicted_tokens_per_second",
                     "Tokens per second of the whole job the planner predicted for this plan.")
              .with({})),
      predicted_phase_seconds(registry.gauge("kubetrain_worker_predicted_phase_seconds",
                                             "Seconds per step the planner predicted for each "
                                             "phase of the step, per rank.",
                                             {"phase"})),
      plan_info(registry.gauge(
          "kubetrain_worker_plan_info",
          "The plan being run (always 1): parallel degrees (pipeline stages and their "
          "virtual stages, "
          "the sharded optimizer, Oases' cutpoint: 0 when none), recompute, "
          "offload, overlap, precision, device and the plan's hash.",
          {"tp", "dp", "pp", "virtual_stages", "distributed_optimizer", "cut_layer", "cut_tp",
           "nodes", "recompute", "offload", "overlap", "precision", "device", "plan_hash"})),
      checkpoint_seconds(registry
                             .gauge("kubetrain_worker_checkpoint_seconds",
                                    "Wall time of the last checkpoint save, in seconds.")
                             .with({})),
      last_checkpoint_step(registry
                               .gauge("kubetrain_worker_last_checkpoint_step",
                                      "Step of the last checkpoint saved (0: none yet).")
                               .with({})),
      last_checkpoint_time(registry
                               .gauge("kubetrain_worker_last_checkpoint_timestamp_seconds",
                                      "Unix time of the last checkpoint saved by this process "
                                      "(0: none yet).")
                               .with({})),
      checkpoint_failures(registry.counter("kubetrain_worker_checkpoint_failures_total",
                                           "Checkpoint saves that failed (training went on), by "
                                           "the errno of the failed call.",
                                           {"reason"})),
      checkpoint_consecutive_failures(
          registry
              .gauge("kubetrain_worker_checkpoint_consecutive_failures",
                     "Checkpoint saves that failed since the last one that succeeded (0: the "
                     "last save succeeded, or none was due yet).")
              .with({})) {
  loss_floor.remove({});  // a family without labels starts with its sample; this one waits
}

}  // namespace kt::telemetry

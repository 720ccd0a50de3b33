#include "telemetry/worker_metrics.h"

namespace kt::telemetry {

Labels worker_labels(const std::string& job, const std::string& job_namespace, int rank,
                     int node_rank) {
  return {{"job", job},
          {"namespace", job_namespace},
          {"rank", std::to_string(rank)},
          {"node_rank", std::to_string(node_rank)}};
}

std::vector<double> step_seconds_buckets() {
  return exponential_buckets(0.01, 2, 15);
}

// Label values (docs/METRICS.md): device "cpu" | "cuda:N"; kind as the plan's memory breakdown
// (params, grads, optimizer, activations, workspace) plus "peak"; direction "h2d" | "d2h";
// group "tp" | "dp".
WorkerMetrics::WorkerMetrics(Registry& registry)
    : steps(registry
                .counter("kubetrain_worker_steps_total",
                         "Optimizer steps completed since the process started.")
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
      predicted_step_seconds(registry
                                 .gauge("kubetrain_worker_predicted_step_seconds",
                                        "Step time the planner predicted for this plan, in "
                                        "seconds.")
                                 .with({})),
      checkpoint_seconds(registry
                             .gauge("kubetrain_worker_checkpoint_seconds",
                                    "Wall time of the last checkpoint save, in seconds.")
                             .with({})),
      last_checkpoint_step(registry
                               .gauge("kubetrain_worker_last_checkpoint_step",
                                      "Step of the last checkpoint saved (0: none yet).")
                               .with({})) {}

}  // namespace kt::telemetry

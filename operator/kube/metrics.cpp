#include "operator/kube/metrics.h"

namespace kt::kube {

KubeMetrics::KubeMetrics(telemetry::Registry& registry)
    : rest_client_requests(registry.counter(
          "rest_client_requests_total",
          "Number of HTTP requests, partitioned by status code and method.", {"code", "method"})),
      workqueue_depth(registry.gauge("workqueue_depth", "Current depth of workqueue", {"name"})),
      workqueue_adds(registry.counter("workqueue_adds_total",
                                      "Total number of adds handled by workqueue", {"name"})),
      workqueue_retries(registry.counter("workqueue_retries_total",
                                         "Total number of retries handled by workqueue",
                                         {"name"})),
      leader_election_master_status(registry.gauge(
          "leader_election_master_status",
          "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, "
          "1 indicates master. 'name' is the string used to identify the lease.",
          {"name"})) {}

}  // namespace kt::kube

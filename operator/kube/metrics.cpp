#include "operator/kube/metrics.h"

namespace kt::kube {

KubeMetrics::KubeMetrics(telemetry::Registry& registry)
    : rest_client_requests(registry.counter(
          "rest_client_requests_total",
          "Number of HTTP requests, partitioned by status code and method.", {"code", "method"})),
      // client-go's buckets (k8s.io/client-go/tools/metrics via component-base).
      rest_client_request_duration(registry.histogram(
          "rest_client_request_duration_seconds",
          "Request latency in seconds. Broken down by verb, and host.",
          {0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0}, {"verb", "host"})),
      workqueue_depth(registry.gauge("workqueue_depth", "Current depth of workqueue", {"name"})),
      workqueue_adds(registry.counter("workqueue_adds_total",
                                      "Total number of adds handled by workqueue", {"name"})),
      workqueue_retries(registry.counter("workqueue_retries_total",
                                         "Total number of retries handled by workqueue",
                                         {"name"})),
      // client-go's buckets: 10 ns to 10 s in powers of ten (workqueue/metrics.go).
      workqueue_queue_duration(registry.histogram(
          "workqueue_queue_duration_seconds",
          "How long in seconds an item stays in workqueue before being requested.",
          {1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1, 10}, {"name"})),
      workqueue_work_duration(registry.histogram(
          "workqueue_work_duration_seconds",
          "How long in seconds processing an item from workqueue takes.",
          {1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1, 10}, {"name"})),
      leader_election_master_status(registry.gauge(
          "leader_election_master_status",
          "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, "
          "1 indicates master. 'name' is the string used to identify the lease.",
          {"name"})) {}

}  // namespace kt::kube

// The Kubernetes-access metrics, with controller-runtime's names so that stock dashboards work
// (docs/OPERATIONS.md, "Metrics"). Registered once per registry; components take a pointer
// (nullptr: no metrics).
#pragma once

#include "telemetry/metrics.h"

namespace kt::kube {

struct KubeMetrics {
  explicit KubeMetrics(telemetry::Registry& registry);

  telemetry::Family<telemetry::Counter>& rest_client_requests;  // {code, method}
  // client-go's request latency, labels as client-go's: verb (the HTTP method) and host
  // (host:port of the API server). A watch counts until its response headers.
  telemetry::Family<telemetry::Histogram>& rest_client_request_duration;  // {verb, host}
  telemetry::Family<telemetry::Gauge>& workqueue_depth;         // {name}
  telemetry::Family<telemetry::Counter>& workqueue_adds;        // {name}
  telemetry::Family<telemetry::Counter>& workqueue_retries;     // {name}
  // client-go's: from add to get (waiting in the queue), and from get to done (the reconcile).
  telemetry::Family<telemetry::Histogram>& workqueue_queue_duration;  // {name}
  telemetry::Family<telemetry::Histogram>& workqueue_work_duration;   // {name}
  telemetry::Family<telemetry::Gauge>& leader_election_master_status;  // {name}
};

}  // namespace kt::kube

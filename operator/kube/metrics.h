// The Kubernetes-access metrics, with controller-runtime's names so that stock dashboards work
// (DESIGN.md §8). Registered once per registry; components take a pointer (nullptr: no metrics).
#pragma once

#include "telemetry/metrics.h"

namespace kt::kube {

struct KubeMetrics {
  explicit KubeMetrics(telemetry::Registry& registry);

  telemetry::Family<telemetry::Counter>& rest_client_requests;  // {code, method}
  telemetry::Family<telemetry::Gauge>& workqueue_depth;         // {name}
  telemetry::Family<telemetry::Counter>& workqueue_adds;        // {name}
  telemetry::Family<telemetry::Counter>& workqueue_retries;     // {name}
  telemetry::Family<telemetry::Gauge>& leader_election_master_status;  // {name}
};

}  // namespace kt::kube

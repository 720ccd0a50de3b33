// The worker's and operator's scrape endpoints on an HttpServer.
#pragma once

#include "telemetry/http_server.h"
#include "telemetry/metrics.h"

namespace kt::telemetry {

// The content type of the Prometheus text exposition format 0.0.4.
inline constexpr const char* kPrometheusTextContentType =
    "text/plain; version=0.0.4; charset=utf-8";

// Registers GET /metrics (registry.expose() at each scrape) and GET /healthz ("ok") on `server`.
// `registry` must outlive the server.
void serve_metrics(HttpServer& server, const Registry& registry);

}  // namespace kt::telemetry

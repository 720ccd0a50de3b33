#include "telemetry/metrics_endpoint.h"

namespace kt::telemetry {

void serve_metrics(HttpServer& server, const Registry& registry) {
  server.handle("/metrics", [&registry](const Request&) {
    return Response{200, kPrometheusTextContentType, registry.expose()};
  });
  server.handle("/healthz", [](const Request&) {
    return Response{200, "text/plain; charset=utf-8", "ok"};
  });
}

}  // namespace kt::telemetry

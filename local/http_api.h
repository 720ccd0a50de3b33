// The Kubernetes REST API over a kube::Client (normally the local Store): what
// `kubetrain local serve` exposes on 127.0.0.1 so that the operator's REST path and kubectl can
// talk to the local control plane (docs/ARCHITECTURE.md §6, docs/KUBE.md).
//
// Served: the resource paths of core and group resources (namespaced and cluster-scoped, the
// status subresource, pods/log), GET/list (label/field selectors, limit/continue,
// resourceVersion, and kubectl's Table form with the built-in kinds' columns, tables.h), watch
// as a chunked stream of JSON lines (also as a streaming list: sendInitialEvents), POST, PUT,
// PATCH (merge patch; strategic merge patch treated as a merge patch; server-side apply,
// apply.h), DELETE with propagationPolicy; JSON or Kubernetes protobuf bodies (protobuf.h);
// server-side field validation of custom resources (schema.h); errors as metav1.Status;
// discovery (/api, /api/v1, /apis, /apis/<group>[/<version>], /version) with the CRDs in the
// store (discovery.h); /openapi/v3 from the CRDs' schemas and a minimal /openapi/v2 (openapi.h);
// /healthz, /readyz, /livez. Requests with a ServiceAccount token are authorized by RBAC (rbac.h).
//
// Faults for tests, set through set_faults() or `POST /kubetrain/faults` with the same fields
// as JSON ({"serverErrors": 2, "delayMs": 300, "errorRate": 0.05}); `POST /kubetrain/drop-watches`
// cuts every open watch connection.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "http/server.h"
#include "operator/kube/client.h"

namespace kt::local {

using http::HttpRequest;
using http::HttpServer;
using http::ResponseWriter;

// Each count is consumed by the requests it hits, in arrival order.
struct Faults {
  int watch_gone = 0;          // watch requests answered with HTTP 410 Gone
  int watch_expired = 0;       // watches answered 200 + one ERROR event {code 410, Expired}
  int update_conflicts = 0;    // PUT and PATCH answered 409 Conflict
  int server_errors = 0;       // requests (watches included) answered 500
  int too_many_requests = 0;   // requests answered 429 with Retry-After: 1
  std::chrono::milliseconds delay{0};  // added before every resource request (not discovery)
  // Random faults for chaos tests (`kubetrain local serve --inject-faults RATE`): each resource
  // request is answered 500 or 429 (Retry-After: 1), half and half, with probability
  // `error_rate`, and each watch ends early, after an exponentially distributed time with a mean
  // of 1 / error_rate seconds (half of them cut without ending the response, as a dropped
  // connection). `seed` seeds the draws.
  double error_rate = 0;
  uint64_t seed = 0;
};

// The file holding a pod's container output (the local pod runner's log), for pods/log.
using PodLogPath = std::function<std::string(const std::string& ns, const std::string& name)>;

class ApiServer {
 public:
  ApiServer(kube::Client& backend, std::string address = "127.0.0.1", int port = 0);
  ~ApiServer();  // stops
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  void start();  // throws kt::Error if it cannot listen
  void stop();
  int port() const;
  std::string url() const;  // "http://127.0.0.1:PORT"

  // A kubeconfig whose current context points at this server (namespace "default").
  std::string kubeconfig() const;
  void write_kubeconfig(const std::string& path) const;  // throws kt::Error

  // Serves a resource the backend knows without a CRD object (Store::register_resource).
  void add_resource(const kube::Resource& resource, bool status_subresource,
                    std::vector<std::string> short_names = {});

  // A bearer token for the ServiceAccount ns/name (the same one each time): requests with it
  // are that account's and are authorized by RBAC against the stored Roles, ClusterRoles and
  // their bindings (rbac.h). Requests without a token are the local administrator's.
  std::string service_account_token(const std::string& ns, const std::string& name);
  // A kubeconfig for this server with that token and namespace: what a local pod gets.
  std::string service_account_kubeconfig(const std::string& ns, const std::string& name);

  // Serves GET .../pods/NAME/log (follow, tailLines, container, previous) from these files.
  void set_pod_logs(PodLogPath path_of);

  void set_faults(const Faults& faults);
  Faults faults() const;
  // Cuts every open watch connection now, without ending its response.
  void drop_watches();
  int open_watches() const { return open_watches_.load(); }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::atomic<int> open_watches_{0};
};

}  // namespace kt::local

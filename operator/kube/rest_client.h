// kube::Client over HTTP: the Kubernetes REST API of a real API server or of
// `kubetrain local serve` (docs/KUBE.md). Errors come back as ApiError classified from the
// server's Status body; transport failures as kt::Error.
//
//   RestClient client(load_config(flag), {.metrics = &kube_metrics});
//   Object pod = client.get(kPods, "default", "w-0");
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "operator/kube/client.h"
#include "operator/kube/config.h"
#include "operator/kube/http_client.h"
#include "operator/kube/metrics.h"

namespace kt::kube {

struct RestClientOptions {
  std::chrono::milliseconds timeout{30'000};  // per request (not watches)
  // A 429 is retried after its Retry-After (capped at max_retry_after) this many times before
  // the ApiError reaches the caller, as client-go does.
  int max_429_retries = 3;
  std::chrono::seconds max_retry_after{10};
  KubeMetrics* metrics = nullptr;  // counts rest_client_requests_total{code,method}
  std::string user_agent = "kubetrain/0.1.0";
};

class RestClient : public Client {
 public:
  RestClient(const Config& config, RestClientOptions options = {});
  ~RestClient() override;

  Object get(const Resource& r, const std::string& ns, const std::string& name) override;
  ObjectList list(const Resource& r, const std::string& ns, const ListOptions& opts) override;
  Object create(const Resource& r, const std::string& ns, const Object& obj) override;
  Object update(const Resource& r, const std::string& ns, const Object& obj) override;
  Object update_status(const Resource& r, const std::string& ns, const Object& obj) override;
  Object merge_patch(const Resource& r, const std::string& ns, const std::string& name,
                     const Object& patch, bool status_subresource = false) override;
  void remove(const Resource& r, const std::string& ns, const std::string& name,
              Propagation propagation = Propagation::Background) override;
  std::unique_ptr<Watch> watch(const Resource& r, const std::string& ns,
                               const WatchOptions& opts) override;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// The URL path of a collection or object: "/api/v1/namespaces/ns/pods/name/status",
// "/apis/coordination.k8s.io/v1/namespaces/ns/leases", "/api/v1/nodes/n". `ns` is ignored for
// cluster-scoped resources; "" lists across namespaces.
std::string resource_path(const Resource& r, const std::string& ns, const std::string& name = "",
                          const std::string& subresource = "");

// Percent-encodes a query value (RFC 3986 unreserved characters stay).
std::string url_encode(const std::string& text);

// The ApiError for an HTTP error status: reason, message and retryAfterSeconds from a
// metav1.Status body when there is one, else from the code; Retry-After header in seconds.
ApiError api_error(int status, const std::string& body, std::optional<std::string> retry_after,
                   const std::string& what);

}  // namespace kt::kube

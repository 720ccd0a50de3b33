// A local control plane served over real sockets for kube tests: the Store behind
// `kubetrain local serve`'s ApiServer, and a RestClient pointed at it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <thread>

#include "operator/kube/rest_client.h"
#include "operator/local/http_api.h"
#include "operator/local/store.h"

namespace kt::kube::testing {

struct LocalServer {
  explicit LocalServer(local::StoreOptions store_options = {}) : store(store_options) {
    store.register_resource(kTrainingJobs, true);
    server.add_resource(kTrainingJobs, true, {"tj"});
    server.start();
  }

  Config config() const {
    Config c;
    c.server = server.url();
    c.namespace_ = "default";
    return c;
  }

  std::unique_ptr<RestClient> client(RestClientOptions options = {}) const {
    return std::make_unique<RestClient>(config(), options);
  }

  local::Store store;
  local::ApiServer server{store};
};

inline Object config_map(const std::string& name, const std::string& value = "v",
                         const std::string& ns = "default") {
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", {{"name", name}, {"namespace", ns}, {"labels", {{"app", "kt"}}}}},
          {"data", {{"key", value}}}};
}

// Polls `condition` every 20 ms until it holds or `timeout` passes; returns its last value.
inline bool eventually(const std::function<bool()>& condition,
                       std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return condition();
}

}  // namespace kt::kube::testing

// A local control plane served over real sockets for kube tests: the Store behind
// `kubetrain local serve`'s ApiServer, and a RestClient pointed at it.
#pragma once

#include <memory>

#include "operator/kube/rest_client.h"
#include "local/http_api.h"
#include "local/store.h"

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

}  // namespace kt::kube::testing

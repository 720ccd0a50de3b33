// Where the API server is and how to authenticate: from a kubeconfig file or from the pod's
// service account (in-cluster). Errors are kt::Error naming the file and the field.
//
//   Config config = load_config(flag_kubeconfig);  // flag, $KUBECONFIG, in-cluster, ~/.kube/config
//   RestClient client(config);
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <string>

#include "operator/kube/http_client.h"

namespace kt::kube {

struct Config {
  std::string server;     // "https://10.0.0.1:6443"
  TlsOptions tls;
  std::string token;      // a bearer token ("" for none) ...
  std::string token_file; // ... or a file holding it, re-read periodically (in-cluster)
  std::string namespace_; // the context's namespace, or the service account's; "default"
  std::string source;     // for messages: "kubeconfig /root/.kube/config, context kind-a"
};

// Reads a kubeconfig. `context` "" means its current-context. Paths in it are relative to the
// file's directory; *-data fields are base64 as in the file. Unsupported authentication (exec
// plugins, auth providers, basic auth) is an error that says so.
Config load_kubeconfig(const std::string& path, const std::string& context = "");
// The same for the text of a kubeconfig read from `path` (named in errors, and the directory
// that relative paths in it are resolved against).
Config parse_kubeconfig(const std::string& text, const std::string& path,
                        const std::string& context = "");

// The pod's service account: KUBERNETES_SERVICE_HOST/PORT from `env` and the token, CA and
// namespace files under `secrets_dir`.
Config in_cluster_config(const std::map<std::string, std::string>& env,
                         const std::string& secrets_dir =
                             "/var/run/secrets/kubernetes.io/serviceaccount");

// controller-runtime's order: `kubeconfig_flag`, then $KUBECONFIG (the first existing file of
// its colon-separated list), then in-cluster when KUBERNETES_SERVICE_HOST is set, then
// ~/.kube/config.
Config load_config(const std::string& kubeconfig_flag = "");

// The bearer token to send: a fixed one, or a file re-read when older than `reread_after`
// (projected service-account tokens rotate; client-go re-reads every minute). Thread-safe.
class BearerToken {
 public:
  BearerToken(std::string token, std::string file,
              std::chrono::seconds reread_after = std::chrono::seconds(60));
  // "" when there is no token. Throws kt::Error if the file cannot be read the first time; a
  // later read failure keeps the last token.
  std::string get();

 private:
  const std::string file_;
  const std::chrono::seconds reread_after_;
  std::mutex mutex_;
  std::string token_;
  std::chrono::steady_clock::time_point read_at_{};
  bool ever_read_ = false;
};

// RFC 4648 base64 (padding optional, whitespace ignored); throws kt::Error naming `what`.
std::string base64_decode(const std::string& text, const std::string& what);

}  // namespace kt::kube

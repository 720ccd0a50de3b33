#include "cli/local_serve.h"

#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/run.h"
#include "operator/local/builtin_resources.h"
#include "operator/local/deployment_controller.h"
#include "operator/local/http_api.h"
#include "operator/local/local_node.h"
#include "operator/local/pod_runner.h"
#include "operator/local/store.h"

namespace kt::cli {

int local_serve(const LocalServeOptions& options) {
  // Block the stop signals before any thread starts, so that only sigwait below sees them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  local::Store store;
  local::ApiServer server(store, "127.0.0.1", options.port);
  std::unique_ptr<local::PodRunner> runner;
  std::string node_name;
  if (options.node) {
    const local::LocalMachine machine = local::detect_local_machine();
    local::register_local_node(store, machine);
    node_name = machine.node_name;
    std::filesystem::create_directories(options.workdir);
    local::PodRunnerOptions runner_options;
    runner_options.node_name = machine.node_name;
    runner_options.work_dir = std::filesystem::absolute(options.workdir).string();
    runner_options.worker_binary =
        options.worker_binary.empty() ? find_worker_binary() : options.worker_binary;
    // A pod reaches this server with its ServiceAccount's token, so RBAC applies to it.
    runner_options.service_account_kubeconfig = [&server](const std::string& ns,
                                                          const std::string& account) {
      return server.service_account_kubeconfig(ns, account);
    };
    runner = std::make_unique<local::PodRunner>(store, runner_options);
  }
  // The namespaces every cluster has.
  for (const char* ns : {"default", "kube-system", "kube-public", "kube-node-lease"}) {
    store.create(local::kNamespaces, "",
                 {{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", ns}}}});
  }
  if (runner) {
    server.set_pod_logs([&runner](const std::string& ns, const std::string& name) {
      return runner->log_path(ns, name);
    });
  }
  // The controller manager's part: Deployments get ReplicaSets and pods, PDBs their status.
  local::DeploymentController deployments(store);
  server.start();
  deployments.start();
  if (runner) runner->start();
  if (!options.kubeconfig_out.empty()) server.write_kubeconfig(options.kubeconfig_out);
  std::printf("kubetrain local control plane serving at %s\n", server.url().c_str());
  if (runner) {
    std::printf("node %s: pods run as local processes, logs under %s/pods\n", node_name.c_str(),
                options.workdir.c_str());
  }
  if (!options.kubeconfig_out.empty()) {
    std::printf("kubeconfig written to %s\n", options.kubeconfig_out.c_str());
  }
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  std::printf("kubetrain local control plane: stopping (signal %d)\n", signal_number);
  std::fflush(stdout);
  deployments.stop();  // no replacement pods while the node shuts down
  if (runner) runner->stop();  // SIGTERM to the pods' processes first
  server.stop();
  return 0;
}

}  // namespace kt::cli

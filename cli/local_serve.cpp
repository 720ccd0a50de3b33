#include "cli/local_serve.h"

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/run.h"
#include "local/builtin_resources.h"
#include "local/deployment_controller.h"
#include "local/http_api.h"
#include "local/local_node.h"
#include "local/pod_runner.h"
#include "local/scheduler.h"
#include "local/simulated_kubelet.h"
#include "local/store.h"

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
    runner_options.bind_pods = options.simulated.count == 0;  // else the Scheduler binds
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
  // Simulated nodes: their Nodes, the scheduler for all nodes, and their fake kubelet.
  std::unique_ptr<local::Scheduler> scheduler;
  std::unique_ptr<local::SimulatedKubelet> simulated_kubelet;
  const auto simulation_started = std::chrono::steady_clock::now();
  if (options.simulated.count > 0) {
    local::register_simulated_nodes(store, options.simulated);
    local::SimulatedKubeletOptions kubelet_options;
    for (int i = 0; i < options.simulated.count; ++i)
      kubelet_options.nodes.insert(local::simulated_node_name(options.simulated, i));
    const auto millis = [](double seconds) {
      return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000 + 0.5));
    };
    kubelet_options.start_delay = millis(options.simulated_pod_start_delay_seconds);
    kubelet_options.run_duration = millis(options.simulated_pod_duration_seconds);
    scheduler = std::make_unique<local::Scheduler>(store);
    simulated_kubelet = std::make_unique<local::SimulatedKubelet>(store, kubelet_options);
  }
  const double simulation_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - simulation_started).count();
  if (runner) {
    server.set_pod_logs([&runner](const std::string& ns, const std::string& name) {
      return runner->log_path(ns, name);
    });
  }
  // The controller manager's part: Deployments get ReplicaSets and pods, PDBs their status.
  local::DeploymentController deployments(store);
  if (options.fault_rate > 0) {
    local::Faults faults;
    faults.error_rate = options.fault_rate;
    faults.seed = options.fault_seed;
    server.set_faults(faults);
  }
  server.start();
  deployments.start();
  if (runner) runner->start();
  if (scheduler) scheduler->start();
  if (simulated_kubelet) simulated_kubelet->start();
  if (!options.kubeconfig_out.empty()) server.write_kubeconfig(options.kubeconfig_out);
  std::printf("kubetrain local control plane serving at %s\n", server.url().c_str());
  if (runner) {
    std::printf("node %s: pods run as local processes, logs under %s/pods\n", node_name.c_str(),
                options.workdir.c_str());
  }
  if (options.simulated.count > 0) {
    std::printf("%d simulated nodes %s..%s (%d x %s each), registered in %.2f s: their pods run no "
                "process\n",
                options.simulated.count, local::simulated_node_name(options.simulated, 0).c_str(),
                local::simulated_node_name(options.simulated, options.simulated.count - 1).c_str(),
                options.simulated.gpus_per_node, options.simulated.gpu_product.c_str(),
                simulation_seconds);
  }
  if (!options.kubeconfig_out.empty()) {
    std::printf("kubeconfig written to %s\n", options.kubeconfig_out.c_str());
  }
  if (options.fault_rate > 0) {
    std::printf("injecting faults: %g of resource requests answered 500 or 429, watches end "
                "early (seed %llu)\n",
                options.fault_rate, static_cast<unsigned long long>(options.fault_seed));
  }
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  std::printf("kubetrain local control plane: stopping (signal %d)\n", signal_number);
  std::fflush(stdout);
  deployments.stop();  // no replacement pods while the node shuts down
  if (simulated_kubelet) simulated_kubelet->stop();
  if (scheduler) scheduler->stop();
  if (runner) runner->stop();  // SIGTERM to the pods' processes first
  server.stop();
  return 0;
}

}  // namespace kt::cli

// `kubetrain local serve`: the local control plane over HTTP on 127.0.0.1, with a kubeconfig
// for kubectl and the operator (docs/KUBE.md). The same control plane as `kubetrain run`: the
// Store, this machine registered as a Node, and the pod runner that runs bound pods as local
// processes — only the reconciler is not in-process (the operator binary brings it over HTTP).
#pragma once

#include <cstdint>
#include <string>

#include "local/simulated_nodes.h"

namespace kt::cli {

struct LocalServeOptions {
  int port = 0;                // 0: a free one
  std::string kubeconfig_out;  // "" writes none
  bool node = true;            // register this machine and run pods; false: the API only
  std::string workdir = "kubetrain-local";  // pod logs and volumes
  std::string worker_binary;   // default: find_worker_binary()
  double fault_rate = 0;       // local::Faults::error_rate (chaos tests); 0: none
  uint64_t fault_seed = 0;
  // Simulated nodes (local/simulated_nodes.h): count 0 adds none. With any, the scheduler.h
  // Scheduler binds pods to every node (this one too) and the fake kubelet runs theirs.
  local::SimulatedNodeOptions simulated;
  double simulated_pod_start_delay_seconds = 1;  // bound -> Running
  double simulated_pod_duration_seconds = 0;     // Running -> Succeeded; 0: until deleted
};

// Serves until SIGINT or SIGTERM. Prints the URL (and the kubeconfig path) on stdout once
// serving. Returns the exit code.
int local_serve(const LocalServeOptions& options);

}  // namespace kt::cli

// Simulated nodes for scale tests (docs/KUBE.md, like KWOK): Nodes that exist only in the store,
// with the labels NVIDIA GPU Feature Discovery sets on a GPU node and the capacity of a DGX-class
// server, so that the operator's inventory and planner see a large GPU cluster. Their pods run
// no process: scheduler.h binds pods to them and simulated_kubelet.h plays their kubelet.
#pragma once

#include <cstdint>
#include <string>

#include "operator/kube/client.h"

namespace kt::local {

// On every simulated Node: "true". The fake kubelet serves the nodes that carry it.
inline constexpr const char* kSimulatedNodeLabel = "kubetrain.dev/simulated";

struct SimulatedNodeOptions {
  int count = 0;
  std::string name_prefix = "sim-node-";              // sim-node-00000, sim-node-00001, ...
  std::string gpu_product = "NVIDIA-H100-80GB-HBM3";  // GFD spelling
  int gpus_per_node = 8;
  // nvidia.com/gpu.memory in MiB: what nvidia-smi (and so GFD) reports for an H100 SXM 80GB.
  int64_t gpu_memory_mib = 81559;
  // Per node, as a DGX H100: 2 × Xeon 8480C, 112 cores (224 threads), 2 TiB (NVIDIA DGX H100
  // datasheet). Allocatable = capacity (no system reservation).
  int64_t cpu_cores = 224;
  int64_t memory_gib = 2048;
  int64_t max_pods = 110;  // the kubelet's default maxPods
};

// "sim-node-00042": the index zero-padded to 5 digits (more when count needs it).
std::string simulated_node_name(const SimulatedNodeOptions& options, int index);

// The Node object of simulated node `index`: labels kubernetes.io/hostname, kubernetes.io/os,
// node.kubernetes.io/instance-type, nvidia.com/gpu.product, .count, .memory, .present=true and
// kSimulatedNodeLabel; capacity and allocatable cpu, memory, pods, nvidia.com/gpu; Ready; an
// InternalIP in 10.64.0.0/10. The status is included (register_simulated_nodes writes it
// through the status subresource).
kube::Object simulated_node_object(const SimulatedNodeOptions& options, int index);

// Creates the options.count Nodes with their status. Throws the store's errors (a node of that
// name existing is AlreadyExists).
void register_simulated_nodes(kube::Client& client, const SimulatedNodeOptions& options);

}  // namespace kt::local

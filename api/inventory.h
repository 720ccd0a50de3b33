// The cluster inventory the planner plans for: nodes with their accelerators, CPUs and memory,
// each resolved to a HardwareProfile (built-in figures plus the node's overrides).
//
// Two file formats are read:
//  * our Inventory YAML (kind: Inventory; see examples/clusters/), with `replicas` for groups of
//    identical nodes, and
//  * `kubectl get nodes -o json` (kind: List of Node), using GPU Feature Discovery labels
//    (nvidia.com/gpu.product, nvidia.com/gpu.count, nvidia.com/gpu.memory in MiB) and
//    status.allocatable (nvidia.com/gpu, cpu, memory). A node without GPUs is a CPU node.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "api/hardware.h"
#include "api/yaml_json.h"

namespace kt::api {

struct Node {
  std::string name;
  std::string gpu_product;  // empty: a CPU-only node
  int64_t gpu_count = 0;    // allocatable GPUs
  int64_t free_gpus = 0;    // allocatable minus requests of running pods
  int64_t cpu_cores = 0;
  double memory_bytes = 0;  // host memory (allocatable)
  bool schedulable = true;  // false when cordoned, not Ready, or tainted not-ready/unreachable
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> annotations;
  HardwareProfile hardware;  // resolved: profile + overrides + the node's own GPU memory

  bool is_cpu_node() const { return gpu_count == 0; }
};

struct Inventory {
  std::string name;
  std::vector<Node> nodes;
};

// Both throw FieldError with paths such as "nodes[2].gpu.product" or
// "items[0].metadata.labels.nvidia.com/gpu.product".
Inventory decode_inventory(const Json& doc);
Inventory decode_kubectl_nodes(const Json& doc);
// One Node object of the Kubernetes API (an item of the above), `path` naming it in errors.
Node decode_kubectl_node(const Json& node, const std::string& path);
// Whether a core/v1 Node takes new pods: Ready (a node without a Ready condition counts as
// Ready), not cordoned, no not-ready/unreachable taint of effect NoSchedule or NoExecute.
bool node_accepts_pods(const Json& node);
// Detects the format by `kind`; throws Error ("<path>: <field>: <problem>" for a bad field).
// An empty cluster is an error.
Inventory load_inventory(const std::string& path);
Inventory inventory_from_document(const Json& doc, const std::string& source);

}  // namespace kt::api

// This machine as a Kubernetes Node (docs/OPERATIONS.md §3): its CPUs, memory and any NVIDIA GPUs,
// with the labels GPU Feature Discovery would set (nvidia.com/gpu.product, .memory in MiB, .count),
// so that api::decode_kubectl_nodes reads it like a cluster node and the planner plans for it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "operator/kube/client.h"

namespace kt::local {

struct LocalGpu {
  std::string product;  // GFD spelling: "NVIDIA-H100-80GB-HBM3" (spaces become '-')
  int64_t memory_mib = 0;
};

struct LocalMachine {
  std::string node_name;  // the hostname, as a valid node name
  int64_t cpu_cores = 1;
  int64_t memory_bytes = 0;
  std::vector<LocalGpu> gpus;
  // The CPU's bf16 matmul instructions (/proc/cpuinfo flags amx_bf16, avx512_bf16), labelled as
  // Node Feature Discovery does (feature.node.kubernetes.io/cpu-cpuid.AMXBF16, .AVX512BF16).
  bool amx_bf16 = false, avx512_bf16 = false;
};

// Reads this machine: sysconf for CPUs and memory; GPUs from `nvidia-smi` when it is on PATH,
// else /proc/driver/nvidia/gpus/*/information (no memory figure there). No GPU is not an error.
LocalMachine detect_local_machine();

// "NVIDIA H100 80GB HBM3" -> "NVIDIA-H100-80GB-HBM3" (what GFD puts in the product label).
std::string gfd_product_name(const std::string& name);

// The Node object: capacity and allocatable cpu, memory, pods and nvidia.com/gpu; Ready; the
// hostname label; the GFD labels when there are GPUs (all GPUs must be one product); the NFD
// cpu-cpuid labels of the bf16 instructions.
kube::Object local_node_object(const LocalMachine& machine);

// Creates the Node, or updates it when it exists (status through the status subresource).
void register_local_node(kube::Client& client, const LocalMachine& machine);

}  // namespace kt::local

#include "local/simulated_nodes.h"

#include <algorithm>
#include <cstdio>

namespace kt::local {

using kube::Object;

std::string simulated_node_name(const SimulatedNodeOptions& options, int index) {
  const int digits = std::max<int>(5, static_cast<int>(std::to_string(options.count - 1).size()));
  char number[32];
  std::snprintf(number, sizeof number, "%0*d", digits, index);
  return options.name_prefix + number;
}

Object simulated_node_object(const SimulatedNodeOptions& options, int index) {
  const std::string name = simulated_node_name(options, index);
  const std::string gpus = std::to_string(options.gpus_per_node);
  const Object labels = {
      {"kubernetes.io/hostname", name},
      {"kubernetes.io/os", "linux"},
      {"kubernetes.io/arch", "amd64"},
      {"node.kubernetes.io/instance-type", "sim-" + gpus + "x-" + options.gpu_product},
      {"nvidia.com/gpu.present", "true"},
      {"nvidia.com/gpu.product", options.gpu_product},
      {"nvidia.com/gpu.count", gpus},
      {"nvidia.com/gpu.memory", std::to_string(options.gpu_memory_mib)},
      {kSimulatedNodeLabel, "true"}};
  const Object resources = {{"cpu", std::to_string(options.cpu_cores)},
                            {"memory", std::to_string(options.memory_gib) + "Gi"},
                            {"pods", std::to_string(options.max_pods)},
                            {"nvidia.com/gpu", gpus}};
  // 10.64.0.0/10 holds 4M addresses: index 0 is 10.64.0.1.
  const int host = index + 1;
  const std::string ip = "10." + std::to_string(64 + (host >> 16)) + "." +
                         std::to_string((host >> 8) & 255) + "." + std::to_string(host & 255);
  return {
      {"apiVersion", "v1"},
      {"kind", "Node"},
      {"metadata", {{"name", name}, {"labels", labels}}},
      {"spec", Object::object()},
      {"status",
       {{"capacity", resources},
        {"allocatable", resources},
        {"addresses",
         {{{"type", "InternalIP"}, {"address", ip}}, {{"type", "Hostname"}, {"address", name}}}},
        {"nodeInfo",
         {{"kubeletVersion", "v1.32.0-kubetrain-simulated"},
          {"operatingSystem", "linux"},
          {"architecture", "amd64"}}},
        {"conditions",
         {{{"type", "Ready"},
           {"status", "True"},
           {"reason", "KubeletReady"},
           {"message", "kubetrain simulated node"}}}}}}};
}

void register_simulated_nodes(kube::Client& client, const SimulatedNodeOptions& options) {
  for (int i = 0; i < options.count; ++i) {
    const Object want = simulated_node_object(options, i);
    Object stored = client.create(kube::kNodes, "", want);
    stored["status"] = want["status"];  // create() drops the status of a status subresource
    client.update_status(kube::kNodes, "", stored);
  }
}

}  // namespace kt::local

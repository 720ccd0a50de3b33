// libFuzzer harness: cluster inventories (api/inventory.h) in both formats the planner reads,
// our Inventory YAML and `kubectl get nodes -o json`. Any input must give an inventory or be
// refused with kt::Error; every node of an inventory must be one the planner can plan for.
//   fuzz/run.sh inventory 60
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "api/error.h"
#include "api/inventory.h"
#include "api/yaml_json.h"
#include "fuzz/fuzz_check.h"

namespace {

bool positive(double x) { return std::isfinite(x) && x > 0; }

void check(const kt::api::Json& doc) {
  kt::api::Inventory inventory;
  try {
    inventory = kt::api::inventory_from_document(doc, "cluster.yaml");
  } catch (const kt::Error&) {
    return;
  }
  FUZZ_CHECK(!inventory.nodes.empty(), "an empty inventory was accepted");
  for (const kt::api::Node& node : inventory.nodes) {
    const std::string what = "node " + node.name;
    FUZZ_CHECK(node.gpu_count >= 0 && node.free_gpus >= 0 && node.free_gpus <= node.gpu_count,
               what + ": gpus " + std::to_string(node.free_gpus) + "/" +
                   std::to_string(node.gpu_count));
    FUZZ_CHECK(node.cpu_cores >= 0 && std::isfinite(node.memory_bytes) && node.memory_bytes >= 0,
               what + ": cpu or memory");
    const kt::api::HardwareProfile& hw = node.hardware;
    FUZZ_CHECK(hw.achieved_fraction > 0 && hw.achieved_fraction <= 1, what + ": achieved fraction");
    FUZZ_CHECK(positive(hw.peak_fp32_flops) || positive(hw.peak_bf16_flops), what + ": peak");
    FUZZ_CHECK(std::isfinite(hw.host_link_bandwidth) && std::isfinite(hw.intra_allreduce_busbw) &&
                   std::isfinite(hw.inter_node_bandwidth) && std::isfinite(hw.allreduce_latency) &&
                   std::isfinite(hw.memory_bytes),
               what + ": a non-finite figure");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(kt::fuzz::as_text(data, size));
  try {
    check(kt::api::yaml_to_json(text, "cluster.yaml"));
  } catch (const kt::Error&) {
  }
  try {
    check(kt::api::parse_json(text, "nodes.json"));
  } catch (const kt::Error&) {
  }
  return 0;
}

#include "api/inventory.h"

#include <gtest/gtest.h>

#include "api/yaml_json.h"

#include "api/error.h"
#include "api/hardware.h"
#include "api/quantity.h"
#include "test_util.h"

namespace kt {
namespace {

TEST(Inventory, ReplicasExpandToNamedNodes) {
  const auto inv = test::cluster("3090x32-pcie");
  ASSERT_EQ(inv.nodes.size(), 8u);
  EXPECT_EQ(inv.nodes[0].name, "rtx3090-0");
  EXPECT_EQ(inv.nodes[7].name, "rtx3090-7");
  EXPECT_EQ(inv.nodes[3].gpu_count, 4);
  EXPECT_EQ(inv.nodes[3].free_gpus, 4);
  EXPECT_EQ(inv.nodes[3].hardware.name, "RTX-3090");
  EXPECT_EQ(inv.nodes[3].hardware.intra_link, api::LinkKind::kPcie);
  EXPECT_DOUBLE_EQ(inv.nodes[3].hardware.inter_node_bandwidth, 12.5e9);
}

TEST(Inventory, LinksOverrideTheProfile) {
  const auto pcie = test::cluster("3090x32-pcie");
  const auto nvlink = test::cluster("3090x32-nvlink");
  EXPECT_EQ(nvlink.nodes[0].hardware.intra_link, api::LinkKind::kNvlink);
  EXPECT_GT(nvlink.nodes[0].hardware.intra_allreduce_busbw,
            pcie.nodes[0].hardware.intra_allreduce_busbw);
}

TEST(Inventory, ReadsKubectlNodesWithGpuFeatureDiscoveryLabels) {
  const auto inv = api::load_inventory(test::source_path("tests/data/kubectl-nodes.json"));
  ASSERT_EQ(inv.nodes.size(), 2u);
  const auto& gpu = inv.nodes[0];
  EXPECT_EQ(gpu.gpu_count, 8);
  EXPECT_EQ(gpu.cpu_cores, 111);  // 111500m, whole cores
  EXPECT_EQ(gpu.hardware.name, "H100-SXM");
  EXPECT_DOUBLE_EQ(gpu.hardware.memory_bytes, 81559 * api::kMiB);  // the label wins
  EXPECT_DOUBLE_EQ(gpu.hardware.inter_node_bandwidth, 100e9);      // the annotation wins
  const auto& cpu = inv.nodes[1];
  EXPECT_TRUE(cpu.is_cpu_node());
  EXPECT_FALSE(cpu.schedulable);
  EXPECT_TRUE(cpu.hardware.is_cpu);
  EXPECT_DOUBLE_EQ(cpu.memory_bytes, 64 * api::kGiB);
}

TEST(Inventory, NodesThatAreNotReady_OrTaintedSo_TakeNoPods) {
  const api::Json ready = api::Json::parse(R"({"kind": "Node", "metadata": {"name": "a"},
      "status": {"allocatable": {"cpu": "4", "memory": "8Gi"},
                 "conditions": [{"type": "MemoryPressure", "status": "False"},
                                {"type": "Ready", "status": "True"}]}})");
  EXPECT_TRUE(api::decode_kubectl_node(ready, "n").schedulable);
  for (const char* status : {"False", "Unknown"}) {
    api::Json node = ready;
    node["status"]["conditions"][1]["status"] = status;
    EXPECT_FALSE(api::decode_kubectl_node(node, "n").schedulable) << status;
  }
  api::Json no_conditions = ready;
  no_conditions["status"].erase("conditions");
  EXPECT_TRUE(api::decode_kubectl_node(no_conditions, "n").schedulable);
  for (const char* key : {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}) {
    api::Json node = ready;
    node["spec"]["taints"] = {{{"key", key}, {"effect", "NoExecute"}}};
    EXPECT_FALSE(api::decode_kubectl_node(node, "n").schedulable) << key;
  }
  api::Json other_taint = ready;
  other_taint["spec"]["taints"] = {{{"key", "nvidia.com/gpu"}, {"effect", "NoSchedule"}}};
  EXPECT_TRUE(api::decode_kubectl_node(other_taint, "n").schedulable);
  api::Json cordoned = ready;
  cordoned["spec"]["unschedulable"] = true;
  EXPECT_FALSE(api::node_accepts_pods(cordoned));
}

// GPU Feature Discovery's memory label is outside data: 10^20 MiB was once planned with.
TEST(Inventory, GpuMemoryLabelBeyondAnyGpu_IsAFieldError) {
  api::Json nodes = api::load_document(test::source_path("tests/data/kubectl-nodes.json"));
  for (const char* value : {"99999999999999999999", "0", "-5", "1e400", "lots"}) {
    nodes["items"][0]["metadata"]["labels"]["nvidia.com/gpu.memory"] = value;
    try {
      api::decode_kubectl_nodes(nodes);
      ADD_FAILURE() << "accepted " << value;
    } catch (const FieldError& e) {
      EXPECT_NE(e.path().find("nvidia.com/gpu.memory"), std::string::npos) << e.path();
    }
  }
  nodes["items"][0]["metadata"]["labels"]["nvidia.com/gpu.memory"] = "143771";
  EXPECT_DOUBLE_EQ(api::decode_kubectl_nodes(nodes).nodes[0].hardware.memory_bytes, 143771 * api::kMiB);
}

TEST(Inventory, UnknownProductNamesTheField) {
  try {
    test::inventory_from_yaml(
        "kind: Inventory\nnodes:\n- name: x\n  gpu: {product: NVIDIA-B999, count: 2}\n"
        "  cpu: {cores: 8}\n  memory: 64Gi\n");
    FAIL();
  } catch (const FieldError& e) {
    EXPECT_EQ(e.path(), "nodes[0].gpu.product");
    EXPECT_NE(e.problem().find("unknown GPU product \"NVIDIA-B999\""), std::string::npos);
  }
}

TEST(Inventory, EmptyClusterIsAnError) {
  EXPECT_THROW(test::inventory_from_yaml("kind: Inventory\nnodes: []\n"), FieldError);
  EXPECT_THROW(test::inventory_from_yaml("kind: Deployment\n"), Error);
}

// The path of the FieldError an inventory document raises ("" when it decodes).
std::string error_path(const std::string& yaml) {
  try {
    test::inventory_from_yaml(yaml);
    return "";
  } catch (const FieldError& e) {
    return e.path() + ": " + e.problem();
  }
}

TEST(Inventory, HugeCounts_AreFieldErrors_NotEndlessPlannerLoops) {
  // 10^18 cores once became the planner's per-node process search (one candidate per core).
  EXPECT_EQ(error_path("kind: Inventory\nnodes:\n- name: x\n  cpu: {cores: 1000000000000000000}\n"
                       "  memory: 64Gi\n"),
            "nodes[0].cpu.cores: 1000000000000000000 exceeds the limit of 65536");
  EXPECT_EQ(error_path("kind: Inventory\nnodes:\n- name: x\n  gpu: {product: H200, count: 100000}\n"
                       "  cpu: {cores: 8}\n  memory: 64Gi\n"),
            "nodes[0].gpu.count: 100000 exceeds the limit of 1024");
  EXPECT_EQ(error_path("kind: Inventory\nnodes:\n- name: x\n  replicas: 1000000000\n  cpu: {cores: 8}\n"
                       "  memory: 64Gi\n"),
            "nodes[0].replicas: 1000000000 must be between 1 and 65536");
  EXPECT_EQ(error_path("kind: Inventory\nnodes:\n- {name: x, replicas: 40000, cpu: {cores: 8}, memory: 64Gi}\n"
                       "- {name: y, replicas: 40000, cpu: {cores: 8}, memory: 64Gi}\n"),
            "nodes[1].replicas: the inventory would hold more than 65536 nodes");
  // kubectl's node list: allocatable quantities are doubles, checked before the integer cast.
  EXPECT_EQ(error_path("kind: List\napiVersion: v1\nitems:\n- metadata: {name: n}\n"
                       "  status: {allocatable: {cpu: \"1e300\", memory: 64Gi}}\n"),
            "items[0].status.allocatable.cpu: 1e+300 must be between 0 and 65536");
}

// Found by fuzz/inventory_fuzz.cpp: a `kind` that was not a string threw nlohmann's type_error
// out of the decoder (an abort in `kubetrain plan --cluster`).
TEST(Inventory, KindThatIsNotAString_IsAFieldError) {
  EXPECT_EQ(error_path("kind: {name: gpu-a}\nnodes: []\n"), "kind: must be a string, got a map");
  EXPECT_EQ(error_path("kind: List\nitems:\n- {kind: 7, metadata: {name: n}}\n"),
            "items[0].kind: must be Node");
}

TEST(Inventory, BadAnnotationNamesTheKey) {
  try {
    test::inventory_from_yaml(
        "kind: Inventory\nnodes:\n- name: x\n  gpu: {product: H200, count: 1}\n  cpu: {cores: 8}\n"
        "  memory: 64Gi\n  annotations: {kubetrain.dev/pcie-gbps: fast}\n");
    FAIL();
  } catch (const FieldError& e) {
    EXPECT_EQ(e.path(), "nodes[0].annotations.kubetrain.dev/pcie-gbps");
  }
}

TEST(Hardware, ProfilesMatchGfdNamesAndCarrySources) {
  for (const char* name :
       {"NVIDIA-H200", "nvidia h200", "H200", "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB",
        "NVIDIA-A100-PCIE-40GB", "NVIDIA-L40S", "NVIDIA-L4", "NVIDIA-GeForce-RTX-4090",
        "NVIDIA-GeForce-RTX-3090", "Tesla-V100-SXM2-32GB", "Tesla-T4", "NVIDIA-H100-PCIe"}) {
    EXPECT_NE(api::find_profile(name), nullptr) << name;
  }
  EXPECT_EQ(api::find_profile("NVIDIA-L4")->name, "L4");
  EXPECT_EQ(api::find_profile("NVIDIA-L40S")->name, "L40S");
  for (const auto& p : api::builtin_profiles()) {
    EXPECT_FALSE(p.source.empty()) << p.name;
    EXPECT_GT(p.peak_bf16_flops, 0) << p.name;
    EXPECT_GT(p.memory_bytes, 0) << p.name;
    EXPECT_GT(p.intra_allreduce_busbw, 0) << p.name;
    EXPECT_GT(p.host_link_bandwidth, 0) << p.name;
    EXPECT_GT(p.achieved_fraction, 0) << p.name;
    EXPECT_LE(p.achieved_fraction, 1) << p.name;
  }
  EXPECT_TRUE(api::cpu_profile().is_cpu);
}

}  // namespace
}  // namespace kt

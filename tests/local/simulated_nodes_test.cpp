// Simulated nodes (KWOK-like): their Node objects, the scheduler that binds pods to them by
// requests and node selection, and the fake kubelet that runs their pods without processes.
#include "local/simulated_nodes.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <set>
#include <thread>

#include "api/inventory.h"
#include "local/scheduler.h"
#include "local/simulated_kubelet.h"
#include "local/store.h"

namespace kt::local {
namespace {

using kube::kNodes;
using kube::kPods;
using kube::Object;
using std::chrono::milliseconds;

// Polls until `condition` holds or the deadline passes; its last value.
bool within(milliseconds timeout, const std::function<bool()>& condition) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return condition();
}

Object pod(const std::string& name, int gpus, Object extra_spec = Object::object()) {
  Object spec = {{"containers",
                  {{{"name", "worker"},
                    {"image", "kubetrain:dev"},
                    {"resources",
                     {{"requests", {{"nvidia.com/gpu", std::to_string(gpus)}, {"cpu", "8"}}},
                      {"limits", {{"nvidia.com/gpu", std::to_string(gpus)}}}}}}}}};
  spec.update(extra_spec);
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"namespace", "default"}}},
          {"spec", spec}};
}

std::string node_of(Store& store, const std::string& name) {
  return store.get(kPods, "default", name)["spec"].value("nodeName", "");
}
std::string phase_of(Store& store, const std::string& name) {
  const Object p = store.get(kPods, "default", name);
  return p.contains("status") ? p["status"].value("phase", "") : "";
}
// The PodScheduled=False condition's message, or "".
std::string pending_message(Store& store, const std::string& name) {
  const Object p = store.get(kPods, "default", name);
  if (!p.contains("status")) return "";
  for (const auto& c : p["status"].value("conditions", Object::array()))
    if (c["type"] == "PodScheduled" && c["status"] == "False" && c["reason"] == "Unschedulable")
      return c.value("message", "");
  return "";
}

SimulatedNodeOptions three_h100_nodes() {
  SimulatedNodeOptions o;
  o.count = 3;
  return o;
}

TEST(SimulatedNodes, NodeObject_HasGfdLabelsAndAllocatable) {
  SimulatedNodeOptions o = three_h100_nodes();
  const Object node = simulated_node_object(o, 2);
  EXPECT_EQ(node["metadata"]["name"], "sim-node-00002");
  const Object& labels = node["metadata"]["labels"];
  EXPECT_EQ(labels["nvidia.com/gpu.product"], "NVIDIA-H100-80GB-HBM3");
  EXPECT_EQ(labels["nvidia.com/gpu.count"], "8");
  EXPECT_EQ(labels["nvidia.com/gpu.memory"], "81559");
  EXPECT_EQ(labels["nvidia.com/gpu.present"], "true");
  EXPECT_EQ(labels["kubernetes.io/hostname"], "sim-node-00002");
  EXPECT_EQ(labels["node.kubernetes.io/instance-type"], "sim-8x-NVIDIA-H100-80GB-HBM3");
  EXPECT_EQ(node["status"]["allocatable"]["nvidia.com/gpu"], "8");
  EXPECT_EQ(node["status"]["allocatable"]["cpu"], "224");
  EXPECT_EQ(node["status"]["allocatable"]["memory"], "2048Gi");
  EXPECT_EQ(node["status"]["allocatable"]["pods"], "110");
  EXPECT_EQ(node["status"]["conditions"][0]["type"], "Ready");
  EXPECT_EQ(node["status"]["conditions"][0]["status"], "True");
}

TEST(SimulatedNodes, Names_AreZeroPaddedToTheCount) {
  SimulatedNodeOptions o;
  o.count = 10;
  EXPECT_EQ(simulated_node_name(o, 7), "sim-node-00007");
  o.count = 200000;
  EXPECT_EQ(simulated_node_name(o, 7), "sim-node-000007");
}

TEST(SimulatedNodes, Registered_ThePlannerSeesEightH100sPerNode) {
  Store store;
  register_simulated_nodes(store, three_h100_nodes());
  const Object list = {{"kind", "List"}, {"items", store.list(kNodes, "", {}).items}};
  const api::Inventory inv = api::decode_kubectl_nodes(list);
  ASSERT_EQ(inv.nodes.size(), 3u);
  EXPECT_EQ(inv.nodes[0].name, "sim-node-00000");
  EXPECT_FALSE(inv.nodes[0].is_cpu_node());
  EXPECT_EQ(inv.nodes[0].gpu_count, 8);
  EXPECT_EQ(inv.nodes[0].gpu_product, "NVIDIA-H100-80GB-HBM3");
  EXPECT_EQ(inv.nodes[0].cpu_cores, 224);
}

// ---- the fit rules, without a store ----

SchedulableNode node_with(double gpus, std::map<std::string, std::string> labels = {}) {
  SchedulableNode n;
  n.name = "n";
  n.labels = std::move(labels);
  n.allocatable = {gpus, 64, 512.0 * (1 << 30), 110};
  n.ready = true;
  return n;
}

TEST(SchedulerFit, FitsBesideOthers_UntilTheGpusRunOut) {
  const PodNeeds four = pod_needs(pod("p", 4));
  EXPECT_TRUE(unfit_reasons(four, node_with(8), {}).empty());
  EXPECT_TRUE(unfit_reasons(four, node_with(8), {4, 8, 0, 1}).empty());
  EXPECT_EQ(unfit_reasons(four, node_with(8), {5, 8, 0, 1}),
            std::vector<std::string>{"Insufficient nvidia.com/gpu"});
}

TEST(SchedulerFit, EveryShortResourceIsNamed) {
  const PodNeeds four = pod_needs(pod("p", 4));
  EXPECT_EQ(unfit_reasons(four, node_with(8), {8, 60, 0, 110}),
            (std::vector<std::string>{"Too many pods", "Insufficient cpu",
                                      "Insufficient nvidia.com/gpu"}));
}

TEST(SchedulerFit, NodeSelectorAndRequiredAffinity_MustMatch) {
  const SchedulableNode h100 =
      node_with(8, {{"nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"}, {"zone", "a"}});
  const std::string mismatch = "node(s) didn't match Pod's node affinity/selector";
  EXPECT_TRUE(
      unfit_reasons(pod_needs(pod("p", 1, {{"nodeSelector", {{"zone", "a"}}}})), h100, {}).empty());
  EXPECT_EQ(unfit_reasons(pod_needs(pod("p", 1, {{"nodeSelector", {{"zone", "b"}}}})), h100, {}),
            std::vector<std::string>{mismatch});
  const auto affinity = [](const std::string& op, Object values) {
    return Object{{"affinity",
                   {{"nodeAffinity",
                     {{"requiredDuringSchedulingIgnoredDuringExecution",
                       {{"nodeSelectorTerms",
                         {{{"matchExpressions",
                            {{{"key", "nvidia.com/gpu.product"},
                              {"operator", op},
                              {"values", values}}}}}}}}}}}}}};
  };
  EXPECT_TRUE(unfit_reasons(
                  pod_needs(pod(
                      "p", 1, affinity("In", {"NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"}))),
                  h100, {})
                  .empty());
  EXPECT_EQ(
      unfit_reasons(pod_needs(pod("p", 1, affinity("In", {"NVIDIA-A100-SXM4-80GB"}))), h100, {}),
      std::vector<std::string>{mismatch});
  EXPECT_EQ(
      unfit_reasons(pod_needs(pod("p", 1, affinity("NotIn", {"NVIDIA-H100-80GB-HBM3"}))), h100, {}),
      std::vector<std::string>{mismatch});
  EXPECT_TRUE(
      unfit_reasons(pod_needs(pod("p", 1, affinity("Exists", Object::array()))), h100, {}).empty());
}

TEST(SchedulerFit, NotReadyAndCordonedNodesTakeNothing) {
  SchedulableNode n = node_with(8);
  n.ready = false;
  EXPECT_EQ(
      unfit_reasons(pod_needs(pod("p", 1)), n, {}),
      std::vector<std::string>{"node(s) had untolerated taint {node.kubernetes.io/not-ready: }"});
  n.ready = true;
  n.unschedulable = true;
  EXPECT_EQ(unfit_reasons(pod_needs(pod("p", 1)), n, {}),
            std::vector<std::string>{"node(s) were unschedulable"});
}

TEST(SchedulerFit, Message_CountsNodesPerReasonLikeKubeScheduler) {
  EXPECT_EQ(unschedulable_message(3, {{"Insufficient nvidia.com/gpu", 2},
                                      {"node(s) didn't match Pod's node affinity/selector", 1}}),
            "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 "
            "Insufficient nvidia.com/gpu.");
  EXPECT_EQ(unschedulable_message(0, {}), "0/0 nodes are available.");
}

// ---- the scheduler and the fake kubelet against a store ----

struct SimulatedCluster : ::testing::Test {
  Store store;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<SimulatedKubelet> kubelet;

  void start(milliseconds start_delay, milliseconds run_duration = milliseconds(0)) {
    const SimulatedNodeOptions nodes = three_h100_nodes();
    register_simulated_nodes(store, nodes);
    SchedulerOptions scheduler_options;
    scheduler_options.interval = milliseconds(10);
    scheduler = std::make_unique<Scheduler>(store, scheduler_options);
    SimulatedKubeletOptions kubelet_options;
    for (int i = 0; i < nodes.count; ++i)
      kubelet_options.nodes.insert(simulated_node_name(nodes, i));
    kubelet_options.start_delay = start_delay;
    kubelet_options.run_duration = run_duration;
    kubelet_options.interval = milliseconds(10);
    kubelet = std::make_unique<SimulatedKubelet>(store, kubelet_options);
    scheduler->start();
    kubelet->start();
  }
  void TearDown() override {
    if (kubelet) kubelet->stop();
    if (scheduler) scheduler->stop();
  }
};

TEST_F(SimulatedCluster, PodsFillNodesInOrder_AndOneThatFitsNowhereStaysPending) {
  start(milliseconds(0));
  for (int i = 0; i < 4; ++i) store.create(kPods, "default", pod("w" + std::to_string(i), 6));
  // Three 8-GPU nodes take one 6-GPU pod each; the fourth fits on none.
  ASSERT_TRUE(within(milliseconds(10000), [&] {
    return !pending_message(store, "w3").empty() && !node_of(store, "w2").empty();
  }));
  std::set<std::string> used;
  for (int i = 0; i < 3; ++i) used.insert(node_of(store, "w" + std::to_string(i)));
  EXPECT_EQ(used, (std::set<std::string>{"sim-node-00000", "sim-node-00001", "sim-node-00002"}));
  EXPECT_EQ(node_of(store, "w3"), "");
  EXPECT_EQ(phase_of(store, "w3"), "Pending");
  EXPECT_EQ(pending_message(store, "w3"),
            "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.");
  // A 2-GPU pod still fits beside a 6-GPU one.
  store.create(kPods, "default", pod("small", 2));
  EXPECT_TRUE(
      within(milliseconds(10000), [&] { return node_of(store, "small") == "sim-node-00000"; }));
  // Deleting a pod frees its GPUs: the pending one is bound to the node it left.
  const std::string freed = node_of(store, "w1");
  store.remove(kPods, "default", "w1");
  EXPECT_TRUE(within(milliseconds(10000), [&] { return node_of(store, "w3") == freed; }));
}

TEST_F(SimulatedCluster, NodeSelector_PicksTheNamedNode_OrSaysNoneMatches) {
  start(milliseconds(0));
  store.create(
      kPods, "default",
      pod("placed", 8, {{"nodeSelector", {{"kubernetes.io/hostname", "sim-node-00001"}}}}));
  store.create(kPods, "default",
               pod("nowhere", 1, {{"nodeSelector", {{"nvidia.com/gpu.product", "NVIDIA-B200"}}}}));
  EXPECT_TRUE(
      within(milliseconds(10000), [&] { return node_of(store, "placed") == "sim-node-00001"; }));
  EXPECT_TRUE(within(milliseconds(10000), [&] {
    return pending_message(store, "nowhere") ==
           "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.";
  }));
  EXPECT_EQ(node_of(store, "nowhere"), "");
}

TEST_F(SimulatedCluster, PodWaitsForItsClaim_AndIsBoundOnceTheClaimIs) {
  start(milliseconds(0));
  store.create(
      kPods, "default",
      pod("w", 8,
          {{"volumes", {{{"name", "ckpt"}, {"persistentVolumeClaim", {{"claimName", "data"}}}}}}}));
  EXPECT_TRUE(within(milliseconds(10000), [&] {
    return pending_message(store, "w") ==
           "0/3 nodes are available: persistentvolumeclaim \"data\" not found.";
  }));
  Object claim = store.create(kube::kPersistentVolumeClaims, "default",
                              {{"apiVersion", "v1"},
                               {"kind", "PersistentVolumeClaim"},
                               {"metadata", {{"name", "data"}, {"namespace", "default"}}},
                               {"spec", {{"accessModes", {"ReadWriteOnce"}}}}});
  EXPECT_TRUE(within(milliseconds(10000), [&] {
    return pending_message(store, "w") ==
           "0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims.";
  }));
  EXPECT_EQ(node_of(store, "w"), "");
  // Bound later (the local node's provisioner does it in local serve): only a claim changed.
  claim["status"] = {{"phase", "Bound"}};
  store.update_status(kube::kPersistentVolumeClaims, "default", claim);
  EXPECT_TRUE(within(milliseconds(10000), [&] { return node_of(store, "w") == "sim-node-00000"; }));
}

TEST_F(SimulatedCluster, RealNodeIsTriedFirst_GpuPodsGoOnToSimulatedOnes) {
  SimulatedNodeOptions real_options;
  real_options.count = 1;
  real_options.name_prefix = "zz-real-";
  real_options.gpus_per_node = 0;
  Object real = simulated_node_object(real_options, 0);
  real["metadata"]["labels"].erase(kSimulatedNodeLabel);
  Object stored = store.create(kNodes, "", real);
  stored["status"] = real["status"];
  store.update_status(kNodes, "", stored);
  start(milliseconds(0));
  Object cpu_only = pod("operator", 0);
  cpu_only["spec"]["containers"][0]["resources"] = {{"requests", {{"cpu", "1"}}}};
  store.create(kPods, "default", cpu_only);
  store.create(kPods, "default", pod("gpu", 8));
  EXPECT_TRUE(within(milliseconds(10000), [&] {
    return node_of(store, "operator") == "zz-real-00000" &&
           node_of(store, "gpu") == "sim-node-00000";
  }));
}

TEST_F(SimulatedCluster, PodIsRunningOnlyAfterTheStartDelay) {
  const milliseconds delay(300);
  start(delay);
  store.create(kPods, "default", pod("w", 8));
  ASSERT_TRUE(within(milliseconds(10000), [&] { return !node_of(store, "w").empty(); }));
  const auto bound = std::chrono::steady_clock::now();
  ASSERT_TRUE(within(milliseconds(10000), [&] { return phase_of(store, "w") == "Running"; }));
  // The kubelet saw the binding no earlier than this test did.
  EXPECT_GE(std::chrono::steady_clock::now() - bound, delay - milliseconds(20));
  const Object p = store.get(kPods, "default", "w");
  EXPECT_TRUE(p["status"]["containerStatuses"][0]["state"].contains("running"));
  EXPECT_EQ(p["status"]["containerStatuses"][0]["ready"], true);
  EXPECT_FALSE(p["status"].value("podIP", "").empty());
  EXPECT_EQ(kubelet->pods(), 1u);
}

TEST_F(SimulatedCluster, ExitCodeAnnotation_FailsOrCompletesThePodOnDemand) {
  start(milliseconds(0));
  store.create(kPods, "default", pod("fails", 8));
  Object completes = pod("completes", 8);
  completes["metadata"]["annotations"] = {{kSimulateExitCodeAnnotation, "0"}};
  store.create(kPods, "default", completes);
  ASSERT_TRUE(within(milliseconds(10000), [&] { return phase_of(store, "fails") == "Running"; }));
  EXPECT_TRUE(
      within(milliseconds(10000), [&] { return phase_of(store, "completes") == "Succeeded"; }));
  // Running until a test says otherwise: the annotation ends it with that exit code.
  EXPECT_EQ(phase_of(store, "fails"), "Running");
  store.merge_patch(kPods, "default", "fails",
                    {{"metadata", {{"annotations", {{kSimulateExitCodeAnnotation, "1"}}}}}});
  ASSERT_TRUE(within(milliseconds(10000), [&] { return phase_of(store, "fails") == "Failed"; }));
  const Object terminated =
      store.get(kPods, "default", "fails")["status"]["containerStatuses"][0]["state"]["terminated"];
  EXPECT_EQ(terminated["exitCode"], 1);
  EXPECT_EQ(terminated["reason"], "Error");
  EXPECT_EQ(
      store.get(kPods, "default",
                "completes")["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
      0);
  // Ended pods hold no GPUs: a full-node pod fits where they were.
  store.create(kPods, "default", pod("after", 8));
  store.create(kPods, "default", pod("after2", 8));
  store.create(kPods, "default", pod("after3", 8));
  EXPECT_TRUE(within(milliseconds(10000), [&] {
    return !node_of(store, "after").empty() && !node_of(store, "after2").empty() &&
           !node_of(store, "after3").empty();
  }));
}

TEST_F(SimulatedCluster, RunDuration_SucceedsThePodAfterItRanThatLong) {
  start(milliseconds(0), milliseconds(200));
  store.create(kPods, "default", pod("w", 1));
  ASSERT_TRUE(within(milliseconds(10000), [&] { return phase_of(store, "w") == "Running"; }));
  const auto running = std::chrono::steady_clock::now();
  ASSERT_TRUE(within(milliseconds(10000), [&] { return phase_of(store, "w") == "Succeeded"; }));
  EXPECT_GE(std::chrono::steady_clock::now() - running, milliseconds(150));
}

// ---- gangs: all or nothing ----

Object pod_group(const kube::Resource& resource, const std::string& name, int64_t min_member) {
  return {{"apiVersion", resource.api_version()},
          {"kind", "PodGroup"},
          {"metadata", {{"name", name}, {"namespace", "default"}}},
          {"spec", {{"minMember", min_member}}}};
}
Object in_group(Object p, const std::string& group) {
  p["metadata"]["labels"][kube::kCoschedulingPodGroupLabel] = group;
  return p;
}
int bound_count(Store& store, const std::vector<std::string>& names) {
  int n = 0;
  for (const auto& name : names) n += node_of(store, name).empty() ? 0 : 1;
  return n;
}

struct SimulatedGangs : SimulatedCluster {
  void SetUp() override {
    store.register_resource(kube::kCoschedulingPodGroups, true);
    store.register_resource(kube::kVolcanoPodGroups, true);
  }
};

TEST_F(SimulatedGangs, GangThatDoesNotFit_NeverHalfStarts_AndStartsOnceItFits) {
  start(milliseconds(0));
  // Another job's pod holds one of the three 8-GPU nodes: two of the gang's three would fit.
  store.create(kPods, "default", pod("blocker", 8));
  ASSERT_TRUE(within(milliseconds(10000), [&] { return !node_of(store, "blocker").empty(); }));
  store.create(kube::kCoschedulingPodGroups, "default",
               pod_group(kube::kCoschedulingPodGroups, "gang", 3));
  const std::vector<std::string> gang = {"g0", "g1", "g2"};
  for (const auto& name : gang) store.create(kPods, "default", in_group(pod(name, 8), "gang"));
  ASSERT_TRUE(within(milliseconds(10000), [&] {
    for (const auto& name : gang)
      if (pending_message(store, name).empty()) return false;
    return true;
  }));
  EXPECT_EQ(bound_count(store, gang), 0);
  EXPECT_EQ(pending_message(store, "g0"),
            "0/3 nodes are available: 3 Insufficient nvidia.com/gpu; pod group default/gang: 2 of "
            "its minMember 3 pods fit, so none is bound.");
  // Still none after more passes (a half-start would show up as one bound pod).
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(bound_count(store, gang), 0);
  // The node is freed: the whole gang is bound, each member on its own node.
  store.remove(kPods, "default", "blocker");
  ASSERT_TRUE(within(milliseconds(10000), [&] { return bound_count(store, gang) == 3; }));
  std::set<std::string> nodes;
  for (const auto& name : gang) nodes.insert(node_of(store, name));
  EXPECT_EQ(nodes.size(), 3u);
}

TEST_F(SimulatedGangs, GangWaitsForAllItsMembers_VolcanoAnnotationToo) {
  start(milliseconds(0));
  store.create(kube::kVolcanoPodGroups, "default", pod_group(kube::kVolcanoPodGroups, "v", 3));
  const auto volcano_pod = [](const std::string& name) {
    Object p = pod(name, 1, {{"schedulerName", "volcano"}});
    p["metadata"]["annotations"][kube::kVolcanoGroupAnnotation] = "v";
    return p;
  };
  store.create(kPods, "default", volcano_pod("v0"));
  store.create(kPods, "default", volcano_pod("v1"));
  ASSERT_TRUE(within(milliseconds(10000), [&] {
    return pending_message(store, "v1") ==
           "0/3 nodes are available: pod group default/v has 2 of its minMember 3 pods.";
  }));
  EXPECT_EQ(bound_count(store, {"v0", "v1"}), 0);
  store.create(kPods, "default", volcano_pod("v2"));
  EXPECT_TRUE(
      within(milliseconds(10000), [&] { return bound_count(store, {"v0", "v1", "v2"}) == 3; }));
}

TEST_F(SimulatedGangs, MissingPodGroup_KeepsItsPodsPendingAndSaysSo) {
  start(milliseconds(0));
  store.create(kPods, "default", in_group(pod("orphan", 1), "nowhere"));
  EXPECT_TRUE(within(milliseconds(10000), [&] {
    return pending_message(store, "orphan") ==
           "0/3 nodes are available: PodGroup default/nowhere (scheduling.x-k8s.io/v1alpha1) not "
           "found.";
  }));
  EXPECT_EQ(node_of(store, "orphan"), "");
}

TEST_F(SimulatedGangs, KueueGroup_GatedPodsWait_AndTheGroupStartsWhenUngated) {
  start(milliseconds(0));
  const auto kueue_pod = [](const std::string& name, bool gated) {
    Object p = pod(name, 4, gated ? Object{{"schedulingGates",
                                            {{{"name", "kueue.x-k8s.io/admission"}}}}}
                                  : Object::object());
    p["metadata"]["labels"][kube::kKueuePodGroupLabel] = "job-a0";
    p["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "team";
    p["metadata"]["annotations"][kube::kKueuePodGroupTotalCountAnnotation] = "2";
    return p;
  };
  store.create(kPods, "default", kueue_pod("k0", false));
  store.create(kPods, "default", kueue_pod("k1", true));
  const auto gated_reason = [&] {
    const Object p = store.get(kPods, "default", "k1");
    if (!p.contains("status")) return std::string();
    for (const auto& c : p["status"].value("conditions", Object::array()))
      if (c["type"] == "PodScheduled" && c["status"] == "False") return c.value("reason", "");
    return std::string();
  };
  ASSERT_TRUE(within(milliseconds(10000), [&] {
    return gated_reason() == "SchedulingGated" &&
           pending_message(store, "k0") ==
               "0/3 nodes are available: pod group default/job-a0 has 1 of its minMember 2 pods.";
  }));
  EXPECT_EQ(bound_count(store, {"k0", "k1"}), 0);
  // Kueue admits the workload: it removes the gate.
  store.merge_patch(kPods, "default", "k1", {{"spec", {{"schedulingGates", nullptr}}}});
  EXPECT_TRUE(within(milliseconds(10000), [&] { return bound_count(store, {"k0", "k1"}) == 2; }));
}

TEST(SimulatedNodesScale, TenThousandNodesRegisterAndOnePodIsPlacedOnTheLastFreeOne) {
  Store store;
  SimulatedNodeOptions nodes;
  nodes.count = 10000;
  const auto t0 = std::chrono::steady_clock::now();
  register_simulated_nodes(store, nodes);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  Scheduler scheduler(store, SchedulerOptions{milliseconds(10)});
  scheduler.start();
  store.create(kPods, "default",
               pod("last", 8, {{"nodeSelector", {{"kubernetes.io/hostname", "sim-node-09999"}}}}));
  EXPECT_TRUE(
      within(milliseconds(30000), [&] { return node_of(store, "last") == "sim-node-09999"; }));
  scheduler.stop();
}

}  // namespace
}  // namespace kt::local

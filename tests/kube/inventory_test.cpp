// The inventory tracker (operator/controller/inventory.h): kept from informer events, it gives the
// same nodes, free figures and fingerprint as a LIST of every node and pod, through random pod and
// node changes; a job's own pods are given back to its plan only; a pod just created counts
// before its watch event; one bad node is left out instead of failing every plan.
#include "operator/controller/inventory.h"

#include <gtest/gtest.h>

#include <random>
#include <sstream>

#include "operator/controller/manager.h"
#include "operator/kube/objects.h"
#include "local/store.h"
#include "tests/support/eventually.h"
#include "tests/support/random.h"

namespace kt::controller {
namespace {

using namespace std::chrono_literals;
using kube::kNodes;
using kube::kPods;
using kube::Object;

kube::InformerTiming fast_timing() {
  kube::InformerTiming timing;
  timing.initial_backoff = 10ms;
  timing.max_backoff = 100ms;
  return timing;
}

Object gpu_node(const std::string& name, int gpus, const std::string& cpu = "64") {
  Object labels = {{"kubernetes.io/hostname", name}};
  Object allocatable = {{"cpu", cpu}, {"memory", "512Gi"}};
  if (gpus > 0) {
    labels["nvidia.com/gpu.product"] = "NVIDIA-H100-80GB-HBM3";
    labels["nvidia.com/gpu.count"] = std::to_string(gpus);
    labels["nvidia.com/gpu.memory"] = "81559";
    allocatable["nvidia.com/gpu"] = std::to_string(gpus);
  }
  return {{"metadata", {{"name", name}, {"labels", labels}}},
          {"status", {{"allocatable", allocatable}, {"capacity", allocatable}}}};
}

void put_node(local::Store& store, const Object& node) {
  const std::string name = node["metadata"]["name"];
  Object stored;
  try {
    stored = store.get(kNodes, "", name);
    stored["metadata"]["labels"] = node["metadata"]["labels"];
    if (node.contains("spec")) stored["spec"] = node["spec"];
    stored = store.update(kNodes, "", stored);
  } catch (const kube::ApiError& e) {
    if (!e.not_found()) throw;
    stored = store.create(kNodes, "", node);
  }
  stored["status"] = node["status"];
  store.update_status(kNodes, "", stored);
}

Object pod(const std::string& name, const std::string& job, double gpus, const std::string& cpu,
           const std::string& memory) {
  Object requests = {{"cpu", cpu}, {"memory", memory}};
  if (gpus > 0)  // as a quantity: "3", or "1500m" (the API takes an integer or a string)
    requests["nvidia.com/gpu"] = std::to_string(static_cast<int64_t>(gpus * 1000)) + "m";
  Object labels = Object::object();
  if (!job.empty()) labels[kJobNameLabel] = job;
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"labels", labels}}},
          {"spec",
           {{"containers",
             {{{"name", "c"}, {"image", "busybox"}, {"resources", {{"requests", requests}}}}}}}}};
}

// Everything a plan reads of an inventory, as text (so that a mismatch prints the difference).
std::string describe(const api::Inventory& inventory) {
  std::ostringstream out;
  for (const api::Node& n : inventory.nodes)
    out << n.name << " gpus " << n.free_gpus << "/" << n.gpu_count << " cores " << n.cpu_cores
        << " memory " << static_cast<int64_t>(n.memory_bytes) << " schedulable " << n.schedulable
        << " product " << n.gpu_product << " labels " << n.labels.size() << "\n";
  return out.str();
}

struct Seen {
  std::string free, allocatable, fingerprint;
};

Seen seen_by_tracker(InventoryTracker& tracker, const std::string& ns, const std::string& job) {
  Seen seen;
  tracker.with_inventory(ns, job, [&](const PlannerInventory& inv) {
    seen = {describe(inv.free), describe(inv.allocatable()), inv.fingerprint};
  });
  return seen;
}

Seen seen_by_listing(kube::Client& client, const std::string& ns, const std::string& job) {
  Seen seen;
  with_listed_inventory(client, ns, job, [&](const PlannerInventory& inv) {
    seen = {describe(inv.free), describe(inv.allocatable()), inv.fingerprint};
  });
  return seen;
}

local::Store& with_training_jobs(local::Store& store) {
  store.register_resource(kube::kTrainingJobs, true);  // the operator's cache watches them
  return store;
}

struct Cluster {
  local::Store store;
  local::Store& registered = with_training_jobs(store);
  kube::Cache cache{store, [] {
                      kube::CacheOptions options = operator_cache_options("", fast_timing());
                      return options;
                    }()};
  InventoryTracker tracker{cache};
  // The informers stop before the tracker their handlers call goes (members die in reverse).
  ~Cluster() { cache.stop(); }

  void start() {
    cache.start();
    ASSERT_TRUE(test::eventually([&] { return tracker.has_synced(); }, 10s, 5ms));
  }
  // Waits until the tracker has caught up with the Store, as seen by a plan of ns/job.
  ::testing::AssertionResult agrees(const std::string& ns, const std::string& job) {
    Seen listed, tracked;
    const bool same = test::eventually(
        [&] {
          listed = seen_by_listing(store, ns, job);
          tracked = seen_by_tracker(tracker, ns, job);
          return listed.free == tracked.free && listed.allocatable == tracked.allocatable &&
                 listed.fingerprint == tracked.fingerprint;
        },
        10s, 5ms);
    if (same) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "plan of " << ns << "/" << job << "\nlisted (" << listed.fingerprint << "):\n"
           << listed.free << "tracked (" << tracked.fingerprint << "):\n"
           << tracked.free;
  }
};

TEST(InventoryTracker, EqualsTheListedInventoryThroughRandomPodAndNodeChanges) {
  Cluster cluster;
  local::Store& store = cluster.store;
  for (int i = 0; i < 12; ++i)
    put_node(store, gpu_node("node-" + std::to_string(i), i % 4 == 3 ? 0 : 8));
  cluster.start();

  const unsigned seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const auto uniform = [&](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  const std::vector<std::string> namespaces = {"default", "team-a", "team-b"};
  const std::vector<std::string> jobs = {"a", "b", "c", ""};  // "": a pod of no job
  const std::vector<std::string> cpus = {"500m", "2", "100m", "1500m", "7"};
  const std::vector<std::string> memories = {"1Gi", "300Mi", "64Gi", "1000000000"};
  std::vector<std::pair<std::string, std::string>> pods;  // (ns, name) created so far
  int created = 0;

  for (int round = 0; round < 15; ++round) {
    for (int op = 0; op < 20; ++op) {
      const int kind = uniform(0, 9);
      if (kind <= 3 || pods.empty()) {  // a new pod: bound, pinned by nodeSelector, or unplaced
        const std::string ns = namespaces[uniform(0, 2)];
        const std::string name = "pod-" + std::to_string(created++);
        Object p = pod(name, jobs[uniform(0, 3)], uniform(0, 4) * (uniform(0, 3) == 0 ? 0.5 : 1),
                       cpus[uniform(0, 4)], memories[uniform(0, 3)]);
        const std::string node = "node-" + std::to_string(uniform(0, 13));  // 12, 13: no node
        const int placed = uniform(0, 2);
        if (placed == 0) p["spec"]["nodeName"] = node;
        if (placed == 1) p["spec"]["nodeSelector"] = {{"kubernetes.io/hostname", node}};
        store.create(kPods, ns, p);
        pods.emplace_back(ns, name);
      } else if (kind <= 5) {  // a phase change
        const auto& [ns, name] = pods[uniform(0, static_cast<int>(pods.size()) - 1)];
        Object p = store.get(kPods, ns, name);
        static const char* phases[] = {"Pending", "Running", "Succeeded", "Failed"};
        p["status"] = {{"phase", phases[uniform(0, 3)]}};
        store.update_status(kPods, ns, p);
      } else if (kind == 6) {  // bound by the scheduler
        const auto& [ns, name] = pods[uniform(0, static_cast<int>(pods.size()) - 1)];
        Object p = store.get(kPods, ns, name);
        if (p["spec"].value("nodeName", "").empty()) {
          p["spec"]["nodeName"] = "node-" + std::to_string(uniform(0, 11));
          store.update(kPods, ns, p);
        }
      } else if (kind == 7) {  // deleted
        const size_t i = static_cast<size_t>(uniform(0, static_cast<int>(pods.size()) - 1));
        store.remove(kPods, pods[i].first, pods[i].second);
        pods.erase(pods.begin() + static_cast<std::ptrdiff_t>(i));
      } else if (kind == 8) {  // a node cordoned, relabelled, resized, or added back
        const std::string name = "node-" + std::to_string(uniform(0, 13));
        Object node = gpu_node(name, uniform(0, 2) * 4, cpus[uniform(0, 4)] == "7" ? "7" : "64");
        if (uniform(0, 1)) node["spec"] = {{"unschedulable", true}};
        if (uniform(0, 1)) node["metadata"]["labels"]["pool"] = "p" + std::to_string(uniform(0, 2));
        put_node(store, node);
      } else {  // a node deleted
        const std::string name = "node-" + std::to_string(uniform(0, 13));
        try {
          store.remove(kNodes, "", name);
        } catch (const kube::ApiError& e) {
          if (!e.not_found()) throw;
        }
      }
    }
    for (const std::string& ns : namespaces)
      for (const char* job : {"a", "b", "none"})
        ASSERT_TRUE(cluster.agrees(ns, job)) << "round " << round;
  }
  EXPECT_EQ(cluster.tracker.rejected_nodes(), 0u);
}

TEST(InventoryTracker, GivesAJobItsOwnPodsBack_AndOnlyForItsPlan) {
  Cluster cluster;
  put_node(cluster.store, gpu_node("node-0", 8));
  cluster.start();
  Object p = pod("a-worker-0", "a", 8, "4", "16Gi");
  p["spec"]["nodeName"] = "node-0";
  cluster.store.create(kPods, "default", p);
  ASSERT_TRUE(cluster.agrees("default", "b"));

  const auto free_gpus = [&](const std::string& ns, const std::string& job) {
    int64_t free = -1;
    cluster.tracker.with_inventory(ns, job, [&](const PlannerInventory& inv) {
      free = inv.free.nodes.at(0).free_gpus;
      EXPECT_EQ(inv.allocatable().nodes.at(0).free_gpus, 8);
    });
    return free;
  };
  EXPECT_EQ(free_gpus("default", "b"), 0);
  EXPECT_EQ(free_gpus("default", "a"), 8);
  EXPECT_EQ(free_gpus("team-a", "a"), 0);   // another namespace's job of the same name
  EXPECT_EQ(free_gpus("default", "b"), 0);  // taken again after a's plan
  // ... also when the plan throws.
  EXPECT_THROW(cluster.tracker.with_inventory("default", "a",
                                              [](const PlannerInventory&) { throw Error("no"); }),
               Error);
  EXPECT_EQ(free_gpus("default", "b"), 0);
}

TEST(InventoryTracker, FingerprintFollowsTheFreeGpus_AndComesBackWhenThePodGoes) {
  Cluster cluster;
  put_node(cluster.store, gpu_node("node-0", 8));
  put_node(cluster.store, gpu_node("node-1", 8));
  cluster.start();
  const std::string before = seen_by_tracker(cluster.tracker, "default", "x").fingerprint;
  Object p = pod("other", "", 2, "1", "1Gi");
  p["spec"]["nodeName"] = "node-1";
  cluster.store.create(kPods, "default", p);
  ASSERT_TRUE(cluster.agrees("default", "x"));
  const Seen with_pod = seen_by_tracker(cluster.tracker, "default", "x");
  EXPECT_NE(with_pod.fingerprint, before);
  EXPECT_NE(with_pod.free.find("node-1 gpus 6/8"), std::string::npos) << with_pod.free;
  cluster.store.remove(kPods, "default", "other");
  ASSERT_TRUE(cluster.agrees("default", "x"));
  EXPECT_EQ(seen_by_tracker(cluster.tracker, "default", "x").fingerprint, before);
}

TEST(InventoryTracker, CountsAPodJustCreated_BeforeItsWatchEvent_AndOnceAfter) {
  Cluster cluster;
  put_node(cluster.store, gpu_node("node-0", 8));
  cluster.start();
  // The pod as the API answered its create; the tracker is told before any event arrives (the
  // informer is stopped, so none can).
  cluster.cache.stop();
  Object p = pod("a-worker-0", "a", 8, "4", "16Gi");
  p["spec"]["nodeSelector"] = {{"kubernetes.io/hostname", "node-0"}};
  const Object created = cluster.store.create(kPods, "default", p);
  cluster.tracker.expect(created);
  int64_t free = -1;
  cluster.tracker.with_inventory(
      "default", "b", [&](const PlannerInventory& inv) { free = inv.free.nodes.at(0).free_gpus; });
  EXPECT_EQ(free, 0);
  cluster.tracker.with_inventory(
      "default", "a", [&](const PlannerInventory& inv) { free = inv.free.nodes.at(0).free_gpus; });
  EXPECT_EQ(free, 8);  // its own job's plan gets it back
}

TEST(InventoryTracker, ExpectedPodCountedOnce_WhenTheInformerDeliversIt) {
  Cluster cluster;
  put_node(cluster.store, gpu_node("node-0", 8));
  cluster.start();
  Object p = pod("a-worker-0", "a", 3, "4", "16Gi");
  p["spec"]["nodeSelector"] = {{"kubernetes.io/hostname", "node-0"}};
  const Object created = cluster.store.create(kPods, "default", p);
  cluster.tracker.expect(created);  // before or after the event: either way counted once
  ASSERT_TRUE(cluster.agrees("default", "b"));
  const Seen seen = seen_by_tracker(cluster.tracker, "default", "b");
  EXPECT_NE(seen.free.find("node-0 gpus 5/8"), std::string::npos) << seen.free;
  // Deleted: nothing stays counted.
  cluster.store.remove(kPods, "default", "a-worker-0");
  ASSERT_TRUE(cluster.agrees("default", "b"));
  EXPECT_NE(seen_by_tracker(cluster.tracker, "default", "b").free.find("node-0 gpus 8/8"),
            std::string::npos);
}

// A reservation (pods rendered, their creates not yet sent) counts for other jobs' plans until
// the create's answer replaces it (counted once, not twice) or it is let go.
TEST(InventoryTracker, ReservedPodsCount_UntilCreatedOrLetGo) {
  Cluster cluster;
  put_node(cluster.store, gpu_node("node-0", 8));
  cluster.start();
  const auto free_for = [&](const std::string& job) {
    int64_t free = -1;
    cluster.tracker.with_inventory(
        "default", job, [&](const PlannerInventory& inv) { free = inv.free.nodes.at(0).free_gpus; });
    return free;
  };
  Object a0 = pod("a-worker-0", "a", 3, "4", "16Gi");
  a0["metadata"]["namespace"] = "default";
  a0["spec"]["nodeSelector"] = {{"kubernetes.io/hostname", "node-0"}};
  Object a1 = a0;
  a1["metadata"]["name"] = "a-worker-1";
  cluster.tracker.reserve({a0, a1});
  EXPECT_EQ(free_for("b"), 2);
  EXPECT_EQ(free_for("a"), 8);  // its own plan gets its reservations back
  cluster.tracker.reserve({a0});  // the same pod reserved again replaces, not adds
  EXPECT_EQ(free_for("b"), 2);
  // a-worker-0 is created: its reservation becomes the created pod (counted once).
  const Object created = cluster.store.create(kPods, "default", a0);
  cluster.tracker.expect(created);
  EXPECT_EQ(free_for("b"), 2);
  // a-worker-1's create failed: let go, only the created pod counts.
  cluster.tracker.unreserve({"default/a-worker-1", "default/never-reserved"});
  ASSERT_TRUE(cluster.agrees("default", "b"));
  EXPECT_EQ(free_for("b"), 5);
}

TEST(InventoryTracker, LeavesOutABadNode_AndTakesItBackWhenFixed) {
  Cluster cluster;
  put_node(cluster.store, gpu_node("good", 8));
  Object bad = gpu_node("bad", 8);
  bad["metadata"]["labels"].erase("nvidia.com/gpu.product");  // GPUs, but no GFD product label
  put_node(cluster.store, bad);
  cluster.start();
  ASSERT_TRUE(cluster.agrees("default", "x"));
  EXPECT_EQ(cluster.tracker.rejected_nodes(), 1u);
  Seen seen = seen_by_tracker(cluster.tracker, "default", "x");
  EXPECT_EQ(seen.free.find("bad "), std::string::npos) << seen.free;
  EXPECT_NE(seen.free.find("good "), std::string::npos) << seen.free;

  put_node(cluster.store, gpu_node("bad", 8));
  ASSERT_TRUE(cluster.agrees("default", "x"));
  EXPECT_EQ(cluster.tracker.rejected_nodes(), 0u);
  seen = seen_by_tracker(cluster.tracker, "default", "x");
  EXPECT_NE(seen.free.find("bad gpus 8/8"), std::string::npos) << seen.free;
}

TEST(OperatorCache, KeepsOfANodeWhatTheInventoryReads_AndDropsTheRest) {
  Cluster cluster;
  Object node = gpu_node("node-0", 8);
  node["status"]["images"] = Object::array();
  for (int i = 0; i < 50; ++i)
    node["status"]["images"].push_back(
        {{"names", {"registry.example/image-" + std::to_string(i) + ":v1"}}, {"sizeBytes", i}});
  node["status"]["conditions"] = {
      {{"type", "MemoryPressure"}, {"status", "False"}, {"message", std::string(512, 'm')}},
      {{"type", "Ready"}, {"status", "True"}, {"lastHeartbeatTime", "2026-12-03T00:00:00Z"}}};
  node["spec"] = {{"unschedulable", true}, {"podCIDR", "10.0.0.0/24"}};
  put_node(cluster.store, node);
  Object p = pod("p", "", 1, "1", "1Gi");
  p["metadata"]["managedFields"] = {{{"manager", "kubectl"}, {"operation", "Update"}}};
  p["spec"]["nodeSelector"] = {{"kubernetes.io/hostname", "node-0"}};
  p["spec"]["containers"][0]["env"] = {{{"name", "BIG"}, {"value", std::string(4096, 'x')}}};
  p["spec"]["volumes"] = {{{"name", "v"}, {"emptyDir", Object::object()}}};
  cluster.store.create(kPods, "default", p);
  cluster.start();
  ASSERT_TRUE(cluster.agrees("default", "x"));  // the trimmed node decodes as the full one

  const auto cached = cluster.cache.informer(kNodes)->get("", "node-0");
  ASSERT_TRUE(cached);
  EXPECT_FALSE(cached->at("status").contains("images"));
  // Of the conditions, Ready's type and status (whether the node takes pods).
  EXPECT_EQ(cached->at("status").at("conditions"),
            Object::parse(R"([{"type": "Ready", "status": "True"}])"));
  EXPECT_FALSE(cached->at("spec").contains("podCIDR"));
  EXPECT_TRUE(cached->at("spec").value("unschedulable", false));
  EXPECT_EQ(cached->at("status").at("allocatable").value("nvidia.com/gpu", ""), "8");
  EXPECT_EQ(cached->at("metadata").at("labels").value("nvidia.com/gpu.product", ""),
            "NVIDIA-H100-80GB-HBM3");
  EXPECT_FALSE(cached->at("metadata").at("resourceVersion").get<std::string>().empty());
  const auto cached_pod = cluster.cache.informer(kPods)->get("default", "p");
  ASSERT_TRUE(cached_pod);
  EXPECT_FALSE(cached_pod->at("metadata").contains("managedFields"));
  // Of a pod's spec, what the inventory and the controller read.
  const Object& spec = cached_pod->at("spec");
  EXPECT_FALSE(spec.contains("volumes"));
  EXPECT_FALSE(spec.at("containers").at(0).contains("env"));
  EXPECT_EQ(spec.at("containers").at(0).at("name"), "c");
  EXPECT_EQ(kube::pod_gpu_request(*cached_pod), 1);
  EXPECT_EQ(spec.at("nodeSelector").value("kubernetes.io/hostname", ""), "node-0");
}

TEST(InventoryTracker, RefusesACacheWithoutEveryPod) {
  local::Store store;
  kube::Cache cache(with_training_jobs(store), operator_cache_options("default", fast_timing()));
  EXPECT_THROW(InventoryTracker tracker(cache), Error);
}

}  // namespace
}  // namespace kt::controller

// The local control plane's Deployment, ReplicaSet and PodDisruptionBudget controller against a
// Store, with the test playing kubelet (pod status written directly; no processes) and a fake
// clock for the crash backoff. Expected values are the real controllers' (pkg/controller/
// deployment, replicaset, disruption) worked out by hand; what helm 4's --wait requires is
// kstatus' rules, restated below.
#include "local/deployment_controller.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <regex>

#include "local/builtin_resources.h"
#include "local/store.h"

namespace kt::local {
namespace {

using kube::kPods;
using kube::Object;

// kstatus (sigs.k8s.io/cli-utils pkg/kstatus/status: checkGeneration, deploymentConditions):
// when a Deployment is Current, which is what helm 4's --wait waits for.
bool kstatus_deployment_current(const Object& d) {
  const Object status = d.value("status", Object::object());
  if (status.contains("observedGeneration") &&
      status["observedGeneration"] != d["metadata"]["generation"])
    return false;
  const int64_t spec = d["spec"].value("replicas", int64_t{1});
  const int64_t replicas = status.value("replicas", int64_t{0});
  const int64_t updated = status.value("updatedReplicas", int64_t{0});
  const int64_t ready = status.value("readyReplicas", int64_t{0});
  const int64_t available = status.value("availableReplicas", int64_t{0});
  if (spec > replicas || spec > updated || replicas > spec || updated > available || spec > ready)
    return false;
  bool progressing = false, is_available = false;
  for (const auto& c : status.value("conditions", Object::array())) {
    if (c["type"] == "Progressing" && c["reason"] == "ProgressDeadlineExceeded") return false;
    if (c["type"] == "Progressing" && c["status"] == "True" &&
        c["reason"] == "NewReplicaSetAvailable")
      progressing = true;
    if (c["type"] == "Available" && c["status"] == "True") is_available = true;
  }
  return progressing && is_available;
}

class DeploymentControllerTest : public ::testing::Test {
 protected:
  DeploymentControllerTest() : controller(store, options()) {}

  DeploymentControllerOptions options() {
    DeploymentControllerOptions o;
    o.clock = [this] { return fake_now; };
    return o;
  }

  static Object deployment(const std::string& name, int replicas, const std::string& image) {
    return {{"apiVersion", "apps/v1"},
            {"kind", "Deployment"},
            {"metadata", {{"name", name}, {"labels", {{"app", name}}}}},
            {"spec",
             {{"replicas", replicas},
              {"selector", {{"matchLabels", {{"app", name}}}}},
              {"template",
               {{"metadata", {{"labels", {{"app", name}, {"tier", "control"}}}}},
                {"spec",
                 {{"containers",
                   {{{"name", "manager"},
                     {"image", image},
                     {"command", {"kubetrain-operator"}}}}}}}}}}}};
  }

  Object create(const Object& d) { return store.create(kDeployments, "default", d); }

  Object get(const std::string& name) { return store.get(kDeployments, "default", name); }

  // A change of the Deployment's spec, as `kubectl edit` makes it.
  void edit(const std::string& name, const std::function<void(Object& spec)>& change) {
    Object d = get(name);
    change(d["spec"]);
    store.update(kDeployments, "default", d);
  }

  std::vector<Object> pods(const std::string& label_selector = "",
                           const std::string& field_selector = "") {
    kube::ListOptions options;
    options.label_selector = label_selector;
    options.field_selector = field_selector;
    return store.list(kPods, "default", options).items;
  }

  std::vector<Object> replica_sets() {
    auto items = store.list(kReplicaSets, "default", {}).items;
    std::sort(items.begin(), items.end(), [](const Object& a, const Object& b) {
      return a["metadata"]["uid"] < b["metadata"]["uid"];  // creation order
    });
    return items;
  }

  // The kubelet's writes: a started container (Running, Ready) or an exited one.
  void kubelet_start(const std::string& pod) {
    store.merge_patch(
        kPods, "default", pod,
        {{"status",
          {{"phase", "Running"}, {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}}}},
        true);
  }
  void kubelet_exit(const std::string& pod, const std::string& phase) {
    store.merge_patch(
        kPods, "default", pod,
        {{"status",
          {{"phase", phase}, {"conditions", {{{"type", "Ready"}, {"status", "False"}}}}}}},
        true);
  }
  void kubelet_start_all() {
    for (const auto& p : pods())
      if (!p.contains("status")) kubelet_start(p["metadata"]["name"]);
  }

  // Syncs and starts every new pod until the Deployment is Current (at most 30 passes).
  void roll_until_current(const std::string& name) {
    for (int pass = 0; pass < 30; ++pass) {
      controller.sync();
      if (kstatus_deployment_current(get(name))) return;
      kubelet_start_all();
    }
    FAIL() << name << " never became Current: " << get(name).dump();
  }

  static Object without_times(Object condition) {
    condition.erase("lastUpdateTime");
    condition.erase("lastTransitionTime");
    return condition;
  }

  static Object condition_of(const Object& obj, const std::string& type) {
    for (const auto& c : obj["status"].value("conditions", Object::array()))
      if (c["type"] == type) return without_times(c);
    return nullptr;
  }

  static Object status_without_conditions(Object obj) {
    Object status = obj["status"];
    status.erase("conditions");
    return status;
  }

  static std::string hash_label(const Object& obj) {
    return obj["metadata"]["labels"].value("pod-template-hash", "");
  }

  Store store;
  std::chrono::steady_clock::time_point fake_now{std::chrono::hours(1)};
  DeploymentController controller;
};

TEST(PodTemplateHash, IsStable_ChangesWithTheTemplate_AndSpellsWithTheSafeAlphabet) {
  const Object a = {{"spec", {{"containers", {{{"image", "a"}}}}}}};
  const Object b = {{"spec", {{"containers", {{{"image", "b"}}}}}}};
  EXPECT_EQ(pod_template_hash(a), pod_template_hash(Object::parse(a.dump())));
  EXPECT_NE(pod_template_hash(a), pod_template_hash(b));
  // A uint32's decimal digits, each spelled from "bcdfghjklmnpqrstvwxz2456789": '0'..'9' (ASCII
  // 48..57, mod 27 = 21..26, 0..3) become 4 5 6 7 8 9 b c d f.
  EXPECT_TRUE(std::regex_match(pod_template_hash(a), std::regex("[456789bcdf]{1,10}")));
}

TEST_F(DeploymentControllerTest, NewDeployment_GetsAReplicaSetNamedByTemplateHash_OwningItsPods) {
  const Object d = create(deployment("web", 3, "op:1"));
  controller.sync();

  const auto sets = replica_sets();
  ASSERT_EQ(sets.size(), 1u);
  const Object& rs = sets[0];
  const std::string hash = pod_template_hash(d["spec"]["template"]);
  EXPECT_EQ(rs["metadata"]["name"], "web-" + hash);
  EXPECT_EQ(rs["metadata"]["labels"],
            Object({{"app", "web"}, {"tier", "control"}, {"pod-template-hash", hash}}));
  EXPECT_EQ(rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"], "1");
  EXPECT_EQ(rs["metadata"]["ownerReferences"], Object::array({{{"apiVersion", "apps/v1"},
                                                               {"kind", "Deployment"},
                                                               {"name", "web"},
                                                               {"uid", d["metadata"]["uid"]},
                                                               {"controller", true},
                                                               {"blockOwnerDeletion", true}}}));
  EXPECT_EQ(rs["spec"]["replicas"], 3);
  EXPECT_EQ(rs["spec"]["selector"],
            Object({{"matchLabels", {{"app", "web"}, {"pod-template-hash", hash}}}}));
  EXPECT_EQ(get("web")["metadata"]["annotations"]["deployment.kubernetes.io/revision"], "1");

  const auto all = pods();
  ASSERT_EQ(all.size(), 3u);
  for (const auto& p : all) {
    EXPECT_TRUE(std::regex_match(p["metadata"]["name"].get<std::string>(),
                                 std::regex("web-" + hash + "-[bcdfghjklmnpqrstvwxz2456789]{5}")));
    EXPECT_EQ(p["metadata"]["labels"], rs["metadata"]["labels"]);
    EXPECT_EQ(p["metadata"]["ownerReferences"], Object::array({{{"apiVersion", "apps/v1"},
                                                                {"kind", "ReplicaSet"},
                                                                {"name", "web-" + hash},
                                                                {"uid", rs["metadata"]["uid"]},
                                                                {"controller", true},
                                                                {"blockOwnerDeletion", true}}}));
    EXPECT_EQ(p["spec"], d["spec"]["template"]["spec"]);
  }
}

TEST_F(DeploymentControllerTest, WhilePodsStart_StatusIsUnavailable_AndProgressingSaysCreated) {
  create(deployment("web", 2, "op:1"));
  controller.sync();
  const Object d = get("web");
  const std::string rs_name = "web-" + pod_template_hash(d["spec"]["template"]);
  EXPECT_EQ(status_without_conditions(d), Object({{"observedGeneration", 1},
                                                  {"replicas", 2},
                                                  {"updatedReplicas", 2},
                                                  {"unavailableReplicas", 2}}));
  EXPECT_EQ(condition_of(d, "Available"),
            Object({{"type", "Available"},
                    {"status", "False"},
                    {"reason", "MinimumReplicasUnavailable"},
                    {"message", "Deployment does not have minimum availability."}}));
  EXPECT_EQ(condition_of(d, "Progressing"),
            Object({{"type", "Progressing"},
                    {"status", "True"},
                    {"reason", "NewReplicaSetCreated"},
                    {"message", "Created new replica set \"" + rs_name + "\""}}));
  EXPECT_FALSE(kstatus_deployment_current(d));
  EXPECT_EQ(replica_sets()[0]["status"],
            Object({{"replicas", 2}, {"fullyLabeledReplicas", 2}, {"observedGeneration", 1}}));
}

TEST_F(DeploymentControllerTest, OnceEveryPodIsReady_TheDeploymentIsCurrentForKstatus) {
  create(deployment("web", 2, "op:1"));
  controller.sync();
  kubelet_start_all();
  controller.sync();
  const Object d = get("web");
  const std::string rs_name = "web-" + pod_template_hash(d["spec"]["template"]);
  EXPECT_EQ(status_without_conditions(d), Object({{"observedGeneration", 1},
                                                  {"replicas", 2},
                                                  {"updatedReplicas", 2},
                                                  {"readyReplicas", 2},
                                                  {"availableReplicas", 2}}));
  EXPECT_EQ(condition_of(d, "Available"),
            Object({{"type", "Available"},
                    {"status", "True"},
                    {"reason", "MinimumReplicasAvailable"},
                    {"message", "Deployment has minimum availability."}}));
  EXPECT_EQ(condition_of(d, "Progressing"),
            Object({{"type", "Progressing"},
                    {"status", "True"},
                    {"reason", "NewReplicaSetAvailable"},
                    {"message", "ReplicaSet \"" + rs_name + "\" has successfully progressed."}}));
  EXPECT_TRUE(kstatus_deployment_current(d));
  EXPECT_EQ(replica_sets()[0]["status"], Object({{"replicas", 2},
                                                 {"fullyLabeledReplicas", 2},
                                                 {"readyReplicas", 2},
                                                 {"availableReplicas", 2},
                                                 {"observedGeneration", 1}}));
}

TEST_F(DeploymentControllerTest, ThreeOfFourReady_IsAvailableWithinMaxUnavailable_ButStillRolling) {
  create(deployment("web", 4, "op:1"));  // maxUnavailable 25 % of 4 = 1
  controller.sync();
  const auto all = pods();
  for (int i = 0; i < 3; ++i) kubelet_start(all[i]["metadata"]["name"]);
  controller.sync();
  const Object d = get("web");
  EXPECT_EQ(d["status"]["availableReplicas"], 3);
  EXPECT_EQ(d["status"]["unavailableReplicas"], 1);
  EXPECT_EQ(condition_of(d, "Available")["reason"], "MinimumReplicasAvailable");
  EXPECT_EQ(condition_of(d, "Progressing")["reason"], "ReplicaSetUpdated");
  EXPECT_FALSE(kstatus_deployment_current(d));
}

TEST_F(DeploymentControllerTest, ASyncWithNothingChanged_WritesNothing) {
  create(deployment("web", 2, "op:1"));
  roll_until_current("web");
  const std::string version = store.resource_version();
  controller.sync();
  controller.sync();
  EXPECT_EQ(store.resource_version(), version);
}

TEST_F(DeploymentControllerTest, ScaleUp_AddsPodsToTheSameReplicaSet_ScaleDown_DropsUnreadyFirst) {
  create(deployment("web", 2, "op:1"));
  roll_until_current("web");
  std::set<std::string> first_two;
  for (const auto& p : pods()) first_two.insert(p["metadata"]["name"]);

  edit("web", [](Object& spec) { spec["replicas"] = 4; });
  controller.sync();
  ASSERT_EQ(replica_sets().size(), 1u);
  EXPECT_EQ(replica_sets()[0]["spec"]["replicas"], 4);
  EXPECT_EQ(pods().size(), 4u);
  EXPECT_EQ(get("web")["status"]["observedGeneration"], 2);

  edit("web", [](Object& spec) { spec["replicas"] = 2; });  // the two new pods are not ready
  controller.sync();
  std::set<std::string> left;
  for (const auto& p : pods()) left.insert(p["metadata"]["name"]);
  EXPECT_EQ(left, first_two);
  const Object d = get("web");
  EXPECT_EQ(d["status"]["observedGeneration"], 3);
  EXPECT_TRUE(kstatus_deployment_current(d));
}

TEST_F(DeploymentControllerTest, TemplateChange_RollsToANewReplicaSet_WithinSurgeAndUnavailable) {
  create(deployment("web", 4, "op:1"));
  roll_until_current("web");
  const std::string old_hash = hash_label(replica_sets()[0]);

  edit("web", [](Object& spec) { spec["template"]["spec"]["containers"][0]["image"] = "op:2"; });
  std::set<std::string> reasons;
  bool current = false;
  for (int pass = 0; pass < 30 && !current; ++pass) {
    controller.sync();
    // maxSurge 25 % of 4 rounds up to 1, maxUnavailable down to 1: at most 5 pods, at least 3
    // of them ready.
    int64_t ready = 0;
    const auto all = pods();
    for (const auto& p : all) ready += p.contains("status") && p["status"]["phase"] == "Running";
    EXPECT_LE(all.size(), 5u) << "pass " << pass;
    EXPECT_GE(ready, 3) << "pass " << pass;
    const Object d = get("web");
    reasons.insert(condition_of(d, "Progressing")["reason"].get<std::string>());
    current = kstatus_deployment_current(d);
    kubelet_start_all();
  }
  ASSERT_TRUE(current);
  EXPECT_TRUE(reasons.count("NewReplicaSetCreated"));
  EXPECT_TRUE(reasons.count("ReplicaSetUpdated"));

  const auto sets = replica_sets();
  ASSERT_EQ(sets.size(), 2u);
  EXPECT_EQ(hash_label(sets[0]), old_hash);
  EXPECT_EQ(sets[0]["spec"]["replicas"], 0);
  EXPECT_EQ(sets[0]["status"],
            Object({{"replicas", 0}, {"observedGeneration", sets[0]["metadata"]["generation"]}}));
  EXPECT_EQ(sets[1]["spec"]["replicas"], 4);
  EXPECT_EQ(sets[1]["metadata"]["annotations"]["deployment.kubernetes.io/revision"], "2");
  const Object d = get("web");
  EXPECT_EQ(d["metadata"]["annotations"]["deployment.kubernetes.io/revision"], "2");
  EXPECT_EQ(hash_label(sets[1]), pod_template_hash(d["spec"]["template"]));
  for (const auto& p : pods()) EXPECT_EQ(hash_label(p), hash_label(sets[1]));
  EXPECT_EQ(pods().size(), 4u);
  EXPECT_EQ(condition_of(d, "Progressing")["message"],
            "ReplicaSet \"" + sets[1]["metadata"]["name"].get<std::string>() +
                "\" has successfully progressed.");
}

TEST_F(DeploymentControllerTest, Recreate_DeletesEveryOldPod_BeforeCreatingNewOnes) {
  Object d = deployment("web", 2, "op:1");
  d["spec"]["strategy"] = {{"type", "Recreate"}};
  create(d);
  roll_until_current("web");
  edit("web", [](Object& spec) { spec["template"]["spec"]["containers"][0]["image"] = "op:2"; });

  controller.sync();  // old ReplicaSet to 0: its pods go
  EXPECT_TRUE(pods().empty());
  EXPECT_EQ(replica_sets().size(), 1u);
  controller.sync();  // then the new ReplicaSet with every replica at once
  const std::string new_hash = pod_template_hash(get("web")["spec"]["template"]);
  EXPECT_EQ(pods("pod-template-hash=" + new_hash).size(), 2u);
  EXPECT_EQ(pods().size(), 2u);
  roll_until_current("web");
}

TEST_F(DeploymentControllerTest, FailedPod_IsReplacedAfterTheCrashBackoff_AndKeptForItsLogs) {
  create(deployment("web", 1, "op:1"));
  roll_until_current("web");
  const std::string first = pods()[0]["metadata"]["name"];

  kubelet_exit(first, "Failed");
  controller.sync();
  Object d = get("web");
  EXPECT_EQ(status_without_conditions(d),
            Object({{"observedGeneration", 1}, {"unavailableReplicas", 1}}));
  EXPECT_EQ(condition_of(d, "Available")["status"], "False");
  EXPECT_EQ(pods().size(), 1u);  // the first restart waits 10 s

  fake_now += std::chrono::seconds(9);
  controller.sync();
  EXPECT_EQ(pods().size(), 1u);
  fake_now += std::chrono::seconds(1);
  controller.sync();
  ASSERT_EQ(pods("", "status.phase!=Failed").size(), 1u);
  EXPECT_EQ(pods().size(), 2u);  // the failed one stays for `kubectl logs`
  EXPECT_EQ(store.get(kPods, "default", first)["status"]["phase"], "Failed");

  // A second exit in a row doubles the wait; Succeeded counts as an exit too.
  std::string second;
  for (const auto& p : pods())
    if (p["metadata"]["name"] != first) second = p["metadata"]["name"];
  kubelet_start(second);
  controller.sync();
  kubelet_exit(second, "Succeeded");
  controller.sync();
  fake_now += std::chrono::seconds(19);
  controller.sync();
  EXPECT_EQ(pods().size(), 2u);
  fake_now += std::chrono::seconds(1);
  controller.sync();
  EXPECT_EQ(pods().size(), 3u);
  roll_until_current("web");
}

TEST_F(DeploymentControllerTest, TerminatedPods_BeyondTheKeptNumber_AreDeleted) {
  DeploymentControllerOptions o = options();
  o.crash_backoff_initial = std::chrono::milliseconds(0);
  o.terminated_pods_kept = 2;
  DeploymentController fast(store, o);
  create(deployment("web", 1, "op:1"));
  std::vector<std::string> failed;
  for (int i = 0; i < 4; ++i) {
    fast.sync();
    for (const auto& p : pods())
      if (!p.contains("status")) {
        failed.push_back(p["metadata"]["name"]);
        kubelet_exit(failed.back(), "Failed");
      }
  }
  fast.sync();
  std::set<std::string> kept;
  for (const auto& p : pods("")) kept.insert(p["metadata"]["name"]);
  ASSERT_EQ(failed.size(), 4u);
  EXPECT_EQ(pods().size(), 3u);  // the two newest failed ones and their replacement
  EXPECT_TRUE(kept.count(failed[2]) && kept.count(failed[3]));
}

TEST_F(DeploymentControllerTest, DeletingTheDeployment_CollectsItsReplicaSetsAndPods) {
  create(deployment("web", 2, "op:1"));
  create(deployment("other", 1, "op:1"));
  roll_until_current("web");
  store.remove(kDeployments, "default", "web");
  controller.sync();
  const auto sets = replica_sets();
  ASSERT_EQ(sets.size(), 1u);
  EXPECT_EQ(sets[0]["metadata"]["ownerReferences"][0]["name"], "other");
  EXPECT_TRUE(pods("app=web").empty());
  EXPECT_EQ(pods("app=other").size(), 1u);
}

TEST_F(DeploymentControllerTest, RevisionHistoryLimit_KeepsThatManyOldReplicaSets) {
  Object d = deployment("web", 1, "op:1");
  d["spec"]["revisionHistoryLimit"] = 1;
  create(d);
  roll_until_current("web");
  for (const char* image : {"op:2", "op:3"}) {
    edit("web", [&](Object& spec) { spec["template"]["spec"]["containers"][0]["image"] = image; });
    roll_until_current("web");
  }
  controller.sync();
  const auto sets = replica_sets();
  ASSERT_EQ(sets.size(), 2u);  // op:2's (empty) and op:3's
  EXPECT_EQ(sets[0]["metadata"]["annotations"]["deployment.kubernetes.io/revision"], "2");
  EXPECT_EQ(sets[1]["metadata"]["annotations"]["deployment.kubernetes.io/revision"], "3");
}

TEST_F(DeploymentControllerTest, RollbackToAnEarlierTemplate_ReusesItsReplicaSetAsTheNextRevision) {
  create(deployment("web", 1, "op:1"));
  roll_until_current("web");
  for (const char* image : {"op:2", "op:1"}) {
    edit("web", [&](Object& spec) { spec["template"]["spec"]["containers"][0]["image"] = image; });
    roll_until_current("web");
  }
  const auto sets = replica_sets();
  ASSERT_EQ(sets.size(), 2u);
  EXPECT_EQ(sets[0]["spec"]["replicas"], 1);
  EXPECT_EQ(sets[0]["metadata"]["annotations"]["deployment.kubernetes.io/revision"], "3");
  EXPECT_EQ(sets[1]["spec"]["replicas"], 0);
  EXPECT_EQ(get("web")["metadata"]["annotations"]["deployment.kubernetes.io/revision"], "3");
}

class DisruptionBudgetTest : public DeploymentControllerTest {
 protected:
  Object budget(const std::string& name, const std::string& field, const Object& value) {
    Object b = {{"apiVersion", "policy/v1"},
                {"kind", "PodDisruptionBudget"},
                {"metadata", {{"name", name}}},
                {"spec", {{"selector", {{"matchLabels", {{"app", "web"}}}}}, {field, value}}}};
    return store.create(kPodDisruptionBudgets, "default", b);
  }
  Object get_budget(const std::string& name) {
    return store.get(kPodDisruptionBudgets, "default", name);
  }
};

TEST_F(DisruptionBudgetTest, MinAvailableCount_ExpectsTheSelectedPods_AndAllowsTheHealthySurplus) {
  create(deployment("web", 3, "op:1"));
  controller.sync();
  const auto all = pods();
  kubelet_start(all[0]["metadata"]["name"]);
  kubelet_start(all[1]["metadata"]["name"]);
  budget("web", "minAvailable", 1);
  controller.sync();
  const Object b = get_budget("web");
  Object status = b["status"];
  ASSERT_EQ(status["conditions"].size(), 1u);
  const Object condition = status["conditions"][0];
  status.erase("conditions");
  EXPECT_EQ(status, Object({{"observedGeneration", 1},
                            {"currentHealthy", 2},
                            {"desiredHealthy", 1},
                            {"expectedPods", 3},
                            {"disruptionsAllowed", 1}}));
  EXPECT_EQ(without_times(condition), Object({{"type", "DisruptionAllowed"},
                                              {"status", "True"},
                                              {"observedGeneration", 1},
                                              {"reason", "SufficientPods"},
                                              {"message", ""}}));
  // kstatus calls a PDB Current once observedGeneration is its generation.
  EXPECT_EQ(b["status"]["observedGeneration"], b["metadata"]["generation"]);
}

TEST_F(DisruptionBudgetTest, Percentages_ExpectTheDeploymentsScale) {
  create(deployment("web", 4, "op:1"));
  roll_until_current("web");
  budget("unavailable", "maxUnavailable", "25%");  // 4 - ceil(1) = 3 must stay healthy
  budget("available", "minAvailable", "100%");     // ceil(4) = 4
  controller.sync();
  const Object unavailable = get_budget("unavailable")["status"];
  EXPECT_EQ(unavailable["expectedPods"], 4);
  EXPECT_EQ(unavailable["desiredHealthy"], 3);
  EXPECT_EQ(unavailable["currentHealthy"], 4);
  EXPECT_EQ(unavailable["disruptionsAllowed"], 1);
  const Object available = get_budget("available")["status"];
  EXPECT_EQ(available["desiredHealthy"], 4);
  EXPECT_EQ(available["disruptionsAllowed"], 0);
  EXPECT_EQ(available["conditions"][0]["status"], "False");
  EXPECT_EQ(available["conditions"][0]["reason"], "InsufficientPods");
}

TEST_F(DisruptionBudgetTest, NoSelectedPod_AllowsNoDisruption) {
  budget("web", "minAvailable", 0);
  controller.sync();
  const Object status = get_budget("web")["status"];
  EXPECT_EQ(status["expectedPods"], 0);
  EXPECT_EQ(status["disruptionsAllowed"], 0);
  EXPECT_EQ(status["conditions"][0]["reason"], "InsufficientPods");
}

}  // namespace
}  // namespace kt::local

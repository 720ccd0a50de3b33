// The TrainingJob reconciler's decisions, against the local Store. No processes run: a fake
// "kubelet" (set_pod_*) writes pod statuses, and a fake metrics fetcher stands for rank 0.
#include "operator/controller/controller.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <set>

#include "api/hardware.h"
#include "api/measured_profile.h"
#include "api/plan.h"
#include "api/quantity.h"
#include "api/yaml_json.h"
#include "local/builtin_resources.h"
#include "local/store.h"
#include "telemetry/metrics.h"
#include "tests/support/forwarding_client.h"

namespace kt::controller {
namespace {

using kube::kConfigMaps;
using kube::kPods;
using kube::kTrainingJobs;
using kube::Object;
using Clock = std::chrono::system_clock;

Object cpu_node(const std::string& name, int cores) {
  return {{"apiVersion", "v1"},
          {"kind", "Node"},
          {"metadata", {{"name", name}, {"labels", {{"kubernetes.io/hostname", name}}}}},
          {"status",
           {{"allocatable", {{"cpu", std::to_string(cores)}, {"memory", "16Gi"}}},
            {"capacity", {{"cpu", std::to_string(cores)}, {"memory", "16Gi"}}}}}};
}

std::string phase_of_pod(const Object& pod) {
  return pod.contains("status") ? pod["status"].value("phase", "Pending") : "Pending";
}

Object tiny_job(const std::string& name) {
  return {{"apiVersion", "kubetrain.dev/v1alpha1"},
          {"kind", "TrainingJob"},
          {"metadata", {{"name", name}, {"namespace", "default"}}},
          {"spec",
           {{"model", {{"preset", "tiny"}}},
            {"training", {{"steps", 100}, {"globalBatchSize", 8}}},
            {"resources", {{"cpuOnly", true}}},
            {"runPolicy", {{"backoffLimit", 2}}}}}};
}

class ControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store.register_resource(kTrainingJobs, true);
    add_node(cpu_node("node-a", 4));
    options.clock = [this] { return now; };
    options.metrics = &metrics;
    options.fetch_metrics = [this](const std::string& host,
                                   int port) -> std::optional<std::string> {
      fetched_host = host;
      fetched_port = port;
      return metrics_text;
    };
  }

  // Nodes report their status through the subresource, as kubelets do.
  void add_node(const Object& node) {
    Object created = store.create(kube::kNodes, "", node);
    created["status"] = node["status"];
    store.update_status(kube::kNodes, "", created);
  }
  Controller controller() { return Controller(store, options); }
  ReconcileResult reconcile(const std::string& name = "job") {
    return controller().reconcile("default", name);
  }
  Object job(const std::string& name = "job") { return store.get(kTrainingJobs, "default", name); }
  Object status(const std::string& name = "job") {
    return job(name).value("status", Object::object());
  }
  std::vector<Object> pods() { return store.list(kPods, "default", {}).items; }
  Object condition(const std::string& type, const std::string& name = "job") {
    for (const auto& c : status(name).value("conditions", Object::array()))
      if (c["type"] == type) return c;
    return nullptr;
  }
  std::vector<std::string> event_reasons() {
    std::vector<std::string> out;
    for (const auto& e : store.list(kube::kEvents, "default", {}).items) out.push_back(e["reason"]);
    return out;
  }

  // The fake kubelet.
  void set_pod_status(const std::string& pod, Object pod_status) {
    Object p = store.get(kPods, "default", pod);
    p["status"] = pod_status;
    store.update_status(kPods, "default", p);
  }
  // The profiling pod's end: Succeeded with `message` as its termination message.
  void set_profile_returned(const std::string& message,
                            const std::string& pod = "kubetrain-profile-cpu") {
    const Object terminated = {{"exitCode", 0}, {"message", message}};
    set_pod_status(
        pod, {{"phase", "Succeeded"},
              {"containerStatuses",
               Object::array({{{"name", "profile"}, {"state", {{"terminated", terminated}}}}})}});
  }
  void set_pod_running(const std::string& pod) {
    set_pod_status(pod, {{"phase", "Running"},
                         {"podIP", "10.0.0.7"},
                         {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}});
  }
  // The container ended with `terminated` (exitCode, reason, message): Succeeded on 0.
  void set_pod_terminated(const std::string& pod, const Object& terminated) {
    const Object container = {{"name", "worker"}, {"state", {{"terminated", terminated}}}};
    set_pod_status(pod, {{"phase", terminated.value("exitCode", 1) == 0 ? "Succeeded" : "Failed"},
                         {"containerStatuses", Object::array({container})}});
  }
  void set_pod_exited(const std::string& pod, int code) {
    const Object terminated = {{"exitCode", code}, {"reason", code ? "Error" : "Completed"}};
    const Object container = {{"name", "worker"}, {"state", {{"terminated", terminated}}}};
    set_pod_status(pod, {{"phase", code == 0 ? "Succeeded" : "Failed"},
                         {"containerStatuses", Object::array({container})}});
  }
  void set_pod_evicted(const std::string& pod) {
    set_pod_status(pod, {{"phase", "Failed"},
                         {"reason", "Evicted"},
                         {"conditions", {{{"type", "DisruptionTarget"}, {"status", "True"}}}}});
  }
  std::string attempt_of(const Object& pod) {
    return pod["metadata"]["labels"]["kubetrain.dev/restart-attempt"];
  }

  // gpt2-124m at batch 64 on an 8 × H100 node, its pod Running: the plan (TP 2 with the
  // built-in figures).
  api::Plan start_gpt2_on_h100(int64_t steps);

  local::Store store;
  telemetry::Registry registry;
  ControllerMetrics metrics{registry};
  ControllerOptions options;
  Clock::time_point now = Clock::from_time_t(1'800'000'000);
  std::optional<std::string> metrics_text;
  std::string fetched_host;
  int fetched_port = 0;
};

TEST_F(ControllerTest, Create_PlansAndCreatesConfigMapServiceAndOnePodPerNode) {
  store.create(kTrainingJobs, "default", tiny_job("job"));
  reconcile();

  const Object cm = store.get(kConfigMaps, "default", "job-plan");
  const api::Plan plan =
      api::decode_plan(Object::parse(cm["data"]["plan.json"].get<std::string>()));
  EXPECT_EQ(plan.device, api::DeviceKind::kCpu);
  EXPECT_EQ(plan.placement, std::vector<std::string>{"node-a"});
  EXPECT_EQ(plan.job_name, "job");

  const Object svc = store.get(kube::kServices, "default", "job");
  EXPECT_EQ(svc["spec"]["clusterIP"], "None");
  EXPECT_EQ(svc["spec"]["publishNotReadyAddresses"], true);

  const auto all = pods();
  ASSERT_EQ(all.size(), 1u);
  const Object& pod = all[0];
  EXPECT_EQ(pod["metadata"]["name"], "job-worker-0");
  EXPECT_EQ(pod["metadata"]["labels"]["kubetrain.dev/job-name"], "job");
  EXPECT_EQ(pod["metadata"]["labels"]["kubetrain.dev/node-rank"], "0");
  EXPECT_EQ(attempt_of(pod), "0");
  const Object ref = pod["metadata"]["ownerReferences"][0];
  EXPECT_EQ(ref["uid"], job()["metadata"]["uid"]);
  EXPECT_EQ(ref["controller"], true);
  EXPECT_EQ(ref["blockOwnerDeletion"], true);
  EXPECT_EQ(pod["spec"]["hostname"], "job-worker-0");
  EXPECT_EQ(pod["spec"]["subdomain"], "job");
  EXPECT_EQ(pod["spec"]["nodeSelector"]["kubernetes.io/hostname"], "node-a");
  std::map<std::string, std::string> env;
  for (const auto& e : pod["spec"]["containers"][0]["env"])
    if (e.contains("value")) env[e["name"]] = e["value"];
  EXPECT_EQ(env["MASTER_ADDR"], "job-worker-0.job");
  EXPECT_EQ(env["WORLD_SIZE"], std::to_string(plan.world));
  EXPECT_EQ(env["NNODES"], "1");
  EXPECT_EQ(env["NODE_RANK"], "0");
  EXPECT_EQ(env["NPROC_PER_NODE"], std::to_string(plan.config.procs_per_node));
  EXPECT_EQ(env["KUBETRAIN_PLAN"], "/etc/kubetrain/plan.json");
  EXPECT_EQ(pod["spec"]["containers"][0]["command"][0], "kubetrain-worker");
  EXPECT_EQ(pod["spec"]["containers"][0]["args"][0], "launch");
  EXPECT_FALSE(pod["spec"]["containers"][0]["resources"]["limits"].contains("nvidia.com/gpu"));

  const Object s = status();
  EXPECT_EQ(s["phase"], "Starting");
  EXPECT_EQ(s["plan"]["planHash"], plan.plan_hash);
  EXPECT_EQ(s["plan"]["configMap"], "job-plan");
  EXPECT_EQ(s["workers"]["desired"], 1);
  EXPECT_EQ(condition("Planned")["status"], "True");
  EXPECT_EQ(condition("Planned")["observedGeneration"], 1);
  EXPECT_EQ(s["observedGeneration"], 1);
  EXPECT_EQ(event_reasons(), std::vector<std::string>{"PlanChosen"});
}

// A job with Oases' cutpoint: the status says what the TP and DP columns cannot (the layers from
// the cut at another TP degree), as do stages and sharding.
TEST_F(ControllerTest, Status_SaysTheCutpointStagesAndSharding) {
  Object j = tiny_job("job");
  j["spec"]["parallelism"] = {{"tensorParallel", 1},
                              {"dataParallel", 2},
                              {"cutpointLayer", 1},
                              {"cutpointTensorParallel", 2},
                              {"distributedOptimizer", "on"}};
  store.create(kTrainingJobs, "default", j);
  reconcile();
  const Object s = status();
  ASSERT_TRUE(s.contains("plan")) << s.dump(2);
  EXPECT_EQ(s["plan"]["tp"], 1);
  EXPECT_EQ(s["plan"]["dp"], 2);
  EXPECT_EQ(s["plan"]["pp"], 1);
  EXPECT_EQ(s["plan"]["distributedOptimizer"], true);
  EXPECT_EQ(s["plan"]["cutpoint"], Object({{"layer", 1}, {"tp", 2}}));
  EXPECT_EQ(condition("Planned")["status"], "True");
  // A plan without one says none.
  store.create(kTrainingJobs, "default", tiny_job("plain"));
  reconcile("plain");
  const Object plain = status("plain");
  EXPECT_FALSE(plain["plan"].contains("cutpoint")) << plain.dump(2);
  EXPECT_EQ(plain["plan"]["distributedOptimizer"], false);
}

// Volumes and mounts of a pod by name.
Object by_name(const Object& list, const std::string& name) {
  for (const auto& item : list)
    if (item.value("name", "") == name) return item;
  return nullptr;
}

double quantity(const Object& value) {
  return api::parse_quantity(value.get<std::string>()).value();
}

// The plan ConfigMap is looked for by the job label: one of its name without the label (left by
// someone else) is found by the create's AlreadyExists and taken over, not a reconcile error.
TEST_F(ControllerTest, PlanConfigMapWithoutTheJobLabel_IsTakenOver) {
  store.create(kConfigMaps, "default",
               {{"apiVersion", "v1"},
                {"kind", "ConfigMap"},
                {"metadata", {{"name", "job-plan"}}},
                {"data", {{"stale", "yes"}}}});
  store.create(kTrainingJobs, "default", tiny_job("job"));
  reconcile();
  const Object cm = store.get(kConfigMaps, "default", "job-plan");
  EXPECT_EQ(cm["metadata"]["labels"]["kubetrain.dev/job-name"], "job");
  EXPECT_EQ(cm["metadata"]["ownerReferences"][0]["name"], "job");
  EXPECT_EQ(api::decode_plan(Object::parse(cm["data"]["plan.json"].get<std::string>())).job_name,
            "job");
  EXPECT_FALSE(cm["data"].contains("stale"));
  EXPECT_EQ(pods().size(), 1u);
}

// A cache behind the API: its lists do not show the ConfigMaps yet.
class ConfigMapsNotCachedYet : public test::ForwardingClient {
 public:
  using ForwardingClient::ForwardingClient;
  kube::ObjectList list(const kube::Resource& r, const std::string& ns,
                        const kube::ListOptions& opts) override {
    kube::ObjectList out = inner_.list(r, ns, opts);
    if (r == kConfigMaps) out.items.clear();
    return out;
  }
};

// The job's own plan ConfigMap, missing from a cache that is behind, is not taken over (its attempt
// and restart count would be overwritten): the reconcile fails, to be retried, and changes nothing.
TEST_F(ControllerTest, OwnPlanConfigMapMissingFromTheCache_IsLeftAlone_AndTheReconcileRetried) {
  store.create(kTrainingJobs, "default", tiny_job("job"));
  reconcile();
  Object cm = store.get(kConfigMaps, "default", "job-plan");
  cm["metadata"]["annotations"][kAttemptAnnotation] = "3";
  cm = store.update(kConfigMaps, "default", cm);
  ConfigMapsNotCachedYet behind(store);
  EXPECT_THROW(Controller(behind, options).reconcile("default", "job"), kt::Error);
  const Object after = store.get(kConfigMaps, "default", "job-plan");
  EXPECT_EQ(after["metadata"]["resourceVersion"], cm["metadata"]["resourceVersion"]);
  EXPECT_EQ(after["metadata"]["annotations"][kAttemptAnnotation], "3");
}

TEST_F(ControllerTest, WorkerPod_RequestsWhatThePlanUses_AndRunsRestricted) {
  store.create(kTrainingJobs, "default", tiny_job("job"));
  reconcile();
  const api::Plan plan = api::decode_plan(Object::parse(
      store.get(kConfigMaps, "default", "job-plan")["data"]["plan.json"].get<std::string>()));
  const Object pod = pods().at(0);
  const Object& container = pod["spec"]["containers"][0];
  const Object& res = container["resources"];

  // CPU: every rank's threads, which on this 4-core node are all 4 cores; no CPU limit.
  EXPECT_EQ(plan.config.procs_per_node * plan.cpu_threads, 4);
  EXPECT_DOUBLE_EQ(quantity(res["requests"]["cpu"]), 4.0);
  EXPECT_FALSE(res["limits"].contains("cpu"));
  // Memory: at least the plan's host memory (on a CPU device, the ranks' whole memory), below
  // the node's 16Gi, and limit = request.
  const double planned =
      plan.predicted.host_bytes_per_node +
      plan.predicted.memory.total() * static_cast<double>(plan.config.procs_per_node);
  const double memory = quantity(res["requests"]["memory"]);
  EXPECT_GT(memory, planned + 256.0 * 1024 * 1024);  // + the /dev/shm it holds
  EXPECT_LT(memory, 16.0 * 1024 * 1024 * 1024);
  EXPECT_EQ(res["limits"]["memory"], res["requests"]["memory"]);

  // /dev/shm memory-backed, /tmp writable (the root filesystem is read-only).
  const Object shm = by_name(pod["spec"]["volumes"], "dshm");
  ASSERT_TRUE(shm.is_object());
  EXPECT_EQ(shm["emptyDir"]["medium"], "Memory");
  EXPECT_EQ(by_name(container["volumeMounts"], "dshm")["mountPath"], "/dev/shm");
  EXPECT_EQ(by_name(container["volumeMounts"], "tmp")["mountPath"], "/tmp");

  // The restricted Pod Security Standard.
  EXPECT_EQ(pod["spec"]["securityContext"]["runAsNonRoot"], true);
  EXPECT_EQ(pod["spec"]["securityContext"]["runAsUser"], 65532);
  EXPECT_EQ(pod["spec"]["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
  EXPECT_EQ(container["securityContext"]["allowPrivilegeEscalation"], false);
  EXPECT_EQ(container["securityContext"]["readOnlyRootFilesystem"], true);
  EXPECT_EQ(container["securityContext"]["capabilities"]["drop"], Object::array({"ALL"}));

  EXPECT_GE(pod["spec"]["terminationGracePeriodSeconds"].get<int>(), 60);
  EXPECT_EQ(pod["metadata"]["labels"]["kubetrain.dev/plan-hash"], plan.plan_hash);
}

TEST_F(ControllerTest, WorkerPod_PullsWithTheOperatorsWorkerImagePullSecrets) {
  options.children.image_pull_secrets = {"regcred", "mirror"};
  store.create(kTrainingJobs, "default", tiny_job("job"));
  reconcile();
  EXPECT_EQ(pods().at(0)["spec"]["imagePullSecrets"],
            Object::parse(R"([{"name": "regcred"}, {"name": "mirror"}])"));
}

TEST_F(ControllerTest, Checkpoints_GoToAPvcPerJobByDefault_SoThatARestartResumes) {
  store.create(kTrainingJobs, "default", tiny_job("job"));
  reconcile();
  const Object claim = store.get(kube::kPersistentVolumeClaims, "default", "job-checkpoints");
  EXPECT_EQ(claim["spec"]["accessModes"], Object::array({"ReadWriteOnce"}));  // one node
  // tiny: far below the 1 GiB floor.
  EXPECT_EQ(claim["spec"]["resources"]["requests"]["storage"], "1Gi");
  EXPECT_FALSE(claim["spec"].contains("storageClassName"));
  EXPECT_EQ(claim["metadata"]["ownerReferences"][0]["uid"], job()["metadata"]["uid"]);
  const Object volume = by_name(pods().at(0)["spec"]["volumes"], "checkpoints");
  EXPECT_EQ(volume["persistentVolumeClaim"]["claimName"], "job-checkpoints");

  // Suspended and resumed: the pods went, the claim (and what it holds) stayed.
  Object j = job();
  j["spec"]["runPolicy"]["suspend"] = true;
  store.update(kTrainingJobs, "default", j);
  reconcile();
  EXPECT_TRUE(pods().empty());
  EXPECT_EQ(store.get(kube::kPersistentVolumeClaims, "default", "job-checkpoints")["metadata"]["uid"],
            claim["metadata"]["uid"]);
}

TEST_F(ControllerTest, CheckpointClaim_SizeAndClassFromTheOptions_GrowsWithTheModel) {
  options.children.checkpoint_storage_class = "fast";
  Object j = tiny_job("job");
  j["spec"]["model"] = {{"preset", "gpt2-124m"}};
  store.create(kTrainingJobs, "default", j);
  reconcile();
  const Object claim = store.get(kube::kPersistentVolumeClaims, "default", "job-checkpoints");
  EXPECT_EQ(claim["spec"]["storageClassName"], "fast");
  // 124,475,904 parameters × 16 B × (keep 3 + 1) × 1.25 = 9.27 GiB, rounded up.
  EXPECT_EQ(claim["spec"]["resources"]["requests"]["storage"], "10Gi");
}

TEST_F(ControllerTest, Checkpoints_JobsOwnVolumeOrEmptyDirMode_MakeNoClaim) {
  Object own = tiny_job("own");
  own["spec"]["checkpoint"]["volume"] = {{"persistentVolumeClaim", {{"claimName", "mine"}}}};
  store.create(kTrainingJobs, "default", own);
  reconcile("own");
  options.children.checkpoint_pvc = false;
  store.create(kTrainingJobs, "default", tiny_job("scratch"));
  reconcile("scratch");
  EXPECT_TRUE(store.list(kube::kPersistentVolumeClaims, "default", {}).items.empty());
  EXPECT_EQ(by_name(store.get(kPods, "default", "own-worker-0")["spec"]["volumes"],
                    "checkpoints")["persistentVolumeClaim"]["claimName"],
            "mine");
  EXPECT_TRUE(by_name(store.get(kPods, "default", "scratch-worker-0")["spec"]["volumes"],
                      "checkpoints")
                  .contains("emptyDir"));
}

TEST_F(ControllerTest, EmptyDirCheckpoints_AreAllowed_WithAWarningConditionAndOneEvent) {
  Object j = tiny_job("job");
  j["spec"]["checkpoint"]["volume"] = {{"emptyDir", Object::object()}};
  store.create(kTrainingJobs, "default", j);
  reconcile();
  reconcile();
  EXPECT_EQ(condition("EphemeralCheckpoints")["status"], "True");
  EXPECT_EQ(condition("EphemeralCheckpoints")["reason"], "EmptyDirVolume");
  EXPECT_NE(condition("EphemeralCheckpoints")["message"].get<std::string>().find("from step 0"),
            std::string::npos);
  const auto reasons = event_reasons();
  EXPECT_EQ(std::count(reasons.begin(), reasons.end(), "EphemeralCheckpoints"), 1)
      << "one Warning when the condition turns True, not one per reconcile";
  EXPECT_FALSE(pods().empty()) << "the job still runs";
  // The spec fixed to a persistent volume: the condition clears.
  Object fixed = job();
  fixed["spec"]["checkpoint"]["volume"] = {{"persistentVolumeClaim", {{"claimName", "mine"}}}};
  store.update(kTrainingJobs, "default", fixed);
  reconcile();
  EXPECT_EQ(condition("EphemeralCheckpoints")["status"], "False");
  // The operator in emptyDir mode warns about jobs that name no volume as well; a job with the
  // default PVC gets no such condition.
  options.children.checkpoint_pvc = false;
  store.create(kTrainingJobs, "default", tiny_job("scratch"));
  reconcile("scratch");
  EXPECT_EQ(condition("EphemeralCheckpoints", "scratch")["status"], "True");
  options.children.checkpoint_pvc = true;
  store.create(kTrainingJobs, "default", tiny_job("kept"));
  reconcile("kept");
  EXPECT_TRUE(condition("EphemeralCheckpoints", "kept").is_null());
}

TEST_F(ControllerTest, CheckpointClaim_Retain_HasNoOwner_SoItOutlivesTheJob) {
  Object j = tiny_job("job");
  j["spec"]["checkpoint"]["claimRetentionPolicy"] = "Retain";
  store.create(kTrainingJobs, "default", j);
  reconcile();
  const Object claim = store.get(kube::kPersistentVolumeClaims, "default", "job-checkpoints");
  EXPECT_FALSE(claim["metadata"].contains("ownerReferences"));
  EXPECT_EQ(claim["metadata"]["labels"]["kubetrain.dev/job-name"], "job");
}

TEST_F(ControllerTest, WorkerPod_JobOverridesWin_ExceptTheGpus) {
  Object j = tiny_job("job");
  j["spec"]["resources"]["resources"] = {{"requests", {{"cpu", "1500m"}}},
                                         {"limits", {{"memory", "3Gi"}}}};
  store.create(kTrainingJobs, "default", j);
  reconcile();
  const Object res = pods().at(0)["spec"]["containers"][0]["resources"];
  EXPECT_EQ(res["requests"]["cpu"], "1500m");
  EXPECT_EQ(res["limits"]["memory"], "3Gi");
  EXPECT_TRUE(res["requests"].contains("memory"));  // the plan's, where the job set none
}

TEST_F(ControllerTest, OtherPodsRequests_AreNotFreeForThePlan) {
  // The operator's own pod holds 1 of node-a's 4 cores: the plan and its pod use the other 3.
  store.create(kPods, "default",
               {{"metadata", {{"name", "operator"}, {"namespace", "default"}}},
                {"spec",
                 {{"nodeName", "node-a"},
                  {"containers",
                   {{{"name", "op"}, {"resources", {{"requests", {{"cpu", "1"}, {"memory", "1Gi"}}}}}}}}}}});
  store.create(kTrainingJobs, "default", tiny_job("job"));
  reconcile();
  const Object res = store.get(kPods, "default", "job-worker-0")["spec"]["containers"][0]["resources"];
  EXPECT_LE(quantity(res["requests"]["cpu"]), 3.0);
}

// A pod of a long-running workload (a ReplicaSet's: the operator itself) never gives its
// requests back: a job that fits only without it fails at once, saying so, instead of waiting
// forever; the same requests held by a pod that ends (a bare pod, another job's) are waited for.
TEST_F(ControllerTest, JobThatFitsOnlyWithoutALongRunningPod_FailsInsteadOfWaitingForever) {
  for (const bool replica_set : {true, false}) {
    const std::string name = replica_set ? "never" : "later";
    Object pod = {{"metadata", {{"name", "holder-" + name}, {"namespace", "default"}}},
                  {"spec",
                   {{"nodeName", "node-a"},
                    {"containers",
                     {{{"name", "c"}, {"resources", {{"requests", {{"cpu", "100m"}}}}}}}}}}};
    if (replica_set) {
      Object replicas = {{"metadata", {{"name", "kubetrain-operator-5d8f"}}}};
      replicas["spec"]["selector"]["matchLabels"]["app"] = "op";
      replicas["spec"]["template"]["metadata"]["labels"]["app"] = "op";
      replicas["spec"]["template"]["spec"]["containers"] =
          Object::array({{{"name", "c"}, {"image", "op"}}});
      const Object rs = store.create(local::kReplicaSets, "default", replicas);
      pod["metadata"]["ownerReferences"] = {{{"apiVersion", "apps/v1"},
                                             {"kind", "ReplicaSet"},
                                             {"name", "kubetrain-operator-5d8f"},
                                             {"uid", rs["metadata"]["uid"]},
                                             {"controller", true}}};
    }
    store.create(kPods, "default", pod);
    Object j = tiny_job(name);
    j["spec"]["parallelism"] = {{"dataParallel", 4}};  // 4 CPU ranks: all of node-a's 4 cores
    store.create(kTrainingJobs, "default", j);
    reconcile(name);
    if (replica_set) {
      EXPECT_EQ(status(name)["phase"], "Failed");
      EXPECT_EQ(condition("Planned", name)["reason"], "NoFeasiblePlan");
      const std::string message = condition("Planned", name)["message"];
      EXPECT_NE(message.find("long-running workloads"), std::string::npos) << message;
    } else {
      EXPECT_EQ(status(name)["phase"], "Pending");
      EXPECT_EQ(condition("Planned", name)["reason"], "WaitingForResources");
    }
    store.remove(kPods, "default", "holder-" + name);
  }
}

// A plan made for a cluster that is not there (other pods missing from the inventory at that
// moment) leaves a gang that can never be scheduled: once every pod of it is Unschedulable, the
// job is planned again for the cluster as it is, as a new attempt (not a restart).
TEST_F(ControllerTest, GangThatCannotBeScheduled_IsPlannedAgainForTheClusterAsItIs) {
  store.create(kTrainingJobs, "default", tiny_job("job"));
  reconcile();
  Object pod = store.get(kPods, "default", "job-worker-0");
  const double cpus = quantity(pod["spec"]["containers"][0]["resources"]["requests"]["cpu"]);
  ASSERT_GT(cpus, 1.0) << "the test needs a plan that takes more than one of node-a's cores";
  reconcile();  // a pass with nothing new keeps the plan and the pod
  EXPECT_EQ(store.get(kPods, "default", "job-worker-0")["metadata"]["uid"], pod["metadata"]["uid"]);
  store.create(kPods, "default",
               {{"metadata", {{"name", "other"}, {"namespace", "default"}}},
                {"spec",
                 {{"nodeName", "node-a"},
                  {"containers",
                   {{{"name", "c"}, {"resources", {{"requests", {{"cpu", "3"}}}}}}}}}}});
  set_pod_status("job-worker-0",
                 {{"phase", "Pending"},
                  {"conditions",
                   Object::array({{{"type", "PodScheduled"},
                                   {"status", "False"},
                                   {"reason", "Unschedulable"},
                                   {"message", "0/1 nodes are available: Insufficient cpu"}}})}});
  reconcile();
  reconcile();
  const Object again = store.get(kPods, "default", "job-worker-0");
  EXPECT_NE(again["metadata"]["uid"], pod["metadata"]["uid"]);
  EXPECT_EQ(attempt_of(again), "1");
  EXPECT_LE(quantity(again["spec"]["containers"][0]["resources"]["requests"]["cpu"]), 1.0);
  EXPECT_EQ(status()["restarts"], 0);
}

TEST_F(ControllerTest, JobThatFitsOnlyWhenOtherPodsLeave_WaitsInsteadOfFailing) {
  // Another pod holds 15.5 of node-a's 16 GiB: GPT-2 124M on the CPU does not fit beside it,
  // but fits the node, so the job waits for the memory (it would fail on a smaller node).
  store.create(kPods, "default",
               {{"metadata", {{"name", "hog"}, {"namespace", "default"}}},
                {"spec",
                 {{"nodeName", "node-a"},
                  {"containers",
                   {{{"name", "c"}, {"resources", {{"requests", {{"memory", "15872Mi"}}}}}}}}}}});
  Object j = tiny_job("job");
  j["spec"]["model"] = {{"preset", "gpt2-124m"}};
  store.create(kTrainingJobs, "default", j);
  reconcile();
  EXPECT_EQ(status()["phase"], "Pending");
  EXPECT_EQ(condition("Planned")["reason"], "WaitingForResources");
  store.remove(kPods, "default", "hog");
  reconcile();
  EXPECT_EQ(condition("Planned")["status"], "True");
  EXPECT_TRUE(store.get(kPods, "default", "job-worker-0").is_object());
}

TEST_F(ControllerTest, Progress_IsKeptToFourSignificantDigits_ForKubectl) {
  store.create(kTrainingJobs, "default", tiny_job("job"));
  reconcile();
  set_pod_running("job-worker-0");
  metrics_text =
      "kubetrain_worker_steps_total{rank=\"0\"} 40\n"
      "kubetrain_worker_loss{rank=\"0\"} 5.182575702667236\n"
      "kubetrain_worker_tokens_per_second{rank=\"0\"} 102935.73934901589\n";
  reconcile();
  EXPECT_DOUBLE_EQ(status()["progress"]["loss"].get<double>(), 5.183);
  EXPECT_DOUBLE_EQ(status()["progress"]["tokensPerSecond"].get<double>(), 102936);
}

TEST_F(ControllerTest, RunningPods_MakeTheJobRunning_WithProgressFromRankZero) {
  store.create(kTrainingJobs, "default", tiny_job("job"));
  reconcile();
  set_pod_running("job-worker-0");
  metrics_text =
      "# TYPE kubetrain_worker_steps_total counter\n"
      "kubetrain_worker_steps_total{trainingjob=\"job\",rank=\"1\"} 99\n"
      "kubetrain_worker_steps_total{trainingjob=\"job\",rank=\"0\"} 40\n"
      "kubetrain_worker_loss{trainingjob=\"job\",rank=\"0\"} 3.25\n"
      "kubetrain_worker_tokens_per_second{trainingjob=\"job\",rank=\"0\"} 512\n"
      "kubetrain_worker_last_checkpoint_step{trainingjob=\"job\",rank=\"0\"} 20\n";
  const auto result = reconcile();
  EXPECT_EQ(fetched_host, "10.0.0.7");
  EXPECT_EQ(fetched_port, 9090);
  const Object s = status();
  EXPECT_EQ(s["phase"], "Running");
  EXPECT_EQ(s["progress"]["step"], 40);
  EXPECT_DOUBLE_EQ(s["progress"]["loss"].get<double>(), 3.25);
  EXPECT_DOUBLE_EQ(s["progress"]["tokensPerSecond"].get<double>(), 512);
  // 8 sequences × 64 tokens per step at 512 tokens/s = 1 s per step; 60 steps left.
  EXPECT_DOUBLE_EQ(s["progress"]["stepSeconds"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(s["progress"]["etaSeconds"].get<double>(), 60.0);
  EXPECT_EQ(s["lastCheckpointStep"], 20);
  EXPECT_FALSE(s["startTime"].get<std::string>().empty());
  EXPECT_EQ(condition("Running")["status"], "True");
  EXPECT_EQ(condition("PodsReady")["status"], "True");
  EXPECT_EQ(s["workers"]["ready"], 1);
  ASSERT_TRUE(result.requeue_after);  // progress is polled
  EXPECT_LE(*result.requeue_after, options.progress_interval);
}

TEST_F(ControllerTest, ResumedWorker_ProgressIsTheJobsStep_NotTheProcesss) {
  // A gang resumed at step 100 has run 10 steps in this process: the job is at step 110.
  Object j = tiny_job("job");
  j["spec"]["training"]["steps"] = 200;
  store.create(kTrainingJobs, "default", j);
  reconcile();
  set_pod_running("job-worker-0");
  metrics_text =
      "kubetrain_worker_steps_total{rank=\"0\"} 10\n"
      "kubetrain_worker_step{rank=\"0\"} 110\n"
      "kubetrain_worker_tokens_per_second{rank=\"0\"} 512\n";
  reconcile();
  EXPECT_EQ(status()["progress"]["step"], 110);
  // 8 × 64 tokens at 512 tokens/s: 1 s a step, 90 left.
  EXPECT_DOUBLE_EQ(status()["progress"]["etaSeconds"].get<double>(), 90.0);
}

TEST_F(ControllerTest, RemappedMetricsPort_IsReadFromThePodAnnotation) {
  store.create(kTrainingJobs, "default", tiny_job("job"));
  reconcile();
  store.merge_patch(kPods, "default", "job-worker-0",
                    {{"metadata", {{"annotations", {{"kubetrain.dev/metrics-port", "40123"}}}}}});
  set_pod_running("job-worker-0");
  metrics_text = "";
  reconcile();
  EXPECT_EQ(fetched_port, 40123);
}

TEST_F(ControllerTest, Reconcile_IsIdempotent_PlanAndPodsStayAndStatusIsNotRewritten) {
  store.create(kTrainingJobs, "default", tiny_job("job"));
  reconcile();
  set_pod_running("job-worker-0");
  reconcile();
  const std::string cm_version =
      store.get(kConfigMaps, "default", "job-plan")["metadata"]["resourceVersion"];
  const std::string pod_uid = pods()[0]["metadata"]["uid"];
  const std::string job_version = job()["metadata"]["resourceVersion"];
  for (int i = 0; i < 3; ++i) reconcile();
  EXPECT_EQ(store.get(kConfigMaps, "default", "job-plan")["metadata"]["resourceVersion"],
            cm_version);
  ASSERT_EQ(pods().size(), 1u);
  EXPECT_EQ(pods()[0]["metadata"]["uid"], pod_uid);
  EXPECT_EQ(job()["metadata"]["resourceVersion"], job_version);  // no status write without change
  EXPECT_EQ(event_reasons().size(), 1u);
}

TEST_F(ControllerTest, InventoryChangeWhileRunning_KeepsThePlan_ButANewGenerationReplans) {
  store.create(kTrainingJobs, "default", tiny_job("job"));
  reconcile();
  set_pod_running("job-worker-0");
  reconcile();
  const std::string hash = status()["plan"]["planHash"];
  add_node(cpu_node("node-b", 64));  // a bigger node appears
  reconcile();
  EXPECT_EQ(status()["plan"]["planHash"], hash);
  EXPECT_EQ(attempt_of(pods()[0]), "0");
  // A spec change (here: the batch) is a new generation: new plan, new gang, no restart counted.
  Object j = job();
  j["spec"]["training"]["globalBatchSize"] = 16;
  store.update(kTrainingJobs, "default", j);
  reconcile();
  EXPECT_NE(status()["plan"]["planHash"], hash);
  ASSERT_EQ(pods().size(), 1u);
  EXPECT_EQ(attempt_of(pods()[0]), "1");
  EXPECT_EQ(status()["restarts"], 0);
  EXPECT_EQ(status()["observedGeneration"], 2);
}

TEST_F(ControllerTest, GangRestart_ReplansWhenTheInventoryChanged) {
  store.create(kTrainingJobs, "default", tiny_job("job"));
  reconcile();
  set_pod_running("job-worker-0");
  reconcile();
  const std::string hash = status()["plan"]["planHash"];
  // node-a goes (cordoned), node-b comes: the running gang keeps its plan ...
  Object a = store.get(kube::kNodes, "", "node-a");
  a["spec"]["unschedulable"] = true;
  store.update(kube::kNodes, "", a);
  add_node(cpu_node("node-b", 8));
  reconcile();
  EXPECT_EQ(status()["plan"]["planHash"], hash);
  // ... until it fails: the new gang is planned for node-b.
  set_pod_exited("job-worker-0", 137);
  reconcile();
  EXPECT_NE(status()["plan"]["planHash"], hash);
  ASSERT_EQ(pods().size(), 1u);
  EXPECT_EQ(pods()[0]["spec"]["nodeSelector"]["kubernetes.io/hostname"], "node-b");
  EXPECT_EQ(attempt_of(pods()[0]), "1");
  EXPECT_EQ(status()["restarts"], 1);
  const api::Plan plan = api::decode_plan(Object::parse(
      store.get(kConfigMaps, "default", "job-plan")["data"]["plan.json"].get<std::string>()));
  EXPECT_EQ(plan.placement, std::vector<std::string>{"node-b"});
}

// A hardware-profile ConfigMap of the namespace: `name`, labelled `kind`, profile.yaml `yaml`.
void store_profile(local::Store& store, const std::string& name, const std::string& kind,
                   const std::string& yaml) {
  store.create(kConfigMaps, "default",
               {{"apiVersion", "v1"},
                {"kind", "ConfigMap"},
                {"metadata",
                 {{"name", name}, {"labels", {{"kubetrain.dev/hardware-profile", kind}}}}},
                {"data", {{"profile.yaml", yaml}}}});
}

api::Plan stored_plan(local::Store& store, const std::string& job = "job") {
  return api::decode_plan(Object::parse(
      store.get(kConfigMaps, "default", job + "-plan")["data"]["plan.json"].get<std::string>()));
}

// Rank 0's metrics after `steps` steps in which each phase took `scale[phase]` times what the
// plan predicts (1 where not given; a phase scaled by a negative number is left out).
std::string phase_metrics(const api::Plan& plan, int steps,
                          const std::map<std::string, double>& scale) {
  std::string text = "kubetrain_worker_steps_total{rank=\"0\"} " + std::to_string(steps) +
                     "\nkubetrain_worker_step{rank=\"0\"} " + std::to_string(steps) + "\n";
  double step_seconds = 0;
  for (const api::TimePhase& phase : api::kTimePhases) {
    const auto it = scale.find(phase.name);
    const double seconds = plan.predicted.time.*phase.seconds * (it == scale.end() ? 1 : it->second);
    if (seconds < 0) continue;
    text += "kubetrain_worker_phase_seconds_total{rank=\"0\",phase=\"" + std::string(phase.name) +
            "\"} " + std::to_string(seconds * steps) + "\n";
    if (std::string(phase.name) == "compute" || std::string(phase.name).ends_with("_exposed") ||
        std::string(phase.name) == "optimizer_gpu")
      step_seconds += seconds;
  }
  const double tokens = static_cast<double>(plan.global_batch * plan.model.seq_len);
  text += "kubetrain_worker_tokens_per_second{rank=\"0\"} " +
          std::to_string(tokens / step_seconds) + "\n";
  return text;
}

Object h100_node(const std::string& name) {
  return {{"apiVersion", "v1"},
          {"kind", "Node"},
          {"metadata",
           {{"name", name},
            {"labels",
             {{"kubernetes.io/hostname", name},
              {"nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"},
              {"nvidia.com/gpu.memory", "81559"}}}}},
          {"status",
           {{"allocatable", {{"cpu", "112"}, {"memory", "2Ti"}, {"nvidia.com/gpu", "8"}}},
            {"capacity", {{"cpu", "112"}, {"memory", "2Ti"}, {"nvidia.com/gpu", "8"}}}}}};
}

std::optional<api::MeasuredProfile> folded_profile(local::Store& store) {
  kube::ListOptions opts;
  opts.label_selector = "kubetrain.dev/hardware-profile";
  for (const Object& cm : store.list(kConfigMaps, "default", opts).items) {
    api::MeasuredProfile p = api::decode_measured_profile(
        api::yaml_to_json(cm["data"]["profile.yaml"].get<std::string>()));
    if (p.provenance.count("foldedBackFrom")) return p;  // autotune's, not one put there
  }
  return std::nullopt;
}

api::Plan ControllerTest::start_gpt2_on_h100(int64_t steps) {
  add_node(h100_node("gpu-a"));
  Object j = tiny_job("job");
  j["spec"]["model"] = {{"preset", "gpt2-124m"}};
  j["spec"]["training"] = {{"steps", steps}, {"globalBatchSize", 64}};
  j["spec"]["resources"] = Object::object();
  store.create(kTrainingJobs, "default", j);
  reconcile();
  set_pod_running("job-worker-0");
  return stored_plan(store);
}

TEST_F(ControllerTest, Autotune_CollectivesSlowerThanPredicted_SwitchesToAPlanThatNeedsFewer) {
  options.autotune_restart_cost = std::chrono::seconds(0);
  const api::Plan first = start_gpt2_on_h100(100000);
  ASSERT_GT(first.config.tp, 1) << "the built-in H100 figures choose tensor parallelism here";
  // Before the warm-up: nothing is decided.
  metrics_text = phase_metrics(first, 5, {{"tp_comm_total", 6}, {"tp_comm_exposed", 6}});
  reconcile();
  EXPECT_FALSE(status().contains("autotune"));
  // The TP all-reduces took 6x what the figures said (a loaded fabric).
  metrics_text = phase_metrics(first, 30, {{"tp_comm_total", 6}, {"tp_comm_exposed", 6}});
  reconcile();
  const Object s = status();
  ASSERT_TRUE(s.contains("autotune")) << s.dump(2);
  EXPECT_EQ(s["autotune"]["evaluatedAttempt"], 0);
  // The fold-back: the kind's profile ConfigMap carries the measured scale and its origin.
  const auto folded = folded_profile(store);
  ASSERT_TRUE(folded);
  EXPECT_NEAR(folded->profile.tp_comm_scale, 6.0, 0.01);
  EXPECT_NEAR(folded->profile.compute_scale, 1.0, 0.01);
  EXPECT_EQ(folded->provenance.at("foldedBackFrom"), "default/job");
  // With those figures a plan with less TP predicts >= 10% more: switched.
  ASSERT_EQ(s["autotune"]["switches"], 1) << s["autotune"]["message"];
  ASSERT_EQ(s["planHistory"].size(), 1u);
  const Object change = s["planHistory"][0];
  EXPECT_EQ(change["reason"], "Autotune");
  EXPECT_EQ(change["fromPlanHash"], first.plan_hash);
  EXPECT_EQ(change["toPlanHash"], s["plan"]["planHash"]);
  EXPECT_GT(change["fromPredictedStepSeconds"].get<double>(),
            1.1 * change["toPredictedStepSeconds"].get<double>());
  EXPECT_TRUE(change.contains("measuredStepSeconds"));
  EXPECT_LT(s["plan"]["tp"].get<int64_t>(), first.config.tp);
  EXPECT_EQ(s["phase"], "Restarting");
  EXPECT_EQ(condition("Restarting")["reason"], "Autotune");
  const std::vector<std::string> reasons = event_reasons();
  EXPECT_NE(std::find(reasons.begin(), reasons.end(), "Replanned"), reasons.end());
  // The old gang went (its workers checkpoint on SIGTERM); the next attempt runs the new plan,
  // and a switch is no restart.
  EXPECT_TRUE(pods().empty());
  reconcile();
  ASSERT_EQ(pods().size(), 1u);
  EXPECT_EQ(attempt_of(pods()[0]), "1");
  EXPECT_EQ(pods()[0]["metadata"]["labels"]["kubetrain.dev/plan-hash"], s["plan"]["planHash"]);
  EXPECT_EQ(status()["restarts"], 0);
  const api::Plan second = stored_plan(store);
  EXPECT_EQ(second.plan_hash, s["plan"]["planHash"]);
  // The new plan measures as predicted with the folded figures: it stays.
  set_pod_running("job-worker-0");
  metrics_text = phase_metrics(second, 30, {});
  reconcile();
  EXPECT_EQ(status()["autotune"]["switches"], 1);
  EXPECT_EQ(status()["autotune"]["evaluatedAttempt"], 1);
  EXPECT_EQ(status()["phase"], "Running");
  EXPECT_EQ(stored_plan(store).plan_hash, second.plan_hash);
  // Once per attempt: the same figures again decide nothing new.
  const std::string version = job()["metadata"]["resourceVersion"];
  reconcile();
  EXPECT_EQ(job()["metadata"]["resourceVersion"], version);
}

TEST_F(ControllerTest, Autotune_SlowComputeOnOneRank_IsFoldedBack_ButEveryPlanSlowsAlike) {
  options.autotune_restart_cost = std::chrono::seconds(0);
  Object j = tiny_job("job");
  j["spec"]["training"]["steps"] = 100000;
  store.create(kTrainingJobs, "default", j);
  reconcile();
  set_pod_running("job-worker-0");
  const api::Plan first = stored_plan(store);
  metrics_text = phase_metrics(first, 30, {{"compute", 3}});
  reconcile();
  const Object s = status();
  ASSERT_TRUE(s.contains("autotune"));
  EXPECT_EQ(s["autotune"]["switches"], 0);
  EXPECT_NE(s["autotune"]["message"].get<std::string>().find("fastest"), std::string::npos)
      << s["autotune"]["message"];
  // The running plan predicted again with the measured figures: 3x the compute.
  EXPECT_GT(s["autotune"]["refitStepSeconds"].get<double>(), 2 * first.predicted.step_seconds);
  const auto folded = folded_profile(store);
  ASSERT_TRUE(folded);
  EXPECT_NEAR(folded->profile.compute_scale, 3.0, 0.01);
  EXPECT_EQ(stored_plan(store).plan_hash, first.plan_hash);
  EXPECT_EQ(s["phase"], "Running");
}

TEST_F(ControllerTest, Autotune_KeepsThePlan_WhenTheStepsLeftDoNotRepayARestart) {
  // 100 steps of 15 ms save far less than the 120 s a restart is taken to cost.
  const api::Plan first = start_gpt2_on_h100(100);
  metrics_text = phase_metrics(first, 30, {{"tp_comm_total", 6}, {"tp_comm_exposed", 6}});
  reconcile();
  const Object s = status();
  ASSERT_TRUE(s.contains("autotune"));
  EXPECT_EQ(s["autotune"]["switches"], 0);
  EXPECT_NE(s["autotune"]["message"].get<std::string>().find("not more than a restart costs"),
            std::string::npos)
      << s["autotune"]["message"];
  EXPECT_FALSE(s.contains("planHistory"));
  EXPECT_EQ(stored_plan(store).plan_hash, first.plan_hash);
  EXPECT_EQ(attempt_of(pods()[0]), "0");
  EXPECT_EQ(s["phase"], "Running");
}

TEST_F(ControllerTest, Autotune_NoSwitchesLeft_FoldsBackButKeepsThePlan) {
  options.autotune_restart_cost = std::chrono::seconds(0);
  options.autotune_max_switches = 0;
  const api::Plan first = start_gpt2_on_h100(100000);
  metrics_text = phase_metrics(first, 30, {{"tp_comm_total", 6}, {"tp_comm_exposed", 6}});
  reconcile();
  const Object s = status();
  EXPECT_EQ(s["autotune"]["switches"], 0);
  EXPECT_NE(s["autotune"]["message"].get<std::string>().find("switch(es) allowed"),
            std::string::npos)
      << s["autotune"]["message"];
  EXPECT_EQ(stored_plan(store).plan_hash, first.plan_hash);
  const auto folded = folded_profile(store);
  ASSERT_TRUE(folded);
  EXPECT_NEAR(folded->profile.tp_comm_scale, 6.0, 0.01);
}

TEST_F(ControllerTest, Autotune_ProfileChangedSinceThePlan_RefitsAgainstTheFiguresAsTheyAreNow) {
  options.autotune_max_switches = 0;
  const api::Plan first = start_gpt2_on_h100(100000);  // planned with the built-in figures
  // Another job's fold-back has since put TP all-reduces at 3x.
  const std::string kind = api::find_profile("NVIDIA-H100-80GB-HBM3")->name;
  store_profile(store, "kubetrain-profile-x", "x",
                "apiVersion: kubetrain.dev/v1alpha1\nkind: HardwareProfile\nmetadata: {name: " +
                    kind + "}\nspec: {tpCommScale: 3}\n");
  // This job's all-reduces ran 6x what the built-in figures said in total (and it did not say
  // how much of that was exposed): the scale is 6, not 3 x 6.
  metrics_text = phase_metrics(first, 30, {{"tp_comm_total", 6}, {"tp_comm_exposed", -1}});
  reconcile();
  const auto folded = folded_profile(store);
  ASSERT_TRUE(folded);
  EXPECT_NEAR(folded->profile.tp_comm_scale, 6.0, 0.01);
}

TEST_F(ControllerTest, Autotune_Off_NeverReplans) {
  options.autotune_restart_cost = std::chrono::seconds(0);
  Object j = tiny_job("job");
  j["spec"]["training"]["steps"] = 100000;
  j["spec"]["parallelism"] = {{"autotune", "off"}};
  store.create(kTrainingJobs, "default", j);
  reconcile();
  set_pod_running("job-worker-0");
  const api::Plan first = stored_plan(store);
  metrics_text = phase_metrics(first, 30, {{"compute", 6}, {"tp_comm_total", 6},
                                           {"dp_comm_total", 6}});
  reconcile();
  EXPECT_FALSE(status().contains("autotune"));
  EXPECT_EQ(stored_plan(store).plan_hash, first.plan_hash);
  EXPECT_THROW(store.get(kConfigMaps, "default", "kubetrain-profile-cpu"), kube::ApiError);
}

TEST_F(ControllerTest, StoredProfile_IsPlannedWith_AndABrokenOneIsSaidInAnEvent) {
  // A measured profile in a labelled ConfigMap: the plan's peak is its figure.
  const std::string profile =
      "apiVersion: kubetrain.dev/v1alpha1\nkind: HardwareProfile\nmetadata: {name: cpu}\n"
      "spec: {peakFp32Flops: 3.0e10, computeScale: 2}\n";
  store_profile(store, "kubetrain-profile-cpu", "cpu", profile);
  store_profile(store, "kubetrain-profile-bad", "h200", "kind: HardwareProfile\n");
  store.create(kTrainingJobs, "default", tiny_job("job"));
  reconcile();
  const api::Plan plan = stored_plan(store);
  EXPECT_EQ(plan.peak_source.find("measured"), 0u) << plan.peak_source;
  const std::vector<std::string> reasons = event_reasons();
  EXPECT_NE(std::find(reasons.begin(), reasons.end(), "InvalidHardwareProfile"), reasons.end());
  // The plan ConfigMap's inventory hash names the profile's version: a new one re-plans at the
  // next (re)start.
  const std::string hash = store.get(kConfigMaps, "default", "job-plan")["metadata"]
                               ["annotations"]["kubetrain.dev/inventory-hash"];
  EXPECT_NE(hash.find("kubetrain-profile-cpu@"), std::string::npos) << hash;
}

// Profiling pods (docs/PLANNER.md §11a): a CPU job for nodes with no profile waits while a profiling pod
// measures one; what it returns (its termination message) becomes the kind's ConfigMap and the
// job is planned with it; the pod is removed.
TEST_F(ControllerTest, Profiling_NoProfile_RunsAPodAndPlansWithWhatItMeasured) {
  options.profiling = true;
  options.profiling_quick = true;
  store.create(kTrainingJobs, "default", tiny_job("job"));
  const ReconcileResult r = reconcile();
  EXPECT_EQ(status()["phase"], "Pending");
  EXPECT_EQ(condition("Planned")["reason"], "ProfilingNodes");
  EXPECT_TRUE(r.requeue_after.has_value());
  EXPECT_THROW(store.get(kConfigMaps, "default", "job-plan"), kube::ApiError) << "not planned";
  const Object pod = store.get(kPods, "default", "kubetrain-profile-cpu");
  EXPECT_EQ(pod["spec"]["nodeSelector"]["kubernetes.io/hostname"], "node-a");
  EXPECT_EQ(pod["spec"]["restartPolicy"], "Never");
  EXPECT_EQ(pod["spec"]["containers"][0]["command"],
            Object({"kubetrain-worker", "profile", "--termination-message", "--device", "cpu",
                    "--quick"}));
  EXPECT_EQ(pod["spec"]["containers"][0]["resources"]["requests"]["cpu"], "1");
  EXPECT_EQ(pod["spec"]["securityContext"]["runAsNonRoot"], true) << "restricted, as workers";
  reconcile();  // still running: still waiting, no second pod
  EXPECT_EQ(condition("Planned")["reason"], "ProfilingNodes");
  EXPECT_EQ(pods().size(), 1u);

  const std::string measured =
      "{\"apiVersion\":\"kubetrain.dev/v1alpha1\",\"kind\":\"HardwareProfile\","
      "\"metadata\":{\"name\":\"cpu\"},\"provenance\":{\"host\":\"node-a\","
      "\"date\":\"2026-12-04T21:00:00Z\"},\"spec\":{\"peakFp32Flops\":3.0e10}}";
  set_profile_returned(measured);
  reconcile();
  const Object cm = store.get(kConfigMaps, "default", "kubetrain-profile-cpu");
  EXPECT_EQ(cm["metadata"]["labels"]["kubetrain.dev/hardware-profile"], "cpu");
  const api::MeasuredProfile stored = api::decode_measured_profile(
      api::yaml_to_json(cm["data"]["profile.yaml"].get<std::string>(), "cm"));
  EXPECT_DOUBLE_EQ(stored.profile.peak_fp32_flops, 3.0e10);
  EXPECT_EQ(stored.provenance.at("profilingPod"), "default/kubetrain-profile-cpu");
  EXPECT_THROW(store.get(kPods, "default", "kubetrain-profile-cpu"), kube::ApiError)
      << "the profiling pod is removed once stored";
  const api::Plan plan = stored_plan(store);
  EXPECT_EQ(plan.peak_source, "measured on node-a 2026-12-04T21:00:00Z");
  const std::vector<std::string> reasons = event_reasons();
  EXPECT_NE(std::find(reasons.begin(), reasons.end(), "ProfilingNodes"), reasons.end());
  EXPECT_NE(std::find(reasons.begin(), reasons.end(), "Profiled"), reasons.end());

  // The next job in the namespace finds the profile: no pod, planned at once.
  store.create(kTrainingJobs, "default", tiny_job("second"));
  reconcile("second");
  EXPECT_THROW(store.get(kPods, "default", "kubetrain-profile-cpu"), kube::ApiError);
  EXPECT_EQ(stored_plan(store, "second").peak_source, plan.peak_source);
}

// A GPU job's node kinds are profiled on a node of each kind (docs/PLANNER.md §11a): the pod asks
// for every GPU of the node (NCCL between two) and names the kind; no CPU profiling for it.
TEST_F(ControllerTest, Profiling_GpuJob_MeasuresItsGpuKindWithEveryGpuOfANode) {
  options.profiling = true;
  add_node(h100_node("gpu-a"));
  Object j = tiny_job("job");
  j["spec"]["model"] = {{"preset", "gpt2-124m"}};
  j["spec"]["training"] = {{"steps", 100}, {"globalBatchSize", 64}};
  j["spec"]["resources"] = Object::object();
  store.create(kTrainingJobs, "default", j);
  reconcile();
  ASSERT_EQ(condition("Planned")["reason"], "ProfilingNodes");
  EXPECT_NE(condition("Planned")["message"].get<std::string>().find("H100-SXM on gpu-a"),
            std::string::npos)
      << condition("Planned")["message"];
  ASSERT_EQ(pods().size(), 1u) << "the GPU kind only: the CPU node is not the job's";
  const Object pod = store.get(kPods, "default", "kubetrain-profile-h100-sxm");
  EXPECT_EQ(pod["metadata"]["labels"]["kubetrain.dev/profiling"], "h100-sxm");
  EXPECT_EQ(pod["metadata"]["annotations"]["kubetrain.dev/node-kind"], "H100-SXM");
  EXPECT_EQ(pod["spec"]["nodeSelector"]["kubernetes.io/hostname"], "gpu-a");
  EXPECT_EQ(pod["spec"]["containers"][0]["command"],
            Object({"kubetrain-worker", "profile", "--termination-message", "--device", "cuda",
                    "--kind", "H100-SXM"}));
  const Object resources = pod["spec"]["containers"][0]["resources"];
  EXPECT_EQ(resources["limits"]["nvidia.com/gpu"], "8");
  EXPECT_EQ(resources["requests"]["nvidia.com/gpu"], "8");

  set_profile_returned(
      "{\"apiVersion\":\"kubetrain.dev/v1alpha1\",\"kind\":\"HardwareProfile\","
      "\"metadata\":{\"name\":\"H100-SXM\"},\"provenance\":{\"host\":\"gpu-a\","
      "\"date\":\"2026-12-05T15:00:00Z\"},\"spec\":{\"peakBf16Flops\":7.0e14}}",
      "kubetrain-profile-h100-sxm");
  reconcile();
  const Object cm = store.get(kConfigMaps, "default", "kubetrain-profile-h100-sxm");
  EXPECT_EQ(cm["metadata"]["labels"]["kubetrain.dev/hardware-profile"], "h100-sxm");
  const api::Plan plan = stored_plan(store);
  EXPECT_EQ(plan.peak_source, "measured on gpu-a 2026-12-05T15:00:00Z");
  EXPECT_EQ(plan.device, api::DeviceKind::kCuda);
  EXPECT_THROW(store.get(kPods, "default", "kubetrain-profile-h100-sxm"), kube::ApiError);
  EXPECT_THROW(store.get(kConfigMaps, "default", "kubetrain-profile-cpu"), kube::ApiError);
}

// A profile ConfigMap that does not decode is no profile: the node kind is measured again and the
// measurement replaces it (else every plan would profile again).
TEST_F(ControllerTest, Profiling_ABrokenStoredProfileIsReplacedByTheMeasurement) {
  options.profiling = true;
  store_profile(store, "kubetrain-profile-cpu", "cpu", "kind: HardwareProfile\n");
  store.create(kTrainingJobs, "default", tiny_job("job"));
  reconcile();
  ASSERT_EQ(condition("Planned")["reason"], "ProfilingNodes");
  set_profile_returned(
      "{\"apiVersion\":\"kubetrain.dev/v1alpha1\",\"kind\":\"HardwareProfile\","
      "\"metadata\":{\"name\":\"cpu\"},\"provenance\":{\"host\":\"node-a\","
      "\"date\":\"2026-12-04T22:00:00Z\"},\"spec\":{\"peakFp32Flops\":4.0e10}}");
  reconcile();
  EXPECT_EQ(stored_plan(store).peak_source, "measured on node-a 2026-12-04T22:00:00Z");
  const Object cm = store.get(kConfigMaps, "default", "kubetrain-profile-cpu");
  EXPECT_NE(cm["data"]["profile.yaml"].get<std::string>().find("peakFp32Flops: 4"),
            std::string::npos);
}

// A profiling pod that fails, or returns what is no profile, or outlives the timeout, does not
// hold the job: it is planned with the built-in figures and a Warning says why.
TEST_F(ControllerTest, Profiling_FailedOrBrokenOrSlow_PlansWithTheBuiltInFigures) {
  options.profiling = true;
  for (const std::string how : {"failed", "garbage", "slow"}) {
    SCOPED_TRACE(how);
    const std::string name = "job-" + how;
    store.create(kTrainingJobs, "default", tiny_job(name));
    reconcile(name);
    ASSERT_EQ(condition("Planned", name)["reason"], "ProfilingNodes");
    if (how == "failed") {
      set_pod_exited("kubetrain-profile-cpu", 1);
    } else if (how == "garbage") {
      set_profile_returned("{\"kind\": 3");
    } else {
      now += options.profiling_timeout + std::chrono::seconds(1);
    }
    reconcile(name);
    const api::Plan plan = stored_plan(store, name);
    EXPECT_EQ(plan.peak_source, "built-in cpu profile");
    EXPECT_THROW(store.get(kConfigMaps, "default", "kubetrain-profile-cpu"), kube::ApiError);
    const std::vector<std::string> reasons = event_reasons();
    EXPECT_NE(std::find(reasons.begin(), reasons.end(), "ProfilingFailed"), reasons.end());
    // A failed pod stays for `kubectl logs` (and keeps the next job from profiling again until
    // it is deleted); the others are gone.
    if (how == "failed") {
      EXPECT_NO_THROW(store.get(kPods, "default", "kubetrain-profile-cpu"));
      store.remove(kPods, "default", "kubetrain-profile-cpu");
    } else if (how == "garbage") {
      EXPECT_NO_THROW(store.get(kPods, "default", "kubetrain-profile-cpu"));
      store.remove(kPods, "default", "kubetrain-profile-cpu");
    } else {
      EXPECT_THROW(store.get(kPods, "default", "kubetrain-profile-cpu"), kube::ApiError);
    }
  }
}

TEST_F(ControllerTest, ElasticRestart_NotReadyNodeIsLeftOut_MinNodesWaits_HistorySaysWhy) {
  add_node(cpu_node("node-b", 4));
  Object j = tiny_job("job");
  j["spec"]["training"]["globalBatchSize"] = 64;
  j["spec"]["parallelism"] = {{"dataParallel", "auto"}};
  store.create(kTrainingJobs, "default", j);
  reconcile();
  api::Plan first = stored_plan(store);
  ASSERT_EQ(first.config.nodes, 2) << "dataParallel over both nodes";
  for (const auto& p : pods()) set_pod_running(p["metadata"]["name"]);
  reconcile();
  // node-b stops being Ready and its worker dies: the restart plans for node-a alone.
  Object b = store.get(kube::kNodes, "", "node-b");
  b["status"]["conditions"] = {{{"type", "Ready"}, {"status", "False"}}};
  store.update_status(kube::kNodes, "", b);
  set_pod_exited("job-worker-1", 137);
  reconcile();
  const api::Plan second = stored_plan(store);
  EXPECT_EQ(second.placement, std::vector<std::string>{"node-a"});
  Object s = status();
  ASSERT_EQ(s["planHistory"].size(), 1u);
  EXPECT_EQ(s["planHistory"][0]["reason"], "InventoryChanged");
  EXPECT_EQ(s["planHistory"][0]["fromPlanHash"], first.plan_hash);
  EXPECT_EQ(s["planHistory"][0]["toPlanHash"], second.plan_hash);
  const std::vector<std::string> reasons = event_reasons();
  EXPECT_NE(std::find(reasons.begin(), reasons.end(), "Replanned"), reasons.end());
}

TEST_F(ControllerTest, MinNodes_MoreThanAreReady_WaitsInsteadOfPlanningSmaller) {
  add_node(cpu_node("node-b", 4));
  Object b = store.get(kube::kNodes, "", "node-b");
  b["status"]["conditions"] = {{{"type", "Ready"}, {"status", "Unknown"}}};
  store.update_status(kube::kNodes, "", b);
  Object j = tiny_job("job");
  j["spec"]["resources"]["minNodes"] = 2;
  store.create(kTrainingJobs, "default", j);
  const auto result = reconcile();
  EXPECT_TRUE(pods().empty());
  EXPECT_EQ(status()["phase"], "Pending");
  EXPECT_EQ(condition("Planned")["reason"], "WaitingForResources");
  EXPECT_NE(condition("Planned")["message"].get<std::string>().find("spec.resources.minNodes"),
            std::string::npos)
      << condition("Planned")["message"];
  ASSERT_TRUE(result.requeue_after);
  // node-b is Ready again: the job plans for both.
  b = store.get(kube::kNodes, "", "node-b");
  b["status"]["conditions"] = {{{"type", "Ready"}, {"status", "True"}}};
  store.update_status(kube::kNodes, "", b);
  reconcile();
  EXPECT_EQ(stored_plan(store).config.nodes, 2);
  EXPECT_EQ(pods().size(), 2u);
}

TEST_F(ControllerTest, Suspend_DeletesPodsAndCreatesNone_ResumeStartsAgain) {
  Object j = tiny_job("job");
  j["spec"]["runPolicy"]["suspend"] = true;
  store.create(kTrainingJobs, "default", j);
  reconcile();
  EXPECT_TRUE(pods().empty());
  EXPECT_EQ(status()["phase"], "Suspended");
  EXPECT_EQ(condition("Suspended")["status"], "True");

  j = job();
  j["spec"]["runPolicy"]["suspend"] = false;
  store.update(kTrainingJobs, "default", j);
  reconcile();
  EXPECT_EQ(pods().size(), 1u);
  EXPECT_EQ(condition("Suspended")["status"], "False");
  EXPECT_EQ(condition("Suspended")["reason"], "Resumed");
  set_pod_running("job-worker-0");
  reconcile();

  j = job();
  j["spec"]["runPolicy"]["suspend"] = true;
  store.update(kTrainingJobs, "default", j);
  reconcile();
  EXPECT_TRUE(pods().empty());
  EXPECT_EQ(status()["phase"], "Suspended");
  EXPECT_EQ(status()["workers"]["ready"], 0);
}

TEST_F(ControllerTest, RetryableWorkerFailure_RestartsTheWholeGang_ThenFailsAfterBackoffLimit) {
  store.create(kTrainingJobs, "default", tiny_job("job"));  // backoffLimit 2
  reconcile();
  for (int restart = 1; restart <= 2; ++restart) {
    set_pod_running("job-worker-0");
    reconcile();
    set_pod_exited("job-worker-0", 137);  // SIGKILL (OOM): retryable
    reconcile();
    ASSERT_EQ(pods().size(), 1u);
    EXPECT_EQ(attempt_of(pods()[0]), std::to_string(restart));
    EXPECT_EQ(phase_of_pod(pods()[0]), "Pending");
    EXPECT_EQ(status()["restarts"], restart);
    EXPECT_EQ(status()["phase"], "Restarting");
    EXPECT_EQ(condition("Restarting")["status"], "True");
  }
  set_pod_running("job-worker-0");
  reconcile();
  EXPECT_EQ(status()["phase"], "Running");
  EXPECT_EQ(condition("Restarting")["status"], "False");
  set_pod_exited("job-worker-0", 143);
  reconcile();
  EXPECT_EQ(status()["phase"], "Failed");
  EXPECT_EQ(condition("Failed")["reason"], "BackoffLimitExceeded");
  EXPECT_EQ(status()["restarts"], 2);
  EXPECT_FALSE(status()["completionTime"].get<std::string>().empty());
  EXPECT_EQ(pods().size(), 1u);  // cleanPodPolicy Running keeps the failed pod for its logs
  const auto reasons = event_reasons();
  EXPECT_EQ(std::count(reasons.begin(), reasons.end(), "Restarting"), 2);
}

// The worker's own error (its termination message's `# error:` line) and the kubelet's OOMKilled
// are in the condition, not only in `kubectl logs`; a finished job's PodsReady is False.
TEST_F(ControllerTest, WorkerError_IsInTheFailedCondition_AndPodsReadyTurnsFalse) {
  store.create(kTrainingJobs, "default", tiny_job("job"));
  reconcile();
  set_pod_running("job-worker-0");
  reconcile();
  EXPECT_EQ(condition("PodsReady")["status"], "True");
  const Object terminated = {{"exitCode", 1},
                             {"reason", "Error"},
                             {"message", "# error: no file matches /data/train_*.bin\n"}};
  set_pod_terminated("job-worker-0", terminated);
  reconcile();
  EXPECT_EQ(status()["phase"], "Failed");
  const std::string message = condition("Failed")["message"];
  EXPECT_NE(message.find("exit code 1: no file matches /data/train_*.bin"), std::string::npos)
      << message;
  EXPECT_EQ(condition("PodsReady")["status"], "False");

  store.create(kTrainingJobs, "default", tiny_job("oom"));
  reconcile("oom");
  const Object killed = {{"exitCode", 137}, {"reason", "OOMKilled"}};
  set_pod_terminated("oom-worker-0", killed);
  reconcile("oom");
  EXPECT_EQ(status("oom")["phase"], "Restarting");
  EXPECT_NE(condition("Restarting", "oom")["message"].get<std::string>().find("OOMKilled"),
            std::string::npos);
}

TEST_F(ControllerTest, WorkerPodDeletedByHand_IsCreatedAgain_WithAnEvent) {
  store.create(kTrainingJobs, "default", tiny_job("job"));
  reconcile();
  set_pod_running("job-worker-0");
  reconcile();
  auto reasons = event_reasons();
  EXPECT_EQ(std::count(reasons.begin(), reasons.end(), "WorkerPodRecreated"), 0);
  store.remove(kPods, "default", "job-worker-0");
  reconcile();
  EXPECT_EQ(pods().size(), 1u);
  reasons = event_reasons();
  EXPECT_EQ(std::count(reasons.begin(), reasons.end(), "WorkerPodRecreated"), 1);
}

TEST_F(ControllerTest, PermanentExitCode_FailsAtOnce) {
  store.create(kTrainingJobs, "default", tiny_job("job"));
  reconcile();
  set_pod_exited("job-worker-0", 3);
  reconcile();
  EXPECT_EQ(status()["phase"], "Failed");
  EXPECT_EQ(condition("Failed")["reason"], "WorkerFailed");
  EXPECT_NE(condition("Failed")["message"].get<std::string>().find("exit code 3"),
            std::string::npos);
  EXPECT_EQ(status()["restarts"], 0);
  // Terminal: later reconciles create nothing.
  reconcile();
  EXPECT_EQ(pods().size(), 1u);
  EXPECT_EQ(attempt_of(pods()[0]), "0");
}

TEST_F(ControllerTest, Eviction_RestartsWithoutCountingAgainstTheLimit) {
  Object j = tiny_job("job");
  j["spec"]["runPolicy"]["backoffLimit"] = 0;
  store.create(kTrainingJobs, "default", j);
  reconcile();
  for (int i = 1; i <= 3; ++i) {
    set_pod_evicted("job-worker-0");
    reconcile();
    EXPECT_EQ(status()["phase"], "Restarting");
    EXPECT_EQ(status()["restarts"], 0);
    EXPECT_EQ(condition("Restarting")["reason"], "Evicted");
    EXPECT_EQ(attempt_of(pods()[0]), std::to_string(i));
  }
}

TEST_F(ControllerTest, ActiveDeadline_FailsTheJob_AndCleansRunningPods) {
  Object j = tiny_job("job");
  j["spec"]["runPolicy"]["activeDeadlineSeconds"] = 60;
  store.create(kTrainingJobs, "default", j);
  const auto first = reconcile();
  ASSERT_TRUE(first.requeue_after);
  EXPECT_EQ(*first.requeue_after, std::chrono::seconds(60));
  set_pod_running("job-worker-0");
  now += std::chrono::seconds(59);
  reconcile();
  EXPECT_EQ(status()["phase"], "Running");
  now += std::chrono::seconds(2);
  reconcile();
  EXPECT_EQ(status()["phase"], "Failed");
  EXPECT_EQ(condition("Failed")["reason"], "DeadlineExceeded");
  EXPECT_TRUE(pods().empty());  // cleanPodPolicy Running: the running pod was deleted
}

// The model of a started job is immutable: a changed spec.model is refused (condition and event,
// naming the field and both shapes) and the gang goes on with the model it started with, where
// it once failed for good when the new gang could not load the old checkpoint.
TEST_F(ControllerTest, ModelChangedWhileRunning_IsRefused_AndTheJobGoesOn) {
  store.create(kTrainingJobs, "default", tiny_job("job"));
  reconcile();
  set_pod_running("job-worker-0");
  metrics_text = "kubetrain_worker_step{rank=\"0\"} 40\nkubetrain_worker_steps_total{rank=\"0\"} 40\n";
  reconcile();
  const Object pod_before = store.get(kPods, "default", "job-worker-0");
  const std::string plan_before =
      store.get(kConfigMaps, "default", "job-plan")["data"]["plan.json"];
  Object j = job();
  j["spec"]["model"] = {{"preset", "tiny"}, {"layers", 3}};
  store.update(kTrainingJobs, "default", j);
  reconcile();
  EXPECT_EQ(status()["phase"], "Running");
  EXPECT_EQ(condition("ModelChangeRefused")["status"], "True");
  const std::string message = condition("ModelChangeRefused")["message"];
  EXPECT_NE(message.find("spec.model"), std::string::npos) << message;
  EXPECT_NE(message.find("now layers 3"), std::string::npos) << message;
  EXPECT_NE(message.find("started as layers 2"), std::string::npos) << message;
  const auto reasons = event_reasons();
  EXPECT_EQ(std::count(reasons.begin(), reasons.end(), "ModelChangeRefused"), 1);
  EXPECT_EQ(store.get(kPods, "default", "job-worker-0")["metadata"]["uid"],
            pod_before["metadata"]["uid"]);  // the gang was not replaced
  EXPECT_EQ(store.get(kConfigMaps, "default", "job-plan")["data"]["plan.json"], plan_before);

  // Changed back: the refusal is cleared.
  j = job();
  j["spec"]["model"] = {{"preset", "tiny"}};
  store.update(kTrainingJobs, "default", j);
  reconcile();
  EXPECT_EQ(condition("ModelChangeRefused")["status"], "False");
}

// Steps lowered below the progress: the job stops at once and says how many steps it trained.
TEST_F(ControllerTest, StepsLoweredBelowTheProgress_SucceedsSayingWhatWasTrained) {
  store.create(kTrainingJobs, "default", tiny_job("job"));
  reconcile();
  set_pod_running("job-worker-0");
  metrics_text = "kubetrain_worker_step{rank=\"0\"} 90\n";
  reconcile();
  Object j = job();
  j["spec"]["training"]["steps"] = 50;
  store.update(kTrainingJobs, "default", j);
  reconcile();
  for (const Object& pod : pods()) {
    const std::string name = pod["metadata"]["name"];
    const Object terminated = {{"exitCode", 0},
                               {"reason", "Completed"},
                               {"message", "kubetrain_worker_step 90\n"}};
    set_pod_terminated(name, terminated);
  }
  reconcile();
  EXPECT_EQ(status()["phase"], "Succeeded");
  EXPECT_EQ(status()["progress"]["step"], 90);
  const std::string message = condition("Succeeded")["message"];
  EXPECT_NE(message.find("completed 90 steps"), std::string::npos) << message;
  EXPECT_NE(message.find("spec.training.steps was lowered to 50"), std::string::npos) << message;
}

// A cache that lags a delete still holds the job: the reconciler asks the API before it creates
// the first child, and creates nothing for a job that is gone or was replaced (another uid).
TEST_F(ControllerTest, JobDeletedBehindAStaleCache_GetsNoChildren) {
  // Reads of the job come from a copy taken before the delete, as from a lagging informer.
  class StaleJobCache : public test::ForwardingClient {
   public:
    StaleJobCache(kube::Client& inner, Object job) : ForwardingClient(inner), job_(std::move(job)) {}
    Object get(const kube::Resource& r, const std::string& ns, const std::string& name) override {
      if (r == kTrainingJobs) return job_;
      return ForwardingClient::get(r, ns, name);
    }

   private:
    Object job_;
  };
  store.create(kTrainingJobs, "default", tiny_job("job"));
  const Object cached = job();
  store.remove(kTrainingJobs, "default", "job");
  StaleJobCache stale(store, cached);
  ControllerOptions with_api = options;
  with_api.api_reader = &store;
  EXPECT_NO_THROW(Controller(stale, with_api).reconcile("default", "job"));
  EXPECT_TRUE(pods().empty());
  EXPECT_TRUE(store.list(kConfigMaps, "default", {}).items.empty());
  EXPECT_TRUE(store.list(kube::kServices, "default", {}).items.empty());
  EXPECT_TRUE(store.list(kube::kPersistentVolumeClaims, "default", {}).items.empty());

  // A new job of the same name is another object: the old copy's reconcile leaves it alone.
  store.create(kTrainingJobs, "default", tiny_job("job"));
  EXPECT_NO_THROW(Controller(stale, with_api).reconcile("default", "job"));
  EXPECT_TRUE(pods().empty());
  reconcile();  // the live job's own reconcile makes its gang
  EXPECT_EQ(pods().size(), 1u);
}

// Durations are bounded (int32 seconds) and their arithmetic saturates: at the bound a deadline
// and a TTL lie decades ahead, and past it the spec is refused naming the field. (9,999,999,999 s
// added to a nanosecond clock once overflowed into the past: the job failed at once with
// DeadlineExceeded, or was deleted with its checkpoint PVC as it succeeded.)
TEST_F(ControllerTest, LongestDurations_NeitherExpireAtOnceNorOverflow) {
  Object j = tiny_job("job");
  j["spec"]["runPolicy"]["activeDeadlineSeconds"] = 2147483647;
  j["spec"]["runPolicy"]["ttlSecondsAfterFinished"] = 2147483647;
  store.create(kTrainingJobs, "default", j);
  const auto first = reconcile();
  ASSERT_TRUE(first.requeue_after);
  EXPECT_EQ(*first.requeue_after, std::chrono::hours(24));  // looked at again daily
  set_pod_running("job-worker-0");
  now += std::chrono::hours(24 * 365);
  reconcile();
  EXPECT_EQ(status()["phase"], "Running");
  set_pod_exited("job-worker-0", 0);
  const auto done = reconcile();
  EXPECT_EQ(status()["phase"], "Succeeded");
  ASSERT_TRUE(done.requeue_after);
  EXPECT_EQ(*done.requeue_after, std::chrono::hours(24));
  EXPECT_NO_THROW(job());

  for (const char* field : {"activeDeadlineSeconds", "ttlSecondsAfterFinished"}) {
    const std::string name = std::string("over-") + (field[0] == 'a' ? "deadline" : "ttl");
    Object over = tiny_job(name);
    over["spec"]["runPolicy"][field] = 9999999999LL;
    store.create(kTrainingJobs, "default", over);
    reconcile(name);
    EXPECT_EQ(status(name)["phase"], "Failed") << field;
    EXPECT_EQ(condition("Planned", name)["reason"], "InvalidSpec") << field;
    const std::string message = condition("Planned", name)["message"];
    EXPECT_NE(message.find(std::string("spec.runPolicy.") + field), std::string::npos) << message;
    EXPECT_NE(message.find("9999999999"), std::string::npos) << message;
    EXPECT_NO_THROW(job(name)) << field;  // refused, not deleted
  }
}

// A finished worker's /metrics is gone: the last loss and speed come from rank 0's termination
// message (Prometheus text the worker writes to KUBETRAIN_TERMINATION_MESSAGE_PATH).
TEST_F(ControllerTest, Succeeded_TakesTheFinalProgressFromTheTerminationMessage) {
  store.create(kTrainingJobs, "default", tiny_job("done"));
  reconcile("done");
  const Object pod = store.get(kPods, "default", "done-worker-0");
  const Object& container = pod["spec"]["containers"][0];
  EXPECT_EQ(container["terminationMessagePath"], "/dev/termination-log");
  bool env_set = false;
  for (const auto& e : container["env"])
    env_set |= e["name"] == "KUBETRAIN_TERMINATION_MESSAGE_PATH" &&
               e["value"] == "/dev/termination-log";
  EXPECT_TRUE(env_set);
  const Object terminated = {
      {"exitCode", 0},
      {"reason", "Completed"},
      {"message",
       "kubetrain_worker_steps_total 100\nkubetrain_worker_loss 2.125\n"
       "kubetrain_worker_tokens_per_second 31250\n"}};
  set_pod_status("done-worker-0",
                 {{"phase", "Succeeded"},
                  {"containerStatuses",
                   Object::array({{{"name", "worker"}, {"state", {{"terminated", terminated}}}}})}});
  reconcile("done");
  EXPECT_EQ(status("done")["phase"], "Succeeded");
  EXPECT_EQ(status("done")["progress"]["loss"], 2.125);
  EXPECT_EQ(status("done")["progress"]["tokensPerSecond"], 31250);
}

// A full or read-only checkpoint disk does not stop training (worker/trainer.cpp): rank 0's
// metrics count the failed saves, and the job says so until a save succeeds again.
TEST_F(ControllerTest, FailingCheckpoints_SetCheckpointFailingWithOneWarning_UntilOneSucceeds) {
  store.create(kTrainingJobs, "default", tiny_job("job"));
  reconcile();
  set_pod_running("job-worker-0");
  const std::string labels =
      "{trainingjob=\"job\",namespace=\"default\",rank=\"0\",node_rank=\"0\"";
  metrics_text = "kubetrain_worker_steps_total" + labels + "} 40\n" +
                 "kubetrain_worker_last_checkpoint_step" + labels + "} 20\n" +
                 "kubetrain_worker_checkpoint_consecutive_failures" + labels + "} 0\n";
  reconcile();
  EXPECT_TRUE(condition("CheckpointFailing").is_null()) << "no news is no condition";
  for (int failures = 1; failures <= 2; ++failures) {
    metrics_text =
        "kubetrain_worker_steps_total" + labels + "} " + std::to_string(40 + 10 * failures) + "\n" +
        "kubetrain_worker_last_checkpoint_step" + labels + "} 20\n" +
        "kubetrain_worker_checkpoint_failures_total" + labels + ",reason=\"ENOSPC\"} " +
        std::to_string(failures) + "\n" + "kubetrain_worker_checkpoint_consecutive_failures" +
        labels + "} " + std::to_string(failures) + "\n" +
        // another rank's count is not the job's word
        "kubetrain_worker_checkpoint_consecutive_failures{rank=\"1\"} 7\n";
    reconcile();
    const Object c = condition("CheckpointFailing");
    ASSERT_FALSE(c.is_null());
    EXPECT_EQ(c["status"], "True");
    EXPECT_EQ(c["reason"], "CheckpointWriteFailed");
    const std::string message = c["message"];
    EXPECT_NE(message.find("the last " + std::to_string(failures) + " checkpoint save(s) failed"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("ENOSPC " + std::to_string(failures)), std::string::npos) << message;
    EXPECT_NE(message.find("resumes from step 20"), std::string::npos) << message;
  }
  EXPECT_EQ(status()["phase"], "Running") << "training goes on";
  auto reasons = event_reasons();
  EXPECT_EQ(std::count(reasons.begin(), reasons.end(), "CheckpointFailing"), 1)
      << "one Warning when the condition turns True, not one per poll";
  // A later save succeeds: the condition clears.
  metrics_text = "kubetrain_worker_last_checkpoint_step" + labels + "} 70\n" +
                 "kubetrain_worker_checkpoint_failures_total" + labels + ",reason=\"ENOSPC\"} 2\n" +
                 "kubetrain_worker_checkpoint_consecutive_failures" + labels + "} 0\n";
  reconcile();
  EXPECT_EQ(condition("CheckpointFailing")["status"], "False");
  EXPECT_EQ(condition("CheckpointFailing")["reason"], "CheckpointWritten");
  EXPECT_EQ(status()["lastCheckpointStep"], 70);
  reasons = event_reasons();
  EXPECT_EQ(std::count(reasons.begin(), reasons.end(), "CheckpointRecovered"), 1);
}

// SIGTERM while the disk is full: the worker still exits 143 (retryable) and says in its
// termination message that its last save failed; the restart is not held against the job's spec.
TEST_F(ControllerTest, StoppedWithAFailedFinalSave_RestartsAndReportsCheckpointFailing) {
  store.create(kTrainingJobs, "default", tiny_job("job"));
  reconcile();
  set_pod_running("job-worker-0");
  reconcile();
  const Object terminated = {{"exitCode", 143},
                             {"reason", "Error"},
                             {"message",
                              "kubetrain_worker_steps_total 31\n"
                              "kubetrain_worker_checkpoint_failures_total 1\n"
                              "kubetrain_worker_checkpoint_consecutive_failures 1\n"}};
  set_pod_status(
      "job-worker-0",
      {{"phase", "Failed"},
       {"containerStatuses",
        Object::array({{{"name", "worker"}, {"state", {{"terminated", terminated}}}}})}});
  reconcile();
  EXPECT_EQ(status()["phase"], "Restarting");
  EXPECT_EQ(condition("CheckpointFailing")["status"], "True");
  EXPECT_NE(condition("CheckpointFailing")["message"].get<std::string>().find("resumes from"),
            std::string::npos);
}

TEST_F(ControllerTest, CleanPodPolicy_DecidesWhichPodsStayAfterTheEnd) {
  for (const char* policy : {"All", "Running", "None"}) {
    const std::string name = std::string("job-") + (policy[0] == 'A'   ? "a"
                                                    : policy[0] == 'R' ? "r"
                                                                       : "n");
    Object j = tiny_job(name);
    j["spec"]["runPolicy"]["cleanPodPolicy"] = policy;
    store.create(kTrainingJobs, "default", j);
    reconcile(name);
    set_pod_exited(name + "-worker-0", 0);
    reconcile(name);
    EXPECT_EQ(status(name)["phase"], "Succeeded") << policy;
    EXPECT_EQ(condition("Succeeded", name)["status"], "True");
    EXPECT_EQ(status(name)["progress"]["step"], 100);
    kube::ListOptions by_job;
    by_job.label_selector = "kubetrain.dev/job-name=" + name;
    const bool kept = store.list(kPods, "default", by_job).items.size() == 1;
    EXPECT_EQ(kept, std::string(policy) != "All") << policy;
  }
}

TEST_F(ControllerTest, TtlAfterFinished_DeletesTheJobAndItsChildren) {
  Object j = tiny_job("job");
  j["spec"]["runPolicy"]["ttlSecondsAfterFinished"] = 100;
  j["spec"]["runPolicy"]["cleanPodPolicy"] = "None";
  store.create(kTrainingJobs, "default", j);
  reconcile();
  set_pod_exited("job-worker-0", 0);
  const auto done = reconcile();
  ASSERT_TRUE(done.requeue_after);
  EXPECT_EQ(*done.requeue_after, std::chrono::seconds(100));
  now += std::chrono::seconds(99);
  reconcile();
  EXPECT_NO_THROW(job());
  now += std::chrono::seconds(1);
  reconcile();
  EXPECT_THROW(job(), kube::ApiError);
  EXPECT_TRUE(pods().empty());  // garbage-collected through the ownerReference
  EXPECT_THROW(store.get(kConfigMaps, "default", "job-plan"), kube::ApiError);
  EXPECT_NO_THROW(reconcile());  // a deleted job is not an error
}

TEST_F(ControllerTest, InvalidSpec_FailsWithTheFieldPath_AndAFixedSpecRuns) {
  Object j = tiny_job("job");
  j["spec"]["training"]["steps"] = -5;
  j["spec"]["parallelism"]["tensorParallel"] = 3;
  store.create(kTrainingJobs, "default", j);
  reconcile();
  EXPECT_EQ(status()["phase"], "Failed");
  EXPECT_EQ(condition("Planned")["status"], "False");
  EXPECT_EQ(condition("Planned")["reason"], "InvalidSpec");
  const std::string message = condition("Planned")["message"];
  EXPECT_NE(message.find("spec.training.steps"), std::string::npos) << message;
  EXPECT_NE(message.find("spec.parallelism.tensorParallel"), std::string::npos) << message;
  EXPECT_TRUE(pods().empty());
  reconcile();  // no new events for the same generation
  EXPECT_EQ(event_reasons().size(), 1u);

  j = job();
  j["spec"]["training"]["steps"] = 10;
  j["spec"]["parallelism"].erase("tensorParallel");
  store.update(kTrainingJobs, "default", j);
  reconcile();
  EXPECT_EQ(status()["phase"], "Starting");
  EXPECT_EQ(condition("Failed")["status"], "False");
  EXPECT_EQ(pods().size(), 1u);
}

TEST_F(ControllerTest, UnknownField_IsReportedWithItsPath) {
  Object j = tiny_job("job");
  j["spec"]["training"]["stepz"] = 5;
  store.create(kTrainingJobs, "default", j);
  reconcile();
  EXPECT_EQ(status()["phase"], "Failed");
  EXPECT_NE(condition("Failed")["message"].get<std::string>().find("spec.training.stepz"),
            std::string::npos);
}

TEST_F(ControllerTest, ModelThatFitsNowhere_FailsWithNoFeasiblePlan) {
  add_node(
      {{"metadata",
        {{"name", "gpu-1"}, {"labels", {{"nvidia.com/gpu.product", "Tesla-V100-SXM2-32GB"}}}}},
       {"status", {{"allocatable", {{"cpu", "8"}, {"memory", "64Gi"}, {"nvidia.com/gpu", "1"}}}}}});
  store.remove(kube::kNodes, "", "node-a");
  Object j = tiny_job("job");
  j["spec"]["model"] = {{"preset", "gpt-7b"}};
  j["spec"]["resources"] = {{"maxNodes", 1}};
  store.create(kTrainingJobs, "default", j);
  reconcile();
  EXPECT_EQ(status()["phase"], "Failed");
  EXPECT_EQ(condition("Planned")["reason"], "NoFeasiblePlan");
  EXPECT_TRUE(pods().empty());
}

// GPU plans in stages or sharded with offload optimizer, which the workers refused before
// (PlanNotExecutable), now plan and start their pods: the planner emits no plan that
// api::not_yet_executable refuses (the controller's check stays, for a plan made elsewhere).
TEST_F(ControllerTest, GpuPlansWithStagesOrTheDistributedOptimizerAndOffload_StartTheirPods) {
  add_node(h100_node("gpu-a"));  // a node each: a job's pod takes all 8 GPUs of one
  add_node(h100_node("gpu-b"));
  store.remove(kube::kNodes, "", "node-a");
  const std::vector<Object> parallelisms{
      {{"dataParallel", 2}, {"distributedOptimizer", "on"}, {"offload", "optimizer"}},
      {{"pipelineParallel", 2}, {"offload", "optimizer"}}};
  for (size_t k = 0; k < parallelisms.size(); ++k) {
    const std::string name = "job" + std::to_string(k);
    Object j = tiny_job(name);
    j["spec"]["model"] = {{"preset", "gpt2-124m"}};
    j["spec"]["resources"] = Object::object();
    j["spec"]["parallelism"] = parallelisms[k];
    store.create(kTrainingJobs, "default", j);
    reconcile(name);
    EXPECT_EQ(condition("Planned", name)["status"], "True") << status(name);
    EXPECT_NE(status(name)["phase"], "Failed") << status(name);
  }
  EXPECT_EQ(pods().size(), 2u) << "a pod (of 8 ranks) each";
}

TEST_F(ControllerTest, ControllerRestartMidReconcile_NoDuplicatePodsNoLostStatus) {
  store.create(kTrainingJobs, "default", tiny_job("job"));
  // The first controller dies after writing the ConfigMap, before any pod exists.
  store.set_fault([](const std::string& verb, const kube::Resource& r, const std::string&,
                     const std::string&) -> std::optional<kube::ApiError> {
    if (verb == "create" && r == kPods) return kube::ApiError(500, "InternalError", "crash");
    return std::nullopt;
  });
  EXPECT_THROW(reconcile(), kube::ApiError);
  store.set_fault(nullptr);
  const std::string cm_version =
      store.get(kConfigMaps, "default", "job-plan")["metadata"]["resourceVersion"];
  reconcile();  // a new Controller
  reconcile();
  EXPECT_EQ(pods().size(), 1u);
  EXPECT_EQ(store.get(kConfigMaps, "default", "job-plan")["metadata"]["resourceVersion"],
            cm_version);
  EXPECT_EQ(status()["plan"]["configMap"], "job-plan");

  // Mid-restart: the attempt moved on but the old pods could not be deleted.
  set_pod_exited("job-worker-0", 137);
  store.set_fault([](const std::string& verb, const kube::Resource& r, const std::string&,
                     const std::string&) -> std::optional<kube::ApiError> {
    if (verb == "delete" && r == kPods) return kube::ApiError(500, "InternalError", "crash");
    return std::nullopt;
  });
  EXPECT_THROW(reconcile(), kube::ApiError);
  store.set_fault(nullptr);
  reconcile();
  reconcile();
  ASSERT_EQ(pods().size(), 1u);
  EXPECT_EQ(attempt_of(pods()[0]), "1");
  EXPECT_LE(status()["restarts"].get<int>(), 1);  // never counted twice
}

// Found by the chaos test (tests/chaos): with API faults a job restarted twice showed
// restarts 1. The status write after a gang restart failed; the next reconcile saw only the old
// attempt's pod, replaced it and never counted the restart, so backoffLimit could be passed.
TEST_F(ControllerTest, RestartCount_SurvivesALostStatusWriteAfterTheAttemptMoved) {
  store.create(kTrainingJobs, "default", tiny_job("job"));  // backoffLimit 2
  reconcile();
  for (int restart = 1; restart <= 2; ++restart) {
    set_pod_running("job-worker-0");
    reconcile();
    set_pod_exited("job-worker-0", 137);
    bool once = true;  // the restart's status write is lost (500; or the operator died there)
    store.set_fault([&](const std::string& verb, const kube::Resource& r, const std::string&,
                        const std::string&) -> std::optional<kube::ApiError> {
      if (verb == "update_status" && r == kTrainingJobs && once) {
        once = false;
        return kube::ApiError(500, "InternalError", "injected");
      }
      return std::nullopt;
    });
    EXPECT_THROW(reconcile(), kube::ApiError);
    store.set_fault(nullptr);
    reconcile();
    ASSERT_EQ(pods().size(), 1u);
    EXPECT_EQ(attempt_of(pods()[0]), std::to_string(restart));
    EXPECT_EQ(status()["restarts"], restart);
  }
  set_pod_running("job-worker-0");
  reconcile();
  set_pod_exited("job-worker-0", 137);
  reconcile();
  EXPECT_EQ(status()["phase"], "Failed");
  EXPECT_EQ(condition("Failed")["reason"], "BackoffLimitExceeded");
  EXPECT_EQ(status()["restarts"], 2);
}

TEST_F(ControllerTest, ConcurrentStatusWrite_IsAConflict_AndTheNextReconcileConverges) {
  store.create(kTrainingJobs, "default", tiny_job("job"));
  bool once = true;
  store.set_fault([&](const std::string& verb, const kube::Resource& r, const std::string&,
                      const std::string&) -> std::optional<kube::ApiError> {
    if (verb == "update_status" && r == kTrainingJobs && once) {
      once = false;
      return kube::ApiError(409, "Conflict", "the object has been modified");
    }
    return std::nullopt;
  });
  EXPECT_THROW(reconcile(), kube::ApiError);
  reconcile();
  EXPECT_EQ(pods().size(), 1u);
  EXPECT_EQ(status()["phase"], "Starting");
}

// A kube::Client over the Store that counts pod creates in flight. Each create waits (up to 5 s)
// until a second one is in flight, so that creation one by one shows as a maximum of 1 rather
// than depending on timing (after one such wait runs out, the others do not wait).
class CreatesInFlight : public test::ForwardingClient {
 public:
  using ForwardingClient::ForwardingClient;
  int max_in_flight() const { return max_in_flight_; }

  Object create(const kube::Resource& r, const std::string& ns, const Object& obj) override {
    if (r.plural != "pods") return inner_.create(r, ns, obj);
    {
      std::unique_lock lock(mutex_);
      max_in_flight_ = std::max(max_in_flight_, ++in_flight_);
      changed_.notify_all();
      if (!changed_.wait_for(lock, std::chrono::seconds(5),
                             [&] { return max_in_flight_ > 1 || waited_out_; }))
        waited_out_ = true;
    }
    Object created = inner_.create(r, ns, obj);
    std::lock_guard lock(mutex_);
    --in_flight_;
    return created;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int in_flight_ = 0;
  int max_in_flight_ = 0;
  bool waited_out_ = false;
};

TEST_F(ControllerTest, LargeGang_PodsAreCreatedInParallel_EachExactlyOnce) {
  for (int n = 1; n < 64; ++n) add_node(cpu_node("node-" + std::to_string(n), 4));
  Object j = tiny_job("big");
  j["spec"]["training"]["globalBatchSize"] = 256;
  j["spec"]["parallelism"]["dataParallel"] = 64;
  store.create(kTrainingJobs, "default", j);
  CreatesInFlight counting(store);
  options.max_concurrent_creates = 16;
  Controller(counting, options).reconcile("default", "big");

  std::set<std::string> names;
  for (const auto& pod : pods()) names.insert(pod["metadata"]["name"].get<std::string>());
  ASSERT_EQ(pods().size(), 64u) << status("big").dump();
  EXPECT_EQ(names.size(), 64u);
  for (int rank = 0; rank < 64; ++rank)
    EXPECT_TRUE(names.count("big-worker-" + std::to_string(rank))) << rank;
  EXPECT_GT(counting.max_in_flight(), 1);
  EXPECT_LE(counting.max_in_flight(), 16);
  EXPECT_EQ(status("big")["workers"]["desired"], 64);
  // The next reconcile finds them all and creates none.
  Controller(counting, options).reconcile("default", "big");
  EXPECT_EQ(pods().size(), 64u);
}

// Two jobs planned one after the other, before the scheduler bound the first's pod: the second
// sees the GPUs the first's pod is pinned to as taken and goes to the other node.
TEST_F(ControllerTest, JobsPlannedBeforeTheFirstIsBound_DoNotShareANodesGpus) {
  store.remove(kube::kNodes, "", "node-a");
  for (const char* name : {"gpu-a", "gpu-b"}) {
    Object node = cpu_node(name, 64);
    node["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-H100-80GB-HBM3";
    node["metadata"]["labels"]["nvidia.com/gpu.memory"] = "81559";
    node["status"]["allocatable"]["nvidia.com/gpu"] = "8";
    node["status"]["capacity"]["nvidia.com/gpu"] = "8";
    node["status"]["allocatable"]["memory"] = node["status"]["capacity"]["memory"] = "512Gi";
    add_node(node);
  }
  const auto gpu_job = [](const std::string& name) {
    Object j = tiny_job(name);
    j["spec"]["resources"] = {{"maxNodes", 1}, {"gpusPerNode", 8}};
    j["spec"]["training"]["globalBatchSize"] = 64;
    j["spec"]["parallelism"]["dataParallel"] = 8;
    return j;
  };
  store.create(kTrainingJobs, "default", gpu_job("first"));
  store.create(kTrainingJobs, "default", gpu_job("second"));
  reconcile("first");
  reconcile("second");
  std::set<std::string> hosts;
  for (const auto& pod : pods()) {
    EXPECT_FALSE(pod["spec"].contains("nodeName"));  // nobody bound them
    hosts.insert(pod["spec"]["nodeSelector"]["kubernetes.io/hostname"].get<std::string>());
  }
  ASSERT_EQ(pods().size(), 2u) << status("second").dump();
  EXPECT_EQ(hosts, (std::set<std::string>{"gpu-a", "gpu-b"}));
}

// ---- gang scheduling ----

Object two_node_job(const std::string& name, Object scheduling_policy) {
  Object j = tiny_job(name);
  j["spec"]["parallelism"]["dataParallel"] = 2;
  if (!scheduling_policy.is_null()) j["spec"]["runPolicy"]["schedulingPolicy"] = scheduling_policy;
  return j;
}

TEST_F(ControllerTest, Coscheduling_PodGroupSizedToTheGang_MadeBeforeItsLabelledPods) {
  add_node(cpu_node("node-b", 4));
  store.register_resource(kube::kCoschedulingPodGroups, true);
  store.create(kTrainingJobs, "default",
               two_node_job("job", {{"gangScheduler", "Coscheduling"},
                                    {"scheduleTimeoutSeconds", 120}}));
  reconcile();
  const Object pg = store.get(kube::kCoschedulingPodGroups, "default", "job");
  EXPECT_EQ(pg["apiVersion"], "scheduling.x-k8s.io/v1alpha1");
  EXPECT_EQ(pg["spec"]["minMember"], 2);
  EXPECT_EQ(pg["spec"]["scheduleTimeoutSeconds"], 120);
  EXPECT_EQ(pg["metadata"]["ownerReferences"][0]["uid"], job()["metadata"]["uid"]);
  ASSERT_EQ(pods().size(), 2u);
  for (const auto& pod : pods()) {
    EXPECT_EQ(pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"], "job");
    EXPECT_FALSE(pod["spec"].contains("schedulerName"));  // the default scheduler's plugin
  }
  EXPECT_EQ(condition("GangScheduling")["status"], "True");
  // Someone shrank it: the next pods' creation puts the gang's size back.
  Object shrunk = pg;
  shrunk["spec"]["minMember"] = 1;
  store.update(kube::kCoschedulingPodGroups, "default", shrunk);
  store.remove(kPods, "default", "job-worker-1");
  reconcile();
  EXPECT_EQ(store.get(kube::kCoschedulingPodGroups, "default", "job")["spec"]["minMember"], 2);
}

TEST_F(ControllerTest, Volcano_ByTheOperatorsDefault_PodGroupWithQueueAndSchedulerName) {
  add_node(cpu_node("node-b", 4));
  store.register_resource(kube::kVolcanoPodGroups, true);
  options.children.gang_scheduler = api::GangScheduler::kVolcano;
  store.create(kTrainingJobs, "default", two_node_job("job", {{"queue", "research"}}));
  reconcile();
  const Object pg = store.get(kube::kVolcanoPodGroups, "default", "job");
  EXPECT_EQ(pg["spec"]["minMember"], 2);
  EXPECT_EQ(pg["spec"]["queue"], "research");
  EXPECT_TRUE(pg["spec"]["minResources"].contains("cpu"));
  ASSERT_EQ(pods().size(), 2u);
  for (const auto& pod : pods()) {
    EXPECT_EQ(pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"], "job");
    EXPECT_EQ(pod["spec"]["schedulerName"], "volcano");
  }
}

TEST_F(ControllerTest, PodGroupApiMissing_NoPodIsCreated_AndTheJobSaysWhy) {
  add_node(cpu_node("node-b", 4));  // no PodGroup resource registered: the API is not served
  store.create(kTrainingJobs, "default", two_node_job("job", {{"gangScheduler", "Coscheduling"}}));
  const ReconcileResult r = reconcile();
  EXPECT_TRUE(pods().empty());
  EXPECT_EQ(condition("GangScheduling")["status"], "False");
  EXPECT_EQ(condition("GangScheduling")["reason"], "PodGroupUnavailable");
  EXPECT_NE(condition("GangScheduling")["message"].get<std::string>().find(
                "scheduling.x-k8s.io/v1alpha1"),
            std::string::npos);
  ASSERT_TRUE(r.requeue_after);
  reconcile();  // said once
  const auto reasons = event_reasons();
  EXPECT_EQ(std::count(reasons.begin(), reasons.end(), "PodGroupUnavailable"), 1);
  // The scheduler is installed: the gang is made.
  store.register_resource(kube::kCoschedulingPodGroups, true);
  reconcile();
  EXPECT_EQ(pods().size(), 2u);
  EXPECT_EQ(condition("GangScheduling")["status"], "True");
}

TEST_F(ControllerTest, Kueue_PodsCarryQueueGroupPerAttemptAndCount_GatedPodsAreWaitedFor) {
  add_node(cpu_node("node-b", 4));
  Object j = two_node_job("job", {{"gangScheduler", "Kueue"}});
  j["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "team-a";
  store.create(kTrainingJobs, "default", j);
  reconcile();
  ASSERT_EQ(pods().size(), 2u);
  for (const auto& pod : pods()) {
    EXPECT_EQ(pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], "team-a");
    EXPECT_EQ(pod["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"], "job-a0");
    EXPECT_EQ(pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"], "2");
  }
  // Kueue's webhook gated them; they wait, Pending, for admission: no restart, no failure.
  for (const char* name : {"job-worker-0", "job-worker-1"}) {
    Object p = store.get(kPods, "default", name);
    p["spec"]["schedulingGates"] = {{{"name", "kueue.x-k8s.io/admission"}}};
    store.update(kPods, "default", p);
  }
  now += std::chrono::hours(1);
  reconcile();
  EXPECT_EQ(status()["phase"], "Starting");
  EXPECT_EQ(status().value("restarts", 0), 0);
  EXPECT_EQ(condition("PodsReady")["reason"], "WaitingForAdmission");
  EXPECT_EQ(condition("PodsReady")["message"],
            "0/2 workers ready; 2 waiting for admission (scheduling gates: "
            "kueue.x-k8s.io/admission)");
  EXPECT_EQ(pods().size(), 2u);
  // A restart makes a new pod group: a new Kueue workload.
  set_pod_evicted("job-worker-1");
  reconcile();
  reconcile();
  int second_attempt = 0;
  for (const auto& pod : pods())
    if (attempt_of(pod) == "1") {
      ++second_attempt;
      EXPECT_EQ(pod["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"], "job-a1");
    }
  EXPECT_EQ(second_attempt, 2) << status().dump();
}

TEST_F(ControllerTest, Kueue_WithoutAQueue_IsAnInvalidSpecNamingTheField) {
  store.create(kTrainingJobs, "default", two_node_job("job", {{"gangScheduler", "Kueue"}}));
  reconcile();
  EXPECT_EQ(status()["phase"], "Failed");
  EXPECT_EQ(condition("Failed")["reason"], "InvalidSpec");
  EXPECT_NE(condition("Failed")["message"].get<std::string>().find(
                "spec.runPolicy.schedulingPolicy.queue"),
            std::string::npos);
  EXPECT_TRUE(pods().empty());
  // The operator's default is Kueue and the job names no queue: the same, in the operator's words.
  options.children.gang_scheduler = api::GangScheduler::kKueue;
  store.create(kTrainingJobs, "default", tiny_job("other"));
  reconcile("other");
  EXPECT_EQ(status("other")["phase"], "Failed");
  EXPECT_NE(condition("Failed", "other")["message"].get<std::string>().find("--gang-scheduler"),
            std::string::npos);
}

TEST_F(ControllerTest, Metrics_CountReconcilesAndOutcomes) {
  store.create(kTrainingJobs, "default", tiny_job("job"));
  reconcile();
  set_pod_exited("job-worker-0", 0);
  reconcile();
  const std::string text = registry.expose();
  EXPECT_NE(
      text.find(
          "controller_runtime_reconcile_total{controller=\"trainingjob\",result=\"success\"} 2"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("kubetrain_jobs_succeeded_total 1"), std::string::npos);
  EXPECT_NE(text.find("kubetrain_jobs_created_total 1"), std::string::npos);
  EXPECT_NE(text.find("kubetrain_planner_duration_seconds_count 1"), std::string::npos);
  EXPECT_NE(text.find("kubetrain_jobs{phase=\"Succeeded\"} 1"), std::string::npos);
  EXPECT_NE(text.find("kubetrain_jobs{phase=\"Starting\"} 0"), std::string::npos);
  // The job's own series, kube-state-metrics style: 1 for its phase, 0 for the others.
  EXPECT_NE(text.find("kubetrain_trainingjob_status_phase{namespace=\"default\",trainingjob="
                      "\"job\",phase=\"Succeeded\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("kubetrain_trainingjob_status_phase{namespace=\"default\",trainingjob="
                      "\"job\",phase=\"Running\"} 0\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("kubetrain_trainingjob_restarts{namespace=\"default\",trainingjob="
                      "\"job\"} 0\n"),
            std::string::npos)
      << text;
  // Deleted: its series end.
  store.remove(kTrainingJobs, "default", "job");
  reconcile();
  const std::string after = registry.expose();
  EXPECT_EQ(after.find("trainingjob=\"job\""), std::string::npos) << after;
  EXPECT_NE(after.find("kubetrain_jobs{phase=\"Succeeded\"} 0"), std::string::npos) << after;
}

TEST(ParseWorkerProgress, ReadsCheckpointFailuresByReason) {
  const auto p = parse_worker_progress(
      "kubetrain_worker_checkpoint_failures_total{rank=\"0\",reason=\"ENOSPC\"} 3\n"
      "kubetrain_worker_checkpoint_failures_total{rank=\"0\",reason=\"EROFS\"} 1\n"
      "kubetrain_worker_checkpoint_failures_total{rank=\"1\",reason=\"EIO\"} 5\n"
      "kubetrain_worker_checkpoint_consecutive_failures{rank=\"0\"} 2\n");
  ASSERT_TRUE(p.checkpoint_consecutive_failures);
  EXPECT_DOUBLE_EQ(*p.checkpoint_consecutive_failures, 2);
  const std::map<std::string, double> want = {{"ENOSPC", 3}, {"EROFS", 1}};
  EXPECT_EQ(p.checkpoint_failures, want);
}

TEST(ParseWorkerProgress, ReadsRankZeroOnly) {
  const auto p = parse_worker_progress(
      "# HELP kubetrain_worker_loss x\n"
      "kubetrain_worker_loss{rank=\"10\"} 9\n"
      "kubetrain_worker_loss{trainingjob=\"a\",rank=\"0\",node_rank=\"0\"} 2.5\n"
      "kubetrain_worker_steps_total 7\n");
  ASSERT_TRUE(p.loss);
  EXPECT_DOUBLE_EQ(*p.loss, 2.5);
  ASSERT_TRUE(p.steps);
  EXPECT_DOUBLE_EQ(*p.steps, 7);
  EXPECT_FALSE(p.tokens_per_second);
}

// What answers on a pod's port is outside data: non-finite values and overflowing sums are
// skipped, the label maps stay bounded.
TEST(ParseWorkerProgress, HostileValuesAndLabelsAreBounded) {
  std::string text = "kubetrain_worker_loss nan\nkubetrain_worker_step inf\n"
                     "kubetrain_worker_phase_seconds_total{phase=\"compute\"} 1e308\n"
                     "kubetrain_worker_phase_seconds_total{phase=\"compute\"} 1e308\n";
  for (int i = 0; i < 1000; ++i)
    text += "kubetrain_worker_phase_seconds_total{phase=\"p" + std::to_string(i) + "\"} 1\n";
  text += "kubetrain_worker_checkpoint_failures_total{reason=\"" + std::string(100, 'x') +
          "\"} 1\n";
  const auto p = parse_worker_progress(text);
  EXPECT_FALSE(p.loss);
  EXPECT_FALSE(p.step);
  EXPECT_DOUBLE_EQ(p.phase_seconds.at("compute"), 1e308) << "the overflowing addition skipped";
  EXPECT_EQ(p.phase_seconds.size(), kMaxProgressLabels);
  EXPECT_TRUE(p.checkpoint_failures.empty()) << "a 100-byte reason is no errno name";
}

}  // namespace
}  // namespace kt::controller

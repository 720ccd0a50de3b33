// The local node and its pod runner, with real processes.
#include "local/pod_runner.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "api/inventory.h"
#include "api/quantity.h"
#include "local/local_node.h"
#include "local/store.h"
#include "tests/support/eventually.h"

namespace kt::local {
namespace {

namespace fs = std::filesystem;
using kube::kPods;
using kube::Object;
using test::eventually;

TEST(LocalNode, GfdProductName_ReplacesSpaces) {
  EXPECT_EQ(gfd_product_name(" NVIDIA H100 80GB HBM3 "), "NVIDIA-H100-80GB-HBM3");
}

TEST(LocalNode, CpuMachine_DecodesAsACpuNodeForThePlanner) {
  LocalMachine m;
  m.node_name = "box";
  m.cpu_cores = 6;
  m.memory_bytes = int64_t{24} << 30;
  const Object list = {{"kind", "List"}, {"items", {local_node_object(m)}}};
  const api::Inventory inv = api::decode_kubectl_nodes(list);
  ASSERT_EQ(inv.nodes.size(), 1u);
  EXPECT_EQ(inv.nodes[0].name, "box");
  EXPECT_TRUE(inv.nodes[0].is_cpu_node());
  EXPECT_EQ(inv.nodes[0].cpu_cores, 6);
  EXPECT_DOUBLE_EQ(inv.nodes[0].memory_bytes, 24 * api::kGiB);
  EXPECT_EQ(inv.nodes[0].labels.at("kubernetes.io/hostname"), "box");
}

TEST(LocalNode, Bf16Cpu_CarriesNfdLabelsThePlannerReads) {
  LocalMachine m;
  m.node_name = "amxbox";
  m.cpu_cores = 2;
  m.memory_bytes = int64_t{24} << 30;
  m.amx_bf16 = m.avx512_bf16 = true;
  const Object node = local_node_object(m);
  EXPECT_EQ(node["metadata"]["labels"]["feature.node.kubernetes.io/cpu-cpuid.AMXBF16"], "true");
  EXPECT_EQ(node["metadata"]["labels"]["feature.node.kubernetes.io/cpu-cpuid.AVX512BF16"], "true");
  const api::Inventory inv = api::decode_kubectl_nodes({{"kind", "List"}, {"items", {node}}});
  EXPECT_TRUE(inv.nodes[0].hardware.has_bf16);
  EXPECT_DOUBLE_EQ(inv.nodes[0].hardware.peak_bf16_flops, 0.75e12) << "AMX wins over AVX512-BF16";
  m.amx_bf16 = m.avx512_bf16 = false;
  EXPECT_FALSE(local_node_object(m)["metadata"]["labels"].contains(
      "feature.node.kubernetes.io/cpu-cpuid.AMXBF16"));
}

TEST(LocalNode, GpuMachine_CarriesGfdLabelsAndAllocatableGpus) {
  LocalMachine m;
  m.node_name = "gpubox";
  m.cpu_cores = 16;
  m.memory_bytes = int64_t{128} << 30;
  m.gpus = {{"NVIDIA-H200", 143771}};
  const Object node = local_node_object(m);
  EXPECT_EQ(node["metadata"]["labels"]["nvidia.com/gpu.count"], "1");
  const api::Inventory inv = api::decode_kubectl_nodes({{"kind", "List"}, {"items", {node}}});
  EXPECT_EQ(inv.nodes[0].gpu_count, 1);
  EXPECT_EQ(inv.nodes[0].gpu_product, "NVIDIA-H200");
  EXPECT_DOUBLE_EQ(inv.nodes[0].hardware.memory_bytes, 143771 * api::kMiB);
}

TEST(LocalNode, DetectAndRegister_ThisMachine) {
  const LocalMachine m = detect_local_machine();
  EXPECT_GE(m.cpu_cores, 1);
  EXPECT_GT(m.memory_bytes, 0);
  EXPECT_EQ(m.cpu_cores, ::sysconf(_SC_NPROCESSORS_ONLN));
  Store store;
  register_local_node(store, m);
  register_local_node(store, m);  // again: an update, not an error
  const Object node = store.get(kube::kNodes, "", m.node_name);
  EXPECT_EQ(node["status"]["allocatable"]["cpu"], std::to_string(m.cpu_cores));
  EXPECT_EQ(node["status"]["conditions"][0]["type"], "Ready");
}

class PodRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() /
          ("kt-pod-runner-" + std::to_string(::getpid()) + "-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    LocalMachine m;
    m.node_name = "local";
    m.cpu_cores = 2;
    m.memory_bytes = int64_t{4} << 30;
    register_local_node(store, m);
    PodRunnerOptions o;
    o.node_name = "local";
    o.work_dir = dir.string();
    o.worker_binary = "/bin/echo";
    o.shutdown_grace = std::chrono::milliseconds(500);
    runner = std::make_unique<PodRunner>(store, o);
  }
  void TearDown() override {
    runner->stop();
    fs::remove_all(dir);
  }

  Object shell_pod(const std::string& name, const std::string& script) {
    return {
        {"metadata", {{"name", name}}},
        {"spec",
         {{"terminationGracePeriodSeconds", 1},
          {"containers",
           {{{"name", "main"}, {"image", "busybox"}, {"command", {"/bin/sh", "-c", script}}}}}}}};
  }

  // Syncs until the pod reaches `phase` (or 10 s pass); returns the pod.
  Object wait_for_phase(const std::string& name, const std::string& phase) {
    Object pod;
    const bool reached = eventually(
        [&] {
          runner->sync();
          pod = store.get(kPods, "default", name);
          return pod.contains("status") && pod["status"].value("phase", "") == phase;
        },
        std::chrono::seconds(10));
    if (!reached) ADD_FAILURE() << name << " never reached " << phase << ": " << pod.dump();
    return pod;
  }

  // Waits until `path` exists (or 10 s pass).
  static bool wait_for_file(const std::string& path) {
    return eventually([&] { return fs::exists(path); }, std::chrono::seconds(10));
  }

  std::string read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  fs::path dir;
  Store store;
  std::unique_ptr<PodRunner> runner;
};

TEST_F(PodRunnerTest, UnboundPod_IsBoundRunAndSucceeds_WithItsOutputInTheLog) {
  store.create(kPods, "default", shell_pod("ok", "echo hello from $HOSTNAME"));
  const Object pod = wait_for_phase("ok", "Succeeded");
  EXPECT_EQ(pod["spec"]["nodeName"], "local");
  EXPECT_EQ(pod["status"]["podIP"], "127.0.0.1");
  EXPECT_EQ(pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"], 0);
  EXPECT_EQ(pod["status"]["containerStatuses"][0]["state"]["terminated"]["reason"], "Completed");
  EXPECT_NE(read(runner->log_path("default", "ok")).find("hello from ok"), std::string::npos);
}

TEST_F(PodRunnerTest, TerminationMessage_IsCopiedIntoTheContainerStatus) {
  store.create(kPods, "default",
               shell_pod("msg", "printf 'kubetrain_worker_loss 2.5' > \"$KUBETRAIN_TERMINATION_MESSAGE_PATH\""));
  const Object pod = wait_for_phase("msg", "Succeeded");
  EXPECT_EQ(pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"],
            "kubetrain_worker_loss 2.5");
}

TEST_F(PodRunnerTest, NonZeroExit_IsFailedWithTheExitCode) {
  store.create(kPods, "default", shell_pod("bad", "exit 3"));
  const Object pod = wait_for_phase("bad", "Failed");
  EXPECT_EQ(pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"], 3);
  EXPECT_EQ(pod["status"]["containerStatuses"][0]["state"]["terminated"]["reason"], "Error");
}

TEST_F(PodRunnerTest, KilledBySignal_ReportsExitCode128PlusSignal) {
  store.create(kPods, "default", shell_pod("killed", "kill -KILL $$"));
  const Object pod = wait_for_phase("killed", "Failed");
  EXPECT_EQ(pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"], 137);
}

// A kubelet's memory limit: a container whose processes (children included) hold more than
// limits.memory is killed, OOMKilled with exit code 137; one within its limit runs to the end.
TEST_F(PodRunnerTest, OverItsMemoryLimit_IsOOMKilledWithExitCode137) {
  const std::string hog =
      "python3 -c \"import time; s = b'x' * (300 << 20); time.sleep(30)\"; echo survived";
  Object pod = shell_pod("hog", hog);
  pod["spec"]["containers"][0]["resources"] = {{"limits", {{"memory", "128Mi"}}}};
  store.create(kPods, "default", pod);
  Object within = shell_pod("fits", "python3 -c \"s = b'x' * (16 << 20)\"");
  within["spec"]["containers"][0]["resources"] = {{"limits", {{"memory", "128Mi"}}}};
  store.create(kPods, "default", within);
  const Object killed = wait_for_phase("hog", "Failed");
  const Object terminated = killed["status"]["containerStatuses"][0]["state"]["terminated"];
  EXPECT_EQ(terminated["exitCode"], 137);
  EXPECT_EQ(terminated["reason"], "OOMKilled");
  const std::string log = read(runner->log_path("default", "hog"));
  EXPECT_NE(log.find("OOMKilled"), std::string::npos) << log;
  EXPECT_EQ(log.find("\nsurvived"), std::string::npos) << log;  // (the header quotes the command)
  const Object fits = wait_for_phase("fits", "Succeeded");
  EXPECT_EQ(fits["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"], 0);
}

// A pod's kubeconfig holds its ServiceAccount's bearer token: readable by its owner only (it was
// 0644); and what a local pod listens on is the loopback (it listened on every address).
TEST_F(PodRunnerTest, PodKubeconfig_IsPrivate_AndListenersStayOnLoopback) {
  runner->stop();
  PodRunnerOptions o;
  o.node_name = "local";
  o.work_dir = dir.string();
  o.worker_binary = "/bin/echo";
  o.service_account_kubeconfig = [](const std::string&, const std::string&) {
    return std::string("users: [{user: {token: kt-secret}}]\n");
  };
  runner = std::make_unique<PodRunner>(store, o);
  store.create(kPods, "default",
               shell_pod("creds", "stat -c %a \"$KUBECONFIG\"; echo listen=$KUBETRAIN_LISTEN_ADDRESS"));
  wait_for_phase("creds", "Succeeded");
  const std::string log = read(runner->log_path("default", "creds"));
  EXPECT_NE(log.find("\n600\n"), std::string::npos) << log;
  EXPECT_NE(log.find("listen=127.0.0.1"), std::string::npos) << log;
}

TEST_F(PodRunnerTest, RunningPod_IsReady_AndDeletingItKillsTheProcess) {
  store.create(kPods, "default", shell_pod("sleeper", "sleep 60"));
  const Object pod = wait_for_phase("sleeper", "Running");
  bool ready = false;
  for (const auto& c : pod["status"]["conditions"])
    if (c["type"] == "Ready") ready = c["status"] == "True";
  EXPECT_TRUE(ready);
  EXPECT_EQ(runner->running(), 1u);
  store.remove(kPods, "default", "sleeper");
  eventually(
      [&] {
        runner->sync();
        return runner->running() == 0;
      },
      std::chrono::seconds(5));
  EXPECT_EQ(runner->running(), 0u);
}

TEST_F(PodRunnerTest, ProcessIgnoringSigterm_IsKilledAfterTheGracePeriod) {
  // The script touches `trapped` once SIGTERM is ignored; deleting the pod before that would
  // let SIGTERM end it at once.
  const std::string trapped = runner->pod_dir("default", "stubborn") + "/trapped";
  store.create(kPods, "default",
               shell_pod("stubborn",
                         "trap '' TERM; : > '" + trapped + "'; while true; do sleep 0.05; done"));
  wait_for_phase("stubborn", "Running");
  ASSERT_TRUE(wait_for_file(trapped)) << "the script never set its trap";
  store.remove(kPods, "default", "stubborn");
  const auto t0 = std::chrono::steady_clock::now();
  while (runner->running() > 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
    runner->sync();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(runner->running(), 0u);
  EXPECT_GE(took, std::chrono::milliseconds(900));  // terminationGracePeriodSeconds: 1
}

TEST_F(PodRunnerTest, ProcessesOrphanedWhenThePodDies_AreKilledToo) {
  // Like the worker's ranks: a child in its own session outlives its parent's death. The pod
  // kills itself only once that child is running, so the exit code 137 shows it was there.
  const std::string marker = std::to_string(80000 + ::getpid() % 10000);
  const std::string find_child = "pgrep -f '^sleep " + marker + "$' > /dev/null";
  store.create(kPods, "default",
               shell_pod("orphans", "setsid sleep " + marker + " & until " + find_child +
                                        "; do sleep 0.01; done; kill -KILL $$"));
  const Object pod = wait_for_phase("orphans", "Failed");
  EXPECT_EQ(pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"], 137);
  auto still_running = [&] { return std::system(find_child.c_str()) == 0; };
  eventually([&] { return !still_running(); }, std::chrono::seconds(3),
             std::chrono::milliseconds(50));
  EXPECT_FALSE(still_running());
}

TEST_F(PodRunnerTest, ConfigMapVolume_IsMaterialised_AndMountPathsRewritten) {
  store.create(kube::kConfigMaps, "default",
               {{"metadata", {{"name", "cfg"}}}, {"data", {{"plan.json", "{\"x\":1}"}}}});
  Object pod = shell_pod("reader", "");
  pod["spec"]["containers"][0]["command"] = {"/bin/sh", "-c",
                                             "cat \"$1\"; echo \" env=$CFG port=$MASTER_PORT "
                                             "addr=$MASTER_ADDR\"",
                                             "sh", "/etc/kt/plan.json"};
  pod["spec"]["containers"][0]["env"] = {{{"name", "CFG"}, {"value", "/etc/kt/plan.json"}},
                                         {{"name", "MASTER_ADDR"}, {"value", "w-0.job"}},
                                         {{"name", "MASTER_PORT"}, {"value", "29500"}}};
  pod["spec"]["containers"][0]["volumeMounts"] = {{{"name", "plan"}, {"mountPath", "/etc/kt"}}};
  pod["spec"]["volumes"] = {{{"name", "plan"}, {"configMap", {{"name", "cfg"}}}}};
  store.create(kPods, "default", pod);
  const Object done = wait_for_phase("reader", "Succeeded");
  const std::string log = read(runner->log_path("default", "reader"));
  EXPECT_NE(log.find("{\"x\":1}"), std::string::npos) << log;
  const std::string local_plan = runner->pod_dir("default", "reader") + "/volumes/plan/plan.json";
  EXPECT_NE(log.find("env=" + local_plan), std::string::npos) << log;
  EXPECT_NE(log.find("addr=127.0.0.1"), std::string::npos) << log;
  const std::string port = done["metadata"]["annotations"]["kubetrain.dev/master-port"];
  EXPECT_NE(port, "29500");
  EXPECT_NE(log.find("port=" + port), std::string::npos) << log;
}

TEST_F(PodRunnerTest, KubetrainWorkerCommand_RunsThisBuildsBinary_WithAFreeMetricsPort) {
  Object pod = shell_pod("worker", "");
  pod["spec"]["containers"][0]["command"] = {"kubetrain-worker"};
  pod["spec"]["containers"][0]["args"] = {"launch", "--metrics-port", "9090"};
  store.create(kPods, "default", pod);  // worker_binary is /bin/echo here
  const Object done = wait_for_phase("worker", "Succeeded");
  const std::string port = done["metadata"]["annotations"]["kubetrain.dev/metrics-port"];
  EXPECT_NE(port, "9090");
  EXPECT_NE(read(runner->log_path("default", "worker")).find("launch --metrics-port " + port),
            std::string::npos);
}

// Found by the chaos test: a port the kernel chose for bind(0) is in its ephemeral range, where
// outgoing connections also take their local ports, and one took a worker's port before it bound
// it (exit 1, the job failed). The ports handed to pods lie below that range, each once.
TEST_F(PodRunnerTest, RemappedPorts_AreBelowTheEphemeralRange_AndDistinct) {
  int ephemeral_low = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> ephemeral_low;
  std::set<std::string> ports;
  for (int i = 0; i < 3; ++i) {
    const std::string name = "w" + std::to_string(i);
    Object pod = shell_pod(name, "");
    pod["spec"]["containers"][0]["command"] = {"kubetrain-worker"};
    pod["spec"]["containers"][0]["args"] = {"launch", "--metrics-port", "9090"};
    pod["spec"]["containers"][0]["env"] = {{{"name", "MASTER_PORT"}, {"value", "29500"}}};
    store.create(kPods, "default", pod);  // worker_binary is /bin/echo here
    const Object done = wait_for_phase(name, "Succeeded");
    for (const char* key : {"kubetrain.dev/metrics-port", "kubetrain.dev/master-port"}) {
      const std::string port = done["metadata"]["annotations"][key];
      EXPECT_LT(std::stoi(port), ephemeral_low) << key;
      EXPECT_GE(std::stoi(port), 1024) << key;
      EXPECT_TRUE(ports.insert(port).second) << key << " " << port << " handed out twice";
    }
  }
}

TEST_F(PodRunnerTest, PodThatDoesNotFit_StaysPendingAndUnschedulable) {
  Object gpu_pod = shell_pod("gpu", "true");
  gpu_pod["spec"]["containers"][0]["resources"] = {{"limits", {{"nvidia.com/gpu", "1"}}}};
  store.create(kPods, "default", gpu_pod);
  Object elsewhere = shell_pod("elsewhere", "true");
  elsewhere["spec"]["nodeSelector"] = {{"kubernetes.io/hostname", "other-node"}};
  store.create(kPods, "default", elsewhere);
  runner->sync();
  runner->sync();
  for (const char* name : {"gpu", "elsewhere"}) {
    const Object pod = store.get(kPods, "default", name);
    EXPECT_FALSE(pod["spec"].contains("nodeName")) << name;
    EXPECT_EQ(pod["status"]["phase"], "Pending");
    EXPECT_EQ(pod["status"]["conditions"][0]["reason"], "Unschedulable");
  }
  EXPECT_EQ(runner->running(), 0u);
}

TEST_F(PodRunnerTest, Claims_AreBoundToDirectories_ThatOutliveThePods_AndGoWithTheClaim) {
  store.create(kube::kPersistentVolumeClaims, "default",
               {{"metadata", {{"name", "ckpt"}}},
                {"spec",
                 {{"accessModes", {"ReadWriteOnce"}},
                  {"resources", {{"requests", {{"storage", "1Gi"}}}}}}}});
  // A pod naming a claim that does not exist is not scheduled, and says why.
  Object waiting = shell_pod("waiting", "true");
  waiting["spec"]["volumes"] = {{{"name", "data"}, {"persistentVolumeClaim", {{"claimName", "absent"}}}}};
  store.create(kPods, "default", waiting);
  auto writer = [&](const std::string& name, const std::string& script) {
    Object pod = shell_pod(name, "");
    // The mount path as an argument of its own: the runner rewrites it to the claim's directory.
    pod["spec"]["containers"][0]["command"] = {"/bin/sh", "-c", script, "sh", "/ckpt"};
    pod["spec"]["containers"][0]["volumeMounts"] = {{{"name", "data"}, {"mountPath", "/ckpt"}}};
    pod["spec"]["volumes"] = {{{"name", "data"}, {"persistentVolumeClaim", {{"claimName", "ckpt"}}}}};
    store.create(kPods, "default", pod);
    return wait_for_phase(name, "Succeeded");
  };
  writer("first", "echo 308 > \"$1/latest\"");
  const Object claim = store.get(kube::kPersistentVolumeClaims, "default", "ckpt");
  EXPECT_EQ(claim["status"]["phase"], "Bound");
  EXPECT_EQ(claim["status"]["capacity"]["storage"], "1Gi");
  const std::string volume = claim["spec"]["volumeName"];
  EXPECT_EQ(volume, "pvc-" + claim["metadata"]["uid"].get<std::string>());
  // The next pod (a restarted gang) reads what the first one wrote.
  writer("second", "echo \"read $(cat \"$1/latest\")\"");
  EXPECT_NE(read(runner->log_path("default", "second")).find("read 308\n"), std::string::npos);
  const Object pending = store.get(kPods, "default", "waiting");
  EXPECT_FALSE(pending["spec"].contains("nodeName"));
  EXPECT_NE(pending["status"]["conditions"][0]["message"].get<std::string>().find(
                "persistentvolumeclaim \"absent\" not found"),
            std::string::npos)
      << pending.dump();
  // Reclaim policy Delete: the claim goes, its directory too.
  const fs::path data = dir / "volumes" / volume;
  EXPECT_TRUE(fs::exists(data / "latest"));
  store.remove(kube::kPersistentVolumeClaims, "default", "ckpt");
  runner->sync();
  EXPECT_FALSE(fs::exists(data));
}

TEST_F(PodRunnerTest, MissingConfigMap_FailsThePodWithTheReason) {
  Object pod = shell_pod("nocm", "true");
  pod["spec"]["volumes"] = {{{"name", "v"}, {"configMap", {{"name", "absent"}}}}};
  store.create(kPods, "default", pod);
  const Object failed = wait_for_phase("nocm", "Failed");
  EXPECT_EQ(failed["status"]["reason"], "CreateContainerError");
  EXPECT_NE(failed["status"]["message"].get<std::string>().find("absent"), std::string::npos);
}

TEST_F(PodRunnerTest, Stop_TerminatesEveryProcess) {
  runner->start();
  store.create(kPods, "default", shell_pod("a", "sleep 60"));
  store.create(kPods, "default", shell_pod("b", "sleep 60"));
  eventually([&] { return runner->running() >= 2; }, std::chrono::seconds(5));
  ASSERT_EQ(runner->running(), 2u);
  runner->stop();
  EXPECT_EQ(runner->running(), 0u);
}

}  // namespace
}  // namespace kt::local

// The local node's scheduler and kubelet (docs/OPERATIONS.md §3). It watches the store's Pods, binds the
// unbound ones that fit this node (nodeSelector, GPUs), and runs each bound pod's container as a
// local process in its own process group:
//  * `command` + `args`, where a `kubetrain-worker` program (whatever the image) is this build's
//    worker binary;
//  * the pod's env, with MASTER_ADDR pointed at 127.0.0.1 (there is no cluster DNS) and
//    MASTER_PORT moved to a free port; a `--metrics-port N` argument moves to a free port too,
//    recorded in the pod annotation kubetrain.dev/metrics-port;
//  * volumes as directories: configMap (its keys written as files), emptyDir (per pod),
//    hostPath (the path itself), persistentVolumeClaim (the directory its claim is bound to);
//    mount paths in arguments and env values are rewritten to those directories;
//  * PersistentVolumeClaims as a local-path provisioner binds them: each claim gets a directory
//    <work_dir>/volumes/pvc-<claim uid> and is Bound to it (spec.volumeName, status.phase Bound,
//    capacity = the request; size is not enforced); a pod naming a claim that does not exist
//    stays Pending (PodScheduled False, as the scheduler's VolumeBinding says); a deleted claim's
//    directory is removed (reclaim policy Delete), so a claim created again starts empty;
//  * stdout and stderr appended to <work_dir>/pods/<ns>_<pod>/log.
// Pod status follows the kubelet: Pending -> Running (podIP 127.0.0.1, Ready) -> Succeeded or
// Failed, with containerStatuses[0].state.terminated.exitCode (128 + signal when killed). A
// deleted pod's processes get SIGTERM, and SIGKILL after terminationGracePeriodSeconds.
// Containers are never restarted (restartPolicy is treated as Never).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "operator/kube/client.h"

namespace kt::local {

// On a pod: the host ports its container ports were moved to ("8080=41234,8081=41235").
inline constexpr const char* kPortMapAnnotation = "kubetrain.dev/port-map";
// In a pod's processes' environment: "<work_dir>#<pod uid>".
inline constexpr const char* kPodUidEnv = "KUBETRAIN_LOCAL_POD_UID";

struct PodRunnerOptions {
  std::string node_name;
  std::string work_dir;       // pod directories and volumes go under it
  std::string worker_binary;  // what "kubetrain-worker" runs; its siblings run the others
  // The kubeconfig a pod gets (env KUBECONFIG) for its namespace and ServiceAccount; none when
  // unset (tests of the bare runner).
  std::function<std::string(const std::string& ns, const std::string& service_account)>
      service_account_kubeconfig;
  // Whether this runner binds unbound pods to its node (the one-node scheduler below). False
  // when a scheduler.h Scheduler binds pods to this node and others (local serve with simulated
  // nodes); the runner then lists only the pods bound to its node.
  bool bind_pods = true;
  std::chrono::milliseconds poll_interval{100};
  // On stop(): how long processes get after SIGTERM before SIGKILL.
  std::chrono::milliseconds shutdown_grace{std::chrono::seconds(10)};
};

class PodRunner {
 public:
  PodRunner(kube::Client& client, PodRunnerOptions options);
  ~PodRunner();  // stop()
  PodRunner(const PodRunner&) = delete;
  PodRunner& operator=(const PodRunner&) = delete;

  // Starts the thread that syncs every poll_interval.
  void start();
  // Stops syncing, terminates every process this runner started (SIGTERM, then SIGKILL after
  // shutdown_grace) and waits for them. Idempotent.
  void stop();
  // One sync pass (bind, start, reap, kill): what the thread does; tests may call it directly
  // instead of start().
  void sync();

  std::string pod_dir(const std::string& ns, const std::string& name) const;
  std::string log_path(const std::string& ns, const std::string& name) const;
  // Where the container's termination message is written (its env
  // KUBETRAIN_TERMINATION_MESSAGE_PATH); copied into state.terminated.message on exit.
  std::string termination_message_path(const std::string& ns, const std::string& name) const;
  // Processes running now.
  size_t running() const;

 private:
  struct Process {
    pid_t pid = -1;
    std::string ns, name;
    std::string started_at;
    int64_t grace_seconds = 30;                       // the pod's terminationGracePeriodSeconds
    std::chrono::steady_clock::time_point kill_at{};  // when terminating: SIGKILL after this
    bool terminating = false;
    // Its processes seen at the last sync: when the pod's main process dies first, orphaned
    // ones (the worker's ranks run in process groups of their own) are found here.
    std::vector<pid_t> descendants;
    // The container's limits.memory in bytes (0: none), and whether the runner killed the pod
    // for going over it (a kubelet's OOMKilled, exit code 137).
    double memory_limit_bytes = 0;
    bool oom_killed = false;
    double peak_memory_bytes = 0;  // the most its processes held at one sync
  };

  void bind_if_fits(const kube::Object& pod, const kube::Object& node,
                    const std::vector<kube::Object>& pods);
  // Binds every unbound claim to a directory and removes the directories of deleted claims.
  void bind_claims();
  // The directory a bound claim's volume lives in, or why the pod cannot use it yet.
  std::string claim_dir(const std::string& ns, const std::string& claim, std::string* why) const;
  void launch(const kube::Object& pod);
  void reap(const std::set<std::string>& live_uids);
  void patch_status(const std::string& ns, const std::string& name, const kube::Object& status);

  kube::Client& client_;
  const PodRunnerOptions options_;
  mutable std::mutex mutex_;  // guards processes_ and started_; sync() runs one at a time
  std::mutex sync_mutex_;
  std::map<std::string, Process> processes_;  // by pod uid
  std::set<std::string> started_;             // pod uids ever started (never started twice)
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace kt::local

// The kubelet of simulated nodes (simulated_nodes.h; KWOK's "stage" idea, fixed to one
// life cycle): a pod bound to one of its nodes runs no process. It becomes Running (Ready, a
// podIP in 10.128.0.0/10) `start_delay` after the kubelet first saw it bound, and Succeeded
// (exit code 0) `run_duration` after that when run_duration is set; otherwise it runs until
// deleted. A test ends it on demand with the pod annotation
//   kubetrain.dev/simulate-exit-code: "N"
// — Succeeded for 0, Failed for anything else, with containerStatuses[0].state.terminated
// .exitCode N (reason Completed or Error), as the real kubelet reports a container's exit. The
// annotation may be set at creation (the pod ends right after it became Running) or later.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "operator/kube/client.h"
#include "operator/kube/informer.h"

namespace kt::local {

inline constexpr const char* kSimulateExitCodeAnnotation = "kubetrain.dev/simulate-exit-code";

struct SimulatedKubeletOptions {
  std::set<std::string> nodes;  // the node names it serves
  std::chrono::milliseconds start_delay{1000};
  std::chrono::milliseconds run_duration{0};  // 0: until deleted (or the annotation)
  std::chrono::milliseconds interval{20};     // between passes
};

class SimulatedKubelet {
 public:
  SimulatedKubelet(kube::Client& client, SimulatedKubeletOptions options);
  ~SimulatedKubelet();  // stop()
  SimulatedKubelet(const SimulatedKubelet&) = delete;
  SimulatedKubelet& operator=(const SimulatedKubelet&) = delete;

  void start();  // the pod informer and the pass thread; returns at once
  void stop();   // idempotent
  bool has_synced() const;
  // One pass: writes the status of every pod whose time came. What the thread does.
  void sync();
  size_t pods() const;  // pods on its nodes that have not ended

 private:
  struct SimulatedPod {
    std::string ns, name, container, image;
    std::chrono::steady_clock::time_point seen_bound;
    std::optional<std::chrono::steady_clock::time_point> running_since;
    std::string started_at;        // RFC 3339, when Running
    std::optional<int> exit_code;  // from the annotation
    bool ended = false;
  };

  void on_pod(kube::WatchEventType type, const kube::Object& pod);
  void set_running(SimulatedPod& pod);
  void set_terminated(SimulatedPod& pod, int exit_code);

  kube::Client& client_;
  const SimulatedKubeletOptions options_;
  std::unique_ptr<kube::Informer> pod_informer_;
  mutable std::mutex mutex_;                  // guards pods_ and next_ip_
  std::map<std::string, SimulatedPod> pods_;  // by uid
  uint32_t next_ip_ = 1;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace kt::local

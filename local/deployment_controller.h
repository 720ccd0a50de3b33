// The kube-controller-manager's workload controllers for the local control plane (docs/KUBE.md),
// so that a Deployment applied to `kubetrain local serve` (the operator's, from the Helm chart)
// runs on the local node and `helm install --wait` sees it Current. One level-triggered pass
// over every object, every poll_interval:
//  * Deployments: one ReplicaSet `<deployment>-<pod-template-hash>` per pod template, owned by
//    the Deployment (controller: true), with the template's labels plus `pod-template-hash`, the
//    Deployment's selector plus that label, and the revision annotation; a template change rolls
//    to a new ReplicaSet with the strategy's arithmetic (RollingUpdate: maxSurge and
//    maxUnavailable, default 25 %, one scale step per pass as the real controller takes;
//    Recreate: old ReplicaSets to 0, the new one created once no old pod is active); empty old
//    ReplicaSets beyond revisionHistoryLimit are deleted. Status as the deployment controller
//    writes it (observedGeneration, replicas, updatedReplicas, readyReplicas, availableReplicas,
//    unavailableReplicas; conditions Available and Progressing with the real reasons).
//  * ReplicaSets: spec.replicas active pods `<replicaset>-<5 chars>` from the template, owned by
//    the ReplicaSet; surplus pods deleted (unscheduled, then Pending, then not Ready, then newest
//    first); status replicas, fullyLabeledReplicas, readyReplicas, availableReplicas,
//    observedGeneration.
//  * PodDisruptionBudgets: the disruption controller's status (observedGeneration,
//    currentHealthy, desiredHealthy, expectedPods, disruptionsAllowed, condition
//    DisruptionAllowed).
// A pod counts as ready when its Ready condition is True (the pod runner sets it when the
// process starts); available = ready, since minReadySeconds is ignored. The local node never
// restarts containers, so a terminated (Failed or Succeeded) pod is replaced instead, after the
// kubelet's CrashLoopBackOff delay; the last `terminated_pods_kept` of each ReplicaSet to
// terminate stay for `kubectl logs`, older ones are deleted.
// Left out: adoption of orphaned pods or ReplicaSets that match a selector, proportional
// scaling of a rollout in progress, spec.paused, the progress deadline (Progressing never turns
// ProgressDeadlineExceeded), collisionCount, events, and the scale of PDB-selected pods'
// controllers other than ReplicaSets (such a controller counts its selected pods).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "operator/kube/client.h"

namespace kt::local {

struct DeploymentControllerOptions {
  std::chrono::milliseconds poll_interval{200};
  // The kubelet's CrashLoopBackOff: 10 s after a container's first exit, doubled per exit in a
  // row, at most 5 min, and reset after 10 min without one (kubernetes.io, "Pod Lifecycle",
  // container restart policy).
  std::chrono::milliseconds crash_backoff_initial{std::chrono::seconds(10)};
  std::chrono::milliseconds crash_backoff_max{std::chrono::minutes(5)};
  int terminated_pods_kept = 5;  // per ReplicaSet
  // The clock the backoff reads; tests pass a fake one. Empty: std::chrono::steady_clock.
  std::function<std::chrono::steady_clock::time_point()> clock;
};

class DeploymentController {
 public:
  DeploymentController(kube::Client& client, DeploymentControllerOptions options = {});
  ~DeploymentController();  // stop()
  DeploymentController(const DeploymentController&) = delete;
  DeploymentController& operator=(const DeploymentController&) = delete;

  // Starts the thread that syncs every poll_interval.
  void start();
  // Stops the thread (the pods stay). Idempotent.
  void stop();
  // One pass over every Deployment, ReplicaSet and PodDisruptionBudget: what the thread does;
  // tests call it directly. An object whose writes fail (a Conflict, say) is retried on the next
  // pass; failures other than Conflict are reported on stderr. Throws when a list fails.
  void sync();

 private:
  struct Pass;  // one sync's view of the objects (deployment_controller.cpp)
  struct CrashBackoff {
    int exits_in_a_row = 0;
    std::chrono::steady_clock::time_point last_exit{};
    std::chrono::steady_clock::time_point retry_at{};
    std::map<std::string, int64_t> seen;  // terminated pod uid -> when counted (a sequence)
    int64_t counted = 0;
  };

  void sync_deployment(Pass& pass, kube::Object& deployment);
  void sync_replica_set(Pass& pass, kube::Object& replica_set);
  void sync_deployment_status(Pass& pass, kube::Object& deployment);
  void sync_disruption_budget(Pass& pass, kube::Object& budget);
  std::chrono::steady_clock::time_point now() const;

  kube::Client& client_;
  const DeploymentControllerOptions options_;
  std::mutex sync_mutex_;                           // sync() runs one at a time
  std::map<std::string, CrashBackoff> backoff_;     // by ReplicaSet uid; guarded by sync_mutex_
  std::map<std::string, std::string> last_errors_;  // "kind ns/name" -> message; sync_mutex_
  std::mutex stop_mutex_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;  // guarded by stop_mutex_
  std::thread thread_;
};

// The pod-template-hash label of a pod template: FNV-1a (32 bit) of its JSON, its decimal
// digits spelled in the API server's alphabet, as the deployment controller spells it.
std::string pod_template_hash(const kube::Object& pod_template);

}  // namespace kt::local

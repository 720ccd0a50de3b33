// The local control plane's scheduler for many nodes (docs/KUBE.md; used with simulated nodes,
// simulated_nodes.h). Like kube-scheduler's default plugins, reduced to what training pods use:
// a pod without spec.nodeName is bound to the first node (real nodes by name, then simulated
// ones, simulated_nodes.h, by name) that
//  * is Ready and not spec.unschedulable (NodeUnschedulable; taints are not looked at),
//  * matches its nodeSelector and its required node affinity (nodeSelectorTerms ORed, each
//    term's matchExpressions In, NotIn, Exists, DoesNotExist, Gt, Lt and matchFields on
//    metadata.name ANDed) (NodeAffinity),
//  * has room for its nvidia.com/gpu, cpu and memory requests and one more pod beside the pods
//    bound there that have not ended (NodeResourcesFit),
// once the PersistentVolumeClaims it names exist and are Bound (VolumeBinding). First fit packs
// nodes, which is what GPU gangs want (no scoring). A pod that fits nowhere stays
// Pending with PodScheduled=False, reason Unschedulable, and kube-scheduler's message:
// "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 Insufficient
// nvidia.com/gpu." (without its "preemption: ..." tail: nothing is preempted here).
//
// Gangs (docs/OPERATIONS.md "Gang scheduling"): the pods of one group — a
// coscheduling PodGroup (label scheduling.x-k8s.io/pod-group), a Volcano PodGroup (annotation
// scheduling.k8s.io/group-name) or a Kueue plain pod group (label kueue.x-k8s.io/pod-group-name,
// annotation kueue.x-k8s.io/pod-group-total-count) — are bound all at once or not at all: only
// when the group's minMember pods (the PodGroup's spec.minMember, or Kueue's total count) exist
// and fit together; otherwise every pending member stays Pending and says why. This one scheduler
// stands in for all of them, whatever the pods' schedulerName. A pod with schedulingGates is not
// scheduled until they are removed (PodScheduled=False, reason SchedulingGated), as in
// kube-scheduler.
//
// It reads Nodes and Pods through informers (no LIST per pass, so 10,000 nodes cost one scan
// per pending pod and change) and keeps per node the requests of its pods; a binding counts at
// once (kube-scheduler's "assume"), before its watch event arrives.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "operator/kube/client.h"
#include "operator/kube/informer.h"

namespace kt::local {

struct Resources {
  double gpus = 0;          // nvidia.com/gpu
  double cpu_cores = 0;     // cpu
  double memory_bytes = 0;  // memory
  double pods = 0;          // pods
};

// A node as the scheduler sees it.
struct SchedulableNode {
  std::string name;
  std::map<std::string, std::string> labels;
  Resources allocatable;
  bool ready = false;
  bool unschedulable = false;  // spec.unschedulable (kubectl cordon)
};

// What a pod asks of a node.
struct PodNeeds {
  Resources requests;  // pods = 1
  std::map<std::string, std::string> node_selector;
  kube::Object node_selector_terms;  // required node affinity's nodeSelectorTerms; null: none
};

SchedulableNode schedulable_node(const kube::Object& node);
PodNeeds pod_needs(const kube::Object& pod);

// Why `pod` cannot go to `node` beside `requested` (the requests of the pods bound there), in
// kube-scheduler's words, one entry per failing check ("Insufficient nvidia.com/gpu", "Too many
// pods", "node(s) didn't match Pod's node affinity/selector", ...); empty when it fits.
std::vector<std::string> unfit_reasons(const PodNeeds& pod, const SchedulableNode& node,
                                       const Resources& requested);

// "0/N nodes are available: <count> <reason>, ...." with the reasons counted over the nodes and
// sorted, as kube-scheduler's FitError says it.
std::string unschedulable_message(size_t node_count,
                                  const std::map<std::string, int>& nodes_by_reason);

struct SchedulerOptions {
  std::chrono::milliseconds interval{50};  // between passes (a pass only when something changed)
};

class Scheduler {
 public:
  Scheduler(kube::Client& client, SchedulerOptions options = {});
  ~Scheduler();  // stop()
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  void start();  // the informers and the pass thread; returns at once
  void stop();   // idempotent
  bool has_synced() const;
  // One pass over the pending pods (what the thread does every interval when something
  // changed); tests may call it after has_synced().
  void schedule_pending();

 private:
  struct PodState {
    std::string ns, name;
    std::string node;    // spec.nodeName ("" pending)
    bool active = true;  // not Succeeded or Failed
    PodNeeds needs;
    std::vector<std::string> claims;  // persistentVolumeClaim names of its volumes
    std::string reported;             // the Unschedulable message on it now
    bool gated = false;               // non-empty spec.schedulingGates
    // Its gang: "<kind>/<ns>/<name>" ("" none); the PodGroup API it names (nullptr for Kueue,
    // whose size is min_member, from the pod).
    std::string group;
    const kube::Resource* group_resource = nullptr;
    std::string group_name;
    int64_t min_member = 0;
  };

  void on_node(kube::WatchEventType type, const kube::Object& node);
  void on_pod(kube::WatchEventType type, const kube::Object& pod);
  void count(const PodState& pod, double sign);    // adds or removes its requests; needs mutex_
  std::string unbound_claim(const PodState& pod);  // why its claims keep it Pending, or ""
  void report_unschedulable(PodState& pod, const std::string& message,
                            const std::string& reason = "Unschedulable");
  // The first node (in order) that `pod` fits, or nullptr with the reasons counted per node.
  const SchedulableNode* first_fit(const PodState& pod, std::map<std::string, int>& nodes_by_reason);
  bool bind(PodState& pod, const SchedulableNode& node);  // false: the pod is gone
  // The pending members of one gang, all at once or none; needs mutex_.
  void schedule_gang(const std::vector<PodState*>& pending);

  kube::Client& client_;
  const SchedulerOptions options_;
  // Claims only wake a pass: a pod waits for its claims to be Bound.
  std::unique_ptr<kube::Informer> node_informer_, pod_informer_, claim_informer_;

  std::mutex mutex_;  // guards everything below; passes run one at a time under it
  // By "0/<name>" for real nodes, "1/<name>" for simulated ones: the first-fit order.
  std::map<std::string, SchedulableNode> nodes_;
  std::map<std::string, PodState> pods_;        // by "ns/name"
  std::map<std::string, Resources> requested_;  // by node name: active bound pods' requests
  bool changed_ = true;

  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace kt::local

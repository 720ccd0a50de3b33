// The cluster as the planner sees it (docs/ARCHITECTURE.md §4.4): every node's allocatable GPUs,
// cores and memory less what the other pods on it request. Two sources give the same answer:
//
//  * listed_inventory(): a LIST of every node and every pod, decoded for each plan (`kubetrain
//    run`, tests, a client without caches);
//  * InventoryTracker: kept up to date from the Node and Pod informers' events (each node decoded
//    once, each pod's requests counted once), so that a plan at 10,000 nodes lists, copies and
//    decodes nothing; the planner reads it under the tracker's lock.
//
//   kube::Cache cache(rest, operator_cache_options(""));
//   InventoryTracker tracker(cache);  // before cache.start()
//   ...
//   tracker.with_inventory("default", "gpt", [&](const PlannerInventory& inv) {
//     plan = planner::best_plan(job, inv.free);
//   });
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "api/inventory.h"
#include "operator/kube/cache.h"
#include "operator/kube/client.h"

namespace kt::controller {

// In whole thousandths (of a GPU, of a core) and bytes, so that counting a pod in and out again
// leaves exactly what was there.
struct Requests {
  int64_t milli_gpus = 0;
  int64_t milli_cpus = 0;
  int64_t memory_bytes = 0;
  Requests& operator+=(const Requests& r);
  Requests& operator-=(const Requests& r);
};

// Where a pod's requests count: on its node (spec.nodeName), or, before the scheduler binds it,
// on the node its nodeSelector pins it to (another job's plan placed it there). std::nullopt
// for a pod that is Succeeded or Failed, or placed nowhere.
struct PodClaim {
  std::string node;
  Requests requests;
};
std::optional<PodClaim> pod_claim(const kube::Object& pod);

struct PlannerInventory {
  // Allocatable less the requests of the pods that count (not the planned job's own).
  const api::Inventory& free;
  // The fingerprint of `free`: what a plan depends on (the plan ConfigMap keeps it).
  const std::string& fingerprint;
  // The nodes less only what pods of long-running workloads hold (a ReplicaSet's, DaemonSet's or
  // StatefulSet's, or a static pod: the operator, system daemons, which do not finish to make
  // room); what would be free once every job's pods are gone. Built on demand: a plan that fails asks whether the job would ever fit, to wait
  // rather than fail.
  std::function<api::Inventory()> allocatable;
};

// From a LIST of every node and every pod through `client`; `fn` sees the inventory for a plan
// of the job `ns`/`job` (its own pods do not count).
void with_listed_inventory(kube::Client& client, const std::string& ns, const std::string& job,
                           const std::function<void(const PlannerInventory&)>& fn);

class InventoryTracker {
 public:
  // Adds handlers to the cache's Node and Pod informers: call before cache.start(), and stop the
  // cache before the tracker is destroyed (the handlers call it). The pod
  // informer must see every namespace (pods of other namespaces take GPUs too); throws kt::Error
  // otherwise.
  explicit InventoryTracker(kube::Cache& cache);
  InventoryTracker(const InventoryTracker&) = delete;
  InventoryTracker& operator=(const InventoryTracker&) = delete;

  // Both informers have listed and their lists have been counted.
  bool has_synced() const;
  // Calls `fn` under the tracker's lock (informer events wait) with the inventory for a plan of
  // the job `ns`/`job`: its own pods' requests are given back while `fn` runs.
  void with_inventory(const std::string& ns, const std::string& job,
                      const std::function<void(const PlannerInventory&)>& fn);

  // A pod this operator has just created (the API's answer): counted at once, until the pod
  // informer delivers its resourceVersion (or 30 s passed), so that the next plan, made before
  // the watch event arrives, does not take the same GPUs (controller-runtime's expectations).
  void expect(const kube::Object& created_pod);

  // Pods about to be created (rendered, not yet sent), counted from now so that the operator
  // can let the next job plan while these creates are in flight. A reservation ends when
  // expect() sees the pod of the same namespace/name, or by unreserve() (the create failed or
  // the reconcile ended). A job's own reservations are given back to its plans, as its pods are.
  void reserve(const std::vector<kube::Object>& pods);
  void unreserve(const std::vector<std::string>& keys);  // "ns/name"; absent keys are ignored

  // Nodes that failed to decode (left out of the inventory; each logged once), for tests.
  std::size_t rejected_nodes() const;

 private:
  void on_node(kube::WatchEventType type, const kube::Object& node);
  void on_pod(kube::WatchEventType type, const kube::Object& pod);
  void refresh_locked(std::size_t node_index);
  std::size_t find_locked(const std::string& node) const;  // npos when absent

  struct Allocatable {
    int64_t cpu_cores = 0;
    double memory_bytes = 0;
    uint64_t identity = 0;  // the hash of what a pod does not change (node_identity)
  };
  struct CountedPod {
    std::string job_key;  // "ns/job" from the job label, "" for other pods
    PodClaim claim;
    bool held = false;  // runs_indefinitely(): its requests are never given back
  };
  struct Expected {
    std::string key;  // "ns/name"
    CountedPod pod;
    std::chrono::steady_clock::time_point at;
  };
  void add_locked(const CountedPod& pod);
  void remove_locked(const CountedPod& pod);
  void settle_expectations_locked();
  void unreserve_locked(const std::string& key);

  kube::Informer& nodes_informer_;
  kube::Informer& pods_informer_;
  mutable std::mutex mutex_;
  api::Inventory inventory_;                          // sorted by name; free figures kept current
  std::vector<Allocatable> allocatable_;              // as inventory_.nodes
  std::unordered_map<std::string, Requests> used_;    // by node name
  std::unordered_map<std::string, Requests> held_;    // ... of those, by held pods
  std::unordered_map<std::string, CountedPod> pods_;  // by "ns/name", pods that count
  std::unordered_map<std::string, std::string> rejected_;  // node name -> why
  std::multimap<int64_t, Expected> expected_;              // by resourceVersion; counted in used_
  std::unordered_map<std::string, CountedPod> reserved_;   // by "ns/name"; counted in used_
  int64_t seen_version_ = -1;  // the newest pod resourceVersion the handler has seen
};

}  // namespace kt::controller

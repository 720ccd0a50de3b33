// Drives the reconciler the controller-runtime way (docs/ARCHITECTURE.md §7): the informers
// of a kube::Cache on TrainingJobs and on what they own (pods, ConfigMaps, Services, PVCs)
// enqueue the owning job's "ns/name"; N workers take keys from a rate-limited work queue (a key
// is never processed by two workers at once) and call Controller::reconcile. Success forgets the
// key's failures and honours requeue_after; an error goes back with add_rate_limited. The
// reconciler reads through its Client: a kube::CachingClient over the same Cache, so that every
// collection has one informer, which both enqueues and answers reads.
//
//   kube::Cache cache(rest, operator_cache_options(ns, timing));
//   kube::CachingClient client(rest, cache);
//   Controller controller(client, controller_options);
//   Manager manager(cache, controller, manager_options);
//   manager.start();  // starts the cache too
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "operator/controller/controller.h"
#include "operator/controller/metrics.h"
#include "operator/kube/cache.h"
#include "operator/kube/metrics.h"
#include "operator/kube/work_queue.h"

namespace kt::controller {

struct ManagerOptions {
  std::string ns;  // "" = all namespaces
  int workers = 2;
  kube::KubeMetrics* kube_metrics = nullptr;  // workqueue_* metrics; may be null
  // kubetrain_operator_api_requests_per_reconcile (with a Cache the controller reads through);
  // may be null.
  ControllerMetrics* controller_metrics = nullptr;
  kube::InformerTiming informer_timing;  // for the Manager's own Cache
};

// What the reconciler reads, cached: TrainingJobs, pods (indexed by job label and by node),
// nodes, and the ConfigMaps, Services and PVCs carrying the job label, in `ns` ("" = all; nodes
// are cluster-scoped). Pods are cached unfiltered: the inventory counts every pod on a node.
kube::CacheOptions operator_cache_options(const std::string& ns, kube::InformerTiming timing = {});

class Manager {
 public:
  // Enqueues from `cache` (which must hold TrainingJobs), which start() starts and stop() stops.
  Manager(kube::Cache& cache, Controller& controller, ManagerOptions options);
  // With a Cache of its own over `client` (operator_cache_options(options.ns)); the controller
  // reads through whatever Client it was given.
  Manager(kube::Client& client, Controller& controller, ManagerOptions options);
  ~Manager();  // stop()
  Manager(const Manager&) = delete;
  Manager& operator=(const Manager&) = delete;

  void start();  // returns at once
  void stop();   // idempotent; waits for the workers and informers
  bool has_synced() const;
  // Reconcile this job soon (e.g. after a change the informers cannot see).
  void enqueue(const std::string& ns, const std::string& name);

 private:
  void watch_for_keys();
  void work();
  // Jobs waiting for resources (Pending, Planned False with WaitingForResources) are woken when
  // resources may have come free (a pod deleted or finished, a node added) instead of at their
  // 30 s requeue.
  void track_waiting(kube::WatchEventType type, const kube::Object& job);
  void wake_waiting();

  std::unique_ptr<kube::Cache> own_cache_;  // null when the cache is the caller's
  kube::Cache& cache_;
  Controller& controller_;
  ControllerMetrics* const controller_metrics_;
  kube::WorkQueue queue_;
  const int workers_;
  std::vector<std::thread> threads_;
  std::atomic<bool> started_{false};
  std::mutex waiting_mutex_;
  std::set<std::string> waiting_;  // "ns/name" of the jobs waiting for resources
  std::map<std::string, bool> node_accepts_pods_;  // by node name, as last seen
};

// The key of the TrainingJob that controls `pod` (its controller ownerReference, else its
// kubetrain.dev/job-name label), or "" when none does.
std::string owning_job_key(const kube::Object& pod);

}  // namespace kt::controller

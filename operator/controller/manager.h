// Drives the reconciler the controller-runtime way (DESIGN.md §8, CONVENTIONS.md): informers on
// TrainingJobs and on the pods they own enqueue the owning job's "ns/name"; N workers take keys
// from a rate-limited work queue (a key is never processed by two workers at once) and call
// Controller::reconcile. Success forgets the key's failures and honours requeue_after; an error
// goes back with add_rate_limited. The reconciler reads through the Client, never the cache.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "operator/controller/controller.h"
#include "operator/kube/informer.h"
#include "operator/kube/metrics.h"
#include "operator/kube/work_queue.h"

namespace kt::controller {

struct ManagerOptions {
  std::string ns;  // "" = all namespaces
  int workers = 2;
  kube::KubeMetrics* kube_metrics = nullptr;  // workqueue_* metrics; may be null
  kube::InformerTiming informer_timing;
};

class Manager {
 public:
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
  void work();

  Controller& controller_;
  kube::WorkQueue queue_;
  kube::Informer jobs_;
  kube::Informer pods_;
  const int workers_;
  std::vector<std::thread> threads_;
  std::atomic<bool> started_{false};
};

// The key of the TrainingJob that controls `pod` (its controller ownerReference, else its
// kubetrain.dev/job-name label), or "" when none does.
std::string owning_job_key(const kube::Object& pod);

}  // namespace kt::controller

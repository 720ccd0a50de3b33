// The TrainingJob reconciler (docs/OPERATIONS.md §2). reconcile(ns, name) reads the job and what it owns
// through kube::Client, compares them with what the job asks for and converges one step:
// level-triggered (it looks only at the current state, never at the event that woke it) and
// idempotent (running it twice changes nothing the second time). It knows nothing of HTTP or of
// how it is driven: the manager (informers + work queue), `kubetrain run`, and the tests all call
// reconcile() the same way.
//
// What it keeps between calls lives in the cluster, never in memory, so that a new Controller on
// the same objects continues where an old one stopped: the plan, the spec generation it was made
// for, the inventory fingerprint and the restart attempt in the plan ConfigMap's annotations; the
// rest in the job's status.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "operator/controller/children.h"
#include "operator/controller/events.h"
#include "operator/controller/inventory.h"
#include "operator/controller/metrics.h"
#include "operator/controller/progress.h"
#include "operator/kube/client.h"

namespace kt::controller {

struct ControllerOptions {
  ChildOptions children;
  MetricsFetcher fetch_metrics;          // may be empty: no progress
  ControllerMetrics* metrics = nullptr;  // may be null
  // How often a running job is looked at again for progress (and deadlines).
  std::chrono::milliseconds progress_interval{std::chrono::seconds(5)};
  // The time; tests move it to reach deadlines and TTLs.
  std::function<std::chrono::system_clock::time_point()> clock = [] {
    return std::chrono::system_clock::now();
  };
  std::string name = "trainingjob";  // the `controller` label of the metrics
  // Pod creates of one gang in flight at once (the client must be thread-safe: RestClient and
  // local::Store are). 1 creates them one by one.
  int max_concurrent_creates = 16;
  // The inventory kept from the informers (may be null, or not yet synced: then each plan lists
  // every node and pod).
  InventoryTracker* inventory = nullptr;
  // Where Events go (may be null: each is created within the reconcile that records it).
  EventRecorder* events = nullptr;
  // Autotune (spec.parallelism.autotune, docs/PLANNER.md §11b): the steps a gang runs before its
  // phase times are read (once per attempt), what a restart is taken to cost (stop with a
  // checkpoint, start, resume), and the most switches one job makes.
  int64_t autotune_warmup_steps = 20;
  std::chrono::seconds autotune_restart_cost{120};
  int64_t autotune_max_switches = 3;
  // Profiling pods (docs/PLANNER.md §11a): before planning a job for nodes of a kind (cpu, or a
  // GPU product: the pod then asks for all the node's GPUs) that has no hardware-profile
  // ConfigMap in the job's namespace, run `kubetrain-worker profile` on one such node (pod
  // kubetrain-profile-<kind>), store what it measured in that ConfigMap, and
  // plan with it; the job waits (Planned False, ProfilingNodes) at most profiling_timeout. A
  // failed profiling pod is left in place (delete it to profile again) and the job is planned
  // with the built-in figures. Off: plan with what is stored or built in.
  bool profiling = false;
  bool profiling_quick = false;  // `profile --quick`: seconds, fewer repetitions (tests)
  std::chrono::seconds profiling_timeout{600};
  // Reads the API itself, not a cache (may be null: the reconciler's client is asked). Before a
  // pass creates the first child of a job it asks this one whether the job still exists with
  // the same uid: a cache that lags a delete would otherwise recreate the gang of a deleted job.
  kube::Client* api_reader = nullptr;
};

struct ReconcileResult {
  // Look at the job again after this long even if nothing changes (progress, deadlines, TTL).
  std::optional<std::chrono::milliseconds> requeue_after;
};

class Controller {
 public:
  Controller(kube::Client& client, ControllerOptions options);

  // Throws ApiError (e.g. a Conflict from a concurrent writer) or kt::Error on failures the
  // caller should retry with backoff; a job that is gone is not an error.
  ReconcileResult reconcile(const std::string& ns, const std::string& name);

 private:
  class Pass;  // one reconcile's working state (controller.cpp)

  kube::Client& client_;
  ControllerOptions options_;
  // Held by a reconcile from reading the inventory for a new plan until that plan's pods exist:
  // two jobs placed at once would both take the same free GPUs (shared: Controller stays movable).
  std::shared_ptr<std::mutex> placement_mutex_ = std::make_shared<std::mutex>();
};

}  // namespace kt::controller

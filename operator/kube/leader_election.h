// Lease-based leader election (coordination.k8s.io/v1 Lease), as client-go's leaderelection:
// candidates try every retry_period to create or take over the Lease; a holder renews every
// retry_period and gives up leadership when it could not renew for renew_deadline; another
// candidate takes over once the lease has not changed for lease_duration (measured on its own
// clock from when it last saw the record change, so clock skew between nodes does not matter).
// Writes are optimistic: an update carries the resourceVersion read, and a Conflict means
// another candidate was first.
//
//   LeaderElector elector(client, {.lease_namespace = "kubetrain-system",
//                                  .lease_name = "kubetrain-operator", .identity = pod_name,
//                                  .on_started_leading = [&] { controller.start(); },
//                                  .on_stopped_leading = [&] { std::exit(1); }});
//   elector.start();
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "operator/kube/client.h"
#include "operator/kube/metrics.h"

namespace kt::kube {

struct LeaderElectionConfig {
  std::string lease_namespace;
  std::string lease_name;
  std::string identity;  // unique per candidate (the pod name)
  std::chrono::milliseconds lease_duration{15'000};
  std::chrono::milliseconds renew_deadline{10'000};
  std::chrono::milliseconds retry_period{2'000};
  // Called on the elector's thread; they must return promptly (start threads, don't run them).
  std::function<void()> on_started_leading;
  std::function<void()> on_stopped_leading;
  // On stop() a leader empties holderIdentity so that a successor need not wait for the lease
  // to expire (client-go's ReleaseOnCancel).
  bool release_on_stop = true;
  // A Role in the Lease's namespace that owns the Lease (an ownerReference), so that deleting
  // it — `helm uninstall` deletes the chart's leader-election Role — collects the Lease too
  // instead of leaving a record of a holder that is gone. "" leaves the Lease unowned; a Role
  // that cannot be read is logged and the Lease is written without the owner.
  std::string owner_role;
  KubeMetrics* metrics = nullptr;  // leader_election_master_status{name=lease_name}
};

class LeaderElector {
 public:
  LeaderElector(Client& client, LeaderElectionConfig config);
  ~LeaderElector();  // stops
  LeaderElector(const LeaderElector&) = delete;
  LeaderElector& operator=(const LeaderElector&) = delete;

  void start();
  // Ends the loop; a leader releases the lease (if configured) and gets on_stopped_leading.
  void stop();
  bool is_leader() const { return leading_.load(); }

 private:
  void run();
  void log_lock_error(const char* what, const std::string& error) const;
  bool try_acquire_or_renew();
  // Adds the owner_role reference to `lease` when it lacks one (reads the Role once).
  void own(Object& lease);
  void set_leading(bool leading);
  bool sleep_unless_stopped(std::chrono::milliseconds duration);

  Client& client_;
  const LeaderElectionConfig config_;
  std::atomic<bool> leading_{false};

  // What this candidate last saw of the lease and when (on its steady clock).
  std::string observed_record_;
  Object owner_;  // the ownerReference to owner_role once read (null until then)
  std::chrono::steady_clock::time_point observed_at_{};
  std::chrono::steady_clock::time_point last_renewed_{};

  std::mutex mutex_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace kt::kube

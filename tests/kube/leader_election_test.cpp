// Lease leader election with two candidates over HTTP against `kubetrain local serve`: exactly
// one leads; when it stops, the other takes over (at once when the lease is released, after the
// lease duration when the leader just vanished).
#include "operator/kube/leader_election.h"

#include <gtest/gtest.h>

#include <atomic>

#include "tests/kube/local_server.h"
#include "tests/support/eventually.h"

using namespace std::chrono_literals;
using namespace kt::kube;
using kt::kube::testing::LocalServer;
using kt::test::eventually;

namespace {

// Shortened timings (the defaults are 15 s / 10 s / 2 s); the ratios stay client-go's.
LeaderElectionConfig candidate(const std::string& identity, std::atomic<int>& starts,
                               std::atomic<int>& stops, bool release_on_stop = true) {
  LeaderElectionConfig c;
  c.lease_namespace = "kubetrain-system";
  c.lease_name = "kubetrain-operator";
  c.identity = identity;
  c.lease_duration = 3s;
  c.renew_deadline = 2s;
  c.retry_period = 400ms;
  c.release_on_stop = release_on_stop;
  c.on_started_leading = [&starts] { starts++; };
  c.on_stopped_leading = [&stops] { stops++; };
  return c;
}

std::string holder(Client& store) {
  return store.get(kLeases, "kubetrain-system", "kubetrain-operator")["spec"].value("holderIdentity", "");
}

// The lease's spec.renewTime: it changes with every successful renewal.
std::string renew_time(Client& store) {
  const Object lease = store.get(kLeases, "kubetrain-system", "kubetrain-operator");
  return lease["spec"].value("renewTime", "");
}

}  // namespace

TEST(LeaderElection, ExactlyOneOfTwoLeadsAndTheOtherTakesOverWhenItStops) {
  LocalServer local;
  auto client_a = local.client();
  auto client_b = local.client();
  std::atomic<int> a_starts{0}, a_stops{0}, b_starts{0}, b_stops{0};
  kt::telemetry::Registry registry;
  KubeMetrics metrics_a(registry);
  kt::telemetry::Registry registry_b;
  KubeMetrics metrics_b(registry_b);
  auto config_a = candidate("a", a_starts, a_stops);
  config_a.metrics = &metrics_a;
  auto config_b = candidate("b", b_starts, b_stops);
  config_b.metrics = &metrics_b;
  LeaderElector a(*client_a, config_a);
  LeaderElector b(*client_b, config_b);
  a.start();
  b.start();

  ASSERT_TRUE(eventually([&] { return a.is_leader() || b.is_leader(); }, 10s));
  // For several renew periods: never both, always one.
  for (int i = 0; i < 20; ++i) {
    EXPECT_NE(a.is_leader(), b.is_leader()) << "exactly one leads";
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_EQ(a_starts + b_starts, 1) << "leadership did not flap";
  LeaderElector& leader = a.is_leader() ? a : b;
  LeaderElector& follower = a.is_leader() ? b : a;
  const std::string leader_name = a.is_leader() ? "a" : "b";
  const std::string follower_name = a.is_leader() ? "b" : "a";
  KubeMetrics& leader_metrics = a.is_leader() ? metrics_a : metrics_b;
  KubeMetrics& follower_metrics = a.is_leader() ? metrics_b : metrics_a;
  EXPECT_EQ(holder(local.store), leader_name);
  EXPECT_EQ(leader_metrics.leader_election_master_status.with({"kubetrain-operator"}).value(), 1);
  EXPECT_EQ(follower_metrics.leader_election_master_status.with({"kubetrain-operator"}).value(), 0);

  const auto stopped_at = std::chrono::steady_clock::now();
  leader.stop();  // releases the lease
  EXPECT_EQ(a_stops + b_stops, 1) << "the stopped leader was told";
  EXPECT_EQ(leader_metrics.leader_election_master_status.with({"kubetrain-operator"}).value(), 0);
  ASSERT_TRUE(eventually([&] { return follower.is_leader(); }, 10s));
  EXPECT_LT(std::chrono::steady_clock::now() - stopped_at, 3s)
      << "a released lease is taken within the lease duration";
  EXPECT_EQ(holder(local.store), follower_name);
  EXPECT_EQ(follower_metrics.leader_election_master_status.with({"kubetrain-operator"}).value(), 1);
  const Object lease = local.store.get(kLeases, "kubetrain-system", "kubetrain-operator");
  EXPECT_EQ(lease["spec"]["leaseTransitions"].get<int>(), 1);
}

TEST(LeaderElection, AVanishedLeaderIsReplacedOnlyAfterTheLeaseExpires) {
  LocalServer local;
  kt::telemetry::Registry registry_b;
  KubeMetrics metrics_b(registry_b);  // counts b's requests: its tries for the lease
  auto client_a = local.client();
  auto client_b = local.client({.metrics = &metrics_b});
  std::atomic<int> a_starts{0}, a_stops{0}, b_starts{0}, b_stops{0};
  LeaderElector a(*client_a, candidate("a", a_starts, a_stops, /*release_on_stop=*/false));
  a.start();
  ASSERT_TRUE(eventually([&] { return a.is_leader(); }, 10s));
  LeaderElector b(*client_b, candidate("b", b_starts, b_stops));
  b.start();
  // b has read the lease that a holds three times (a GET per try), so its first two tries are
  // over, and it has not taken the lease.
  const auto& lease_reads_by_b = metrics_b.rest_client_requests.with({"200", "GET"});
  ASSERT_TRUE(eventually([&] { return lease_reads_by_b.value() >= 3; }, 10s));
  ASSERT_FALSE(b.is_leader());

  const auto vanished_at = std::chrono::steady_clock::now();
  a.stop();  // no release: like a crashed process
  ASSERT_TRUE(eventually([&] { return b.is_leader(); }, 15s));
  const auto takeover = std::chrono::steady_clock::now() - vanished_at;
  // b measures expiry from when it last saw the record change, about one retry period after
  // a's last renewal: so about lease_duration − retry_period after a vanished at the earliest.
  // The bound leaves room for late renewals on a loaded machine; a takeover without waiting
  // for expiry would come within one retry period (0.4 s).
  EXPECT_GE(takeover, 1500ms);
  EXPECT_LT(takeover, 10s);
}

TEST(LeaderElection, ALeaderThatCannotRenewStepsDown) {
  LocalServer local;
  auto client = local.client();
  std::atomic<int> starts{0}, stops{0};
  LeaderElector a(*client, candidate("a", starts, stops));
  a.start();
  ASSERT_TRUE(eventually([&] { return a.is_leader(); }, 10s));
  // One conflicting write is absorbed by the next renewal...
  local.server.set_faults({.update_conflicts = 1});
  ASSERT_TRUE(eventually([&] { return local.server.faults().update_conflicts == 0; }, 10s));
  const std::string renewed_before = renew_time(local.store);
  ASSERT_TRUE(eventually([&] { return renew_time(local.store) != renewed_before; }, 10s))
      << "no renewal after the conflict";
  EXPECT_TRUE(a.is_leader());
  EXPECT_EQ(stops, 0);
  // ...but an API server that fails every request for longer than the renew deadline costs
  // the leadership.
  local.server.set_faults({.server_errors = 1'000'000});
  EXPECT_TRUE(eventually([&] { return !a.is_leader(); }, 10s));
  EXPECT_EQ(stops, 1);
  local.server.set_faults({});
  EXPECT_TRUE(eventually([&] { return a.is_leader(); }, 15s)) << "and it can lead again later";
  a.stop();
}

// With owner_role, the Lease is owned by that Role: deleting the Role (helm uninstall) collects
// the Lease, so no record of a holder that is gone is left behind. A Lease made before the
// owner was known gets the reference on its next renewal.
TEST(LeaderElection, TheLeaseIsOwnedByTheRoleAndGoesWithIt) {
  LocalServer local;
  auto client = local.client();
  std::atomic<int> starts{0}, stops{0};
  auto config = candidate("a", starts, stops);
  config.owner_role = "kt-leader-election";
  {
    // No Role yet: the Lease is written without an owner, and the elector still leads.
    LeaderElector a(*client, config);
    a.start();
    ASSERT_TRUE(eventually([&] { return a.is_leader(); }, 10s));
    EXPECT_FALSE(local.store.get(kLeases, "kubetrain-system", "kubetrain-operator")["metadata"]
                     .contains("ownerReferences"));
    const Object role = local.store.create(
        kRoles, "kubetrain-system", {{"metadata", {{"name", "kt-leader-election"}}}, {"rules", Object::array()}});
    ASSERT_TRUE(eventually(
        [&] {
          const Object lease = local.store.get(kLeases, "kubetrain-system", "kubetrain-operator");
          return lease["metadata"].contains("ownerReferences") &&
                 lease["metadata"]["ownerReferences"][0]["uid"] == role["metadata"]["uid"];
        },
        10s))
        << "the Lease never got its owner";
    a.stop();
  }
  local.store.remove(kRoles, "kubetrain-system", "kt-leader-election");
  EXPECT_THROW(local.store.get(kLeases, "kubetrain-system", "kubetrain-operator"), ApiError);
}

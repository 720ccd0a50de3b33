// The operator's REST path end to end, in one process: the TrainingJob manager and reconciler
// talk to `kubetrain local serve` through RestClient over 127.0.0.1 while the server injects
// faults (dropped watches, 410s, 500s, 409s, slow responses); a fake kubelet writes pod status
// straight into the Store. The job must still run to Succeeded with exactly one worker pod.
#include <gtest/gtest.h>

#include "operator/controller/controller.h"
#include "operator/controller/manager.h"
#include "tests/kube/local_server.h"
#include "tests/support/eventually.h"
#include "tests/support/training_job.h"

using namespace std::chrono_literals;
using namespace kt::kube;
using kt::kube::testing::LocalServer;
using kt::test::eventually;
using kt::test::tiny_job_object;

TEST(OperatorOverHttp, ATrainingJobRunsToSucceededThroughFaults) {
  LocalServer local;
  Object node = local.store.create(
      kNodes, "", {{"metadata", {{"name", "n"}, {"labels", {{"kubernetes.io/hostname", "n"}}}}}});
  node["status"] = {{"allocatable", {{"cpu", "2"}, {"memory", "8Gi"}}}};
  local.store.update_status(kNodes, "", node);

  auto client = local.client();
  kt::controller::ControllerOptions controller_options;
  controller_options.progress_interval = 100ms;
  kt::controller::Controller controller(*client, controller_options);
  kt::controller::ManagerOptions manager_options;
  manager_options.informer_timing.initial_backoff = 50ms;
  manager_options.informer_timing.max_backoff = 500ms;
  kt::controller::Manager manager(*client, controller, manager_options);
  manager.start();
  ASSERT_TRUE(eventually([&] { return manager.has_synced(); }));

  // Faults from the start: every watch is cut once, then 410, 500s, conflicts and slowness.
  local.server.set_faults({.watch_gone = 2, .update_conflicts = 3, .server_errors = 5,
                           .delay = 20ms});
  local.server.drop_watches();
  local.store.create(kTrainingJobs, "default", tiny_job_object("h"));  // as kubectl would

  auto pod_exists = [&] {
    try {
      local.store.get(kPods, "default", "h-worker-0");
      return true;
    } catch (const ApiError&) {
      return false;
    }
  };
  ASSERT_TRUE(eventually(pod_exists, 30s));
  EXPECT_EQ(local.server.faults().server_errors, 0) << "the 500s were met";
  EXPECT_EQ(local.server.faults().watch_gone, 0) << "the 410s were met";
  auto phase = [&] {
    return local.store.get(kTrainingJobs, "default", "h")
        .value("status", Object::object())
        .value("phase", "");
  };
  kt::local::Faults faults = local.server.faults();  // conflicts not yet met stay
  faults.watch_expired = 1;
  faults.server_errors = 3;
  local.server.set_faults(faults);
  local.server.drop_watches();
  Object pod = local.store.get(kPods, "default", "h-worker-0");
  pod["status"] = {{"phase", "Running"}, {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}};
  local.store.update_status(kPods, "default", pod);
  EXPECT_TRUE(eventually([&] { return phase() == "Running"; }, 30s)) << phase();

  local.server.drop_watches();
  pod = local.store.get(kPods, "default", "h-worker-0");
  pod["status"] = {{"phase", "Succeeded"}};
  local.store.update_status(kPods, "default", pod);
  EXPECT_TRUE(eventually([&] { return phase() == "Succeeded"; }, 30s)) << phase();
  manager.stop();
  EXPECT_EQ(local.server.faults().update_conflicts, 0) << "the conflicts were met";
  EXPECT_EQ(local.server.faults().watch_expired, 0) << "the ERROR event was met";
  EXPECT_EQ(local.store.list(kPods, "default", {}).items.size(), 1u) << "exactly one worker pod";
}

// The manager drives the reconciler from informer events through the work queue.
#include "operator/controller/manager.h"

#include <gtest/gtest.h>

#include "local/store.h"
#include "tests/support/eventually.h"
#include "tests/support/training_job.h"

namespace kt::controller {
namespace {

using kube::Object;
using test::eventually;
using test::tiny_job_object;

TEST(OwningJobKey, PrefersTheControllerReference_ThenTheLabel) {
  const Object owned = {{"metadata",
                         {{"namespace", "ns"},
                          {"labels", {{"kubetrain.dev/job-name", "from-label"}}},
                          {"ownerReferences",
                           {{{"kind", "TrainingJob"}, {"name", "owner"}, {"controller", true}}}}}}};
  EXPECT_EQ(owning_job_key(owned), "ns/owner");
  const Object labelled = {
      {"metadata", {{"namespace", "ns"}, {"labels", {{"kubetrain.dev/job-name", "j"}}}}}};
  EXPECT_EQ(owning_job_key(labelled), "ns/j");
  EXPECT_EQ(owning_job_key({{"metadata", {{"namespace", "ns"}}}}), "");
}

TEST(Manager, ReconcilesOnJobAndPodEvents_UntilTheJobSucceeds) {
  local::Store store;
  store.register_resource(kube::kTrainingJobs, true);
  Object node =
      store.create(kube::kNodes, "",
                   {{"metadata", {{"name", "n"}, {"labels", {{"kubernetes.io/hostname", "n"}}}}}});
  node["status"] = {{"allocatable", {{"cpu", "2"}, {"memory", "8Gi"}}}};
  store.update_status(kube::kNodes, "", node);
  ControllerOptions options;
  options.progress_interval = std::chrono::milliseconds(50);
  Controller controller(store, options);
  ManagerOptions manager_options;
  manager_options.workers = 2;
  Manager manager(store, controller, manager_options);
  manager.start();
  ASSERT_TRUE(eventually([&] { return manager.has_synced(); }));

  store.create(kube::kTrainingJobs, "default", tiny_job_object("m"));
  auto pod_exists = [&] {
    try {
      store.get(kube::kPods, "default", "m-worker-0");
      return true;
    } catch (const kube::ApiError&) {
      return false;
    }
  };
  ASSERT_TRUE(eventually(pod_exists));
  auto phase = [&] {
    return store.get(kube::kTrainingJobs, "default", "m")
        .value("status", Object::object())
        .value("phase", "");
  };
  // The fake kubelet: running, then done. Each pod change must wake the reconciler.
  Object pod = store.get(kube::kPods, "default", "m-worker-0");
  pod["status"] = {{"phase", "Running"}, {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}};
  store.update_status(kube::kPods, "default", pod);
  EXPECT_TRUE(eventually([&] { return phase() == "Running"; })) << phase();
  pod = store.get(kube::kPods, "default", "m-worker-0");
  pod["status"] = {{"phase", "Succeeded"}};
  store.update_status(kube::kPods, "default", pod);
  EXPECT_TRUE(eventually([&] { return phase() == "Succeeded"; })) << phase();
  manager.stop();
  EXPECT_EQ(store.list(kube::kPods, "default", {}).items.size(), 1u);  // still exactly one pod
}

// A job waiting for resources starts when a pod that held them goes, not at its 30 s requeue.
TEST(Manager, AJobWaitingForResources_StartsWhenAPodLeaves) {
  local::Store store;
  store.register_resource(kube::kTrainingJobs, true);
  Object node =
      store.create(kube::kNodes, "",
                   {{"metadata", {{"name", "n"}, {"labels", {{"kubernetes.io/hostname", "n"}}}}}});
  node["status"] = {{"allocatable", {{"cpu", "4"}, {"memory", "16Gi"}}}};
  store.update_status(kube::kNodes, "", node);
  // Someone else's pod holds 15.5 of the 16 GiB: GPT-2 124M fits the node, not beside it.
  store.create(kube::kPods, "default",
               {{"metadata", {{"name", "hog"}, {"namespace", "default"}}},
                {"spec",
                 {{"nodeName", "n"},
                  {"containers",
                   {{{"name", "c"}, {"resources", {{"requests", {{"memory", "15872Mi"}}}}}}}}}}});
  ControllerOptions options;
  Controller controller(store, options);
  Manager manager(store, controller, ManagerOptions{});
  manager.start();
  ASSERT_TRUE(eventually([&] { return manager.has_synced(); }));
  Object job = tiny_job_object("w");
  job["spec"]["model"] = {{"preset", "gpt2-124m"}};
  store.create(kube::kTrainingJobs, "default", job);
  const auto planned_reason = [&] {
    for (const Object& c : store.get(kube::kTrainingJobs, "default", "w")
                               .value("status", Object::object())
                               .value("conditions", Object::array()))
      if (c.value("type", "") == "Planned") return c.value("reason", "");
    return std::string();
  };
  ASSERT_TRUE(eventually([&] { return planned_reason() == "WaitingForResources"; }))
      << planned_reason();
  store.remove(kube::kPods, "default", "hog");
  const auto worker_exists = [&] {
    for (const Object& p : store.list(kube::kPods, "default", {}).items)
      if (p["metadata"].value("name", "") == "w-worker-0") return true;
    return false;
  };
  EXPECT_TRUE(eventually(worker_exists, std::chrono::seconds(10)))
      << "the waiting job was not woken (its own requeue comes after 30 s)";
  manager.stop();
}

TEST(Manager, JobsThatExistedBeforeTheStart_AreReconciledFromTheFirstList) {
  local::Store store;
  store.register_resource(kube::kTrainingJobs, true);
  Object node =
      store.create(kube::kNodes, "",
                   {{"metadata", {{"name", "n"}, {"labels", {{"kubernetes.io/hostname", "n"}}}}}});
  node["status"] = {{"allocatable", {{"cpu", "2"}, {"memory", "8Gi"}}}};
  store.update_status(kube::kNodes, "", node);
  store.create(kube::kTrainingJobs, "default", tiny_job_object("early"));
  Controller controller(store, {});
  ManagerOptions manager_options;
  manager_options.ns = "default";
  Manager manager(store, controller, manager_options);
  manager.start();
  EXPECT_TRUE(eventually([&] { return store.list(kube::kPods, "default", {}).items.size() == 1; }));
}

}  // namespace
}  // namespace kt::controller

#include "operator/controller/manager.h"

#include <cstdio>

namespace kt::controller {

using kube::Object;

std::string owning_job_key(const Object& pod) {
  const Object meta = pod.value("metadata", Object::object());
  const std::string ns = meta.value("namespace", "");
  for (const auto& ref : meta.value("ownerReferences", Object::array()))
    if (ref.value("controller", false) && ref.value("kind", "") == "TrainingJob")
      return ns + "/" + ref.value("name", "");
  const std::string job = meta.value("labels", Object::object()).value(kJobNameLabel, "");
  return job.empty() ? "" : ns + "/" + job;
}

Manager::Manager(kube::Client& client, Controller& controller, ManagerOptions options)
    : controller_(controller),
      queue_("trainingjob", options.kube_metrics),
      jobs_(client, kube::kTrainingJobs, options.ns, "", options.informer_timing),
      pods_(client, kube::kPods, options.ns, kJobNameLabel, options.informer_timing),
      workers_(std::max(1, options.workers)) {
  // Handlers only enqueue keys (never touch objects): the reconciler reads the current state.
  jobs_.add_handler(
      [this](kube::WatchEventType, const Object& job) { queue_.add(kube::object_key(job)); });
  pods_.add_handler([this](kube::WatchEventType, const Object& pod) {
    const std::string key = owning_job_key(pod);
    if (!key.empty()) queue_.add(key);
  });
}

Manager::~Manager() {
  stop();
}

void Manager::start() {
  if (started_.exchange(true)) return;
  jobs_.start();
  pods_.start();
  for (int i = 0; i < workers_; ++i) threads_.emplace_back([this] { work(); });
}

void Manager::stop() {
  if (!started_.exchange(false)) return;
  queue_.shut_down();
  for (auto& t : threads_) t.join();
  threads_.clear();
  pods_.stop();
  jobs_.stop();
}

bool Manager::has_synced() const {
  return jobs_.has_synced() && pods_.has_synced();
}

void Manager::enqueue(const std::string& ns, const std::string& name) {
  queue_.add(ns + "/" + name);
}

void Manager::work() {
  while (auto key = queue_.get()) {
    const auto slash = key->find('/');
    const std::string ns = slash == std::string::npos ? "" : key->substr(0, slash);
    const std::string name = slash == std::string::npos ? *key : key->substr(slash + 1);
    try {
      const ReconcileResult result = controller_.reconcile(ns, name);
      queue_.forget(*key);
      if (result.requeue_after) queue_.add_after(*key, *result.requeue_after);
    } catch (const std::exception& e) {
      // Conflicts are routine (someone wrote first); everything else is worth a line.
      const auto* api = dynamic_cast<const kube::ApiError*>(&e);
      if (!api || !api->conflict())
        std::fprintf(stderr, "kubetrain-operator: reconcile %s: %s\n", key->c_str(), e.what());
      queue_.add_rate_limited(*key);
    }
    queue_.done(*key);
  }
}

}  // namespace kt::controller

#include "operator/controller/manager.h"

#include <cstdio>

#include "api/inventory.h"
#include "operator/controller/events.h"
#include "operator/kube/objects.h"

namespace kt::controller {

using kube::Object;

namespace {
// The work queue's `name` and the metrics' `controller` label, as controller-runtime names both
// after the controller.
constexpr const char* kControllerName = "trainingjob";
}  // namespace

std::string owning_job_key(const Object& pod) {
  const Object meta = pod.value("metadata", Object::object());
  const std::string ns = meta.value("namespace", "");
  for (const auto& ref : meta.value("ownerReferences", Object::array()))
    if (ref.value("controller", false) && ref.value("kind", "") == "TrainingJob")
      return ns + "/" + ref.value("name", "");
  const std::string job = meta.value("labels", Object::object()).value(kJobNameLabel, "");
  return job.empty() ? "" : ns + "/" + job;
}

namespace {

// A Node as the operator keeps it: what the inventory decodes (api/inventory.h) and what
// selectors read; its images, addresses, conditions, daemon endpoints and managedFields (tens of
// KiB on a real node) are dropped.
void trim_node(Object& node) {
  const auto keep_only = [](Object& object, std::initializer_list<const char*> keys) {
    if (!object.is_object()) return;
    Object kept = Object::object();
    for (const char* key : keys)
      if (auto it = object.find(key); it != object.end()) kept[key] = std::move(*it);
    object = std::move(kept);
  };
  keep_only(node, {"apiVersion", "kind", "metadata", "spec", "status"});
  if (auto meta = node.find("metadata"); meta != node.end())
    keep_only(*meta, {"name", "uid", "resourceVersion", "generation", "creationTimestamp",
                      "deletionTimestamp", "labels", "annotations"});
  if (auto spec = node.find("spec"); spec != node.end())
    keep_only(*spec, {"unschedulable", "taints", "providerID"});
  if (auto status = node.find("status"); status != node.end() && status->is_object()) {
    // Of the conditions, Ready's status (api::node_accepts_pods reads it).
    Object ready = Object::array();
    if (auto conditions = status->find("conditions");
        conditions != status->end() && conditions->is_array())
      for (const Object& c : *conditions)
        if (c.is_object() && c.value("type", Object()) == "Ready")
          ready.push_back({{"type", "Ready"}, {"status", c.value("status", Object())}});
    keep_only(*status, {"allocatable", "capacity"});
    if (!ready.empty()) (*status)["conditions"] = std::move(ready);
  }
}

// Every other cached object without metadata.managedFields (1-3 KiB each on a real API server;
// an update that leaves them out keeps the server's).
void trim_managed_fields(Object& object) {
  if (auto meta = object.find("metadata"); meta != object.end() && meta->is_object())
    meta->erase("managedFields");
}

// A Pod as the operator keeps it (the pod informer sees every pod of the cluster, most of them
// not ours): its metadata, its status, and of its spec what the controller and the inventory
// read (where it runs or is pinned, its gates, each container's resources); env, commands,
// volumes, probes, affinity and tolerations (most of a pod's size) are dropped. Nothing updates
// a pod from the cache, so nothing writes a trimmed spec back.
void trim_pod(Object& pod) {
  trim_managed_fields(pod);
  const auto spec = pod.find("spec");
  if (spec == pod.end() || !spec->is_object()) return;
  Object kept = Object::object();
  for (const char* key : {"nodeName", "nodeSelector", "schedulingGates", "schedulerName",
                          "priorityClassName", "restartPolicy"})
    if (auto it = spec->find(key); it != spec->end()) kept[key] = std::move(*it);
  if (auto containers = spec->find("containers");
      containers != spec->end() && containers->is_array()) {
    Object trimmed = Object::array();
    for (Object& c : *containers) {
      if (!c.is_object()) continue;
      Object one = Object::object();
      for (const char* key : {"name", "resources"})
        if (auto it = c.find(key); it != c.end()) one[key] = std::move(*it);
      trimmed.push_back(std::move(one));
    }
    kept["containers"] = std::move(trimmed);
  }
  *spec = std::move(kept);
}

}  // namespace

kube::CacheOptions operator_cache_options(const std::string& ns, kube::InformerTiming timing) {
  kube::CacheOptions options;
  options.timing = timing;
  options.resources = {
      {kube::kTrainingJobs, ns, "", {}, {}, trim_managed_fields},
      {kube::kPods, ns, "", {kJobNameLabel}, {"spec.nodeName"}, trim_pod},
      {kube::kNodes, "", "", {}, {}, trim_node},
      {kube::kConfigMaps, ns, kJobNameLabel, {kJobNameLabel}, {}, trim_managed_fields},
      {kube::kServices, ns, kJobNameLabel, {kJobNameLabel}, {}, trim_managed_fields},
      {kube::kPersistentVolumeClaims, ns, kJobNameLabel, {kJobNameLabel}, {}, trim_managed_fields},
  };
  return options;
}

Manager::Manager(kube::Cache& cache, Controller& controller, ManagerOptions options)
    : cache_(cache),
      controller_(controller),
      controller_metrics_(options.controller_metrics),
      queue_(kControllerName, options.kube_metrics),
      workers_(std::max(1, options.workers)) {
  if (controller_metrics_) controller_metrics_->api_requests_per_reconcile.with({kControllerName});
  watch_for_keys();
}

Manager::Manager(kube::Client& client, Controller& controller, ManagerOptions options)
    : own_cache_(std::make_unique<kube::Cache>(
          client, operator_cache_options(options.ns, options.informer_timing))),
      cache_(*own_cache_),
      controller_(controller),
      controller_metrics_(nullptr),  // the controller does not read through own_cache_
      queue_(kControllerName, options.kube_metrics),
      workers_(std::max(1, options.workers)) {
  watch_for_keys();
}

void Manager::watch_for_keys() {
  kube::Informer* jobs = cache_.informer(kube::kTrainingJobs);
  KT_CHECK(jobs, "Manager: the cache holds no TrainingJobs");
  // Handlers enqueue keys (and keep the set of waiting jobs); the reconciler reads the current
  // state.
  jobs->add_handler([this](kube::WatchEventType type, const Object& job) {
    track_waiting(type, job);
    queue_.add(kube::object_key(job));
  });
  // What a job owns (controller-runtime's Owns()): a change, or a child deleted by someone else,
  // wakes its job.
  for (const kube::Resource& owned :
       {kube::kPods, kube::kConfigMaps, kube::kServices, kube::kPersistentVolumeClaims}) {
    kube::Informer* informer = cache_.informer(owned);
    if (!informer) continue;
    informer->add_handler([this](kube::WatchEventType, const Object& child) {
      const std::string key = owning_job_key(child);
      if (!key.empty()) queue_.add(key);
    });
  }
  // Any pod, ours or not, that stops holding its requests; any node that joins.
  if (kube::Informer* pods = cache_.informer(kube::kPods))
    pods->add_handler([this](kube::WatchEventType type, const Object& pod) {
      const auto status = pod.find("status");
      const std::string phase = status != pod.end() && status->is_object()
                                    ? status->value("phase", std::string())
                                    : std::string();
      if (type == kube::WatchEventType::Deleted || phase == "Succeeded" || phase == "Failed")
        wake_waiting();
    });
  // ... and any node that joins or comes back (Ready again, uncordoned): a job waiting for
  // room, or for spec.resources.minNodes, plans again. Heartbeats that change nothing wake none.
  if (kube::Informer* nodes = cache_.informer(kube::kNodes))
    nodes->add_handler([this](kube::WatchEventType type, const Object& node) {
      const std::string name = node.contains("metadata") && node["metadata"].is_object()
                                   ? node["metadata"].value("name", std::string())
                                   : std::string();
      bool came_back = false;
      {
        std::lock_guard lock(waiting_mutex_);
        if (type == kube::WatchEventType::Deleted) {
          node_accepts_pods_.erase(name);
        } else {
          const bool accepts = api::node_accepts_pods(node);
          const auto it = node_accepts_pods_.find(name);
          came_back = accepts && (it == node_accepts_pods_.end() || !it->second);
          node_accepts_pods_[name] = accepts;
        }
      }
      if (came_back) wake_waiting();
    });
}

void Manager::track_waiting(kube::WatchEventType type, const Object& job) {
  bool waiting = false;
  const auto status = job.find("status");
  if (type != kube::WatchEventType::Deleted && status != job.end() && status->is_object() &&
      status->value("phase", std::string()) == "Pending") {
    const auto conditions = status->find("conditions");
    if (conditions != status->end() && conditions->is_array())
      for (const Object& c : *conditions)
        waiting = waiting || (c.is_object() && c.value("type", std::string()) == "Planned" &&
                              c.value("reason", std::string()) == "WaitingForResources");
  }
  const std::string key = kube::object_key(job);
  std::lock_guard lock(waiting_mutex_);
  if (waiting)
    waiting_.insert(key);
  else
    waiting_.erase(key);
}

void Manager::wake_waiting() {
  std::lock_guard lock(waiting_mutex_);
  for (const std::string& key : waiting_) queue_.add(key);
}

Manager::~Manager() {
  stop();
}

void Manager::start() {
  if (started_.exchange(true)) return;
  cache_.start();
  for (int i = 0; i < workers_; ++i) threads_.emplace_back([this] { work(); });
}

void Manager::stop() {
  if (!started_.exchange(false)) return;
  queue_.shut_down();
  for (auto& t : threads_) t.join();
  threads_.clear();
  cache_.stop();
}

bool Manager::has_synced() const {
  return cache_.has_synced();
}

void Manager::enqueue(const std::string& ns, const std::string& name) {
  queue_.add(ns + "/" + name);
}

void Manager::work() {
  while (auto key = queue_.get()) {
    const auto slash = key->find('/');
    const std::string ns = slash == std::string::npos ? "" : key->substr(0, slash);
    const std::string name = slash == std::string::npos ? *key : key->substr(slash + 1);
    const std::int64_t requests_before = kube::CachingClient::api_requests_on_this_thread();
    try {
      const ReconcileResult result = controller_.reconcile(ns, name);
      queue_.forget(*key);
      if (result.requeue_after) queue_.add_after(*key, *result.requeue_after);
    } catch (const std::exception& e) {
      // Conflicts (someone wrote first, or we read a stale cache) and AlreadyExists (a create
      // after a read that had not seen the object yet) are routine: the next reconcile reads
      // again. Everything else is worth a line.
      const auto* api = dynamic_cast<const kube::ApiError*>(&e);
      if (!api || !(api->conflict() || api->already_exists()))
        std::fprintf(stderr, "ts=%s level=error msg=\"reconcile failed; retrying\" job=%s err=%s\n",
                     kube::now_rfc3339().c_str(), key->c_str(), logfmt_quoted(e.what()).c_str());
      queue_.add_rate_limited(*key);
    }
    if (controller_metrics_)
      controller_metrics_->api_requests_per_reconcile.with({kControllerName})
          .observe(static_cast<double>(kube::CachingClient::api_requests_on_this_thread() -
                                       requests_before));
    queue_.done(*key);
  }
}

}  // namespace kt::controller

#include "operator/controller/inventory.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "api/error.h"
#include "operator/controller/children.h"
#include "operator/kube/informer.h"
#include "operator/kube/objects.h"

namespace kt::controller {

using kube::Object;

Requests& Requests::operator+=(const Requests& r) {
  milli_gpus += r.milli_gpus;
  milli_cpus += r.milli_cpus;
  memory_bytes += r.memory_bytes;
  return *this;
}

Requests& Requests::operator-=(const Requests& r) {
  milli_gpus -= r.milli_gpus;
  milli_cpus -= r.milli_cpus;
  memory_bytes -= r.memory_bytes;
  return *this;
}

namespace {

constexpr std::size_t kNpos = static_cast<std::size_t>(-1);

// FNV-1a 64, streamed.
struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void bytes(const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) {
      h ^= p[i];
      h *= 1099511628211ull;
    }
  }
  void text(const std::string& s) {
    bytes(s.data(), s.size());
    bytes("|", 1);
  }
  template <typename T>
  void value(T v) {
    bytes(&v, sizeof(v));
  }
};

// What no pod changes about a node: a change is a different cluster for the plan.
uint64_t node_identity(const api::Node& node) {
  Fnv f;
  f.text(node.name);
  f.text(node.gpu_product);
  f.value(node.gpu_count);
  f.value(node.schedulable);
  for (const auto& [k, v] : node.labels) {
    f.text(k);
    f.text(v);
  }
  return f.h;
}

std::string fingerprint(const api::Inventory& free, const std::vector<uint64_t>& identities) {
  Fnv f;
  for (std::size_t i = 0; i < free.nodes.size(); ++i) {
    const api::Node& node = free.nodes[i];
    f.value(identities[i]);
    f.value(node.free_gpus);
    f.value(node.cpu_cores);
    f.value(node.memory_bytes);
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(f.h));
  return buf;
}

int64_t floor_div(int64_t a, int64_t b) {
  return a / b - ((a % b != 0) && ((a < 0) != (b < 0)));
}

// `node`'s free figures: its allocatable ones less `used`. At least one core and 5 % of the
// memory stay (requests above allocatable are the scheduler's problem, not a negative node).
void deduct(api::Node& node, int64_t cpu_cores, double memory_bytes, const Requests& used) {
  const int64_t used_gpus = (std::max<int64_t>(0, used.milli_gpus) + 999) / 1000;
  node.free_gpus = std::max<int64_t>(0, node.gpu_count - used_gpus);
  node.cpu_cores = std::max<int64_t>(1, floor_div(cpu_cores * 1000 - used.milli_cpus, 1000));
  node.memory_bytes =
      std::max(memory_bytes - static_cast<double>(used.memory_bytes), memory_bytes * 0.05);
}

std::string job_key_of(const Object& pod) {
  const Object& meta = pod.at("metadata");
  const std::string job = meta.value("labels", Object::object()).value(kJobNameLabel, "");
  return job.empty() ? "" : meta.value("namespace", "") + "/" + job;
}

// A pod of a long-running workload: its controller (a ReplicaSet, DaemonSet, StatefulSet or
// ReplicationController) replaces it when it ends, and a static pod's kubelet does; its
// requests are never given back for a job to use. Other pods (a TrainingJob's, a Job's, bare
// ones) end, and free what they hold.
bool runs_indefinitely(const Object& pod) {
  const Object& meta = pod.at("metadata");
  if (meta.value("annotations", Object::object()).contains("kubernetes.io/config.mirror"))
    return true;
  const Object refs = meta.value("ownerReferences", Object::array());
  if (!refs.is_array()) return false;
  for (const Object& ref : refs) {
    if (!ref.is_object() || ref.value("controller", Object(false)) != Object(true)) continue;
    const std::string kind = ref.value("kind", Object("")).is_string() ? ref.value("kind", "") : "";
    return kind == "ReplicaSet" || kind == "DaemonSet" || kind == "StatefulSet" ||
           kind == "ReplicationController";
  }
  return false;
}

std::string string_at(const Object& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

void warn_rejected(const std::string& node, const std::string& why) {
  std::fprintf(stderr,
               "ts=%s level=warn msg=\"node left out of the inventory\" node=%s err=\"%s\"\n",
               kube::now_rfc3339().c_str(), node.c_str(), why.c_str());
}

}  // namespace

std::optional<PodClaim> pod_claim(const Object& pod) {
  const auto status = pod.find("status");
  const std::string phase =
      status != pod.end() && status->is_object() ? string_at(*status, "phase") : "";
  if (phase == "Succeeded" || phase == "Failed") return std::nullopt;
  const auto spec_it = pod.find("spec");
  if (spec_it == pod.end() || !spec_it->is_object()) return std::nullopt;
  const Object& spec = *spec_it;
  PodClaim claim;
  claim.node = string_at(spec, "nodeName");
  if (claim.node.empty()) {
    const auto selector = spec.find("nodeSelector");
    if (selector != spec.end() && selector->is_object())
      claim.node = string_at(*selector, "kubernetes.io/hostname");
  }
  if (claim.node.empty()) return std::nullopt;
  claim.requests.milli_gpus = std::llround(kube::pod_gpu_request(pod) * 1000);
  claim.requests.milli_cpus = std::llround(kube::pod_request(pod, "cpu") * 1000);
  claim.requests.memory_bytes = std::llround(kube::pod_request(pod, "memory"));
  return claim;
}

void with_listed_inventory(kube::Client& client, const std::string& ns, const std::string& job,
                           const std::function<void(const PlannerInventory&)>& fn) {
  api::Inventory allocatable;
  allocatable.name = "cluster";
  for (const Object& node : client.list(kube::kNodes, "", {}).items) {
    const std::string name = string_at(node.value("metadata", Object::object()), "name");
    try {
      allocatable.nodes.push_back(api::decode_kubectl_node(node, "nodes/" + name));
    } catch (const std::exception& e) {
      warn_rejected(name, e.what());  // one bad node is left out, not every plan failed
    }
  }
  std::map<std::string, Requests> used, held;
  const std::string own = ns + "/" + job;
  for (const auto& pod : client.list(kube::kPods, "", {}).items) {
    const std::string key = job_key_of(pod);
    if (key == own) continue;
    if (auto claim = pod_claim(pod)) {
      used[claim->node] += claim->requests;
      if (runs_indefinitely(pod)) held[claim->node] += claim->requests;
    }
  }
  api::Inventory free = allocatable;
  std::vector<uint64_t> identities;
  identities.reserve(free.nodes.size());
  for (auto& node : free.nodes) {
    identities.push_back(node_identity(node));
    deduct(node, node.cpu_cores, node.memory_bytes, used[node.name]);
  }
  const std::string print = fingerprint(free, identities);
  fn(PlannerInventory{free, print, [&] {
                        api::Inventory reclaimable = allocatable;
                        for (auto& node : reclaimable.nodes)
                          deduct(node, node.cpu_cores, node.memory_bytes, held[node.name]);
                        return reclaimable;
                      }});
}

InventoryTracker::InventoryTracker(kube::Cache& cache)
    : nodes_informer_([&]() -> kube::Informer& {
        kube::Informer* nodes = cache.informer(kube::kNodes);
        if (!nodes || !nodes->label_selector().empty())
          throw Error("InventoryTracker: the cache holds no informer on every Node");
        return *nodes;
      }()),
      pods_informer_([&]() -> kube::Informer& {
        kube::Informer* pods = cache.informer(kube::kPods);
        if (!pods || !pods->ns().empty() || !pods->label_selector().empty())
          throw Error(
              "InventoryTracker: the cache holds no informer on every pod of every "
              "namespace");
        return *pods;
      }()) {
  inventory_.name = "cluster";
  nodes_informer_.add_handler(
      [this](kube::WatchEventType type, const Object& node) { on_node(type, node); });
  pods_informer_.add_handler(
      [this](kube::WatchEventType type, const Object& pod) { on_pod(type, pod); });
}

bool InventoryTracker::has_synced() const {
  return nodes_informer_.has_synced() && pods_informer_.has_synced();
}

std::size_t InventoryTracker::rejected_nodes() const {
  std::lock_guard lock(mutex_);
  return rejected_.size();
}

std::size_t InventoryTracker::find_locked(const std::string& name) const {
  const auto& nodes = inventory_.nodes;
  const auto it =
      std::lower_bound(nodes.begin(), nodes.end(), name,
                       [](const api::Node& n, const std::string& v) { return n.name < v; });
  return it != nodes.end() && it->name == name ? static_cast<std::size_t>(it - nodes.begin())
                                               : kNpos;
}

void InventoryTracker::refresh_locked(std::size_t i) {
  api::Node& node = inventory_.nodes[i];
  const auto used = used_.find(node.name);
  deduct(node, allocatable_[i].cpu_cores, allocatable_[i].memory_bytes,
         used == used_.end() ? Requests{} : used->second);
}

void InventoryTracker::on_node(kube::WatchEventType type, const Object& object) {
  const std::string name = string_at(object.value("metadata", Object::object()), "name");
  std::lock_guard lock(mutex_);
  std::size_t i = find_locked(name);
  const auto erase = [&] {
    if (i == kNpos) return;
    inventory_.nodes.erase(inventory_.nodes.begin() + static_cast<std::ptrdiff_t>(i));
    allocatable_.erase(allocatable_.begin() + static_cast<std::ptrdiff_t>(i));
    i = kNpos;
  };
  if (type == kube::WatchEventType::Deleted) {
    erase();
    rejected_.erase(name);
    return;
  }
  api::Node node;
  try {
    node = api::decode_kubectl_node(object, "nodes/" + name);
  } catch (const std::exception& e) {
    // One bad node is left out, not every plan failed: said once per distinct problem.
    erase();
    auto [it, fresh] = rejected_.try_emplace(name, e.what());
    if (fresh || it->second != e.what()) {
      it->second = e.what();
      warn_rejected(name, e.what());
    }
    return;
  }
  rejected_.erase(name);
  const Allocatable alloc{node.cpu_cores, node.memory_bytes, node_identity(node)};
  if (i == kNpos) {
    const auto& nodes = inventory_.nodes;
    const auto at =
        std::lower_bound(nodes.begin(), nodes.end(), name,
                         [](const api::Node& n, const std::string& v) { return n.name < v; });
    i = static_cast<std::size_t>(at - nodes.begin());
    inventory_.nodes.insert(at, std::move(node));
    allocatable_.insert(allocatable_.begin() + static_cast<std::ptrdiff_t>(i), alloc);
  } else {
    inventory_.nodes[i] = std::move(node);
    allocatable_[i] = alloc;
  }
  refresh_locked(i);
}

void InventoryTracker::add_locked(const CountedPod& pod) {
  used_[pod.claim.node] += pod.claim.requests;
  if (pod.held) held_[pod.claim.node] += pod.claim.requests;
  if (const std::size_t i = find_locked(pod.claim.node); i != kNpos) refresh_locked(i);
}

void InventoryTracker::remove_locked(const CountedPod& pod) {
  if (const auto held = held_.find(pod.claim.node); pod.held && held != held_.end()) {
    held->second -= pod.claim.requests;
    const Requests& left = held->second;
    if (left.milli_gpus == 0 && left.milli_cpus == 0 && left.memory_bytes == 0) held_.erase(held);
  }
  const auto used = used_.find(pod.claim.node);
  if (used != used_.end()) {
    used->second -= pod.claim.requests;
    const Requests& left = used->second;
    if (left.milli_gpus == 0 && left.milli_cpus == 0 && left.memory_bytes == 0) used_.erase(used);
  }
  if (const std::size_t i = find_locked(pod.claim.node); i != kNpos) refresh_locked(i);
}

// Events arrive in resourceVersion order: once one at or past an expected pod's version has been
// seen, the informer's own count includes that pod (or its deletion).
void InventoryTracker::settle_expectations_locked() {
  const auto expired = std::chrono::steady_clock::now() - std::chrono::seconds(30);
  for (auto it = expected_.begin(); it != expected_.end();) {
    if (it->first <= seen_version_ || it->second.at < expired) {
      remove_locked(it->second.pod);
      it = expected_.erase(it);
    } else {
      ++it;
    }
  }
}

void InventoryTracker::reserve(const std::vector<Object>& pods) {
  std::lock_guard lock(mutex_);
  for (const Object& pod : pods) {
    std::optional<PodClaim> claim = pod_claim(pod);
    if (!claim) continue;
    const std::string key = kube::object_key(pod);
    if (const auto old = reserved_.find(key); old != reserved_.end()) {
      remove_locked(old->second);
      reserved_.erase(old);
    }
    CountedPod counted{job_key_of(pod), std::move(*claim), runs_indefinitely(pod)};
    add_locked(counted);
    reserved_.emplace(key, std::move(counted));
  }
}

void InventoryTracker::unreserve(const std::vector<std::string>& keys) {
  std::lock_guard lock(mutex_);
  for (const std::string& key : keys) unreserve_locked(key);
}

void InventoryTracker::unreserve_locked(const std::string& key) {
  if (const auto it = reserved_.find(key); it != reserved_.end()) {
    remove_locked(it->second);
    reserved_.erase(it);
  }
}

void InventoryTracker::expect(const Object& created) {
  const int64_t version = kube::resource_version_number(created);
  std::optional<PodClaim> claim = pod_claim(created);
  std::lock_guard lock(mutex_);
  if (!reserved_.empty()) unreserve_locked(kube::object_key(created));
  if (version < 0 || !claim) return;
  if (version <= seen_version_) return;  // the informer was first
  Expected expected{kube::object_key(created), CountedPod{job_key_of(created), std::move(*claim), runs_indefinitely(created)},
                    std::chrono::steady_clock::now()};
  add_locked(expected.pod);
  expected_.emplace(version, std::move(expected));
}

void InventoryTracker::on_pod(kube::WatchEventType type, const Object& pod) {
  const std::string key = kube::object_key(pod);
  std::optional<PodClaim> claim;
  if (type != kube::WatchEventType::Deleted) claim = pod_claim(pod);
  std::lock_guard lock(mutex_);
  seen_version_ = std::max(seen_version_, kube::resource_version_number(pod));
  if (const auto old = pods_.find(key); old != pods_.end()) {
    remove_locked(old->second);
    pods_.erase(old);
  }
  if (claim) {
    CountedPod counted{job_key_of(pod), std::move(*claim), runs_indefinitely(pod)};
    add_locked(counted);
    pods_.emplace(key, std::move(counted));
  }
  if (!expected_.empty()) settle_expectations_locked();
}

void InventoryTracker::with_inventory(const std::string& ns, const std::string& job,
                                      const std::function<void(const PlannerInventory&)>& fn) {
  std::lock_guard lock(mutex_);
  if (!expected_.empty()) settle_expectations_locked();
  // The job's own pods are given back for the call, and taken again after it (also when `fn`
  // throws).
  const std::string own = ns + "/" + job;
  std::vector<const CountedPod*> given_back;
  for (const auto& [key, pod] : pods_)
    if (pod.job_key == own) given_back.push_back(&pod);
  for (const auto& [version, expected] : expected_)
    if (expected.pod.job_key == own) given_back.push_back(&expected.pod);
  for (const auto& [key, reserved] : reserved_)
    if (reserved.job_key == own) given_back.push_back(&reserved);
  for (const CountedPod* pod : given_back) remove_locked(*pod);
  struct TakeAgain {
    InventoryTracker& self;
    const std::vector<const CountedPod*>& pods;
    ~TakeAgain() {
      for (const CountedPod* pod : pods) self.add_locked(*pod);
    }
  } take_again{*this, given_back};

  std::vector<uint64_t> identities;
  identities.reserve(allocatable_.size());
  for (const Allocatable& a : allocatable_) identities.push_back(a.identity);
  const std::string print = fingerprint(inventory_, identities);
  fn(PlannerInventory{inventory_, print, [&] {
                        api::Inventory all = inventory_;
                        for (std::size_t i = 0; i < all.nodes.size(); ++i) {
                          const auto held = held_.find(all.nodes[i].name);
                          deduct(all.nodes[i], allocatable_[i].cpu_cores,
                                 allocatable_[i].memory_bytes,
                                 held == held_.end() ? Requests{} : held->second);
                        }
                        return all;
                      }});
}

}  // namespace kt::controller

#include "local/scheduler.h"

#include <algorithm>
#include <cstdio>

#include "api/quantity.h"
#include "operator/kube/objects.h"
#include "local/simulated_nodes.h"

namespace kt::local {

using kube::ApiError;
using kube::Object;
using kube::WatchEventType;

namespace {

double quantity(const Object& map, const char* key) {
  if (!map.is_object() || !map.contains(key)) return 0;
  const Object& v = map[key];
  if (v.is_number()) return v.get<double>();
  if (!v.is_string()) return 0;
  return api::parse_quantity(v.get<std::string>()).value_or(0);
}

std::string phase_of(const Object& pod) {
  return pod.contains("status") && pod["status"].is_object()
             ? pod["status"].value("phase", "Pending")
             : "Pending";
}

// One NodeSelectorRequirement against a value (nullptr: the key is absent).
bool requirement_holds(const Object& requirement, const std::string* value) {
  const std::string op = requirement.value("operator", "");
  const Object values = requirement.value("values", Object::array());
  const auto listed = [&] {
    if (!value) return false;
    for (const auto& v : values)
      if (v.is_string() && v.get<std::string>() == *value) return true;
    return false;
  };
  if (op == "In") return listed();
  if (op == "NotIn") return !listed();
  if (op == "Exists") return value != nullptr;
  if (op == "DoesNotExist") return value == nullptr;
  if (op == "Gt" || op == "Lt") {
    if (!value || values.size() != 1 || !values[0].is_string()) return false;
    try {
      const long long have = std::stoll(*value), bound = std::stoll(values[0].get<std::string>());
      return op == "Gt" ? have > bound : have < bound;
    } catch (const std::exception&) {
      return false;
    }
  }
  return false;  // an unknown operator matches nothing, as the API server would refuse it
}

bool term_matches(const Object& term, const SchedulableNode& node) {
  bool any = false;
  for (const auto& r : term.value("matchExpressions", Object::array())) {
    any = true;
    const auto it = node.labels.find(r.value("key", ""));
    if (!requirement_holds(r, it == node.labels.end() ? nullptr : &it->second)) return false;
  }
  for (const auto& r : term.value("matchFields", Object::array())) {
    any = true;
    if (r.value("key", "") != "metadata.name" || !requirement_holds(r, &node.name)) return false;
  }
  return any;  // an empty term matches no node (the API's NodeSelectorTerm semantics)
}

bool selection_matches(const PodNeeds& pod, const SchedulableNode& node) {
  for (const auto& [key, value] : pod.node_selector) {
    const auto it = node.labels.find(key);
    if (it == node.labels.end() || it->second != value) return false;
  }
  if (!pod.node_selector_terms.is_array()) return true;
  for (const auto& term : pod.node_selector_terms)
    if (term_matches(term, node)) return true;
  return false;
}

Object condition(const std::string& type, bool value, const std::string& reason,
                 const std::string& message) {
  Object c = {{"type", type},
              {"status", value ? "True" : "False"},
              {"lastTransitionTime", kube::now_rfc3339()}};
  if (!reason.empty()) c["reason"] = reason;
  if (!message.empty()) c["message"] = message;
  return c;
}

}  // namespace

SchedulableNode schedulable_node(const Object& node) {
  SchedulableNode out;
  const Object& meta = node["metadata"];
  out.name = meta.value("name", "");
  const Object labels = meta.value("labels", Object::object());
  for (const auto& [k, v] : labels.items())
    if (v.is_string()) out.labels[k] = v.get<std::string>();
  const Object spec = node.value("spec", Object::object());
  out.unschedulable = spec.is_object() && spec.value("unschedulable", false);
  const Object status = node.value("status", Object::object());
  if (status.is_object()) {
    const Object alloc = status.value("allocatable", Object::object());
    out.allocatable = {quantity(alloc, "nvidia.com/gpu"), quantity(alloc, "cpu"),
                       quantity(alloc, "memory"), quantity(alloc, "pods")};
    for (const auto& c : status.value("conditions", Object::array()))
      if (c.value("type", "") == "Ready") out.ready = c.value("status", "") == "True";
  }
  return out;
}

PodNeeds pod_needs(const Object& pod) {
  PodNeeds out;
  out.requests = {kube::pod_request(pod, "nvidia.com/gpu"), kube::pod_request(pod, "cpu"),
                  kube::pod_request(pod, "memory"), 1};
  const Object spec = pod.value("spec", Object::object());
  const Object selector = spec.value("nodeSelector", Object::object());
  for (const auto& [k, v] : selector.items())
    if (v.is_string()) out.node_selector[k] = v.get<std::string>();
  const Object affinity = spec.value("affinity", Object::object());
  if (affinity.is_object() && affinity.contains("nodeAffinity")) {
    const Object required = affinity["nodeAffinity"].value(
        "requiredDuringSchedulingIgnoredDuringExecution", Object::object());
    if (required.is_object() && required.contains("nodeSelectorTerms"))
      out.node_selector_terms = required["nodeSelectorTerms"];
  }
  return out;
}

std::vector<std::string> unfit_reasons(const PodNeeds& pod, const SchedulableNode& node,
                                       const Resources& requested) {
  // kube-scheduler runs the filters in this order and stops at the first that fails; only
  // NodeResourcesFit reports every resource that is short.
  if (!node.ready) return {"node(s) had untolerated taint {node.kubernetes.io/not-ready: }"};
  if (node.unschedulable) return {"node(s) were unschedulable"};
  if (!selection_matches(pod, node)) return {"node(s) didn't match Pod's node affinity/selector"};
  std::vector<std::string> reasons;
  const auto short_of = [](double want, double used, double allocatable) {
    return want > 0 && used + want > allocatable * (1 + 1e-9) + 1e-9;
  };
  if (short_of(pod.requests.pods, requested.pods, node.allocatable.pods))
    reasons.push_back("Too many pods");
  if (short_of(pod.requests.cpu_cores, requested.cpu_cores, node.allocatable.cpu_cores))
    reasons.push_back("Insufficient cpu");
  if (short_of(pod.requests.memory_bytes, requested.memory_bytes, node.allocatable.memory_bytes))
    reasons.push_back("Insufficient memory");
  if (short_of(pod.requests.gpus, requested.gpus, node.allocatable.gpus))
    reasons.push_back("Insufficient nvidia.com/gpu");
  return reasons;
}

std::string unschedulable_message(size_t node_count,
                                  const std::map<std::string, int>& nodes_by_reason) {
  std::vector<std::string> parts;
  for (const auto& [reason, nodes] : nodes_by_reason)
    parts.push_back(std::to_string(nodes) + " " + reason);
  std::sort(parts.begin(), parts.end());
  std::string out = "0/" + std::to_string(node_count) + " nodes are available";
  for (size_t i = 0; i < parts.size(); ++i) out += (i == 0 ? ": " : ", ") + parts[i];
  return out + ".";
}

Scheduler::Scheduler(kube::Client& client, SchedulerOptions options)
    : client_(client), options_(options) {
  node_informer_ = std::make_unique<kube::Informer>(client_, kube::kNodes, "", "");
  pod_informer_ = std::make_unique<kube::Informer>(client_, kube::kPods, "", "");
  node_informer_->add_handler(
      [this](WatchEventType type, const Object& node) { on_node(type, node); });
  pod_informer_->add_handler([this](WatchEventType type, const Object& pod) { on_pod(type, pod); });
  claim_informer_ =
      std::make_unique<kube::Informer>(client_, kube::kPersistentVolumeClaims, "", "");
  claim_informer_->add_handler([this](WatchEventType, const Object&) {
    std::lock_guard lock(mutex_);
    changed_ = true;
  });
}

Scheduler::~Scheduler() {
  stop();
}

void Scheduler::start() {
  stopping_ = false;
  node_informer_->start();
  pod_informer_->start();
  claim_informer_->start();
  thread_ = std::thread([this] {
    while (!stopping_) {
      if (has_synced()) {
        try {
          schedule_pending();
        } catch (const std::exception& e) {
          std::fprintf(stderr, "kubetrain: scheduler: %s\n", e.what());
        }
      }
      std::this_thread::sleep_for(options_.interval);
    }
  });
}

void Scheduler::stop() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  node_informer_->stop();
  pod_informer_->stop();
  claim_informer_->stop();
}

bool Scheduler::has_synced() const {
  return node_informer_->has_synced() && pod_informer_->has_synced() &&
         claim_informer_->has_synced();
}

void Scheduler::on_node(WatchEventType type, const Object& node) {
  std::lock_guard lock(mutex_);
  SchedulableNode n = schedulable_node(node);
  // Real nodes first, then simulated ones: a pod that fits this machine (the chart's operator,
  // a CPU job) runs as a process rather than on a node that runs nothing.
  nodes_.erase("0/" + n.name);
  nodes_.erase("1/" + n.name);
  const bool simulated = n.labels.count(kSimulatedNodeLabel) > 0;
  if (type != WatchEventType::Deleted) nodes_[(simulated ? "1/" : "0/") + n.name] = std::move(n);
  changed_ = true;
}

void Scheduler::count(const PodState& pod, double sign) {
  if (pod.node.empty() || !pod.active) return;
  Resources& r = requested_[pod.node];
  r.gpus += sign * pod.needs.requests.gpus;
  r.cpu_cores += sign * pod.needs.requests.cpu_cores;
  r.memory_bytes += sign * pod.needs.requests.memory_bytes;
  r.pods += sign * pod.needs.requests.pods;
}

void Scheduler::on_pod(WatchEventType type, const Object& pod) {
  std::lock_guard lock(mutex_);
  const std::string key = kube::object_key(pod);
  const auto old = pods_.find(key);
  std::string reported, bound_to;
  if (old != pods_.end()) {
    bound_to = old->second.node;
    count(old->second, -1);
    reported = old->second.reported;
    pods_.erase(old);
  }
  changed_ = true;
  if (type == WatchEventType::Deleted) return;
  PodState state;
  state.ns = pod["metadata"].value("namespace", "");
  state.name = pod["metadata"].value("name", "");
  const Object spec = pod.value("spec", Object::object());
  state.node = spec.value("nodeName", "");
  // A binding is never undone: an event older than the binding this scheduler just made (its
  // own Unschedulable patch) must not make the pod look pending again.
  if (state.node.empty()) state.node = bound_to;
  const std::string phase = phase_of(pod);
  state.active = phase != "Succeeded" && phase != "Failed";
  state.needs = pod_needs(pod);
  for (const auto& v : spec.value("volumes", Object::array()))
    if (v.contains("persistentVolumeClaim"))
      state.claims.push_back(v["persistentVolumeClaim"].value("claimName", ""));
  if (pod.contains("status") && pod["status"].is_object())
    for (const auto& c : pod["status"].value("conditions", Object::array()))
      if (c.value("type", "") == "PodScheduled" && c.value("status", "") == "False")
        reported = c.value("message", "");
  state.reported = reported;
  state.gated = spec.contains("schedulingGates") && spec["schedulingGates"].is_array() &&
                !spec["schedulingGates"].empty();
  const Object& meta = pod["metadata"];
  const Object labels = meta.value("labels", Object::object());
  const Object annotations = meta.value("annotations", Object::object());
  const auto text = [](const Object& map, const char* key) {
    return map.is_object() && map.contains(key) && map[key].is_string() ? map[key].get<std::string>()
                                                                       : std::string();
  };
  if (const std::string g = text(labels, kube::kCoschedulingPodGroupLabel); !g.empty()) {
    state.group_resource = &kube::kCoschedulingPodGroups;
    state.group_name = g;
  } else if (const std::string v = text(annotations, kube::kVolcanoGroupAnnotation); !v.empty()) {
    state.group_resource = &kube::kVolcanoPodGroups;
    state.group_name = v;
  } else if (const std::string k = text(labels, kube::kKueuePodGroupLabel); !k.empty()) {
    state.group_name = k;
    try {
      state.min_member =
          std::stoll(text(annotations, kube::kKueuePodGroupTotalCountAnnotation));
    } catch (const std::exception&) {
      state.min_member = 0;  // no count: the group is never complete (Kueue rejects such pods)
    }
  }
  if (!state.group_name.empty())
    state.group = (state.group_resource ? state.group_resource->group : std::string("kueue")) +
                  "/" + state.ns + "/" + state.group_name;
  count(state, +1);
  pods_[key] = std::move(state);
}

std::string Scheduler::unbound_claim(const PodState& pod) {
  for (const auto& claim : pod.claims) {
    try {
      const Object pvc = client_.get(kube::kPersistentVolumeClaims, pod.ns, claim);
      if (pvc.value("status", Object::object()).value("phase", "") != "Bound")
        return "pod has unbound immediate PersistentVolumeClaims";
    } catch (const ApiError& e) {
      if (!e.not_found()) throw;
      return "persistentvolumeclaim \"" + claim + "\" not found";
    }
  }
  return "";
}

void Scheduler::report_unschedulable(PodState& pod, const std::string& message,
                                     const std::string& reason) {
  if (pod.reported == message) return;  // said once; it stays Pending until something changes
  try {
    client_.merge_patch(
        kube::kPods, pod.ns, pod.name,
        {{"status",
          {{"phase", "Pending"},
           {"conditions", Object::array({condition("PodScheduled", false, reason, message)})}}}},
        true);
    pod.reported = message;
  } catch (const ApiError& e) {
    if (!e.not_found()) throw;
  }
}

const SchedulableNode* Scheduler::first_fit(const PodState& pod,
                                            std::map<std::string, int>& nodes_by_reason) {
  static const Resources kNothing;
  for (const auto& [order, node] : nodes_) {
    const auto used = requested_.find(node.name);
    const std::vector<std::string> reasons =
        unfit_reasons(pod.needs, node, used == requested_.end() ? kNothing : used->second);
    if (reasons.empty()) return &node;
    for (const auto& r : reasons) ++nodes_by_reason[r];
  }
  return nullptr;
}

bool Scheduler::bind(PodState& pod, const SchedulableNode& node) {
  // The binding: kube-scheduler's write of spec.nodeName (through pods/binding there).
  try {
    client_.merge_patch(kube::kPods, pod.ns, pod.name, {{"spec", {{"nodeName", node.name}}}});
  } catch (const ApiError& e) {
    if (!e.not_found()) throw;
    return false;
  }
  pod.node = node.name;
  count(pod, +1);  // assumed at once: the next pod of this pass sees the room it took
  return true;
}

void Scheduler::schedule_gang(const std::vector<PodState*>& pending) {
  PodState& first = *pending.front();
  const std::string group = first.group_name;
  const std::string nodes_available = "0/" + std::to_string(nodes_.size()) + " nodes are available";
  int64_t min_member = first.min_member;
  if (first.group_resource) {
    try {
      const Object pg = client_.get(*first.group_resource, first.ns, group);
      min_member = pg.value("spec", Object::object()).value("minMember", int64_t{1});
    } catch (const ApiError& e) {
      if (!e.not_found()) throw;
      for (PodState* pod : pending)
        report_unschedulable(*pod, nodes_available + ": PodGroup " + first.ns + "/" + group + " (" +
                                       first.group_resource->api_version() + ") not found.");
      return;
    }
  }
  int64_t bound = 0;
  for (const auto& [key, pod] : pods_)
    if (pod.group == first.group && pod.active && !pod.node.empty()) ++bound;
  const int64_t members = bound + static_cast<int64_t>(pending.size());
  if (members < min_member) {
    for (PodState* pod : pending)
      report_unschedulable(*pod, nodes_available + ": pod group " + first.ns + "/" + group +
                                     " has " + std::to_string(members) + " of its minMember " +
                                     std::to_string(min_member) + " pods.");
    return;
  }
  // Place every pending member in turn, each assumed as it is placed; if too few fit, undo
  // them all: a gang never half-starts.
  std::vector<std::pair<PodState*, const SchedulableNode*>> placed;
  std::map<std::string, int> nodes_by_reason;
  for (PodState* pod : pending) {
    std::map<std::string, int> reasons;
    const SchedulableNode* node = first_fit(*pod, reasons);
    if (!node) {
      if (nodes_by_reason.empty()) nodes_by_reason = reasons;
      continue;
    }
    pod->node = node->name;
    count(*pod, +1);
    placed.emplace_back(pod, node);
  }
  for (auto& [pod, node] : placed) {
    count(*pod, -1);
    pod->node.clear();
  }
  if (bound + static_cast<int64_t>(placed.size()) < min_member) {
    const std::string why =
        unschedulable_message(nodes_.size(), nodes_by_reason).substr(nodes_available.size());
    for (PodState* pod : pending)
      report_unschedulable(*pod, nodes_available + (why == "." ? "" : why.substr(0, why.size() - 1)) +
                                     "; pod group " + first.ns + "/" + group + ": " +
                                     std::to_string(bound + static_cast<int64_t>(placed.size())) +
                                     " of its minMember " + std::to_string(min_member) +
                                     " pods fit, so none is bound.");
    return;
  }
  for (auto& [pod, node] : placed) bind(*pod, *node);
}

void Scheduler::schedule_pending() {
  std::lock_guard lock(mutex_);
  if (!changed_) return;
  changed_ = false;
  std::map<std::string, std::vector<PodState*>> gangs;  // pending members by group
  for (auto& [key, pod] : pods_) {
    if (!pod.node.empty() || !pod.active) continue;
    if (pod.gated) {
      report_unschedulable(pod, "Scheduling is blocked due to non-empty scheduling gates",
                           "SchedulingGated");
      continue;
    }
    if (const std::string why = unbound_claim(pod); !why.empty()) {
      report_unschedulable(
          pod, "0/" + std::to_string(nodes_.size()) + " nodes are available: " + why + ".");
      continue;
    }
    if (!pod.group.empty()) {
      gangs[pod.group].push_back(&pod);
      continue;
    }
    std::map<std::string, int> nodes_by_reason;
    const SchedulableNode* chosen = first_fit(pod, nodes_by_reason);
    if (!chosen) {
      report_unschedulable(pod, unschedulable_message(nodes_.size(), nodes_by_reason));
      continue;
    }
    bind(pod, *chosen);
  }
  for (const auto& [group, pending] : gangs) schedule_gang(pending);
}

}  // namespace kt::local

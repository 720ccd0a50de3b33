#include "local/deployment_controller.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <tuple>
#include <vector>

#include "operator/kube/objects.h"
#include "local/builtin_resources.h"
#include "operator/kube/selectors.h"

namespace kt::local {

using kube::ApiError;
using kube::matches_label_selector;
using kube::now_rfc3339;
using kube::Object;
using kube::Resource;

namespace {

constexpr char kHashLabel[] = "pod-template-hash";
constexpr char kRevisionAnnotation[] = "deployment.kubernetes.io/revision";
// The kubelet resets a container's restart backoff once it ran this long without exiting.
constexpr auto kBackoffReset = std::chrono::minutes(10);

// ---- reading objects ----

std::string meta_string(const Object& obj, const char* key) {
  return obj["metadata"].value(key, "");
}

int64_t generation_of(const Object& obj) {
  return obj["metadata"].value("generation", int64_t{1});
}

const Object& spec_of(const Object& obj) {
  static const Object kEmpty = Object::object();
  return obj.contains("spec") && obj["spec"].is_object() ? obj["spec"] : kEmpty;
}

int64_t spec_replicas(const Object& obj) {
  return spec_of(obj).value("replicas", int64_t{1});
}

// The ownerReference with controller: true, or nullptr.
const Object* controller_ref(const Object& obj) {
  const Object& meta = obj["metadata"];
  if (!meta.contains("ownerReferences") || !meta["ownerReferences"].is_array()) return nullptr;
  for (const auto& ref : meta["ownerReferences"])
    if (ref.value("controller", false)) return &ref;
  return nullptr;
}

std::string controller_uid(const Object& obj) {
  const Object* ref = controller_ref(obj);
  return ref ? ref->value("uid", "") : "";
}

// What a dependent's ownerReferences say of its controller `owner` (a `resource` object).
Object controller_reference(const Resource& resource, const Object& owner) {
  return {{"apiVersion", resource.api_version()},
          {"kind", resource.kind},
          {"name", meta_string(owner, "name")},
          {"uid", meta_string(owner, "uid")},
          {"controller", true},
          {"blockOwnerDeletion", true}};
}

std::string phase_of(const Object& pod) {
  return pod.contains("status") && pod["status"].is_object()
             ? pod["status"].value("phase", "Pending")
             : "Pending";
}

bool is_terminated(const Object& pod) {
  const std::string phase = phase_of(pod);
  return phase == "Succeeded" || phase == "Failed";
}

// The kubelet's IsPodReady: the Ready condition is True.
bool is_ready(const Object& pod) {
  if (is_terminated(pod) || !pod.contains("status") || !pod["status"].is_object()) return false;
  for (const auto& c : pod["status"].value("conditions", Object::array()))
    if (c.value("type", "") == "Ready") return c.value("status", "") == "True";
  return false;
}

int64_t revision_of(const Object& obj) {
  const Object annotations = obj["metadata"].value("annotations", Object::object());
  try {
    return std::stoll(annotations.value(kRevisionAnnotation, "0"));
  } catch (const std::exception&) {
    return 0;
  }
}

// A metav1.LabelSelector as a selector string; nullopt for a null selector (which selects
// nothing), "" for an empty one (everything).
std::optional<std::string> selector_string(const Object& selector) {
  if (!selector.is_object()) return std::nullopt;
  std::vector<std::string> requirements;
  const Object match_labels = selector.value("matchLabels", Object::object());
  for (const auto& [key, value] : match_labels.items())
    requirements.push_back(key + "=" + value.get<std::string>());
  for (const auto& e : selector.value("matchExpressions", Object::array())) {
    const std::string key = e.value("key", ""), op = e.value("operator", "");
    std::string values;
    for (const auto& v : e.value("values", Object::array()))
      values += (values.empty() ? "" : ",") + v.get<std::string>();
    if (op == "In" || op == "NotIn")
      requirements.push_back(key + (op == "In" ? " in (" : " notin (") + values + ")");
    else if (op == "Exists")
      requirements.push_back(key);
    else if (op == "DoesNotExist")
      requirements.push_back("!" + key);
    else
      throw kt::Error("selector: unknown matchExpressions operator \"" + op + "\"");
  }
  std::string joined;
  for (const auto& r : requirements) joined += (joined.empty() ? "" : ",") + r;
  return joined;
}

// intstr.GetScaledValueFromIntOrPercent: an integer, or "N%" of `total` rounded up or down.
int64_t scaled_value(const Object& value, int64_t total, bool round_up) {
  if (value.is_number_integer()) return value.get<int64_t>();
  if (!value.is_string()) return 0;
  const std::string text = value.get<std::string>();
  if (text.empty() || text.back() != '%')
    throw kt::Error("invalid value \"" + text + "\": an integer or a percentage is required");
  const double scaled =
      std::stod(text.substr(0, text.size() - 1)) * static_cast<double>(total) / 100;
  return static_cast<int64_t>(round_up ? std::ceil(scaled) : std::floor(scaled));
}

// ---- the deployment controller's arithmetic (pkg/controller/deployment/util) ----

bool is_recreate(const Object& deployment) {
  return spec_of(deployment).value("strategy", Object::object()).value("type", "") == "Recreate";
}

struct Fenceposts {
  int64_t max_surge = 0;
  int64_t max_unavailable = 0;
};

// ResolveFenceposts: maxSurge rounds up, maxUnavailable down, and both 0 means 1 unavailable.
Fenceposts rolling_fenceposts(const Object& deployment, int64_t replicas) {
  const Object rolling = spec_of(deployment)
                             .value("strategy", Object::object())
                             .value("rollingUpdate", Object::object());
  Fenceposts f;
  f.max_surge = scaled_value(rolling.value("maxSurge", Object("25%")), replicas, true);
  f.max_unavailable = scaled_value(rolling.value("maxUnavailable", Object("25%")), replicas, false);
  if (f.max_surge == 0 && f.max_unavailable == 0) f.max_unavailable = 1;
  return f;
}

// MaxUnavailable: what the Available condition and the rollout allow to be unavailable.
int64_t max_unavailable(const Object& deployment, int64_t replicas) {
  if (is_recreate(deployment) || replicas == 0) return 0;
  return std::min(rolling_fenceposts(deployment, replicas).max_unavailable, replicas);
}

// ---- status ----

// Writes `status` through the status subresource unless it is what `obj` has.
void write_status(kube::Client& client, const Resource& resource, Object& obj, Object status) {
  if (obj.contains("status") && obj["status"] == status) return;
  obj["status"] = std::move(status);
  obj = client.update_status(resource, meta_string(obj, "namespace"), obj);
}

// A count the API omits when zero (`json:",omitempty"`).
void put_count(Object& status, const char* key, int64_t value) {
  if (value == 0)
    status.erase(key);
  else
    status[key] = value;
}

const Object* find_condition(const Object& conditions, const std::string& type) {
  for (const auto& c : conditions)
    if (c.value("type", "") == type) return &c;
  return nullptr;
}

void remove_condition(Object& conditions, const std::string& type) {
  Object kept = Object::array();
  for (const auto& c : conditions)
    if (c.value("type", "") != type) kept.push_back(c);
  conditions = std::move(kept);
}

Object deployment_condition(const std::string& type, bool value, const std::string& reason,
                            const std::string& message) {
  const std::string now = now_rfc3339();
  return {{"type", type},          {"status", value ? "True" : "False"},
          {"lastUpdateTime", now}, {"lastTransitionTime", now},
          {"reason", reason},      {"message", message}};
}

// SetDeploymentCondition: nothing changes when status and reason are the same; a condition whose
// status stays keeps its lastTransitionTime; the new one goes last.
void set_deployment_condition(Object& conditions, Object condition) {
  const std::string type = condition["type"];
  if (const Object* current = find_condition(conditions, type)) {
    if ((*current)["status"] == condition["status"] && (*current)["reason"] == condition["reason"])
      return;
    if ((*current)["status"] == condition["status"])
      condition["lastTransitionTime"] = (*current)["lastTransitionTime"];
  }
  remove_condition(conditions, type);
  conditions.push_back(std::move(condition));
}

// The scale-down order of the ReplicaSet controller (controller.ActivePods, simplified): the
// first to go is unscheduled, then Pending before Running, then not Ready, then the newest.
bool deleted_before(const Object& a, const Object& b) {
  auto rank = [](const Object& pod) {
    const std::string phase = phase_of(pod);
    return std::make_tuple(!spec_of(pod).value("nodeName", "").empty(),
                           phase == "Pending"   ? 0
                           : phase == "Running" ? 2
                                                : 1,
                           is_ready(pod));
  };
  if (rank(a) != rank(b)) return rank(a) < rank(b);
  const std::string ta = meta_string(a, "creationTimestamp"),
                    tb = meta_string(b, "creationTimestamp");
  if (ta != tb) return ta > tb;
  return meta_string(a, "name") > meta_string(b, "name");
}

bool created_before(const Object& a, const Object& b) {
  const std::string ta = meta_string(a, "creationTimestamp"),
                    tb = meta_string(b, "creationTimestamp");
  if (ta != tb) return ta < tb;
  return meta_string(a, "name") < meta_string(b, "name");
}

}  // namespace

std::string pod_template_hash(const Object& pod_template) {
  uint32_t hash = 2166136261u;  // FNV-1a, 32 bit
  for (const unsigned char c : pod_template.dump()) {
    hash ^= c;
    hash *= 16777619u;
  }
  // rand.SafeEncodeString: each byte picks from the alphabet without vowels or confusables.
  static const char kAlphabet[] = "bcdfghjklmnpqrstvwxz2456789";
  std::string spelled;
  for (const char digit : std::to_string(hash))
    spelled += kAlphabet[static_cast<unsigned char>(digit) % (sizeof(kAlphabet) - 1)];
  return spelled;
}

// One pass's view of the objects, kept current with this pass's own writes.
struct DeploymentController::Pass {
  struct Rollout {
    bool synced = false;          // sync_deployment finished
    std::string new_replica_set;  // the ReplicaSet of the current template ("" none yet)
    bool created_new = false;     // this pass created it
  };
  struct PodCounts {
    int64_t active = 0;  // neither Succeeded nor Failed
    int64_t ready = 0;
  };

  std::vector<Object> deployments;
  std::vector<Object> replica_sets;
  std::map<std::string, Object> pods;       // by uid
  std::map<std::string, Rollout> rollouts;  // by Deployment uid

  PodCounts counts(const Object& replica_set) const {
    const std::string ns = meta_string(replica_set, "namespace");
    const std::string uid = meta_string(replica_set, "uid");
    PodCounts c;
    for (const auto& [_, pod] : pods) {
      if (meta_string(pod, "namespace") != ns || controller_uid(pod) != uid) continue;
      if (!is_terminated(pod)) ++c.active;
      if (is_ready(pod)) ++c.ready;
    }
    return c;
  }

  // The ReplicaSets `deployment` controls, as indexes into replica_sets.
  std::vector<size_t> owned_by(const Object& deployment) const {
    const std::string ns = meta_string(deployment, "namespace");
    const std::string uid = meta_string(deployment, "uid");
    std::vector<size_t> owned;
    for (size_t i = 0; i < replica_sets.size(); ++i)
      if (meta_string(replica_sets[i], "namespace") == ns && controller_uid(replica_sets[i]) == uid)
        owned.push_back(i);
    return owned;
  }
};

DeploymentController::DeploymentController(kube::Client& client,
                                           DeploymentControllerOptions options)
    : client_(client), options_(std::move(options)) {}

DeploymentController::~DeploymentController() {
  stop();
}

std::chrono::steady_clock::time_point DeploymentController::now() const {
  return options_.clock ? options_.clock() : std::chrono::steady_clock::now();
}

void DeploymentController::start() {
  {
    std::lock_guard<std::mutex> lock(stop_mutex_);
    stopping_ = false;
  }
  thread_ = std::thread([this] {
    std::string last_error;  // a failing list is reported once, not every pass
    std::unique_lock<std::mutex> lock(stop_mutex_);
    while (!stopping_) {
      lock.unlock();
      try {
        sync();
        last_error.clear();
      } catch (const std::exception& e) {
        if (e.what() != last_error)
          std::fprintf(stderr, "kubetrain: deployment controller: %s\n", e.what());
        last_error = e.what();
      }
      lock.lock();
      stop_cv_.wait_for(lock, options_.poll_interval, [this] { return stopping_; });
    }
  });
}

void DeploymentController::stop() {
  {
    std::lock_guard<std::mutex> lock(stop_mutex_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void DeploymentController::sync() {
  std::lock_guard<std::mutex> sync_lock(sync_mutex_);
  Pass pass;
  pass.deployments = client_.list(kDeployments, "", {}).items;
  pass.replica_sets = client_.list(kReplicaSets, "", {}).items;
  std::vector<Object> budgets = client_.list(kPodDisruptionBudgets, "", {}).items;
  // Only ReplicaSets and budgets look at pods: without them (a cluster of TrainingJobs alone)
  // the pods, thousands at scale, are not listed five times a second.
  if (!pass.deployments.empty() || !pass.replica_sets.empty() || !budgets.empty()) {
    for (auto& pod : client_.list(kube::kPods, "", {}).items) {
      const std::string uid = meta_string(pod, "uid");
      pass.pods[uid] = std::move(pod);
    }
  }

  // One object's failure is reported (once while it repeats) and retried on the next pass.
  std::map<std::string, std::string> errors;
  auto each = [&](const char* kind, std::vector<Object>& objects, auto&& sync_one) {
    for (auto& obj : objects) {
      const std::string key =
          std::string(kind) + " " + meta_string(obj, "namespace") + "/" + meta_string(obj, "name");
      try {
        sync_one(obj);
      } catch (const ApiError& e) {
        if (!e.conflict() && !e.not_found()) errors[key] = e.what();
      } catch (const std::exception& e) {
        errors[key] = e.what();
      }
    }
  };
  each("deployment", pass.deployments, [&](Object& d) { sync_deployment(pass, d); });
  each("replicaset", pass.replica_sets, [&](Object& rs) { sync_replica_set(pass, rs); });
  each("deployment", pass.deployments, [&](Object& d) { sync_deployment_status(pass, d); });
  each("poddisruptionbudget", budgets, [&](Object& b) { sync_disruption_budget(pass, b); });

  for (const auto& [key, message] : errors)
    if (last_errors_[key] != message)
      std::fprintf(stderr, "kubetrain: deployment controller: %s: %s\n", key.c_str(),
                   message.c_str());
  last_errors_ = std::move(errors);
  std::set<std::string> live;
  for (const auto& rs : pass.replica_sets) live.insert(meta_string(rs, "uid"));
  std::erase_if(backoff_, [&](const auto& entry) { return !live.count(entry.first); });
}

// The deployment controller's sync (pkg/controller/deployment: rolling.go, recreate.go,
// sync.go): find or create the ReplicaSet of the current template and scale the ReplicaSets
// one step towards it.
void DeploymentController::sync_deployment(Pass& pass, Object& deployment) {
  const std::string ns = meta_string(deployment, "namespace");
  const std::string name = meta_string(deployment, "name");
  const Object spec = spec_of(deployment);
  const int64_t replicas = spec.value("replicas", int64_t{1});
  const Object pod_template = spec.value("template", Object::object());
  const std::string hash = pod_template_hash(pod_template);
  Pass::Rollout& rollout = pass.rollouts[meta_string(deployment, "uid")];

  std::optional<size_t> fresh;  // the ReplicaSet of the current template
  std::vector<size_t> old;
  int64_t max_old_revision = 0;
  for (size_t i : pass.owned_by(deployment)) {
    const Object labels = pass.replica_sets[i]["metadata"].value("labels", Object::object());
    if (labels.value(kHashLabel, "") == hash) {
      fresh = i;
    } else {
      old.push_back(i);
      max_old_revision = std::max(max_old_revision, revision_of(pass.replica_sets[i]));
    }
  }
  // Oldest revision first: the first to scale down and to be collected.
  std::sort(old.begin(), old.end(), [&](size_t a, size_t b) {
    const Object &x = pass.replica_sets[a], &y = pass.replica_sets[b];
    return revision_of(x) != revision_of(y) ? revision_of(x) < revision_of(y)
                                            : created_before(x, y);
  });

  auto update_replica_set = [&](size_t i) {
    pass.replica_sets[i] = client_.update(kReplicaSets, ns, pass.replica_sets[i]);
  };
  // A template that comes back (a rollback) makes its old ReplicaSet the newest revision.
  if (fresh && revision_of(pass.replica_sets[*fresh]) <= max_old_revision) {
    pass.replica_sets[*fresh]["metadata"]["annotations"][kRevisionAnnotation] =
        std::to_string(max_old_revision + 1);
    update_replica_set(*fresh);
  }
  auto create_fresh = [&](int64_t initial_replicas) {
    Object rs_template = pod_template;
    rs_template["metadata"]["labels"][kHashLabel] = hash;
    Object selector = spec.value("selector", Object::object());
    if (!selector.contains("matchLabels") && !selector.contains("matchExpressions"))
      selector["matchLabels"] =
          pod_template.value("metadata", Object::object()).value("labels", Object::object());
    selector["matchLabels"][kHashLabel] = hash;
    Object rs_spec = {
        {"replicas", initial_replicas}, {"selector", selector}, {"template", rs_template}};
    if (spec.contains("minReadySeconds")) rs_spec["minReadySeconds"] = spec["minReadySeconds"];
    const Object rs = {
        {"apiVersion", kReplicaSets.api_version()},
        {"kind", kReplicaSets.kind},
        {"metadata",
         {{"name", name + "-" + hash},
          {"namespace", ns},
          {"labels", rs_template["metadata"]["labels"]},
          {"annotations", {{kRevisionAnnotation, std::to_string(max_old_revision + 1)}}},
          {"ownerReferences", {controller_reference(kDeployments, deployment)}}}},
        {"spec", rs_spec}};
    pass.replica_sets.push_back(client_.create(kReplicaSets, ns, rs));
    fresh = pass.replica_sets.size() - 1;
    rollout.created_new = true;
  };
  auto scale = [&](size_t i, int64_t to) {
    if (spec_replicas(pass.replica_sets[i]) == to) return false;
    pass.replica_sets[i]["spec"]["replicas"] = to;
    update_replica_set(i);
    return true;
  };
  auto sum_spec = [&](const std::vector<size_t>& indexes) {
    int64_t n = 0;
    for (size_t i : indexes) n += spec_replicas(pass.replica_sets[i]);
    return n;
  };
  auto all = [&] {
    std::vector<size_t> indexes = old;
    if (fresh) indexes.push_back(*fresh);
    return indexes;
  };

  if (is_recreate(deployment)) {
    // Old ReplicaSets to 0; the new one once none of their pods is active.
    bool scaled_down = false;
    for (size_t i : old) scaled_down |= scale(i, 0);
    int64_t old_active = 0;
    for (size_t i : old) old_active += pass.counts(pass.replica_sets[i]).active;
    if (!scaled_down && old_active == 0) {
      if (!fresh)
        create_fresh(replicas);
      else
        scale(*fresh, replicas);
    }
  } else {
    const Fenceposts f = rolling_fenceposts(deployment, replicas);
    const int64_t max_total = replicas + f.max_surge;
    bool scaled_up = false;
    if (!fresh) {
      create_fresh(std::clamp(max_total - sum_spec(old), int64_t{0}, replicas));
    } else {
      // NewRSNewReplicas: up to the surge, never above spec.replicas.
      const int64_t current = spec_replicas(pass.replica_sets[*fresh]);
      const int64_t total = sum_spec(all());
      if (current > replicas)
        scaled_up = scale(*fresh, replicas);
      else if (current < replicas && total < max_total)
        scaled_up = scale(*fresh, current + std::min(max_total - total, replicas - current));
    }
    if (!scaled_up && sum_spec(old) > 0) {
      // reconcileOldReplicaSets: scale down while the available pods stay at or above
      // spec.replicas - maxUnavailable; old pods that are not ready go first.
      const int64_t min_available = replicas - max_unavailable(deployment, replicas);
      const Object& fresh_rs = pass.replica_sets[*fresh];
      const int64_t new_unavailable = spec_replicas(fresh_rs) - pass.counts(fresh_rs).ready;
      const int64_t max_scaled_down = sum_spec(all()) - min_available - new_unavailable;
      if (max_scaled_down > 0) {
        int64_t cleaned = 0;
        for (size_t i : old) {
          if (cleaned >= max_scaled_down) break;
          const int64_t current = spec_replicas(pass.replica_sets[i]);
          const int64_t ready = pass.counts(pass.replica_sets[i]).ready;
          if (current <= ready) continue;
          const int64_t down = std::min(max_scaled_down - cleaned, current - ready);
          scale(i, current - down);
          cleaned += down;
        }
        int64_t available = 0;
        for (size_t i : all()) available += pass.counts(pass.replica_sets[i]).ready;
        int64_t budget = available - min_available;
        for (size_t i : old) {
          if (budget <= 0) break;
          const int64_t current = spec_replicas(pass.replica_sets[i]);
          const int64_t down = std::min(current, budget);
          if (down > 0) scale(i, current - down);
          budget -= down;
        }
      }
    }
  }

  // cleanupDeployment: once no old ReplicaSet has replicas, keep revisionHistoryLimit of them.
  const int64_t history_limit =
      std::max<int64_t>(spec.value("revisionHistoryLimit", int64_t{10}), 0);
  std::vector<size_t> empty_old;
  for (size_t i : old)
    if (spec_replicas(pass.replica_sets[i]) == 0 && pass.counts(pass.replica_sets[i]).active == 0)
      empty_old.push_back(i);
  std::vector<std::string> collected;  // uids
  if (empty_old.size() == old.size() && static_cast<int64_t>(old.size()) > history_limit) {
    for (size_t k = 0; k < old.size() - static_cast<size_t>(history_limit); ++k) {
      const Object& rs = pass.replica_sets[old[k]];
      client_.remove(kReplicaSets, ns, meta_string(rs, "name"));
      collected.push_back(meta_string(rs, "uid"));
    }
  }

  if (fresh) {
    const Object& rs = pass.replica_sets[*fresh];
    rollout.new_replica_set = meta_string(rs, "name");
    const std::string revision = std::to_string(revision_of(rs));
    const Object annotations = deployment["metadata"].value("annotations", Object::object());
    if (annotations.value(kRevisionAnnotation, "") != revision) {
      deployment["metadata"]["annotations"][kRevisionAnnotation] = revision;
      deployment = client_.update(kDeployments, ns, deployment);
    }
  }
  // The collected ReplicaSets' pods went with them (the store's garbage collector).
  for (const std::string& uid : collected) {
    std::erase_if(pass.pods,
                  [&](const auto& entry) { return controller_uid(entry.second) == uid; });
    std::erase_if(pass.replica_sets,
                  [&](const Object& rs) { return meta_string(rs, "uid") == uid; });
  }
  rollout.synced = true;
}

// The ReplicaSet controller's sync (pkg/controller/replicaset): spec.replicas active pods from
// the template, then the status.
void DeploymentController::sync_replica_set(Pass& pass, Object& replica_set) {
  const std::string ns = meta_string(replica_set, "namespace");
  const std::string name = meta_string(replica_set, "name");
  const std::string uid = meta_string(replica_set, "uid");
  const int64_t wanted = spec_replicas(replica_set);
  std::vector<Object> active, terminated;
  for (const auto& [_, pod] : pass.pods)
    if (meta_string(pod, "namespace") == ns && controller_uid(pod) == uid)
      (is_terminated(pod) ? terminated : active).push_back(pod);

  // Every newly terminated pod is an exit in a row for the backoff.
  CrashBackoff& backoff = backoff_[uid];
  const auto t = now();
  std::set<std::string> terminated_uids;
  for (const auto& pod : terminated) {
    const std::string pod_uid = meta_string(pod, "uid");
    terminated_uids.insert(pod_uid);
    if (!backoff.seen.emplace(pod_uid, backoff.counted).second) continue;
    ++backoff.counted;
    if (backoff.exits_in_a_row > 0 && t - backoff.last_exit >= kBackoffReset)
      backoff.exits_in_a_row = 0;
    ++backoff.exits_in_a_row;
    backoff.last_exit = t;
    auto delay = options_.crash_backoff_initial;
    for (int k = 1; k < backoff.exits_in_a_row && delay < options_.crash_backoff_max; ++k)
      delay *= 2;
    backoff.retry_at = t + std::min(delay, options_.crash_backoff_max);
  }
  std::erase_if(backoff.seen,
                [&](const auto& entry) { return !terminated_uids.count(entry.first); });

  auto remove_pod = [&](const Object& pod) {
    try {
      client_.remove(kube::kPods, ns, meta_string(pod, "name"));
    } catch (const ApiError& e) {
      if (!e.not_found()) throw;
    }
    pass.pods.erase(meta_string(pod, "uid"));
  };
  // The latest to terminate stay for `kubectl logs`.
  std::sort(terminated.begin(), terminated.end(), [&](const Object& a, const Object& b) {
    const int64_t sa = backoff.seen.at(meta_string(a, "uid"));
    const int64_t sb = backoff.seen.at(meta_string(b, "uid"));
    return sa != sb ? sa > sb : created_before(b, a);
  });
  for (size_t k = static_cast<size_t>(std::max(options_.terminated_pods_kept, 0));
       k < terminated.size(); ++k)
    remove_pod(terminated[k]);

  const int64_t have = static_cast<int64_t>(active.size());
  if (have < wanted && t >= backoff.retry_at) {
    const Object pod_template = spec_of(replica_set).value("template", Object::object());
    const Object template_meta = pod_template.value("metadata", Object::object());
    Object meta = {{"generateName", name + "-"},
                   {"namespace", ns},
                   {"ownerReferences", {controller_reference(kReplicaSets, replica_set)}}};
    for (const char* key : {"labels", "annotations"})
      if (template_meta.contains(key)) meta[key] = template_meta[key];
    const Object pod = {{"apiVersion", kube::kPods.api_version()},
                        {"kind", kube::kPods.kind},
                        {"metadata", meta},
                        {"spec", pod_template.value("spec", Object::object())}};
    for (int64_t k = have; k < wanted; ++k) {
      const Object created = client_.create(kube::kPods, ns, pod);
      active.push_back(created);
      pass.pods[meta_string(created, "uid")] = created;
    }
  } else if (have > wanted) {
    std::sort(active.begin(), active.end(), deleted_before);
    for (int64_t k = 0; k < have - wanted; ++k) remove_pod(active[k]);
    active.erase(active.begin(), active.begin() + (have - wanted));
  }

  // calculateStatus: replicas is always written, the other counts when not zero.
  const Object template_labels = spec_of(replica_set)
                                     .value("template", Object::object())
                                     .value("metadata", Object::object())
                                     .value("labels", Object::object());
  int64_t ready = 0, fully_labeled = 0;
  for (const auto& pod : active) {
    if (is_ready(pod)) ++ready;
    const Object labels = pod["metadata"].value("labels", Object::object());
    bool all = true;
    for (const auto& [key, value] : template_labels.items())
      all = all && labels.contains(key) && labels[key] == value;
    if (all) ++fully_labeled;
  }
  Object status = replica_set.value("status", Object::object());
  status["replicas"] = static_cast<int64_t>(active.size());
  put_count(status, "fullyLabeledReplicas", fully_labeled);
  put_count(status, "readyReplicas", ready);
  put_count(status, "availableReplicas", ready);  // minReadySeconds is ignored
  status["observedGeneration"] = generation_of(replica_set);
  write_status(client_, kReplicaSets, replica_set, std::move(status));
}

// syncRolloutStatus and calculateStatus (pkg/controller/deployment/progress.go, sync.go).
void DeploymentController::sync_deployment_status(Pass& pass, Object& deployment) {
  const Pass::Rollout& rollout = pass.rollouts[meta_string(deployment, "uid")];
  if (!rollout.synced) return;  // its sync failed: the next pass writes the status
  const int64_t replicas = spec_replicas(deployment);
  int64_t actual = 0, updated = 0, ready = 0, total_spec = 0;
  for (size_t i : pass.owned_by(deployment)) {
    const Object& rs = pass.replica_sets[i];
    const Pass::PodCounts c = pass.counts(rs);
    actual += c.active;
    ready += c.ready;
    total_spec += spec_replicas(rs);
    if (meta_string(rs, "name") == rollout.new_replica_set) updated = c.active;
  }
  const int64_t available = ready;  // minReadySeconds is ignored
  const Object old = deployment.value("status", Object::object());

  Object status = Object::object();
  status["observedGeneration"] = generation_of(deployment);
  put_count(status, "replicas", actual);
  put_count(status, "updatedReplicas", updated);
  put_count(status, "readyReplicas", ready);
  put_count(status, "availableReplicas", available);
  put_count(status, "unavailableReplicas", std::max<int64_t>(total_spec - available, 0));
  if (old.contains("collisionCount")) status["collisionCount"] = old["collisionCount"];

  Object conditions = old.value("conditions", Object::array());
  if (available >= replicas - max_unavailable(deployment, replicas))
    set_deployment_condition(conditions,
                             deployment_condition("Available", true, "MinimumReplicasAvailable",
                                                  "Deployment has minimum availability."));
  else
    set_deployment_condition(
        conditions, deployment_condition("Available", false, "MinimumReplicasUnavailable",
                                         "Deployment does not have minimum availability."));

  const std::string& rs_name = rollout.new_replica_set;
  if (spec_of(deployment).value("progressDeadlineSeconds", int64_t{INT32_MAX}) == INT32_MAX) {
    remove_condition(conditions, "Progressing");  // no deadline: the controller sets none
  } else {
    // A new ReplicaSet says so for this pass (the real controller writes it on creation).
    if (rollout.created_new)
      set_deployment_condition(conditions,
                               deployment_condition("Progressing", true, "NewReplicaSetCreated",
                                                    "Created new replica set \"" + rs_name + "\""));
    const Object* current = find_condition(conditions, "Progressing");
    // A finished rollout stays finished while every pod is of the new template.
    const bool stays_complete = !rollout.created_new && actual == updated && current &&
                                current->value("reason", "") == "NewReplicaSetAvailable";
    const auto old_count = [&](const char* key) { return old.value(key, int64_t{0}); };
    const bool progressed =
        updated > old_count("updatedReplicas") ||
        actual - updated < old_count("replicas") - old_count("updatedReplicas") ||
        ready > old_count("readyReplicas") || available > old_count("availableReplicas");
    if (stays_complete) {
      // Nothing to say: scaling and pod restarts are not a rollout.
    } else if (updated == replicas && actual == replicas && available == replicas) {
      set_deployment_condition(
          conditions,
          deployment_condition("Progressing", true, "NewReplicaSetAvailable",
                               "ReplicaSet \"" + rs_name + "\" has successfully progressed."));
    } else if (!rollout.created_new && (progressed || !current)) {
      // Progress refreshes lastUpdateTime even with the same reason (what the deadline reads).
      Object condition = deployment_condition(
          "Progressing", true, "ReplicaSetUpdated",
          rs_name.empty() ? "Deployment \"" + meta_string(deployment, "name") + "\" is progressing."
                          : "ReplicaSet \"" + rs_name + "\" is progressing.");
      if (current && current->value("status", "") == "True")
        condition["lastTransitionTime"] = (*current)["lastTransitionTime"];
      remove_condition(conditions, "Progressing");
      conditions.push_back(std::move(condition));
    }
  }
  if (!conditions.empty()) status["conditions"] = conditions;
  write_status(client_, kDeployments, deployment, std::move(status));
}

// The disruption controller's status (pkg/controller/disruption: getExpectedPodCount,
// countHealthyPods, updatePdbStatus).
void DeploymentController::sync_disruption_budget(Pass& pass, Object& budget) {
  const std::string ns = meta_string(budget, "namespace");
  const Object& spec = spec_of(budget);
  const std::optional<std::string> selector =
      spec.contains("selector") ? selector_string(spec["selector"]) : std::nullopt;
  std::vector<const Object*> pods;
  if (selector)
    for (const auto& [_, pod] : pass.pods)
      if (meta_string(pod, "namespace") == ns && matches_label_selector(pod, *selector))
        pods.push_back(&pod);

  // getExpectedScale: the sum of the selected pods' controllers' scales; a ReplicaSet of a
  // Deployment counts as the Deployment. Pods without a controller are left out (the real
  // controller warns of them); other controllers count their selected pods.
  auto expected_scale = [&] {
    std::map<std::string, int64_t> scale_by_controller;
    for (const Object* pod : pods) {
      const Object* ref = controller_ref(*pod);
      if (!ref) continue;
      std::string key = ref->value("uid", "");
      int64_t scale = -1;
      if (ref->value("kind", "") == kReplicaSets.kind) {
        for (const auto& rs : pass.replica_sets) {
          if (meta_string(rs, "uid") != key) continue;
          scale = spec_replicas(rs);
          const Object* owner = controller_ref(rs);
          if (owner && owner->value("kind", "") == kDeployments.kind)
            for (const auto& d : pass.deployments)
              if (meta_string(d, "uid") == owner->value("uid", "")) {
                key = meta_string(d, "uid");
                scale = spec_replicas(d);
              }
        }
      }
      if (scale >= 0)
        scale_by_controller[key] = scale;
      else
        ++scale_by_controller[key];
    }
    int64_t total = 0;
    for (const auto& [_, scale] : scale_by_controller) total += scale;
    return total;
  };
  int64_t expected = 0, desired = 0;
  if (spec.contains("maxUnavailable") && !spec["maxUnavailable"].is_null()) {
    expected = expected_scale();
    desired = std::max<int64_t>(expected - scaled_value(spec["maxUnavailable"], expected, true), 0);
  } else if (spec.contains("minAvailable") && !spec["minAvailable"].is_null()) {
    if (spec["minAvailable"].is_number_integer()) {
      expected = static_cast<int64_t>(pods.size());
      desired = spec["minAvailable"].get<int64_t>();
    } else {
      expected = expected_scale();
      desired = scaled_value(spec["minAvailable"], expected, true);
    }
  }
  int64_t healthy = 0;
  for (const Object* pod : pods) healthy += is_ready(*pod);
  // An expectedPods of 0 allows nothing: the first pods may appear before the next pass.
  const int64_t allowed = expected <= 0 ? 0 : std::max<int64_t>(healthy - desired, 0);

  const int64_t generation = generation_of(budget);
  const Object old = budget.value("status", Object::object());
  Object status = old;
  status["observedGeneration"] = generation;
  status["disruptionsAllowed"] = allowed;
  status["currentHealthy"] = healthy;
  status["desiredHealthy"] = desired;
  status["expectedPods"] = expected;
  // meta.SetStatusCondition: lastTransitionTime moves only when the status does.
  Object condition = {{"type", "DisruptionAllowed"},
                      {"status", allowed > 0 ? "True" : "False"},
                      {"observedGeneration", generation},
                      {"lastTransitionTime", now_rfc3339()},
                      {"reason", allowed > 0 ? "SufficientPods" : "InsufficientPods"},
                      {"message", ""}};
  Object conditions = old.value("conditions", Object::array());
  if (const Object* current = find_condition(conditions, "DisruptionAllowed"))
    if ((*current)["status"] == condition["status"])
      condition["lastTransitionTime"] = (*current)["lastTransitionTime"];
  bool replaced = false;
  for (auto& c : conditions)
    if (c.value("type", "") == "DisruptionAllowed") {
      c = condition;
      replaced = true;
    }
  if (!replaced) conditions.push_back(condition);
  status["conditions"] = conditions;
  write_status(client_, kPodDisruptionBudgets, budget, std::move(status));
}

}  // namespace kt::local

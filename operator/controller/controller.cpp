#include "operator/controller/controller.h"

#include <algorithm>
#include <cctype>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <exception>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>

#include "api/inventory.h"
#include "api/measured_profile.h"
#include "api/yaml_json.h"
#include "operator/kube/objects.h"
#include "planner/calibration.h"
#include "planner/planner.h"

namespace kt::controller {

using api::JobPhase;
using kube::ApiError;
using kube::Object;
using kube::parse_rfc3339;
using kube::rfc3339;
using Clock = std::chrono::system_clock;
using std::chrono::milliseconds;

namespace {

// Thrown by Pass::require_live_job(): the job was deleted (or replaced) after the copy this pass
// works from was read.
struct JobGone {};

// `from` plus `seconds`, saturating at the clock's ends: validation bounds the spec's durations,
// but a stored object (or a clock far off) must not overflow the nanosecond count into the past,
// which would expire a TTL or a deadline at once.
Clock::time_point plus_seconds(Clock::time_point from, int64_t seconds) {
  using Rep = Clock::duration::rep;
  const Rep per_second = std::chrono::duration_cast<Clock::duration>(std::chrono::seconds(1)).count();
  const Rep now = from.time_since_epoch().count();
  const Rep max = std::numeric_limits<Rep>::max(), min = std::numeric_limits<Rep>::min();
  if (seconds > 0 && (seconds > max / per_second || now > max - seconds * per_second))
    return Clock::time_point::max();
  if (seconds < 0 && (seconds < min / per_second || now < min - seconds * per_second))
    return Clock::time_point::min();
  return from + std::chrono::duration_cast<Clock::duration>(std::chrono::seconds(seconds));
}

// How long from now to `at`, for a requeue: at most a day (a requeue far in the future would
// overflow the work queue's clock; looking again daily is harmless, the reconcile is
// level-triggered).
milliseconds until_from(Clock::time_point now, Clock::time_point at) {
  if (at <= now) return milliseconds(0);
  const auto day = std::chrono::hours(24);
  if (at - now >= std::chrono::duration_cast<Clock::duration>(day)) return day;
  return std::chrono::duration_cast<milliseconds>(at - now);
}

// The restarts counted so far, in the plan ConfigMap beside the attempt and written with it: the
// status write that follows a restart can be lost (an API error, the operator killed), and the
// next reconcile, seeing only pods of an old attempt, would not count that restart again.
constexpr const char* kRestartsAnnotation = "kubetrain.dev/restarts";

// Status figures as `kubectl get tj` prints them: the API server prints a number column with
// every digit it has (5.182575702667236), so the status keeps 4 significant digits, and whole
// numbers at and above 1,000 (102936 tokens/s). Prometheus has the exact values.
double for_display(double value) {
  if (!std::isfinite(value) || value == 0) return value;
  if (std::fabs(value) >= 1000) return std::round(value);
  const double scale = std::pow(10.0, 3 - std::floor(std::log10(std::fabs(value))));
  return std::round(value * scale) / scale;
}

std::string label(const Object& obj, const char* key) {
  const auto& labels = obj["metadata"].value("labels", Object::object());
  return labels.value(key, "");
}

int64_t to_int(const std::string& s, int64_t fallback) {
  try {
    return s.empty() ? fallback : std::stoll(s);
  } catch (const std::exception&) {
    return fallback;
  }
}

std::string phase_of(const Object& pod) {
  return pod.contains("status") ? pod["status"].value("phase", "Pending") : "Pending";
}

bool condition_true(const Object& obj, const std::string& type) {
  if (!obj.contains("status")) return false;
  for (const auto& c : obj["status"].value("conditions", Object::array()))
    if (c.value("type", "") == type) return c.value("status", "") == "True";
  return false;
}

// The training container's exit code, if it terminated.
std::optional<int> exit_code(const Object& pod) {
  if (!pod.contains("status")) return std::nullopt;
  for (const auto& cs : pod["status"].value("containerStatuses", Object::array())) {
    const auto state = cs.value("state", Object::object());
    if (state.contains("terminated")) return state["terminated"].value("exitCode", 0);
  }
  return std::nullopt;
}

// The training container's termination message ("" when none): rank 0 writes its last progress
// there (worker/main.cpp).
std::string termination_message(const Object& pod) {
  if (!pod.contains("status")) return "";
  const Object statuses = pod["status"].value("containerStatuses", Object::array());
  if (statuses.empty() || !statuses[0].is_object()) return "";
  const Object state = statuses[0].value("state", Object::object());
  if (!state.is_object()) return "";
  const Object terminated = state.value("terminated", Object::object());
  return terminated.is_object() ? terminated.value("message", "") : "";
}

// Evicted or preempted (DisruptionTarget, kubelet's reason Evicted): the job did nothing wrong.
bool evicted(const Object& pod) {
  if (!pod.contains("status")) return false;
  const std::string reason = pod["status"].value("reason", "");
  return reason == "Evicted" || reason == "Preempted" || reason == "Preempting" ||
         condition_true(pod, "DisruptionTarget");
}

api::PlanSummary summarize(const api::Plan& plan) {
  api::PlanSummary s;
  s.nodes = plan.config.nodes;
  s.gpus_per_node = plan.device == api::DeviceKind::kCuda ? plan.config.procs_per_node : 0;
  s.tp = plan.config.tp;
  s.dp = plan.config.dp;
  s.pp = plan.config.pp;
  s.virtual_stages = plan.config.virtual_stages;
  s.distributed_optimizer = plan.config.distributed_optimizer;
  s.cut_layer = plan.config.cut_layer;
  s.cut_tp = plan.config.cut_tp;
  s.overlap = plan.config.sub_batches == 2;
  s.recompute = plan.config.recompute;
  s.offload = plan.config.offload;
  s.offload_window = plan.config.window;
  s.gpu_update_fraction = plan.gpu_update_fraction;
  s.predicted_step_seconds = for_display(plan.predicted.step_seconds);
  s.predicted_tokens_per_second = for_display(plan.predicted.tokens_per_second);
  s.config_map = plan_config_map_name(plan.job_name);
  s.plan_hash = plan.plan_hash;
  return s;
}

// Hardware profiles kept in ConfigMaps (docs/PLANNER.md §11a): labelled with the node kind, the
// profile document under profile.yaml (what `kubetrain-worker profile -o` writes); autotune
// writes the scales it folds back into the same ConfigMap.
constexpr const char* kHardwareProfileLabel = "kubetrain.dev/hardware-profile";
constexpr const char* kProfileKey = "profile.yaml";
constexpr size_t kMaxPlanHistory = 10;

// The kind as a label value and a name part: "H100-80GB" -> "h100-80gb".
std::string kind_label(const std::string& kind) {
  std::string out;
  for (char ch : kind.substr(0, 40)) {
    const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    out += (std::isalnum(static_cast<unsigned char>(c)) ? c : '-');
  }
  return out;
}
std::string profile_config_map_name(const std::string& kind) {
  return "kubetrain-profile-" + kind_label(kind);
}

std::string describe_config(const api::Plan& plan) {
  const auto& c = plan.config;
  char text[200];
  std::snprintf(text, sizeof(text), "%lld node(s) × %lld, tp %lld, dp %lld, %s, recompute %s, "
                "offload %s",
                static_cast<long long>(c.nodes), static_cast<long long>(c.procs_per_node),
                static_cast<long long>(c.tp), static_cast<long long>(c.dp),
                c.sub_batches == 2 ? "overlapped" : "not overlapped",
                std::string(api::to_string(c.recompute)).c_str(),
                std::string(api::to_string(c.offload)).c_str());
  return text;
}

}  // namespace

// One reconcile: the job as read, the status being built, and the writes that converge.
class Controller::Pass {
 public:
  Pass(kube::Client& client, const ControllerOptions& options, std::mutex& placement_mutex,
       Object job_object)
      : client_(client),
        options_(options),
        placement_mutex_(placement_mutex),
        object_(std::move(job_object)),
        ns_(object_["metadata"].value("namespace", "default")),
        name_(object_["metadata"]["name"]),
        generation_(object_["metadata"].value("generation", int64_t{1})),
        now_(options.clock()) {
    try {
      old_status_ = api::decode_status(object_.value("status", Object::object()));
    } catch (const kt::Error&) {
      // A status we cannot read (written by someone else) is rebuilt from the cluster.
    }
    status_ = old_status_;
  }
  // Reservations whose pods were not created (an error, a name still taken) end with the pass.
  ~Pass() {
    if (!reserved_.empty()) options_.inventory->unreserve(reserved_);
  }
  Pass(const Pass&) = delete;
  Pass& operator=(const Pass&) = delete;

  ReconcileResult run();
  std::string phase() const {
    return status_.phase ? std::string(api::to_string(*status_.phase)) : "";
  }
  int64_t restarts() const { return status_.restarts; }

 private:
  // ---- status -----------------------------------------------------------------------------
  void set_condition(const std::string& type, bool value, const std::string& reason,
                     const std::string& message) {
    const std::string status = value ? "True" : "False";
    for (auto& c : status_.conditions) {
      if (c.type != type) continue;
      if (c.status != status) c.last_transition_time = rfc3339(now_);
      c.status = status;
      c.reason = reason;
      c.message = message;
      c.observed_generation = generation_;
      return;
    }
    if (!value && reason.empty()) return;  // nothing to say about a condition never set
    status_.conditions.push_back({type, status, reason, message, generation_, rfc3339(now_)});
  }
  bool has_condition(const std::string& type, bool value) const {
    for (const auto& c : status_.conditions)
      if (c.type == type) return c.status == (value ? "True" : "False");
    return false;
  }
  std::string condition_reason(const std::string& type) const {
    for (const auto& c : status_.conditions)
      if (c.type == type) return c.reason;
    return "";
  }
  void clear_condition(const std::string& type, const std::string& reason) {
    for (const auto& c : status_.conditions)
      if (c.type == type && c.status == "True") {
        set_condition(type, false, reason, "");
        return;
      }
  }

  // Writes the status when it changed (and only then), with the version read: a concurrent
  // writer makes this a Conflict, and the next reconcile starts from fresh state.
  void write_status() {
    status_.observed_generation = generation_;
    const Object want = api::to_json(status_);
    if (object_.contains("status") && object_["status"] == want) return;
    Object update = object_;
    update["status"] = want;
    object_ = client_.update_status(kube::kTrainingJobs, ns_, update);
  }

  void event(const std::string& type, const std::string& reason, const std::string& message) {
    const std::string ts = rfc3339(now_);
    Object ev = {{"apiVersion", "v1"},
                 {"kind", "Event"},
                 {"metadata", {{"generateName", name_ + "."}, {"namespace", ns_}}},
                 {"involvedObject",
                  {{"apiVersion", api::kApiVersion},
                   {"kind", "TrainingJob"},
                   {"name", name_},
                   {"namespace", ns_},
                   {"uid", object_["metadata"].value("uid", "")}}},
                 {"type", type},
                 {"reason", reason},
                 {"message", message},
                 {"source", {{"component", "kubetrain-operator"}}},
                 {"firstTimestamp", ts},
                 {"lastTimestamp", ts},
                 {"count", 1}};
    if (options_.events) {
      options_.events->record(std::move(ev));  // off the reconcile path, as client-go's
    } else {
      create_event(client_, ev);
    }
  }

  // status.planHistory gets one entry (the newest last, at most kMaxPlanHistory kept).
  void record_plan_change(const std::string& reason, const std::string& message,
                          const std::string& from_hash, double from_step, const api::Plan& to,
                          std::optional<double> measured_step = std::nullopt) {
    api::PlanChange change;
    change.time = rfc3339(now_);
    change.reason = reason;
    change.message = message;
    change.from_plan_hash = from_hash;
    change.to_plan_hash = to.plan_hash;
    change.from_predicted_step_seconds = for_display(from_step);
    change.to_predicted_step_seconds = for_display(to.predicted.step_seconds);
    if (measured_step) change.measured_step_seconds = for_display(*measured_step);
    auto& history = status_.plan_history;
    history.push_back(std::move(change));
    if (history.size() > kMaxPlanHistory)
      history.erase(history.begin(), history.end() - kMaxPlanHistory);
  }

  void set_phase(JobPhase phase) {
    if (status_.phase != phase && options_.metrics) {
      if (phase == JobPhase::kSucceeded) options_.metrics->jobs_succeeded_total.inc();
      if (phase == JobPhase::kFailed) options_.metrics->jobs_failed_total.inc();
    }
    status_.phase = phase;
  }

  // ---- children ---------------------------------------------------------------------------
  std::vector<Object> list_pods() {
    std::vector<Object> pods;
    for (auto& p : client_.list(kube::kPods, ns_, job_children()).items) {
      // Only the pods this job controls (a label alone could be anyone's).
      for (const auto& ref : p["metadata"].value("ownerReferences", Object::array()))
        if (ref.value("uid", "") == object_["metadata"].value("uid", "") &&
            ref.value("controller", false))
          pods.push_back(p);
    }
    return pods;
  }

  void delete_pod(const Object& pod) {
    try {
      client_.remove(kube::kPods, ns_, pod["metadata"]["name"]);
    } catch (const ApiError& e) {
      if (!e.not_found()) throw;
    }
  }

  // cleanPodPolicy on finish: All deletes every pod, Running those still running, None none.
  void clean_pods(api::CleanPodPolicy policy) {
    if (policy == api::CleanPodPolicy::kNone) return;
    for (const auto& pod : list_pods()) {
      const std::string phase = phase_of(pod);
      if (policy == api::CleanPodPolicy::kAll || (phase != "Succeeded" && phase != "Failed"))
        delete_pod(pod);
    }
  }

  void finish(JobPhase phase, const std::string& reason, const std::string& message,
              api::CleanPodPolicy policy) {
    set_phase(phase);
    const bool ok = phase == JobPhase::kSucceeded;
    set_condition(ok ? "Succeeded" : "Failed", true, reason, message);
    set_condition("Running", false, reason, "");
    clear_condition("PodsReady", reason);  // no pod of a finished job is ready any more
    clear_condition("Restarting", reason);
    status_.workers.ready = 0;
    if (status_.completion_time.empty()) status_.completion_time = rfc3339(now_);
    event(ok ? "Normal" : "Warning", reason, message);
    clean_pods(policy);
  }

  // The plan ConfigMap, looked for by the job label as the Service is (the cache answers; its own
  // writes are seen at once). One without the label is found when its create says AlreadyExists.
  std::optional<Object> get_config_map() {
    const std::string name = plan_config_map_name(name_);
    for (Object& cm : client_.list(kube::kConfigMaps, ns_, job_children()).items)
      if (cm["metadata"].value("name", "") == name) return std::move(cm);
    return std::nullopt;
  }
  kube::ListOptions job_children() const {
    kube::ListOptions opts;
    opts.label_selector = std::string(kJobNameLabel) + "=" + name_;
    return opts;
  }

  // Whether the job has trained (or is training): then its model may not change.
  bool has_started(bool pods_exist) const {
    return pods_exist || status_.progress.step > 0 || status_.last_checkpoint_step.value_or(0) > 0;
  }
  static std::string describe(const api::ModelDims& m) {
    return "layers " + std::to_string(m.layers) + ", hidden " + std::to_string(m.hidden) +
           ", heads " + std::to_string(m.heads) + ", ffnHidden " + std::to_string(m.ffn_hidden) +
           ", vocab " + std::to_string(m.vocab) + ", seqLen " + std::to_string(m.seq_len);
  }

  // Before the first child a pass creates: the job must still exist, with this uid, in the API
  // (not in a cache that may lag its delete). Throws JobGone when it does not; the reconcile
  // then ends quietly. One GET per pass that creates; none in a steady state.
  void require_live_job() {
    if (!job_exists_) {
      kube::Client& api = options_.api_reader ? *options_.api_reader : client_;
      try {
        const Object live = api.get(kube::kTrainingJobs, ns_, name_);
        job_exists_ = live["metadata"].value("uid", "") == object_["metadata"].value("uid", "") &&
                      !live["metadata"].contains("deletionTimestamp");
      } catch (const ApiError& e) {
        if (!e.not_found()) throw;
        job_exists_ = false;
      }
    }
    if (!*job_exists_) throw JobGone{};
  }

  // The job's checkpoint PVC, created once and never changed (a PVC's size may only grow, and
  // its data is the job's progress).
  void ensure_checkpoint_claim(const api::TrainingJob& job, const api::Plan& plan) {
    if (!job_needs_checkpoint_claim(job, options_.children)) return;
    try {
      client_.get(kube::kPersistentVolumeClaims, ns_, checkpoint_claim_name(name_));
    } catch (const ApiError& e) {
      if (!e.not_found()) throw;
      require_live_job();
      try {
        client_.create(kube::kPersistentVolumeClaims, ns_,
                       render_checkpoint_claim(object_, plan, job.spec.checkpoint.claim_retention,
                                               options_.children));
      } catch (const ApiError& create_error) {
        if (!create_error.already_exists()) throw;
      }
    }
  }

  // Allowed, but said loudly (a condition, and an event when it turns True): every restart of the
  // gang starts again from step 0.
  void warn_if_checkpoints_are_ephemeral(const api::TrainingJob& job) {
    if (!checkpoints_are_ephemeral(job, options_.children)) {
      clear_condition(kEphemeralCheckpoints, "PersistentVolume");
      return;
    }
    const std::string message =
        "checkpoints are written to an emptyDir, which goes with the pod: a restarted, "
        "evicted or resumed gang starts again from step 0 (use a PersistentVolumeClaim, or leave "
        "spec.checkpoint.volume unset for the operator's)";
    if (!has_condition(kEphemeralCheckpoints, true)) event("Warning", "EphemeralCheckpoints", message);
    set_condition(kEphemeralCheckpoints, true, "EmptyDirVolume", message);
  }
  static constexpr const char* kEphemeralCheckpoints = "EphemeralCheckpoints";

  // The job's headless Service exists. Looked for by the job label, which the cache answers
  // without a request (a GET of a name the label-filtered cache lacks would go to the API). A
  // new job's Service is created alongside the reconcile's next writes (nothing waits for it:
  // DNS names resolve once it exists); service_created() waits for it, and its error is the
  // reconcile's. A Service of that name without the label is left as it is (AlreadyExists).
  void ensure_service() {
    for (const Object& service : client_.list(kube::kServices, ns_, job_children()).items)
      if (service["metadata"].value("name", "") == name_) return;
    require_live_job();
    const auto create = [this, want = render_service(object_, options_.children)] {
      try {
        client_.create(kube::kServices, ns_, want);
      } catch (const ApiError& create_error) {
        if (!create_error.already_exists()) throw;
      }
    };
    try {
      service_create_ = std::async(std::launch::async, create);
    } catch (const std::system_error&) {
      create();  // no thread to spare: in line
    }
  }
  void service_created() {
    if (service_create_.valid()) service_create_.get();
  }

  // The hardware profiles kept in ConfigMaps of the job's namespace (one LIST, made only when a
  // plan is made: the cache holds no such ConfigMaps); `fingerprint` says which versions.
  // One that does not decode is left out, and said in a Warning event.
  std::vector<api::MeasuredProfile> stored_profiles(std::string& fingerprint) {
    kube::ListOptions opts;
    opts.label_selector = kHardwareProfileLabel;
    std::vector<api::MeasuredProfile> profiles;
    for (const Object& cm : client_.list(kube::kConfigMaps, ns_, opts).items) {
      const std::string name = cm["metadata"].value("name", "");
      try {
        const std::string text = cm.value("data", Object::object()).value(kProfileKey, "");
        if (text.size() > (1u << 20)) throw kt::Error("profile.yaml is larger than 1 MiB");
        profiles.push_back(api::decode_measured_profile(
            api::yaml_to_json(text, "ConfigMap " + name + " " + kProfileKey)));
        fingerprint += "|" + name + "@" + cm["metadata"].value("resourceVersion", "");
        // The first of a kind is the one nodes take (apply_measured_profiles), and the one a
        // fold-back updates.
        stored_by_kind_.emplace(profiles.back().profile.name,
                                std::make_pair(name, profiles.back()));
      } catch (const std::exception& e) {
        if (!warned_profiles_.insert(name).second) continue;
        event("Warning", "InvalidHardwareProfile",
              "ConfigMap " + ns_ + "/" + name + " data." + kProfileKey + ": " + e.what() +
                  " (planned without it)");
      }
    }
    return profiles;
  }

  // Calls `fn` with the nodes as the planner sees them (inventory.h): from the tracker the
  // informers keep when there is one and it has synced, else from a LIST of every node and pod.
  void with_inventory(const std::function<void(const PlannerInventory&)>& fn) {
    if (options_.inventory && options_.inventory->has_synced()) {
      options_.inventory->with_inventory(ns_, name_, fn);
    } else {
      with_listed_inventory(client_, ns_, name_, fn);
    }
  }

  // ---- the steps (run() lists them in order) ---------------------------------------------
  // A step that may end the reconcile returns the result to end it with; std::nullopt goes on.
  using Outcome = std::optional<ReconcileResult>;

  // The restart attempt this reconcile works on, carried from step to step.
  struct Gang {
    std::optional<Object> config_map;  // <job>-plan: the plan, the attempt, the restart count
    int64_t attempt = 0;
    bool attempt_pods_exist = false;  // any pod of this attempt, whatever its phase
    // Every pod of this attempt is Pending and Unschedulable: its plan was made for a cluster
    // that is not there (e.g. from a moment when other pods were missing from the cache).
    bool attempt_unschedulable = false;
    std::set<int64_t> attempt_ranks;  // the node ranks of those pods
    std::map<int64_t, Object> rendered;  // pods reserved in the tracker, to create as they are
    std::optional<api::Plan> plan;
    std::map<int64_t, Object> pods;  // the attempt's pods by node rank
    int64_t desired = 0;             // node ranks in the plan
    std::optional<Object> failed;    // the failed pod to report (a real failure over an eviction)
  };

  Outcome validate(api::TrainingJob& job);
  bool failed_for_old_spec() const;
  bool finished_before() const;
  void reopen_if_spec_fixed();
  Outcome suspend(const api::RunPolicy& policy, const std::vector<Object>& pods);
  void resume_if_suspended();
  bool deadline_exceeded(const api::RunPolicy& policy);
  Gang read_attempt(const std::vector<Object>& pods);
  Outcome plan(const api::TrainingJob& job, Gang& gang, ReconcileResult& result);
  void classify(Gang& gang, const std::vector<Object>& pods);
  Outcome restart_or_fail(const api::TrainingJob& job, Gang& gang, ReconcileResult& result);
  bool all_succeeded(const api::TrainingJob& job, Gang& gang);
  void create_missing(const api::TrainingJob& job, Gang& gang, ReconcileResult& result);
  bool ensure_pod_group(const api::TrainingJob& job, const Gang& gang, ReconcileResult& result);
  void report_progress(const api::TrainingJob& job, Gang& gang, ReconcileResult& result);
  void requeue_at_deadline(const api::RunPolicy& policy, ReconcileResult& result);

  ReconcileResult finished(const api::TrainingJob& job);
  ReconcileResult without_plan(const api::TrainingJob& job, const ReconcileResult& result);
  std::optional<api::Plan> plan_for(const api::TrainingJob& job, Gang& gang, bool pods_exist,
                                    ReconcileResult& result);
  void reserve_placement(const api::TrainingJob& job, Gang& gang, const api::Plan& plan);
  void progress(const api::TrainingJob& job, const api::Plan& plan, const Object& rank0);
  void autotune(const api::TrainingJob& job, Gang& gang, ReconcileResult& result);
  void save_profile(const planner::Refit& refit, int64_t steps, double measured);
  std::optional<std::string> profile_kind(const std::string& kind, const api::Node& node,
                                          const api::TrainingJob& job, bool& stored);
  std::map<std::string, const api::Node*> unprofiled_kinds(const api::TrainingJob& job,
                                                          const api::Inventory& nodes) const;
  std::optional<std::string> profile_node_kinds(const api::TrainingJob& job,
                                                const api::Inventory& nodes, bool& stored);
  void checkpoint_health(const WorkerProgress& rank0);

  kube::Client& client_;
  const ControllerOptions& options_;
  std::mutex& placement_mutex_;
  std::unique_lock<std::mutex> placing_;  // placement_mutex_, from a new plan to its pods
  std::vector<std::string> reserved_;     // "ns/name" of the pods reserved in the tracker
  Object object_;
  const std::string ns_, name_;
  const int64_t generation_;
  const Clock::time_point now_;
  api::TrainingJobStatus old_status_, status_;
  std::optional<WorkerProgress> rank0_;  // rank 0's metrics, when this reconcile read them
  std::set<std::string> warned_profiles_;
  // The profile ConfigMap (name, profile) of each node kind that has one, as last listed.
  std::map<std::string, std::pair<std::string, api::MeasuredProfile>> stored_by_kind_;
  std::optional<bool> job_exists_;  // require_live_job()'s answer, asked once per pass
  bool replanning_unschedulable_ = false;  // plan(): the gang's pods cannot be scheduled
  // Last: destroyed first, it waits for the create that uses the members above.
  std::future<void> service_create_;
};

ReconcileResult Controller::Pass::finished(const api::TrainingJob& job) {
  clean_pods(job.spec.run_policy.clean_pod_policy);
  write_status();
  const auto ttl = job.spec.run_policy.ttl_seconds_after_finished;
  const auto done = parse_rfc3339(status_.completion_time);
  if (!ttl || !done) return {};
  const auto expires = plus_seconds(*done, *ttl);
  if (now_ >= expires) {
    client_.remove(kube::kTrainingJobs, ns_, name_, kube::Propagation::Background);
    return {};
  }
  return {until_from(now_, expires)};
}

// The plan the job runs: the stored one, unless the spec generation changed, or the inventory
// changed while no pods run (a (re)start). On a new plan the ConfigMap is written and `attempt`
// moves on when pods of the old plan exist. std::nullopt: no plan now (status says why).
std::optional<api::Plan> Controller::Pass::plan_for(const api::TrainingJob& job, Gang& gang,
                                                    bool pods_exist, ReconcileResult& result) {
  std::optional<Object>& cm = gang.config_map;
  int64_t& attempt = gang.attempt;
  const auto annotation = [&](const char* key) -> std::string {
    if (!cm) return "";
    return cm->at("metadata").value("annotations", Object::object()).value(key, "");
  };
  std::optional<api::Plan> stored;
  if (cm) {
    try {
      stored = api::decode_plan(Object::parse(cm->at("data").value("plan.json", "{}")));
    } catch (const std::exception&) {
      stored.reset();  // unreadable: plan again
    }
  }
  const bool same_generation = to_int(annotation(kGenerationAnnotation), -1) == generation_;
  // A gang that exists keeps its plan: no inventory read (10,000 nodes and every pod) for it.
  if (stored && same_generation && pods_exist) return stored;
  // The model of a job that has started is immutable (the CRD's rule on spec.model, for a
  // cluster without it or for `kubetrain run`): its checkpoints hold that model's tensors, and a
  // gang of another shape could never load them. The change is refused, said in a condition and
  // an event, and the job goes on with the model it started with.
  if (stored && !same_generation && has_started(pods_exist)) {
    const api::ModelDims asked = api::resolve_model(job.spec.model);
    if (!(asked == stored->model)) {
      const std::string message =
          "spec.model changed while the job ran (now " + describe(asked) + ", started as " +
          describe(stored->model) +
          "): the model of a started job is immutable, its checkpoints hold the first one's "
          "tensors; the job goes on with the model it started with (delete and re-create it to "
          "train another model)";
      if (!has_condition("ModelChangeRefused", true))
        event("Warning", "ModelChangeRefused", message);
      set_condition("ModelChangeRefused", true, "ModelImmutable", message);
      if (!pods_exist) reserve_placement(job, gang, *stored);
      return stored;
    }
  }
  clear_condition("ModelChangeRefused", "ModelUnchanged");
  // New placements are made one at a time, each seeing the pods of the one before.
  if (!placing_.owns_lock()) placing_ = std::unique_lock(placement_mutex_);
  std::string inventory_hash;
  std::optional<api::Plan> fresh;
  std::string no_plan;          // why the planner found none
  bool fits_when_free = false;  // ... though one fits the cluster with every GPU, core, byte free
  double planning_seconds = 0;
  std::string profiles_hash;
  std::vector<api::MeasuredProfile> profiles = stored_profiles(profiles_hash);
  if (options_.profiling) {
    std::optional<api::Inventory> nodes;
    with_inventory([&](const PlannerInventory& inventory) {
      // allocatable() builds the nodes anew: only while a kind has no profile (kinds, and
      // whether nodes are schedulable, are the same in the free inventory).
      if (!unprofiled_kinds(job, inventory.free).empty()) nodes = inventory.allocatable();
    });
    bool stored = false;
    if (const auto waiting = nodes ? profile_node_kinds(job, *nodes, stored) : std::nullopt) {
      set_phase(JobPhase::kPending);
      set_condition("Planned", false, "ProfilingNodes", *waiting);
      result.requeue_after = std::chrono::seconds(5);
      return std::nullopt;
    }
    if (stored) {  // plan with what profiling stored just now
      profiles_hash.clear();
      profiles = stored_profiles(profiles_hash);
    }
  }
  with_inventory([&](const PlannerInventory& inventory) {
    inventory_hash = inventory.fingerprint + profiles_hash;
    if (stored && same_generation && annotation(kInventoryHashAnnotation) == inventory_hash) return;
    const auto started = std::chrono::steady_clock::now();
    try {
      if (profiles.empty()) {
        fresh = planner::best_plan(job, inventory.free);
      } else {
        api::Inventory measured = inventory.free;
        api::apply_measured_profiles(measured, profiles);
        fresh = planner::best_plan(job, measured);
      }
    } catch (const kt::Error& e) {
      no_plan = e.what();
      try {
        // Every node free, and every node back (cordoned or not Ready ones may return): a job
        // that would fit then waits, as a Pending pod does.
        api::Inventory all = inventory.allocatable();
        for (api::Node& node : all.nodes) node.schedulable = true;
        planner::best_plan(job, all);
        fits_when_free = true;
      } catch (const kt::Error&) {
      }
    }
    planning_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  });
  if (!fresh && no_plan.empty()) {  // same generation, same inventory
    reserve_placement(job, gang, *stored);
    return stored;
  }
  if (!fresh) {
    if (fits_when_free) {
      set_phase(JobPhase::kPending);
      set_condition("Planned", false, "WaitingForResources", no_plan);
      result.requeue_after = std::chrono::seconds(30);
    } else {
      const std::string message =
          no_plan + " (and it would not fit with every other job's pods gone either: what pods of "
                    "long-running workloads, such as the operator, hold stays held)";
      finish(JobPhase::kFailed, "NoFeasiblePlan", message, job.spec.run_policy.clean_pod_policy);
      set_condition("Planned", false, "NoFeasiblePlan", message);
    }
    return std::nullopt;
  }
  const api::Plan& plan = *fresh;
  if (options_.metrics) options_.metrics->planner_duration_seconds.observe(planning_seconds);
  // A plan the workers would refuse (pipeline stages, the distributed optimizer): said now,
  // before a gang of pods starts only to exit.
  if (const std::string why = api::not_yet_executable(plan); !why.empty()) {
    const std::string message = "the plan cannot run: " + why;
    finish(JobPhase::kFailed, "PlanNotExecutable", message, job.spec.run_policy.clean_pod_policy);
    set_condition("Planned", false, "PlanNotExecutable", message);
    return std::nullopt;
  }

  const bool plan_changed = !stored || stored->plan_hash != plan.plan_hash;
  if (plan_changed && (pods_exist || replanning_unschedulable_)) {  // pods of the old plan
    ++attempt;
    gang.attempt_ranks.clear();
  }
  reserve_placement(job, gang, plan_changed ? plan : *stored);
  Object want = render_plan_config_map(object_, plan_changed ? plan : *stored, generation_,
                                       inventory_hash, attempt);
  if (const std::string restarts = annotation(kRestartsAnnotation); !restarts.empty())
    want["metadata"]["annotations"][kRestartsAnnotation] = restarts;
  if (!cm) {
    require_live_job();
    try {
      cm = client_.create(kube::kConfigMaps, ns_, want);
    } catch (const ApiError& e) {
      if (!e.already_exists()) throw;
      Object update = client_.get(kube::kConfigMaps, ns_, plan_config_map_name(name_));
      // Ours, and the cache is behind (its attempt and restart count must not be overwritten):
      // the reconcile is retried once the cache has it.
      if (update["metadata"].value("labels", Object::object()).contains(kJobNameLabel))
        throw kt::Error("ConfigMap " + ns_ + "/" + plan_config_map_name(name_) +
                        " exists but the cache does not have it yet; retrying");
      // A ConfigMap of that name without the job label: taken over, labels and all.
      for (const char* key : {"labels", "annotations", "ownerReferences"})
        if (want["metadata"].contains(key)) update["metadata"][key] = want["metadata"][key];
      update["data"] = want["data"];
      cm = client_.update(kube::kConfigMaps, ns_, update);
    }
  } else {
    Object update = *cm;
    update["metadata"]["annotations"] = want["metadata"]["annotations"];
    update["data"] = want["data"];
    cm = client_.update(kube::kConfigMaps, ns_, update);
  }
  if (!plan_changed) return stored;
  if (stored) {  // a gang ran another plan before: say what changed
    const std::string reason = same_generation ? "InventoryChanged" : "SpecChanged";
    const std::string message =
        (same_generation ? "the usable nodes or their figures changed: " : "the spec changed: ") +
        describe_config(*stored) + " -> " + describe_config(plan);
    record_plan_change(reason, message, stored->plan_hash, stored->predicted.step_seconds, plan);
    event("Normal", "Replanned", message);
  }
  status_.plan = summarize(plan);
  char message[256];
  std::snprintf(
      message, sizeof(message),
      "%lld node(s) × %lld %s, tp %lld, dp %lld, %s, recompute %s, offload %s; "
      "predicted %.4g s/step, %.4g tokens/s (plan %s)",
      static_cast<long long>(plan.config.nodes), static_cast<long long>(plan.config.procs_per_node),
      plan.device == api::DeviceKind::kCuda ? "GPU(s)" : "CPU rank(s)",
      static_cast<long long>(plan.config.tp), static_cast<long long>(plan.config.dp),
      plan.config.sub_batches == 2 ? "overlapped" : "not overlapped",
      std::string(api::to_string(plan.config.recompute)).c_str(),
      std::string(api::to_string(plan.config.offload)).c_str(), plan.predicted.step_seconds,
      plan.predicted.tokens_per_second, plan.plan_hash.c_str());
  set_condition("Planned", true, "PlanChosen", message);
  event("Normal", "PlanChosen", message);
  return plan;
}

// With the tracker, the pods a placement is about to create are reserved there and the placement
// lock is let go at once: the next job plans while these pods are created, and sees them. (From
// a LIST, the lock is held until the pods exist: the next LIST must find them.)
void Controller::Pass::reserve_placement(const api::TrainingJob& job, Gang& gang,
                                         const api::Plan& plan) {
  if (!placing_.owns_lock() || !options_.inventory || !options_.inventory->has_synced()) return;
  std::vector<Object> pods;
  std::vector<int64_t> ranks;
  for (int64_t rank = 0; rank < static_cast<int64_t>(plan.placement.size()); ++rank) {
    if (gang.attempt_ranks.count(rank)) continue;
    pods.push_back(render_worker_pod(object_, job, plan, rank, gang.attempt, options_.children));
    ranks.push_back(rank);
  }
  options_.inventory->reserve(pods);
  placing_.unlock();
  gang.rendered.clear();
  for (std::size_t i = 0; i < pods.size(); ++i) {
    reserved_.push_back(kube::object_key(pods[i]));
    gang.rendered.emplace(ranks[i], std::move(pods[i]));
  }
}

void Controller::Pass::progress(const api::TrainingJob& job, const api::Plan& plan,
                                const Object& rank0) {
  if (!options_.fetch_metrics) return;
  const std::string ip = rank0.contains("status") ? rank0["status"].value("podIP", "") : "";
  if (ip.empty()) return;
  int port = options_.children.metrics_port;
  const auto annotations = rank0["metadata"].value("annotations", Object::object());
  if (annotations.contains(kMetricsPortAnnotation))
    port = static_cast<int>(to_int(annotations.value(kMetricsPortAnnotation, ""), port));
  const auto text = options_.fetch_metrics(ip, port);
  if (!text) return;
  const WorkerProgress& p = rank0_.emplace(parse_worker_progress(*text));
  if (const auto step = p.step ? p.step : p.steps) status_.progress.step = static_cast<int64_t>(*step);
  if (p.loss) status_.progress.loss = for_display(*p.loss);
  if (p.tokens_per_second) {
    status_.progress.tokens_per_second = for_display(*p.tokens_per_second);
    const double tokens_per_step =
        static_cast<double>(plan.global_batch) * static_cast<double>(plan.model.seq_len);
    if (*p.tokens_per_second > 0) {
      const double step_seconds = tokens_per_step / *p.tokens_per_second;
      status_.progress.step_seconds = for_display(step_seconds);
      status_.progress.eta_seconds = for_display(
          std::max<double>(0,
                           static_cast<double>(job.spec.training.steps - status_.progress.step)) *
          step_seconds);
    }
  }
  if (p.last_checkpoint_step && *p.last_checkpoint_step > 0)
    status_.last_checkpoint_step = static_cast<int64_t>(*p.last_checkpoint_step);
  checkpoint_health(p);
}

// CheckpointFailing, level-triggered from rank 0's counts: True while its latest saves fail (one
// Warning event when it turns True: the count changes every interval, the news does not), False
// once a save succeeds again. Training goes on meanwhile; a restart would resume from the last
// checkpoint that was written.
void Controller::Pass::checkpoint_health(const WorkerProgress& rank0) {
  if (!rank0.checkpoint_consecutive_failures) return;  // no sample: nothing new
  const double failing = *rank0.checkpoint_consecutive_failures;
  if (failing > 0) {
    std::string reasons;
    for (const auto& [reason, count] : rank0.checkpoint_failures)
      if (count > 0)
        reasons += (reasons.empty() ? "" : ", ") + (reason.empty() ? "" : reason + " ") +
                   std::to_string(static_cast<int64_t>(count));
    const std::string message =
        "the last " + std::to_string(static_cast<int64_t>(failing)) + " checkpoint save(s) failed" +
        (reasons.empty() ? "" : " (so far: " + reasons + ")") +
        "; training goes on and saves again at the next interval; a restart resumes from " +
        (status_.last_checkpoint_step ? "step " + std::to_string(*status_.last_checkpoint_step)
                                      : std::string("the start")) +
        " (the worker's log says why: disk full, read-only, permissions)";
    const bool news = !has_condition("CheckpointFailing", true);
    set_condition("CheckpointFailing", true, "CheckpointWriteFailed", message);
    if (news) event("Warning", "CheckpointFailing", message);
  } else if (has_condition("CheckpointFailing", true)) {
    const std::string message =
        "checkpoints are written again" +
        (status_.last_checkpoint_step
             ? " (the last at step " + std::to_string(*status_.last_checkpoint_step) + ")"
             : std::string());
    set_condition("CheckpointFailing", false, "CheckpointWritten", message);
    event("Normal", "CheckpointRecovered", message);
  }
}

// Autotune (docs/PLANNER.md §11b): once per attempt, after the warm-up, rank 0's measured phase
// times are folded into the figures of the plan's node kind (refit), which are written back to
// the kind's profile ConfigMap for every later plan. When the best plan with those figures
// predicts >= 10% more tokens/s than the running one does and the steps left repay a restart,
// the gang is stopped (the workers checkpoint on SIGTERM) and the next attempt runs the new
// plan, resuming by resharding; both plans and the reason go to status and an event.
void Controller::Pass::autotune(const api::TrainingJob& job, Gang& gang, ReconcileResult& result) {
  if (!rank0_ || !gang.plan || status_.phase != JobPhase::kRunning) return;
  if (!job.spec.parallelism.autotune.value_or(true)) return;
  api::AutotuneStatus at = status_.autotune.value_or(api::AutotuneStatus{});
  if (at.evaluated_attempt >= gang.attempt) return;
  const WorkerProgress& p = *rank0_;
  if (!p.steps || *p.steps < static_cast<double>(options_.autotune_warmup_steps) ||
      p.phase_seconds.empty())
    return;
  std::map<std::string, double> measured;
  for (const auto& [phase, total] : p.phase_seconds) measured[phase] = total / *p.steps;
  const api::Plan& plan = *gang.plan;
  at.evaluated_attempt = gang.attempt;
  at.measured_step_seconds = status_.progress.step_seconds;

  // The figures the plan's nodes have now (with the stored profiles), refit by what they did.
  std::string profiles_hash;
  const std::vector<api::MeasuredProfile> profiles = stored_profiles(profiles_hash);
  std::optional<api::Inventory> inventory;
  std::string inventory_hash;
  with_inventory([&](const PlannerInventory& inv) {
    inventory = inv.free;
    inventory_hash = inv.fingerprint;
  });
  api::apply_measured_profiles(*inventory, profiles);
  const api::Node* node = nullptr;
  for (const api::Node& n : inventory->nodes)
    if (!plan.placement.empty() && n.name == plan.placement[0]) node = &n;
  if (!node) return;  // the node is gone: a restart will re-plan
  const bool cpu_on_gpu_node = plan.device == api::DeviceKind::kCpu && !node->is_cpu_node();
  if (cpu_on_gpu_node) {
    at.message = "autotune folds back only the figures of the node kind a plan's ranks run on; "
                 "a CPU job on GPU nodes keeps its plan";
    status_.autotune = at;
    return;
  }
  // The ratios are against the running configuration predicted with the figures as they are
  // now: the profile may have changed since the plan was made (another job's fold-back).
  const std::optional<api::Plan> now = planner::predict_again(job, plan, *inventory);
  const api::Prediction& predicted = now ? now->predicted : plan.predicted;
  const planner::Refit refit =
      planner::refit(node->hardware, predicted.time, predicted.step_seconds, measured);
  planner::apply_scales(*inventory, refit.profile);
  save_profile(refit, job.spec.training.steps, p.steps.value_or(0));
  const int64_t steps_left = job.spec.training.steps - status_.progress.step;
  const planner::AutotuneDecision d =
      planner::decide(job, plan, *inventory, steps_left,
                      static_cast<double>(options_.autotune_restart_cost.count()));
  if (d.current) at.refit_step_seconds = for_display(d.current->predicted.step_seconds);
  if (d.best) at.best_step_seconds = for_display(d.best->predicted.step_seconds);
  std::string changes;
  for (const std::string& c : refit.changes) changes += (changes.empty() ? "" : "; ") + c;
  at.message = d.reason + (changes.empty() ? "" : " (measured/predicted: " + changes + ")");
  if (d.switch_plan && at.switches >= options_.autotune_max_switches)
    at.message += "; kept: this job made the " + std::to_string(at.switches) +
                  " switch(es) allowed (--autotune-max-switches)";
  if (!d.switch_plan || at.switches >= options_.autotune_max_switches) {
    status_.autotune = at;
    return;
  }
  ++at.switches;
  status_.autotune = at;
  const api::Plan& next = *d.best;
  const std::string message = "autotune: " + describe_config(plan) + " -> " +
                              describe_config(next) + "; " + at.message + "; switch " +
                              std::to_string(at.switches) + " of at most " +
                              std::to_string(options_.autotune_max_switches);
  record_plan_change("Autotune", message, plan.plan_hash, d.current->predicted.step_seconds, next,
                     status_.progress.step_seconds);
  // The new attempt and plan first (the ConfigMap), then the old gang goes: stopped between
  // the two, the next reconcile finds only pods of an old attempt and replaces them.
  ++gang.attempt;
  Object want = render_plan_config_map(object_, next, generation_,
                                       inventory_hash + profiles_hash, gang.attempt);
  Object update = *gang.config_map;
  const Object old_annotations = update["metadata"].value("annotations", Object::object());
  update["metadata"]["annotations"] = want["metadata"]["annotations"];
  if (old_annotations.contains(kRestartsAnnotation))
    update["metadata"]["annotations"][kRestartsAnnotation] = old_annotations[kRestartsAnnotation];
  update["data"] = want["data"];
  gang.config_map = client_.update(kube::kConfigMaps, ns_, update);
  for (const auto& [rank, pod] : gang.pods) delete_pod(pod);
  gang.pods.clear();
  status_.plan = summarize(next);
  status_.workers = {static_cast<int64_t>(next.placement.size()), 0, 0, 0};
  set_phase(JobPhase::kRestarting);
  set_condition("Restarting", true, "Autotune", message);
  set_condition("Running", false, "Autotune", "");
  set_condition("PodsReady", false, "Autotune", "");
  event("Normal", "Replanned", message);
  result.requeue_after = milliseconds(500);
}

// The kind's profile ConfigMap gets the refit scales: the one the nodes took their figures
// from (its provenance and measurements kept), else kubetrain-profile-<kind>, created from the
// node's figures. Where the scales came from is added to the provenance.
void Controller::Pass::save_profile(const planner::Refit& refit, int64_t steps, double measured) {
  if (refit.changes.empty()) return;
  api::MeasuredProfile doc;
  std::string name = profile_config_map_name(refit.profile.name);
  if (const auto it = stored_by_kind_.find(refit.profile.name); it != stored_by_kind_.end()) {
    name = it->second.first;
    doc = it->second.second;
  } else {
    doc.provenance = {{"command", "kubetrain-operator autotune"}};
  }
  doc.profile = refit.profile;
  doc.provenance["foldedBackFrom"] = ns_ + "/" + name_;
  doc.provenance["foldedBackAt"] = rfc3339(now_);
  doc.measurements["foldedBackSteps"] = measured;
  doc.measurements["foldedBackJobSteps"] = static_cast<double>(steps);
  Object want = {{"apiVersion", "v1"},
                 {"kind", "ConfigMap"},
                 {"metadata",
                  {{"name", name},
                   {"namespace", ns_},
                   {"labels", {{kHardwareProfileLabel, kind_label(refit.profile.name)}}}}},
                 {"data", {{kProfileKey, api::json_to_yaml(api::to_json(doc))}}}};
  try {
    Object existing = client_.get(kube::kConfigMaps, ns_, name);
    existing["data"][kProfileKey] = want["data"][kProfileKey];
    client_.update(kube::kConfigMaps, ns_, existing);
  } catch (const ApiError& e) {
    if (!e.not_found()) throw;
    try {
      client_.create(kube::kConfigMaps, ns_, want);
    } catch (const ApiError& create_error) {
      if (!create_error.already_exists()) throw;  // another job's fold-back won: next time
    }
  }
}

// The node kinds a job could run on that no ConfigMap of the namespace profiles — "cpu" for a
// CPU job (measured on its node with the most cores), else each GPU product's kind (on its node
// with the most GPUs: NCCL is measured between two of them) — each with the node to measure it on.
std::map<std::string, const api::Node*> Controller::Pass::unprofiled_kinds(
    const api::TrainingJob& job, const api::Inventory& nodes) const {
  const bool gpus = std::any_of(nodes.nodes.begin(), nodes.nodes.end(),
                                [](const api::Node& n) { return !n.is_cpu_node(); });
  const bool cpu_job = job.spec.resources.cpu_only || !gpus;
  std::map<std::string, const api::Node*> targets;  // kind -> the node to measure it on
  for (const api::Node& n : nodes.nodes) {
    if (!n.schedulable || n.is_cpu_node() != cpu_job) continue;
    std::string kind = "cpu";
    if (!cpu_job) {
      const api::HardwareProfile* builtin = api::find_profile(n.gpu_product);
      if (!builtin) continue;  // the planner names it; nothing to profile as
      kind = builtin->name;
    }
    if (stored_by_kind_.count(kind)) continue;
    const api::Node*& target = targets[kind];
    if (!target || (cpu_job ? n.cpu_cores > target->cpu_cores : n.gpu_count > target->gpu_count))
      target = &n;
  }
  return targets;
}

// Profiling pods (ControllerOptions::profiling) for unprofiled_kinds. Returns why the job waits,
// or nothing when planning may go on (every kind profiled now — `stored` — or profiling failed or
// timed out, or nothing to profile).
std::optional<std::string> Controller::Pass::profile_node_kinds(const api::TrainingJob& job,
                                                                const api::Inventory& nodes,
                                                                bool& stored) {
  std::string waiting;
  for (const auto& [kind, target] : unprofiled_kinds(job, nodes)) {
    bool kind_stored = false;
    if (const auto why = profile_kind(kind, *target, job, kind_stored))
      waiting += (waiting.empty() ? "" : "; ") + *why;
    stored |= kind_stored;
  }
  if (waiting.empty()) return std::nullopt;
  return waiting;
}

// One node kind's profiling pod (profile_node_kinds): creates it, or reads what it returned into
// the kind's ConfigMap (`stored`), or gives up on it. Returns why the job waits, if it does.
std::optional<std::string> Controller::Pass::profile_kind(const std::string& kind,
                                                          const api::Node& target,
                                                          const api::TrainingJob& job,
                                                          bool& stored) {
  const std::string pod_name = profile_config_map_name(kind);
  std::optional<Object> pod;
  kube::ListOptions by_kind;  // a LIST (which the operator's role has), not a GET
  by_kind.label_selector = std::string(kProfilingLabel) + "=" + kind_label(kind);
  for (const Object& p : client_.list(kube::kPods, ns_, by_kind).items)
    if (p["metadata"].value("name", "") == pod_name) pod = p;
  if (!pod) {
    const auto host = target.labels.find("kubernetes.io/hostname");
    ProfilingTarget where;
    where.kind = kind;
    where.label = kind_label(kind);
    where.hostname = host != target.labels.end() ? host->second : target.name;
    where.gpus = target.gpu_count;
    const Object want =
        render_profiling_pod(ns_, pod_name, where, job.spec.resources.image,
                             options_.profiling_quick, rfc3339(now_), options_.children);
    try {
      client_.create(kube::kPods, ns_, want);
    } catch (const ApiError& e) {
      if (!e.already_exists()) throw;  // another job's reconcile created it
    }
    event("Normal", "ProfilingNodes",
          "no hardware profile of node kind " + kind + " in " + ns_ + ": measuring one on " +
              target.name + " (pod " + pod_name + ") before planning");
    return "measuring node kind " + kind + " on " + target.name + " (pod " + pod_name + ")";
  }
  const Object status = pod->value("status", Object::object());
  const std::string phase = status.value("phase", "Pending");
  if (phase == "Succeeded") {
    const std::string message = termination_message(*pod);
    try {
      api::MeasuredProfile measured = api::decode_measured_profile(
          api::parse_json(message, "pod " + pod_name + " termination message"));
      if (measured.profile.name != kind)
        throw kt::Error("it profiles node kind " + measured.profile.name + ", not " + kind);
      measured.provenance["profilingPod"] = ns_ + "/" + pod_name;
      Object cm = {{"apiVersion", "v1"},
                   {"kind", "ConfigMap"},
                   {"metadata",
                    {{"name", profile_config_map_name(kind)},
                     {"namespace", ns_},
                     {"labels", {{kHardwareProfileLabel, kind_label(kind)}}}}},
                   {"data", {{kProfileKey, api::json_to_yaml(api::to_json(measured))}}}};
      try {
        client_.create(kube::kConfigMaps, ns_, cm);
      } catch (const ApiError& e) {
        if (!e.already_exists()) throw;
        // One that does not decode (else no profiling would have run): the measurement wins.
        Object existing = client_.get(kube::kConfigMaps, ns_, profile_config_map_name(kind));
        existing["metadata"]["labels"][kHardwareProfileLabel] = kind_label(kind);
        existing["data"][kProfileKey] = cm["data"][kProfileKey];
        client_.update(kube::kConfigMaps, ns_, existing);
      }
      client_.remove(kube::kPods, ns_, pod_name, kube::Propagation::Background);
      stored = true;
      event("Normal", "Profiled",
            "node kind " + kind + " measured on " + target.name + " (" + measured.profile.source +
                "), stored in ConfigMap " + ns_ + "/" + profile_config_map_name(kind) +
                "; planning with it");
    } catch (const kt::Error& e) {
      event("Warning", "ProfilingFailed",
            "pod " + pod_name + " ended without a usable profile: " + e.what() +
                " (planned with the built-in figures; delete the pod to profile again)");
    }
    return std::nullopt;
  }
  if (phase == "Failed") {
    const auto code = exit_code(*pod);
    event("Warning", "ProfilingFailed",
          "pod " + pod_name + " failed" +
              (code ? " with exit code " + std::to_string(*code) : std::string()) +
              " (planned with the built-in figures; kubectl logs " + pod_name +
              "; delete the pod to profile again)");
    return std::nullopt;
  }
  // Timed from the operator's own clock (the annotation), not the API server's.
  const auto created = parse_rfc3339(pod->at("metadata")
                                         .value("annotations", Object::object())
                                         .value(kProfilingStartedAnnotation, ""));
  if (created && now_ - *created > options_.profiling_timeout) {
    client_.remove(kube::kPods, ns_, pod_name, kube::Propagation::Background);
    event("Warning", "ProfilingFailed",
          "pod " + pod_name + " did not finish within " +
              std::to_string(options_.profiling_timeout.count()) +
              " s (deleted; planned with the built-in figures)");
    return std::nullopt;
  }
  return "measuring node kind " + kind + " (pod " + pod_name + " " + phase + ")";
}

// One reconcile, as the list of its steps; each says in its comment what it decides.
ReconcileResult Controller::Pass::run() {
  api::TrainingJob job;
  if (Outcome invalid = validate(job)) return *invalid;
  if (finished_before()) return finished(job);
  reopen_if_spec_fixed();
  warn_if_checkpoints_are_ephemeral(job);

  const api::RunPolicy& policy = job.spec.run_policy;
  const std::vector<Object> pods = list_pods();
  if (Outcome suspended = suspend(policy, pods)) return *suspended;
  resume_if_suspended();
  if (deadline_exceeded(policy)) return finished(job);

  ReconcileResult result;
  Gang gang = read_attempt(pods);
  if (Outcome no_plan = plan(job, gang, result)) return *no_plan;
  ensure_service();
  ensure_checkpoint_claim(job, *gang.plan);
  classify(gang, pods);
  if (Outcome given_up = restart_or_fail(job, gang, result)) return *given_up;
  if (all_succeeded(job, gang)) return finished(job);
  create_missing(job, gang, result);
  service_created();
  report_progress(job, gang, result);
  autotune(job, gang, result);
  requeue_at_deadline(policy, result);
  write_status();
  return result;
}

// Validate: decodes the spec into `job`; an invalid one fails the job (InvalidSpec) once per
// generation. The CRD schema catches most of this earlier.
Controller::Pass::Outcome Controller::Pass::validate(api::TrainingJob& job) {
  Object manifest = object_;
  manifest.erase("status");
  std::vector<FieldError> errors = api::check_training_job(manifest, job);
  // The spec may leave the gang scheduler to the operator, whose default may be Kueue.
  if (errors.empty() && gang_scheduler(job, options_.children) == api::GangScheduler::kKueue &&
      api::queue_name(job).empty())
    errors.emplace_back("spec.runPolicy.schedulingPolicy.queue",
                        std::string("required: this operator gang-schedules with Kueue "
                                    "(--gang-scheduler), so the job needs a LocalQueue here or "
                                    "the label ") +
                            api::kKueueQueueLabel);
  if (errors.empty()) return std::nullopt;
  if (status_.phase == JobPhase::kFailed && condition_reason("Failed") == "InvalidSpec" &&
      old_status_.observed_generation == generation_)
    return ReconcileResult{};
  std::string message;
  for (const auto& e : errors) message += (message.empty() ? "" : "; ") + std::string(e.what());
  status_.completion_time.clear();
  set_condition("Planned", false, "InvalidSpec", message);
  finish(JobPhase::kFailed, "InvalidSpec", message, api::CleanPodPolicy::kRunning);
  write_status();
  return ReconcileResult{};
}

// A job failed for its spec runs again once the spec is fixed (a new generation).
bool Controller::Pass::failed_for_old_spec() const {
  return status_.phase == JobPhase::kFailed && condition_reason("Failed") == "InvalidSpec" &&
         old_status_.observed_generation != generation_;
}

// Finish: a Succeeded or Failed job stays so (only its pods are cleaned and its TTL runs).
bool Controller::Pass::finished_before() const {
  const bool terminal = status_.phase == JobPhase::kSucceeded || status_.phase == JobPhase::kFailed;
  return terminal && !failed_for_old_spec();
}

// A new job is Pending; one failed for a spec since fixed starts again from Pending.
void Controller::Pass::reopen_if_spec_fixed() {
  if (failed_for_old_spec()) {
    status_.completion_time.clear();
    clear_condition("Failed", "SpecChanged");
    status_.phase.reset();
  }
  if (!status_.phase) set_phase(JobPhase::kPending);
}

// Suspend: a suspended job runs nothing (its pods are deleted; plan and checkpoints stay).
Controller::Pass::Outcome Controller::Pass::suspend(const api::RunPolicy& policy,
                                                    const std::vector<Object>& pods) {
  if (!policy.suspend) return std::nullopt;
  for (const auto& pod : pods) delete_pod(pod);
  set_phase(JobPhase::kSuspended);
  set_condition("Suspended", true, "Suspended", "the job is suspended (runPolicy.suspend)");
  set_condition("Running", false, "Suspended", "");
  set_condition("PodsReady", false, "Suspended", "");
  status_.workers.ready = 0;
  status_.workers.succeeded = status_.workers.failed = 0;
  write_status();
  return ReconcileResult{};
}

// A resumed job starts again from Pending, its deadline counted from the resume.
void Controller::Pass::resume_if_suspended() {
  if (!has_condition("Suspended", true)) return;
  set_condition("Suspended", false, "Resumed", "the job was resumed");
  status_.start_time.clear();  // the deadline counts from the resume, as for batch/v1 Jobs
  set_phase(JobPhase::kPending);
}

// Deadline: a job running longer than activeDeadlineSeconds fails (DeadlineExceeded).
bool Controller::Pass::deadline_exceeded(const api::RunPolicy& policy) {
  if (!policy.active_deadline_seconds || status_.start_time.empty()) return false;
  const auto started = parse_rfc3339(status_.start_time).value_or(now_);
  const auto deadline = plus_seconds(started, *policy.active_deadline_seconds);
  if (now_ < deadline) return false;
  finish(JobPhase::kFailed, "DeadlineExceeded",
         "the job ran longer than activeDeadlineSeconds (" +
             std::to_string(*policy.active_deadline_seconds) + " s)",
         policy.clean_pod_policy);
  return true;
}

// The attempt and the restart count as the plan ConfigMap records them (0 before the first plan).
Controller::Pass::Gang Controller::Pass::read_attempt(const std::vector<Object>& pods) {
  Gang gang;
  gang.config_map = get_config_map();
  if (gang.config_map) {
    const Object annotations =
        gang.config_map->at("metadata").value("annotations", Object::object());
    gang.attempt = to_int(annotations.value(kAttemptAnnotation, ""), 0);
    status_.restarts =
        std::max(status_.restarts, to_int(annotations.value(kRestartsAnnotation, ""), 0));
  }
  bool all_unschedulable = true;
  for (const Object& p : pods) {
    if (to_int(label(p, kRestartAttemptLabel), -1) != gang.attempt) continue;
    gang.attempt_ranks.insert(to_int(label(p, kNodeRankLabel), -1));
    bool unschedulable = false;
    if (phase_of(p) == "Pending")
      for (const Object& c : p.value("status", Object::object()).value("conditions", Object::array()))
        unschedulable |= c.is_object() && c.value("type", Object("")) == Object("PodScheduled") &&
                         c.value("status", Object("")) == Object("False") &&
                         c.value("reason", Object("")) == Object("Unschedulable");
    all_unschedulable = all_unschedulable && unschedulable;
  }
  gang.attempt_pods_exist = !gang.attempt_ranks.empty();
  gang.attempt_unschedulable = gang.attempt_pods_exist && all_unschedulable;
  return gang;
}

// Plan: the plan the gang runs (plan_for says when it is made anew); none ends the reconcile,
// Pending (waiting for resources) or Failed (no feasible plan).
Controller::Pass::Outcome Controller::Pass::plan(const api::TrainingJob& job, Gang& gang,
                                                 ReconcileResult& result) {
  if (status_.phase == JobPhase::kPending) set_phase(JobPhase::kPlanning);
  // A gang none of whose pods can be scheduled is planned again for the cluster as it is now
  // (a new attempt, not a restart, when the plan changes); otherwise it keeps its plan.
  replanning_unschedulable_ = gang.attempt_unschedulable;
  gang.plan = plan_for(job, gang, gang.attempt_pods_exist && !gang.attempt_unschedulable, result);
  replanning_unschedulable_ = false;
  if (!gang.plan) return without_plan(job, result);
  if (!status_.plan) status_.plan = summarize(*gang.plan);
  gang.desired = static_cast<int64_t>(gang.plan->placement.size());
  return std::nullopt;
}

ReconcileResult Controller::Pass::without_plan(const api::TrainingJob& job,
                                               const ReconcileResult& result) {
  if (status_.phase == JobPhase::kFailed) return finished(job);
  write_status();
  return result;
}

// Classify the gang: pods of older attempts go; the attempt's pods are counted by phase and
// the failure to act on is picked.
void Controller::Pass::classify(Gang& gang, const std::vector<Object>& pods) {
  for (const auto& pod : pods) {
    if (to_int(label(pod, kRestartAttemptLabel), -1) != gang.attempt)
      delete_pod(pod);
    else
      gang.pods[to_int(label(pod, kNodeRankLabel), -1)] = pod;
  }
  status_.workers = {gang.desired, 0, 0, 0};
  for (const auto& [rank, pod] : gang.pods) {
    const std::string phase = phase_of(pod);
    if (phase == "Succeeded") ++status_.workers.succeeded;
    if (phase == "Failed") {
      ++status_.workers.failed;
      if (!gang.failed || evicted(*gang.failed)) gang.failed = pod;
    }
    if (phase == "Running" && condition_true(pod, "Ready")) ++status_.workers.ready;
  }
}

// Restart: a failed worker restarts the whole gang as a new attempt (re-planned if the
// inventory changed), or fails the job when the failure is permanent or the backoff is spent.
Controller::Pass::Outcome Controller::Pass::restart_or_fail(const api::TrainingJob& job, Gang& gang,
                                                            ReconcileResult& result) {
  if (!gang.failed) return std::nullopt;
  const api::RunPolicy& policy = job.spec.run_policy;
  const std::string pod_name = (*gang.failed)["metadata"]["name"];
  const bool was_evicted = evicted(*gang.failed);
  const auto code = exit_code(*gang.failed);
  // Rank 0's last word on its checkpoints (whether it exited on its own or was stopped).
  if (gang.pods.count(0))
    checkpoint_health(parse_worker_progress(termination_message(gang.pods[0])));
  // The container's own account: the kubelet's reason (OOMKilled) and the worker's error line in
  // its termination message (`# error: ...`, worker/main.cpp).
  std::string why;
  const Object statuses =
      (*gang.failed).value("status", Object::object()).value("containerStatuses", Object::array());
  if (statuses.is_array() && !statuses.empty() && statuses[0].is_object()) {
    const Object terminated =
        statuses[0].value("state", Object::object()).value("terminated", Object::object());
    if (terminated.is_object() && terminated.value("reason", Object("")) == Object("OOMKilled"))
      why = " (OOMKilled: over its limits.memory)";
  }
  const std::string last_words = termination_message(*gang.failed);
  if (const auto at = last_words.find("# error: "); at != std::string::npos)
    why += ": " + last_words.substr(at + 9, last_words.find('\n', at) - at - 9);
  const std::string what =
      was_evicted ? "pod " + pod_name + " was evicted"
                  : "pod " + pod_name + " failed" +
                        (code ? " with exit code " + std::to_string(*code) : std::string()) + why;
  // Exit codes 1-127 are the program's own verdict (bad data, a bug): permanent. 128+ are
  // signals (OOM kill, node shutdown, preemption): retryable.
  const bool retryable = was_evicted || !code || *code >= 128;
  if (!retryable) {
    finish(JobPhase::kFailed, "WorkerFailed", what + " (exit codes 1-127 are permanent)",
           policy.clean_pod_policy);
    return finished(job);
  }
  if (!was_evicted && status_.restarts >= policy.backoff_limit) {
    finish(JobPhase::kFailed, "BackoffLimitExceeded",
           what + "; the job was restarted " + std::to_string(status_.restarts) +
               " time(s), backoffLimit is " + std::to_string(policy.backoff_limit),
           policy.clean_pod_policy);
    return finished(job);
  }
  // The attempt moves first (in the ConfigMap, with the restart count): if we stop between
  // the writes, the next reconcile sees only pods of an old attempt and replaces them, without
  // counting twice, and takes the count from the ConfigMap.
  ++gang.attempt;
  gang.attempt_ranks.clear();
  gang.rendered.clear();
  if (!was_evicted) ++status_.restarts;
  Object update = *gang.config_map;
  update["metadata"]["annotations"][kAttemptAnnotation] = std::to_string(gang.attempt);
  update["metadata"]["annotations"][kRestartsAnnotation] = std::to_string(status_.restarts);
  gang.config_map = client_.update(kube::kConfigMaps, ns_, update);
  if (options_.metrics) options_.metrics->jobs_restarted_total.inc();
  const std::string reason = was_evicted ? "Evicted" : "WorkerFailed";
  const std::string message = what + "; restarting the whole gang (attempt " +
                              std::to_string(gang.attempt) + ", restarts " +
                              std::to_string(status_.restarts) + " of " +
                              std::to_string(policy.backoff_limit) + ")";
  set_phase(JobPhase::kRestarting);
  set_condition("Restarting", true, reason, message);
  set_condition("Running", false, reason, "");
  set_condition("PodsReady", false, reason, "");
  event("Warning", "Restarting", message);
  for (const auto& [rank, pod] : gang.pods) delete_pod(pod);
  gang.pods.clear();
  gang.failed.reset();
  // The new gang runs on the cluster as it is now: plan again if the inventory changed.
  gang.plan = plan_for(job, gang, false, result);
  if (!gang.plan) return without_plan(job, result);
  gang.desired = static_cast<int64_t>(gang.plan->placement.size());
  status_.workers = {gang.desired, 0, 0, 0};
  return std::nullopt;
}

// Success: every worker of the attempt completed; the job takes rank 0's final progress.
bool Controller::Pass::all_succeeded(const api::TrainingJob& job, Gang& gang) {
  if (gang.desired == 0 || status_.workers.succeeded != gang.desired) return false;
  const int64_t asked = job.spec.training.steps;
  // The steps trained: the job's step where rank 0 stopped, which is more than asked when the
  // spec lowered its steps below the progress while it ran (a resumed gang stops at once).
  int64_t trained = std::max(asked, status_.progress.step);
  status_.progress.eta_seconds = 0;
  // Rank 0's final progress, from its termination message (its /metrics is gone).
  if (gang.pods.count(0)) {
    const WorkerProgress last = parse_worker_progress(termination_message(gang.pods[0]));
    if (last.loss) status_.progress.loss = for_display(*last.loss);
    if (last.tokens_per_second)
      status_.progress.tokens_per_second = for_display(*last.tokens_per_second);
    if (last.step) trained = std::max(asked, static_cast<int64_t>(*last.step));
    if (last.last_checkpoint_step)
      trained = std::max(trained, static_cast<int64_t>(*last.last_checkpoint_step));
    checkpoint_health(last);
  }
  status_.progress.step = trained;
  std::string message = "all " + std::to_string(gang.desired) + " worker(s) completed " +
                        std::to_string(trained) + " steps";
  if (trained > asked)
    message += " (spec.training.steps was lowered to " + std::to_string(asked) +
               " while the job ran, after step " + std::to_string(asked) + " had passed)";
  finish(JobPhase::kSucceeded, "Succeeded", message, job.spec.run_policy.clean_pod_policy);
  return true;
}

// Create what is missing: the attempt's absent pods, up to options_.max_concurrent_creates at
// once (a gang of 1,000 nodes must not wait for 1,000 round trips in a row). The first error
// stops further creates and is the reconcile's error, once those in flight have returned.
void Controller::Pass::create_missing(const api::TrainingJob& job, Gang& gang,
                                      ReconcileResult& result) {
  std::vector<int64_t> missing;
  for (int64_t rank = 0; rank < gang.desired; ++rank)
    if (!gang.pods.count(rank)) missing.push_back(rank);
  if (missing.empty()) return;
  require_live_job();
  if (!ensure_pod_group(job, gang, result)) return;
  // A pod of a gang that was already up is gone without a failure of its own (deleted by hand,
  // or by something else): it is made again, and said so.
  if (!status_.start_time.empty() &&
      (status_.phase == JobPhase::kRunning || status_.phase == JobPhase::kStarting)) {
    std::string names;
    for (const int64_t rank : missing)
      names += (names.empty() ? "" : ", ") + worker_pod_name(name_, rank);
    event("Warning", "WorkerPodRecreated",
          "worker pod(s) " + names + " of attempt " + std::to_string(gang.attempt) +
              " disappeared without failing (deleted?); creating them again");
  }

  struct Created {
    std::optional<Object> pod;
    bool name_taken = false;  // a pod of the old attempt still terminating holds the name
  };
  std::vector<Created> created(missing.size());
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr first_error;
  std::mutex error_mutex;
  const auto create_some = [&] {
    for (size_t i = next++; i < missing.size() && !failed; i = next++) {
      try {
        // As reserved when there is a reservation (no second render, no copy).
        const auto rendered = gang.rendered.find(missing[i]);
        created[i].pod =
            rendered != gang.rendered.end()
                ? client_.create(kube::kPods, ns_, rendered->second)
                : client_.create(kube::kPods, ns_,
                                 render_worker_pod(object_, job, *gang.plan, missing[i],
                                                   gang.attempt, options_.children));
        // Counted at once: the next job's plan may come before the pod informer's event.
        if (options_.inventory) options_.inventory->expect(*created[i].pod);
      } catch (const ApiError& e) {
        if (e.already_exists()) {
          created[i].name_taken = true;
          continue;
        }
        std::lock_guard lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
        failed = true;
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
        failed = true;
      }
    }
  };
  // This thread creates too; the others are started only when there is more than one pod.
  const size_t threads_wanted =
      std::min(missing.size(), static_cast<size_t>(std::max(1, options_.max_concurrent_creates)));
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < threads_wanted; ++t) {
    try {
      helpers.emplace_back(create_some);
    } catch (const std::system_error&) {
      break;  // no more threads: fewer creates in flight, same result
    }
  }
  create_some();
  for (auto& helper : helpers) helper.join();
  if (first_error) std::rethrow_exception(first_error);

  bool any_created = false;
  for (size_t i = 0; i < missing.size(); ++i) {
    if (created[i].pod) {
      gang.pods[missing[i]] = std::move(*created[i].pod);
      any_created = true;
    }
    if (created[i].name_taken) result.requeue_after = milliseconds(500);  // try again shortly
  }
  if (placing_.owns_lock()) placing_.unlock();  // the next job's inventory sees these pods
  if (any_created && status_.start_time.empty()) {
    status_.start_time = rfc3339(now_);
    if (options_.metrics && status_.restarts == 0) options_.metrics->jobs_created_total.inc();
  }
}

// Gang scheduling: the gang's PodGroup exists, sized to this plan, before its pods are made
// (looked at only when pods are missing, so a steady state costs no request). False when the
// cluster does not serve the PodGroup API: no pod is made (a gang half-scheduled by a scheduler
// that ignores the group is what gang scheduling is for); said in an event and a condition.
bool Controller::Pass::ensure_pod_group(const api::TrainingJob& job, const Gang& gang,
                                        ReconcileResult& result) {
  const api::GangScheduler scheduler = gang_scheduler(job, options_.children);
  const kube::Resource* resource = pod_group_resource(scheduler);
  if (!resource) return true;
  const Object want = render_pod_group(object_, job, *gang.plan, options_.children);
  try {
    client_.create(*resource, ns_, want);
  } catch (const ApiError& e) {
    if (e.already_exists()) {
      // Ours from an earlier attempt: a re-plan may have changed the gang's size.
      Object have = client_.get(*resource, ns_, name_);
      const Object spec = have.value("spec", Object::object());
      bool same = true;
      for (const auto& [key, value] : want["spec"].items())
        same = same && spec.contains(key) && spec[key] == value;
      if (!same) {
        for (const auto& [key, value] : want["spec"].items()) have["spec"][key] = value;
        client_.update(*resource, ns_, have);
      }
    } else if (e.code() == 404) {
      const std::string message =
          "gangScheduler " + std::string(api::to_string(scheduler)) + " needs the PodGroup API " +
          resource->api_version() + " (" +
          (scheduler == api::GangScheduler::kVolcano ? "Volcano" : "scheduler-plugins") +
          "), which this cluster does not serve: no worker pod is created until it does";
      if (!has_condition("GangScheduling", false)) event("Warning", "PodGroupUnavailable", message);
      set_condition("GangScheduling", false, "PodGroupUnavailable", message);
      result.requeue_after = std::chrono::seconds(30);
      return false;
    } else {
      throw;
    }
  }
  set_condition("GangScheduling", true, std::string(api::to_string(scheduler)),
                "PodGroup " + name_ + " (minMember " + std::to_string(gang.desired) + ")");
  return true;
}

// Report progress: Running with rank 0's progress once every worker is ready (looked at again
// every progress_interval), else Starting (or still Restarting) with the count of ready ones.
void Controller::Pass::report_progress(const api::TrainingJob& job, Gang& gang,
                                       ReconcileResult& result) {
  const int64_t desired = gang.desired;
  if (status_.workers.ready == desired && desired > 0) {
    if (status_.phase != JobPhase::kRunning && options_.metrics) {
      if (const auto created_at = parse_rfc3339(object_["metadata"].value("creationTimestamp", "")))
        if (!has_condition("Running", true) && status_.restarts == 0)
          options_.metrics->time_to_running_seconds.observe(
              std::chrono::duration<double>(now_ - *created_at).count());
    }
    set_phase(JobPhase::kRunning);
    set_condition("PodsReady", true, "AllWorkersReady",
                  std::to_string(desired) + "/" + std::to_string(desired) + " workers ready");
    set_condition("Running", true, "Training",
                  "training step " + std::to_string(status_.progress.step) + " of " +
                      std::to_string(job.spec.training.steps));
    clear_condition("Restarting", "Recovered");
    if (gang.pods.count(0)) progress(job, *gang.plan, gang.pods[0]);
    set_condition("Running", true, "Training",
                  "training step " + std::to_string(status_.progress.step) + " of " +
                      std::to_string(job.spec.training.steps));
    const milliseconds interval = options_.progress_interval;
    if (!result.requeue_after || *result.requeue_after > interval) result.requeue_after = interval;
  } else {
    if (status_.phase != JobPhase::kRestarting) set_phase(JobPhase::kStarting);
    // Gated pods (Kueue's admission gate, or anyone's) are waited for like any Pending pod,
    // never counted as failures; the condition says who holds them.
    int64_t gated = 0;
    std::set<std::string> gates;
    for (const auto& [rank, pod] : gang.pods)
      if (pod.contains("spec") && pod["spec"].contains("schedulingGates") &&
          pod["spec"]["schedulingGates"].is_array() && !pod["spec"]["schedulingGates"].empty()) {
        ++gated;
        for (const auto& g : pod["spec"]["schedulingGates"])
          if (g.is_object()) gates.insert(g.value("name", ""));
      }
    std::string message =
        std::to_string(status_.workers.ready) + "/" + std::to_string(desired) + " workers ready";
    if (gated > 0) {
      std::string names;
      for (const auto& g : gates) names += (names.empty() ? "" : ", ") + g;
      message += "; " + std::to_string(gated) + " waiting for admission (scheduling gates: " +
                 names + ")";
    }
    set_condition("PodsReady", false, gated > 0 ? "WaitingForAdmission" : "WaitingForWorkers",
                  message);
  }
}

// Look again when the deadline passes.
void Controller::Pass::requeue_at_deadline(const api::RunPolicy& policy, ReconcileResult& result) {
  if (!policy.active_deadline_seconds || status_.start_time.empty()) return;
  const auto deadline = plus_seconds(parse_rfc3339(status_.start_time).value_or(now_),
                                     *policy.active_deadline_seconds);
  const milliseconds left = until_from(now_, deadline);
  if (!result.requeue_after || *result.requeue_after > left) result.requeue_after = left;
}

Controller::Controller(kube::Client& client, ControllerOptions options)
    : client_(client), options_(std::move(options)) {
  // The error count from 0, as controller-runtime's (a rate of it then reads 0, not "no data").
  if (options_.metrics) options_.metrics->reconcile_errors_total.with({options_.name});
}

ReconcileResult Controller::reconcile(const std::string& ns, const std::string& name) {
  const auto started = std::chrono::steady_clock::now();
  auto observe = [&](const std::string& result) {
    if (!options_.metrics) return;
    options_.metrics->reconcile_total.with({options_.name, result}).inc();
    options_.metrics->reconcile_time_seconds.with({options_.name})
        .observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  };
  try {
    Object job;
    try {
      job = client_.get(kube::kTrainingJobs, ns, name);
    } catch (const ApiError& e) {
      if (!e.not_found()) throw;
      if (options_.metrics) options_.metrics->record_job(ns, name, "", 0);
      observe("success");
      return {};  // deleted: its children go with it (ownerReferences)
    }
    if (job["metadata"].contains("deletionTimestamp")) {
      observe("success");
      return {};
    }
    Pass pass(client_, options_, *placement_mutex_, std::move(job));
    ReconcileResult result;
    try {
      result = pass.run();
    } catch (const JobGone&) {
      observe("success");
      return {};  // deleted since the cache's copy was read: nothing is created for it
    }
    if (options_.metrics) options_.metrics->record_job(ns, name, pass.phase(), pass.restarts());
    observe(result.requeue_after ? "requeue_after" : "success");
    return result;
  } catch (...) {
    observe("error");
    if (options_.metrics) options_.metrics->reconcile_errors_total.with({options_.name}).inc();
    throw;
  }
}

}  // namespace kt::controller

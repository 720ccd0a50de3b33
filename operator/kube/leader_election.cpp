#include "operator/kube/leader_election.h"

#include <cstdio>
#include <ctime>

#include "api/error.h"

namespace kt::kube {
namespace {

// metav1.MicroTime: RFC 3339 with microseconds, UTC.
std::string micro_time_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
      1'000'000;
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[64];
  std::snprintf(text, sizeof(text), "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", utc.tm_year + 1900,
                utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                static_cast<long long>(micros));
  return text;
}

int whole_seconds(std::chrono::milliseconds duration) {
  return std::max(1, static_cast<int>((duration.count() + 999) / 1000));
}

}  // namespace

LeaderElector::LeaderElector(Client& client, LeaderElectionConfig config)
    : client_(client), config_(std::move(config)) {
  KT_CHECK(!config_.lease_name.empty() && !config_.identity.empty(),
           "leader election needs a lease name and an identity");
  KT_CHECK(config_.lease_duration > config_.renew_deadline &&
               config_.renew_deadline > config_.retry_period,
           "leader election needs lease_duration > renew_deadline > retry_period");
  if (config_.metrics) config_.metrics->leader_election_master_status.with({config_.lease_name});
}

LeaderElector::~LeaderElector() {
  stop();
}

void LeaderElector::start() {
  KT_CHECK(!thread_.joinable(), "LeaderElector::start called twice");
  thread_ = std::thread([this] { run(); });
}

void LeaderElector::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    stop_cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

bool LeaderElector::sleep_unless_stopped(std::chrono::milliseconds duration) {
  std::unique_lock lock(mutex_);
  return !stop_cv_.wait_for(lock, duration, [&] { return stopping_; });
}

void LeaderElector::set_leading(bool leading) {
  leading_ = leading;
  if (config_.metrics) {
    config_.metrics->leader_election_master_status.with({config_.lease_name}).set(leading ? 1 : 0);
  }
  const auto& callback = leading ? config_.on_started_leading : config_.on_stopped_leading;
  if (callback) callback();
}

bool LeaderElector::try_acquire_or_renew() {
  const auto now = std::chrono::steady_clock::now();
  const std::string now_text = micro_time_now();
  try {
    Object lease;
    try {
      lease = client_.get(kLeases, config_.lease_namespace, config_.lease_name);
    } catch (const ApiError& e) {
      if (!e.not_found()) {
        log_lock_error("error retrieving resource lock", e.what());
        return false;
      }
      Object fresh = {
          {"apiVersion", "coordination.k8s.io/v1"},
          {"kind", "Lease"},
          {"metadata", {{"name", config_.lease_name}, {"namespace", config_.lease_namespace}}},
          {"spec",
           {{"holderIdentity", config_.identity},
            {"leaseDurationSeconds", whole_seconds(config_.lease_duration)},
            {"acquireTime", now_text},
            {"renewTime", now_text},
            {"leaseTransitions", 0}}}};
      own(fresh);
      const Object created = client_.create(kLeases, config_.lease_namespace, fresh);
      observed_record_ = created.value("spec", Object::object()).dump();
      observed_at_ = now;
      return true;
    }

    Object spec = lease.value("spec", Object::object());
    if (const std::string record = spec.dump(); record != observed_record_) {
      observed_record_ = record;
      observed_at_ = now;
    }
    const std::string holder = spec.value("holderIdentity", "");
    const auto duration = std::chrono::seconds(
        spec.value("leaseDurationSeconds", whole_seconds(config_.lease_duration)));
    if (!holder.empty() && holder != config_.identity && now < observed_at_ + duration) {
      return false;  // another candidate holds a lease that has not expired
    }
    if (holder != config_.identity) {
      spec["acquireTime"] = now_text;
      spec["leaseTransitions"] = spec.value("leaseTransitions", 0) + 1;
    }
    spec["holderIdentity"] = config_.identity;
    spec["leaseDurationSeconds"] = whole_seconds(config_.lease_duration);
    spec["renewTime"] = now_text;
    lease["spec"] = spec;
    own(lease);
    // update() sends metadata.resourceVersion as read: a Conflict means someone else wrote.
    const Object updated = client_.update(kLeases, config_.lease_namespace, lease);
    observed_record_ = updated.value("spec", Object::object()).dump();
    observed_at_ = now;
    return true;
  } catch (const ApiError& e) {
    // Conflict and AlreadyExists: someone else wrote first. Anything else (403, 5xx) is worth
    // a line, as client-go's "Failed to update lock"; either way, try again next period.
    if (!e.conflict() && !e.already_exists()) log_lock_error("failed to update lock", e.what());
    return false;
  } catch (const std::exception& e) {
    log_lock_error("failed to update lock", e.what());
    return false;
  }
}

void LeaderElector::own(Object& lease) {
  if (config_.owner_role.empty()) return;
  if (owner_.is_null()) {
    try {
      const Object role = client_.get(kRoles, config_.lease_namespace, config_.owner_role);
      owner_ = {{"apiVersion", kRoles.api_version()},
                {"kind", kRoles.kind},
                {"name", config_.owner_role},
                {"uid", role["metadata"].value("uid", "")}};
    } catch (const std::exception& e) {
      log_lock_error("cannot read the Lease's owner Role; the Lease is written without it",
                     e.what());
      return;
    }
  }
  Object& meta = lease["metadata"];
  if (meta.contains("ownerReferences") && meta["ownerReferences"].is_array()) {
    for (const Object& ref : meta["ownerReferences"])
      if (ref.is_object() && ref.value("uid", "") == owner_["uid"]) return;
  } else {
    meta["ownerReferences"] = Object::array();
  }
  meta["ownerReferences"].push_back(owner_);
}

void LeaderElector::log_lock_error(const char* what, const std::string& error) const {
  std::fprintf(stderr, "ts=%s level=error msg=\"%s\" lease=%s/%s err=\"%s\"\n",
               micro_time_now().c_str(), what, config_.lease_namespace.c_str(),
               config_.lease_name.c_str(), error.c_str());
}

void LeaderElector::run() {
  for (;;) {
    // Candidate: try every retry period until this one holds the lease.
    for (;;) {
      if (try_acquire_or_renew()) break;
      if (!sleep_unless_stopped(config_.retry_period)) return;
    }
    last_renewed_ = std::chrono::steady_clock::now();
    set_leading(true);

    // Leader: renew every retry period; no successful renewal for renew_deadline loses it.
    bool stopped = false;
    for (;;) {
      if (!sleep_unless_stopped(config_.retry_period)) {
        stopped = true;
        break;
      }
      if (try_acquire_or_renew()) {
        last_renewed_ = std::chrono::steady_clock::now();
      } else if (std::chrono::steady_clock::now() - last_renewed_ >= config_.renew_deadline) {
        break;
      }
    }
    if (stopped && config_.release_on_stop) {
      try {
        Object lease = client_.get(kLeases, config_.lease_namespace, config_.lease_name);
        if (lease["spec"].value("holderIdentity", "") == config_.identity) {
          lease["spec"]["holderIdentity"] = "";
          lease["spec"]["leaseDurationSeconds"] = 1;
          lease["spec"]["renewTime"] = micro_time_now();
          client_.update(kLeases, config_.lease_namespace, lease);
        }
      } catch (const std::exception&) {
        // Best effort: the lease then expires after its duration.
      }
    }
    set_leading(false);
    if (stopped) return;
  }
}

}  // namespace kt::kube

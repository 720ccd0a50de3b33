#include "worker/step_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "api/error.h"

namespace kt::worker {
namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// JSON has no NaN or Inf: a diverged loss is written as null.
nlohmann::ordered_json number(double x) {
  return std::isfinite(x) ? nlohmann::ordered_json(x) : nlohmann::ordered_json(nullptr);
}

}  // namespace

std::map<std::string, double> predicted_phase_seconds(const api::TimeBreakdown& t) {
  std::map<std::string, double> phases;
  for (const api::TimePhase& p : api::kTimePhases) phases[p.name] = t.*p.seconds;
  return phases;
}

std::map<std::string, double> PhaseMeter::step(const StepReport& r) {
  std::map<std::string, double> phases;
  double exposed = 0;
  for (const char* group : {"tp", "dp"}) {
    CommStats now;
    if (const auto it = r.comm.find(group); it != r.comm.end()) now = it->second;
    CommStats& last = last_[group];
    const double total = std::max(0.0, now.seconds - last.seconds);
    const double exposed_now = std::max(0.0, now.exposed_seconds - last.exposed_seconds);
    last = now;
    phases[std::string(group) + "_comm_total"] = total;
    phases[std::string(group) + "_comm_exposed"] = exposed_now;
    exposed += exposed_now;
  }
  if (r.transfer_seconds >= 0) {
    phases["transfer_total"] = r.transfer_seconds;
    phases["transfer_exposed"] = std::max(0.0, r.exposed_transfer_seconds);
    exposed += phases["transfer_exposed"];
  }
  phases["optimizer_gpu"] = r.optimizer_seconds;
  phases["optimizer_cpu_total"] = r.cpu_optimizer_seconds;
  phases["compute"] = std::max(0.0, r.seconds - exposed - r.optimizer_seconds);
  return phases;
}

StepLog::StepLog(const std::string& path) : path_(path) {
  // The checkpoint directory may not exist yet (the first save makes it).
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  // O_NONBLOCK: a FIFO there must not block the worker (and its SIGTERM) in open().
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK, 0644);
  struct stat info {};
  std::string why = fd_ < 0 ? std::strerror(errno) : "";
  if (fd_ >= 0 && (::fstat(fd_, &info) != 0 || !S_ISREG(info.st_mode))) {
    why = "not a regular file";
    ::close(fd_);
    fd_ = -1;
  }
  if (fd_ < 0) {
    // The record is for reports; a directory nobody can write (read-only, full) must not stop
    // training, any more than a failing checkpoint does (each save reports its own failure).
    failed_ = true;
    std::fprintf(stderr, "warning: %s: cannot keep the step log (%s); training goes on\n",
                 path.c_str(), why.c_str());
  }
}

StepLog::~StepLog() {
  if (fd_ >= 0) ::close(fd_);
}

void StepLog::write(const std::string& line) {
  if (failed_) return;
  const std::string text = line + "\n";
  const ssize_t n = ::write(fd_, text.data(), text.size());
  if (n != static_cast<ssize_t>(text.size())) {
    failed_ = true;
    std::fprintf(stderr, "warning: %s: the step log stops here: %s\n", path_.c_str(),
                 n < 0 ? std::strerror(errno) : "short write");
  }
}

void StepLog::start(const api::Plan& plan, const RunStart& start) {
  const int64_t remaining = std::max<int64_t>(1, plan.training.steps - start.resumed_from);
  every_ = std::max<int64_t>(1, (remaining + kMaxStepLines - 1) / kMaxStepLines);
  nlohmann::ordered_json predicted = nlohmann::ordered_json::object();
  for (const auto& [phase, seconds] : predicted_phase_seconds(plan.predicted.time))
    predicted[phase] = number(seconds);
  nlohmann::ordered_json j = {
      {"kind", "start"},
      {"time", unix_now()},
      {"resumed_from", start.resumed_from},
      {"total_steps", plan.training.steps},
      {"plan_hash", plan.plan_hash},
      {"tp", plan.config.tp},
      {"dp", plan.config.dp},
      {"pp", plan.config.pp},
      {"virtual_stages", plan.config.virtual_stages},
      {"distributed_optimizer", plan.config.distributed_optimizer},
      {"cut_layer", plan.config.cut_layer},
      {"cut_tp", plan.config.cut_tp},
      {"recompute", std::string(api::to_string(plan.config.recompute))},
      {"offload", std::string(api::to_string(plan.config.offload))},
      {"precision", std::string(api::to_string(plan.precision))},
      {"device", std::string(api::to_string(plan.device))},
      {"predicted_step_seconds", number(plan.predicted.step_seconds)},
      {"predicted_tokens_per_second", number(plan.predicted.tokens_per_second)},
      {"predicted_phase_seconds", predicted},
      {"loss_floor", start.loss_floor ? number(*start.loss_floor) : nullptr}};
  write(j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
}

void StepLog::step(const StepReport& r, const std::map<std::string, double>& phases) {
  if (r.step % every_ != 0 && r.step != r.total_steps && r.step != 1) return;
  nlohmann::ordered_json measured = nlohmann::ordered_json::object();
  for (const auto& [phase, seconds] : phases) measured[phase] = number(seconds);
  const nlohmann::ordered_json j = {{"kind", "step"},
                            {"time", unix_now()},
                            {"step", r.step},
                            {"loss", number(r.loss)},
                            {"seconds", number(r.seconds)},
                            {"tokens_per_second", number(r.tokens_per_second)},
                            {"mfu", number(r.mfu)},
                            {"phase_seconds", measured}};
  write(j.dump());
}

void StepLog::checkpoint(int64_t step, double seconds) {
  write(nlohmann::ordered_json{{"kind", "checkpoint"},
                       {"time", unix_now()},
                       {"step", step},
                       {"seconds", number(seconds)}}
            .dump());
}

void StepLog::checkpoint_failed(int64_t step, const std::string& reason) {
  write(nlohmann::ordered_json{
      {"kind", "checkpoint_failed"}, {"time", unix_now()}, {"step", step}, {"reason", reason}}
            .dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
}

void StepLog::end(int64_t step, bool finished) {
  write(nlohmann::ordered_json{{"kind", "end"},
                       {"time", unix_now()},
                       {"step", step},
                       {"how", finished ? "finished" : "signal"}}
            .dump());
}

}  // namespace kt::worker

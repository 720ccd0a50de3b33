#include "cli/run.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <thread>

#include "api/error.h"
#include "api/plan.h"
#include "api/quantity.h"
#include "api/training_job.h"
#include "api/yaml_json.h"
#include "cli/report.h"
#include "operator/controller/controller.h"
#include "operator/controller/manager.h"
#include "operator/kube/cache.h"
#include "local/local_node.h"
#include "local/pod_runner.h"
#include "local/store.h"
#include "telemetry/http_get.h"

namespace kt::cli {

namespace fs = std::filesystem;
using kube::Object;
using Steady = std::chrono::steady_clock;

namespace {

std::atomic<int> g_signal{0};

void on_signal(int sig) {
  g_signal = sig;
}

std::string duration_text(double seconds) {
  if (!(seconds >= 0)) return "?";
  const long long s = std::llround(seconds);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", s / 3600, (s / 60) % 60);
  else if (s >= 60)
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", s / 60, s % 60);
  else
    std::snprintf(buf, sizeof(buf), "%.1fs", seconds);
  return buf;
}

// The progress display: a redrawn bar on a terminal, a line per change otherwise.
class ProgressView {
 public:
  explicit ProgressView(int64_t steps) : steps_(steps), tty_(::isatty(STDERR_FILENO) == 1) {}

  void update(const api::ProgressStatus& p) {
    // The loss kept as a value and a flag, not an optional: GCC 12 -O2 takes the comparison of
    // two optionals for a read of an uninitialized double (-Wmaybe-uninitialized).
    const bool has_loss = p.loss.has_value();
    const double loss_value = p.loss.value_or(0.0);
    if (p.step == last_step_ && has_loss == has_last_loss_ && loss_value == last_loss_) return;
    last_step_ = p.step;
    has_last_loss_ = has_loss;
    last_loss_ = loss_value;
    char line[256];
    const std::string loss = p.loss ? api::fmt("%.4f", *p.loss) : "-";
    const std::string eta = p.eta_seconds ? duration_text(*p.eta_seconds) : "?";
    std::snprintf(line, sizeof(line), "step %lld/%lld  loss %s  %.0f tok/s  ETA %s",
                  static_cast<long long>(p.step), static_cast<long long>(steps_), loss.c_str(),
                  p.tokens_per_second, eta.c_str());
    if (tty_) {
      constexpr int kWidth = 30;
      const int filled =
          steps_ > 0 ? static_cast<int>(kWidth * std::min<int64_t>(p.step, steps_) / steps_) : 0;
      std::fprintf(stderr, "\r[%s%s] %s\033[K", std::string(filled, '#').c_str(),
                   std::string(kWidth - filled, '.').c_str(), line);
      drawn_ = true;
    } else {
      std::fprintf(stdout, "progress: %s\n", line);
      std::fflush(stdout);
    }
  }
  void message(const std::string& text) {
    end_line();
    std::fprintf(stdout, "%s\n", text.c_str());
    std::fflush(stdout);
  }
  void end_line() {
    if (drawn_) std::fprintf(stderr, "\n");
    drawn_ = false;
  }

 private:
  const int64_t steps_;
  const bool tty_;
  bool drawn_ = false;
  int64_t last_step_ = -1;
  bool has_last_loss_ = false;
  double last_loss_ = 0.0;
};

// What the rank-0 worker wrote in this run (its log from `offset` on: a run that resumes an
// interrupted one appends to the same log): the first and last loss, the last step, and the
// step its first process resumed from.
struct LogSummary {
  std::optional<double> first_loss, final_loss;
  int64_t steps = 0;
  int64_t resumed_from = 0;
};

LogSummary read_log(const std::string& path, std::uintmax_t offset) {
  LogSummary out;
  std::ifstream in(path);
  in.seekg(static_cast<std::streamoff>(offset));
  std::string line;
  static const std::regex kStep(R"(step\s+(\d+)/\d+ \| loss ([-0-9.eE+naif]+))");
  static const std::regex kDone(R"(done: (\d+) steps, final loss ([-0-9.eE+naif]+))");
  static const std::regex kResumed(R"(resumed from step (\d+))");
  std::smatch m;
  while (std::getline(in, line)) {
    if (!out.first_loss && std::regex_search(line, m, kResumed)) {
      out.resumed_from = std::stoll(m[1]);
    } else if (std::regex_search(line, m, kStep)) {
      const double loss = std::stod(m[2]);
      if (!out.first_loss) out.first_loss = loss;
      out.final_loss = loss;
      out.steps = std::stoll(m[1]);
    } else if (std::regex_search(line, m, kDone)) {
      out.steps = std::stoll(m[1]);
      out.final_loss = std::stod(m[2]);
    }
  }
  return out;
}

std::string tail(const std::string& path, size_t lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  std::string line;
  while (std::getline(in, line)) all.push_back(line);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i)
    out += "  | " + all[i] + "\n";
  return out;
}

std::string condition_message(const Object& status, const std::string& type) {
  for (const auto& c : status.value("conditions", Object::array()))
    if (c.value("type", "") == type && c.value("status", "") == "True")
      return c.value("reason", "") + ": " + c.value("message", "");
  return "";
}

// The chosen plan in a few lines (the ConfigMap's plan.json; `kubetrain plan` has the full
// table with the baselines).
void print_plan(const Object& plan_json, const std::string& node) {
  const api::Plan plan = api::decode_plan(plan_json);
  const auto& c = plan.config;
  const Object predicted = plan_json.value("predicted", Object::object());
  std::printf("plan %s for %s/%s on the local node %s:\n", plan.plan_hash.c_str(),
              plan.job_namespace.c_str(), plan.job_name.c_str(), node.c_str());
  std::printf(
      "  %lld node(s) × %lld %s rank(s), TP %lld%s × DP %lld%s%s, micro-batch %lld × %lld, "
      "overlap %s, recompute %s, offload %s, %s\n",
      static_cast<long long>(c.nodes), static_cast<long long>(c.procs_per_node),
      std::string(api::to_string(plan.device)).c_str(), static_cast<long long>(c.tp),
      c.pp > 1 ? (" × PP " + std::to_string(c.pp) +
                  (c.virtual_stages > 1
                       ? " (interleaved, " + std::to_string(c.virtual_stages) + " virtual stages)"
                       : " (1F1B)"))
                     .c_str()
               : "",
      static_cast<long long>(c.dp), api::describe_cut(plan).c_str(),
      c.distributed_optimizer ? " (distributed optimizer, ZeRO-1)" : "",
      static_cast<long long>(c.micro_batch), static_cast<long long>(c.grad_accum),
      c.sub_batches == 2 ? "on" : "off", std::string(api::to_string(c.recompute)).c_str(),
      std::string(api::to_string(c.offload)).c_str(),
      std::string(api::to_string(plan.precision)).c_str());
  std::printf("  model %lld layers, hidden %lld, %.2f M parameters; %lld steps of %lld sequences\n",
              static_cast<long long>(plan.model.layers), static_cast<long long>(plan.model.hidden),
              plan.parameters / 1e6, static_cast<long long>(plan.training.steps),
              static_cast<long long>(plan.global_batch));
  std::printf("  predicted %.2f ms/step, %.0f tokens/s, MFU %.1f%%\n",
              predicted.value("stepSeconds", 0.0) * 1e3, predicted.value("tokensPerSecond", 0.0),
              predicted.value("mfu", 0.0) * 100);
  for (const auto& line : plan.explanation) std::printf("  %s\n", line.c_str());
  std::fflush(stdout);
}

}  // namespace

int run_job(const RunOptions& options) {
  // The manifest is checked here first, so that a bad one fails before anything starts, with
  // the same field paths the controller would report.
  Object manifest = api::load_document(options.job_path);
  const api::TrainingJob job = api::load_training_job(options.job_path);
  const std::string ns = job.metadata.namespace_;
  const std::string name = job.metadata.name;

  const fs::path workdir = fs::absolute(options.workdir.empty() ? fs::path("kubetrain-runs") / name
                                                                : fs::path(options.workdir));
  fs::create_directories(workdir);
  const fs::path checkpoints = workdir / "checkpoints";
  // The gang must find its checkpoints again after a restart: a directory of the run, unless
  // the job brings its own volume.
  if (job.spec.checkpoint.volume.is_null())
    manifest["spec"]["checkpoint"]["volume"] = {
        {"hostPath", {{"path", checkpoints.string()}, {"type", "DirectoryOrCreate"}}}};
  manifest["metadata"]["namespace"] = ns;

  // Local pods inherit this environment. OpenMP threads that spin while they wait (libgomp's
  // default) collapse on a machine shared with other work: tiny took 57.9 s instead of 5.0 s at
  // a load average of 8 on 2 cores (docs/OPERATIONS.md). A user's own setting wins.
  ::setenv("OMP_WAIT_POLICY", "passive", 0);

  local::Store store;
  store.register_resource(kube::kTrainingJobs, true);
  const local::LocalMachine machine = local::detect_local_machine();
  local::register_local_node(store, machine);

  local::PodRunnerOptions runner_options;
  runner_options.node_name = machine.node_name;
  runner_options.work_dir = workdir.string();
  runner_options.worker_binary =
      options.worker_binary.empty() ? find_worker_binary() : options.worker_binary;
  local::PodRunner runner(store, runner_options);

  controller::ControllerOptions controller_options;
  controller_options.progress_interval = std::chrono::milliseconds(500);
  controller_options.fetch_metrics = [](const std::string& host, int port) {
    return telemetry::http_get(host, port, "/metrics", std::chrono::milliseconds(500));
  };
  // The operator's shape: informers -> work queue -> reconcile, reads from the informers'
  // cache, as in a cluster.
  kube::Cache cache(store, controller::operator_cache_options(ns));
  kube::CachingClient cached_store(store, cache);
  controller_options.api_reader = &store;
  controller::Controller controller(cached_store, controller_options);

  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  struct sigaction old_int {
  }, old_term{};
  sigaction(SIGINT, &action, &old_int);
  sigaction(SIGTERM, &action, &old_term);
  g_signal = 0;

  std::printf("kubetrain run: %s/%s on %s (%lld CPU cores, %.1f GiB, %zu GPU(s)); work dir %s\n",
              ns.c_str(), name.c_str(), machine.node_name.c_str(),
              static_cast<long long>(machine.cpu_cores), machine.memory_bytes / api::kGiB,
              machine.gpus.size(), workdir.string().c_str());
  std::fflush(stdout);

  controller::ManagerOptions manager_options;
  manager_options.ns = ns;
  manager_options.workers = 1;
  controller::Manager manager(cache, controller, manager_options);
  kube::WatchOptions watch_options;
  watch_options.allow_bookmarks = false;
  watch_options.field_selector = "metadata.name=" + name;
  auto job_watch = store.watch(kube::kTrainingJobs, ns, watch_options);
  store.create(kube::kTrainingJobs, ns, manifest);
  runner.start();
  manager.start();
  const auto started = Steady::now();
  ProgressView view(job.spec.training.steps);
  // A run interrupted before (Ctrl-C) left its checkpoints and its log here: this one resumes
  // from the checkpoints and appends to the log.
  const std::string log = runner.log_path(ns, controller::worker_pod_name(name, 0));
  std::error_code size_error;
  const std::uintmax_t log_size = fs::file_size(log, size_error);  // an error when there is none
  const std::uintmax_t log_offset = size_error ? 0 : log_size;
  if (job.spec.checkpoint.volume.is_null() && fs::exists(checkpoints / "latest"))
    view.message("resuming: " + checkpoints.string() +
                 " holds an earlier run's checkpoints; training goes on from the latest "
                 "(remove the directory to start over)");
  bool plan_shown = false;
  std::string last_phase;
  int restarts_seen = 0;
  Object status = Object::object();
  int exit_code = 1;

  for (;;) {
    // Every version of the job passes through the watch, in order, so a status that was
    // visible only briefly (ttlSecondsAfterFinished: 0 deletes the job as it finishes) is seen.
    const auto event = job_watch->next(std::chrono::milliseconds(250));
    if (event && event->type == kube::WatchEventType::Deleted) {
      const std::string phase = status.value("phase", "");
      exit_code = phase == "Succeeded" ? 0 : g_signal ? 130 : 1;
      if (phase != "Succeeded" && phase != "Failed" && !g_signal)
        view.message("the job was deleted before it finished");
      break;
    }
    if (event) status = event->object.value("status", Object::object());
    const api::TrainingJobStatus typed = api::decode_status(status);

    if (!plan_shown && typed.plan) {
      plan_shown = true;
      try {
        const Object cm = store.get(kube::kConfigMaps, ns, typed.plan->config_map);
        print_plan(Object::parse(cm["data"]["plan.json"].get<std::string>()), machine.node_name);
      } catch (const kube::ApiError&) {
        // Gone already (a job that finished and was collected at once): nothing to show.
      }
    }
    const std::string phase = status.value("phase", "");
    if (phase != last_phase) {
      const std::string why = phase == "Restarting" ? condition_message(status, "Restarting") : "";
      view.message("phase: " + phase + (why.empty() ? "" : " (" + why + ")"));
      last_phase = phase;
    }
    restarts_seen = static_cast<int>(typed.restarts);
    if (phase == "Running") view.update(typed.progress);
    if (phase == "Succeeded") {
      exit_code = 0;
      break;
    }
    if (phase == "Failed") {
      exit_code = 1;
      break;
    }
    if (g_signal) {
      view.message("interrupted: stopping the job's pods");
      // Deleting the job deletes its pods; the runner sends SIGTERM (the worker checkpoints).
      store.remove(kube::kTrainingJobs, ns, name, kube::Propagation::Background);
      exit_code = 130;
      break;
    }
  }
  view.end_line();
  manager.stop();
  runner.sync();  // the deleted pods' processes get their SIGTERM now
  runner.stop();
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);

  const double wall = std::chrono::duration<double>(Steady::now() - started).count();
  const LogSummary summary = read_log(log, log_offset);
  if (exit_code == 0) {
    // This run's steps, time and tokens: a resumed run trained from its checkpoint on.
    const int64_t trained = std::max<int64_t>(0, summary.steps - summary.resumed_from);
    const double tokens = static_cast<double>(trained) *
                          static_cast<double>(job.spec.training.global_batch_size) *
                          static_cast<double>(api::resolve_model(job.spec.model).seq_len);
    const std::string resumed =
        summary.resumed_from > 0
            ? "; this run resumed an earlier one at step " + std::to_string(summary.resumed_from) +
                  ", which the report counts as a restart"
            : "";
    if (trained == 0 && summary.resumed_from > 0) {
      // Run again after it finished: the checkpoint is already at the last step.
      std::printf(
          "Succeeded: nothing left to train: the checkpoint of an earlier run is at step %lld of "
          "%lld (remove %s to train again)\n",
          static_cast<long long>(summary.resumed_from),
          static_cast<long long>(job.spec.training.steps),
          job.spec.checkpoint.volume.is_null() ? checkpoints.c_str() : "the job's checkpoints");
    } else {
      std::printf(
          "Succeeded: %lld steps in %s (steps %lld to %lld), loss %s -> %s, %.0f tokens/s "
          "overall (restarts: %d%s)\n",
          static_cast<long long>(trained), duration_text(wall).c_str(),
          static_cast<long long>(summary.resumed_from + 1), static_cast<long long>(summary.steps),
          summary.first_loss ? api::fmt("%.4f", *summary.first_loss).c_str() : "?",
          summary.final_loss ? api::fmt("%.4f", *summary.final_loss).c_str() : "?",
          wall > 0 ? tokens / wall : 0.0, restarts_seen, resumed.c_str());
    }
    std::printf("final loss: %s\n",
                summary.final_loss ? api::fmt("%.4f", *summary.final_loss).c_str() : "?");
  } else if (exit_code == 1) {
    std::string reason = condition_message(status, "Failed");
    if (reason.empty()) reason = condition_message(status, "Planned");
    std::fprintf(stderr, "kubetrain: job %s/%s failed: %s\n", ns.c_str(), name.c_str(),
                 reason.c_str());
    if (fs::exists(log))
      std::fprintf(stderr, "last lines of %s:\n%s", log.c_str(), tail(log, 10).c_str());
  }
  std::printf("checkpoints: %s\nlogs: %s\n",
              job.spec.checkpoint.volume.is_null() ? checkpoints.c_str() : "(the job's volume)",
              (workdir / "pods").c_str());
  // The run report (cli/report.h) from the rank-0 worker's step log beside the checkpoints.
  const std::string steps_dir =
      job.spec.checkpoint.volume.is_null()
          ? checkpoints.string()
          : job.spec.checkpoint.volume.value(Object::json_pointer("/hostPath/path"), "");
  if (!steps_dir.empty())
    report_after_run(steps_dir + "/steps.jsonl", (workdir / "report.html").string(),
                     ns + "/" + name);
  return exit_code;
}

std::string find_worker_binary() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path sibling = self.parent_path() / "kubetrain-worker";
    if (::access(sibling.c_str(), X_OK) == 0) return sibling.string();
  }
  return "kubetrain-worker";  // from PATH
}

}  // namespace kt::cli

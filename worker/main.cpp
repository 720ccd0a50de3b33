// kubetrain-worker: the pod entry point. `launch` runs a node's ranks; `train` runs one rank of a
// Plan; `export-llmc` writes a checkpoint's weights in llm.c's model format. Exit codes: 0 done,
// 1 a user-facing error (bad plan, unreadable data, the final checkpoint not written), 2 bad
// usage, 143 stopped by SIGTERM (after checkpointing, or trying to: a failed save does not change
// the code); `launch` exits with its failed rank's code. Never a signal of its own for bad input.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <iostream>
#include <map>
#include <memory>
#include <optional>

#include "api/error.h"
#include "api/measured_profile.h"
#include "api/plan.h"
#include "api/yaml_json.h"
#include "telemetry/process_metrics.h"
#include "telemetry/http_server.h"
#include "telemetry/metrics.h"
#include "telemetry/metrics_endpoint.h"
#include "telemetry/worker_metrics.h"
#include "worker/checkpoint.h"
#include "worker/gpt.h"
#include "worker/durable_file.h"
#include "worker/launch.h"
#include "worker/llmc_file.h"
#include "worker/profile.h"
#include "worker/step_log.h"
#include "worker/trainer.h"

namespace {

constexpr const char* kVersion = "0.1.0";

// The plan exactly as the planner wrote it: planHash is required (decode_plan checks that it
// matches the content), and check_plan_values refuses values the planner never emits. Field
// errors name the file.
kt::api::Plan load_plan(const std::string& path) {
  const kt::api::Json doc = kt::api::load_document(path);
  try {
    if (!doc.is_object() || !doc.contains("planHash"))
      throw kt::FieldError("plan.planHash",
                           "required (a plan is made by `kubetrain plan` or the operator, and "
                           "its hash guards it against edits)");
    kt::api::Plan plan = kt::api::decode_plan(doc);
    kt::worker::check_plan_values(plan);
    return plan;
  } catch (const kt::FieldError& e) {
    throw kt::Error(path + ": " + e.what());
  }
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

int cmd_train(const std::string& plan_path, const std::string& checkpoint_dir, int metrics_port,
              const std::string& metrics_address, const std::string& init_from, int log_every) {
  // First, before any thread starts (trainer.h says why).
  kt::worker::install_stop_handlers();
  const kt::api::Plan plan = load_plan(plan_path);
  try {
    kt::worker::check_executable(plan);
  } catch (const kt::FieldError& e) {
    throw kt::Error(plan_path + ": " + e.what());
  }
  // Multi-rank plans find their peers through RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
  // (set by `kubetrain-worker launch` or the operator).
  const auto rendezvous = kt::worker::RendezvousConfig::from_env();
  if (rendezvous.world_size != plan.world)
    throw kt::Error("the plan has " + std::to_string(plan.world) + " rank(s) but WORLD_SIZE is " +
                    std::to_string(rendezvous.world_size) +
                    (plan.world > 1 ? " (start the ranks with kubetrain-worker launch)" : ""));

  // Metrics: constant labels as docs/METRICS.md (the operator sets NODE_RANK).
  kt::telemetry::Registry registry({{"trainingjob", plan.job_name},
                                    {"namespace", plan.job_namespace},
                                    {"rank", std::to_string(rendezvous.rank)},
                                    {"node_rank", env_or("NODE_RANK", "0")}});
  kt::telemetry::WorkerMetrics metrics(registry);
  kt::telemetry::add_process_metrics(registry, "worker", kVersion);
  metrics.predicted_step_seconds.set(plan.predicted.step_seconds);
  metrics.predicted_tokens_per_second.set(plan.predicted.tokens_per_second);
  for (const auto& [phase, seconds] : kt::worker::predicted_phase_seconds(plan.predicted.time))
    metrics.predicted_phase_seconds.with({phase}).set(seconds);
  metrics.target_steps.set(static_cast<double>(plan.training.steps));
  metrics.plan_info
      .with({std::to_string(plan.config.tp), std::to_string(plan.config.dp),
             std::to_string(plan.config.pp), std::to_string(plan.config.virtual_stages),
             plan.config.distributed_optimizer ? "true" : "false",
             std::to_string(plan.config.cut_layer), std::to_string(plan.config.cut_tp),
             std::to_string(plan.config.nodes),
             std::string(kt::api::to_string(plan.config.recompute)),
             std::string(kt::api::to_string(plan.config.offload)),
             plan.config.sub_batches > 1 ? "true" : "false",
             std::string(kt::api::to_string(plan.precision)),
             std::string(kt::api::to_string(plan.device)), plan.plan_hash})
      .set(1);
  std::unique_ptr<kt::telemetry::HttpServer> server;
  if (metrics_port >= 0) {
    server = std::make_unique<kt::telemetry::HttpServer>(metrics_address, metrics_port);
    kt::telemetry::serve_metrics(*server, registry);
    server->start();
    std::printf("metrics on http://%s:%d/metrics\n", metrics_address.c_str(), server->port());
  }

  std::printf(
      "kubetrain-worker %s: plan %s for %s/%s: %lld steps of %lld sequences × %lld "
      "tokens (micro-batch %lld × %lld), %.2f M parameters, %lld CPU thread(s)\n",
      kVersion, plan.plan_hash.c_str(), plan.job_namespace.c_str(), plan.job_name.c_str(),
      static_cast<long long>(plan.training.steps), static_cast<long long>(plan.global_batch),
      static_cast<long long>(plan.model.seq_len), static_cast<long long>(plan.config.micro_batch),
      static_cast<long long>(plan.config.grad_accum), plan.parameters / 1e6,
      static_cast<long long>(plan.cpu_threads));
  std::fflush(stdout);

  kt::worker::ProcessGroups groups;
  if (plan.world > 1)
    groups = kt::worker::connect_process_groups(
        rendezvous, static_cast<int>(plan.config.tp), static_cast<int>(plan.config.dp),
        static_cast<int>(plan.config.pp), static_cast<int>(plan.config.cut_tp),
        static_cast<int>(kt::api::cut_stage(plan.config, plan.model.layers)));
  kt::worker::TrainOptions options;
  options.groups = plan.world > 1 ? &groups : nullptr;
  if (rendezvous.rank != 0) log_every = 0;  // one progress line per step, from rank 0
  options.checkpoint_dir = checkpoint_dir;
  options.init_from_llmc = init_from;
  options.log_every = log_every;
  // Rank 0 keeps the run's record next to its checkpoints (worker/step_log.h).
  std::unique_ptr<kt::worker::StepLog> step_log;
  if (!checkpoint_dir.empty() && rendezvous.rank == 0)
    step_log = std::make_unique<kt::worker::StepLog>(checkpoint_dir + "/steps.jsonl");
  options.on_start = [&](const kt::worker::RunStart& start) {
    metrics.step.set(static_cast<double>(start.resumed_from));
    if (start.loss_floor) metrics.loss_floor.with({}).set(*start.loss_floor);
    if (step_log) step_log->start(plan, start);
  };
  kt::worker::PhaseMeter phase_meter;
  double last_tokens_per_second = 0;
  kt::worker::CommStats pp_last;  // the pipeline group's totals at the last step
  options.on_step = [&](const kt::worker::StepReport& r) {
    last_tokens_per_second = r.tokens_per_second;
    const std::map<std::string, double> phases = phase_meter.step(r);
    for (const auto& [phase, seconds] : phases) metrics.phase_seconds.with({phase}).inc(seconds);
    if (step_log) step_log->step(r, phases);
    metrics.step.set(static_cast<double>(r.step));
    metrics.steps.inc();
    metrics.step_seconds.observe(r.seconds);
    metrics.tokens.inc(static_cast<double>(r.tokens));
    metrics.tokens_per_second.set(r.tokens_per_second);
    metrics.loss.set(r.loss);
    metrics.mfu_ratio.set(r.mfu);
    // Where AdamW ran: the device ("cpu", or "cuda:N": there the time to enqueue it) and the
    // offload engine's host pool.
    metrics.optimizer_seconds.with({r.device}).inc(r.optimizer_seconds);
    metrics.optimizer_seconds.with({"host"}).inc(r.cpu_optimizer_seconds);
    metrics.transfer_bytes.with({"h2d"}).inc(static_cast<double>(r.h2d_bytes));
    metrics.transfer_bytes.with({"d2h"}).inc(static_cast<double>(r.d2h_bytes));
    // Communication of the groups this plan has, in this step.
    for (const std::string name : {"tp", "dp"}) {
      if (!r.comm.count(name)) continue;
      metrics.comm_seconds.with({name}).inc(phases.at(name + "_comm_total"));
      metrics.comm_exposed_seconds.with({name}).inc(phases.at(name + "_comm_exposed"));
    }
    // Pipeline stages' sends and receives, the loss broadcast and the norm's sum: the waits
    // include the 1F1B bubble, which the plan's phases count as compute (so no phase of its own).
    if (const auto it = r.comm.find("pp"); it != r.comm.end()) {
      metrics.comm_seconds.with({"pp"}).inc(std::max(0.0, it->second.seconds - pp_last.seconds));
      metrics.comm_exposed_seconds.with({"pp"}).inc(
          std::max(0.0, it->second.exposed_seconds - pp_last.exposed_seconds));
      pp_last = it->second;
    }
  };
  // Failed saves (training goes on): the operator sets CheckpointFailing while the consecutive
  // count is above 0.
  int64_t consecutive_failures = 0;
  options.on_checkpoint = [&](int64_t step, double seconds) {
    if (step_log) step_log->checkpoint(step, seconds);
    metrics.checkpoint_seconds.set(seconds);
    metrics.last_checkpoint_step.set(static_cast<double>(step));
    metrics.last_checkpoint_time.set(
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
    consecutive_failures = 0;
    metrics.checkpoint_consecutive_failures.set(0);
  };
  options.on_checkpoint_failure = [&](int64_t step, const std::string& reason,
                                      const std::string&) {
    if (step_log) step_log->checkpoint_failed(step, reason);
    metrics.checkpoint_failures.with({reason}).inc();
    metrics.checkpoint_consecutive_failures.set(static_cast<double>(++consecutive_failures));
  };
  const std::string lock_wait = env_or("KUBETRAIN_CHECKPOINT_LOCK_WAIT_SECONDS", "");
  if (!lock_wait.empty()) {
    char* end = nullptr;
    const double seconds = std::strtod(lock_wait.c_str(), &end);
    if (end == lock_wait.c_str() || *end || !(seconds >= 0 && seconds <= 3600))
      throw kt::Error("KUBETRAIN_CHECKPOINT_LOCK_WAIT_SECONDS=" + lock_wait +
                      " is not a number of seconds in [0, 3600]");
    options.checkpoint_lock_wait = std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  }
  options.on_memory = [&](const std::string& device, const std::map<std::string, double>& bytes) {
    for (const auto& [kind, n] : bytes) metrics.memory_bytes.with({device, kind}).set(n);
  };
  const auto result = kt::worker::train(plan, options, [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  });
  if (step_log) step_log->end(result.steps_done, !result.interrupted);
  if (server) server->stop();
  // The final progress as a Kubernetes termination message (the kubelet copies the file into
  // containerStatuses[].state.terminated.message), so that a finished job's status still shows
  // its last loss and speed, and whether its checkpoints failed, when /metrics is gone.
  // Prometheus text, the same samples the operator reads from /metrics; well under the 4 KiB
  // limit.
  if (const char* path = std::getenv("KUBETRAIN_TERMINATION_MESSAGE_PATH");
      path && *path && rendezvous.rank == 0) {
    if (std::FILE* out = std::fopen(path, "w")) {
      std::fprintf(out,
                   "kubetrain_worker_steps_total %lld\nkubetrain_worker_loss %.6g\n"
                   "kubetrain_worker_tokens_per_second %.6g\n"
                   "kubetrain_worker_checkpoint_failures_total %lld\n"
                   "kubetrain_worker_checkpoint_consecutive_failures %lld\n",
                   static_cast<long long>(result.steps_done), result.last_loss,
                   last_tokens_per_second, static_cast<long long>(result.checkpoint_failures),
                   static_cast<long long>(consecutive_failures));
      std::fclose(out);
    }
  }
  // 128 + SIGTERM: retryable, also when the checkpoint on the way out failed (a full or
  // read-only disk is no verdict on the job; the restart resumes from the last good one).
  if (result.interrupted) return 143;
  if (!result.checkpoint_error.empty())
    throw kt::Error("training finished at step " + std::to_string(result.steps_done) +
                    ", but its final checkpoint could not be written: " + result.checkpoint_error);
  std::printf("done: %lld steps, final loss %.4f\n", static_cast<long long>(result.steps_done),
              result.last_loss);
  return 0;
}

int cmd_export_llmc(const std::string& plan_path, const std::string& checkpoint_dir,
                    const std::string& out) {
  const kt::api::Plan plan = load_plan(plan_path);
  const auto& m = plan.model;
  if (m.ffn_hidden != 4 * m.hidden)
    throw kt::Error("llm.c's format needs ffnHidden = 4 × hidden; this model has " +
                    std::to_string(m.ffn_hidden));
  kt::worker::Gpt model(kt::worker::GptConfig::from(m), 1, 1, kt::worker::Device::cpu());
  auto device = kt::worker::Device::cpu();
  auto adam_m = device->allocate_floats(model.num_parameters(), kt::worker::MemoryKind::kOptimizer);
  auto adam_v = device->allocate_floats(model.num_parameters(), kt::worker::MemoryKind::kOptimizer);
  const kt::worker::CheckpointTensors tensors{model.parameter_views(), model.views(adam_m.data()),
                                              model.views(adam_v.data())};
  const auto meta = kt::worker::load_latest_checkpoint(checkpoint_dir, tensors);
  if (!meta) throw kt::Error("no checkpoint in " + checkpoint_dir);
  const kt::worker::LlmcDims dims{static_cast<int>(m.seq_len), static_cast<int>(m.vocab),
                                  static_cast<int>(m.layers),  static_cast<int>(m.heads),
                                  static_cast<int>(m.hidden),  static_cast<int>(m.padded_vocab())};
  kt::worker::export_llmc(out, dims, model.parameter_views());
  std::printf("wrote %s from step %lld of %s\n", out.c_str(), static_cast<long long>(meta->step),
              checkpoint_dir.c_str());
  return 0;
}

// The pod entry: one `train` process per rank of this node (worker/launch.h). The program the
// ranks run is this binary, or KUBETRAIN_LAUNCH_CHILD (tests put a fake rank there).
int cmd_launch(const std::string& plan_path, const std::string& checkpoint_dir, int metrics_port,
               const std::string& metrics_address) {
  const kt::api::Plan plan = load_plan(plan_path);
  kt::worker::LaunchOptions options;
  // This binary by its real path, not /proc/self/exe: the kernel names a process after the file
  // it executes, and ranks named "exe" in ps, top and OOM reports say nothing.
  std::string self = "/proc/self/exe";
  {
    std::error_code ec;
    const std::filesystem::path real = std::filesystem::read_symlink("/proc/self/exe", ec);
    // (A binary replaced or deleted since it started: its old path is gone, keep /proc/self/exe.)
    if (!ec && std::filesystem::is_regular_file(real, ec)) self = real.string();
  }
  options.child_program = env_or("KUBETRAIN_LAUNCH_CHILD", self.c_str());
  options.child_args = {"train", "--plan", plan_path};
  if (!checkpoint_dir.empty()) {
    options.child_args.insert(options.child_args.end(), {"--checkpoint-dir", checkpoint_dir});
  }
  // Each rank serves its own metrics on a free local port; the launcher merges them.
  options.child_args.insert(options.child_args.end(),
                            {"--metrics-port", "0", "--metrics-address", "127.0.0.1"});
  options.procs_per_node = static_cast<int>(plan.config.procs_per_node);
  options.world_size = static_cast<int>(plan.world);
  const std::string node_rank = env_or("NODE_RANK", "0");
  try {
    options.node_rank = std::stoi(node_rank);
  } catch (const std::exception&) {
    throw kt::Error("NODE_RANK=" + node_rank + " is not a number");
  }
  options.master_addr = env_or("MASTER_ADDR", "127.0.0.1");
  const std::string master_port = env_or("MASTER_PORT", "29500");
  try {
    options.master_port = std::stoi(master_port);
  } catch (const std::exception&) {
    throw kt::Error("MASTER_PORT=" + master_port + " is not a number");
  }
  options.metrics_port = metrics_port;
  options.metrics_address = metrics_address;
  return kt::worker::launch_ranks(options);
}

// The error a worker exits with, as its container's termination message (when the operator set
// KUBETRAIN_TERMINATION_MESSAGE_PATH): a Prometheus comment line, `# error: <what>`, so that the
// job's Failed condition says why and not only `kubectl logs` does. Best effort, within the
// kubelet's 4 KiB.
void write_error_message(const std::string& what) {
  const char* env = std::getenv("KUBETRAIN_TERMINATION_MESSAGE_PATH");
  if (!env || !*env) return;
  std::string text = "# error: " + what;
  for (char& c : text)
    if (c == '\n') c = ' ';
  if (text.size() > 4000) text = text.substr(0, 4000) + "...";
  if (std::FILE* file = std::fopen(env, "w")) {
    std::fputs((text + "\n").c_str(), file);
    std::fclose(file);
  }
}

// The profile as the container's termination message (what a profiling pod returns to the
// operator, which stores it in a ConfigMap): compact JSON within the kubelet's 4 KiB, the raw
// measurements dropped if they do not fit.
void write_termination_message(kt::api::MeasuredProfile profile) {
  const char* env = std::getenv("KUBETRAIN_TERMINATION_MESSAGE_PATH");
  const std::string path = env && *env ? env : "/dev/termination-log";
  std::string text = kt::api::to_json(profile).dump();
  if (text.size() > 4096) {
    profile.measurements.clear();
    text = kt::api::to_json(profile).dump();
  }
  if (text.size() > 4096)
    throw kt::Error("profile: " + std::to_string(text.size()) +
                    " bytes of profile do not fit a 4096-byte termination message");
  // In place, not by rename: the kubelet bind-mounts that file.
  std::FILE* file = std::fopen(path.c_str(), "w");
  const bool ok = file && std::fwrite(text.data(), 1, text.size(), file) == text.size();
  if (file && std::fclose(file) != 0) throw kt::Error("profile: cannot write " + path);
  if (!ok) throw kt::Error("profile: cannot write " + path);
}

int cmd_profile(const std::string& plan_path, const std::string& out, int threads, bool quick,
                const std::string& device, const std::string& kind, bool termination_message,
                const std::string& command) {
  std::optional<kt::api::Plan> plan;
  if (!plan_path.empty()) plan = kt::api::decode_plan(kt::api::load_document(plan_path));
  kt::worker::ProfileOptions options;
  options.plan = plan ? &*plan : nullptr;
  options.threads = threads;
  options.quick = quick;
  options.version = kVersion;
  options.command = command;
  options.device = device;
  options.kind = kind;
  std::optional<kt::api::MeasuredProfile> gpu = kt::worker::measure_gpu_profile(options);
  const kt::api::MeasuredProfile measured = gpu ? *gpu : kt::worker::measure_profile(options);
  if (termination_message) write_termination_message(measured);
  const std::string text = kt::api::json_to_yaml(kt::api::to_json(measured));
  if (out.empty()) {
    std::fputs(text.c_str(), stdout);
    return 0;
  }
  kt::worker::replace_file_atomically(
      out, [&](kt::worker::CheckedFile& file) { file.write_all(text.data(), text.size()); });
  std::fprintf(stderr, "profile: wrote %s (kubetrain plan JOB -c CLUSTER --profile %s)\n",
               out.c_str(), out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kubetrain-worker: runs one rank of a kubetrain Plan (device: cpu, or cuda on one GPU)."};
  app.require_subcommand(1);
  app.set_version_flag("--version", kVersion);
  std::string plan_path, checkpoint_dir, init_from, out;
  // Listeners bind every address in a pod; KUBETRAIN_LISTEN_ADDRESS narrows it (local pods:
  // 127.0.0.1, so that a run on a laptop is not reachable from the network).
  const char* listen = std::getenv("KUBETRAIN_LISTEN_ADDRESS");
  std::string metrics_address = listen && *listen ? listen : "0.0.0.0";
  int metrics_port = -1, log_every = 1;

  CLI::App* train = app.add_subcommand("train", "Train one rank of PLAN");
  train->add_option("--plan", plan_path, "Plan JSON (kubetrain plan -o json)")
      ->required()
      ->check(CLI::ExistingFile);
  train->add_option("--checkpoint-dir", checkpoint_dir,
                    "checkpoints go here; the run resumes from the latest one");
  train->add_option("--metrics-port", metrics_port,
                    "serve /metrics and /healthz on this port (0: any free port)");
  train->add_option("--metrics-address", metrics_address, "address to listen on")
      ->capture_default_str();
  train->add_option("--init-from-llmc", init_from, "start from an llm.c model file")
      ->check(CLI::ExistingFile);
  train->add_option("--log-every", log_every, "print progress every N steps")
      ->capture_default_str();

  CLI::App* exp =
      app.add_subcommand("export-llmc", "Write the latest checkpoint as llm.c's model file");
  exp->add_option("--plan", plan_path, "Plan JSON")->required()->check(CLI::ExistingFile);
  exp->add_option("--checkpoint-dir", checkpoint_dir, "checkpoint directory")->required();
  exp->add_option("--out", out, "output file (llm.c .bin)")->required();

  CLI::App* launch = app.add_subcommand(
      "launch", "Run this node's ranks of PLAN (procsPerNode `train` processes; the pod entry)");
  launch->add_option("--plan", plan_path, "Plan JSON")->required()->check(CLI::ExistingFile);
  launch->add_option("--checkpoint-dir", checkpoint_dir, "passed to every rank");
  launch->add_option("--metrics-port", metrics_port,
                     "serve the ranks' merged /metrics and /healthz on this port (0: any)");
  launch->add_option("--metrics-address", metrics_address, "address to listen on")
      ->capture_default_str();

  CLI::App* profile = app.add_subcommand(
      "profile",
      "Measure this machine for the planner (the model's GEMMs, a micro-batch, memory, AdamW, "
      "all-reduce and its interference) and write a hardware profile for `kubetrain plan "
      "--profile`");
  std::string profile_plan;
  int profile_threads = 0;
  bool quick = false;
  profile->add_option("--plan", profile_plan,
                      "measure at this plan's model and micro-batch (default: GPT-2 124M, B 4, "
                      "T 64)")
      ->check(CLI::ExistingFile);
  profile->add_option("--output,-o", out, "write the profile here (YAML; default: stdout)");
  profile->add_option("--threads", profile_threads, "threads (default: every core)");
  profile->add_flag("--quick", quick, "small shapes, few repetitions (a few seconds; for tests)");
  std::string profile_device = "auto", profile_kind;
  profile->add_option("--device", profile_device,
                      "what to measure: cpu (this node as a CPU node), cuda (its GPUs; two of "
                      "them for NCCL where it has two), auto (cuda where a GPU is usable)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  profile->add_option("--kind", profile_kind,
                      "the GPU node kind the profile is for (a docs/HARDWARE.md product name or "
                      "alias; default: the GPU's own product name)");
  bool termination_message = false;
  profile->add_flag("--termination-message", termination_message,
                    "also write the profile as the container's termination message (JSON, "
                    "$KUBETRAIN_TERMINATION_MESSAGE_PATH or /dev/termination-log): what the "
                    "operator's profiling pods return");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "kubetrain-worker: %s (see kubetrain-worker --help)\n", e.what());
    return 2;
  }
  try {
    if (*train)
      return cmd_train(plan_path, checkpoint_dir, metrics_port, metrics_address, init_from,
                       log_every);
    if (*exp) return cmd_export_llmc(plan_path, checkpoint_dir, out);
    if (*launch) return cmd_launch(plan_path, checkpoint_dir, metrics_port, metrics_address);
    if (*profile) {
      std::string command = "kubetrain-worker";
      for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
      return cmd_profile(profile_plan, out, profile_threads, quick, profile_device, profile_kind,
                         termination_message, command);
    }
  } catch (const kt::Error& e) {
    std::fprintf(stderr, "kubetrain-worker: %s\n", e.what());
    write_error_message(e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "kubetrain-worker: out of memory (an allocation failed)\n");
    write_error_message("out of memory (an allocation failed)");
    return 1;
  } catch (const std::exception& e) {
    // Not a signal: exit codes 128+ tell the operator to retry, and input that reaches an
    // unchecked library error would fail the same way again.
    std::fprintf(stderr, "kubetrain-worker: internal error: %s\n", e.what());
    write_error_message(std::string("internal error: ") + e.what());
    return 1;
  }
  return 0;
}

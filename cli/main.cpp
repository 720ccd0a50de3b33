// The `kubetrain` command. Subcommands: plan, validate, run, report, profiles, presets, version,
// local serve. Exit codes: 0 success, 1 a user-facing error (bad manifest, no plan fits, a failed
// run), 2 bad usage, 130 a run interrupted by Ctrl-C.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <set>

#include "api/error.h"
#include "api/hardware.h"
#include "api/inventory.h"
#include "api/measured_profile.h"
#include "api/model.h"
#include "api/plan.h"
#include "api/quantity.h"
#include "api/training_job.h"
#include "api/yaml_json.h"
#include "cli/format.h"
#include "cli/local_serve.h"
#include "cli/report.h"
#include "cli/run.h"
#include "planner/calibration.h"
#include "planner/planner.h"

namespace {

constexpr const char* kVersion = "0.1.0";

void print_document(const kt::api::Json& doc, const std::string& format) {
  if (format == "json")
    std::cout << doc.dump(2) << "\n";
  else
    std::cout << kt::api::json_to_yaml(doc);
}

// --refit RUN...: the runs' measured phase times folded into the figures of the node kind
// they ran on (planner/calibration.h), as the operator's autotune does. The runs' plans must
// have been predicted with the figures the cluster's nodes have here (the same --profile).
void refit_inventory(kt::api::Inventory& inventory, const std::string& cluster_path,
                     const std::vector<std::string>& run_paths) {
  std::vector<kt::planner::PhaseEvidence> runs;
  std::string device;
  for (const std::string& path : run_paths) {
    const std::string file =
        std::filesystem::is_directory(path) ? path + "/steps.jsonl" : path;
    const kt::cli::RunPhases phases = kt::cli::run_phases(kt::cli::load_steps_log(file));
    if (!device.empty() && phases.device != device)
      throw kt::Error("--refit: " + file + " ran on " + phases.device + ", the runs before on " +
                      device + ": refit one node kind at a time");
    device = phases.device;
    kt::planner::PhaseEvidence evidence;
    evidence.predicted_step_seconds = phases.predicted_step_seconds;
    for (const kt::api::TimePhase& p : kt::api::kTimePhases)
      if (const auto it = phases.predicted.find(p.name); it != phases.predicted.end())
        evidence.predicted.*p.seconds = it->second;
    evidence.measured = phases.measured;
    runs.push_back(std::move(evidence));
  }
  // The kind: cpu for CPU runs, else the cluster's one GPU kind.
  std::set<std::string> kinds;
  for (const kt::api::Node& node : inventory.nodes)
    if ((device == "cpu") == node.is_cpu_node()) kinds.insert(node.hardware.name);
  if (kinds.size() != 1)
    throw kt::Error("--refit: the runs are of " + device + " plans, and " + cluster_path +
                    " has " + std::to_string(kinds.size()) +
                    " node kind(s) they could have run on: give a cluster of one kind");
  for (const kt::api::Node& node : inventory.nodes) {
    if (node.hardware.name != *kinds.begin()) continue;
    const kt::planner::Refit refit = kt::planner::refit(node.hardware, runs);
    kt::planner::apply_scales(inventory, refit.profile);
    std::string changes;
    for (const std::string& c : refit.changes) changes += "\n  " + c;
    std::cerr << "refit " << node.hardware.name << " from " << runs.size() << " run(s):"
              << (changes.empty() ? " no phase measured well enough" : changes) << "\n";
    break;
  }
}

int cmd_plan(const std::string& job_path, const std::string& cluster_path,
             const std::vector<std::string>& profile_paths,
             const std::vector<std::string>& refit_paths, const std::string& format) {
  const kt::api::TrainingJob job = kt::api::load_training_job(job_path);
  kt::api::Inventory inventory = kt::api::load_inventory(cluster_path);
  std::vector<kt::api::MeasuredProfile> profiles;
  for (const std::string& path : profile_paths)
    profiles.push_back(kt::api::load_measured_profile(path));
  if (!profiles.empty() && kt::api::apply_measured_profiles(inventory, profiles) == 0) {
    std::string kinds;
    for (const auto& m : profiles) kinds += (kinds.empty() ? "" : ", ") + m.profile.name;
    throw kt::Error("--profile: no node of " + cluster_path + " is of the kind of " +
                    (profiles.size() > 1 ? "any profile given (" : "the profile (") + kinds + ")");
  }
  if (!refit_paths.empty()) refit_inventory(inventory, cluster_path, refit_paths);
  const kt::api::Plan plan = kt::planner::best_plan(job, inventory);
  if (format == "table")
    std::cout << kt::cli::format_plan_table(plan, inventory.name);
  else
    print_document(kt::api::to_json(plan), format);
  return 0;
}

int cmd_validate(const std::string& job_path, const std::string& format) {
  const kt::api::TrainingJob job = kt::api::load_training_job(job_path);
  if (!format.empty()) {
    print_document(kt::api::to_json(job), format);
    return 0;
  }
  const kt::api::ModelDims m = kt::api::resolve_model(job.spec.model);
  std::printf(
      "%s: valid TrainingJob %s/%s (model: %lld layers, hidden %lld, %s parameters; "
      "%lld steps of %lld sequences)\n",
      job_path.c_str(), job.metadata.namespace_.c_str(), job.metadata.name.c_str(),
      static_cast<long long>(m.layers), static_cast<long long>(m.hidden),
      kt::api::format_count(static_cast<double>(kt::api::parameter_count(m))).c_str(),
      static_cast<long long>(job.spec.training.steps),
      static_cast<long long>(job.spec.training.global_batch_size));
  return 0;
}

// `kubetrain report RUN_DIR [-o FILE] [--job NAME]`: the run report of a run's step log.
int cmd_report(const std::string& run_dir, std::string html_path, std::string job) {
  namespace fs = std::filesystem;
  const fs::path steps = kt::cli::find_steps_log(run_dir);
  // In a `kubetrain run` work directory (<workdir>/checkpoints/steps.jsonl) the report goes to
  // <workdir>/report.html, and the job is the directory's name (the default
  // ./kubetrain-runs/<job>); elsewhere it goes beside the step log.
  const fs::path dir = steps.parent_path();
  const bool work_dir = dir.filename() == "checkpoints";
  const fs::path home = work_dir ? dir.parent_path() : dir;
  if (html_path.empty()) html_path = (home / "report.html").string();
  if (job.empty() && work_dir) job = fs::absolute(home).lexically_normal().filename().string();
  kt::cli::ReportOptions options;
  options.job = job;
  for (const auto& warning : kt::cli::write_report(steps.string(), html_path, options))
    std::fprintf(stderr, "kubetrain: warning: %s\n", warning.c_str());
  std::printf("report: %s\n", html_path.c_str());
  return 0;
}

int cmd_profiles() {
  std::printf("%-16s %12s %12s %10s %-8s %14s %14s %10s\n", "profile", "bf16 TFLOP/s",
              "fp32 TFLOP/s", "memory", "link", "busbw GB/s", "inter GB/s", "PCIe GB/s");
  auto row = [](const kt::api::HardwareProfile& p) {
    std::printf("%-16s %12.1f %12.1f %10s %-8s %14.1f %14.2f %10.1f%s\n", p.name.c_str(),
                p.peak_bf16_flops / 1e12, p.peak_fp32_flops / 1e12,
                p.is_cpu ? "(node)" : kt::api::format_bytes(p.memory_bytes).c_str(),
                std::string(kt::api::to_string(p.intra_link)).c_str(),
                p.intra_allreduce_busbw / 1e9, p.inter_node_bandwidth / 1e9,
                p.host_link_bandwidth / 1e9, p.is_cpu ? "   (per core)" : "");
  };
  for (const auto& p : kt::api::builtin_profiles()) row(p);
  row(kt::api::cpu_profile());
  std::printf("\nSources: docs/HARDWARE.md. Override per node with kubetrain.dev/* annotations.\n");
  return 0;
}

int cmd_presets() {
  std::printf("%-11s %7s %7s %6s %7s %7s %6s %14s  %s\n", "preset", "layers", "hidden", "heads",
              "ffn", "vocab", "seq", "parameters", "what");
  for (const auto& p : kt::api::model_presets()) {
    const auto& d = p.dims;
    std::printf("%-11s %7lld %7lld %6lld %7lld %7lld %6lld %14lld  %s\n", p.name.c_str(),
                static_cast<long long>(d.layers), static_cast<long long>(d.hidden),
                static_cast<long long>(d.heads), static_cast<long long>(d.ffn_hidden),
                static_cast<long long>(d.vocab), static_cast<long long>(d.seq_len),
                static_cast<long long>(kt::api::parameter_count(d)), p.description.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "kubetrain: plans and runs GPT training jobs with tensor parallelism, overlapped "
      "communication and CPU offload.\nDocs: README.md, docs/PLANNER.md, docs/HARDWARE.md."};
  app.require_subcommand(1);
  app.set_version_flag("--version", kVersion);

  std::string job_path, cluster_path, format = "table", validate_format;

  CLI::App* plan = app.add_subcommand(
      "plan",
      "Plan how to train JOB on CLUSTER: the chosen plan, its predicted step time, "
      "tokens/s and memory per GPU, the baselines side by side, and why");
  plan->add_option("job", job_path, "TrainingJob manifest (YAML or JSON)")
      ->required()
      ->check(CLI::ExistingFile);
  plan->add_option("--cluster,-c", cluster_path,
                   "cluster inventory: kubetrain Inventory YAML or `kubectl get nodes -o json`")
      ->required()
      ->check(CLI::ExistingFile);
  std::vector<std::string> profile_paths;
  plan->add_option("--profile,-p", profile_paths,
                   "measured hardware profile (kubetrain-worker profile): the nodes of its kind "
                   "are planned with its figures instead of the built-in ones (repeatable)")
      ->check(CLI::ExistingFile);
  std::vector<std::string> refit_paths;
  plan->add_option("--refit", refit_paths,
                   "a run's steps.jsonl (or its checkpoint directory): its measured phase times "
                   "are folded into its node kind's figures first, as autotune does (repeatable; "
                   "its plan must have been made with the same figures)")
      ->check(CLI::ExistingPath);
  plan->add_option("--output,-o", format, "output format")
      ->check(CLI::IsMember({"table", "yaml", "json"}))
      ->capture_default_str();

  CLI::App* validate = app.add_subcommand(
      "validate", "Check a TrainingJob manifest; -o yaml|json prints it with defaults applied");
  validate->add_option("job", job_path, "TrainingJob manifest (YAML or JSON)")
      ->required()
      ->check(CLI::ExistingFile);
  validate->add_option("--output,-o", validate_format, "print the defaulted manifest")
      ->check(CLI::IsMember({"yaml", "json"}));

  kt::cli::RunOptions run_options;
  CLI::App* run = app.add_subcommand(
      "run",
      "Run JOB on this machine with no cluster: the operator's reconciler against a local "
      "control plane whose pods are local processes; prints the plan, progress and a summary");
  run->add_option("job", run_options.job_path, "TrainingJob manifest (YAML or JSON)")
      ->required()
      ->check(CLI::ExistingFile);
  run->add_option("--workdir", run_options.workdir,
                  "pod logs, volumes and checkpoints (default ./kubetrain-runs/<job>; the same "
                  "workdir resumes from its latest checkpoint)");
  run->add_option("--worker", run_options.worker_binary,
                  "the kubetrain-worker binary (default: the one next to kubetrain)");

  std::string report_dir, report_out, report_job;
  CLI::App* report = app.add_subcommand(
      "report",
      "Write the run report: one self-contained HTML page (no script, no network) with the loss, "
      "tokens/s against the plan's prediction, the step time by phase, checkpoints and restarts, "
      "from the step log of RUN_DIR (`kubetrain run` writes it at the end of a run too)");
  report
      ->add_option("run-dir", report_dir,
                   "a `kubetrain run` work directory (its checkpoints/steps.jsonl), a checkpoint "
                   "directory (its steps.jsonl) or the step log itself")
      ->required();
  report->add_option("--output,-o", report_out,
                     "the HTML file (default: report.html in the work directory, or beside the "
                     "step log)");
  report->add_option("--job", report_job,
                     "the job's name for the title (default: the work directory's name)");

  CLI::App* profiles = app.add_subcommand("profiles", "List the built-in hardware profiles");
  CLI::App* presets = app.add_subcommand("presets", "List the model presets");
  CLI::App* version = app.add_subcommand("version", "Print the version");

  CLI::App* local = app.add_subcommand("local", "The local control plane");
  local->require_subcommand(1);
  kt::cli::LocalServeOptions serve_options;
  bool api_only = false;
  CLI::App* serve = local->add_subcommand(
      "serve", "Serve the local control plane's Kubernetes API on 127.0.0.1 (for kubectl and "
               "the operator), with this machine as a Node whose pods run as local processes, "
               "until interrupted");
  serve->add_option("--port", serve_options.port, "port to listen on (0: a free one)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  serve->add_option("--kubeconfig-out", serve_options.kubeconfig_out,
                    "write a kubeconfig for this server to PATH");
  serve->add_option("--workdir", serve_options.workdir, "pod logs and volumes")
      ->capture_default_str();
  serve->add_option("--worker", serve_options.worker_binary,
                    "the kubetrain-worker binary pods run (default: next to kubetrain, else PATH)");
  serve->add_flag("--api-only", api_only, "serve the API only: no Node, no pods are run");
  serve->add_option("--inject-faults", serve_options.fault_rate,
                    "for chaos tests: answer this fraction of resource requests 500 or 429, and "
                    "end watches early (on average after 1/RATE seconds)")
      ->check(CLI::Range(0.0, 1.0));
  serve->add_option("--fault-seed", serve_options.fault_seed, "seed of --inject-faults' draws")
      ->capture_default_str();
  kt::local::SimulatedNodeOptions& sim = serve_options.simulated;
  serve->add_option("--simulate-nodes", sim.count,
                    "add N simulated Nodes sim-node-00000... (like KWOK) whose pods run no "
                    "process; pods are then scheduled by requests over all nodes")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  serve->add_option("--simulate-gpu-product", sim.gpu_product,
                    "nvidia.com/gpu.product label of the simulated nodes")
      ->capture_default_str();
  serve->add_option("--simulate-gpus-per-node", sim.gpus_per_node,
                    "nvidia.com/gpu allocatable per simulated node")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  serve->add_option("--simulate-gpu-memory", sim.gpu_memory_mib,
                    "nvidia.com/gpu.memory label (MiB) of the simulated nodes")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))
      ->capture_default_str();
  serve->add_option("--simulate-cpus", sim.cpu_cores, "cpu allocatable per simulated node")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  serve->add_option("--simulate-memory-gib", sim.memory_gib,
                    "memory allocatable per simulated node, GiB")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
      ->capture_default_str();
  serve->add_option("--simulate-pod-start-delay", serve_options.simulated_pod_start_delay_seconds,
                    "seconds from a pod's binding to a simulated node to Running")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  serve->add_option("--simulate-pod-duration", serve_options.simulated_pod_duration_seconds,
                    "seconds a simulated pod runs before it Succeeds (0: until deleted); the pod "
                    "annotation kubetrain.dev/simulate-exit-code: \"N\" ends it at once with "
                    "exit code N")
      ->check(CLI::Range(0.0, 1e9))
      ->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::fprintf(stderr, "kubetrain: %s (see kubetrain --help)\n", e.what());
    return 2;
  }

  try {
    if (*plan) return cmd_plan(job_path, cluster_path, profile_paths, refit_paths, format);
    if (*validate) return cmd_validate(job_path, validate_format);
    if (*run) {
      job_path = run_options.job_path;
      return kt::cli::run_job(run_options);
    }
    if (*report) return cmd_report(report_dir, report_out, report_job);
    if (*profiles) return cmd_profiles();
    if (*presets) return cmd_presets();
    if (*serve) {
      serve_options.node = !api_only;
      return kt::cli::local_serve(serve_options);
    }
    if (*version) {
      std::printf("kubetrain %s\n", kVersion);
      return 0;
    }
  } catch (const kt::ValidationError& e) {
    for (const auto& err : e.errors())
      std::fprintf(stderr, "kubetrain: %s: %s\n", job_path.c_str(), err.what());
    return 1;
  } catch (const kt::FieldError& e) {
    std::fprintf(stderr, "kubetrain: %s\n", e.what());
    return 1;
  } catch (const kt::Error& e) {
    std::fprintf(stderr, "kubetrain: %s\n", e.what());
    return 1;
  }
  return 0;
}

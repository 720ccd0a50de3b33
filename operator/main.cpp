// kubetrain-operator: the TrainingJob controller for a Kubernetes cluster (docs/OPERATIONS.md §2). It reads
// its configuration from --kubeconfig, $KUBECONFIG, ~/.kube/config or the pod's service account,
// watches TrainingJobs and the pods they own, and reconciles them with N workers; with
// --leader-elect only the holder of a coordination.k8s.io Lease reconciles. /metrics (the
// controller-runtime names plus kubetrain_*), /healthz and /readyz are served on their own ports.
// Logs are logfmt lines on stderr (time, level, msg, keys).
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "api/error.h"
#include "api/quantity.h"
#include "operator/controller/controller.h"
#include "operator/controller/manager.h"
#include "operator/controller/metrics.h"
#include "operator/kube/cache.h"
#include "operator/kube/config.h"
#include "operator/kube/leader_election.h"
#include "operator/kube/metrics.h"
#include "operator/kube/rest_client.h"
#include "telemetry/process_metrics.h"
#include "telemetry/http_get.h"
#include "telemetry/http_server.h"
#include "telemetry/metrics.h"
#include "telemetry/metrics_endpoint.h"

namespace {

std::string now_text() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[64];
  std::snprintf(text, sizeof text, "%04d-%02d-%02dT%02d:%02d:%02d.%03lldZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<long long>(ms));
  return text;
}

// One logfmt line: ts=… level=… msg="…" key=value…
void log(const char* level, const std::string& message, const std::string& fields = "") {
  std::fprintf(stderr, "ts=%s level=%s msg=\"%s\"%s%s\n", now_text().c_str(), level,
               message.c_str(), fields.empty() ? "" : " ", fields.c_str());
  std::fflush(stderr);
}

// ":8080" or "0.0.0.0:8080" or "127.0.0.1:0" → address and port; "0" disables.
bool parse_bind(const std::string& flag, const std::string& text, std::string& address,
                int& port) {
  if (text == "0") return false;
  const auto colon = text.rfind(':');
  if (colon == std::string::npos)
    throw kt::Error(flag + ": \"" + text + "\" is not HOST:PORT or :PORT (or 0 to disable)");
  address = text.substr(0, colon).empty() ? "0.0.0.0" : text.substr(0, colon);
  try {
    port = std::stoi(text.substr(colon + 1));
  } catch (const std::exception&) {
    throw kt::Error(flag + ": \"" + text + "\" has no port number");
  }
  if (port < 0 || port > 65535) throw kt::Error(flag + ": port " + std::to_string(port) + " out of range");
  return true;
}

std::string identity() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return std::string(host) + "_" + std::to_string(::getpid());
}

}  // namespace

int main(int argc, char** argv) {
  // One malloc arena, not glibc's 8 per core: the informers, workers and the gang's parallel
  // creates each allocate JSON on their own thread, and per-thread arenas held their free pages
  // apart (bench_operator, 10,000 nodes × 1,000 jobs, peak RSS: 327 MiB with glibc's default,
  // 160-198 MiB with two arenas, 156 MiB with one, for ~5 % more CPU; docs/PERFORMANCE.md).
  // MALLOC_ARENA_MAX in the environment still decides when set.
  if (!std::getenv("MALLOC_ARENA_MAX")) mallopt(M_ARENA_MAX, 1);
  CLI::App app{"kubetrain-operator: reconciles TrainingJobs (kubetrain.dev/v1alpha1) on a cluster"};
  std::string kubeconfig, watch_namespace, metrics_bind = ":8080", health_bind = ":8081";
  std::string lease_namespace, lease_name = "kubetrain-operator", lease_owner_role, worker_image;
  bool leader_elect = false;
  int workers = 2;
  app.add_option("--kubeconfig", kubeconfig,
                 "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, else in-cluster)");
  app.add_option("--namespace", watch_namespace, "only this namespace (default: all)");
  app.add_flag("--leader-elect", leader_elect,
               "take a Lease first, so that one of several replicas reconciles");
  app.add_option("--leader-election-namespace", lease_namespace,
                 "namespace of the Lease (default: the configuration's namespace)");
  app.add_option("--leader-election-id", lease_name, "name of the Lease")->capture_default_str();
  app.add_option("--leader-election-role", lease_owner_role,
                 "a Role in the Lease's namespace that owns the Lease, so that deleting the Role "
                 "(helm uninstall) deletes the Lease");
  app.add_option("--metrics-bind-address", metrics_bind, "serve /metrics here; 0 disables")
      ->capture_default_str();
  app.add_option("--health-probe-bind-address", health_bind,
                 "serve /healthz and /readyz here; 0 disables")
      ->capture_default_str();
  app.add_option("--workers", workers, "concurrent reconciles")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--worker-image", worker_image,
                 "image of worker pods when a job names none (spec.resources.image)");
  std::vector<std::string> worker_pull_secrets;
  std::string checkpoint_volume = "pvc", checkpoint_storage_class, checkpoint_size;
  app.add_option("--default-checkpoint-volume", checkpoint_volume,
                 "checkpoints of a job without spec.checkpoint.volume: pvc (a PVC <job>-checkpoints "
                 "per job) or emptyDir (lost with the pod)")
      ->check(CLI::IsMember({"pvc", "emptyDir"}))
      ->capture_default_str();
  app.add_option("--checkpoint-storage-class", checkpoint_storage_class,
                 "StorageClass of those PVCs (default: the cluster's default class)");
  app.add_option("--checkpoint-volume-size", checkpoint_size,
                 "size of those PVCs, e.g. 100Gi (default: keep+1 checkpoints of the model + 25%)");
  app.add_option("--worker-image-pull-secret", worker_pull_secrets,
                 "a Secret in the job's namespace to pull worker images with (repeatable)");
  std::string gang_scheduler = "None", gang_scheduler_name;
  app.add_option("--gang-scheduler", gang_scheduler,
                 "gang scheduling of a job whose spec.runPolicy.schedulingPolicy names none: "
                 "None, Coscheduling (scheduler-plugins PodGroup), Volcano (Volcano PodGroup) or "
                 "Kueue (plain pod groups)")
      ->check(CLI::IsMember({"None", "Coscheduling", "Volcano", "Kueue"}))
      ->capture_default_str();
  app.add_option("--gang-scheduler-name", gang_scheduler_name,
                 "schedulerName of gang-scheduled worker pods (default: the cluster's default "
                 "scheduler for Coscheduling, volcano for Volcano)");
  int64_t autotune_restart_cost = 120, autotune_warmup_steps = 20, autotune_max_switches = 3;
  app.add_option("--autotune-restart-cost", autotune_restart_cost,
                 "seconds a plan switch is taken to cost (stop with a checkpoint, start, "
                 "resume): autotune switches only when the steps left save more")
      ->check(CLI::Range(int64_t{0}, int64_t{86400}))
      ->capture_default_str();
  app.add_option("--autotune-warmup-steps", autotune_warmup_steps,
                 "steps a gang runs before autotune reads its phase times")
      ->check(CLI::Range(int64_t{1}, int64_t{1000000}))
      ->capture_default_str();
  app.add_option("--autotune-max-switches", autotune_max_switches,
                 "plan switches autotune makes per job at most (0: never switch, only fold back)")
      ->check(CLI::Range(int64_t{0}, int64_t{100}))
      ->capture_default_str();
  bool profiling = false, profiling_quick = false;
  int64_t profiling_timeout = 600;
  app.add_flag("--profiling", profiling,
               "before planning a job for a node kind (cpu, or a GPU product) with no "
               "hardware-profile ConfigMap in its namespace, measure one with a profiling pod "
               "(kubetrain-worker profile) and plan with it");
  app.add_flag("--profiling-quick", profiling_quick,
               "profiling pods run `profile --quick` (seconds; fewer repetitions)");
  app.add_option("--profiling-timeout", profiling_timeout,
                 "seconds a job waits for a profiling pod before it is planned without it")
      ->check(CLI::Range(int64_t{10}, int64_t{86400}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  // The stop signals go to sigwait below only.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  try {
    const kt::kube::Config config = kt::kube::load_config(kubeconfig);
    if (lease_namespace.empty()) lease_namespace = config.namespace_;
    kt::telemetry::Registry registry;
    kt::telemetry::add_process_metrics(registry, "operator", "0.1.0");
    kt::kube::KubeMetrics kube_metrics(registry);
    kt::controller::ControllerMetrics controller_metrics(registry);
    kt::kube::RestClientOptions rest_options;
    rest_options.metrics = &kube_metrics;
    kt::kube::RestClient client(config, rest_options);
    log("info", "configuration loaded",
        "source=\"" + config.source + "\" server=" + config.server +
            " namespace=" + (watch_namespace.empty() ? std::string("(all)") : watch_namespace));

    kt::controller::ControllerOptions controller_options;
    controller_options.metrics = &controller_metrics;
    if (!worker_image.empty()) controller_options.children.default_image = worker_image;
    controller_options.children.image_pull_secrets = worker_pull_secrets;
    controller_options.children.checkpoint_pvc = checkpoint_volume == "pvc";
    controller_options.children.checkpoint_storage_class = checkpoint_storage_class;
    controller_options.children.gang_scheduler =
        *kt::api::parse_enum<kt::api::GangScheduler>(gang_scheduler);
    controller_options.children.gang_scheduler_name = gang_scheduler_name;
    if (!checkpoint_size.empty() && !kt::api::parse_quantity(checkpoint_size)) {
      throw kt::Error("--checkpoint-volume-size: \"" + checkpoint_size + "\" is not a quantity (e.g. 100Gi)");
    }
    controller_options.children.checkpoint_size = checkpoint_size;
    controller_options.autotune_restart_cost = std::chrono::seconds(autotune_restart_cost);
    controller_options.autotune_warmup_steps = autotune_warmup_steps;
    controller_options.autotune_max_switches = autotune_max_switches;
    controller_options.profiling = profiling;
    controller_options.profiling_quick = profiling_quick;
    controller_options.profiling_timeout = std::chrono::seconds(profiling_timeout);
    controller_options.fetch_metrics = [](const std::string& host, int port) {
      return kt::telemetry::http_get(host, port, "/metrics", std::chrono::seconds(2));
    };
    // Reads from informer caches, writes to the API server (docs/OPERATIONS.md §2); the manager's
    // informers are the cache's.
    kt::kube::Cache cache(client, kt::controller::operator_cache_options(watch_namespace));
    kt::kube::CachingClient cached_client(client, cache);
    controller_options.api_reader = &client;  // a job's existence before its children's creates
    // Plans read the nodes and their free GPUs from the informers' events (inventory.h). With
    // one watched namespace the pod cache sees only it, so plans list every pod instead.
    std::unique_ptr<kt::controller::InventoryTracker> inventory;
    if (watch_namespace.empty()) {
      inventory = std::make_unique<kt::controller::InventoryTracker>(cache);
      controller_options.inventory = inventory.get();
    }
    kt::controller::EventRecorder events(client);  // outlives the workers that record
    controller_options.events = &events;
    kt::controller::Controller controller(cached_client, controller_options);
    kt::controller::ManagerOptions manager_options;
    manager_options.ns = watch_namespace;
    manager_options.workers = workers;
    manager_options.kube_metrics = &kube_metrics;
    manager_options.controller_metrics = &controller_metrics;
    kt::controller::Manager manager(cache, controller, manager_options);

    std::string address;
    int port = 0;
    std::unique_ptr<kt::telemetry::HttpServer> metrics_server, health_server;
    if (parse_bind("--metrics-bind-address", metrics_bind, address, port)) {
      metrics_server = std::make_unique<kt::telemetry::HttpServer>(address, port);
      kt::telemetry::serve_metrics(*metrics_server, registry);
      metrics_server->start();
      log("info", "serving metrics", "address=" + address + ":" + std::to_string(metrics_server->port()));
    }
    std::atomic<bool> leading{!leader_elect}, lost{false};
    if (parse_bind("--health-probe-bind-address", health_bind, address, port)) {
      health_server = std::make_unique<kt::telemetry::HttpServer>(address, port);
      health_server->handle("/healthz", [](const kt::telemetry::Request&) {
        return kt::telemetry::Response{200, "text/plain; charset=utf-8", "ok"};
      });
      // Ready once the caches have synced (a standby replica is ready too: it only waits).
      health_server->handle("/readyz", [&](const kt::telemetry::Request&) {
        const bool ready = !leading.load() || manager.has_synced();
        return kt::telemetry::Response{ready ? 200 : 503, "text/plain; charset=utf-8",
                                       ready ? "ok" : "informers not synced"};
      });
      health_server->start();
      log("info", "serving health probes",
          "address=" + address + ":" + std::to_string(health_server->port()));
    }

    std::unique_ptr<kt::kube::LeaderElector> elector;
    if (leader_elect) {
      kt::kube::LeaderElectionConfig election;
      election.lease_namespace = lease_namespace;
      election.lease_name = lease_name;
      election.owner_role = lease_owner_role;
      election.identity = identity();
      election.metrics = &kube_metrics;
      // The elector keeps a copy of `election`: the callbacks must not refer to it.
      const std::string me = election.identity;
      election.on_started_leading = [&, me] {
        log("info", "became the leader; reconciling",
            "lease=" + lease_namespace + "/" + lease_name + " identity=" + me);
        leading = true;
        manager.start();
      };
      election.on_stopped_leading = [&] {
        if (!leading.load()) return;
        // As controller-runtime: a replica that lost its lease exits, and is restarted clean.
        log("error", "lost the leader lease; exiting", "lease=" + lease_namespace + "/" + lease_name);
        lost = true;
        ::kill(::getpid(), SIGTERM);
      };
      log("info", "waiting for the leader lease",
          "lease=" + lease_namespace + "/" + lease_name + " identity=" + election.identity);
      elector = std::make_unique<kt::kube::LeaderElector>(client, election);
      elector->start();
    } else {
      // The only replica leads: say so, so that a dashboard's leader panel and the no-leader
      // alert read the same with and without --leader-elect.
      kube_metrics.leader_election_master_status.with({lease_name}).set(1);
      manager.start();
      log("info", "reconciling", "workers=" + std::to_string(workers));
    }

    int signal_number = 0;
    sigwait(&stop_signals, &signal_number);
    log("info", lost ? "stopping after losing the lease" : "stopping",
        "signal=" + std::to_string(signal_number));
    leading = false;
    manager.stop();
    if (elector) elector->stop();  // releases the lease for a successor
    if (health_server) health_server->stop();
    if (metrics_server) metrics_server->stop();
    return lost ? 1 : 0;
  } catch (const std::exception& e) {
    log("error", std::string("kubetrain-operator: ") + e.what());
    return 1;
  }
}

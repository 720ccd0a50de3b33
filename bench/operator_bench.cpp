// The operator at cluster scale (docs/PERFORMANCE.md, "The operator under load"): `kubetrain local
// serve --simulate-nodes N` (N Nodes of 8 × H100 whose pods run no process; a fake kubelet marks
// them Running) and `kubetrain-operator` as real processes, driven through the REST client. Two
// scenarios, each on a fresh server and operator:
//   burst  — J TrainingJobs of one 8-GPU node each, created at once;
//   gang   — one TrainingJob of G nodes (G pods of 8 GPUs).
// For each: the time from the first create to every pod created and to every pod Running; the
// reconcile latency p50/p99 (controller_runtime_reconcile_time_seconds); the API requests the
// operator made per reconcile, in all and in the steady state once every pod runs (counted by the
// server's apiserver_request_total, less the benchmark's own requests), with the LISTs among
// them; the planner's time per job against the N nodes (kubetrain_planner_duration_seconds); the
// operator's peak RSS (VmHWM) and CPU seconds.
//
// Usage: bench_operator [--nodes N] [--jobs J] [--gang-nodes G] [--workers W]
//                       [--scenario burst|gang|both] [--steady-seconds S]
//        (defaults: 10000 nodes, 1000 jobs, a gang of 1000 nodes, 2 workers, both, 15 s)
// Run from the repository root (it applies crds/ with kubectl).
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "operator/kube/config.h"
#include "operator/kube/rest_client.h"
#include "telemetry/http_get.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using kt::kube::Object;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

pid_t spawn(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) != 0) {
    std::perror(args[0].c_str());
    std::exit(1);
  }
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool wait_until(double seconds, const std::function<bool()>& done, int poll_ms = 100) {
  const auto start = Clock::now();
  while (seconds_since(start) < seconds) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
  }
  return done();
}

// One scrape of a Prometheus text exposition: every sample line `name{labels} value`.
struct Scrape {
  std::vector<std::pair<std::string, double>> samples;  // "name{labels}" → value

  static Scrape of(int port) {
    Scrape s;
    const auto text = kt::telemetry::http_get("127.0.0.1", port, "/metrics");
    if (!text) return s;
    std::istringstream lines(*text);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.empty() || line[0] == '#') continue;
      const auto space = line.rfind(' ');
      if (space == std::string::npos) continue;
      s.samples.emplace_back(line.substr(0, space), std::atof(line.c_str() + space + 1));
    }
    return s;
  }
  // The sum of the samples of `name` whose labels contain every one of `label_parts`
  // (e.g. `verb="LIST"`).
  double sum(const std::string& name, const std::vector<std::string>& label_parts = {}) const {
    double total = 0;
    for (const auto& [series, value] : samples) {
      if (series.compare(0, name.size(), name) != 0 ||
          (series.size() > name.size() && series[name.size()] != '{'))
        continue;
      bool all = true;
      for (const auto& part : label_parts) all = all && series.find(part) != std::string::npos;
      if (all) total += value;
    }
    return total;
  }
  // The sums of `name` by the values of the labels `keys` (joined by " "), e.g. by verb and
  // resource.
  std::map<std::string, double> by(const std::string& name,
                                   const std::vector<std::string>& keys) const {
    std::map<std::string, double> out;
    for (const auto& [series, value] : samples) {
      if (series.compare(0, name.size(), name) != 0 || series.size() == name.size() ||
          series[name.size()] != '{')
        continue;
      std::string group;
      for (const auto& key : keys) {
        const auto at = series.find(key + "=\"");
        std::string v = "-";
        if (at != std::string::npos) {
          const auto from = at + key.size() + 2;
          v = series.substr(from, series.find('"', from) - from);
        }
        group += (group.empty() ? "" : " ") + (v.empty() ? std::string("-") : v);
      }
      out[group] += value;
    }
    return out;
  }
  // A histogram's cumulative buckets, `le` → count (summed over the other labels).
  std::map<double, double> buckets(const std::string& name) const {
    std::map<double, double> out;
    const std::string prefix = name + "_bucket{";
    for (const auto& [series, value] : samples) {
      if (series.rfind(prefix, 0) != 0) continue;
      const auto le = series.find("le=\"") + 4;
      const std::string bound = series.substr(le, series.find('"', le) - le);
      out[bound == "+Inf" ? INFINITY : std::stod(bound)] += value;
    }
    return out;
  }
};

// The q-quantile of a Prometheus histogram (cumulative buckets), linear inside the bucket, as
// histogram_quantile() does.
double histogram_quantile(double q, const std::map<double, double>& buckets) {
  if (buckets.empty() || buckets.rbegin()->second == 0) return NAN;
  const double total = buckets.rbegin()->second;
  double previous_le = 0, previous_count = 0;
  for (const auto& [le, count] : buckets) {
    if (count >= q * total) {
      if (std::isinf(le)) return previous_le;
      return previous_le + (le - previous_le) * (q * total - previous_count) /
                               std::max(1.0, count - previous_count);
    }
    previous_le = le;
    previous_count = count;
  }
  return previous_le;
}

// What /proc says of a process: peak RSS and CPU seconds (user + system).
struct ProcessUsage {
  double peak_rss_mib = 0;
  double cpu_seconds = 0;
};

ProcessUsage usage_of(pid_t pid) {
  ProcessUsage u;
  std::istringstream status(read_file("/proc/" + std::to_string(pid) + "/status"));
  std::string key;
  long kib = 0;
  while (status >> key)
    if (key == "VmHWM:") status >> kib;
  u.peak_rss_mib = kib / 1024.0;
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  // Fields after the command's closing parenthesis: state is field 3; utime 14, stime 15.
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));
  std::vector<std::string> f;
  std::string x;
  while (fields >> x) f.push_back(x);
  if (f.size() > 12)
    u.cpu_seconds = (std::stod(f[11]) + std::stod(f[12])) / static_cast<double>(sysconf(_SC_CLK_TCK));
  return u;
}

struct Options {
  int nodes = 10000;
  int jobs = 1000;
  int gang_nodes = 1000;
  int workers = 2;
  std::string scenario = "both";
  double steady_seconds = 15;
};

// One scenario's local serve + operator, and the benchmark's own count of the requests it made
// (subtracted from the server's counter to leave the operator's).
class Cluster {
 public:
  Cluster(const Options& options, const std::string& name) {
    bin_ = fs::read_symlink("/proc/self/exe").parent_path();
    dir_ = fs::temp_directory_path() /
           ("kt-bench-operator-" + std::to_string(getpid()) + "-" + name);
    fs::create_directories(dir_);
    const std::string kubeconfig = (dir_ / "kubeconfig").string();
    server_ = spawn({(bin_ / "kubetrain").string(), "local", "serve", "--api-only",
                     "--simulate-nodes", std::to_string(options.nodes),
                     "--simulate-pod-start-delay", "1", "--kubeconfig-out", kubeconfig,
                     "--workdir", (dir_ / "work").string()},
                    (dir_ / "serve.log").string());
    if (!wait_until(60, [&] { return fs::exists(kubeconfig) && fs::file_size(kubeconfig) > 0; }))
      die("local serve did not start: " + read_file((dir_ / "serve.log").string()));
    const kt::kube::Config config = kt::kube::load_kubeconfig(kubeconfig);
    server_port_ = std::atoi(config.server.substr(config.server.rfind(':') + 1).c_str());
    client_ = std::make_unique<kt::kube::RestClient>(config);
    if (std::system(("kubectl --kubeconfig " + kubeconfig +
                     " apply -f crds/trainingjobs.kubetrain.dev.yaml > /dev/null 2>&1").c_str()) != 0)
      die("kubectl apply -f crds/trainingjobs.kubetrain.dev.yaml failed (is kubectl installed? "
          "run from the repository root)");
    if (!wait_until(10, [&] {
          try {
            list(kt::kube::kTrainingJobs, "");
            return true;
          } catch (const std::exception&) {
            return false;
          }
        }))
      die("TrainingJobs are not served");
    operator_ = spawn({(bin_ / "kubetrain-operator").string(), "--kubeconfig", kubeconfig,
                       "--metrics-bind-address", "127.0.0.1:0", "--health-probe-bind-address", "0",
                       "--workers", std::to_string(options.workers),
                       // --api-only: nobody binds PVCs, and the checkpoints are not measured here.
                       "--default-checkpoint-volume", "emptyDir"},
                      (dir_ / "operator.log").string());
    if (!wait_until(30, [&] {
          const std::string log = read_file((dir_ / "operator.log").string());
          const auto at = log.find("msg=\"serving metrics\" address=127.0.0.1:");
          if (at == std::string::npos) return false;
          operator_port_ = std::atoi(log.c_str() + log.find(':', log.find("address=", at)) + 1);
          return true;
        }))
      die("the operator did not start: " + read_file((dir_ / "operator.log").string()));
  }
  ~Cluster() {
    kill(operator_, SIGTERM);
    waitpid(operator_, nullptr, 0);
    kill(server_, SIGTERM);
    waitpid(server_, nullptr, 0);
    fs::remove_all(dir_);
  }

  kt::kube::Client& client() { return *client_; }
  void create_job(const Object& job) {
    client_->create(kt::kube::kTrainingJobs, "default", job);
  }
  std::vector<Object> list(const kt::kube::Resource& r, const std::string& label) {
    kt::kube::ListOptions options;
    options.label_selector = label;
    return client_->list(r, "default", options).items;
  }
  Scrape server_metrics() const { return Scrape::of(server_port_); }
  Scrape operator_metrics() const { return Scrape::of(operator_port_); }
  ProcessUsage operator_usage() const { return usage_of(operator_); }
  ProcessUsage server_usage() const { return usage_of(server_); }
  [[noreturn]] void die(const std::string& why) {
    std::fprintf(stderr, "bench_operator: %s\n", why.c_str());
    if (operator_ > 0) kill(operator_, SIGTERM);
    if (server_ > 0) kill(server_, SIGTERM);
    std::exit(1);
  }

 private:
  fs::path bin_, dir_;
  pid_t server_ = -1, operator_ = -1;
  int server_port_ = 0, operator_port_ = 0;
  std::unique_ptr<kt::kube::RestClient> client_;
};

// Every labelled pod's phase, from a watch (re-listed when the watch ends).
class PodPhases {
 public:
  PodPhases(kt::kube::Client& client, std::string label)
      : client_(client), label_(std::move(label)) {
    relist();
  }
  // Applies the events that arrive within `wait`.
  void catch_up(std::chrono::milliseconds wait) {
    const auto until = Clock::now() + wait;
    while (Clock::now() < until) {
      if (watch_->ended()) relist();
      auto event = watch_->next(std::chrono::duration_cast<std::chrono::milliseconds>(
          until - Clock::now()));
      if (!event) continue;
      if (event->type == kt::kube::WatchEventType::Error) {
        watch_->stop();
        continue;
      }
      apply(event->type, event->object);
    }
  }
  std::size_t seen() const { return ever_.size(); }
  std::size_t running() const {
    return static_cast<std::size_t>(std::count_if(
        phase_.begin(), phase_.end(), [](const auto& p) { return p.second == "Running"; }));
  }

 private:
  void apply(kt::kube::WatchEventType type, const Object& pod) {
    const std::string name = pod["metadata"].value("name", "");
    if (type == kt::kube::WatchEventType::Bookmark) return;
    ever_.insert(name);
    if (type == kt::kube::WatchEventType::Deleted) {
      phase_.erase(name);
      return;
    }
    phase_[name] = pod.contains("status") ? pod["status"].value("phase", "") : "";
  }
  void relist() {
    kt::kube::ListOptions options;
    options.label_selector = label_;
    const kt::kube::ObjectList list = client_.list(kt::kube::kPods, "default", options);
    phase_.clear();
    for (const Object& pod : list.items) apply(kt::kube::WatchEventType::Added, pod);
    kt::kube::WatchOptions watch;
    watch.resource_version = list.resource_version;
    watch.label_selector = label_;
    watch_ = client_.watch(kt::kube::kPods, "default", watch);
  }

  kt::kube::Client& client_;
  const std::string label_;
  std::unique_ptr<kt::kube::Watch> watch_;
  std::map<std::string, std::string> phase_;  // name -> phase, of the pods that exist
  std::set<std::string> ever_;                // every pod seen, deleted or not
};

Object training_job(const std::string& name, int nodes) {
  const int ranks = 8 * nodes;
  return {{"apiVersion", "kubetrain.dev/v1alpha1"},
          {"kind", "TrainingJob"},
          {"metadata", {{"name", name}, {"namespace", "default"}}},
          {"spec",
           {{"model", {{"preset", "gpt2-124m"}}},
            {"training", {{"steps", 100}, {"globalBatchSize", std::max(32, ranks)}}},
            {"data", {{"source", "synthetic"}}},
            {"resources", {{"maxNodes", nodes}, {"gpusPerNode", 8}}},
            {"parallelism", {{"tensorParallel", 1}, {"dataParallel", ranks}}}}}};
}

// The resource requests the server counted (apiserver_request_total with a resource label),
// of one verb or of all.
double resource_requests(const Scrape& s, const std::string& verb = "") {
  if (verb.empty()) return s.sum("apiserver_request_total") - s.sum("apiserver_request_total", {"resource=\"\""});
  return s.sum("apiserver_request_total", {"verb=\"" + verb + "\""}) -
         s.sum("apiserver_request_total", {"verb=\"" + verb + "\"", "resource=\"\""});
}

void run_scenario(const Options& options, const std::string& name, int jobs, int nodes_per_job) {
  const int pods = jobs * nodes_per_job;
  std::printf("\n== %s: %d TrainingJob(s) of %d node(s) x 8 GPUs (%d pods) on %d simulated "
              "nodes, operator with %d workers\n",
              name.c_str(), jobs, nodes_per_job, pods, options.nodes, options.workers);
  std::fflush(stdout);
  Cluster cluster(options, name);
  const std::string label = "kubetrain.dev/job-name";
  // The pods are followed by a watch, not by LISTs of every pod: at 1,000 pods, a LIST every
  // 250 ms would be most of the server's work, and the operator's latency would measure it.
  PodPhases phases(cluster.client(), label);
  const auto start = Clock::now();
  for (int i = 0; i < jobs; ++i)
    cluster.create_job(training_job(name + "-" + std::to_string(i), nodes_per_job));
  const double create_seconds = seconds_since(start);
  double created_seconds = NAN, running_seconds = NAN;
  const bool all_running = wait_until(
      600,
      [&] {
        phases.catch_up(std::chrono::milliseconds(100));
        if (std::isnan(created_seconds) && phases.seen() >= static_cast<std::size_t>(pods))
          created_seconds = seconds_since(start);
        const bool done = phases.running() >= static_cast<std::size_t>(pods);
        if (done) running_seconds = seconds_since(start);
        return done;
      },
      0);
  const Scrape op_burst = cluster.operator_metrics();
  const Scrape server_burst = cluster.server_metrics();

  // The steady state: every pod runs; the operator only looks at the jobs again for progress.
  std::this_thread::sleep_for(std::chrono::duration<double>(options.steady_seconds));
  const Scrape op_steady = cluster.operator_metrics();
  const Scrape server_steady = cluster.server_metrics();
  const ProcessUsage usage = cluster.operator_usage();
  const ProcessUsage server = cluster.server_usage();

  const double reconciles_burst = op_burst.sum("controller_runtime_reconcile_total");
  // What the operator itself sent (its client-go style REST metrics, informers' lists and
  // watches included): the server's counts also hold this benchmark's own polling.
  const double operator_requests_burst = op_burst.sum("rest_client_requests_total");
  const double operator_gets_burst =
      op_burst.sum("rest_client_requests_total", {"method=\"GET\""});
  const double steady_reconciles = op_steady.sum("controller_runtime_reconcile_total") - reconciles_burst;
  const double steady_requests = resource_requests(server_steady) - resource_requests(server_burst);
  const double steady_lists =
      resource_requests(server_steady, "LIST") - resource_requests(server_burst, "LIST");
  const auto reconcile = op_steady.buckets("controller_runtime_reconcile_time_seconds");
  const auto planner = op_steady.buckets("kubetrain_planner_duration_seconds");
  const double plans = op_steady.sum("kubetrain_planner_duration_seconds_count");
  const double plan_seconds = op_steady.sum("kubetrain_planner_duration_seconds_sum");

  std::printf("create %d job(s) (REST, one client)        %8.2f s\n", jobs, create_seconds);
  std::printf("every pod created (%d)                    %8.2f s%s\n", pods, created_seconds,
              std::isnan(created_seconds) ? "  (NOT REACHED)" : "");
  std::printf("every pod Running                          %8.2f s%s\n", running_seconds,
              all_running ? "" : "  (NOT REACHED)");
  std::printf("reconciles %.0f; reconcile time p50 %.1f ms, p99 %.1f ms (histogram buckets)\n",
              op_steady.sum("controller_runtime_reconcile_total"),
              1e3 * histogram_quantile(0.5, reconcile), 1e3 * histogram_quantile(0.99, reconcile));
  {
    std::string shares;
    const double total = reconcile.empty() ? 0 : reconcile.rbegin()->second;
    for (const auto& [le, count] : reconcile) {
      if (std::isinf(le) || le < 0.004 || le > 0.3 || total <= 0) continue;
      char item[64];
      std::snprintf(item, sizeof item, "%s<= %.0f ms %.1f%%", shares.empty() ? "" : ", ", le * 1e3,
                    100.0 * count / total);
      shares += item;
    }
    std::printf("reconciles within: %s\n", shares.c_str());
  }
  std::printf("API requests per reconcile, to all Running %8.2f (GETs %.2f; informers' included)\n",
              operator_requests_burst / std::max(1.0, reconciles_burst),
              operator_gets_burst / std::max(1.0, reconciles_burst));
  // The writes behind those requests, per job (the server's count: the benchmark writes only
  // the TrainingJobs; the LISTs and WATCHes are left out, they are mostly the benchmark's).
  {
    std::string writes;
    for (const auto& [group, count] : server_burst.by("apiserver_request_total",
                                                      {"verb", "resource", "subresource"})) {
      if (group.rfind("LIST", 0) == 0 || group.rfind("WATCH", 0) == 0 ||
          group.rfind("GET", 0) == 0 || count < jobs * 0.05)
        continue;
      char item[160];
      std::snprintf(item, sizeof item, "%s%s %.2f", writes.empty() ? "" : ", ", group.c_str(),
                    count / std::max(1, jobs));
      writes += item;
    }
    std::printf("writes per job, to all Running: %s\n", writes.c_str());
  }
  std::printf("steady state, %.0f s: %.0f reconciles, %.2f requests and %.2f LISTs per reconcile\n",
              options.steady_seconds, steady_reconciles,
              steady_requests / std::max(1.0, steady_reconciles),
              steady_lists / std::max(1.0, steady_reconciles));
  std::printf("planning per job: mean %.1f ms, p50 %.1f ms, p99 %.1f ms (%.0f plans)\n",
              1e3 * plan_seconds / std::max(1.0, plans), 1e3 * histogram_quantile(0.5, planner),
              1e3 * histogram_quantile(0.99, planner), plans);
  std::printf("operator peak RSS %.1f MiB, CPU %.1f s (the server, simulated kubelet included: "
              "CPU %.1f s, peak RSS %.0f MiB)\n",
              usage.peak_rss_mib, usage.cpu_seconds, server.cpu_seconds, server.peak_rss_mib);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_operator: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--nodes") options.nodes = std::atoi(value().c_str());
    else if (arg == "--jobs") options.jobs = std::atoi(value().c_str());
    else if (arg == "--gang-nodes") options.gang_nodes = std::atoi(value().c_str());
    else if (arg == "--workers") options.workers = std::atoi(value().c_str());
    else if (arg == "--scenario") options.scenario = value();
    else if (arg == "--steady-seconds") options.steady_seconds = std::atof(value().c_str());
    else {
      std::fprintf(stderr,
                   "usage: bench_operator [--nodes N] [--jobs J] [--gang-nodes G] [--workers W] "
                   "[--scenario burst|gang|both] [--steady-seconds S]\n");
      return arg == "--help" || arg == "-h" ? 0 : 2;
    }
  }
  if (options.scenario != "burst" && options.scenario != "gang" && options.scenario != "both") {
    std::fprintf(stderr, "bench_operator: --scenario is burst, gang or both, not %s\n",
                 options.scenario.c_str());
    return 2;
  }
  if (options.scenario != "gang") run_scenario(options, "burst", options.jobs, 1);
  if (options.scenario != "burst") run_scenario(options, "gang", 1, options.gang_nodes);
  return 0;
}

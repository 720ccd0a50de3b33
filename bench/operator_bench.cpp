// The operator under load: `kubetrain local serve` (its Node runs pods as local processes, here
// a stand-in worker that exits at once) and `kubetrain-operator` as real processes; 500
// TrainingJobs created at once through the REST client. Prints the time until every job has its
// children (plan ConfigMap, headless Service, worker Pod) and until every job has Succeeded, the
// reconcile latency p50/p99 from the operator's controller_runtime_reconcile_time_seconds
// histogram, and the operator's peak RSS (VmHWM).
// Usage: bench_operator [jobs] [workers]   (default 500 jobs, 2 operator workers)
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
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

bool wait_until(double seconds, const std::function<bool()>& done) {
  const auto start = Clock::now();
  while (seconds_since(start) < seconds) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return done();
}

// The q-quantile of a Prometheus histogram (cumulative buckets `le` → count), linear inside the
// bucket, as histogram_quantile() does.
double histogram_quantile(double q, const std::map<double, double>& buckets) {
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

int64_t count_of(kt::kube::Client& client, const kt::kube::Resource& r, const std::string& label) {
  kt::kube::ListOptions options;
  options.label_selector = label;
  return static_cast<int64_t>(client.list(r, "default", options).items.size());
}

}  // namespace

int main(int argc, char** argv) {
  const int jobs = argc > 1 ? std::atoi(argv[1]) : 500;
  const int workers = argc > 2 ? std::atoi(argv[2]) : 2;
  const fs::path bin = fs::read_symlink("/proc/self/exe").parent_path();
  const fs::path dir = fs::temp_directory_path() / ("kt-bench-operator-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string fake_worker = (dir / "fake-worker").string();
  {
    std::ofstream out(fake_worker);
    out << "#!/bin/sh\nexit 0\n";
  }
  fs::permissions(fake_worker, fs::perms::owner_all);
  const std::string kubeconfig = (dir / "kubeconfig").string();
  const pid_t server = spawn({(bin / "kubetrain").string(), "local", "serve", "--kubeconfig-out",
                              kubeconfig, "--workdir", (dir / "work").string(), "--worker",
                              fake_worker},
                             (dir / "serve.log").string());
  if (!wait_until(10, [&] { return fs::exists(kubeconfig) && fs::file_size(kubeconfig) > 0; })) {
    std::fprintf(stderr, "local serve did not start: %s\n", read_file((dir / "serve.log").string()).c_str());
    return 1;
  }
  const kt::kube::Config config = kt::kube::load_kubeconfig(kubeconfig);
  kt::kube::RestClient client(config);
  // The CRD, as kubectl apply would create it.
  std::system(("kubectl --kubeconfig " + kubeconfig +
               " apply -f crds/trainingjobs.kubetrain.dev.yaml > /dev/null 2>&1 || true").c_str());
  if (!wait_until(5, [&] {
        try {
          client.list(kt::kube::kTrainingJobs, "default", {});
          return true;
        } catch (const std::exception&) {
          return false;
        }
      })) {
    std::fprintf(stderr, "TrainingJobs are not served (is kubectl installed? run from the repository root)\n");
    kill(server, SIGTERM);
    return 1;
  }
  const pid_t op = spawn({(bin / "kubetrain-operator").string(), "--kubeconfig", kubeconfig,
                          "--metrics-bind-address", "127.0.0.1:0", "--health-probe-bind-address",
                          "0", "--workers", std::to_string(workers)},
                         (dir / "operator.log").string());
  int metrics_port = 0;
  wait_until(10, [&] {
    const std::string log = read_file((dir / "operator.log").string());
    const auto at = log.find("msg=\"serving metrics\" address=127.0.0.1:");
    if (at == std::string::npos) return false;
    metrics_port = std::atoi(log.c_str() + log.find(':', log.find("address=", at)) + 1);
    return true;
  });

  std::printf("bench_operator: %d TrainingJobs at once, operator with %d workers, pods exit at once\n",
              jobs, workers);
  const auto start = Clock::now();
  for (int i = 0; i < jobs; ++i) {
    const Object job = {
        {"apiVersion", "kubetrain.dev/v1alpha1"},
        {"kind", "TrainingJob"},
        {"metadata", {{"name", "job-" + std::to_string(i)}, {"namespace", "default"}}},
        {"spec",
         {{"model", {{"preset", "tiny"}}},
          {"training", {{"steps", 10}, {"globalBatchSize", 8}}}}}};
    client.create(kt::kube::kTrainingJobs, "default", job);
  }
  const double create_seconds = seconds_since(start);
  const std::string label = "kubetrain.dev/job-name";
  const bool children = wait_until(600, [&] {
    return count_of(client, kt::kube::kConfigMaps, "") >= jobs &&
           count_of(client, kt::kube::kServices, "") >= jobs &&
           count_of(client, kt::kube::kPods, label) >= jobs;
  });
  const double children_seconds = seconds_since(start);
  const bool finished = wait_until(900, [&] {
    int64_t done = 0;
    for (const auto& job : client.list(kt::kube::kTrainingJobs, "default", {}).items)
      if (job.contains("status") && job["status"].value("phase", "") == "Succeeded") ++done;
    return done >= jobs;
  });
  const double finished_seconds = seconds_since(start);

  std::map<double, double> buckets;
  double reconciles = 0;
  if (auto text = kt::telemetry::http_get("127.0.0.1", metrics_port, "/metrics")) {
    std::istringstream lines(*text);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.rfind("controller_runtime_reconcile_time_seconds_bucket{", 0) == 0) {
        const auto le = line.find("le=\"") + 4;
        const std::string bound = line.substr(le, line.find('"', le) - le);
        buckets[bound == "+Inf" ? INFINITY : std::stod(bound)] +=
            std::stod(line.substr(line.rfind(' ') + 1));
      }
      if (line.rfind("controller_runtime_reconcile_total{", 0) == 0)
        reconciles += std::stod(line.substr(line.rfind(' ') + 1));
    }
  }
  long peak_kib = 0;
  {
    std::istringstream status(read_file("/proc/" + std::to_string(op) + "/status"));
    std::string key;
    while (status >> key)
      if (key == "VmHWM:") status >> peak_kib;
  }
  std::printf("create %d jobs (REST, one client)     %8.2f s\n", jobs, create_seconds);
  std::printf("every job has its children            %8.2f s%s\n", children_seconds,
              children ? "" : "  (NOT REACHED)");
  std::printf("every job Succeeded                   %8.2f s%s\n", finished_seconds,
              finished ? "" : "  (NOT REACHED)");
  if (!buckets.empty())
    std::printf("reconciles %.0f; reconcile time p50 %.1f ms, p99 %.1f ms (histogram buckets)\n",
                reconciles, 1e3 * histogram_quantile(0.5, buckets),
                1e3 * histogram_quantile(0.99, buckets));
  std::printf("operator peak RSS                     %8.1f MiB\n", peak_kib / 1024.0);
  kill(op, SIGTERM);
  waitpid(op, nullptr, 0);
  kill(server, SIGTERM);
  waitpid(server, nullptr, 0);
  fs::remove_all(dir);
  return children && finished ? 0 : 1;
}

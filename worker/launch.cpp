#include "worker/launch.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "api/error.h"
#include "telemetry/http_get.h"
#include "telemetry/http_server.h"
#include "telemetry/merge.h"
#include "telemetry/metrics_endpoint.h"

extern char** environ;

namespace kt::worker {
namespace {

using Clock = std::chrono::steady_clock;

// Output of all ranks goes through here so that lines of different ranks never interleave.
std::mutex output_mutex;

void write_line(FILE* to, const std::string& line) {
  std::lock_guard lock(output_mutex);
  std::fwrite(line.data(), 1, line.size(), to);
  std::fflush(to);
}

struct Rank {
  int global = 0;
  int local = 0;
  pid_t pid = -1;
  bool alive = false;
  std::thread stdout_reader, stderr_reader;
};

// Metrics ports the ranks announced, by local rank (0: not yet).
class MetricsPorts {
 public:
  explicit MetricsPorts(size_t ranks) : ports_(ranks, 0) {}
  void set(size_t local, int port) {
    std::lock_guard lock(mutex_);
    ports_[local] = port;
  }
  std::vector<int> all() const {
    std::lock_guard lock(mutex_);
    return ports_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<int> ports_;
};

// "metrics on http://127.0.0.1:PORT/metrics" → PORT, or 0.
int announced_port(const std::string& line) {
  const std::string head = "metrics on http://";
  if (line.compare(0, head.size(), head) != 0) return 0;
  const size_t colon = line.rfind(':');
  const size_t slash = line.find('/', colon);
  if (colon == std::string::npos || colon < head.size() || slash == std::string::npos) return 0;
  try {
    return std::stoi(line.substr(colon + 1, slash - colon - 1));
  } catch (const std::exception&) {
    return 0;
  }
}

// Copies `fd` to `to` line by line with "[rank N] " in front; runs until the rank closes it.
void relay(int fd, FILE* to, int global_rank, MetricsPorts* ports, size_t local) {
  const std::string prefix = "[rank " + std::to_string(global_rank) + "] ";
  std::string pending;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buffer, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t end; (end = pending.find('\n', start)) != std::string::npos; start = end + 1) {
      const std::string line = pending.substr(start, end - start);
      if (ports != nullptr) {
        if (const int port = announced_port(line)) ports->set(local, port);
      }
      write_line(to, prefix + line + "\n");
    }
    pending.erase(0, start);
  }
  if (!pending.empty()) write_line(to, prefix + pending + "\n");
  ::close(fd);
}

std::string describe_exit(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "code " + std::to_string(128 + sig) + " (signal " + std::to_string(sig) + ", " +
           ::strsignal(sig) + ")";
  }
  return "code " + std::to_string(WEXITSTATUS(status));
}

int exit_code_of(int status) {
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

// The environment of a rank: ours, with the rendezvous variables replaced.
std::vector<std::string> rank_environment(const LaunchOptions& options, const Rank& rank) {
  const std::map<std::string, std::string> ours{
      {"RANK", std::to_string(rank.global)},
      {"LOCAL_RANK", std::to_string(rank.local)},
      {"WORLD_SIZE", std::to_string(options.world_size)},
      {"MASTER_ADDR", options.master_addr},
      {"MASTER_PORT", std::to_string(options.master_port)},
      {"NODE_RANK", std::to_string(options.node_rank)}};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    if (!ours.count(entry.substr(0, entry.find('=')))) env.push_back(entry);
  }
  for (const auto& [name, value] : ours) env.push_back(name + "=" + value);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

void signal_all(std::vector<Rank>& ranks, int sig) {
  for (auto& rank : ranks)
    if (rank.alive) ::kill(rank.pid, sig);
}

}  // namespace

int launch_ranks(const LaunchOptions& options) {
  const int procs = options.procs_per_node;
  if (procs < 1) throw Error("procsPerNode must be at least 1, not " + std::to_string(procs));
  if ((options.node_rank + 1) * procs > options.world_size || options.node_rank < 0) {
    throw Error("NODE_RANK=" + std::to_string(options.node_rank) + " with " +
                std::to_string(procs) + " rank(s) per node does not fit in a world of " +
                std::to_string(options.world_size));
  }

  // The signals the main loop handles are blocked in every thread (the HTTP server's included,
  // which inherit the mask), so they arrive only through sigtimedwait below.
  sigset_t handled, previous;
  sigemptyset(&handled);
  sigaddset(&handled, SIGTERM);
  sigaddset(&handled, SIGINT);
  sigaddset(&handled, SIGCHLD);
  ::pthread_sigmask(SIG_BLOCK, &handled, &previous);
  struct RestoreMask {
    sigset_t mask;
    ~RestoreMask() { ::pthread_sigmask(SIG_SETMASK, &mask, nullptr); }
  } restore{previous};

  MetricsPorts ports(static_cast<size_t>(procs));
  std::unique_ptr<telemetry::HttpServer> server;
  if (options.metrics_port >= 0) {
    server = std::make_unique<telemetry::HttpServer>(options.metrics_address, options.metrics_port);
    server->handle("/metrics", [&ports](const telemetry::Request&) {
      std::vector<std::string> texts;
      for (int port : ports.all()) {
        if (port == 0) continue;  // not serving yet
        // A rank that does not answer in 2 s is left out of this scrape.
        if (auto text =
                telemetry::http_get("127.0.0.1", port, "/metrics", std::chrono::seconds(2)))
          texts.push_back(std::move(*text));
      }
      return telemetry::Response{200, telemetry::kPrometheusTextContentType,
                                 telemetry::merge_expositions(texts)};
    });
    server->handle("/healthz", [](const telemetry::Request&) {
      return telemetry::Response{200, "text/plain; charset=utf-8", "ok"};
    });
    server->start();
    std::printf("metrics on http://%s:%d/metrics\n", options.metrics_address.c_str(),
                server->port());
    std::fflush(stdout);
  }

  std::vector<Rank> ranks(static_cast<size_t>(procs));
  for (int local = 0; local < procs; ++local) {
    Rank& rank = ranks[static_cast<size_t>(local)];
    rank.local = local;
    rank.global = options.node_rank * procs + local;
    // Everything exec needs is built before fork: the child may only make async-signal-safe
    // calls, since this process has threads.
    std::vector<std::string> argv_strings{options.child_program};
    argv_strings.insert(argv_strings.end(), options.child_args.begin(), options.child_args.end());
    std::vector<std::string> env_strings = rank_environment(options, rank);
    std::vector<char*> argv = c_strings(argv_strings), envp = c_strings(env_strings);
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
      throw Error(std::string("cannot create pipes for rank output: ") + std::strerror(errno));
    }
    const pid_t launcher = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) throw Error(std::string("cannot start a rank: ") + std::strerror(errno));
    if (pid == 0) {
      // Own process group: a terminal's Ctrl-C reaches only the launcher, which forwards it
      // once, instead of every rank getting it twice.
      ::setpgid(0, 0);
      // A rank must not outlive its launcher (killed with SIGKILL, it cannot stop them).
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher) ::_exit(128 + SIGKILL);  // it died before prctl
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
      ::execve(argv[0], argv.data(), envp.data());
      const char* why = "kubetrain-worker launch: cannot execute the rank program\n";
      ssize_t unused = ::write(STDERR_FILENO, why, std::strlen(why));
      (void)unused;
      ::_exit(127);
    }
    ::close(out[1]);
    ::close(err[1]);
    rank.pid = pid;
    rank.alive = true;
    rank.stdout_reader =
        std::thread(relay, out[0], stdout, rank.global, &ports, static_cast<size_t>(local));
    rank.stderr_reader = std::thread(relay, err[0], stderr, rank.global, nullptr, 0);
  }

  int alive = procs;
  std::optional<int> failure_code;
  bool forwarded = false;
  // After a failure: when the ranks that ignored SIGTERM get SIGKILL (none: no deadline).
  bool kill_pending = false;
  Clock::time_point kill_at{};
  while (alive > 0) {
    timespec tick{0, 100'000'000};
    const int sig = ::sigtimedwait(&handled, nullptr, &tick);
    if (sig == SIGTERM || sig == SIGINT) {
      // The ranks checkpoint and exit on their own (143); the kubelet's grace period, not us,
      // bounds how long that may take.
      forwarded = true;
      kill_pending = false;
      write_line(stderr, std::string("kubetrain-worker launch: forwarding SIG") +
                             ::sigabbrev_np(sig) + " to " + std::to_string(alive) + " rank(s)\n");
      signal_all(ranks, sig);
    }
    int status = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      for (auto& rank : ranks) {
        if (rank.pid != pid || !rank.alive) continue;
        rank.alive = false;
        --alive;
        const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (failed && !failure_code) {
          failure_code = exit_code_of(status);
          write_line(stderr, "kubetrain-worker launch: rank " + std::to_string(rank.global) +
                                 " exited with " + describe_exit(status) + "\n");
          if (alive > 0) {
            if (!forwarded) {
              write_line(stderr, "kubetrain-worker launch: stopping the other " +
                                     std::to_string(alive) + " rank(s)\n");
            }
            signal_all(ranks, SIGTERM);
            if (!forwarded) {
              kill_pending = true;
              kill_at = Clock::now() + std::chrono::seconds(options.kill_grace_seconds);
            }
          }
        }
      }
    }
    if (kill_pending && Clock::now() >= kill_at) {
      write_line(stderr, "kubetrain-worker launch: " + std::to_string(alive) +
                             " rank(s) still running after " +
                             std::to_string(options.kill_grace_seconds) + " s; killing them\n");
      signal_all(ranks, SIGKILL);
      kill_pending = false;
    }
  }
  for (auto& rank : ranks) {
    rank.stdout_reader.join();
    rank.stderr_reader.join();
  }
  if (server) server->stop();
  return failure_code.value_or(0);
}

}  // namespace kt::worker

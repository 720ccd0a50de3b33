// kubetrain's HTTP server (http/server.h) against cpp-httplib 0.11.4 (Debian's libcpp-httplib-dev,
// with its default fixed thread pool and with a thread-per-connection task queue), on what local
// serve and the /metrics endpoints need: many long-lived watch streams, slow and stalled clients,
// a hang-up during a quiet stream, bounds on request line, head and body, malformed requests,
// connection bursts and keep-alive. The figures are in docs/RELIABILITY.md "HTTP servers".
//
//   build/bin/bench_http_servers            # about 2 minutes, prints one table per measurement
//
// Every server serves the same endpoints: GET /healthz ("ok"); GET /watch?mode=tick (an event
// every 100 ms), quiet (nothing, checking for a hang-up every 50 ms) or fast (4 KiB events as
// fast as they go); POST /body (the body's size). Bodies are bounded at 16 MiB in both.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "http/server.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// What the servers' watch handlers report: how many run, and when the last one ended.
struct Probe {
  std::atomic<int> watches_running{0};
  std::atomic<long long> last_watch_end_ns{0};
  void watch_ended() {
    last_watch_end_ns = Clock::now().time_since_epoch().count();
    --watches_running;
  }
};

struct ServerUnderTest {
  std::string name;
  std::function<int(Probe&)> start;  // returns the port
  std::function<void()> stop;
};

// ---- kubetrain's server -----------------------------------------------------------------------

ServerUnderTest ours() {
  auto server = std::make_shared<std::unique_ptr<kt::http::HttpServer>>();
  ServerUnderTest s;
  s.name = "kubetrain http/server";
  s.start = [server](Probe& probe) {
    *server = std::make_unique<kt::http::HttpServer>(
        "127.0.0.1", 0, [&probe](const kt::http::HttpRequest& r, kt::http::ResponseWriter& w) {
          if (r.path == "/healthz") return w.send(200, "text/plain", "ok");
          if (r.path == "/body") return w.send(200, "text/plain", std::to_string(r.body.size()));
          if (r.path != "/watch") return w.send(404, "text/plain", "not found");
          ++probe.watches_running;
          w.begin_stream(200, "application/json");
          const std::string mode = r.param("mode");
          const std::string event = mode == "fast" ? std::string(4096, 'e') : "{\"type\":\"ADDED\"}\n";
          for (;;) {
            if (mode == "quiet") {
              if (w.closed()) break;
              std::this_thread::sleep_for(50ms);
              continue;
            }
            if (mode == "tick") std::this_thread::sleep_for(100ms);
            if (!w.write(event)) break;
          }
          probe.watch_ended();
        });
    (*server)->start();
    return (*server)->port();
  };
  s.stop = [server] { server->reset(); };
  return s;
}

// ---- cpp-httplib ------------------------------------------------------------------------------

// A task per connection on its own thread: what cpp-httplib needs so that long-lived streams do
// not take its fixed pool. shutdown() waits for the running tasks.
class ThreadPerTask : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard lock(mutex_);
      ++running_;
    }
    std::thread([this, fn = std::move(fn)] {
      fn();
      std::lock_guard lock(mutex_);
      --running_;
      done_.notify_all();
    }).detach();
  }
  void shutdown() override {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [this] { return running_ == 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  int running_ = 0;
};

ServerUnderTest httplib_server(bool thread_per_connection) {
  struct State {
    httplib::Server server;
    std::thread listener;
  };
  auto state = std::make_shared<std::unique_ptr<State>>();
  ServerUnderTest s;
  s.name = thread_per_connection ? "cpp-httplib, thread per conn" : "cpp-httplib, default pool";
  s.start = [state, thread_per_connection](Probe& probe) {
    *state = std::make_unique<State>();
    httplib::Server& server = (*state)->server;
    if (thread_per_connection) server.new_task_queue = [] { return new ThreadPerTask; };
    server.set_payload_max_length(16 * 1024 * 1024);
    server.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok", "text/plain");
    });
    server.Post("/body", [](const httplib::Request& req, httplib::Response& res) {
      res.set_content(std::to_string(req.body.size()), "text/plain");
    });
    server.Get("/watch", [&probe](const httplib::Request& req, httplib::Response& res) {
      ++probe.watches_running;
      const std::string mode = req.get_param_value("mode");
      res.set_chunked_content_provider(
          "application/json",
          [mode](std::size_t, httplib::DataSink& sink) {
            // Called again and again while it returns true; false ends (and drops) the stream.
            if (mode == "quiet") {
              std::this_thread::sleep_for(50ms);
              return sink.is_writable();
            }
            if (mode == "tick") std::this_thread::sleep_for(100ms);
            const std::string event =
                mode == "fast" ? std::string(4096, 'e') : "{\"type\":\"ADDED\"}\n";
            return sink.write(event.data(), event.size());
          },
          [&probe](bool) { probe.watch_ended(); });
    });
    const int port = server.bind_to_any_port("127.0.0.1");
    (*state)->listener = std::thread([&server] { server.listen_after_bind(); });
    while (!server.is_running()) std::this_thread::sleep_for(1ms);
    return port;
  };
  s.stop = [state] {
    (*state)->server.stop();
    (*state)->listener.join();
    state->reset();
  };
  return s;
}

// ---- a raw client -----------------------------------------------------------------------------

int connect_to(int port, std::chrono::milliseconds timeout) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const timeval tv{static_cast<time_t>(timeout.count() / 1000),
                   static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void send_text(int fd, const std::string& text) {
  for (std::size_t sent = 0; sent < text.size();) {
    const ssize_t n = ::send(fd, text.data() + sent, text.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<std::size_t>(n);
  }
}

// Reads until the status line has arrived: the status, 0 if the server closed first, -1 on
// timeout (the socket's receive timeout).
int read_status(int fd) {
  std::string raw;
  char buffer[4096];
  while (raw.find("\r\n") == std::string::npos) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n == 0) return 0;
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? -1 : 0;
    raw.append(buffer, static_cast<std::size_t>(n));
  }
  int status = 0;
  std::sscanf(raw.c_str(), "HTTP/1.%*d %d", &status);
  return status;
}

// One request on a fresh connection: status (0 closed, -1 timeout) and milliseconds.
std::pair<int, double> exchange(int port, const std::string& raw, std::chrono::milliseconds timeout) {
  const auto start = Clock::now();
  const int fd = connect_to(port, timeout);
  if (fd < 0) return {0, ms_since(start)};
  send_text(fd, raw);
  const int status = read_status(fd);
  ::close(fd);
  return {status, ms_since(start)};
}

std::string describe(int status) {
  return status > 0 ? std::to_string(status) : status == 0 ? "closed" : "timeout";
}

const std::string kHealthz = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

// Waits until no watch handler runs, up to `cap`; the time it took, or -1.
double wait_watches_ended(Probe& probe, Clock::time_point since, std::chrono::seconds cap) {
  while (probe.watches_running > 0 && Clock::now() - since < cap) std::this_thread::sleep_for(5ms);
  if (probe.watches_running > 0) return -1;
  const Clock::time_point end{Clock::duration(probe.last_watch_end_ns.load())};
  return std::chrono::duration<double, std::milli>(end - since).count();
}

void close_all(std::vector<int>& fds) {
  for (const int fd : fds) ::close(fd);
  fds.clear();
}

// ---- the measurements -------------------------------------------------------------------------

// N concurrent tick watches: how many get their response head within 2 s, and how long a
// /healthz takes while they run.
void many_watches(ServerUnderTest& s, int watches) {
  Probe probe;
  const int port = s.start(probe);
  std::vector<int> fds;
  for (int i = 0; i < watches; ++i) {
    const int fd = connect_to(port, 2000ms);
    send_text(fd, "GET /watch?mode=tick HTTP/1.1\r\nHost: x\r\n\r\n");
    fds.push_back(fd);
  }
  int answered = 0;
  for (const int fd : fds) answered += read_status(fd) == 200;
  const auto [status, ms] = exchange(port, kHealthz, 3000ms);
  std::printf("  %-30s %3d watches: %3d answered in 2 s; GET /healthz meanwhile: %s in %.0f ms\n",
              s.name.c_str(), watches, answered, describe(status).c_str(), ms);
  close_all(fds);
  wait_watches_ended(probe, Clock::now(), 10s);
  s.stop();
}

// N connections that sent half a head and stalled: /healthz meanwhile, and how long the server
// keeps a stalled one open (capped).
void slow_clients(ServerUnderTest& s, int clients) {
  Probe probe;
  const int port = s.start(probe);
  std::vector<int> fds;
  const auto stalled_since = Clock::now();
  for (int i = 0; i < clients; ++i) {
    const int fd = connect_to(port, 40'000ms);
    send_text(fd, "GET /healthz HTTP/1.1\r\nHost: x\r\n");
    fds.push_back(fd);
  }
  const auto [status, ms] = exchange(port, kHealthz, 3000ms);
  const int first = read_status(fds.front());  // blocks until the server closes (or 40 s)
  std::printf("  %-30s %3d stalled heads: GET /healthz meanwhile: %s in %.0f ms; a stalled one "
              "%s after %.1f s\n",
              s.name.c_str(), clients, describe(status).c_str(), ms,
              first == -1 ? "still open" : ("answered " + describe(first)).c_str(),
              ms_since(stalled_since) / 1000);
  close_all(fds);
  s.stop();
}

// A quiet watch whose client hangs up: how long until the server's handler ends.
void quiet_hangup(ServerUnderTest& s) {
  Probe probe;
  const int port = s.start(probe);
  const int fd = connect_to(port, 2000ms);
  send_text(fd, "GET /watch?mode=quiet HTTP/1.1\r\nHost: x\r\n\r\n");
  const int status = read_status(fd);
  std::this_thread::sleep_for(200ms);
  const auto closed_at = Clock::now();
  ::close(fd);
  const double ms = wait_watches_ended(probe, closed_at, 10s);
  std::printf("  %-30s quiet watch (%s), client hangs up: handler ended %s\n", s.name.c_str(),
              describe(status).c_str(),
              ms < 0 ? "not within 10 s" : ("after " + std::to_string(int(ms)) + " ms").c_str());
  s.stop();
}

// A fast watch whose client never reads: how long the server's handler stays blocked, and
// whether /healthz is served meanwhile.
void stalled_reader(ServerUnderTest& s) {
  Probe probe;
  const int port = s.start(probe);
  const int fd = connect_to(port, 2000ms);
  const int small = 4096;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  send_text(fd, "GET /watch?mode=fast HTTP/1.1\r\nHost: x\r\n\r\n");
  const auto since = Clock::now();
  std::this_thread::sleep_for(500ms);
  const auto [status, ms] = exchange(port, kHealthz, 3000ms);
  const double ended = wait_watches_ended(probe, since, 40s);
  std::printf("  %-30s watch never read: GET /healthz meanwhile %s in %.0f ms; handler %s\n",
              s.name.c_str(), describe(status).c_str(), ms,
              ended < 0 ? "still blocked after 40 s"
                        : ("dropped the client after " + std::to_string(ended / 1000).substr(0, 4) +
                           " s").c_str());
  ::close(fd);
  wait_watches_ended(probe, Clock::now(), 10s);
  s.stop();
}

// Bounds and malformed requests: the status each gets, and that the server still serves.
void bounds(ServerUnderTest& s) {
  Probe probe;
  const int port = s.start(probe);
  std::string many_headers = "GET /healthz HTTP/1.1\r\n";
  for (int i = 0; i < 20'000; ++i) many_headers += "X-" + std::to_string(i) + ": v\r\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"request line 9 KiB", "GET /" + std::string(9 * 1024, 'a') + " HTTP/1.1\r\n\r\n"},
      {"request line 1 MiB", "GET /" + std::string(1024 * 1024, 'a') + " HTTP/1.1\r\n\r\n"},
      {"one header 70 KiB", "GET /healthz HTTP/1.1\r\nX: " + std::string(70 * 1024, 'v') + "\r\n\r\n"},
      {"20000 headers (200 KiB)", many_headers + "\r\n"},
      {"Content-Length 17 MiB", "POST /body HTTP/1.1\r\nContent-Length: 17825792\r\n\r\n"},
      {"chunk of 17 MiB", "POST /body HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1100000\r\n"},
      {"GARBAGE", "GARBAGE\r\n\r\n"},
      {"four words", "GET /healthz HTTP/1.1 x\r\n\r\n"},
      {"HTTP/2.0", "GET /healthz HTTP/2.0\r\n\r\n"},
      {"header without colon", "GET /healthz HTTP/1.1\r\nNoColon\r\n\r\n"},
      {"space in header name", "GET /healthz HTTP/1.1\r\nBad Name: x\r\n\r\n"},
      {"obs-fold", "GET /healthz HTTP/1.1\r\nA: b\r\n c\r\n\r\n"},
      {"Content-Length abc", "POST /body HTTP/1.1\r\nContent-Length: abc\r\n\r\n"},
      {"Content-Length -1", "POST /body HTTP/1.1\r\nContent-Length: -1\r\n\r\n"},
      {"Content-Length 2x", "POST /body HTTP/1.1\r\nContent-Length: 2x\r\n\r\nxx"},
      {"two Content-Lengths", "POST /body HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx"},
      {"CL and chunked", "POST /body HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"},
      {"chunk size zz", "POST /body HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"},
  };
  std::printf("  %s:\n", s.name.c_str());
  for (const auto& [what, raw] : cases) {
    const auto [status, ms] = exchange(port, raw, 6000ms);
    std::printf("    %-26s -> %-7s (%.0f ms)\n", what.c_str(), describe(status).c_str(), ms);
  }
  std::printf("    %-26s -> %s\n", "then GET /healthz", describe(exchange(port, kHealthz, 3000ms).first).c_str());
  s.stop();
}

// N clients connect and GET /healthz at once: how many succeed, and the slowest.
void burst(ServerUnderTest& s, int clients) {
  Probe probe;
  const int port = s.start(probe);
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  std::vector<double> ms(static_cast<std::size_t>(clients));
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      const auto [status, took] = exchange(port, kHealthz, 10'000ms);
      ok += status == 200;
      ms[static_cast<std::size_t>(i)] = took;
    });
  }
  for (auto& t : threads) t.join();
  std::sort(ms.begin(), ms.end());
  std::printf("  %-30s %d simultaneous GETs: %d ok, median %.0f ms, slowest %.0f ms\n",
              s.name.c_str(), clients, ok.load(), ms[ms.size() / 2], ms.back());
  s.stop();
}

// Keep-alive: requests on one connection until the server closes it (at most 100), and the rate
// of sequential requests on fresh connections.
void keep_alive_and_rate(ServerUnderTest& s) {
  Probe probe;
  const int port = s.start(probe);
  const int fd = connect_to(port, 2000ms);
  int served = 0;
  for (; served < 100; ++served) {
    send_text(fd, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    std::string raw;
    char buffer[1024];
    while (raw.find("\r\n\r\nok") == std::string::npos) {
      const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
      if (n <= 0) break;
      raw.append(buffer, static_cast<std::size_t>(n));
    }
    if (raw.find("\r\n\r\nok") == std::string::npos) break;
  }
  ::close(fd);
  const auto start = Clock::now();
  int ok = 0;
  for (int i = 0; i < 2000; ++i) ok += exchange(port, kHealthz, 2000ms).first == 200;
  std::printf("  %-30s keep-alive: %d of 100 requests on one connection; fresh connections: "
              "%.0f req/s (%d/2000 ok)\n",
              s.name.c_str(), served, 2000 / (ms_since(start) / 1000), ok);
  s.stop();
}

}  // namespace

int main() {
  std::vector<ServerUnderTest> servers = {ours(), httplib_server(false), httplib_server(true)};
  std::printf("cpp-httplib %s; hardware_concurrency %u (default pool: max(8, n-1) threads)\n",
              CPPHTTPLIB_VERSION, std::thread::hardware_concurrency());
  std::printf("\n1. long-lived watches\n");
  for (auto& s : servers) many_watches(s, 7);
  for (auto& s : servers) many_watches(s, 32);
  std::printf("\n2. slow clients (half a head, then nothing)\n");
  for (auto& s : servers) slow_clients(s, 16);
  std::printf("\n3. hang-up during a quiet watch\n");
  for (auto& s : servers) quiet_hangup(s);
  std::printf("\n4. stalled reader of a fast watch\n");
  for (auto& s : servers) stalled_reader(s);
  std::printf("\n5. bounds and malformed requests\n");
  for (auto& s : servers) bounds(s);
  std::printf("\n6. connection burst\n");
  for (auto& s : servers) burst(s, 200);
  std::printf("\n7. keep-alive and request rate\n");
  for (auto& s : servers) keep_alive_and_rate(s);
  return 0;
}

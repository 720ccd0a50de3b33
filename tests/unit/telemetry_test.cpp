// Telemetry: the metrics registry's text exposition, its thread safety and misuse checks, the
// HTTP endpoint over a real socket, and the worker's metrics through `promtool check metrics`.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "api/error.h"
#include "telemetry/http_get.h"
#include "telemetry/http_server.h"
#include "telemetry/metrics.h"
#include "telemetry/process_metrics.h"
#include "telemetry/metrics_endpoint.h"
#include "telemetry/worker_metrics.h"

namespace kt::telemetry {
namespace {

// ---- exposition ------------------------------------------------------------------------------

TEST(Exposition, RendersSortedFamiliesWithConstLabelsEscapingAndCumulativeBuckets) {
  Registry registry({{"job", "gpt"}, {"rank", "0"}});
  auto& requests = registry.counter("http_requests_total", "Requests served.\nBy code \\ path.",
                                    {"code", "path"});
  requests.with({"404", "line\nbreak\\x"}).inc();
  requests.with({"200", "/a\"b"}).inc(3);
  requests.with({"200", "/"}).inc(0.5);
  registry.gauge("a_temperature_celsius", "Temperature.").with({}).set(-1.5);
  auto& latency =
      registry.histogram("rpc_duration_seconds", "RPC latency.", {0.125, 0.5, 1}, {"method"});
  for (double seconds : {0.0625, 0.125, 0.25, 2.0}) latency.with({"get"}).observe(seconds);
  latency.with({"put"});  // created, never observed

  const std::string expected =
      "# HELP a_temperature_celsius Temperature.\n"
      "# TYPE a_temperature_celsius gauge\n"
      "a_temperature_celsius{job=\"gpt\",rank=\"0\"} -1.5\n"
      "# HELP http_requests_total Requests served.\\nBy code \\\\ path.\n"
      "# TYPE http_requests_total counter\n"
      "http_requests_total{job=\"gpt\",rank=\"0\",code=\"200\",path=\"/\"} 0.5\n"
      "http_requests_total{job=\"gpt\",rank=\"0\",code=\"200\",path=\"/a\\\"b\"} 3\n"
      "http_requests_total{job=\"gpt\",rank=\"0\",code=\"404\",path=\"line\\nbreak\\\\x\"} 1\n"
      "# HELP rpc_duration_seconds RPC latency.\n"
      "# TYPE rpc_duration_seconds histogram\n"
      "rpc_duration_seconds_bucket{job=\"gpt\",rank=\"0\",method=\"get\",le=\"0.125\"} 2\n"
      "rpc_duration_seconds_bucket{job=\"gpt\",rank=\"0\",method=\"get\",le=\"0.5\"} 3\n"
      "rpc_duration_seconds_bucket{job=\"gpt\",rank=\"0\",method=\"get\",le=\"1\"} 3\n"
      "rpc_duration_seconds_bucket{job=\"gpt\",rank=\"0\",method=\"get\",le=\"+Inf\"} 4\n"
      "rpc_duration_seconds_sum{job=\"gpt\",rank=\"0\",method=\"get\"} 2.4375\n"
      "rpc_duration_seconds_count{job=\"gpt\",rank=\"0\",method=\"get\"} 4\n"
      "rpc_duration_seconds_bucket{job=\"gpt\",rank=\"0\",method=\"put\",le=\"0.125\"} 0\n"
      "rpc_duration_seconds_bucket{job=\"gpt\",rank=\"0\",method=\"put\",le=\"0.5\"} 0\n"
      "rpc_duration_seconds_bucket{job=\"gpt\",rank=\"0\",method=\"put\",le=\"1\"} 0\n"
      "rpc_duration_seconds_bucket{job=\"gpt\",rank=\"0\",method=\"put\",le=\"+Inf\"} 0\n"
      "rpc_duration_seconds_sum{job=\"gpt\",rank=\"0\",method=\"put\"} 0\n"
      "rpc_duration_seconds_count{job=\"gpt\",rank=\"0\",method=\"put\"} 0\n";
  EXPECT_EQ(registry.expose(), expected);
}

// The process collector of every Prometheus client library, read when scraped, and the build
// info: the operator and the workers had neither.
TEST(Exposition, ProcessMetrics_AreReadWhenScraped) {
  Registry registry({{"rank", "0"}});
  add_process_metrics(registry, "worker", "9.9.9");
  std::vector<char> burn(64 << 20, 1);  // resident pages and some CPU time
  double sum = 0;
  for (int round = 0; round < 20; ++round)
    for (size_t i = 0; i < burn.size(); i += 64) sum += burn[i] * round;
  const std::string text = registry.expose();
  EXPECT_NE(text.find("kubetrain_build_info{rank=\"0\",component=\"worker\",version=\"9.9.9\"} 1\n"),
            std::string::npos) << text;
  const auto value = [&](const std::string& name) {
    const auto at = text.find("\n" + name + "{rank=\"0\"} ");
    if (at == std::string::npos) return -1.0;
    return std::stod(text.substr(text.find("} ", at) + 2));
  };
  EXPECT_GT(value("process_resident_memory_bytes"), 64.0 * (1 << 20)) << text;
  EXPECT_GE(value("process_virtual_memory_bytes"), value("process_resident_memory_bytes"));
  EXPECT_GT(value("process_cpu_seconds_total"), 0) << sum;
  EXPECT_GT(value("process_start_time_seconds"), 1.7e9);  // after 2023
  EXPECT_GE(value("process_open_fds"), 3);
  EXPECT_GE(value("process_max_fds"), value("process_open_fds"));
}

TEST(Exposition, UnlabelledFamiliesStartAtZeroAndEmptyLabelledFamiliesAreOmitted) {
  Registry registry;
  registry.counter("jobs_created_total", "Jobs created.");
  registry.gauge("queue_depth", "Items waiting.", {"name"});  // no child yet: not exposed
  registry.histogram("wait_seconds", "Wait.", {1});
  auto& gauge = registry.gauge("in_flight", "In flight.").with({});
  gauge.inc(5);
  gauge.dec(2);
  EXPECT_EQ(registry.expose(),
            "# HELP in_flight In flight.\n"
            "# TYPE in_flight gauge\n"
            "in_flight 3\n"
            "# HELP jobs_created_total Jobs created.\n"
            "# TYPE jobs_created_total counter\n"
            "jobs_created_total 0\n"
            "# HELP wait_seconds Wait.\n"
            "# TYPE wait_seconds histogram\n"
            "wait_seconds_bucket{le=\"1\"} 0\n"
            "wait_seconds_bucket{le=\"+Inf\"} 0\n"
            "wait_seconds_sum 0\n"
            "wait_seconds_count 0\n");
}

TEST(Exposition, HistogramPutsNaNAndValuesAboveTheLastBoundIntoInf) {
  Registry registry;
  auto& histogram = registry.histogram("x_seconds", "X.", {1, 2, INFINITY}).with({});
  histogram.observe(1);  // le is inclusive
  histogram.observe(2.5);
  histogram.observe(std::nan(""));
  const Histogram::Snapshot snapshot = histogram.snapshot();
  EXPECT_EQ(snapshot.upper_bounds, (std::vector<double>{1, 2}));  // an explicit +Inf is dropped
  EXPECT_EQ(snapshot.cumulative, (std::vector<std::uint64_t>{1, 1, 3}));
  EXPECT_EQ(snapshot.count, 3u);
  EXPECT_TRUE(std::isnan(snapshot.sum));
}

TEST(Exposition, NumbersPrintIntegersPlainAndFloatsShortestRoundTrip) {
  EXPECT_EQ(format_value(0), "0");
  EXPECT_EQ(format_value(1048576), "1048576");
  EXPECT_EQ(format_value(-3), "-3");
  EXPECT_EQ(format_value(123456789012345), "123456789012345");
  EXPECT_EQ(format_value(1e20), "1e+20");
  EXPECT_EQ(format_value(0.1), "0.1");
  EXPECT_EQ(format_value(2.5), "2.5");
  EXPECT_EQ(format_value(1e-7), "1e-07");
  EXPECT_EQ(format_value(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(format_value(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(format_value(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(format_value(std::nan("")), "NaN");

  std::mt19937_64 rng(20261130);
  std::uniform_real_distribution<double> exponent(-30, 30);
  for (int i = 0; i < 10000; ++i) {
    const double value = std::pow(10.0, exponent(rng)) * (i % 2 ? 1 : -1);
    const std::string text = format_value(value);
    EXPECT_EQ(std::strtod(text.c_str(), nullptr), value) << text;
  }
}

TEST(Exposition, NamesFollowThePrometheusGrammar) {
  EXPECT_TRUE(is_valid_metric_name("kubetrain_worker_steps_total"));
  EXPECT_TRUE(is_valid_metric_name(":recorded:rule"));
  EXPECT_FALSE(is_valid_metric_name(""));
  EXPECT_FALSE(is_valid_metric_name("1st"));
  EXPECT_FALSE(is_valid_metric_name("a-b"));
  EXPECT_FALSE(is_valid_metric_name("a b"));
  EXPECT_TRUE(is_valid_label_name("node_rank"));
  EXPECT_TRUE(is_valid_label_name("_x"));
  EXPECT_FALSE(is_valid_label_name("__name__"));
  EXPECT_FALSE(is_valid_label_name("a:b"));
  EXPECT_FALSE(is_valid_label_name("9"));
  EXPECT_FALSE(is_valid_label_name(""));
}

// ---- misuse is a bug ---------------------------------------------------------------------------

class RegistryDeathTest : public ::testing::Test {
 protected:
  // Other tests start cpprest threads; re-exec the binary for each death test.
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
  Registry registry_;
};

TEST_F(RegistryDeathTest, CounterNamesMustEndInTotal) {
  EXPECT_DEATH(registry_.counter("requests", "R."), "must end in _total");
}

TEST_F(RegistryDeathTest, OnlyCountersEndInTotal) {
  EXPECT_DEATH(registry_.gauge("bytes_total", "B."), "only counter names end in _total");
}

TEST_F(RegistryDeathTest, InvalidMetricAndLabelNamesAreRejected) {
  EXPECT_DEATH(registry_.gauge("bad-name", "B."), "invalid metric name \"bad-name\"");
  EXPECT_DEATH(registry_.gauge("x", "X.", {"__reserved"}), "invalid label name \"__reserved\"");
  EXPECT_DEATH(registry_.gauge("x", "X.", {"a.b"}), "invalid label name \"a.b\"");
  EXPECT_DEATH(registry_.gauge("x", "X.", {"a", "a"}), "label \"a\" given twice");
  EXPECT_DEATH(Registry({{"job", "a"}, {"job", "b"}}), "label \"job\" given twice");
  EXPECT_DEATH(Registry({{"__job", "a"}}), "invalid label name");
  EXPECT_DEATH(Registry({{"job", "a"}}).gauge("x", "X.", {"job"}), "label \"job\" given twice");
}

TEST_F(RegistryDeathTest, NegativeCounterIncrementIsABug) {
  auto& counter = registry_.counter("x_total", "X.").with({});
  EXPECT_DEATH(counter.inc(-1), "a counter only goes up");
  EXPECT_DEATH(counter.inc(std::nan("")), "a counter only goes up");
}

TEST_F(RegistryDeathTest, WrongNumberOfLabelValuesIsABug) {
  auto& family = registry_.counter("x_total", "X.", {"a", "b"});
  EXPECT_DEATH(family.with({"1"}), "1 label values for 2 label names");
}

TEST_F(RegistryDeathTest, NameRegisteredTwiceIsABug) {
  registry_.gauge("x", "X.");
  EXPECT_DEATH(registry_.gauge("x", "X."), "registered twice");
}

TEST_F(RegistryDeathTest, HistogramBucketsMustBeIncreasingAndLeIsReserved) {
  EXPECT_DEATH(registry_.histogram("h_seconds", "H.", {1, 1}), "strictly increasing");
  EXPECT_DEATH(registry_.histogram("h_seconds", "H.", {2, 1}), "strictly increasing");
  EXPECT_DEATH(registry_.histogram("h_seconds", "H.", {NAN}), "finite");
  EXPECT_DEATH(registry_.histogram("h_seconds", "H.", {1}, {"le"}), "reserved");
}

// ---- thread safety ------------------------------------------------------------------------------

TEST(RegistryConcurrency, ThreadsUpdatingAndScrapingLoseNothing) {
  Registry registry;
  auto& counters = registry.counter("ops_total", "Ops.", {"thread_group"});
  auto& gauge = registry.gauge("level", "Level.").with({});
  auto& histogram = registry.histogram("op_seconds", "Op.", {0.5}).with({});
  constexpr int kThreads = 8;
  constexpr int kIterations = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Half the threads share a child they each look up on every iteration.
      for (int i = 0; i < kIterations; ++i) {
        counters.with({t % 2 ? "odd" : "even"}).inc();
        gauge.inc(2);
        gauge.dec();
        histogram.observe(i % 2 ? 1.0 : 0.25);
      }
    });
  }
  threads.emplace_back([&] {
    for (int i = 0; i < 200; ++i) EXPECT_FALSE(registry.expose().empty());
  });
  for (auto& thread : threads) thread.join();

  EXPECT_EQ(counters.with({"even"}).value(), kThreads / 2 * kIterations);
  EXPECT_EQ(counters.with({"odd"}).value(), kThreads / 2 * kIterations);
  EXPECT_EQ(gauge.value(), kThreads * kIterations);
  const Histogram::Snapshot snapshot = histogram.snapshot();
  EXPECT_EQ(snapshot.count, std::uint64_t{kThreads} * kIterations);
  EXPECT_EQ(snapshot.cumulative[0], std::uint64_t{kThreads} * kIterations / 2);
  EXPECT_EQ(snapshot.sum, kThreads * kIterations / 2 * 1.25);
}

TEST(RegistryConcurrency, ChildReferencesAreStable) {
  Registry registry;
  auto& family = registry.gauge("g", "G.", {"i"});
  Gauge& first = family.with({"0"});
  for (int i = 1; i < 1000; ++i) family.with({std::to_string(i)});
  EXPECT_EQ(&family.with({"0"}), &first);
}

// ---- HTTP ---------------------------------------------------------------------------------------

struct HttpReply {
  int status = 0;
  std::string headers;  // raw, lower-cased
  std::string body;
};

// A minimal HTTP/1.1 client over a POSIX socket: one request, the whole reply (Content-Length or
// until the server closes), 5 s receive timeout so a broken server fails instead of hanging.
HttpReply http_request(int port, const std::string& method, const std::string& target) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  timeval timeout{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return {};
  }
  const std::string request =
      method + " " + target + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  EXPECT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  std::string raw;
  char buffer[4096];
  std::size_t header_end = std::string::npos, content_length = std::string::npos;
  for (;;) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    raw.append(buffer, static_cast<std::size_t>(n));
    if (header_end == std::string::npos &&
        (header_end = raw.find("\r\n\r\n")) != std::string::npos) {
      std::string headers = raw.substr(0, header_end);
      for (char& c : headers) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (auto at = headers.find("content-length:"); at != std::string::npos) {
        content_length = std::stoul(headers.substr(at + 15));
      }
    }
    if (header_end != std::string::npos && content_length != std::string::npos &&
        raw.size() >= header_end + 4 + content_length) {
      break;
    }
  }
  ::close(fd);
  HttpReply reply;
  if (header_end == std::string::npos) return reply;
  reply.headers = raw.substr(0, header_end);
  for (char& c : reply.headers) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::sscanf(raw.c_str(), "HTTP/1.%*d %d", &reply.status);
  reply.body = raw.substr(header_end + 4);
  return reply;
}

HttpReply http_get(int port, const std::string& target) {
  return http_request(port, "GET", target);
}

// The scraper's GET (the operator reading rank 0, the launcher its ranks) holds at most
// max_bytes of whatever answers: a bigger body is no answer.
TEST(TelemetryHttp, HttpGetRefusesAnswersBeyondItsBound) {
  HttpServer server("127.0.0.1", 0);
  server.handle("/metrics", [](const Request&) {
    Response r;
    r.body = std::string(64 * 1024, 'x');
    return r;
  });
  server.start();
  const auto whole = kt::telemetry::http_get("127.0.0.1", server.port(), "/metrics");
  ASSERT_TRUE(whole);
  EXPECT_EQ(whole->size(), 64u * 1024);
  EXPECT_FALSE(kt::telemetry::http_get("127.0.0.1", server.port(), "/metrics",
                                       std::chrono::seconds(2), 16 * 1024));
}

TEST(TelemetryHttp, ServesMetricsHealthzAndAnswers404And405) {
  Registry registry({{"job", "t"}});
  registry.counter("scrapes_total", "Scrapes.").with({}).inc(7);
  HttpServer server("127.0.0.1", 0);
  serve_metrics(server, registry);
  server.start();
  ASSERT_GT(server.port(), 0);

  const HttpReply metrics = http_get(server.port(), "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.headers.find("content-type: text/plain; version=0.0.4; charset=utf-8"),
            std::string::npos)
      << metrics.headers;
  EXPECT_EQ(metrics.body, registry.expose());
  EXPECT_NE(metrics.body.find("scrapes_total{job=\"t\"} 7\n"), std::string::npos);

  const HttpReply healthz = http_get(server.port(), "/healthz");
  EXPECT_EQ(healthz.status, 200);
  EXPECT_EQ(healthz.body, "ok");

  const HttpReply missing = http_get(server.port(), "/nope");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(missing.body, "not found\n");

  const HttpReply post = http_request(server.port(), "POST", "/metrics");
  EXPECT_EQ(post.status, 405);
  EXPECT_NE(post.headers.find("allow: get"), std::string::npos) << post.headers;
  const HttpReply head = http_request(server.port(), "HEAD", "/metrics");
  EXPECT_EQ(head.status, 405);
  EXPECT_EQ(head.body, "");  // a HEAD reply has no body

  server.stop();
  EXPECT_EQ(http_get(server.port(), "/healthz").status, 0);  // connection refused
  server.stop();                                             // idempotent
}

TEST(TelemetryHttp, HandlersSeePathAndQueryAndExceptionsBecome500) {
  HttpServer server("127.0.0.1", 0);
  server.handle("/echo", [](const Request& request) {
    return Response{201, "application/json",
                    request.method + " " + request.path + " ? " + request.query};
  });
  server.handle("/boom", [](const Request&) -> Response { throw Error("disk on fire"); });
  server.start();

  const HttpReply echo = http_get(server.port(), "/echo?a=1&b=2");
  EXPECT_EQ(echo.status, 201);
  EXPECT_NE(echo.headers.find("content-type: application/json"), std::string::npos);
  EXPECT_EQ(echo.body, "GET /echo ? a=1&b=2");

  const HttpReply boom = http_get(server.port(), "/boom");
  EXPECT_EQ(boom.status, 500);
  EXPECT_EQ(boom.body, "internal error: disk on fire\n");
}

TEST(TelemetryHttp, PortInUseIsAnErrorNamingAddressAndPort) {
  // Hold a listening socket on a kernel-chosen port, then ask the server for that port.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length), 0);
  const int port = ntohs(addr.sin_port);

  HttpServer server("127.0.0.1", port);
  try {
    server.start();
    ADD_FAILURE() << "start() on a port in use did not throw";
  } catch (const Error& e) {
    const std::string prefix = "cannot listen on 127.0.0.1:" + std::to_string(port) + ": ";
    EXPECT_EQ(std::string(e.what()).rfind(prefix, 0), 0u) << e.what();
    EXPECT_GT(std::string(e.what()).size(), prefix.size()) << "no reason given: " << e.what();
  }
  ::close(fd);
}

TEST(TelemetryHttp, BadAddressIsAnError) {
  HttpServer server("not-an-ip", 0);
  EXPECT_THROW(server.start(), Error);
}

// Sends `raw` as it is and returns the status of the reply (0: none).
int raw_request_status(int port, const std::string& raw) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval timeout{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int status = 0;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    (void)::send(fd, raw.data(), raw.size(), MSG_NOSIGNAL);
    // The whole status line, which may come in more than one segment.
    std::string reply;
    char buffer[256];
    while (reply.find("\r\n") == std::string::npos) {
      const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
      if (n <= 0) break;
      reply.append(buffer, static_cast<std::size_t>(n));
    }
    std::sscanf(reply.c_str(), "HTTP/1.1 %d", &status);
  }
  ::close(fd);
  return status;
}

TEST(TelemetryHttp, MalformedAndOverlongRequestsGet4xxAndTheServerLivesOn) {
  Registry registry({});
  HttpServer server("127.0.0.1", 0);
  serve_metrics(server, registry);
  server.start();
  const int port = server.port();
  EXPECT_EQ(raw_request_status(port, "GARBAGE\r\n\r\n"), 400);
  EXPECT_EQ(raw_request_status(port, "GET /metrics HTTP/1.1\r\nNo colon here\r\n\r\n"), 400);
  EXPECT_EQ(raw_request_status(port, "GET /metrics HTTP/1.1\r\nContent-Length: x\r\n\r\n"), 400);
  EXPECT_EQ(raw_request_status(port, "GET /" + std::string(10'000, 'm') + " HTTP/1.1\r\n\r\n"), 414);
  EXPECT_EQ(raw_request_status(port, "GET /metrics HTTP/1.1\r\nX: " + std::string(70'000, 'x') +
                                         "\r\n\r\n"),
            431);
  EXPECT_EQ(raw_request_status(port, "POST /metrics HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n"),
            413);
  EXPECT_EQ(http_get(port, "/healthz").status, 200);
}

// ---- the worker's metrics through promtool --------------------------------------------------

// The full path of `program` on PATH, or "".
std::string find_on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// Every worker metric of docs/METRICS.md, each with at least one sample.
std::string worker_exposition() {
  Registry registry(worker_labels("gpt-small", "default", 3, 1));
  WorkerMetrics metrics(registry);
  metrics.steps.inc(10);
  for (double seconds : {0.8, 1.1, 1.2}) metrics.step_seconds.observe(seconds);
  metrics.tokens.inc(10 * 256 * 1024);
  metrics.tokens_per_second.set(228000.5);
  metrics.loss.set(3.125);
  metrics.mfu_ratio.set(0.41);
  metrics.memory_bytes.with({"cuda:0", "params"}).set(248e6);
  metrics.memory_bytes.with({"cpu", "optimizer"}).set(1.5e9);
  metrics.transfer_bytes.with({"h2d"}).inc(4096);
  metrics.transfer_bytes.with({"d2h"}).inc(8192);
  metrics.comm_seconds.with({"tp"}).inc(0.75);
  metrics.comm_exposed_seconds.with({"tp"}).inc(0.125);
  metrics.comm_seconds.with({"dp"}).inc(0.5);
  metrics.comm_exposed_seconds.with({"dp"}).inc(0);
  metrics.optimizer_seconds.with({"cpu"}).inc(0.3);
  metrics.optimizer_seconds.with({"cuda:0"}).inc(0.01);
  metrics.predicted_step_seconds.set(1.05);
  metrics.predicted_tokens_per_second.set(250000);
  metrics.predicted_phase_seconds.with({"compute"}).set(0.8);
  metrics.predicted_phase_seconds.with({"tp_comm_exposed"}).set(0.05);
  metrics.plan_info
      .with({"2", "4", "2", "2", "true", "0", "0", "1", "selective", "optimizer", "true", "bf16",
             "cuda", "sha256:ab12"})
      .set(1);
  metrics.checkpoint_seconds.set(4.5);
  metrics.last_checkpoint_step.set(10);
  metrics.last_checkpoint_time.set(1764640000);
  metrics.step.set(110);
  metrics.target_steps.set(5000);
  metrics.loss_floor.with({}).set(1.75);
  metrics.phase_seconds.with({"compute"}).inc(0.7);
  metrics.phase_seconds.with({"transfer_exposed"}).inc(0.02);
  return registry.expose();
}

TEST(WorkerMetrics, ExposesEveryDesignMetricWithTheWorkerLabels) {
  const std::string text = worker_exposition();
  const std::string labels =
      "trainingjob=\"gpt-small\",namespace=\"default\",rank=\"3\",node_rank=\"1\"";
  for (const char* sample : {"kubetrain_worker_steps_total{",
                             "kubetrain_worker_step_seconds_bucket{",
                             "kubetrain_worker_step_seconds_sum{",
                             "kubetrain_worker_step_seconds_count{",
                             "kubetrain_worker_tokens_total{",
                             "kubetrain_worker_tokens_per_second{",
                             "kubetrain_worker_loss{",
                             "kubetrain_worker_mfu_ratio{",
                             "kubetrain_worker_memory_bytes{",
                             "kubetrain_worker_transfer_bytes_total{",
                             "kubetrain_worker_comm_seconds_total{",
                             "kubetrain_worker_comm_exposed_seconds_total{",
                             "kubetrain_worker_optimizer_seconds_total{",
                             "kubetrain_worker_predicted_step_seconds{",
                             "kubetrain_worker_checkpoint_seconds{",
                             "kubetrain_worker_last_checkpoint_step{",
                             "kubetrain_worker_predicted_tokens_per_second{",
                             "kubetrain_worker_predicted_phase_seconds{",
                             "kubetrain_worker_plan_info{",
                             "kubetrain_worker_last_checkpoint_timestamp_seconds{",
                             "kubetrain_worker_step{",
                             "kubetrain_worker_target_steps{",
                             "kubetrain_worker_loss_floor{",
                             "kubetrain_worker_phase_seconds_total{"}) {
    EXPECT_NE(text.find(std::string(sample) + labels), std::string::npos) << sample;
  }
  EXPECT_NE(text.find("kubetrain_worker_memory_bytes{" + labels +
                      ",device=\"cuda:0\",kind=\"params\"} 248000000\n"),
            std::string::npos)
      << text;
  EXPECT_NE(
      text.find(
          "kubetrain_worker_plan_info{" + labels +
          ",tp=\"2\",dp=\"4\",pp=\"2\",virtual_stages=\"2\",distributed_optimizer=\"true\","
          "cut_layer=\"0\","
          "cut_tp=\"0\",nodes=\"1\",recompute=\"selective\",offload=\"optimizer\","
          "overlap=\"true\",precision=\"bf16\",device=\"cuda\",plan_hash=\"sha256:ab12\"} 1\n"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("kubetrain_worker_step_seconds_bucket{" + labels + ",le=\"1.28\"} 3\n"),
            std::string::npos)
      << text;
}

TEST(WorkerMetrics, TheLossFloorIsAbsentUntilKnown) {
  Registry registry(worker_labels("j", "default", 0, 0));
  WorkerMetrics metrics(registry);
  EXPECT_EQ(registry.expose().find("kubetrain_worker_loss_floor{"), std::string::npos)
      << "token data has no known floor: no sample rather than a 0 that looks like one";
  metrics.loss_floor.with({}).set(2.0);
  EXPECT_NE(registry.expose().find("kubetrain_worker_loss_floor{trainingjob=\"j\",namespace=\"default\","
                                   "rank=\"0\",node_rank=\"0\"} 2\n"),
            std::string::npos)
      << registry.expose();
}

TEST(Exposition, ARemovedChildEndsItsSeries_OthersStay) {
  Registry registry;
  auto& phase = registry.gauge("job_phase", "Phase.", {"job", "phase"});
  phase.with({"a", "Running"}).set(1);
  phase.with({"b", "Running"}).set(1);
  phase.remove({"a", "Running"});
  phase.remove({"zzz", "Running"});  // none such: nothing happens
  const std::string text = registry.expose();
  EXPECT_EQ(text.find("job=\"a\""), std::string::npos) << text;
  EXPECT_NE(text.find("job_phase{job=\"b\",phase=\"Running\"} 1\n"), std::string::npos) << text;
  phase.with({"a", "Running"}).set(0);  // a later child of the same name starts afresh
  EXPECT_NE(registry.expose().find("job_phase{job=\"a\",phase=\"Running\"} 0\n"),
            std::string::npos);
}

TEST(WorkerMetrics, PassesPromtoolCheckMetrics) {
  const std::string promtool = find_on_path("promtool");
  ASSERT_FALSE(promtool.empty())
      << "promtool is not on PATH; install it (Debian: apt-get install prometheus) — docs/METRICS.md "
         "requires the worker exposition to pass `promtool check metrics`";
  const std::string file = ::testing::TempDir() + "kubetrain_worker_metrics.prom";
  std::ofstream(file) << worker_exposition();
  const std::string command = promtool + " check metrics < '" + file + "' 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[512];
  while (std::fgets(buffer, sizeof(buffer), pipe)) output += buffer;
  const int status = ::pclose(pipe);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "promtool check metrics failed (status " << status << "):\n"
      << output;
  std::remove(file.c_str());
}

}  // namespace
}  // namespace kt::telemetry

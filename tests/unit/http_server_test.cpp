// kubetrain's HTTP server (http/server.h) over real sockets: keep-alive, bodies, streams, a
// hang-up noticed during a quiet stream, and the bounds: every malformed or overlong request is
// answered with its 4xx/5xx and closed, and the server goes on serving.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "http/server.h"

namespace kt::http {
namespace {

using namespace std::chrono_literals;
using namespace std::string_literals;

// A client socket connected to 127.0.0.1:port with 5 s receive and send timeouts; -1 on failure.
int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  const timeval timeout{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
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
  std::size_t sent = 0;
  while (sent < text.size()) {
    const ssize_t n = ::send(fd, text.data() + sent, text.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;  // the server may close early (a refusal); the reply says why
    sent += static_cast<std::size_t>(n);
  }
}

// Everything the server sends until it closes (or 5 s pass).
std::string read_all(int fd) {
  std::string raw;
  char buffer[16 * 1024];
  for (;;) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) return raw;
    raw.append(buffer, static_cast<std::size_t>(n));
  }
}

// Sends `raw` on a fresh connection and returns all of the reply.
std::string round_trip(int port, const std::string& raw) {
  const int fd = connect_to(port);
  if (fd < 0) return "";
  send_text(fd, raw);
  std::string reply = read_all(fd);
  ::close(fd);
  return reply;
}

int status_of(const std::string& reply) {
  int status = 0;
  std::sscanf(reply.c_str(), "HTTP/1.1 %d", &status);
  return status;
}

// Answers GET /ok with "ok", POST /echo with the body's size and first bytes, and GET /stream
// as a chunked stream: two chunks, then nothing until the client is gone.
class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<HttpServer>(
        "127.0.0.1", 0, [this](const HttpRequest& r, ResponseWriter& w) {
          if (r.path == "/ok") {
            w.send(200, "text/plain", "ok");
          } else if (r.path == "/echo") {
            w.send(200, "text/plain",
                   std::to_string(r.body.size()) + ":" + r.body.substr(0, 16) + ":" + r.param("x"));
          } else if (r.path == "/stream") {
            w.begin_stream(200, "application/json");
            w.write("{\"n\":1}\n");
            w.write("{\"n\":2}\n");
            while (!w.closed()) std::this_thread::sleep_for(10ms);
            stream_noticed_hangup_ = std::chrono::steady_clock::now();
            stream_ended_ = true;
          } else {
            w.send(404, "text/plain", "not found");
          }
        });
    server_->start();
    port_ = server_->port();
  }

  // The server still answers a plain request.
  void expect_alive() {
    const std::string reply = round_trip(port_, "GET /ok HTTP/1.1\r\nConnection: close\r\n\r\n");
    EXPECT_EQ(status_of(reply), 200) << reply;
  }

  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
  std::atomic<bool> stream_ended_{false};
  std::chrono::steady_clock::time_point stream_noticed_hangup_;
};

TEST_F(HttpServerTest, ServesRequestsOneAfterAnotherOnAKeptAliveConnection) {
  const int fd = connect_to(port_);
  ASSERT_GE(fd, 0);
  send_text(fd,
            "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n"
            "POST /echo?x=a%20b HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"
            "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n"
            "0\r\nTrailer: t\r\n\r\n"
            "GET /ok HTTP/1.1\r\nConnection: close\r\n\r\n");
  const std::string reply = read_all(fd);
  ::close(fd);
  EXPECT_NE(reply.find("\r\n\r\nok"), std::string::npos) << reply;
  EXPECT_NE(reply.find("\r\n\r\n5:hello:a b"), std::string::npos) << reply;
  EXPECT_NE(reply.find("\r\n\r\n5:abcde:"), std::string::npos) << reply;
  EXPECT_EQ(reply.rfind("ok"), reply.size() - 2) << reply;  // the fourth answer, then closed
}

TEST_F(HttpServerTest, Http10ConnectionClosesAfterOneRequestUnlessKeepAliveIsAsked) {
  const std::string reply = round_trip(port_, "GET /ok HTTP/1.0\r\n\r\nGET /ok HTTP/1.0\r\n\r\n");
  EXPECT_EQ(status_of(reply), 200);
  EXPECT_EQ(reply.find("HTTP/1.1", 1), std::string::npos) << "answered twice: " << reply;
  EXPECT_NE(reply.find("Connection: close"), std::string::npos) << reply;
}

TEST_F(HttpServerTest, StreamsChunksAndNoticesAHangUpWhileTheStreamIsQuiet) {
  const int fd = connect_to(port_);
  ASSERT_GE(fd, 0);
  send_text(fd, "GET /stream HTTP/1.1\r\n\r\n");
  std::string raw;
  char buffer[4096];
  // Read until the second chunk has arrived whole (its data and the CRLF after it may come in
  // separate segments).
  while (raw.find("{\"n\":2}\n\r\n") == std::string::npos) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    ASSERT_GT(n, 0) << raw;
    raw.append(buffer, static_cast<std::size_t>(n));
  }
  EXPECT_NE(raw.find("Transfer-Encoding: chunked\r\n"), std::string::npos) << raw;
  EXPECT_NE(raw.find("\r\n8\r\n{\"n\":1}\n\r\n8\r\n{\"n\":2}\n\r\n"), std::string::npos) << raw;
  const auto closed_at = std::chrono::steady_clock::now();
  ::close(fd);
  for (int i = 0; i < 200 && !stream_ended_; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(stream_ended_) << "the handler did not notice the hang-up within 2 s";
  EXPECT_LT(stream_noticed_hangup_ - closed_at, 1s);
}

TEST_F(HttpServerTest, OverlongRequestLineGets414) {
  const std::string reply =
      round_trip(port_, "GET /" + std::string(9000, 'a') + " HTTP/1.1\r\n\r\n");
  EXPECT_EQ(status_of(reply), 414) << reply.substr(0, 200);
  // A line just within the bound is served (404: no such path).
  EXPECT_EQ(status_of(round_trip(port_, "GET /" + std::string(8000, 'a') +
                                            " HTTP/1.1\r\nConnection: close\r\n\r\n")),
            404);
  expect_alive();
}

TEST_F(HttpServerTest, OverlongHeadGets431WithoutWaitingForItsEnd) {
  std::string many = "GET /ok HTTP/1.1\r\n";
  for (int i = 0; i < 2000; ++i)
    many += "X-Header-" + std::to_string(i) + ": " + std::string(40, 'v') + "\r\n";
  const std::string reply = round_trip(port_, many);  // no empty line: the bound alone ends it
  EXPECT_EQ(status_of(reply), 431) << reply.substr(0, 200);
  EXPECT_EQ(status_of(round_trip(
                port_, "GET /ok HTTP/1.1\r\nX: " + std::string(70'000, 'v') + "\r\n\r\n")),
            431);
  expect_alive();
}

TEST_F(HttpServerTest, OverlargeBodyGets413BeforeItIsRead) {
  // Only the head is sent: a body over 16 MiB is refused from its Content-Length.
  EXPECT_EQ(status_of(round_trip(port_, "POST /echo HTTP/1.1\r\nContent-Length: 16777217\r\n\r\n")),
            413);
  EXPECT_EQ(status_of(round_trip(port_,
                                 "POST /echo HTTP/1.1\r\nContent-Length: "
                                 "99999999999999999999999\r\n\r\n")),
            413);
  // A chunked body is refused at the chunk that would cross the bound.
  EXPECT_EQ(status_of(round_trip(port_,
                                 "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                                 "1000001\r\n")),
            413);
  // Exactly 16 MiB is accepted.
  const std::string body(16 * 1024 * 1024, 'b');
  const std::string reply = round_trip(port_,
                                       "POST /echo HTTP/1.1\r\nConnection: close\r\n"
                                       "Content-Length: " +
                                           std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_EQ(status_of(reply), 200);
  EXPECT_NE(reply.find("\r\n\r\n16777216:bbbb"), std::string::npos) << reply.substr(0, 200);
  expect_alive();
}

TEST_F(HttpServerTest, MalformedRequestsGet400AndTheServerLivesOn) {
  const std::vector<std::pair<std::string, int>> cases = {
      {"GARBAGE\r\n\r\n", 400},
      {"GET /ok\r\n\r\n", 400},                   // no version
      {"GET /ok HTTP/1.1 extra\r\n\r\n", 400},    // three spaces
      {"GET  /ok HTTP/1.1\r\n\r\n", 400},         // empty target
      {"GET ok HTTP/1.1\r\n\r\n", 400},           // not origin-form
      {"GET http://x/ok HTTP/1.1\r\n\r\n", 400},  // absolute-form (proxies only)
      {"G(T /ok HTTP/1.1\r\n\r\n", 400},          // not a token
      {"GET /o\x01k HTTP/1.1\r\n\r\n", 400},      // control byte in the target
      {"GET /ok HTTP/2.0\r\n\r\n", 505},
      {"GET /ok FTP/1.1\r\n\r\n", 400},
      {"GET /ok HTTP/1.1\r\nNoColon\r\n\r\n", 400},
      {"GET /ok HTTP/1.1\r\nBad Name: x\r\n\r\n", 400},
      {"GET /ok HTTP/1.1\r\nName : x\r\n\r\n", 400},         // space before the colon
      {"GET /ok HTTP/1.1\r\n: x\r\n\r\n", 400},              // empty name
      {"GET /ok HTTP/1.1\r\nA: b\r\n folded\r\n\r\n", 400},  // obs-fold
      {"GET /ok HTTP/1.1\r\nA: b\nc\r\n\r\n", 400},          // bare LF
      {"GET /ok HTTP/1.1\r\nA: b\0c\r\n\r\n"s, 400},         // NUL
      {"GET /ok HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400},
      {"POST /echo HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 400},
      {"POST /echo HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400},
      {"POST /echo HTTP/1.1\r\nContent-Length: 2x\r\n\r\nxx", 400},
      {"POST /echo HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nxxx", 400},
      {"POST /echo HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
       400},
      {"POST /echo HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
      {"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400},
      {"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n", 400},
      {"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY0\r\n\r\n", 400},
      {"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + std::string(2000, '1'), 400},
  };
  for (const auto& [request, status] : cases) {
    const std::string reply = round_trip(port_, request);
    EXPECT_EQ(status_of(reply), status)
        << "request: " << request.substr(0, 80) << "\nreply: " << reply;
    EXPECT_NE(reply.find("Connection: close"), std::string::npos) << reply;
  }
  expect_alive();
}

TEST_F(HttpServerTest, EmptyLinesBeforeARequestAreIgnored) {
  EXPECT_EQ(status_of(round_trip(port_, "\r\n\r\nGET /ok HTTP/1.1\r\nConnection: close\r\n\r\n")),
            200);
}

// 600 idle connections (no request, no token needed) once locked everyone out with 503 for the
// idle timeout (90 s), /healthz included: when the server is full, the longest idle connection is
// closed to make room. So are 600 that each sent an unfinished request head (slow-loris clients,
// once holding their slots for the 30 s head deadline): a connection is not the server's work
// until its head is complete.
TEST_F(HttpServerTest, IdleConnectionsCannotLockOthersOut) {
  // Both ends of each connection are in this process: 1,200 descriptors and a few.
  rlimit files{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &files), 0);
  if (files.rlim_cur < 4096) {
    files.rlim_cur = 4096;
    files.rlim_max = std::max<rlim_t>(files.rlim_max, 4096);  // raising the hard limit needs root
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &files), 0)
        << "needs 1,300 file descriptors (run as root, or with ulimit -n 4096)";
  }
  for (const char* opening : {"", "GET /ok HTTP/1.1\r\nHost: x\r\n" /* no blank line */}) {
    SCOPED_TRACE(*opening ? "unfinished heads" : "idle");
    std::vector<int> held;
    for (int i = 0; i < 600; ++i) {
      const int fd = connect_to(port_);
      ASSERT_GE(fd, 0) << i;
      if (*opening) send_text(fd, opening);
      held.push_back(fd);
    }
    const auto started = std::chrono::steady_clock::now();
    int status = 0;
    while (status != 200 && std::chrono::steady_clock::now() - started < 20s) {
      status = status_of(round_trip(port_, "GET /ok HTTP/1.1\r\nConnection: close\r\n\r\n"));
      if (status != 200) std::this_thread::sleep_for(100ms);
    }
    EXPECT_EQ(status, 200);
    EXPECT_LT(std::chrono::steady_clock::now() - started, 10s);  // not the 90 s or 30 s timeouts
    for (const int fd : held) ::close(fd);
    expect_alive();
  }
}

TEST_F(HttpServerTest, StopEndsOpenStreamsAndIdleConnections) {
  const int idle = connect_to(port_);
  const int streaming = connect_to(port_);
  ASSERT_GE(idle, 0);
  ASSERT_GE(streaming, 0);
  send_text(streaming, "GET /stream HTTP/1.1\r\n\r\n");
  char buffer[256];
  ASSERT_GT(::recv(streaming, buffer, sizeof(buffer), 0), 0);
  const auto before = std::chrono::steady_clock::now();
  server_->stop();
  EXPECT_LT(std::chrono::steady_clock::now() - before, 2s);
  EXPECT_TRUE(stream_ended_);
  EXPECT_EQ(::recv(idle, buffer, sizeof(buffer), 0), 0);  // closed by the server
  ::close(idle);
  ::close(streaming);
  server_->stop();  // idempotent
}

}  // namespace
}  // namespace kt::http

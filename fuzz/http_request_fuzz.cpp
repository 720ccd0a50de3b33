// libFuzzer harness: HTTP/1.1 request parsing of kubetrain's one HTTP server (http/server.h),
// through a real socket: what any client of `local serve` or of a /metrics endpoint sends. The
// server runs once, on 127.0.0.1; each input is sent on a fresh connection, whose write side is
// then closed. The server must answer with a well-formed response of an expected status (never
// a 500 or a crash); a request it accepted, sent again as we would write it from what the server
// parsed, must parse to the same request.
//   fuzz/run.sh http_request 60
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "http/server.h"

namespace {

void put(std::string& out, const std::string& field) {
  out += std::to_string(field.size()) + ":" + field;
}

// Everything the server parsed, binary-safe. Content-Length and Transfer-Encoding are left out:
// how the body was framed is not what a handler sees.
std::string echo_of(const kt::http::HttpRequest& r) {
  std::string out;
  put(out, r.method);
  put(out, r.path);
  put(out, r.query);
  for (const auto& [name, value] : r.headers) {
    if (name == "content-length" || name == "transfer-encoding") continue;
    put(out, name);
    put(out, value);
  }
  put(out, r.body);
  return out;
}

int port() {
  static auto server = [] {
    auto s = std::make_unique<kt::http::HttpServer>(
        "127.0.0.1", 0, [](const kt::http::HttpRequest& request, kt::http::ResponseWriter& w) {
          w.send(200, "application/octet-stream", echo_of(request),
                 {{"X-Method", request.method == "HEAD" ? "HEAD" : "other"}});
        });
    s->start();
    return s;
  }();
  return server->port();
}

// Sends `bytes`, closes the write side, returns all the server sent until it closed; nullopt
// when the server neither read nor answered for 10 s.
std::optional<std::string> try_exchange(std::string_view bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  FUZZ_CHECK(fd >= 0, "socket");
  // From a new address of 127.0.0.0/8 each time: the server closes first, so each connection
  // leaves a TIME_WAIT entry for 60 s, and tens of thousands a minute from one address would use
  // up its ephemeral ports.
  static uint32_t source = 0;
  sockaddr_in from{};
  from.sin_family = AF_INET;
  from.sin_addr.s_addr = htonl(0x7f000000u | (1u + (source++ % 0xfffffeu)));
  FUZZ_CHECK(::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) == 0, "bind");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    // Interrupted by a signal, the connection goes on being made: wait for it.
    FUZZ_CHECK(errno == EINTR, std::string("connect: ") + std::strerror(errno));
    pollfd p{fd, POLLOUT, 0};
    while (::poll(&p, 1, 10'000) < 0 && errno == EINTR) {
    }
    int error = 0;
    socklen_t length = sizeof(error);
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
    FUZZ_CHECK(error == 0, std::string("connect: ") + std::strerror(error));
  }
  std::string reply;
  char buffer[64 * 1024];
  size_t sent = 0;
  bool write_open = true;
  for (;;) {
    if (write_open && sent == bytes.size()) {
      ::shutdown(fd, SHUT_WR);
      write_open = false;
    }
    pollfd p{fd, static_cast<short>(POLLIN | (write_open ? POLLOUT : 0)), 0};
    const int ready = ::poll(&p, 1, 10'000);
    if (ready < 0 && errno == EINTR) continue;  // libFuzzer's timers signal the process
    if (ready <= 0) {
      ::close(fd);
      return std::nullopt;
    }
    if (p.revents & POLLIN || (!write_open && p.revents & (POLLHUP | POLLERR))) {
      const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
      if (n <= 0) break;  // closed (a reset after a refusal counts as closed)
      reply.append(buffer, static_cast<size_t>(n));
    } else if (write_open && p.revents & POLLOUT) {
      const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) {
        ::shutdown(fd, SHUT_WR);
        write_open = false;
      } else {
        sent += static_cast<size_t>(n);
      }
    } else if (write_open && p.revents & (POLLHUP | POLLERR)) {
      write_open = false;
    }
  }
  ::close(fd);
  return reply;
}

std::string exchange(std::string_view bytes) {
  auto reply = try_exchange(bytes);
  FUZZ_CHECK(reply.has_value(), "the server neither read nor answered for 10 s");
  return *reply;
}

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;
  std::string body;
};

// The first response of `reply`; status 0 when there is none (the server may close silently
// on a request that ended early).
Response first_response(const std::string& reply) {
  Response r;
  if (reply.empty()) return r;
  FUZZ_CHECK(reply.rfind("HTTP/1.1 ", 0) == 0 && reply.size() >= 12, reply.substr(0, 200));
  r.status = std::stoi(reply.substr(9, 3));
  const size_t head_end = reply.find("\r\n\r\n");
  FUZZ_CHECK(head_end != std::string::npos, reply.substr(0, 200));
  size_t at = reply.find("\r\n") + 2;
  while (at < head_end) {
    const size_t end = reply.find("\r\n", at);
    const std::string line = reply.substr(at, end - at);
    const size_t colon = line.find(": ");
    FUZZ_CHECK(colon != std::string::npos, line);
    std::string name = line.substr(0, colon);
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    r.headers[name] = line.substr(colon + 2);
    at = end + 2;
  }
  const size_t length = std::stoul(r.headers.at("content-length"));
  if (r.headers["x-method"] != "HEAD") {
    FUZZ_CHECK(reply.size() >= head_end + 4 + length, "a response shorter than its Content-Length");
    r.body = reply.substr(head_end + 4, length);
  }
  return r;
}

bool take(std::string_view& in, std::string& field) {
  const size_t colon = in.find(':');
  if (colon == std::string_view::npos) return false;
  const size_t n = std::stoul(std::string(in.substr(0, colon)));
  field = std::string(in.substr(colon + 1, n));
  in.remove_prefix(colon + 1 + n);
  return true;
}

std::string percent_encode(const std::string& text) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '/' || c == '-' || c == '.' || c == '_' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

// The request an echo describes, as a client would write it.
std::string request_of(const std::string& echo) {
  std::string_view in = echo;
  std::string method, path, query;
  FUZZ_CHECK(take(in, method) && take(in, path) && take(in, query), "echo");
  std::vector<std::pair<std::string, std::string>> fields;
  std::string name, value;
  while (take(in, name)) {
    if (in.empty()) {  // the last field is the body
      value = name;
      break;
    }
    FUZZ_CHECK(take(in, value), "echo");
    fields.emplace_back(name, value);
  }
  const std::string& body = value;
  std::string target = path == "*" && query.empty() ? "*" : percent_encode(path);
  if (!query.empty()) target += "?" + query;
  std::string out = method + " " + target + " HTTP/1.1\r\n";
  for (const auto& [n, v] : fields) out += n + ": " + v + "\r\n";
  out += "content-length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  return out;
}

// Whether a header value of the echo starts or ends with a space (see below).
bool has_untrimmed_value(const std::string& echo) {
  std::string_view in = echo;
  std::string field;
  for (int i = 0; i < 3; ++i) take(in, field);
  std::string name, value;
  while (take(in, name) && !in.empty() && take(in, value)) {
    if (!value.empty() && (value.front() == ' ' || value.back() == ' ' || value.front() == '\t' ||
                           value.back() == '\t')) {
      return true;
    }
  }
  return false;
}

const std::set<int> kExpected = {200, 400, 413, 414, 431, 501, 505};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Response r = first_response(exchange(kt::fuzz::as_text(data, size)));
  if (r.status == 0) return 0;
  FUZZ_CHECK(kExpected.count(r.status) == 1, "status " + std::to_string(r.status));
  if (r.status != 200 || r.headers.at("x-method") == "HEAD") return 0;
  // Repeated fields with empty values join to ", ", which a second parse trims: not a request
  // we would write.
  if (r.body.find(", ") != std::string::npos && has_untrimmed_value(r.body)) return 0;
  const std::string again = request_of(r.body);
  const Response r2 = first_response(exchange(again));
  FUZZ_CHECK(r2.status == 200 && r2.body == r.body,
             "the request as parsed, sent again, parses differently (status " +
                 std::to_string(r2.status) + "):\n" + again);
  return 0;
}

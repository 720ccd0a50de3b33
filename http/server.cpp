#include "http/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>

#include "api/error.h"

namespace kt::http {
namespace {

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::string trim(std::string_view text) {
  const auto begin = text.find_first_not_of(" \t");
  if (begin == std::string_view::npos) return "";
  const auto end = text.find_last_not_of(" \t\r");
  return std::string(text.substr(begin, end - begin + 1));
}

const char* reason_phrase(int status) {
  // clang-format off
  switch (status) {
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 406: return "Not Acceptable";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Status";
  }
  // clang-format on
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The bounds of http/server.h. The request line's is nginx's default buffer size; the head's and
// body's hold any request kubectl, helm or the operator sends.
constexpr std::size_t kMaxRequestLineBytes = 8 * 1024;
constexpr std::size_t kMaxHeadBytes = 64 * 1024;
constexpr std::size_t kMaxBodyBytes = 16 * 1024 * 1024;
constexpr std::size_t kMaxChunkLineBytes = 1024;  // chunk size and extensions
constexpr std::size_t kMaxConnections = 512;
constexpr std::chrono::milliseconds kIdleTimeout{90'000};  // between keep-alive requests
// For a head from its first byte, per read of a body, per response or stream chunk sent.
constexpr std::chrono::milliseconds kTransferTimeout{30'000};

// RFC 9110 §5.6.2 tchar: what a method or a header name may contain.
bool is_token(std::string_view text) {
  if (text.empty()) return false;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u) != 0) continue;
    if (std::string_view("!#$%&'*+-.^_`|~").find(c) == std::string_view::npos) return false;
  }
  return true;
}

// Visible ASCII and obs-text (RFC 9112 §3.2): no space, control byte or DEL in a request target.
bool is_target(std::string_view text) {
  if (text.empty() || (text[0] != '/' && text != "*")) return false;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7f) return false;
  }
  return true;
}

// A header value may hold tabs and obs-text but no other control byte (RFC 9110 §5.5).
bool is_field_value(std::string_view text) {
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\t') || u == 0x7f) return false;
  }
  return true;
}

// Digits only, at most 16 of them (beyond any body we accept): Content-Length and chunk sizes.
// std::stoul would take "-1", " 12" and "12abc", and a request smuggled behind them.
std::optional<std::size_t> parse_size(std::string_view text, int base) {
  if (text.empty() || text.size() > 16) return std::nullopt;
  std::size_t value = 0;
  for (const char c : text) {
    const int digit = base == 16 ? hex_value(c) : (c >= '0' && c <= '9' ? c - '0' : -1);
    if (digit < 0) return std::nullopt;
    value = value * static_cast<std::size_t>(base) + static_cast<std::size_t>(digit);
  }
  return value;
}

}  // namespace

std::string percent_decode(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && hex_value(text[i + 1]) >= 0 &&
        hex_value(text[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex_value(text[i + 1]) * 16 + hex_value(text[i + 2])));
      i += 2;
    } else if (text[i] == '+') {
      out.push_back(' ');  // form encoding, as Go's url.ParseQuery reads it
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

std::string HttpRequest::param(const std::string& name) const {
  std::string_view rest = query;
  while (!rest.empty()) {
    const auto amp = rest.find('&');
    const std::string_view pair = rest.substr(0, amp);
    const auto eq = pair.find('=');
    if (percent_decode(pair.substr(0, eq)) == name) {
      return eq == std::string_view::npos ? "" : percent_decode(pair.substr(eq + 1));
    }
    if (amp == std::string_view::npos) break;
    rest.remove_prefix(amp + 1);
  }
  return "";
}

bool HttpRequest::has_param(const std::string& name) const {
  std::string_view rest = query;
  while (!rest.empty()) {
    const auto amp = rest.find('&');
    const std::string_view pair = rest.substr(0, amp);
    if (percent_decode(pair.substr(0, pair.find('='))) == name) return true;
    if (amp == std::string_view::npos) break;
    rest.remove_prefix(amp + 1);
  }
  return false;
}

// One client connection: its socket and what the reader has buffered.
struct HttpServer::Connection {
  int fd = -1;  // -1 once closed; guarded by fd_mutex against stop()'s shutdown
  std::mutex fd_mutex;
  std::atomic<bool>* stopping = nullptr;
  std::atomic<bool> finished{false};
  // While the connection waits for a request to begin: since when (steady clock ns; 0: busy in a
  // request or a response). The acceptor closes the longest idle one when the server is full.
  std::atomic<int64_t> idle_since_ns{0};
  std::string buffer;     // received, not yet parsed
  bool http_1_0 = false;  // the last request's version: keep-alive only when asked for

  // Waits for readable data up to `timeout`, in short slices so that stop() is noticed.
  bool wait_readable(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!stopping->load()) {
      pollfd p{fd, POLLIN, 0};
      const int ready = ::poll(&p, 1, 200);
      if (ready > 0) return true;
      if (ready < 0 && errno != EINTR) return false;
      if (std::chrono::steady_clock::now() >= deadline) return false;
    }
    return false;
  }

  // Appends received bytes to `buffer`; false on EOF, error, timeout or stop.
  bool receive(std::chrono::milliseconds timeout) {
    if (!wait_readable(timeout)) return false;
    char chunk[16 * 1024];
    const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0) return false;
    buffer.append(chunk, static_cast<std::size_t>(n));
    return true;
  }

  // After a refusal: stop sending and read what the client still sends for a moment, so that
  // closing with unread bytes does not reset the connection before it read the answer.
  void drain() {
    ::shutdown(fd, SHUT_WR);
    char sink[16 * 1024];
    for (std::size_t drained = 0; drained < 1024 * 1024;) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 500) <= 0) return;
      const ssize_t n = ::recv(fd, sink, sizeof(sink), 0);
      if (n <= 0) return;
      drained += static_cast<std::size_t>(n);
    }
  }

  // Sends all of `data` within kTransferTimeout; false when the client is gone, too slow (a
  // stalled watcher: a per-send() timeout would not do, as a zero-window peer still takes a
  // few bytes now and then) or the server is stopping.
  bool send_all(std::string_view data) {
    const auto deadline = std::chrono::steady_clock::now() + kTransferTimeout;
    while (!data.empty()) {
      const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        data.remove_prefix(static_cast<std::size_t>(n));
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (stopping->load() || std::chrono::steady_clock::now() >= deadline) return false;
        pollfd p{fd, POLLOUT, 0};
        ::poll(&p, 1, 200);
      } else {
        return false;
      }
    }
    return true;
  }

  // Why a request was refused: the status and a line for the body. The connection closes after.
  struct Refusal {
    int status = 0;  // 0: the connection ended (EOF, timeout, stop) and gets no answer
    std::string message;
  };

  // Reads until `buffer` holds `terminator`, at most `limit` bytes before it, by `deadline`; the
  // terminator's offset, or nullopt (with `refusal` set to `too_long` once over the limit).
  std::optional<std::size_t> receive_until(std::string_view terminator, std::size_t limit,
                                           std::chrono::steady_clock::time_point deadline,
                                           int too_long, const char* what, Refusal& refusal) {
    for (;;) {
      const auto at = buffer.find(terminator);
      if (at != std::string::npos && at <= limit) return at;
      if (buffer.size() > limit + terminator.size()) {
        refusal = {too_long,
                   std::string(what) + " longer than " + std::to_string(limit) + " bytes"};
        return std::nullopt;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !receive(left)) return std::nullopt;
    }
  }

  // Reads one request; false when the connection should close, with `refusal.status` the answer
  // to send first (0: none).
  bool read_request(HttpRequest& request, Refusal& refusal) {
    refusal = {};
    // Up to kIdleTimeout for a request to begin; then its head must be complete within
    // kTransferTimeout (a client sending a byte now and then cannot hold the connection).
    // Until its head is complete a connection is no work of the server's: when the server is
    // full it may be closed to make room (a client sending a head slowly is treated as idle).
    idle_since_ns = std::chrono::steady_clock::now().time_since_epoch().count();
    struct Busy {
      std::atomic<int64_t>& since;
      ~Busy() { since = 0; }
    } busy{idle_since_ns};
    if (buffer.empty() && !receive(kIdleTimeout)) return false;
    const auto head_deadline = std::chrono::steady_clock::now() + kTransferTimeout;
    // The request line (RFC 9112 §3): METHOD SP TARGET SP HTTP/1.x. Empty lines before it are
    // allowed (§2.2).
    std::optional<std::size_t> line_end;
    for (;;) {
      line_end =
          receive_until("\r\n", kMaxRequestLineBytes, head_deadline, 414, "request line", refusal);
      if (!line_end) return false;
      if (*line_end != 0) break;
      buffer.erase(0, 2);
    }
    const std::string request_line = buffer.substr(0, *line_end);
    const auto sp1 = request_line.find(' ');
    const auto sp2 = sp1 == std::string::npos ? sp1 : request_line.find(' ', sp1 + 1);
    if (sp2 == std::string::npos || request_line.find(' ', sp2 + 1) != std::string::npos) {
      refusal = {400, "malformed request line"};
      return false;
    }
    request.method = request_line.substr(0, sp1);
    const std::string target = request_line.substr(sp1 + 1, sp2 - sp1 - 1);
    const std::string version = request_line.substr(sp2 + 1);
    if (!is_token(request.method) || !is_target(target)) {
      refusal = {400, "malformed request line"};
      return false;
    }
    if (version != "HTTP/1.1" && version != "HTTP/1.0") {
      refusal = version.rfind("HTTP/", 0) == 0 ? Refusal{505, "only HTTP/1.0 and HTTP/1.1"}
                                               : Refusal{400, "malformed request line"};
      return false;
    }
    http_1_0 = version == "HTTP/1.0";
    const auto question = target.find('?');
    request.path = percent_decode(std::string_view(target).substr(0, question));
    request.query = question == std::string::npos ? "" : target.substr(question + 1);

    // The header fields, up to the empty line (the first CRLF CRLF, which begins at the request
    // line's end when there are none); the whole head within kMaxHeadBytes.
    const std::size_t fields_start = *line_end + 2;
    const auto head_end =
        receive_until("\r\n\r\n", kMaxHeadBytes, head_deadline, 431, "request head", refusal);
    if (!head_end) return false;
    if (!parse_fields(std::string_view(buffer).substr(fields_start, *head_end + 2 - fields_start),
                      request.headers, refusal)) {
      return false;
    }
    buffer.erase(0, *head_end + 4);

    const auto te = request.headers.find("transfer-encoding");
    const auto cl = request.headers.find("content-length");
    if (te != request.headers.end()) {
      if (cl != request.headers.end()) {  // RFC 9112 §6.1: a smuggling attempt
        refusal = {400, "both Transfer-Encoding and Content-Length"};
        return false;
      }
      if (lower(te->second) != "chunked") {
        refusal = {501, "transfer coding not supported: " + te->second};
        return false;
      }
      return read_chunked_body(request.body, refusal);
    }
    std::size_t length = 0;
    if (cl != request.headers.end()) {
      const auto parsed = parse_size(cl->second, 10);
      if (!parsed) {
        refusal = {cl->second.size() > 16 &&
                           cl->second.find_first_not_of("0123456789") == std::string::npos
                       ? 413
                       : 400,
                   "bad Content-Length: " + cl->second.substr(0, 32)};
        return false;
      }
      length = *parsed;
    }
    if (length > kMaxBodyBytes) {
      refusal = {413, "body larger than " + std::to_string(kMaxBodyBytes) + " bytes"};
      return false;
    }
    while (buffer.size() < length) {
      if (!receive(kTransferTimeout)) return false;
    }
    request.body = buffer.substr(0, length);
    buffer.erase(0, length);
    return true;
  }

  // "Name: value" lines, each ending in CRLF. Names are lower-cased; a repeated field's values
  // are joined with ", " (RFC 9110 §5.3), except Content-Length and Transfer-Encoding, which may
  // appear once. No space before the colon, no line folding (RFC 9112 §5.1, §5.2).
  static bool parse_fields(std::string_view fields, std::map<std::string, std::string>& headers,
                           Refusal& refusal) {
    while (!fields.empty()) {
      const auto end = fields.find("\r\n");
      const std::string_view line = fields.substr(0, end);
      fields.remove_prefix(end + 2);
      const auto colon = line.find(':');
      if (colon == std::string_view::npos || !is_token(line.substr(0, colon)) ||
          !is_field_value(line.substr(colon + 1)) || line.find('\n') != std::string_view::npos) {
        refusal = {400, "malformed header field"};
        return false;
      }
      const std::string name = lower(std::string(line.substr(0, colon)));
      std::string value = trim(line.substr(colon + 1));
      const auto [it, inserted] = headers.emplace(name, value);
      if (!inserted) {
        if (name == "content-length" || name == "transfer-encoding" || name == "host") {
          refusal = {400, "repeated " + name};
          return false;
        }
        it->second += ", " + value;
      }
    }
    return true;
  }

  // A chunked body (RFC 9112 §7.1): hex size [;extensions] CRLF data CRLF ..., 0 CRLF, trailer
  // fields (read and dropped), CRLF.
  bool read_chunked_body(std::string& body, Refusal& refusal) {
    for (;;) {
      const auto line_end = receive_until("\r\n", kMaxChunkLineBytes,
                                          std::chrono::steady_clock::now() + kTransferTimeout, 400,
                                          "chunk size line", refusal);
      if (!line_end) return false;
      const std::string_view line(buffer.data(), *line_end);
      const auto size = parse_size(line.substr(0, line.find(';')), 16);
      if (!size) {
        refusal = {400, "bad chunk size"};
        return false;
      }
      if (body.size() + *size > kMaxBodyBytes) {
        refusal = {413, "body larger than " + std::to_string(kMaxBodyBytes) + " bytes"};
        return false;
      }
      buffer.erase(0, *line_end + 2);
      if (*size == 0) break;
      while (buffer.size() < *size + 2) {
        if (!receive(kTransferTimeout)) return false;
      }
      if (buffer.compare(*size, 2, "\r\n") != 0) {
        refusal = {400, "chunk data not followed by CRLF"};
        return false;
      }
      body.append(buffer, 0, *size);
      buffer.erase(0, *size + 2);
    }
    for (std::size_t trailer_bytes = 0;;) {  // trailer fields, up to the empty line
      if (trailer_bytes >= kMaxHeadBytes) {  // (the limit below must not wrap around)
        refusal = {431, "trailer fields too large"};
        return false;
      }
      const auto line_end = receive_until("\r\n", kMaxHeadBytes - trailer_bytes,
                                          std::chrono::steady_clock::now() + kTransferTimeout, 431,
                                          "trailer", refusal);
      if (!line_end) return false;
      trailer_bytes += *line_end + 2;
      buffer.erase(0, *line_end + 2);
      if (*line_end == 0) return true;
    }
  }
};

namespace {

class SocketResponseWriter : public ResponseWriter {
 public:
  SocketResponseWriter(HttpServer::Connection& connection, bool keep_alive, bool head_only)
      : connection_(connection), keep_alive_(keep_alive), head_only_(head_only) {}

  void send(int status, const std::string& content_type, const std::string& body,
            const std::map<std::string, std::string>& headers) override {
    if (answered_) return;
    answered_ = true;
    std::string head = status_line(status);
    head += "Content-Type: " + content_type + "\r\n";
    head += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    for (const auto& [name, value] : headers) head += name + ": " + value + "\r\n";
    if (!keep_alive_) head += "Connection: close\r\n";
    head += "\r\n";
    if (!connection_.send_all(head) || (!head_only_ && !connection_.send_all(body))) {
      broken_ = true;
    }
  }

  void begin_stream(int status, const std::string& content_type) override {
    if (answered_) return;
    answered_ = true;
    streaming_ = true;
    keep_alive_ = false;  // one stream per connection keeps the state simple
    std::string head = status_line(status);
    head += "Content-Type: " + content_type +
            "\r\nTransfer-Encoding: chunked\r\n"
            "Connection: close\r\n\r\n";
    if (!connection_.send_all(head)) broken_ = true;
  }

  bool write(std::string_view chunk) override {
    if (!streaming_ || broken_ || connection_.stopping->load()) return false;
    if (chunk.empty()) return true;
    char size[32];
    std::snprintf(size, sizeof(size), "%zx\r\n", chunk.size());
    if (!connection_.send_all(size) || !connection_.send_all(chunk) ||
        !connection_.send_all("\r\n")) {
      broken_ = true;
    }
    return !broken_;
  }

  void end_stream() override {
    if (!streaming_ || broken_) return;
    if (!connection_.send_all("0\r\n\r\n")) broken_ = true;
    streaming_ = false;
  }

  void abort() override {
    answered_ = true;
    broken_ = true;
    keep_alive_ = false;
    ::shutdown(connection_.fd, SHUT_RDWR);
  }

  bool closed() override {
    if (broken_ || connection_.stopping->load()) return true;
    pollfd p{connection_.fd, POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) > 0) {
      if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
      char byte;
      if (::recv(connection_.fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0) return true;
    }
    return false;
  }

  bool answered() const { return answered_; }
  bool keep_alive() const { return keep_alive_ && !broken_; }

 private:
  static std::string status_line(int status) {
    return "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\n";
  }

  HttpServer::Connection& connection_;
  bool keep_alive_;
  bool head_only_;
  bool answered_ = false;
  bool streaming_ = false;
  bool broken_ = false;
};

}  // namespace

HttpServer::HttpServer(std::string address, int port, Handler handler)
    : address_(std::move(address)), port_(port), handler_(std::move(handler)) {}

HttpServer::~HttpServer() {
  stop();
}

void HttpServer::start() {
  KT_CHECK(listen_fd_ < 0, "HttpServer::start called twice");
  const std::string where = "cannot listen on " + address_ + ":" + std::to_string(port_) + ": ";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port_));
  if (port_ < 0 || port_ > 65535) throw Error(where + "port out of range");
  if (inet_pton(AF_INET, address_.c_str(), &addr.sin_addr) != 1) {
    throw Error(where + "not an IPv4 address");
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw Error(where + std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  socklen_t length = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 128) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
    const int error = errno;
    ::close(fd);
    throw Error(where + std::strerror(error));
  }
  port_ = ntohs(addr.sin_port);
  listen_fd_ = fd;
  stopping_ = false;
  acceptor_ = std::thread([this] { accept_loop(); });
}

void HttpServer::accept_loop() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto connection = std::make_shared<Connection>();
    connection->fd = fd;
    connection->stopping = &stopping_;
    std::lock_guard lock(connections_mutex_);
    // Reap the threads of finished connections.
    for (std::size_t i = 0; i < connections_.size();) {
      if (connections_[i]->finished) {
        threads_[i].join();
        connections_.erase(connections_.begin() + static_cast<std::ptrdiff_t>(i));
        threads_.erase(threads_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    if (connections_.size() >= kMaxConnections) {
      // Full: the connection idle longest (waiting for a request to begin) is closed to make
      // room, as a keep-alive connection may be at any time, so that idle connections cannot
      // lock everyone out (/healthz included).
      std::shared_ptr<Connection> idlest;
      for (const auto& c : connections_) {
        const int64_t since = c->idle_since_ns;
        if (since != 0 && !c->finished && (!idlest || since < idlest->idle_since_ns)) idlest = c;
      }
      if (idlest) {
        std::lock_guard fd_lock(idlest->fd_mutex);
        if (idlest->fd >= 0) ::shutdown(idlest->fd, SHUT_RDWR);
      }
    }
    if (connections_.size() >= kMaxConnections + kMaxConnections / 8) {
      // Over the bound even so (every connection busy, or the closed ones not yet reaped):
      // answer at once on the acceptor's thread (the reply fits the socket's send buffer),
      // never start a thread.
      static constexpr std::string_view kBusy =
          "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 20\r\n"
          "Connection: close\r\n\r\ntoo many connections";
      (void)::send(fd, kBusy.data(), kBusy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      ::close(fd);
      continue;
    }
    connections_.push_back(connection);
    threads_.emplace_back([this, connection] { serve(connection); });
  }
}

void HttpServer::serve(std::shared_ptr<Connection> connection) {
  for (;;) {
    HttpRequest request;
    Connection::Refusal refusal;
    if (!connection->read_request(request, refusal)) {
      if (refusal.status != 0) {
        SocketResponseWriter writer(*connection, false, false);
        writer.send(refusal.status, "text/plain; charset=utf-8", refusal.message + "\n", {});
        connection->drain();
      }
      break;
    }
    const std::string connection_header = lower(request.headers["connection"]);
    const bool client_closes =
        connection_header.find("close") != std::string::npos ||
        (connection->http_1_0 && connection_header.find("keep-alive") == std::string::npos);
    SocketResponseWriter writer(*connection, !client_closes, request.method == "HEAD");
    try {
      handler_(request, writer);
    } catch (const std::exception& e) {
      writer.send(500, "text/plain", std::string("internal error: ") + e.what() + "\n", {});
    }
    if (!writer.answered()) writer.send(500, "text/plain", "no response\n", {});
    if (!writer.keep_alive() || stopping_) break;
  }
  {
    std::lock_guard lock(connection->fd_mutex);
    ::shutdown(connection->fd, SHUT_RDWR);
    ::close(connection->fd);
    connection->fd = -1;
  }
  connection->finished = true;
}

void HttpServer::stop() {
  if (listen_fd_ < 0) return;
  stopping_ = true;
  if (acceptor_.joinable()) acceptor_.join();
  ::close(listen_fd_);
  listen_fd_ = -1;
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(connections_mutex_);
    // Wake readers blocked in poll/recv; handlers see closed() and return.
    for (const auto& connection : connections_) {
      std::lock_guard fd_lock(connection->fd_mutex);
      if (connection->fd >= 0) ::shutdown(connection->fd, SHUT_RDWR);
    }
    threads = std::move(threads_);
    connections_.clear();
  }
  for (auto& thread : threads) thread.join();
}

}  // namespace kt::http

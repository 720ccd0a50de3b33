#include "operator/local/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "api/error.h"

namespace kt::local {
namespace {

constexpr std::size_t kMaxHeadBytes = 64 * 1024;
constexpr std::size_t kMaxBodyBytes = 16 * 1024 * 1024;
constexpr auto kIdleTimeout = std::chrono::seconds(90);  // keep-alive connections

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
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Status";
  }
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string percent_decode(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && hex_value(text[i + 1]) >= 0 && hex_value(text[i + 2]) >= 0) {
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
  std::string buffer;  // received, not yet parsed

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

  bool send_all(std::string_view data) {
    while (!data.empty()) {
      const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      data.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }

  // Reads one request; false when the connection should close without an answer.
  bool read_request(HttpRequest& request, int& error_status) {
    error_status = 0;
    std::size_t head_end;
    while ((head_end = buffer.find("\r\n\r\n")) == std::string::npos) {
      if (buffer.size() > kMaxHeadBytes) {
        error_status = 431;
        return false;
      }
      if (!receive(buffer.empty() ? std::chrono::milliseconds(kIdleTimeout)
                                  : std::chrono::milliseconds(30'000))) {
        return false;
      }
    }
    const std::string head = buffer.substr(0, head_end);
    buffer.erase(0, head_end + 4);

    const auto line_end = head.find("\r\n");
    const std::string request_line = head.substr(0, line_end);
    const auto sp1 = request_line.find(' ');
    const auto sp2 = request_line.find(' ', sp1 + 1);
    if (sp1 == std::string::npos || sp2 == std::string::npos) {
      error_status = 400;
      return false;
    }
    request.method = request_line.substr(0, sp1);
    const std::string target = request_line.substr(sp1 + 1, sp2 - sp1 - 1);
    const auto question = target.find('?');
    request.path = percent_decode(std::string_view(target).substr(0, question));
    request.query = question == std::string::npos ? "" : target.substr(question + 1);

    std::size_t at = line_end == std::string::npos ? head.size() : line_end + 2;
    while (at < head.size()) {
      auto next = head.find("\r\n", at);
      if (next == std::string::npos) next = head.size();
      const std::string_view line(head.data() + at, next - at);
      const auto colon = line.find(':');
      if (colon != std::string_view::npos) {
        request.headers[lower(std::string(line.substr(0, colon)))] = trim(line.substr(colon + 1));
      }
      at = next + 2;
    }

    if (auto te = request.headers.find("transfer-encoding");
        te != request.headers.end() && lower(te->second) == "chunked") {
      return read_chunked_body(request.body, error_status);
    }
    std::size_t length = 0;
    if (auto cl = request.headers.find("content-length"); cl != request.headers.end()) {
      try {
        length = std::stoul(cl->second);
      } catch (const std::exception&) {
        error_status = 400;
        return false;
      }
    }
    if (length > kMaxBodyBytes) {
      error_status = 413;
      return false;
    }
    while (buffer.size() < length) {
      if (!receive(std::chrono::milliseconds(30'000))) return false;
    }
    request.body = buffer.substr(0, length);
    buffer.erase(0, length);
    return true;
  }

  bool read_chunked_body(std::string& body, int& error_status) {
    for (;;) {
      std::size_t line_end;
      while ((line_end = buffer.find("\r\n")) == std::string::npos) {
        if (!receive(std::chrono::milliseconds(30'000))) return false;
      }
      std::size_t size = 0;
      try {
        size = std::stoul(buffer.substr(0, line_end), nullptr, 16);
      } catch (const std::exception&) {
        error_status = 400;
        return false;
      }
      buffer.erase(0, line_end + 2);
      if (body.size() + size > kMaxBodyBytes) {
        error_status = 413;
        return false;
      }
      while (buffer.size() < size + 2) {
        if (!receive(std::chrono::milliseconds(30'000))) return false;
      }
      body.append(buffer, 0, size);
      buffer.erase(0, size + 2);
      if (size == 0) return true;  // (trailers are not supported)
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
    head += "Content-Type: " + content_type + "\r\nTransfer-Encoding: chunked\r\n"
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
    connections_.push_back(connection);
    threads_.emplace_back([this, connection] { serve(connection); });
  }
}

void HttpServer::serve(std::shared_ptr<Connection> connection) {
  for (;;) {
    HttpRequest request;
    int error_status = 0;
    if (!connection->read_request(request, error_status)) {
      if (error_status != 0) {
        SocketResponseWriter writer(*connection, false, false);
        writer.send(error_status, "text/plain", "bad request\n", {});
      }
      break;
    }
    const bool client_closes = lower(request.headers["connection"]) == "close";
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

}  // namespace kt::local

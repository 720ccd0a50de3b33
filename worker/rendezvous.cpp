#include "worker/rendezvous.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <thread>

#include "api/error.h"
#include "worker/rendezvous_protocol.h"

namespace kt::worker {
namespace {

using Clock = std::chrono::steady_clock;
using rendezvous::Message;

std::string errno_text(int error) {
  return std::strerror(error);
}

// False when the peer closed the connection or a receive timeout expired.
bool read_exact(int fd, void* data, size_t size) {
  auto* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::recv(fd, p, size, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool write_exact(int fd, const void* data, size_t size) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    // MSG_NOSIGNAL: a dead peer gives EPIPE here instead of killing the process with SIGPIPE.
    const ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool send_message(int fd, const Message& message) {
  const std::string wire = rendezvous::encode_message(message);
  return write_exact(fd, wire.data(), wire.size());
}

bool receive_message(int fd, Message& message) {
  return rendezvous::read_message(
      [fd](void* data, size_t size) { return read_exact(fd, data, size); }, message);
}

void set_receive_timeout(int fd, std::chrono::milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

// One connection attempt, bounded by `budget` even when the host drops SYNs (a blocking
// connect() could hang for minutes). Returns the socket, or -1 with `why` set.
int try_connect(const std::string& host, int port, std::chrono::milliseconds budget,
                std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) {
    why = gai_strerror(rc);
    return -1;
  }
  int result = -1;
  for (addrinfo* ai = found; ai != nullptr && result < 0; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      why = errno_text(errno);
      continue;
    }
    const int flags = ::fcntl(fd, F_GETFL);
    ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    int error = 0;
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
      error = errno;
      if (error == EINPROGRESS) {
        pollfd pfd{fd, POLLOUT, 0};
        const int ready = ::poll(&pfd, 1, static_cast<int>(std::max<int64_t>(budget.count(), 1)));
        if (ready <= 0) {
          error = ETIMEDOUT;
        } else {
          socklen_t len = sizeof(error);
          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
        }
      }
    }
    if (error != 0) {
      why = errno_text(error);
      ::close(fd);
      continue;
    }
    ::fcntl(fd, F_SETFL, flags);
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    result = fd;
  }
  ::freeaddrinfo(found);
  return result;
}

std::string seconds_text(std::chrono::milliseconds ms) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%gs", ms.count() / 1000.0);
  return buffer;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Server

struct TcpStoreServer::Impl {
  int listen_fd = -1;
  int port = 0;
  std::thread acceptor;

  std::mutex mutex;
  std::condition_variable changed;  // a key was set, or stopping
  std::map<std::string, std::string> values;
  bool stopping = false;
  std::vector<int> connection_fds;
  std::vector<std::thread> connections;

  void accept_loop();
  void serve(int fd);
  Message handle(const Message& request);
  // Waits until all `keys` exist, `abort_key` exists, or the deadline. Returns the reply.
  Message wait_for(const std::vector<std::string>& keys, const std::string& abort_key,
                   std::chrono::milliseconds timeout, bool want_value);
};

TcpStoreServer::TcpStoreServer(int port, const std::string& address)
    : impl_(std::make_unique<Impl>()) {
  const std::string where = ":" + std::to_string(port);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    throw Error("cannot listen on " + where + " for the rendezvous: " + errno_text(errno));
  // SO_REUSEADDR lets a restarted rank 0 rebind while old connections sit in TIME_WAIT; Linux
  // still refuses a port that another socket is listening on.
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, address.c_str(), &addr.sin_addr) != 1) {
    ::close(fd);
    throw Error("cannot listen on " + address + where + " for the rendezvous: not an IPv4 address");
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0 || ::listen(fd, 128) < 0) {
    const int error = errno;
    ::close(fd);
    throw Error("cannot listen on " + where + " for the rendezvous: " + errno_text(error));
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  impl_->listen_fd = fd;
  impl_->port = ntohs(addr.sin_port);
  impl_->acceptor = std::thread([impl = impl_.get()] { impl->accept_loop(); });
}

TcpStoreServer::~TcpStoreServer() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
    // shutdown() wakes threads blocked in accept()/recv() on these sockets.
    ::shutdown(impl_->listen_fd, SHUT_RDWR);
    for (int fd : impl_->connection_fds) ::shutdown(fd, SHUT_RDWR);
  }
  impl_->changed.notify_all();
  impl_->acceptor.join();
  for (auto& thread : impl_->connections) thread.join();
  ::close(impl_->listen_fd);
}

int TcpStoreServer::port() const {
  return impl_->port;
}

void TcpStoreServer::Impl::accept_loop() {
  for (;;) {
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    std::lock_guard lock(mutex);
    if (stopping) {
      if (fd >= 0) ::close(fd);
      return;
    }
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) {
        continue;
      }
      return;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    connection_fds.push_back(fd);
    connections.emplace_back([this, fd] { serve(fd); });
  }
}

void TcpStoreServer::Impl::serve(int fd) {
  Message request;
  while (receive_message(fd, request)) {
    if (!send_message(fd, handle(request))) break;
  }
  // The fd stays open (and in connection_fds) until the destructor, so that it cannot be reused
  // by another connection while the destructor might still shutdown() it.
  ::shutdown(fd, SHUT_RDWR);
}

Message TcpStoreServer::Impl::handle(const Message& message) {
  rendezvous::Request request;
  try {
    request = rendezvous::parse_request(message);
  } catch (const Error& e) {
    return {"error", e.what()};
  }
  switch (request.op) {
    case rendezvous::Request::Op::kSet: {
      {
        std::lock_guard lock(mutex);
        values[request.keys.front()] = request.value;
      }
      changed.notify_all();
      return {"ok"};
    }
    case rendezvous::Request::Op::kGet:
      return wait_for(request.keys, request.abort_key, request.timeout, true);
    case rendezvous::Request::Op::kWait:
      return wait_for(request.keys, request.abort_key, request.timeout, false);
  }
  return {"error", "unreachable"};
}

Message TcpStoreServer::Impl::wait_for(const std::vector<std::string>& keys,
                                       const std::string& abort_key,
                                       std::chrono::milliseconds timeout, bool want_value) {
  std::unique_lock lock(mutex);
  auto missing = [&] {
    std::vector<std::string> out;
    for (const auto& key : keys)
      if (!values.count(key)) out.push_back(key);
    return out;
  };
  auto aborted = [&] { return !abort_key.empty() && values.count(abort_key) > 0; };
  const bool done =
      changed.wait_for(lock, timeout, [&] { return stopping || aborted() || missing().empty(); });
  if (aborted()) return {"abort", values[abort_key]};
  if (!done || stopping) {
    Message reply{"timeout"};
    for (auto& key : missing()) reply.push_back(std::move(key));
    return reply;
  }
  if (want_value) return {"ok", values[keys.front()]};
  return {"ok"};
}

// ---------------------------------------------------------------------------------------------
// Client

TcpStore::TcpStore(std::string host, int port, std::chrono::milliseconds timeout)
    : endpoint_(host + ":" + std::to_string(port)), timeout_(timeout) {
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  auto pause = std::chrono::milliseconds(100);
  std::string why = "not tried";
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    fd_ = try_connect(host, port, std::max(left, std::chrono::milliseconds(1)), why);
    if (fd_ >= 0) break;
    const auto now = Clock::now();
    if (now >= deadline) {
      throw Error("rendezvous: no store at " + endpoint_ + " after " + seconds_text(timeout) +
                  " (" + why + "; is rank 0 running? is MASTER_ADDR right?)");
    }
    // The last pause is cut short so that one attempt lands right at the deadline.
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

void TcpStore::set_abort_key(std::string key) {
  std::lock_guard lock(mutex_);
  abort_key_ = std::move(key);
}

std::vector<std::string> TcpStore::call(const std::vector<std::string>& request,
                                        std::chrono::milliseconds reply_within) {
  // The server answers waits itself at their deadline; the slack only catches a hung server.
  set_receive_timeout(fd_, reply_within + std::chrono::seconds(10));
  Message reply;
  if (!send_message(fd_, request) || !receive_message(fd_, reply) || reply.empty()) {
    throw Error("rendezvous: lost the store at " + endpoint_ + " (did rank 0 exit or restart?)");
  }
  if (reply[0] == "abort") throw Error(reply.size() > 1 ? reply[1] : "rendezvous aborted");
  if (reply[0] == "error") {
    throw Error("rendezvous: the store at " + endpoint_ +
                " refused a request: " + (reply.size() > 1 ? reply[1] : ""));
  }
  return reply;
}

void TcpStore::set(const std::string& key, const std::vector<char>& data) {
  std::lock_guard lock(mutex_);
  call({"set", key, std::string(data.begin(), data.end())}, timeout_);
}

std::vector<char> TcpStore::get(const std::string& key) {
  std::lock_guard lock(mutex_);
  const auto reply = call({"get", key, std::to_string(timeout_.count()), abort_key_}, timeout_);
  if (reply[0] != "ok" || reply.size() != 2) {
    throw Error("rendezvous: timed out after " + seconds_text(timeout_) + " at " + endpoint_ +
                " waiting for key " + key);
  }
  return {reply[1].begin(), reply[1].end()};
}

void TcpStore::wait(const std::vector<std::string>& keys) {
  wait(keys, timeout_);
}

void TcpStore::wait(const std::vector<std::string>& keys,
                    const std::chrono::milliseconds& timeout) {
  // Gloo passes a zero timeout to mean "the default".
  const auto limit = timeout.count() > 0 ? timeout : timeout_;
  std::lock_guard lock(mutex_);
  Message request{"wait", std::to_string(limit.count()), abort_key_};
  request.insert(request.end(), keys.begin(), keys.end());
  const auto reply = call(request, limit);
  if (reply[0] == "ok") return;
  std::string missing;
  for (size_t i = 1; i < reply.size(); ++i) missing += (i > 1 ? ", " : "") + reply[i];
  throw Error("rendezvous: timed out after " + seconds_text(limit) + " at " + endpoint_ +
              " waiting for key(s) " + missing);
}

}  // namespace kt::worker

// HttpServer over cpprestsdk's http_listener (the Boost.Asio listener on Linux). The only file of
// kubetrain's telemetry that includes cpprest headers.
#include "telemetry/http_server.h"

#include <arpa/inet.h>
#include <cpprest/http_listener.h>
#include <netinet/in.h>
#include <pplx/threadpool.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include "api/error.h"

namespace kt::telemetry {
namespace {

using web::http::experimental::listener::http_listener;

// cpprestsdk runs socket I/O and handlers on one process-wide pool, 40 threads unless sized
// before its first use (TOOLCHAIN.md §4.1: a bare listener process had 41 threads). Two threads
// serve scrapes easily. The size is fixed at first use, so if another cpprest user in the
// process (an HTTP client) came first, its pool stays and initialize_with_threads throws:
// that is fine and ignored.
void size_cpprest_threadpool() {
  static std::once_flag once;
  std::call_once(once, [] {
    try {
      crossplat::threadpool::initialize_with_threads(2);
    } catch (const std::exception&) {
      // Already initialized by an earlier user.
    }
  });
}

// A port that was free a moment ago on `address`: bind port 0, ask the kernel which port it
// gave, close. cpprest cannot report the port it bound, so this is the only way to serve on an
// unused port; the port could be taken between close() and the listener's bind (then start()
// fails as for any port in use).
int pick_free_port(const std::string& address) {
  const std::string where = "cannot listen on " + address + ":0: ";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  if (inet_pton(AF_INET, address.c_str(), &addr.sin_addr) != 1) {
    throw Error(where + "not an IPv4 address");
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw Error(where + std::strerror(errno));
  socklen_t length = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
    const int error = errno;
    ::close(fd);
    throw Error(where + std::strerror(error));
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

Response plain(int status, std::string body) {
  return Response{status, "text/plain; charset=utf-8", std::move(body)};
}

}  // namespace

struct HttpServer::Impl {
  std::string address;
  int port = 0;
  std::unique_ptr<http_listener> listener;  // set while started

  std::mutex handlers_mutex;
  std::map<std::string, Handler> handlers;  // by exact path

  // Runs on a cpprest pool thread for every request.
  void serve(const web::http::http_request& request) {
    const web::uri& uri = request.request_uri();
    const Request req{request.method(), uri.path(), uri.query()};
    Response response;
    if (req.method != web::http::methods::GET) {
      response = plain(405, "method not allowed\n");
    } else {
      Handler handler;
      {
        std::lock_guard lock(handlers_mutex);
        if (auto it = handlers.find(req.path); it != handlers.end()) handler = it->second;
      }
      if (!handler) {
        response = plain(404, "not found\n");
      } else {
        try {
          response = handler(req);
        } catch (const std::exception& e) {
          response = plain(500, std::string("internal error: ") + e.what() + "\n");
        }
      }
    }
    web::http::http_response reply(static_cast<web::http::status_code>(response.status));
    if (response.status == 405) reply.headers().add("Allow", "GET");
    // cpprest would send a body even to HEAD, which a keep-alive client then misreads.
    if (req.method != web::http::methods::HEAD) {
      reply.set_body(std::move(response.body), response.content_type);
    }
    // A client that hung up makes the reply task fail; observe it, or pplx terminates.
    request.reply(reply).then([](pplx::task<void> sent) {
      try {
        sent.get();
      } catch (const std::exception&) {
      }
    });
  }
};

HttpServer::HttpServer(std::string address, int port) : impl_(std::make_unique<Impl>()) {
  impl_->address = std::move(address);
  impl_->port = port;
}

HttpServer::~HttpServer() {
  stop();
}

void HttpServer::handle(std::string path, Handler handler) {
  std::lock_guard lock(impl_->handlers_mutex);
  impl_->handlers[std::move(path)] = std::move(handler);
}

void HttpServer::start() {
  KT_CHECK(!impl_->listener, "HttpServer::start called twice");
  if (impl_->port < 0 || impl_->port > 65535) {
    throw Error("cannot listen on " + impl_->address + ":" + std::to_string(impl_->port) +
                ": port out of range");
  }
  size_cpprest_threadpool();
  if (impl_->port == 0) impl_->port = pick_free_port(impl_->address);
  const std::string where = impl_->address + ":" + std::to_string(impl_->port);
  try {
    auto listener = std::make_unique<http_listener>(web::uri("http://" + where));
    Impl* impl = impl_.get();  // outlives the listener: stop() closes it first
    listener->support([impl](const web::http::http_request& request) { impl->serve(request); });
    listener->open().wait();
    impl_->listener = std::move(listener);
  } catch (const std::exception& e) {
    throw Error("cannot listen on " + where + ": " + e.what());
  }
}

void HttpServer::stop() {
  if (!impl_->listener) return;
  try {
    impl_->listener->close().wait();  // waits for running handlers
  } catch (const std::exception&) {
    // Closing is best effort; the sockets go away with the listener.
  }
  impl_->listener.reset();
}

int HttpServer::port() const {
  return impl_->port;
}

}  // namespace kt::telemetry

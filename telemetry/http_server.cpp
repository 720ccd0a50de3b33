// HttpServer over kubetrain's HTTP server (http/server.h). The only file of telemetry that
// includes it.
#include "telemetry/http_server.h"

#include <map>
#include <mutex>

#include "api/error.h"
#include "http/server.h"

namespace kt::telemetry {

struct HttpServer::Impl {
  std::string address;
  int port = 0;
  std::unique_ptr<http::HttpServer> server;  // set while started

  std::mutex handlers_mutex;
  std::map<std::string, Handler> handlers;  // by exact path

  // Runs on the connection's thread for every request.
  void serve(const http::HttpRequest& request, http::ResponseWriter& writer) {
    const Request req{request.method, request.path, request.query};
    Response response;
    if (req.method != "GET") {
      writer.send(405, "text/plain; charset=utf-8", "method not allowed\n", {{"Allow", "GET"}});
      return;
    }
    Handler handler;
    {
      std::lock_guard lock(handlers_mutex);
      if (auto it = handlers.find(req.path); it != handlers.end()) handler = it->second;
    }
    if (!handler) {
      response = Response{404, "text/plain; charset=utf-8", "not found\n"};
    } else {
      try {
        response = handler(req);
      } catch (const std::exception& e) {
        response = Response{500, "text/plain; charset=utf-8",
                            std::string("internal error: ") + e.what() + "\n"};
      }
    }
    writer.send(response.status, response.content_type, response.body);
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
  KT_CHECK(!impl_->server, "HttpServer::start called twice");
  Impl* impl = impl_.get();  // outlives the server: stop() stops it first
  auto server = std::make_unique<http::HttpServer>(
      impl_->address, impl_->port,
      [impl](const http::HttpRequest& request, http::ResponseWriter& writer) {
        impl->serve(request, writer);
      });
  server->start();  // throws kt::Error("cannot listen on ADDRESS:PORT: why")
  impl_->port = server->port();
  impl_->server = std::move(server);
}

void HttpServer::stop() {
  if (!impl_->server) return;
  impl_->server->stop();
  impl_->server.reset();
}

int HttpServer::port() const {
  return impl_->port;
}

}  // namespace kt::telemetry

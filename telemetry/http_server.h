// A tiny HTTP/1.1 server for GET endpoints (/metrics, /healthz): the worker's, launcher's and
// operator's, over kubetrain's one HTTP server (http/server.h). Only http_server.cpp knows it;
// this header stays free of it.
//
//   HttpServer server("127.0.0.1", 0);                  // port 0: pick a free port
//   server.handle("/healthz", [](const Request&) { return Response{200, "text/plain", "ok"}; });
//   server.start();                                     // throws kt::Error if it cannot listen
//   ... server.port() ...
//   server.stop();
//
// Requests for a path without a handler get 404, methods other than GET get 405, and a handler
// that throws gets 500 with the exception's message. Requests are bounded as http/server.h says
// (request line, head, body; a malformed one gets 400). Handlers run on the server's connection
// threads (one per connection), concurrently with each other and with the caller.
#pragma once

#include <functional>
#include <memory>
#include <string>

namespace kt::telemetry {

struct Request {
  std::string method;  // "GET"
  std::string path;    // "/metrics", percent-encoding left as sent
  std::string query;   // "a=1&b=2" without '?', or ""
};

struct Response {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

class HttpServer {
 public:
  using Handler = std::function<Response(const Request&)>;

  // `address`: the IPv4 address to bind ("127.0.0.1"; "0.0.0.0" in a pod). `port` 0 lets the
  // kernel pick a free port when start() runs.
  HttpServer(std::string address, int port);
  ~HttpServer();  // stops
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Serves `path` (exact match) with `handler`; replaces an earlier handler for the same path.
  void handle(std::string path, Handler handler);

  // Starts listening; throws kt::Error("cannot listen on ADDRESS:PORT: why") on failure.
  void start();
  // Stops listening, closes every connection and waits for running handlers. Idempotent.
  void stop();

  // The port served (the chosen one after start() when constructed with 0).
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kt::telemetry

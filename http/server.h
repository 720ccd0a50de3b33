// kubetrain's one HTTP/1.1 server, for `kubetrain local serve` (the Kubernetes API) and, through
// telemetry/http_server.h, for the worker's, launcher's and operator's /metrics and probes:
// every method, request bodies, keep-alive, and streamed (chunked) responses for watches, on
// plain sockets with a thread per connection.
//
// Why our own and not cpprest's listener or cpp-httplib (docs/RELIABILITY.md "HTTP servers" has
// the measurements): a thread per connection, so long-lived watches and slow handlers never
// starve other requests (cpp-httplib 0.11's fixed pool of 8 does); a hang-up is noticed while a
// watch is quiet (closed()), and a connection can be dropped mid-response (abort(), the
// "dropped watch" fault).
//
// Bounded: request line 8 KiB (414), head 64 KiB (431), body 16 MiB (413), 512 connections
// (503); a head must arrive within 30 s of its first byte, each read of a body within 30 s, and
// each response or stream chunk must be taken by the client within 30 s (a stalled reader is
// dropped); a kept-alive connection idles at most 90 s. When all 512 are taken, the one idle
// longest — waiting for a request, or still sending its head or body — is closed to make room, so
// idle or slow clients cannot lock others out. (No per-address limit: every client of `local
// serve` connects from 127.0.0.1.) A
// malformed request gets 400 (505 for another HTTP version, 501 for a transfer coding other than
// chunked) and the connection is closed.
//
//   HttpServer server("127.0.0.1", 0, [](const HttpRequest& r, ResponseWriter& w) {
//     w.send(200, "application/json", "{}");
//   });
//   server.start();  ... server.port() ...  server.stop();
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace kt::http {

struct HttpRequest {
  std::string method;                          // "GET", "POST", ...
  std::string path;                            // percent-decoded
  std::string query;                           // raw, without '?'
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;

  // Percent-decoded query parameter; "" when absent.
  std::string param(const std::string& name) const;
  bool has_param(const std::string& name) const;
};

// How a handler answers: once with send(), or as a stream: begin_stream(), write() per chunk,
// end_stream(). A handler that returns without answering gets a 500.
class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  virtual void send(int status, const std::string& content_type, const std::string& body,
                    const std::map<std::string, std::string>& headers = {}) = 0;
  virtual void begin_stream(int status, const std::string& content_type) = 0;
  // false once the client has gone (or the server is stopping): the handler should return.
  virtual bool write(std::string_view chunk) = 0;
  virtual void end_stream() = 0;
  // Closes the connection at once, without ending the response (fault injection).
  virtual void abort() = 0;
  // True when the client closed its side or the server is stopping.
  virtual bool closed() = 0;
};

class HttpServer {
 public:
  using Handler = std::function<void(const HttpRequest&, ResponseWriter&)>;

  // `port` 0 picks a free one (the bound port, read back from the socket).
  HttpServer(std::string address, int port, Handler handler);
  ~HttpServer();  // stops
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  void start();  // throws kt::Error("cannot listen on ADDRESS:PORT: why")
  // Closes the listener and every connection, and waits for their threads. Idempotent.
  void stop();
  int port() const { return port_; }

  struct Connection;  // public only so that http_server.cpp's writer can name it

 private:
  void accept_loop();
  void serve(std::shared_ptr<Connection> connection);

  const std::string address_;
  int port_;
  Handler handler_;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::mutex connections_mutex_;
  std::vector<std::shared_ptr<Connection>> connections_;
  std::vector<std::thread> threads_;
};

std::string percent_decode(std::string_view text);

}  // namespace kt::http

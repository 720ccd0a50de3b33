// A small HTTP/1.1 server for `kubetrain local serve`: every method, request bodies, keep-alive,
// and streamed (chunked) responses for watches, on plain sockets with a thread per connection.
//
// Why not telemetry's cpprest adapter: the Kubernetes API needs what cpprest's listener cannot
// give — it shares cpprest's process-wide thread pool (sized to 2 by telemetry), so a slow
// handler (fault injection) or a blocked one stalls every other request and any cpprest client
// in the process; it gives no sign that a client hung up, so a server-side watch would run
// forever; and it cannot drop a connection mid-response, which is the "dropped watch" fault.
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

namespace kt::local {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // percent-decoded
  std::string query;   // raw, without '?'
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

}  // namespace kt::local

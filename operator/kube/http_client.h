// kubetrain's HTTP client: requests with any method, headers and body; TLS with a CA, a client
// certificate and key; a request timeout; cancellation; and streaming reads of a response body
// line by line (Kubernetes watches). Only http_client.cpp knows the HTTP library (cpprestsdk,
// archived upstream, so it may be swapped); this header must stay free of it.
//
//   HttpClient client({.base_url = "https://10.0.0.1:6443", .tls = {.ca_file = "/ca.crt"}});
//   HttpResponse r = client.send({.method = "GET", .target = "/api/v1/nodes"});
//   auto stream = client.open_stream({.method = "GET", .target = "/api/v1/pods?watch=1"}, token);
//   while (auto line = stream->read_line()) { ... }   // std::nullopt at the end of the body
//
// Transport failures (connection refused, TLS handshake, timeout, cancellation) throw kt::Error
// whose message names the method and URL. HTTP error statuses are not exceptions: the caller
// reads `status`.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kt::kube {

// TLS settings. PEM data fields take precedence over the matching file fields.
struct TlsOptions {
  std::string ca_file;           // trust these CAs instead of the system's
  std::string ca_data;           // PEM
  std::string client_cert_file;  // client certificate chain (mutual TLS)
  std::string client_cert_data;  // PEM
  std::string client_key_file;
  std::string client_key_data;   // PEM
  bool insecure_skip_verify = false;
};

struct HttpClientOptions {
  std::string base_url{};  // "https://host:port" or "http://127.0.0.1:8080", no trailing path
  TlsOptions tls{};
  // Bounds connecting and every read: cpprest's timeout is an inactivity timeout, so a long
  // response that keeps arriving is not cut (docs/ARCHITECTURE.md §8). cpprest has no separate
  // connect timeout; this one covers the connect too.
  std::chrono::milliseconds timeout{30'000};
};

struct HttpRequest {
  std::string method = "GET";
  std::string target{};  // path and query, already percent-encoded: "/api/v1/pods?limit=5"
  std::vector<std::pair<std::string, std::string>> headers{};
  std::string body{};
  std::string content_type{};  // sent when `body` is not empty
  // 0: the client's timeout. A watch sets it above its server-side timeoutSeconds.
  std::chrono::milliseconds timeout{0};
};

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;

  std::optional<std::string> header(const std::string& lower_case_name) const;
};

// Aborts in-flight requests that were given it. Copies share the state; cancel() is idempotent
// and may be called from any thread.
class CancelToken {
 public:
  CancelToken();
  void cancel();
  bool cancelled() const;

  struct State;
  const std::shared_ptr<State>& state() const { return state_; }

 private:
  std::shared_ptr<State> state_;
};

// A response whose body is read incrementally.
class HttpStream {
 public:
  virtual ~HttpStream() = default;
  virtual int status() const = 0;
  virtual const std::map<std::string, std::string>& headers() const = 0;  // lower-cased names
  // The next line without its "\n" (and "\r"); std::nullopt at the end of the body. Blocks
  // until a line, the end or the read timeout; throws kt::Error on a transport failure or
  // cancellation.
  virtual std::optional<std::string> read_line() = 0;
  // The whole rest of the body (for error statuses).
  virtual std::string read_rest() = 0;
};

class HttpClient {
 public:
  explicit HttpClient(HttpClientOptions options);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Sends and reads the whole response. Thread-safe.
  HttpResponse send(const HttpRequest& request, const CancelToken* cancel = nullptr);
  // Sends and returns once the status and headers arrived. The stream keeps the connection;
  // `cancel` aborts it (also from another thread, while read_line() blocks). Thread-safe.
  std::unique_ptr<HttpStream> open_stream(const HttpRequest& request, CancelToken cancel);

  const std::string& base_url() const;

  struct Impl;  // public only so that http_client.cpp's stream can name it

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace kt::kube

// HttpClient over cpprestsdk's http_client (the Boost.Asio client on Linux). The only file of
// operator/kube that includes cpprest headers.
#include "operator/kube/http_client.h"

#include <cpprest/http_client.h>

#include <boost/asio/ssl.hpp>
#include <algorithm>
#include <cctype>
#include <fstream>
#include <mutex>
#include <sstream>

#include "api/error.h"

namespace kt::kube {
namespace {

namespace http = web::http;

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

std::string read_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + what + " " + path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The PEM texts the TLS context needs, read once so that a missing file fails at construction
// with its name instead of at the first handshake with an OpenSSL code.
struct TlsMaterial {
  std::string ca;
  std::string client_cert;
  std::string client_key;
};

TlsMaterial load_tls(const TlsOptions& tls) {
  TlsMaterial m;
  m.ca = !tls.ca_data.empty()    ? tls.ca_data
         : !tls.ca_file.empty() ? read_file(tls.ca_file, "certificate authority file")
                                : "";
  m.client_cert = !tls.client_cert_data.empty() ? tls.client_cert_data
                  : !tls.client_cert_file.empty()
                      ? read_file(tls.client_cert_file, "client certificate file")
                      : "";
  m.client_key = !tls.client_key_data.empty()    ? tls.client_key_data
                 : !tls.client_key_file.empty() ? read_file(tls.client_key_file, "client key file")
                                                : "";
  if (m.client_cert.empty() != m.client_key.empty()) {
    throw Error("a client certificate needs a client key and the other way round");
  }
  return m;
}

std::map<std::string, std::string> lower_case_headers(const http::http_headers& headers) {
  std::map<std::string, std::string> out;
  for (const auto& [name, value] : headers) out[lower(name)] = value;
  return out;
}

}  // namespace

std::optional<std::string> HttpResponse::header(const std::string& lower_case_name) const {
  auto it = headers.find(lower_case_name);
  if (it == headers.end()) return std::nullopt;
  return it->second;
}

struct CancelToken::State {
  pplx::cancellation_token_source source;
};

CancelToken::CancelToken() : state_(std::make_shared<State>()) {}

void CancelToken::cancel() {
  state_->source.cancel();
}

bool CancelToken::cancelled() const {
  return state_->source.get_token().is_canceled();
}

struct HttpClient::Impl {
  HttpClientOptions options;
  TlsMaterial tls;

  // cpprest fixes the timeout per http_client, so there is one client per timeout in use
  // (normally two: requests and watches). Clients pool their connections.
  std::mutex clients_mutex;
  std::map<std::chrono::milliseconds, std::shared_ptr<http::client::http_client>> clients;

  std::shared_ptr<http::client::http_client> client_for(std::chrono::milliseconds timeout) {
    if (timeout.count() <= 0) timeout = options.timeout;
    std::lock_guard lock(clients_mutex);
    auto& client = clients[timeout];
    if (!client) {
      http::client::http_client_config config;
      config.set_timeout(timeout);
      config.set_validate_certificates(!options.tls.insecure_skip_verify);
      const TlsMaterial material = tls;
      config.set_ssl_context_callback([material](boost::asio::ssl::context& context) {
        if (!material.ca.empty()) {
          context.add_certificate_authority(boost::asio::buffer(material.ca));
        }
        if (!material.client_cert.empty()) {
          context.use_certificate_chain(boost::asio::buffer(material.client_cert));
          context.use_private_key(boost::asio::buffer(material.client_key),
                                  boost::asio::ssl::context::pem);
        }
      });
      client = std::make_shared<http::client::http_client>(web::uri(options.base_url), config);
    }
    return client;
  }

  std::string where(const HttpRequest& request) const {
    return request.method + " " + options.base_url + request.target;
  }

  // Sends and waits for the status and headers.
  http::http_response start(const HttpRequest& request, const CancelToken* cancel) {
    try {
      http::http_request message(request.method);
      message.set_request_uri(web::uri(request.target));
      for (const auto& [name, value] : request.headers) message.headers().add(name, value);
      if (!request.body.empty()) {
        message.set_body(request.body,
                         request.content_type.empty() ? "application/json" : request.content_type);
      }
      auto client = client_for(request.timeout);
      const pplx::cancellation_token token =
          cancel ? cancel->state()->source.get_token() : pplx::cancellation_token::none();
      return client->request(message, token).get();
    } catch (const std::exception& e) {
      throw failure(request, e, cancel);
    }
  }

  Error failure(const HttpRequest& request, const std::exception& e,
                const CancelToken* cancel) const {
    if (cancel && cancel->cancelled()) return Error(where(request) + ": cancelled");
    // cpprest's timeout message does not say "timeout" (docs/ARCHITECTURE.md §8).
    return Error(where(request) + ": " + e.what());
  }
};

namespace {

class CpprestStream : public HttpStream {
 public:
  CpprestStream(std::shared_ptr<HttpClient::Impl> owner, HttpRequest request,
                http::http_response response, CancelToken cancel)
      : owner_(std::move(owner)), request_(std::move(request)), response_(std::move(response)),
        cancel_(std::move(cancel)), headers_(lower_case_headers(response_.headers())) {}

  int status() const override { return response_.status_code(); }
  const std::map<std::string, std::string>& headers() const override { return headers_; }

  std::optional<std::string> read_line() override {
    for (;;) {
      if (auto newline = pending_.find('\n', scanned_); newline != std::string::npos) {
        std::string line = pending_.substr(0, newline);
        pending_.erase(0, newline + 1);
        scanned_ = 0;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        return line;
      }
      scanned_ = pending_.size();
      if (!fill()) {
        if (pending_.empty()) return std::nullopt;
        std::string last = std::move(pending_);  // a last line without "\n"
        pending_.clear();
        scanned_ = 0;
        return last;
      }
    }
  }

  std::string read_rest() override {
    while (fill()) {
    }
    std::string rest = std::move(pending_);
    pending_.clear();
    scanned_ = 0;
    return rest;
  }

 private:
  // Appends what arrived to pending_; false at the end of the body. The body is a
  // producer_consumer_buffer whose getn(n) completes only once n bytes are there (or the body
  // ended): asking for 64 KiB would sit on a quiet watch's events. So wait for one byte, then
  // take whatever else is already buffered (in_avail) without waiting. Far cheaper than
  // istream::read_line, which pulls one character per task (docs/ARCHITECTURE.md §8).
  bool fill() {
    if (eof_) return false;
    if (cancel_.cancelled()) throw Error(owner_->where(request_) + ": cancelled");
    try {
      auto buffer = response_.body().streambuf();
      if (buffer.getn(chunk_, 1).get() == 0) {
        eof_ = true;
        return false;
      }
      std::size_t n = 1;
      const std::size_t available = std::min<std::size_t>(buffer.in_avail(), sizeof(chunk_) - 1);
      if (available > 0) n += buffer.getn(chunk_ + 1, available).get();
      pending_.append(reinterpret_cast<const char*>(chunk_), n);
      return true;
    } catch (const std::exception& e) {
      throw owner_->failure(request_, e, &cancel_);
    }
  }

  std::shared_ptr<HttpClient::Impl> owner_;  // the client outlives the stream
  HttpRequest request_;
  http::http_response response_;
  CancelToken cancel_;
  std::map<std::string, std::string> headers_;
  std::string pending_;       // received, not yet returned
  std::size_t scanned_ = 0;   // pending_[0, scanned_) holds no '\n'
  bool eof_ = false;
  std::uint8_t chunk_[64 * 1024];
};

}  // namespace

HttpClient::HttpClient(HttpClientOptions options) : impl_(std::make_shared<Impl>()) {
  if (options.base_url.rfind("http://", 0) != 0 && options.base_url.rfind("https://", 0) != 0) {
    throw Error("server URL must start with http:// or https://, got \"" + options.base_url +
                "\"");
  }
  while (!options.base_url.empty() && options.base_url.back() == '/') options.base_url.pop_back();
  impl_->tls = load_tls(options.tls);
  impl_->options = std::move(options);
}

HttpClient::~HttpClient() = default;

HttpResponse HttpClient::send(const HttpRequest& request, const CancelToken* cancel) {
  http::http_response response = impl_->start(request, cancel);
  HttpResponse out;
  out.status = response.status_code();
  out.headers = lower_case_headers(response.headers());
  try {
    std::vector<unsigned char> body = response.extract_vector().get();
    out.body.assign(body.begin(), body.end());
  } catch (const std::exception& e) {
    throw impl_->failure(request, e, cancel);
  }
  return out;
}

std::unique_ptr<HttpStream> HttpClient::open_stream(const HttpRequest& request,
                                                    CancelToken cancel) {
  http::http_response response = impl_->start(request, &cancel);
  return std::make_unique<CpprestStream>(impl_, request, std::move(response), std::move(cancel));
}

const std::string& HttpClient::base_url() const {
  return impl_->options.base_url;
}

}  // namespace kt::kube

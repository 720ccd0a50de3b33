#include "operator/kube/rest_client.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "api/error.h"
#include "operator/kube/objects.h"

namespace kt::kube {
namespace {

// Reasons the API server gives when its body carries none (apimachinery's StatusReason).
std::string reason_for_code(int code) {
  switch (code) {
    case 400: return "BadRequest";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "NotFound";
    case 405: return "MethodNotAllowed";
    case 406: return "NotAcceptable";
    case 409: return "Conflict";
    case 410: return "Expired";
    case 413: return "RequestEntityTooLarge";
    case 415: return "UnsupportedMediaType";
    case 422: return "Invalid";
    case 429: return "TooManyRequests";
    case 500: return "InternalError";
    case 503: return "ServiceUnavailable";
    case 504: return "Timeout";
    default: return code >= 500 ? "InternalError" : "Unknown";
  }
}

std::optional<int> parse_seconds(const std::string& text) {
  try {
    std::size_t used = 0;
    const int seconds = std::stoi(text, &used);
    if (used == text.size() && seconds >= 0) return seconds;
  } catch (const std::exception&) {
  }
  return std::nullopt;  // an HTTP date: treated as absent
}

std::string name_of(const Object& obj) {
  if (!obj.contains("metadata") || !obj["metadata"].is_object() ||
      !obj["metadata"].contains("name") || !obj["metadata"]["name"].is_string()) {
    throw Error("object has no metadata.name");
  }
  return obj["metadata"]["name"].get<std::string>();
}

// The namespace to use: the argument, else the object's own.
std::string namespace_of(const std::string& ns, const Object& obj) {
  if (!ns.empty()) return ns;
  if (obj.contains("metadata") && obj["metadata"].contains("namespace") &&
      obj["metadata"]["namespace"].is_string()) {
    return obj["metadata"]["namespace"].get<std::string>();
  }
  return "";
}

// Builds "?a=b&c=d" from the non-empty values.
class Query {
 public:
  Query& add(const std::string& name, const std::string& value) {
    if (value.empty()) return *this;
    text_ += (text_.empty() ? "?" : "&") + name + "=" + url_encode(value);
    return *this;
  }
  const std::string& str() const { return text_; }

 private:
  std::string text_;
};

// A watch read by its own thread into a queue, so that next() can wait with a timeout while
// the HTTP read blocks. stop() cancels the HTTP request, which ends the read.
class RestWatch : public Watch {
 public:
  RestWatch(std::unique_ptr<HttpStream> stream, CancelToken cancel)
      : stream_(std::move(stream)), cancel_(std::move(cancel)) {
    reader_ = std::thread([this] { read(); });
  }

  ~RestWatch() override {
    stop();
    reader_.join();
  }

  std::optional<WatchEvent> next(std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mutex_);
    arrived_.wait_for(lock, timeout, [&] { return !events_.empty() || ended_; });
    if (events_.empty()) return std::nullopt;
    WatchEvent event = std::move(events_.front());
    events_.pop_front();
    return event;
  }

  bool ended() const override {
    std::lock_guard lock(mutex_);
    return ended_ && events_.empty();
  }

  void stop() override { cancel_.cancel(); }

 private:
  void read() {
    try {
      while (auto line = stream_->read_line()) {
        if (line->empty()) continue;
        WatchEvent event = parse_watch_event(*line);
        std::lock_guard lock(mutex_);
        events_.push_back(std::move(event));
        arrived_.notify_all();
      }
    } catch (const std::exception&) {
      // A dropped connection, a read timeout, stop() or a garbled frame: the watch ends and
      // the caller watches again from its last resourceVersion.
    }
    std::lock_guard lock(mutex_);
    ended_ = true;
    arrived_.notify_all();
  }

  std::unique_ptr<HttpStream> stream_;
  CancelToken cancel_;
  mutable std::mutex mutex_;
  std::condition_variable arrived_;
  std::deque<WatchEvent> events_;
  bool ended_ = false;
  std::thread reader_;
};

}  // namespace

std::string url_encode(const std::string& text) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

std::string resource_path(const Resource& r, const std::string& ns, const std::string& name,
                          const std::string& subresource) {
  std::string path = r.group.empty() ? "/api/" + r.version : "/apis/" + r.group + "/" + r.version;
  if (r.namespaced && !ns.empty()) path += "/namespaces/" + url_encode(ns);
  path += "/" + r.plural;
  if (!name.empty()) path += "/" + url_encode(name);
  if (!subresource.empty()) path += "/" + subresource;
  return path;
}

ApiError api_error(int status, const std::string& body, std::optional<std::string> retry_after,
                   const std::string& what) {
  std::string reason = reason_for_code(status);
  std::string message = body.substr(0, 300);
  std::optional<int> retry_seconds;
  if (retry_after) retry_seconds = parse_seconds(*retry_after);
  try {
    const Object doc = Object::parse(body);
    if (doc.is_object() && doc.value("kind", "") == "Status") {
      if (doc.contains("reason") && doc["reason"].is_string() &&
          !doc["reason"].get<std::string>().empty()) {
        reason = doc["reason"].get<std::string>();
      }
      if (doc.contains("message") && doc["message"].is_string()) {
        message = doc["message"].get<std::string>();
      }
      if (!retry_seconds && doc.contains("details") && doc["details"].is_object() &&
          doc["details"].contains("retryAfterSeconds") &&
          doc["details"]["retryAfterSeconds"].is_number_integer()) {
        retry_seconds = doc["details"]["retryAfterSeconds"].get<int>();
      }
    }
  } catch (const std::exception&) {
    // Not JSON (a proxy's HTML page): keep the code's reason and the raw text.
  }
  return ApiError(status, reason, what + ": " + std::to_string(status) + " " + reason + ": " +
                                      message,
                  retry_seconds);
}

struct RestClient::Impl {
  HttpClient http;
  BearerToken token;
  RestClientOptions options;

  std::string host;  // "10.0.0.1:6443": the `host` label, as client-go's

  Impl(const Config& config, RestClientOptions opts)
      : http(HttpClientOptions{config.server, config.tls, opts.timeout}),
        token(config.token, config.token_file),
        options(std::move(opts)),
        host(host_of(config.server)) {}

  static std::string host_of(const std::string& server) {
    const auto scheme = server.find("://");
    const std::string rest = scheme == std::string::npos ? server : server.substr(scheme + 3);
    return rest.substr(0, rest.find('/'));
  }

  void observe(const std::string& method, std::chrono::steady_clock::time_point started) {
    if (options.metrics) {
      options.metrics->rest_client_request_duration.with({method, host})
          .observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - started)
                       .count());
    }
  }

  void count(int code, const std::string& method) {
    if (options.metrics) {
      options.metrics->rest_client_requests
          .with({code == 0 ? "<error>" : std::to_string(code), method})
          .inc();
    }
  }

  HttpRequest request(const std::string& method, const std::string& target) {
    HttpRequest r;
    r.method = method;
    r.target = target;
    r.headers.emplace_back("Accept", "application/json");
    r.headers.emplace_back("User-Agent", options.user_agent);
    if (std::string bearer = token.get(); !bearer.empty()) {
      r.headers.emplace_back("Authorization", "Bearer " + bearer);
    }
    return r;
  }

  // Sends, counts, retries 429s, and throws ApiError for error statuses.
  Object call(HttpRequest r) {
    for (int attempt = 0;; ++attempt) {
      HttpResponse response;
      const auto started = std::chrono::steady_clock::now();
      try {
        response = http.send(r);
      } catch (const Error&) {
        observe(r.method, started);
        count(0, r.method);
        throw;
      }
      observe(r.method, started);
      count(response.status, r.method);
      if (response.status >= 200 && response.status < 300) {
        if (response.body.empty()) return Object::object();
        try {
          return Object::parse(response.body);
        } catch (const std::exception& e) {
          throw Error(r.method + " " + r.target + ": response is not JSON: " + e.what());
        }
      }
      ApiError error = api_error(response.status, response.body, response.header("retry-after"),
                                 r.method + " " + r.target);
      if (error.too_many_requests() && attempt < options.max_429_retries) {
        const auto wait = std::min<std::chrono::seconds>(
            std::chrono::seconds(error.retry_after_seconds().value_or(1)), options.max_retry_after);
        std::this_thread::sleep_for(wait);
        continue;
      }
      throw error;
    }
  }

  Object send_object(const std::string& method, const std::string& target, const Object& body,
                     const std::string& content_type = "application/json") {
    HttpRequest r = request(method, target);
    r.body = body.dump();
    r.content_type = content_type;
    return call(std::move(r));
  }
};

RestClient::RestClient(const Config& config, RestClientOptions options)
    : impl_(std::make_shared<Impl>(config, std::move(options))) {}

RestClient::~RestClient() = default;

Object RestClient::get(const Resource& r, const std::string& ns, const std::string& name) {
  return impl_->call(impl_->request("GET", resource_path(r, ns, name)));
}

ObjectList RestClient::list(const Resource& r, const std::string& ns, const ListOptions& opts) {
  Query query;
  query.add("labelSelector", opts.label_selector)
      .add("fieldSelector", opts.field_selector)
      .add("limit", opts.limit > 0 ? std::to_string(opts.limit) : "")
      .add("continue", opts.continue_token)
      .add("resourceVersion", opts.resource_version);
  const Object doc = impl_->call(impl_->request("GET", resource_path(r, ns) + query.str()));
  ObjectList out;
  if (doc.contains("items") && doc["items"].is_array()) {
    for (const Object& item : doc["items"]) {
      Object object = item;
      // List items come without apiVersion and kind; fill them in as client-go's decoder does.
      object["apiVersion"] = r.api_version();
      object["kind"] = r.kind;
      out.items.push_back(std::move(object));
    }
  }
  if (doc.contains("metadata") && doc["metadata"].is_object()) {
    out.resource_version = doc["metadata"].value("resourceVersion", "");
    out.continue_token = doc["metadata"].value("continue", "");
  }
  return out;
}

Object RestClient::create(const Resource& r, const std::string& ns, const Object& obj) {
  return impl_->send_object("POST", resource_path(r, namespace_of(ns, obj)), obj);
}

Object RestClient::update(const Resource& r, const std::string& ns, const Object& obj) {
  return impl_->send_object("PUT", resource_path(r, namespace_of(ns, obj), name_of(obj)), obj);
}

Object RestClient::update_status(const Resource& r, const std::string& ns, const Object& obj) {
  return impl_->send_object("PUT", resource_path(r, namespace_of(ns, obj), name_of(obj), "status"),
                            obj);
}

Object RestClient::merge_patch(const Resource& r, const std::string& ns, const std::string& name,
                               const Object& patch, bool status_subresource) {
  return impl_->send_object("PATCH",
                            resource_path(r, ns, name, status_subresource ? "status" : ""), patch,
                            "application/merge-patch+json");
}

void RestClient::remove(const Resource& r, const std::string& ns, const std::string& name,
                        Propagation propagation) {
  const char* policy = propagation == Propagation::Foreground ? "Foreground"
                       : propagation == Propagation::Orphan   ? "Orphan"
                                                              : "Background";
  impl_->send_object("DELETE", resource_path(r, ns, name),
                     {{"kind", "DeleteOptions"}, {"apiVersion", "v1"},
                      {"propagationPolicy", policy}});
}

std::unique_ptr<Watch> RestClient::watch(const Resource& r, const std::string& ns,
                                         const WatchOptions& opts) {
  Query query;
  query.add("watch", "1")
      .add("resourceVersion", opts.resource_version)
      .add("labelSelector", opts.label_selector)
      .add("fieldSelector", opts.field_selector)
      .add("allowWatchBookmarks", opts.allow_bookmarks ? "true" : "")
      .add("timeoutSeconds", opts.timeout_seconds > 0 ? std::to_string(opts.timeout_seconds) : "");
  HttpRequest request = impl_->request("GET", resource_path(r, ns) + query.str());
  // The read timeout is an inactivity timeout: above the server's own end of the watch, so that
  // a quiet but healthy watch is ended by the server, not cut by us.
  // Rounded up to whole minutes: the adapter keeps one connection pool per timeout, and the
  // informer's random 5–10 min watches would otherwise make one each.
  const int server_seconds = opts.timeout_seconds > 0 ? opts.timeout_seconds : 600;
  request.timeout = std::chrono::minutes((server_seconds + 30 + 59) / 60);
  CancelToken cancel;
  std::unique_ptr<HttpStream> stream;
  const auto started = std::chrono::steady_clock::now();
  try {
    stream = impl_->http.open_stream(request, cancel);
  } catch (const Error&) {
    impl_->observe("GET", started);
    impl_->count(0, "GET");
    throw;
  }
  impl_->observe("GET", started);
  impl_->count(stream->status(), "GET");
  if (stream->status() != 200) {
    auto retry = stream->headers().find("retry-after");
    throw api_error(stream->status(), stream->read_rest(),
                    retry == stream->headers().end() ? std::nullopt
                                                     : std::optional<std::string>(retry->second),
                    "WATCH " + request.target);
  }
  return std::make_unique<RestWatch>(std::move(stream), std::move(cancel));
}

}  // namespace kt::kube

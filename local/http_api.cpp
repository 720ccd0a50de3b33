// The router of `kubetrain local serve` (http_api.h): each request's path to discovery
// (discovery.h), the OpenAPI documents (openapi.h) or a resource handler (get, list, watch,
// create, update, patch, apply, delete, pods/log), with authentication, RBAC, field validation
// and the injected faults on the way; errors as metav1.Status.
#include "local/http_api.h"

#include <cstdlib>
#include <ctime>
#include <fstream>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "api/error.h"
#include "api/yaml_json.h"
#include "local/apply.h"
#include "local/builtin_resources.h"
#include "local/discovery.h"
#include "local/openapi.h"
#include "local/protobuf.h"
#include "local/rbac.h"
#include "local/schema.h"
#include "local/store.h"
#include "local/tables.h"
#include "telemetry/metrics.h"

namespace kt::local {
namespace {

using kube::ApiError;
using kube::Object;
using kube::Resource;

Object status_object(int code, const std::string& reason, const std::string& message) {
  return {{"kind", "Status"},       {"apiVersion", "v1"}, {"metadata", Object::object()},
          {"status", "Failure"},    {"message", message}, {"reason", reason},
          {"details", Object::object()}, {"code", code}};
}

void send_json(ResponseWriter& w, int status, const Object& body,
               const std::map<std::string, std::string>& headers = {}) {
  w.send(status, "application/json", body.dump(), headers);
}

void send_status(ResponseWriter& w, int code, const std::string& reason,
                 const std::string& message, const std::map<std::string, std::string>& headers = {}) {
  send_json(w, code, status_object(code, reason, message), headers);
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::size_t at = 0;
  while (at < path.size()) {
    const auto next = path.find('/', at);
    const std::string part = path.substr(at, next == std::string::npos ? std::string::npos : next - at);
    if (!part.empty()) parts.push_back(part);
    if (next == std::string::npos) break;
    at = next + 1;
  }
  return parts;
}

const char* event_type_name(kube::WatchEventType type) {
  switch (type) {
    case kube::WatchEventType::Added: return "ADDED";
    case kube::WatchEventType::Modified: return "MODIFIED";
    case kube::WatchEventType::Deleted: return "DELETED";
    case kube::WatchEventType::Bookmark: return "BOOKMARK";
    case kube::WatchEventType::Error: return "ERROR";
  }
  return "ERROR";
}

// A non-negative integer query parameter; ApiError 400 when it is not one.
long long integer_param(const HttpRequest& r, const std::string& name) {
  const std::string text = r.param(name);
  try {
    std::size_t used = 0;
    const long long value = std::stoll(text, &used);
    if (used == text.size() && value >= 0) return value;
  } catch (const std::exception&) {
  }
  throw ApiError(400, "BadRequest", "invalid " + name + " \"" + text + "\": not a non-negative integer");
}

bool truthy(const std::string& value) {
  return value == "1" || value == "true" || value == "True";
}

// kubectl's Table form (tables.h) of objects of `served`, each row carrying what the request's
// includeObject asks for.
Object table_of(const HttpRequest& r, const ServedResource& served,
                const std::vector<Object>& items, const std::string& resource_version) {
  return table(served.resource, served.printer_columns, items, resource_version,
               table_object(r.param("includeObject")));
}

}  // namespace

struct ApiServer::Impl {
  kube::Client& backend;
  ApiServer& owner;
  HttpServer http;
  mutable std::mutex faults_mutex;  // guards faults, fault_rng, extra, pod_logs and tokens
  Faults faults;
  std::mt19937_64 fault_rng;  // the draws of faults.error_rate, seeded by faults.seed
  std::vector<ServedResource> extra;  // add_resource()
  using Served = std::shared_ptr<const std::vector<ServedResource>>;
  std::mutex served_mutex;            // guards served_cache and crd_watch
  Served served_cache;                // served(): rebuilt when crd_watch has news
  std::unique_ptr<kube::Watch> crd_watch;
  PodLogPath pod_logs;        // set_pod_logs()
  // ServiceAccount tokens issued by service_account_token(): token -> (namespace, name).
  std::map<std::string, std::pair<std::string, std::string>> tokens;
  std::atomic<int> drop_generation{0};
  // GET /metrics: the API server's own request counter, so that a benchmark or a test can count
  // the LISTs and GETs a client makes without instrumenting the client.
  telemetry::Registry metrics;
  telemetry::Family<telemetry::Counter>& requests_total = metrics.counter(
      "apiserver_request_total",
      "Counter of apiserver requests broken out for each verb, group, version, resource, "
      "scope, component, and HTTP response code.",
      {"verb", "group", "version", "resource", "subresource", "scope", "component", "code"});

  Impl(kube::Client& b, ApiServer& o, const std::string& address, int port)
      : backend(b), owner(o),
        http(address, port, [this](const HttpRequest& r, ResponseWriter& w) { handle(r, w); }) {}

  // What apiserver_request_total counts a request as: the API server's RequestInfo, with its
  // verbs in upper case (LIST, GET, WATCH, POST, PUT, PATCH, APPLY, DELETE); for a request that
  // names no resource, the HTTP method and empty resource labels.
  struct RequestInfo {
    std::string verb, group, version, resource, subresource, scope;
  };

  // Remembers the status of the response, which apiserver_request_total is labelled with.
  class StatusRecorder : public ResponseWriter {
   public:
    explicit StatusRecorder(ResponseWriter& inner) : inner_(inner) {}
    int status() const { return status_; }
    void send(int status, const std::string& content_type, const std::string& body,
              const std::map<std::string, std::string>& headers) override {
      status_ = status;
      inner_.send(status, content_type, body, headers);
    }
    void begin_stream(int status, const std::string& content_type) override {
      status_ = status;
      inner_.begin_stream(status, content_type);
    }
    bool write(std::string_view chunk) override { return inner_.write(chunk); }
    void end_stream() override { inner_.end_stream(); }
    void abort() override { inner_.abort(); }
    bool closed() override { return inner_.closed(); }

   private:
    ResponseWriter& inner_;
    int status_ = 0;
  };

  // ---- resources -----------------------------------------------------------------------------

  // What is served: the built-ins, add_resource()'s and the stored CRDs'. Built once and again
  // only when a CRD changed (every request asks, and listing and decoding the CRDs each time was
  // a fifth of the server's work at 1,000 jobs). A watch of the CRDs says when: the backend
  // queues a watch event as the write happens, so a request after a CRD's write sees it.
  Served served() {
    std::lock_guard lock(served_mutex);
    bool stale = !served_cache || !crd_watch || crd_watch->ended();
    while (!stale && crd_watch->next(std::chrono::milliseconds(0))) stale = true;
    if (!stale) return served_cache;
    auto all = std::make_shared<std::vector<ServedResource>>(builtin_served());
    {
      std::lock_guard faults_lock(faults_mutex);
      all->insert(all->end(), extra.begin(), extra.end());
    }
    crd_watch.reset();
    try {
      const kube::ObjectList crds = backend.list(kube::kCustomResourceDefinitions, "", {});
      for (const Object& crd : crds.items) {
        if (auto s = served_from_crd(crd)) all->push_back(*s);
      }
      kube::WatchOptions changes;
      changes.resource_version = crds.resource_version;
      changes.allow_bookmarks = false;
      crd_watch = backend.watch(kube::kCustomResourceDefinitions, "", changes);
    } catch (const std::exception&) {
      // A backend without CRDs serves the built-ins (and is asked again next time).
    }
    served_cache = std::move(all);
    return served_cache;
  }
  void served_changed() {
    std::lock_guard lock(served_mutex);
    served_cache.reset();
  }

  std::optional<ServedResource> find(const std::string& group, const std::string& version,
                             const std::string& plural) {
    for (const ServedResource& s : *served()) {
      if (s.resource.group == group && s.resource.version == version &&
          s.resource.plural == plural) {
        return s;
      }
    }
    return std::nullopt;
  }

  // ---- faults --------------------------------------------------------------------------------

  // Takes one from `count` if positive.
  bool take(int Faults::*count) {
    std::lock_guard lock(faults_mutex);
    if (faults.*count <= 0) return false;
    --(faults.*count);
    return true;
  }

  std::chrono::milliseconds delay() {
    std::lock_guard lock(faults_mutex);
    return faults.delay;
  }

  // Faults::error_rate for one request: 0 (none), 500 or 429.
  int random_error() {
    std::lock_guard lock(faults_mutex);
    if (faults.error_rate <= 0) return 0;
    const double u = std::uniform_real_distribution<double>(0, 1)(fault_rng);
    if (u >= faults.error_rate) return 0;
    return u < faults.error_rate / 2 ? 500 : 429;
  }

  // Faults::error_rate for one watch: when it ends early (nullopt: it does not) and whether it is
  // cut rather than ended.
  std::optional<std::pair<std::chrono::steady_clock::time_point, bool>> random_watch_end() {
    std::lock_guard lock(faults_mutex);
    if (faults.error_rate <= 0) return std::nullopt;
    const double seconds = std::exponential_distribution<double>(faults.error_rate)(fault_rng);
    const bool cut = std::bernoulli_distribution(0.5)(fault_rng);
    return std::make_pair(std::chrono::steady_clock::now() +
                              std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)),
                          cut);
  }

  void handle_faults_endpoint(const HttpRequest& r, ResponseWriter& w) {
    if (r.method == "POST") {
      const Object body = r.body.empty() ? Object::object() : Object::parse(r.body);
      if (!body.is_object()) throw ApiError(400, "BadRequest", "the faults must be a JSON object");
      // Each value bounded: a fault is a test's short disturbance, not a way to stop the server.
      const auto bounded = [&](const char* key, double current, double max) {
        if (!body.contains(key)) return current;
        const Object& v = body.at(key);
        if (!v.is_number() || !(v.get<double>() >= 0 && v.get<double>() <= max))
          throw ApiError(422, "Invalid",
                         std::string(key) + ": " + v.dump() + " must be a number from 0 to " +
                             Object(max).dump());
        return v.get<double>();
      };
      constexpr double kMaxCount = 10000, kMaxDelayMs = 60000;
      Faults next;
      {
        std::lock_guard lock(faults_mutex);
        next = faults;
      }
      next.watch_gone = static_cast<int>(bounded("watchGone", next.watch_gone, kMaxCount));
      next.watch_expired = static_cast<int>(bounded("watchExpired", next.watch_expired, kMaxCount));
      next.update_conflicts =
          static_cast<int>(bounded("updateConflicts", next.update_conflicts, kMaxCount));
      next.server_errors = static_cast<int>(bounded("serverErrors", next.server_errors, kMaxCount));
      next.too_many_requests =
          static_cast<int>(bounded("tooManyRequests", next.too_many_requests, kMaxCount));
      next.delay = std::chrono::milliseconds(static_cast<long long>(
          bounded("delayMs", static_cast<double>(next.delay.count()), kMaxDelayMs)));
      next.error_rate = bounded("errorRate", next.error_rate, 1);
      std::lock_guard lock(faults_mutex);
      faults = next;
    }
    std::lock_guard lock(faults_mutex);
    send_json(w, 200,
              {{"watchGone", faults.watch_gone},
               {"watchExpired", faults.watch_expired},
               {"updateConflicts", faults.update_conflicts},
               {"serverErrors", faults.server_errors},
               {"tooManyRequests", faults.too_many_requests},
               {"delayMs", faults.delay.count()},
               {"errorRate", faults.error_rate},
               {"openWatches", owner.open_watches()}});
  }

  // ---- requests ------------------------------------------------------------------------------

  void handle(const HttpRequest& r, ResponseWriter& response) {
    StatusRecorder w(response);
    RequestInfo info{r.method, "", "", "", "", ""};
    handle(r, w, info);
    requests_total
        .with({info.verb, info.group, info.version, info.resource, info.subresource, info.scope,
               "apiserver", w.status() == 0 ? "0" : std::to_string(w.status())})
        .inc();
  }

  void handle(const HttpRequest& r, ResponseWriter& w, RequestInfo& info) {
    // KUBETRAIN_LOCAL_LOG_REQUESTS=1: one line per request on stderr (what a client asked).
    static const bool log_requests = std::getenv("KUBETRAIN_LOCAL_LOG_REQUESTS") != nullptr;
    if (log_requests) {
      const auto accept = r.headers.find("accept");
      std::fprintf(stderr, "request %s %s?%s accept=%s\n", r.method.c_str(), r.path.c_str(),
                   r.query.c_str(), accept == r.headers.end() ? "" : accept->second.c_str());
    }
    try {
      route(r, w, info);
    } catch (const ApiError& e) {
      std::map<std::string, std::string> headers;
      if (e.retry_after_seconds()) headers["Retry-After"] = std::to_string(*e.retry_after_seconds());
      Object status = status_object(e.code(), e.reason(), e.what());
      if (e.details().is_object()) status["details"] = e.details();
      send_json(w, e.code(), status, headers);
    } catch (const nlohmann::json::exception& e) {
      send_status(w, 400, "BadRequest", std::string("the request body is not valid JSON: ") + e.what());
    } catch (const kt::FieldError& e) {
      send_status(w, 422, "Invalid", e.what());
    } catch (const ValidationError& e) {
      send_status(w, 422, "Invalid", e.what());
    } catch (const std::exception& e) {
      send_status(w, 500, "InternalError", e.what());
    }
  }

  void route(const HttpRequest& r, ResponseWriter& w, RequestInfo& info) {
    std::string path = r.path;
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    // A request with a ServiceAccount token is that account's, and RBAC decides (rbac.h); one
    // without is the local administrator's (the kubeconfig `local serve` writes has none). An
    // unknown token is 401.
    const std::optional<UserInfo> user = authenticate(r);
    // The fault controls switch the API off for everyone: the administrator's only.
    if (path == "/kubetrain/faults" || path == "/kubetrain/drop-watches") {
      if (user)
        throw ApiError(403, "Forbidden",
                       "User \"" + user->name + "\" cannot use " + path +
                           ": fault injection is the local administrator's only");
      if (path == "/kubetrain/faults") return handle_faults_endpoint(r, w);
      drop_generation++;
      return send_json(w, 200, {{"dropped", true}});
    }
    const bool resource_path = path.rfind("/api/", 0) == 0 || path.rfind("/apis/", 0) == 0;
    if (user && !is_discovery(path) && !resource_path) {
      RequestAttributes attributes;
      attributes.resource_request = false;
      attributes.verb = lower(r.method);
      attributes.path = path;
      check_allowed(*user, attributes);
    }
    if (path == "/healthz" || path == "/readyz" || path == "/livez") {
      return w.send(200, "text/plain", "ok");
    }
    if (path == "/version") {
      return send_json(w, 200, version_info());
    }
    if (path == "/metrics" && r.method == "GET") {
      return w.send(200, "text/plain; version=0.0.4; charset=utf-8", metrics.expose());
    }
    if (path == "/openapi/v2") {
      // kubectl asks for gnostic's protobuf form (openapi_v2.Document); field 1 is `swagger`.
      if (auto accept = r.headers.find("accept");
          accept != r.headers.end() && accept->second.find("protobuf") != std::string::npos) {
        return w.send(200, "application/octet-stream",
                      std::string("\x0a\x03" "2.0", 5));
      }
      return send_json(w, 200, openapi_v2_document());
    }
    if (path == "/openapi/v3" || path.rfind("/openapi/v3/", 0) == 0) {
      std::vector<Object> crds;
      try {
        crds = backend.list(kube::kCustomResourceDefinitions, "", {}).items;
      } catch (const std::exception&) {
      }
      if (path == "/openapi/v3") return send_json(w, 200, openapi_v3_index(crds));
      const std::vector<std::string> parts = split_path(path.substr(std::string("/openapi/v3/").size()));
      if (parts.size() == 3 && parts[0] == "apis") {
        const Object doc = openapi_v3_document(crds, parts[1], parts[2]);
        if (!doc.is_null()) return send_json(w, 200, doc);
      }
      return not_found(w);
    }

    const std::vector<std::string> parts = split_path(path);
    if (parts.empty()) return send_json(w, 200, {{"paths", {"/api", "/apis", "/version"}}});
    std::string group, version;
    std::vector<std::string> rest;
    if (parts[0] == "api") {
      if (parts.size() == 1) return send_json(w, 200, api_versions(http.port()));
      version = parts[1];
      rest.assign(parts.begin() + 2, parts.end());
    } else if (parts[0] == "apis") {
      if (parts.size() == 1) return send_json(w, 200, api_group_list(*served()));
      group = parts[1];
      if (parts.size() == 2) {
        for (const Object& g : api_group_list(*served())["groups"]) {
          if (g["name"] == group) return send_json(w, 200, g);
        }
        return not_found(w);
      }
      version = parts[2];
      rest.assign(parts.begin() + 3, parts.end());
    } else {
      return not_found(w);
    }
    if (rest.empty()) {
      if (r.method != "GET") return send_status(w, 405, "MethodNotAllowed", "method not allowed");
      if (auto list = api_resource_list(*served(), group, version)) return send_json(w, 200, *list);
      return not_found(w);
    }
    std::string ns;
    if (rest[0] == "namespaces" && rest.size() >= 3) {
      ns = rest[1];
      rest.erase(rest.begin(), rest.begin() + 2);
    }
    if (rest.size() > 3) return not_found(w);
    const std::optional<ServedResource> served = find(group, version, rest[0]);
    if (!served || (!served->resource.namespaced && !ns.empty())) return not_found(w);
    const std::string name = rest.size() >= 2 ? rest[1] : "";
    const std::string sub = rest.size() == 3 ? rest[2] : "";
    info = {upper(verb_of(r, name)), group, version, served->resource.plural, sub,
            !name.empty() ? "resource" : !ns.empty() ? "namespace" : "cluster"};
    if (info.verb == "CREATE") info.verb = "POST";
    if (info.verb == "UPDATE") info.verb = "PUT";
    if (info.verb == "DELETECOLLECTION") info.verb = "DELETE";
    if (const auto type = r.headers.find("content-type");
        info.verb == "PATCH" && type != r.headers.end() &&
        type->second.rfind("application/apply-patch", 0) == 0)
      info.verb = "APPLY";
    if (user) {
      RequestAttributes attributes;
      attributes.verb = verb_of(r, name);
      attributes.api_group = group;
      attributes.resource = served->resource.plural;
      attributes.subresource = sub;
      attributes.ns = served->resource.namespaced ? ns : "";
      attributes.name = name;
      if (served->resource == kNamespaces && !name.empty()) attributes.ns = name;
      check_allowed(*user, attributes);
    }
    if (user && (r.method == "POST" || r.method == "PUT") && sub.empty())
      check_owner_references(*user, r, ns);
    if (sub == "log" && served->resource == kube::kPods && r.method == "GET")
      return serve_log(r, w, ns, name);
    if (!sub.empty() && (sub != "status" || !served->status)) return not_found(w);
    serve_resource(r, w, *served, ns, name, sub);
  }

  // ---- authentication and authorization -------------------------------------------------

  std::optional<UserInfo> authenticate(const HttpRequest& r) {
    const auto it = r.headers.find("authorization");
    if (it == r.headers.end()) return std::nullopt;
    const std::string prefix = "Bearer ";
    std::pair<std::string, std::string> account;
    {
      std::lock_guard lock(faults_mutex);
      const auto token = it->second.rfind(prefix, 0) == 0
                             ? tokens.find(it->second.substr(prefix.size()))
                             : tokens.end();
      if (token == tokens.end()) throw ApiError(401, "Unauthorized", "Unauthorized");
      account = token->second;
    }
    // A deleted ServiceAccount's token no longer authenticates.
    try {
      backend.get(kServiceAccounts, account.first, account.second);
    } catch (const ApiError& e) {
      if (e.not_found()) throw ApiError(401, "Unauthorized", "Unauthorized");
      throw;
    }
    return service_account_user(account.first, account.second);
  }

  void check_allowed(const UserInfo& user, const RequestAttributes& attributes) {
    const Decision decision = authorize(backend, user, attributes);
    if (!decision.allowed) throw ApiError(403, "Forbidden", decision.reason);
  }

  // The OwnerReferencesPermissionEnforcement admission plugin: setting blockOwnerDeletion on
  // an ownerReference needs `update` on the owner's finalizers subresource.
  void check_owner_references(const UserInfo& user, const HttpRequest& r, const std::string& ns) {
    Object body;
    try {
      body = parse_body(r);
    } catch (const std::exception&) {
      return;  // the request itself reports its malformed body
    }
    if (!body.is_object() || !body.contains("metadata") || !body["metadata"].is_object()) return;
    const Object refs = body["metadata"].value("ownerReferences", Object::array());
    if (!refs.is_array()) return;
    for (const Object& ref : refs) {
      if (!ref.is_object() || !ref.value("blockOwnerDeletion", false)) continue;
      const std::string api_version = ref.value("apiVersion", "");
      const auto slash = api_version.find('/');
      const std::string group = slash == std::string::npos ? "" : api_version.substr(0, slash);
      for (const ServedResource& owner : *served()) {
        if (owner.resource.kind != ref.value("kind", "") || owner.resource.group != group) continue;
        RequestAttributes attributes;
        attributes.verb = "update";
        attributes.api_group = group;
        attributes.resource = owner.resource.plural;
        attributes.subresource = "finalizers";
        attributes.ns = owner.resource.namespaced ? ns : "";
        attributes.name = ref.value("name", "");
        if (!authorize(backend, user, attributes).allowed) {
          throw ApiError(403, "Forbidden",
                         "cannot set blockOwnerDeletion if an ownerReference refers to a resource "
                         "you can't set finalizers on: " + forbidden_message(user, attributes));
        }
      }
    }
  }

  static bool is_discovery(const std::string& path) {
    return path == "/api" || path == "/apis" || path == "/version" ||
           path.rfind("/openapi", 0) == 0;
  }

  static std::string upper(std::string text) {
    for (char& c : text) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return text;
  }

  static std::string lower(std::string text) {
    for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return text;
  }

  // The API server's verb for a resource request (RequestInfoFactory).
  static std::string verb_of(const HttpRequest& r, const std::string& name) {
    if (r.method == "GET") {
      if (truthy(r.param("watch"))) return "watch";
      return name.empty() ? "list" : "get";
    }
    if (r.method == "POST") return "create";
    if (r.method == "PUT") return "update";
    if (r.method == "PATCH") return "patch";
    if (r.method == "DELETE") return name.empty() ? "deletecollection" : "delete";
    return lower(r.method);
  }

  void not_found(ResponseWriter& w) {
    send_status(w, 404, "NotFound", "the server could not find the requested resource");
  }

  void serve_resource(const HttpRequest& r, ResponseWriter& w, const ServedResource& served,
                      const std::string& ns, const std::string& name, const std::string& sub) {
    const Resource& res = served.resource;
    if (auto d = delay(); d.count() > 0) std::this_thread::sleep_for(d);
    if (take(&Faults::server_errors)) {
      return send_status(w, 500, "InternalError", "injected fault: internal error");
    }
    if (take(&Faults::too_many_requests)) {
      return send_status(w, 429, "TooManyRequests", "injected fault: too many requests",
                         {{"Retry-After", "1"}});
    }
    if (const int code = random_error(); code == 500) {
      return send_status(w, 500, "InternalError", "injected fault (random): internal error");
    } else if (code == 429) {
      return send_status(w, 429, "TooManyRequests", "injected fault (random): too many requests",
                         {{"Retry-After", "1"}});
    }
    // dryRun=All (kubectl --dry-run=server): every check of a real write, nothing written.
    // Reads take no dryRun, as the API server's do.
    const std::string dry_run = r.method == "GET" ? "" : r.param("dryRun");
    if (!dry_run.empty() && dry_run != "All") {
      return send_status(w, 400, "BadRequest",
                         "dryRun: Unsupported value: \"" + dry_run +
                             "\": supported values: \"All\"");
    }
    const DryRun dry_run_scope(!dry_run.empty());
    if ((r.method == "PUT" || r.method == "PATCH") && take(&Faults::update_conflicts)) {
      return send_status(w, 409, "Conflict",
                         "injected fault: Operation cannot be fulfilled on " + res.plural + " \"" +
                             name + "\": the object has been modified; please apply your "
                             "changes to the latest version and try again");
    }

    if (r.method == "GET" && name.empty()) {
      if (truthy(r.param("watch"))) return serve_watch(r, w, served, ns);
      kube::ListOptions options;
      options.label_selector = r.param("labelSelector");
      options.field_selector = r.param("fieldSelector");
      if (r.has_param("limit")) options.limit = integer_param(r, "limit");
      options.continue_token = r.param("continue");
      options.resource_version = r.param("resourceVersion");
      const kube::ObjectList list = backend.list(res, ns, options);
      if (wants_table(r)) {
        // kubectl get pages by 500 and asks for the next page by the Table's continue token.
        Object table = table_of(r, served, list.items, list.resource_version);
        if (!list.continue_token.empty()) table["metadata"]["continue"] = list.continue_token;
        return send_json(w, 200, table);
      }
      Object metadata = {{"resourceVersion", list.resource_version}};
      if (!list.continue_token.empty()) metadata["continue"] = list.continue_token;
      Object items = Object::array();
      for (const Object& item : list.items) items.push_back(item);
      return send_json(w, 200,
                       {{"kind", res.kind + "List"}, {"apiVersion", res.api_version()},
                        {"metadata", metadata}, {"items", items}});
    }
    if (r.method == "GET") {
      const Object object = backend.get(res, ns, name);
      if (wants_table(r)) {
        return send_json(
            w, 200, table_of(r, served, {object}, object["metadata"].value("resourceVersion", "")));
      }
      return send_json(w, 200, object);
    }
    if (r.method == "POST" && name.empty()) {
      Object body = parse_body(r);
      if (res.namespaced && body.is_object() &&
          (!body.contains("metadata") || !body["metadata"].contains("namespace"))) {
        body["metadata"]["namespace"] = ns;
      }
      const auto warnings = field_validation(r, served, body);
      const Object created = backend.create(res, ns, body);
      if (res == kube::kCustomResourceDefinitions && !DryRun::active()) mark_established(created);
      return send_json(w, 201, created, warnings);
    }
    if (name.empty()) {
      return send_status(w, 405, "MethodNotAllowed",
                         r.method + " is not supported on a collection here");
    }
    if (r.method == "PUT") {
      Object body = parse_body(r);
      if (!body.is_object() || !body.contains("metadata") ||
          body["metadata"].value("name", "") != name) {
        return send_status(w, 400, "BadRequest",
                           "the name of the object (" +
                               (body.is_object() && body.contains("metadata")
                                    ? body["metadata"].value("name", "")
                                    : std::string()) +
                               ") does not match the name on the URL (" + name + ")");
      }
      if (res.namespaced && !body["metadata"].contains("namespace")) {
        body["metadata"]["namespace"] = ns;
      }
      if (sub == "status") return send_json(w, 200, backend.update_status(res, ns, body));
      const auto warnings = field_validation(r, served, body);
      return send_json(w, 200, backend.update(res, ns, body), warnings);
    }
    if (r.method == "PATCH") {
      const std::string type = content_type(r);
      if (type == "application/apply-patch+yaml") return serve_apply(r, w, served, ns, name, sub);
      if (type != "application/merge-patch+json" &&
          type != "application/strategic-merge-patch+json") {
        return send_status(w, 415, "UnsupportedMediaType",
                           "the body of the request was in an unknown format - accepted media "
                           "types include: application/merge-patch+json, "
                           "application/apply-patch+yaml, application/strategic-merge-patch+json");
      }
      if (r.has_param("force")) {
        return send_status(w, 422, "Invalid",
                           "PatchOptions.meta.k8s.io \"\" is invalid: force: Forbidden: may not "
                           "be specified for non-apply patch");
      }
      Object patch = parse_body(r);
      strip_patch_directives(patch);
      const auto warnings =
          sub == "status" ? std::map<std::string, std::string>{} : field_validation(r, served, patch);
      return send_json(w, 200, backend.merge_patch(res, ns, name, patch, sub == "status"),
                       warnings);
    }
    if (r.method == "DELETE") {
      std::string policy = r.param("propagationPolicy");
      if (!r.body.empty()) {
        const Object options = parse_body(r);
        if (options.is_object() && options.contains("propagationPolicy") &&
            options["propagationPolicy"].is_string()) {
          policy = options["propagationPolicy"].get<std::string>();
        }
      }
      kube::Propagation propagation = kube::Propagation::Background;
      if (policy == "Foreground") propagation = kube::Propagation::Foreground;
      else if (policy == "Orphan") propagation = kube::Propagation::Orphan;
      else if (!policy.empty() && policy != "Background") {
        return send_status(w, 400, "BadRequest", "unknown propagationPolicy \"" + policy + "\"");
      }
      const Object object = backend.get(res, ns, name);
      backend.remove(res, ns, name, propagation);
      return send_json(w, 200, object);
    }
    send_status(w, 405, "MethodNotAllowed", r.method + " is not supported");
  }

  // Server-side field validation (fieldValidation=Strict|Warn|Ignore; the API server's default
  // is Warn) of a custom resource's body: unknown fields are refused with 400 (Strict) or named
  // in Warning headers (Warn); the Store prunes them either way. `body` may be a partial object
  // (a merge patch): only its unknown fields count here, the Store validates the result.
  std::map<std::string, std::string> field_validation(const HttpRequest& r,
                                                      const ServedResource& served,
                                                      const Object& body) {
    const std::string mode = r.has_param("fieldValidation") ? r.param("fieldValidation") : "Warn";
    if (mode != "Strict" && mode != "Warn" && mode != "Ignore") {
      throw ApiError(400, "BadRequest",
                     "fieldValidation parameter unsupported: " + mode +
                         " (supported: Ignore, Warn, Strict)");
    }
    const Resource& res = served.resource;
    if (mode == "Ignore" || builtin_group(res.group) || !body.is_object()) return {};
    Object crd;
    try {
      crd = backend.get(kube::kCustomResourceDefinitions, "", res.plural + "." + res.group);
    } catch (const ApiError&) {
      return {};
    }
    const Object* schema = find_version_schema(crd, res.version);
    if (!schema) return {};
    Object copy = body;
    const SchemaResult result = apply_structural_schema(*schema, copy, /*prune=*/false);
    if (result.unknown_fields.empty()) return {};
    if (mode == "Strict") {
      throw ApiError(400, "BadRequest",
                     res.kind + " in version \"" + res.version + "\" cannot be handled as a " +
                         res.kind + ": " + strict_decoding_error(result.unknown_fields));
    }
    std::string warning;
    for (const std::string& field : result.unknown_fields) {
      warning += (warning.empty() ? "" : ", ") + std::string("299 - ") +
                 Object(unknown_field_warning(field)).dump();
    }
    return {{"Warning", warning}};
  }

  static bool builtin_group(const std::string& group) {
    for (const BuiltinResource& b : builtin_resources())
      if (b.resource.group == group) return true;
    return false;
  }

  // Server-side apply (apply.h): Helm 4's and `kubectl apply --server-side`'s PATCH. Creates
  // the object when it is missing; a conflict with another manager is a 409 with its causes.
  void serve_apply(const HttpRequest& r, ResponseWriter& w, const ServedResource& served,
                   const std::string& ns, const std::string& name, const std::string& sub) {
    const Resource& res = served.resource;
    const std::string manager = r.param("fieldManager");
    check_apply_field_manager(manager);
    const Object applied = parse_apply_body(r.body);
    const auto warnings = sub.empty() ? field_validation(r, served, applied)
                                      : std::map<std::string, std::string>{};
    Object crd;
    const Object* schema = nullptr;
    if (!builtin_group(res.group)) {
      try {
        crd = backend.get(kube::kCustomResourceDefinitions, "", res.plural + "." + res.group);
        schema = find_version_schema(crd, res.version);
      } catch (const ApiError&) {
      }
    }
    WriteTarget target{res, res.namespaced ? ns : "", name, sub, schema, {}};
    if (served.status) target.reset_fields = {sub == "status" ? "spec" : "status"};
    const bool force = truthy(r.param("force"));
    // The live object may change between the read and the write: a stale write is a Conflict
    // from the Store, and the apply is done again on the new version (as the API server does).
    for (int attempt = 0;; ++attempt) {
      Object live;
      try {
        live = backend.get(res, ns, name);
      } catch (const ApiError& e) {
        if (!e.not_found()) throw;
      }
      if (live.is_null() && sub == "status") {
        throw ApiError(404, "NotFound",
                       res.plural + (res.group.empty() ? "" : "." + res.group) + " \"" + name +
                           "\" not found");
      }
      ApplyResult result = apply(live, applied, target, manager, force, std::chrono::system_clock::now());
      if (!result.conflicts.empty()) return send_json(w, 409, conflict_status(result.conflicts));
      try {
        if (result.created) {
          Object created = backend.create(res, ns, result.object);
          if (res == kube::kCustomResourceDefinitions) mark_established(created);
          return send_json(w, 201, created, warnings);
        }
        if (!result.changed) return send_json(w, 200, live, warnings);
        result.object["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"];
        return send_json(w, 200,
                         sub == "status" ? backend.update_status(res, ns, result.object)
                                         : backend.update(res, ns, result.object),
                         warnings);
      } catch (const ApiError& e) {
        if (attempt >= 4 || !(e.conflict() || e.already_exists())) throw;
      }
    }
  }

  // A request body: JSON, or Kubernetes protobuf (protobuf.h) from client-go's typed clients.
  static Object parse_body(const HttpRequest& r) {
    if (content_type(r) == kProtobufContentType) return decode_kubernetes_protobuf(r.body);
    try {
      return api::parse_json(r.body, "the request body");  // depth-bounded
    } catch (const kt::Error& e) {
      throw ApiError(400, "BadRequest", e.what());
    }
  }

  static std::string content_type(const HttpRequest& r) {
    auto it = r.headers.find("content-type");
    if (it == r.headers.end()) return "";
    return it->second.substr(0, it->second.find(';'));
  }

  static bool wants_table(const HttpRequest& r) {
    auto it = r.headers.find("accept");
    return it != r.headers.end() && it->second.find("as=Table") != std::string::npos;
  }

  // Strategic merge patch is served as a merge patch: its "$patch", "$retainKeys",
  // "$setElementOrder/..." directives are dropped, and lists are replaced, not merged by key.
  static void strip_patch_directives(Object& patch) {
    if (!patch.is_object()) return;
    for (auto it = patch.begin(); it != patch.end();) {
      if (!it.key().empty() && it.key()[0] == '$') {
        it = patch.erase(it);
      } else {
        strip_patch_directives(it.value());
        ++it;
      }
    }
  }

  // The API server marks a CRD Established once it serves it; the Store serves it at once.
  void mark_established(const Object& crd) {
    try {
      Object established = crd;
      const std::string now = crd["metadata"].value("creationTimestamp", "");
      established["status"] = {
          {"acceptedNames", crd["spec"].value("names", Object::object())},
          {"storedVersions", Object::array()},
          {"conditions",
           {{{"type", "NamesAccepted"}, {"status", "True"}, {"reason", "NoConflicts"},
             {"lastTransitionTime", now}, {"message", "no conflicts found"}},
            {{"type", "Established"}, {"status", "True"}, {"reason", "InitialNamesAccepted"},
             {"lastTransitionTime", now}, {"message", "the initial names have been accepted"}}}}};
      backend.update_status(kube::kCustomResourceDefinitions, "", established);
    } catch (const std::exception&) {
      // Cosmetic: the resource is served either way.
    }
  }

  void serve_watch(const HttpRequest& r, ResponseWriter& w, const ServedResource& served,
                   const std::string& ns) {
    const Resource& res = served.resource;
    const bool as_table = wants_table(r);
    if (take(&Faults::watch_gone)) {
      return send_status(w, 410, "Gone", "injected fault: too old resource version");
    }
    auto send_expired = [&](const std::string& message) {
      w.begin_stream(200, "application/json");
      w.write(Object{{"type", "ERROR"}, {"object", status_object(410, "Expired", message)}}.dump() +
              "\n");
      w.end_stream();
    };
    if (take(&Faults::watch_expired)) return send_expired("injected fault: too old resource version");

    kube::WatchOptions options;
    options.resource_version = r.param("resourceVersion");
    options.label_selector = r.param("labelSelector");
    options.field_selector = r.param("fieldSelector");
    options.allow_bookmarks = truthy(r.param("allowWatchBookmarks"));
    options.timeout_seconds =
        r.has_param("timeoutSeconds") ? static_cast<int>(integer_param(r, "timeoutSeconds")) : 0;
    // A streaming list (client-go's WatchList, kstatus' informers: sendInitialEvents=true):
    // ADDED for every object that exists, then a bookmark annotated
    // k8s.io/initial-events-end, then the changes since — the API server's order.
    std::vector<std::string> initial_events;
    if (truthy(r.param("sendInitialEvents"))) {
      if (!options.allow_bookmarks) {
        throw ApiError(422, "Invalid",
                       "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: "
                       "sendInitialEvents is forbidden for watch unless allowWatchBookmarks=true");
      }
      kube::ListOptions list_options;
      list_options.label_selector = options.label_selector;
      list_options.field_selector = options.field_selector;
      const kube::ObjectList list = backend.list(res, ns, list_options);
      for (const Object& item : list.items) {
        const Object object =
            as_table ? table_of(r, served, {item}, item["metadata"].value("resourceVersion", ""))
                     : item;
        initial_events.push_back(Object{{"type", "ADDED"}, {"object", object}}.dump() + "\n");
      }
      const Object bookmark = {
          {"kind", res.kind},
          {"apiVersion", res.api_version()},
          {"metadata",
           {{"resourceVersion", list.resource_version},
            {"annotations", {{"k8s.io/initial-events-end", "true"}}}}}};
      initial_events.push_back(Object{{"type", "BOOKMARK"}, {"object", bookmark}}.dump() + "\n");
      options.resource_version = list.resource_version;
    }
    std::unique_ptr<kube::Watch> watch;
    try {
      watch = backend.watch(res, ns, options);
    } catch (const ApiError& e) {
      // The API server reports an expired version as the first event of a 200 stream.
      if (e.gone()) return send_expired(e.what());
      throw;
    }
    const int generation = drop_generation.load();
    owner.open_watches_++;
    struct Leave {
      ApiServer& owner;
      ~Leave() { owner.open_watches_--; }
    } leave{owner};
    w.begin_stream(200, "application/json");
    for (const std::string& line : initial_events)
      if (!w.write(line)) return watch->stop();
    // An empty watch still answers with headers at once; cpprest's client returns then.
    const auto limit = std::chrono::seconds(options.timeout_seconds > 0 ? options.timeout_seconds : 1800);
    const auto deadline = std::chrono::steady_clock::now() + limit;
    const auto early_end = random_watch_end();
    for (;;) {
      if (w.closed()) break;
      if (early_end && std::chrono::steady_clock::now() >= early_end->first) {
        if (early_end->second)
          w.abort();
        else
          w.end_stream();
        break;
      }
      if (drop_generation.load() != generation) {
        w.abort();
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        w.end_stream();
        break;
      }
      auto event = watch->next(std::chrono::milliseconds(200));
      if (!event) {
        if (watch->ended()) {
          w.end_stream();
          break;
        }
        continue;
      }
      if (event->type == kube::WatchEventType::Bookmark && !options.allow_bookmarks) continue;
      // kubectl get --watch asks for tables: each event carries a one-row Table.
      const bool tabulate = as_table && event->type != kube::WatchEventType::Bookmark &&
                            event->type != kube::WatchEventType::Error;
      const Object object = tabulate
                                ? table_of(r, served, {event->object},
                                           event->object["metadata"].value("resourceVersion", ""))
                                : event->object;
      const std::string line =
          Object{{"type", event_type_name(event->type)}, {"object", object}}.dump() + "\n";
      if (!w.write(line)) break;
    }
    watch->stop();
  }

  // ---- pods/log ------------------------------------------------------------------------------

  // kubectl logs [-f] [--tail N] [--previous] [-c C]: the pod runner's log file of the pod.
  void serve_log(const HttpRequest& r, ResponseWriter& w, const std::string& ns,
                 const std::string& name) {
    const Object pod = backend.get(kube::kPods, ns, name);  // 404 as the API server's
    const Object containers = pod["spec"].value("containers", Object::array());
    const std::string first = containers.empty() ? "" : containers[0].value("name", "");
    const std::string container = r.has_param("container") ? r.param("container") : first;
    bool known = false;
    for (const auto& c : containers) known = known || c.value("name", "") == container;
    if (!known) {
      return send_status(w, 400, "BadRequest",
                         "container " + container + " is not valid for pod " + name);
    }
    if (truthy(r.param("previous"))) {
      // restartPolicy Never on the local node: no container ran before this one.
      return send_status(w, 400, "BadRequest",
                         "previous terminated container \"" + container + "\" in pod \"" +
                             name + "\" not found");
    }
    std::string path;
    {
      std::lock_guard lock(faults_mutex);
      if (pod_logs) path = pod_logs(ns, name);
    }
    std::ifstream in(path, std::ios::binary);
    if (path.empty() || !in) {
      return send_status(w, 400, "BadRequest",
                         "container \"" + container + "\" in pod \"" + name +
                             "\" is waiting to start: ContainerCreating");
    }
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (r.has_param("tailLines")) {
      const long long lines = integer_param(r, "tailLines");
      std::size_t at = text.size();
      if (at > 0 && text[at - 1] == '\n') --at;
      long long seen = 0;
      while (at > 0 && seen < lines) {
        const auto nl = text.rfind('\n', at - 1);
        if (nl == std::string::npos) {
          at = 0;
          break;
        }
        if (++seen == lines) {
          at = nl + 1;
          break;
        }
        at = nl;
      }
      if (lines == 0) at = text.size();
      text = text.substr(at);
    }
    if (!truthy(r.param("follow"))) return w.send(200, "text/plain", text);
    // Follow: what is there, then what is appended, until the pod has ended and all is read.
    w.begin_stream(200, "text/plain");
    if (!text.empty() && !w.write(text)) return;
    std::streamoff offset = static_cast<std::streamoff>(in.tellg());
    for (;;) {
      if (w.closed()) return;
      std::ifstream more(path, std::ios::binary);
      more.seekg(offset);
      std::string chunk((std::istreambuf_iterator<char>(more)), std::istreambuf_iterator<char>());
      if (!chunk.empty()) {
        offset += static_cast<std::streamoff>(chunk.size());
        if (!w.write(chunk)) return;
        continue;
      }
      std::string phase = "Unknown";
      try {
        const Object now = backend.get(kube::kPods, ns, name);
        phase = now.contains("status") ? now["status"].value("phase", "Pending") : "Pending";
      } catch (const ApiError&) {
        phase = "Gone";
      }
      if (phase == "Succeeded" || phase == "Failed" || phase == "Gone") {
        w.end_stream();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
};

ApiServer::ApiServer(kube::Client& backend, std::string address, int port)
    : impl_(std::make_unique<Impl>(backend, *this, address, port)) {}

ApiServer::~ApiServer() {
  stop();
}

void ApiServer::start() {
  impl_->http.start();
}

void ApiServer::stop() {
  impl_->http.stop();
}

int ApiServer::port() const {
  return impl_->http.port();
}

std::string ApiServer::url() const {
  return "http://127.0.0.1:" + std::to_string(port());
}

std::string ApiServer::kubeconfig() const {
  return "apiVersion: v1\n"
         "kind: Config\n"
         "clusters:\n"
         "- name: kubetrain-local\n"
         "  cluster:\n"
         "    server: " + url() + "\n"
         "users:\n"
         "- name: kubetrain-local\n"
         "  user: {}\n"
         "contexts:\n"
         "- name: kubetrain-local\n"
         "  context:\n"
         "    cluster: kubetrain-local\n"
         "    user: kubetrain-local\n"
         "    namespace: default\n"
         "current-context: kubetrain-local\n";
}

void ApiServer::write_kubeconfig(const std::string& path) const {
  std::ofstream out(path, std::ios::trunc);
  out << kubeconfig();
  out.close();
  if (!out) throw Error("cannot write kubeconfig " + path);
}

void ApiServer::add_resource(const kube::Resource& resource, bool status_subresource,
                             std::vector<std::string> short_names) {
  ServedResource served = served_without_crd(resource, status_subresource, std::move(short_names));
  {
    std::lock_guard lock(impl_->faults_mutex);
    impl_->extra.push_back(std::move(served));
  }
  impl_->served_changed();
}

std::string ApiServer::service_account_token(const std::string& ns, const std::string& name) {
  std::lock_guard lock(impl_->faults_mutex);
  for (const auto& [token, account] : impl_->tokens)
    if (account.first == ns && account.second == name) return token;
  std::random_device random;
  char text[40];
  std::snprintf(text, sizeof text, "kt-%08x%08x%08x%08x", random(), random(), random(), random());
  impl_->tokens[text] = {ns, name};
  return text;
}

std::string ApiServer::service_account_kubeconfig(const std::string& ns, const std::string& name) {
  const std::string token = service_account_token(ns, name);
  std::string config = kubeconfig();
  const std::string plain = "  user: {}\n";
  config.replace(config.find(plain), plain.size(), "  user:\n    token: " + token + "\n");
  const std::string default_ns = "    namespace: default\n";
  config.replace(config.find(default_ns), default_ns.size(), "    namespace: " + ns + "\n");
  return config;
}

void ApiServer::set_pod_logs(PodLogPath path_of) {
  std::lock_guard lock(impl_->faults_mutex);
  impl_->pod_logs = std::move(path_of);
}

void ApiServer::set_faults(const Faults& faults) {
  std::lock_guard lock(impl_->faults_mutex);
  impl_->faults = faults;
  impl_->fault_rng.seed(faults.seed);
}

Faults ApiServer::faults() const {
  std::lock_guard lock(impl_->faults_mutex);
  return impl_->faults;
}

void ApiServer::drop_watches() {
  impl_->drop_generation++;
}

}  // namespace kt::local

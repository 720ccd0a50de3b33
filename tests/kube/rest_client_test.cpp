// RestClient against `kubetrain local serve` over real sockets: paths, verbs, watch, and how
// every class of API error comes back.
#include "operator/kube/rest_client.h"

#include <gtest/gtest.h>

#include <thread>

#include "api/error.h"
#include "local/builtin_resources.h"
#include "tests/kube/local_server.h"
#include "tests/support/eventually.h"

using namespace std::chrono_literals;
using namespace kt::kube;
using kt::kube::testing::config_map;
using kt::kube::testing::LocalServer;

namespace {

// Runs `call` and returns the ApiError it throws (fails the test if it throws none).
template <typename F>
ApiError api_error_of(F&& call) {
  try {
    call();
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no ApiError";
  return ApiError(0, "", "");
}

Object training_job(const std::string& name) {
  return {{"apiVersion", "kubetrain.dev/v1alpha1"},
          {"kind", "TrainingJob"},
          {"metadata", {{"name", name}}},
          {"spec", {{"training", {{"steps", 10}}}}}};
}

}  // namespace

TEST(ResourcePath, CoreGroupNamespacedClusterScopedAndSubresource) {
  EXPECT_EQ(resource_path(kPods, "ns", "p", "status"), "/api/v1/namespaces/ns/pods/p/status");
  EXPECT_EQ(resource_path(kPods, ""), "/api/v1/pods");
  EXPECT_EQ(resource_path(kNodes, "ignored", "n1"), "/api/v1/nodes/n1");
  EXPECT_EQ(resource_path(kLeases, "kube-system", "op"),
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/op");
  EXPECT_EQ(resource_path(kCustomResourceDefinitions, "", "a.b"),
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/a.b");
  EXPECT_EQ(url_encode("a in (b,c),d!=e"), "a%20in%20%28b%2Cc%29%2Cd%21%3De");
}

TEST(ApiErrorClassification, StatusBodyHeaderAndCodeFallbacks) {
  const ApiError from_status = api_error(
      409,
      R"({"kind":"Status","status":"Failure","reason":"AlreadyExists","message":"pods \"a\" already exists","code":409})",
      std::nullopt, "POST /api/v1/namespaces/d/pods");
  EXPECT_TRUE(from_status.already_exists());
  EXPECT_FALSE(from_status.conflict());
  EXPECT_NE(std::string(from_status.what()).find("pods \"a\" already exists"), std::string::npos);

  const ApiError proxy_page = api_error(503, "<html>busy</html>", "7", "GET /x");
  EXPECT_EQ(proxy_page.reason(), "ServiceUnavailable");
  EXPECT_TRUE(proxy_page.server_error());
  EXPECT_EQ(proxy_page.retry_after_seconds(), 7);

  const ApiError details = api_error(
      429, R"({"kind":"Status","reason":"TooManyRequests","details":{"retryAfterSeconds":3}})",
      std::nullopt, "GET /x");
  EXPECT_TRUE(details.too_many_requests());
  EXPECT_EQ(details.retry_after_seconds(), 3);
  EXPECT_EQ(api_error(410, "", std::nullopt, "GET /x").reason(), "Expired");
  EXPECT_TRUE(api_error(410, "", std::nullopt, "GET /x").gone());
}

TEST(RestClient, CreateGetListUpdatePatchDeleteRoundTrip) {
  LocalServer local;
  auto client = local.client();
  const Object created = client->create(kConfigMaps, "default", config_map("a", "1"));
  EXPECT_FALSE(created["metadata"]["resourceVersion"].get<std::string>().empty());
  EXPECT_EQ(client->get(kConfigMaps, "default", "a")["data"]["key"], "1");

  Object changed = created;
  changed["data"]["key"] = "2";
  const Object updated = client->update(kConfigMaps, "default", changed);
  EXPECT_EQ(updated["data"]["key"], "2");
  EXPECT_NE(updated["metadata"]["resourceVersion"], created["metadata"]["resourceVersion"]);

  const Object patched =
      client->merge_patch(kConfigMaps, "default", "a", {{"data", {{"other", "x"}}}});
  EXPECT_EQ(patched["data"]["key"], "2");
  EXPECT_EQ(patched["data"]["other"], "x");

  client->create(kConfigMaps, "default", config_map("b"));
  client->create(kConfigMaps, "other", config_map("c", "v", "other"));
  EXPECT_EQ(client->list(kConfigMaps, "default", {}).items.size(), 2u);
  const ObjectList all = client->list(kConfigMaps, "", {});
  EXPECT_EQ(all.items.size(), 3u);
  EXPECT_EQ(all.items[0]["kind"], "ConfigMap") << "list items get their kind back";
  EXPECT_FALSE(all.resource_version.empty());

  client->remove(kConfigMaps, "default", "a");
  EXPECT_TRUE(api_error_of([&] { client->get(kConfigMaps, "default", "a"); }).not_found());
}

TEST(RestClient, SelectorsAndPaginationTravelInTheQuery) {
  LocalServer local;
  auto client = local.client();
  for (int i = 0; i < 5; ++i) {
    Object cm = config_map("cm-" + std::to_string(i));
    cm["metadata"]["labels"]["tier"] = i % 2 ? "odd" : "even";
    client->create(kConfigMaps, "default", cm);
  }
  ListOptions selector;
  selector.label_selector = "tier in (odd),app=kt";
  EXPECT_EQ(client->list(kConfigMaps, "default", selector).items.size(), 2u);
  ListOptions field;
  field.field_selector = "metadata.name=cm-3";
  EXPECT_EQ(client->list(kConfigMaps, "default", field).items.size(), 1u);

  ListOptions page;
  page.limit = 2;
  std::set<std::string> names;
  int pages = 0;
  do {
    const ObjectList list = client->list(kConfigMaps, "default", page);
    for (const auto& item : list.items) names.insert(item["metadata"]["name"]);
    page.continue_token = list.continue_token;
    ++pages;
  } while (!page.continue_token.empty() && pages < 10);
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(names.size(), 5u);
}

TEST(RestClient, StatusSubresourceAndCustomResources) {
  LocalServer local;
  auto client = local.client();
  client->create(kTrainingJobs, "default", training_job("tj"));
  Object with_status = client->get(kTrainingJobs, "default", "tj");
  with_status["status"] = {{"phase", "Running"}};
  with_status["spec"]["training"]["steps"] = 99;
  const Object after = client->update_status(kTrainingJobs, "default", with_status);
  EXPECT_EQ(after["status"]["phase"], "Running");
  EXPECT_EQ(after["spec"]["training"]["steps"], 10) << "the status subresource ignores spec";
  const Object patched = client->merge_patch(kTrainingJobs, "default", "tj",
                                             {{"status", {{"phase", "Succeeded"}}}}, true);
  EXPECT_EQ(patched["status"]["phase"], "Succeeded");
}

TEST(RestClient, NotFoundConflictAndAlreadyExistsAreTellApart) {
  LocalServer local;
  auto client = local.client();
  const ApiError missing = api_error_of([&] { client->get(kPods, "default", "nope"); });
  EXPECT_EQ(missing.code(), 404);
  EXPECT_TRUE(missing.not_found());

  const Object first = client->create(kConfigMaps, "default", config_map("a"));
  const ApiError exists = api_error_of([&] { client->create(kConfigMaps, "default", config_map("a")); });
  EXPECT_EQ(exists.code(), 409);
  EXPECT_TRUE(exists.already_exists());
  EXPECT_FALSE(exists.conflict());

  client->merge_patch(kConfigMaps, "default", "a", {{"data", {{"key", "newer"}}}});
  Object stale = first;  // carries the old resourceVersion
  stale["data"]["key"] = "stale";
  const ApiError conflict = api_error_of([&] { client->update(kConfigMaps, "default", stale); });
  EXPECT_EQ(conflict.code(), 409);
  EXPECT_TRUE(conflict.conflict());
  EXPECT_FALSE(conflict.already_exists());
}

TEST(RestClient, InvalidObjectsAre422) {
  LocalServer local;
  auto client = local.client();
  Object nameless = config_map("x");
  nameless["metadata"].erase("name");
  const ApiError invalid = api_error_of([&] { client->create(kConfigMaps, "default", nameless); });
  EXPECT_EQ(invalid.code(), 422);
  EXPECT_TRUE(invalid.invalid());
  EXPECT_EQ(invalid.reason(), "Invalid");
}

TEST(RestClient, TooManyRequestsCarriesRetryAfterAndIsRetriedWhenAllowed) {
  LocalServer local;
  auto no_retry = local.client({.max_429_retries = 0});
  local.server.set_faults({.too_many_requests = 1});
  const ApiError throttled = api_error_of([&] { no_retry->list(kPods, "default", {}); });
  EXPECT_EQ(throttled.code(), 429);
  EXPECT_TRUE(throttled.too_many_requests());
  EXPECT_EQ(throttled.retry_after_seconds(), 1);

  auto retrying = local.client({.max_429_retries = 2});
  local.server.set_faults({.too_many_requests = 1});
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NO_THROW(retrying->list(kPods, "default", {}));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 900ms) << "waited for Retry-After: 1";
}

TEST(RestClient, ServerErrorsAndInjectedConflictsAreClassified) {
  LocalServer local;
  auto client = local.client();
  const Object cm = client->create(kConfigMaps, "default", config_map("a"));
  local.server.set_faults({.server_errors = 1});
  const ApiError internal = api_error_of([&] { client->get(kConfigMaps, "default", "a"); });
  EXPECT_EQ(internal.code(), 500);
  EXPECT_TRUE(internal.server_error());
  EXPECT_EQ(client->get(kConfigMaps, "default", "a")["metadata"]["name"], "a")
      << "the fault was consumed";

  local.server.set_faults({.update_conflicts = 1});
  EXPECT_TRUE(api_error_of([&] { client->update(kConfigMaps, "default", cm); }).conflict());
}

TEST(RestClient, TransportFailuresAreErrorsNotApiErrors) {
  std::string url;
  {
    LocalServer gone;
    url = gone.server.url();
  }  // nothing listens there now
  Config config;
  config.server = url;
  RestClient client(config, {.timeout = 5s});
  try {
    client.get(kPods, "default", "x");
    ADD_FAILURE() << "no error";
  } catch (const ApiError& e) {
    ADD_FAILURE() << "a transport failure is not an ApiError: " << e.what();
  } catch (const kt::Error& e) {
    EXPECT_NE(std::string(e.what()).find(url), std::string::npos) << e.what();
  }
}

TEST(RestClient, CountsRequestsByCodeAndMethod) {
  LocalServer local;
  kt::telemetry::Registry registry;
  KubeMetrics metrics(registry);
  auto client = local.client({.metrics = &metrics});
  client->create(kConfigMaps, "default", config_map("a"));
  client->get(kConfigMaps, "default", "a");
  client->get(kConfigMaps, "default", "a");
  EXPECT_THROW(client->get(kConfigMaps, "default", "b"), ApiError);
  EXPECT_EQ(metrics.rest_client_requests.with({"201", "POST"}).value(), 1);
  EXPECT_EQ(metrics.rest_client_requests.with({"200", "GET"}).value(), 2);
  EXPECT_EQ(metrics.rest_client_requests.with({"404", "GET"}).value(), 1);
}

TEST(RestClient, DeletePropagationReachesTheServer) {
  LocalServer local;
  auto client = local.client();
  const Object owner = client->create(kConfigMaps, "default", config_map("owner"));
  for (const std::string name : {"orphaned", "collected"}) {
    Object dependent = config_map(name);
    dependent["metadata"]["ownerReferences"] = {
        {{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"name", "owner"},
         {"uid", owner["metadata"]["uid"]}, {"controller", true}}};
    client->create(kConfigMaps, "default", dependent);
  }
  // Orphan keeps the dependents; then Background on a new owner of the other one collects it.
  client->remove(kConfigMaps, "default", "owner", Propagation::Orphan);
  EXPECT_NO_THROW(client->get(kConfigMaps, "default", "orphaned"));
  EXPECT_NO_THROW(client->get(kConfigMaps, "default", "collected"));

  const Object owner2 = client->create(kConfigMaps, "default", config_map("owner2"));
  client->merge_patch(kConfigMaps, "default", "collected",
                      {{"metadata",
                        {{"ownerReferences",
                          {{{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"name", "owner2"},
                            {"uid", owner2["metadata"]["uid"]}}}}}}});
  client->remove(kConfigMaps, "default", "owner2", Propagation::Background);
  EXPECT_TRUE(api_error_of([&] { client->get(kConfigMaps, "default", "collected"); }).not_found());
  EXPECT_NO_THROW(client->get(kConfigMaps, "default", "orphaned"));
}

TEST(RestClientWatch, StreamsEventsAsTheyHappenAndStopsOnDemand) {
  LocalServer local;
  auto client = local.client();
  const ObjectList start = client->list(kConfigMaps, "default", {});
  WatchOptions options;
  options.resource_version = start.resource_version;
  auto watch = client->watch(kConfigMaps, "default", options);
  client->create(kConfigMaps, "default", config_map("a"));
  client->merge_patch(kConfigMaps, "default", "a", {{"data", {{"key", "2"}}}});
  client->remove(kConfigMaps, "default", "a");
  std::vector<WatchEventType> types;
  while (types.size() < 3) {
    auto event = watch->next(10s);
    ASSERT_TRUE(event) << "no event within 10 s";
    if (event->type == WatchEventType::Bookmark) continue;
    EXPECT_EQ(event->object["metadata"]["name"], "a");
    types.push_back(event->type);
  }
  EXPECT_EQ(types, (std::vector<WatchEventType>{WatchEventType::Added, WatchEventType::Modified,
                                                WatchEventType::Deleted}));

  // stop() from another thread ends a blocked next() promptly.
  std::thread stopper([&] {
    std::this_thread::sleep_for(200ms);
    watch->stop();
  });
  const auto before = std::chrono::steady_clock::now();
  while (!watch->ended() && std::chrono::steady_clock::now() - before < 10s) watch->next(1s);
  stopper.join();
  EXPECT_TRUE(watch->ended());
  EXPECT_LT(std::chrono::steady_clock::now() - before, 5s);
}

TEST(RestClientWatch, TooOldVersionsAnd410sReachTheCaller) {
  LocalServer local(kt::local::StoreOptions{.history_limit = 2});
  auto client = local.client();
  client->create(kConfigMaps, "default", config_map("first"));
  const std::string old_version = client->list(kConfigMaps, "default", {}).resource_version;
  for (int i = 0; i < 5; ++i) client->create(kConfigMaps, "default", config_map("cm" + std::to_string(i)));

  // Compacted history: the API server's way, a 200 stream whose first event is ERROR 410.
  WatchOptions options;
  options.resource_version = old_version;
  auto watch = client->watch(kConfigMaps, "default", options);
  auto event = watch->next(10s);
  ASSERT_TRUE(event);
  EXPECT_EQ(event->type, WatchEventType::Error);
  EXPECT_EQ(event->object["code"], 410);

  // An HTTP 410 answer to the watch request is an ApiError.
  local.server.set_faults({.watch_gone = 1});
  options.resource_version = client->list(kConfigMaps, "default", {}).resource_version;
  const ApiError gone = api_error_of([&] { client->watch(kConfigMaps, "default", options); });
  EXPECT_TRUE(gone.gone());
}

TEST(RestClientWatch, ADroppedConnectionEndsTheWatch) {
  LocalServer local;
  auto client = local.client();
  WatchOptions options;
  options.resource_version = client->list(kConfigMaps, "default", {}).resource_version;
  auto watch = client->watch(kConfigMaps, "default", options);
  ASSERT_TRUE(kt::test::eventually([&] { return local.server.open_watches() == 1; }));
  local.server.drop_watches();
  const auto before = std::chrono::steady_clock::now();
  while (!watch->ended() && std::chrono::steady_clock::now() - before < 10s) watch->next(200ms);
  EXPECT_TRUE(watch->ended());
}

TEST(LocalServeFaults, AreSetThroughTheControlEndpointAndDropWatches) {
  LocalServer local;
  auto client = local.client();
  HttpClient http({.base_url = local.server.url()});
  const HttpResponse set = http.send({.method = "POST",
                                      .target = "/kubetrain/faults",
                                      .body = R"({"serverErrors": 1, "delayMs": 10})",
                                      .content_type = "application/json"});
  ASSERT_EQ(set.status, 200) << set.body;
  EXPECT_EQ(local.server.faults().server_errors, 1);
  EXPECT_EQ(local.server.faults().delay, 10ms);
  EXPECT_TRUE(api_error_of([&] { client->list(kPods, "default", {}); }).server_error());
  EXPECT_NO_THROW(client->list(kPods, "default", {}));

  WatchOptions options;
  options.resource_version = client->list(kPods, "default", {}).resource_version;
  auto watch = client->watch(kPods, "default", options);
  ASSERT_TRUE(kt::test::eventually([&] { return local.server.open_watches() == 1; }));
  EXPECT_EQ(http.send({.method = "POST", .target = "/kubetrain/drop-watches"}).status, 200);
  const auto before = std::chrono::steady_clock::now();
  while (!watch->ended() && std::chrono::steady_clock::now() - before < 10s) watch->next(200ms);
  EXPECT_TRUE(watch->ended());
}

// The fault controls can switch the API off for everyone: a pod's ServiceAccount token gets 403,
// an unknown token 401, and the administrator's values are bounded (422, nothing changed).
TEST(LocalServeFaults, OnlyTheAdministratorSetsThem_WithinBounds) {
  LocalServer local;
  local.store.create(kt::local::kServiceAccounts, "default",
                     {{"apiVersion", "v1"},
                      {"kind", "ServiceAccount"},
                      {"metadata", {{"name", "pod-account"}, {"namespace", "default"}}}});
  const std::string token = local.server.service_account_token("default", "pod-account");
  HttpClient http({.base_url = local.server.url()});
  const auto post = [&](const std::string& target, const std::string& body,
                        const std::string& bearer) {
    HttpRequest request{.method = "POST", .target = target, .body = body,
                        .content_type = "application/json"};
    if (!bearer.empty()) request.headers.emplace_back("Authorization", "Bearer " + bearer);
    return http.send(request);
  };
  for (const char* target : {"/kubetrain/faults", "/kubetrain/drop-watches"}) {
    EXPECT_EQ(post(target, R"({"serverErrors": 1000000})", token).status, 403) << target;
    EXPECT_EQ(post(target, R"({"serverErrors": 1000000})", "kt-unknown").status, 401) << target;
  }
  EXPECT_EQ(local.server.faults().server_errors, 0);
  for (const char* body : {R"({"serverErrors": 1000000})", R"({"errorRate": 1e308})",
                           R"({"delayMs": -5})", R"({"watchGone": "many"})"}) {
    const HttpResponse refused = post("/kubetrain/faults", body, "");
    EXPECT_EQ(refused.status, 422) << body;
    EXPECT_NE(refused.body.find("must be a number from 0 to"), std::string::npos) << refused.body;
  }
  EXPECT_EQ(local.server.faults().server_errors, 0);
  EXPECT_EQ(local.server.faults().error_rate, 0);
  EXPECT_EQ(local.server.faults().delay, 0ms);
  EXPECT_EQ(post("/kubetrain/faults", R"({"serverErrors": 2, "errorRate": 0.5})", "").status, 200);
  EXPECT_EQ(local.server.faults().server_errors, 2);
  EXPECT_EQ(local.server.faults().error_rate, 0.5);
}

// `kubetrain local serve --inject-faults RATE`: about RATE of the resource requests fail, as 500
// and 429 (with Retry-After) Status objects in equal parts; discovery is never hit; watches end
// early, on average after 1/RATE seconds; a rate of 0 injects nothing.
TEST(LocalServeFaults, RandomFaultsHitAFractionOfRequestsAndEndWatches) {
  LocalServer local;
  HttpClient http({.base_url = local.server.url()});
  local.server.set_faults({.error_rate = 0.2, .seed = 7});
  int server_errors = 0, too_many = 0, ok = 0;
  constexpr int kRequests = 1000;
  for (int i = 0; i < kRequests; ++i) {
    const HttpResponse r = http.send({.method = "GET", .target = "/api/v1/namespaces/default/configmaps"});
    if (r.status == 200) {
      ++ok;
      continue;
    }
    const Object status = Object::parse(r.body);
    EXPECT_EQ(status["kind"], "Status");
    EXPECT_EQ(status["code"], r.status);
    if (r.status == 500) {
      EXPECT_EQ(status["reason"], "InternalError");
      ++server_errors;
    } else {
      ASSERT_EQ(r.status, 429);
      EXPECT_EQ(status["reason"], "TooManyRequests");
      EXPECT_EQ(r.header("retry-after").value_or(""), "1");
      ++too_many;
    }
  }
  // Binomial(1000, 0.1) each: mean 100, standard deviation 9.5; these bounds are 5 of them.
  EXPECT_GT(server_errors, 52);
  EXPECT_LT(server_errors, 148);
  EXPECT_GT(too_many, 52);
  EXPECT_LT(too_many, 148);
  EXPECT_EQ(ok + server_errors + too_many, kRequests);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(http.send({.method = "GET", .target = "/api/v1"}).status, 200);

  // Mean watch life 1 / 0.8 = 1.25 s: each watch ends well within 20 s, some with the end of
  // the chunked body, some cut (a transport error).
  local.server.set_faults({.error_rate = 0.8, .seed = 7});
  int ended = 0, cut = 0;
  for (int i = 0; i < 6; ++i) {
    std::unique_ptr<HttpStream> watch;
    for (int tries = 0; !watch && tries < 200; ++tries) {  // the watch request itself may fail
      auto stream = http.open_stream(
          {.method = "GET", .target = "/api/v1/namespaces/default/configmaps?watch=1"}, CancelToken());
      if (stream->status() == 200) watch = std::move(stream);
    }
    ASSERT_TRUE(watch);
    const auto before = std::chrono::steady_clock::now();
    try {
      while (watch->read_line()) {
      }
      ++ended;
    } catch (const kt::Error&) {
      ++cut;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - before, 20s) << "watch " << i;
  }
  EXPECT_GT(ended, 0);
  EXPECT_GT(cut, 0);

  local.server.set_faults({});
  for (int i = 0; i < 200; ++i)
    EXPECT_EQ(http.send({.method = "GET", .target = "/api/v1/namespaces/default/configmaps"}).status, 200);
}

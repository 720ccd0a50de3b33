// `kubetrain local serve`'s REST surface as a raw HTTP client sees it: discovery, Tables,
// Status errors, patch content types, name checks on PUT, and CRDs served once created.
#include "operator/local/http_api.h"

#include <gtest/gtest.h>

#include "operator/kube/http_client.h"
#include "tests/kube/local_server.h"

using namespace kt::kube;
using kt::kube::testing::LocalServer;

namespace {

struct Raw {
  explicit Raw(const LocalServer& local) : http({.base_url = local.server.url()}) {}

  HttpResponse call(const std::string& method, const std::string& target,
                    const std::string& body = "", const std::string& content_type = "application/json",
                    std::vector<std::pair<std::string, std::string>> headers = {}) {
    return http.send({.method = method, .target = target, .headers = std::move(headers),
                      .body = body, .content_type = content_type});
  }
  Object json(const std::string& method, const std::string& target, const std::string& body = "",
              const std::string& content_type = "application/json") {
    return Object::parse(call(method, target, body, content_type).body);
  }

  HttpClient http;
};

const char* kCrd = R"({
  "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
  "metadata": {"name": "widgets.example.dev"},
  "spec": {"group": "example.dev", "scope": "Cluster",
           "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
           "versions": [{"name": "v1", "served": true, "storage": true,
                         "subresources": {"status": {}},
                         "additionalPrinterColumns": [{"name": "Size", "type": "integer", "jsonPath": ".spec.size"}],
                         "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}})";

}  // namespace

TEST(LocalServeApi, DiscoveryListsCoreGroupsAndCrdResources) {
  LocalServer local;
  Raw raw(local);
  EXPECT_EQ(raw.json("GET", "/api")["versions"], Object({"v1"}));
  const Object core = raw.json("GET", "/api/v1");
  EXPECT_EQ(core["kind"], "APIResourceList");
  bool pods = false, pods_status = false;
  for (const Object& r : core["resources"]) {
    if (r["name"] == "pods") pods = r["namespaced"] == true && r["shortNames"] == Object({"po"});
    if (r["name"] == "pods/status") pods_status = true;
  }
  EXPECT_TRUE(pods);
  EXPECT_TRUE(pods_status);

  ASSERT_EQ(raw.call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", kCrd).status, 201);
  const Object groups = raw.json("GET", "/apis");
  bool example = false, leases = false;
  for (const Object& g : groups["groups"]) {
    example = example || (g["name"] == "example.dev" && g["preferredVersion"]["groupVersion"] == "example.dev/v1");
    leases = leases || g["name"] == "coordination.k8s.io";
  }
  EXPECT_TRUE(example);
  EXPECT_TRUE(leases);
  const Object widgets = raw.json("GET", "/apis/example.dev/v1");
  ASSERT_EQ(widgets["resources"].size(), 2u);  // widgets and widgets/status
  EXPECT_EQ(widgets["resources"][0]["kind"], "Widget");
  EXPECT_EQ(widgets["resources"][0]["namespaced"], false);
  EXPECT_EQ(widgets["resources"][0]["shortNames"], Object({"wd"}));
  EXPECT_EQ(raw.call("GET", "/apis/example.dev/v2").status, 404);
  EXPECT_EQ(raw.json("GET", "/version")["major"], "1");

  // The CRD was marked Established, and its resource is served (cluster-scoped).
  const Object crd = raw.json("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.dev");
  EXPECT_EQ(crd["status"]["conditions"][1]["type"], "Established");
  EXPECT_EQ(raw.call("POST", "/apis/example.dev/v1/widgets",
                     R"({"apiVersion":"example.dev/v1","kind":"Widget","metadata":{"name":"w"},"spec":{"size":3}})")
                .status,
            201);
  EXPECT_EQ(raw.call("GET", "/apis/example.dev/v1/namespaces/default/widgets/w").status, 404)
      << "a cluster-scoped resource has no namespaced path";
}

TEST(LocalServeApi, TablesCarryPrinterColumnsForKubectl) {
  LocalServer local;
  Raw raw(local);
  raw.call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", kCrd);
  raw.call("POST", "/apis/example.dev/v1/widgets",
           R"({"apiVersion":"example.dev/v1","kind":"Widget","metadata":{"name":"w"},"spec":{"size":3}})");
  const HttpResponse r = raw.call("GET", "/apis/example.dev/v1/widgets", "", "",
                                  {{"Accept", "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}});
  const Object table = Object::parse(r.body);
  EXPECT_EQ(table["kind"], "Table");
  std::vector<std::string> columns;
  for (const Object& c : table["columnDefinitions"]) columns.push_back(c["name"]);
  EXPECT_EQ(columns, (std::vector<std::string>{"Name", "Size", "Age"}));
  ASSERT_EQ(table["rows"].size(), 1u);
  EXPECT_EQ(table["rows"][0]["cells"][0], "w");
  EXPECT_EQ(table["rows"][0]["cells"][1], 3);
  EXPECT_EQ(table["rows"][0]["object"]["metadata"]["name"], "w");
}

TEST(LocalServeApi, ErrorsAreStatusObjects) {
  LocalServer local;
  Raw raw(local);
  const HttpResponse missing = raw.call("GET", "/api/v1/namespaces/default/pods/nope");
  EXPECT_EQ(missing.status, 404);
  const Object status = Object::parse(missing.body);
  EXPECT_EQ(status["kind"], "Status");
  EXPECT_EQ(status["reason"], "NotFound");
  EXPECT_EQ(status["code"], 404);
  EXPECT_EQ(raw.call("GET", "/apis/nothing.dev/v1/things").status, 404);
  EXPECT_EQ(raw.call("POST", "/api/v1/namespaces/default/configmaps", "{not json").status, 400);
  EXPECT_EQ(raw.call("GET", "/api/v1/namespaces/default/configmaps?limit=ten").status, 400);
  EXPECT_EQ(raw.call("GET", "/api/v1/configmaps?watch=1&timeoutSeconds=-1").status, 400);

  raw.call("POST", "/api/v1/namespaces/default/configmaps",
           R"({"metadata":{"name":"a"},"data":{"k":"v"}})");
  EXPECT_EQ(raw.call("PUT", "/api/v1/namespaces/default/configmaps/a",
                     R"({"metadata":{"name":"b"},"data":{"k":"v"}})")
                .status,
            400)
      << "the body's name must match the URL's";
  EXPECT_EQ(raw.call("PATCH", "/api/v1/namespaces/default/configmaps/a", R"([{"op":"remove"}])",
                     "application/json-patch+json")
                .status,
            415);
  EXPECT_EQ(raw.call("DELETE", "/api/v1/namespaces/default/configmaps/a", R"({"propagationPolicy":"Sideways"})")
                .status,
            400);
  EXPECT_EQ(raw.call("DELETE", "/api/v1/namespaces/default/configmaps").status, 405);

  // A hostile body is a 400, and the server lives on.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const HttpResponse refused = raw.call("POST", "/api/v1/namespaces/default/pods",
                                        R"({"metadata":{"name":"p"},"spec":{"containers":)" +
                                            deep + "}}");
  EXPECT_EQ(refused.status, 400);
  EXPECT_NE(refused.body.find("nested more than 100 levels deep"), std::string::npos)
      << refused.body;
  EXPECT_EQ(raw.call("GET", "/api/v1/namespaces/default/configmaps/a").status, 200);
}

TEST(LocalServeApi, StrategicMergePatchIsAppliedAsAMergePatchWithoutDirectives) {
  LocalServer local;
  Raw raw(local);
  raw.call("POST", "/api/v1/namespaces/default/configmaps",
           R"({"metadata":{"name":"a","labels":{"x":"1"}},"data":{"k":"v","gone":"y"}})");
  const HttpResponse r = raw.call(
      "PATCH", "/api/v1/namespaces/default/configmaps/a",
      R"({"$setElementOrder/x":[],"metadata":{"labels":{"y":"2","$patch":"merge"}},"data":{"gone":null}})",
      "application/strategic-merge-patch+json");
  ASSERT_EQ(r.status, 200) << r.body;
  const Object cm = Object::parse(r.body);
  EXPECT_EQ(cm["metadata"]["labels"], Object({{"x", "1"}, {"y", "2"}}));
  EXPECT_EQ(cm["data"], Object({{"k", "v"}}));
}

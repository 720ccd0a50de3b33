// `kubetrain local serve`'s REST surface as a raw HTTP client sees it: discovery, Tables,
// Status errors, patch content types, name checks on PUT, and CRDs served once created.
#include "local/http_api.h"

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

// What is served is kept between requests and rebuilt when a CRD changes: the first request after
// a CRD's create, update or delete already sees the change.
TEST(LocalServeApi, ServedResources_FollowEveryCrdChange_OnTheNextRequest) {
  LocalServer local;
  Raw raw(local);
  const std::string crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
  EXPECT_EQ(raw.call("GET", "/apis/example.dev/v1").status, 404);
  ASSERT_EQ(raw.call("POST", crds, kCrd).status, 201);
  EXPECT_EQ(raw.call("GET", "/apis/example.dev/v1/widgets").status, 200);
  // v1 renamed v2 in place (an update): v1 is gone, v2 served.
  Object crd = raw.json("GET", crds + "/widgets.example.dev");
  crd["spec"]["versions"][0]["name"] = "v2";
  ASSERT_EQ(raw.call("PUT", crds + "/widgets.example.dev", crd.dump()).status, 200);
  EXPECT_EQ(raw.call("GET", "/apis/example.dev/v1/widgets").status, 404);
  EXPECT_EQ(raw.call("GET", "/apis/example.dev/v2/widgets").status, 200);
  ASSERT_EQ(raw.call("DELETE", crds + "/widgets.example.dev").status, 200);
  EXPECT_EQ(raw.call("GET", "/apis/example.dev/v2/widgets").status, 404);
  EXPECT_EQ(raw.call("GET", "/apis/example.dev/v2").status, 404);
}

// GET /metrics: apiserver_request_total counts each request by the API server's verb (a GET of a
// collection is a LIST), resource, scope and response code.
TEST(LocalServeApi, Metrics_CountRequestsByVerbResourceAndCode) {
  LocalServer local;
  Raw raw(local);
  ASSERT_EQ(raw.call("GET", "/api/v1/namespaces/default/pods").status, 200);
  ASSERT_EQ(raw.call("GET", "/api/v1/namespaces/default/pods").status, 200);
  ASSERT_EQ(raw.call("GET", "/api/v1/namespaces/default/pods/nope").status, 404);
  ASSERT_EQ(raw.call("GET", "/api/v1/nodes").status, 200);
  const HttpResponse r = raw.call("GET", "/metrics");
  ASSERT_EQ(r.status, 200);
  const auto has = [&](const std::string& line) {
    return r.body.find(line + "\n") != std::string::npos;
  };
  EXPECT_TRUE(has("apiserver_request_total{verb=\"LIST\",group=\"\",version=\"v1\",resource=\"pods\","
                  "subresource=\"\",scope=\"namespace\",component=\"apiserver\",code=\"200\"} 2"))
      << r.body;
  EXPECT_TRUE(has("apiserver_request_total{verb=\"GET\",group=\"\",version=\"v1\",resource=\"pods\","
                  "subresource=\"\",scope=\"resource\",component=\"apiserver\",code=\"404\"} 1"))
      << r.body;
  EXPECT_TRUE(has("apiserver_request_total{verb=\"LIST\",group=\"\",version=\"v1\",resource=\"nodes\","
                  "subresource=\"\",scope=\"cluster\",component=\"apiserver\",code=\"200\"} 1"))
      << r.body;
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

// kubectl get --sort-by and -o custom-columns ask for the whole object in each row
// (includeObject=Object); None leaves it out; anything else is refused.
TEST(LocalServeApi, TableRows_CarryWhatIncludeObjectAsks) {
  LocalServer local;
  Raw raw(local);
  raw.call("POST", "/api/v1/namespaces/default/configmaps",
           R"({"metadata":{"name":"a"},"data":{"k":"v"}})");
  const std::vector<std::pair<std::string, std::string>> table = {
      {"Accept", "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}};
  const std::string path = "/api/v1/namespaces/default/configmaps";
  const Object whole =
      Object::parse(raw.call("GET", path + "?includeObject=Object", "", "", table).body);
  ASSERT_EQ(whole["rows"].size(), 1u);
  EXPECT_EQ(whole["rows"][0]["object"]["kind"], "ConfigMap");
  EXPECT_EQ(whole["rows"][0]["object"]["data"]["k"], "v");
  const Object one =
      Object::parse(raw.call("GET", path + "/a?includeObject=Object", "", "", table).body);
  EXPECT_EQ(one["rows"][0]["object"]["data"]["k"], "v");
  const Object metadata = Object::parse(raw.call("GET", path, "", "", table).body);
  EXPECT_EQ(metadata["rows"][0]["object"]["kind"], "PartialObjectMetadata");
  EXPECT_FALSE(metadata["rows"][0]["object"].contains("data"));
  const Object none =
      Object::parse(raw.call("GET", path + "?includeObject=None", "", "", table).body);
  EXPECT_FALSE(none["rows"][0].contains("object"));
  const HttpResponse bad = raw.call("GET", path + "?includeObject=All", "", "", table);
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("includeObject: Unsupported value: \\\"All\\\""), std::string::npos)
      << bad.body;
}

// dryRun=All (kubectl --dry-run=server) runs every check of a write and writes nothing: no
// object, no watch event, no resourceVersion spent; an invalid write is refused as for real.
TEST(LocalServeApi, DryRun_ChecksEverythingAndWritesNothing) {
  LocalServer local;
  Raw raw(local);
  const std::string path = "/api/v1/namespaces/default/configmaps";
  ASSERT_EQ(raw.call("POST", path, R"({"metadata":{"name":"kept"},"data":{"k":"v"}})").status, 201);
  const std::string version = raw.json("GET", path)["metadata"]["resourceVersion"];

  const HttpResponse created =
      raw.call("POST", path + "?dryRun=All", R"({"metadata":{"name":"new"},"data":{"k":"v"}})");
  EXPECT_EQ(created.status, 201) << created.body;
  EXPECT_EQ(Object::parse(created.body)["metadata"]["name"], "new");
  EXPECT_EQ(raw.call("GET", path + "/new").status, 404);
  EXPECT_EQ(raw.call("POST", path + "?dryRun=All", R"({"metadata":{"name":"Not_A_Name"}})").status,
            422);
  EXPECT_EQ(raw.call("POST", path + "?dryRun=All", R"({"metadata":{"name":"kept"}})").status, 409);

  const HttpResponse patched = raw.call("PATCH", path + "/kept?dryRun=All", R"({"data":{"k":"w"}})",
                                        "application/merge-patch+json");
  EXPECT_EQ(patched.status, 200) << patched.body;
  EXPECT_EQ(Object::parse(patched.body)["data"]["k"], "w");
  EXPECT_EQ(raw.json("GET", path + "/kept")["data"]["k"], "v");

  EXPECT_EQ(raw.call("DELETE", path + "/kept?dryRun=All").status, 200);
  EXPECT_EQ(raw.call("GET", path + "/kept").status, 200);

  EXPECT_EQ(raw.json("GET", path)["metadata"]["resourceVersion"], version);
  EXPECT_EQ(raw.call("POST", path + "?dryRun=Yes", R"({"metadata":{"name":"x"}})").status, 400);
}

// kubectl get asks for pages of 500 rows and follows the Table's continue token.
TEST(LocalServeApi, TablePages_CarryTheContinueToken) {
  LocalServer local;
  Raw raw(local);
  for (const char* name : {"a", "b", "c"})
    raw.call("POST", "/api/v1/namespaces/default/configmaps",
             std::string(R"({"metadata":{"name":")") + name + R"("}})");
  const std::vector<std::pair<std::string, std::string>> table = {
      {"Accept", "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}};
  const Object first = Object::parse(
      raw.call("GET", "/api/v1/namespaces/default/configmaps?limit=2", "", "", table).body);
  ASSERT_EQ(first["rows"].size(), 2u);
  std::string token;
  for (char c : first["metadata"].value("continue", std::string()))
    token += c == '|' ? "%7C" : c == '/' ? "%2F" : std::string(1, c);
  ASSERT_FALSE(token.empty());
  const Object second = Object::parse(
      raw.call("GET", "/api/v1/namespaces/default/configmaps?limit=2&continue=" + token, "", "",
               table)
          .body);
  ASSERT_EQ(second["rows"].size(), 1u);
  EXPECT_EQ(second["rows"][0]["cells"][0], "c");
  EXPECT_FALSE(second["metadata"].contains("continue"));
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

TEST(LocalServeApi, BuiltinBodiesOfTheWrongShape_AreRefusedAtTheDoor) {
  LocalServer local;
  Raw raw(local);
  // `containers` as a map was once stored, and the pod runner then failed on it ten times a
  // second for ever. kube-apiserver's typed decoding answers 400.
  const HttpResponse map_containers = raw.call(
      "POST", "/api/v1/namespaces/default/pods",
      R"({"metadata":{"name":"p"},"spec":{"containers":{"name":"main","image":"x"}}})");
  EXPECT_EQ(map_containers.status, 400) << map_containers.body;
  const Object status = Object::parse(map_containers.body);
  EXPECT_EQ(status["reason"], "BadRequest");
  EXPECT_NE(status["message"].get<std::string>().find(
                "Pod in version \"v1\" cannot be handled as a Pod: spec.containers: Invalid value: "
                "\"object\": spec.containers in body must be of type array"),
            std::string::npos)
      << map_containers.body;
  EXPECT_EQ(raw.call("GET", "/api/v1/namespaces/default/pods/p").status, 404);
  // Validation that the API server does after decoding: 422 with the field.
  const HttpResponse no_containers =
      raw.call("POST", "/api/v1/namespaces/default/pods", R"({"metadata":{"name":"p"},"spec":{}})");
  EXPECT_EQ(no_containers.status, 422) << no_containers.body;
  EXPECT_NE(no_containers.body.find("spec.containers: Required value"), std::string::npos)
      << no_containers.body;
  // Paths that would leave the pod's directory on the node's disk.
  const HttpResponse escape = raw.call(
      "POST", "/api/v1/namespaces/default/pods",
      R"({"metadata":{"name":"p"},"spec":{"containers":[{"name":"main","image":"x"}],
          "volumes":[{"name":"cfg","configMap":{"name":"c","items":[{"key":"k","path":"../../../etc/x"}]}},
                     {"name":"../up","emptyDir":{}},
                     {"name":"d","persistentVolumeClaim":{"claimName":"../../root"}}]}})");
  EXPECT_EQ(escape.status, 422) << escape.body;
  for (const char* field : {"spec.volumes[0].configMap.items[0].path", "spec.volumes[1].name",
                            "spec.volumes[2].persistentVolumeClaim.claimName"})
    EXPECT_NE(escape.body.find(field), std::string::npos) << field << " in " << escape.body;
  // Other kinds the control plane reads: a ConfigMap's data, a Role's verbs, a Lease's duration.
  EXPECT_EQ(raw.call("POST", "/api/v1/namespaces/default/configmaps",
                     R"({"metadata":{"name":"c"},"data":{"k":{"nested":1}}})")
                .status,
            400);
  EXPECT_EQ(raw.call("POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles",
                     R"({"metadata":{"name":"r"},"rules":[{"verbs":"get"}]})")
                .status,
            400);
  EXPECT_EQ(raw.call("POST", "/apis/coordination.k8s.io/v1/namespaces/default/leases",
                     R"({"metadata":{"name":"l"},"spec":{"leaseDurationSeconds":"long"}})")
                .status,
            400);
  // A well-formed pod with fields these schemas do not type is stored whole.
  const HttpResponse good = raw.call(
      "POST", "/api/v1/namespaces/default/pods",
      R"({"metadata":{"name":"p"},"spec":{"containers":[{"name":"main","image":"x","stdin":true,
          "ports":[{"containerPort":8080}]}],"dnsPolicy":"ClusterFirst"}})");
  ASSERT_EQ(good.status, 201) << good.body;
  const Object stored = Object::parse(good.body);
  EXPECT_EQ(stored["spec"]["dnsPolicy"], "ClusterFirst");
  EXPECT_EQ(stored["spec"]["containers"][0]["stdin"], true);
}

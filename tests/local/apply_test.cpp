// local/apply: server-side apply and field ownership. Expected objects and FieldsV1 are
// written out by hand from structured-merge-diff's rules (typed/tofieldset.go, merge/update.go)
// and the API server's formats (managedfields/internal/conflict.go, managedfields.go), not
// captured from this code.
#include "local/apply.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "operator/kube/objects.h"

namespace kt::local {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::system_clock;

const kube::Resource kDeployments{"apps", "v1", "deployments", "Deployment", true};
const kube::Resource kPools{"example.com", "v1", "pools", "Pool", true};

Json j(const char* text) {
  return Json::parse(text);
}

Clock::time_point at(const std::string& rfc3339) {
  return *kube::parse_rfc3339(rfc3339);
}

WriteTarget target(const kube::Resource& resource, const std::string& name) {
  WriteTarget t;
  t.resource = resource;
  t.ns = "default";
  t.name = name;
  return t;
}

// Applies and expects no conflict.
Json applied_by(const std::string& manager, const Json& live, const Json& config,
                const WriteTarget& t, const std::string& time, bool force = false) {
  const ApplyResult r = apply(live, config, t, manager, force, at(time));
  EXPECT_TRUE(r.conflicts.empty()) << conflict_message(r.conflicts);
  return r.object;
}

Json configmap(const Json& labels, const Json& data) {
  Json cm = {{"apiVersion", "v1"},
             {"kind", "ConfigMap"},
             {"metadata", {{"name", "cm"}, {"namespace", "default"}}}};
  if (!labels.is_null()) cm["metadata"]["labels"] = labels;
  if (!data.is_null()) cm["data"] = data;
  return cm;
}

// A Deployment as Helm renders it: one container "app".
Json deployment(int replicas, const std::string& image) {
  Json d = j(R"({"apiVersion": "apps/v1", "kind": "Deployment",
    "metadata": {"name": "web", "namespace": "default"},
    "spec": {"selector": {"matchLabels": {"app": "web"}},
             "template": {"metadata": {"labels": {"app": "web"}},
                          "spec": {"containers": [{"name": "app"}]}}}})");
  d["spec"]["replicas"] = replicas;
  d["spec"]["template"]["spec"]["containers"][0]["image"] = image;
  return d;
}

// FieldsV1 of deployment(): replicas, the atomic selector, the template's label, the container.
const Json kDeploymentFields = j(R"({"f:spec": {"f:replicas": {}, "f:selector": {},
  "f:template": {"f:metadata": {"f:labels": {"f:app": {}}},
                 "f:spec": {"f:containers": {"k:{\"name\":\"app\"}":
                                             {".": {}, "f:image": {}, "f:name": {}}}}}}})");

Json entry(const std::string& manager, const std::string& operation, const std::string& api_version,
           const std::string& time, const Json& fields) {
  Json e = {{"manager", manager},
            {"operation", operation},
            {"apiVersion", api_version},
            {"fieldsType", "FieldsV1"},
            {"fieldsV1", fields}};
  if (!time.empty()) e["time"] = time;
  return e;
}

Json with_managed_fields(Json object, const Json& entries) {
  object["metadata"]["managedFields"] = entries;
  return object;
}

// ---- Create, re-apply, prune -----------------------------------------------------------------

TEST(Apply, CreatesTheObject_WhenLiveIsNull_WithOneApplyEntry) {
  const Json config = configmap({{"app", "web"}}, {{"a", "1"}, {"b", "2"}});
  const ApplyResult r = apply(nullptr, config, target(kube::kConfigMaps, "cm"), "kubectl", false,
                              at("2026-01-02T03:04:05Z"));
  ASSERT_TRUE(r.conflicts.empty());
  EXPECT_TRUE(r.created);
  EXPECT_TRUE(r.changed);
  const Json expected = j(R"({"apiVersion": "v1", "kind": "ConfigMap",
    "metadata": {"name": "cm", "namespace": "default", "labels": {"app": "web"},
      "managedFields": [{"manager": "kubectl", "operation": "Apply", "apiVersion": "v1",
                         "time": "2026-01-02T03:04:05Z", "fieldsType": "FieldsV1",
                         "fieldsV1": {"f:data": {"f:a": {}, "f:b": {}},
                                      "f:metadata": {"f:labels": {"f:app": {}}}}}]},
    "data": {"a": "1", "b": "2"}})");
  EXPECT_EQ(r.object, expected);
}

TEST(Apply, FillsTheNamespaceFromTheRequest_WhenTheConfigHasNone) {
  Json config = configmap(nullptr, {{"a", "1"}});
  config["metadata"].erase("namespace");
  const Json object = applied_by("kubectl", nullptr, config, target(kube::kConfigMaps, "cm"),
                                 "2026-01-02T03:04:05Z");
  EXPECT_EQ(object["metadata"]["namespace"], "default");
}

TEST(Apply, ReapplyWithoutALabel_RemovesIt_ButKeepsALabelItNeverOwned) {
  const WriteTarget t = target(kube::kConfigMaps, "cm");
  Json live =
      applied_by("kubectl", nullptr, configmap({{"app", "web"}, {"tier", "db"}}, {{"a", "1"}}), t,
                 "2026-01-02T03:04:05Z");
  live["metadata"]["labels"]["extra"] = "yes";  // written by something nobody tracked

  const ApplyResult r = apply(live, configmap({{"app", "web"}}, {{"a", "1"}}), t, "kubectl", false,
                              at("2026-01-02T03:05:00Z"));
  ASSERT_TRUE(r.conflicts.empty());
  EXPECT_TRUE(r.changed);
  EXPECT_FALSE(r.created);
  const Json expected = j(R"({"apiVersion": "v1", "kind": "ConfigMap",
    "metadata": {"name": "cm", "namespace": "default", "labels": {"app": "web", "extra": "yes"},
      "managedFields": [{"manager": "kubectl", "operation": "Apply", "apiVersion": "v1",
                         "time": "2026-01-02T03:05:00Z", "fieldsType": "FieldsV1",
                         "fieldsV1": {"f:data": {"f:a": {}},
                                      "f:metadata": {"f:labels": {"f:app": {}}}}}]},
    "data": {"a": "1"}})");
  EXPECT_EQ(r.object, expected);
}

TEST(Apply, TwoManagersCoOwnAnIdenticalValue_AndItStaysWhileOneStillOwnsIt) {
  const WriteTarget t = target(kube::kConfigMaps, "cm");
  Json live = applied_by("a", nullptr, configmap(nullptr, {{"x", "1"}, {"y", "2"}}), t,
                         "2026-01-02T03:00:00Z");

  // b applies the same x: nothing changes, b's entry co-owns it (no time: the object did not
  // change, and entries without time sort first).
  ApplyResult r =
      apply(live, configmap(nullptr, {{"x", "1"}}), t, "b", false, at("2026-01-02T03:01:00Z"));
  ASSERT_TRUE(r.conflicts.empty());
  EXPECT_FALSE(r.changed);
  EXPECT_EQ(r.object["metadata"]["managedFields"],
            Json::array({entry("b", "Apply", "v1", "", j(R"({"f:data": {"f:x": {}}})")),
                         entry("a", "Apply", "v1", "2026-01-02T03:00:00Z",
                               j(R"({"f:data": {"f:x": {}, "f:y": {}}})"))}));
  live = r.object;

  // a stops applying x: b still owns it, so it stays.
  r = apply(live, configmap(nullptr, {{"y", "2"}}), t, "a", false, at("2026-01-02T03:02:00Z"));
  ASSERT_TRUE(r.conflicts.empty());
  EXPECT_FALSE(r.changed);
  EXPECT_EQ(r.object["data"], j(R"({"x": "1", "y": "2"})"));
  EXPECT_EQ(r.object["metadata"]["managedFields"],
            Json::array({entry("b", "Apply", "v1", "", j(R"({"f:data": {"f:x": {}}})")),
                         entry("a", "Apply", "v1", "2026-01-02T03:00:00Z",
                               j(R"({"f:data": {"f:y": {}}})"))}));
  live = r.object;

  // b stops too: x goes, and b's now empty entry with it.
  r = apply(live, configmap(nullptr, nullptr), t, "b", false, at("2026-01-02T03:03:00Z"));
  ASSERT_TRUE(r.conflicts.empty());
  EXPECT_TRUE(r.changed);
  const Json expected = j(R"({"apiVersion": "v1", "kind": "ConfigMap",
    "metadata": {"name": "cm", "namespace": "default",
      "managedFields": [{"manager": "a", "operation": "Apply", "apiVersion": "v1",
                         "time": "2026-01-02T03:00:00Z", "fieldsType": "FieldsV1",
                         "fieldsV1": {"f:data": {"f:y": {}}}}]},
    "data": {"y": "2"}})");
  EXPECT_EQ(r.object, expected);
}

// ---- Conflicts -------------------------------------------------------------------------------

TEST(Apply, ConflictsWithAnUpdatersDifferentValue_WithTheApiServersMessage) {
  const WriteTarget t = target(kDeployments, "web");
  const Json live = record_update(nullptr, deployment(2, "nginx:1"), t, "kubectl-client-side-apply",
                                  at("2026-01-02T03:00:00Z"));

  ApplyResult r =
      apply(live, deployment(3, "nginx:1"), t, "helm", false, at("2026-01-02T03:01:00Z"));
  ASSERT_EQ(r.conflicts.size(), 1u);
  EXPECT_TRUE(r.object.is_null());
  EXPECT_EQ(r.conflicts[0].manager, "kubectl-client-side-apply");
  EXPECT_EQ(r.conflicts[0].field, ".spec.replicas");
  EXPECT_EQ(conflict_message(r.conflicts),
            "Apply failed with 1 conflict: conflict with \"kubectl-client-side-apply\" using "
            "apps/v1: .spec.replicas");
  const kube::ApiError error = conflict_error(r.conflicts);
  EXPECT_EQ(error.code(), 409);
  EXPECT_EQ(error.reason(), "Conflict");
  EXPECT_EQ(conflict_status(r.conflicts)["details"]["causes"],
            j(R"([{"reason": "FieldManagerConflict", "field": ".spec.replicas",
                   "message": "conflict with \"kubectl-client-side-apply\" using apps/v1"}])"));

  r = apply(live, deployment(3, "nginx:2"), t, "helm", false, at("2026-01-02T03:01:00Z"));
  EXPECT_EQ(conflict_message(r.conflicts),
            "Apply failed with 2 conflicts: conflicts with \"kubectl-client-side-apply\" using "
            "apps/v1:\n- .spec.replicas\n- .spec.template.spec.containers[name=\"app\"].image");
}

TEST(Apply, Force_TakesTheConflictingFieldOver_AndCoOwnsTheEqualOnes) {
  const WriteTarget t = target(kDeployments, "web");
  const Json live = record_update(nullptr, deployment(2, "nginx:1"), t, "kubectl-client-side-apply",
                                  at("2026-01-02T03:00:00Z"));
  const Json object =
      applied_by("helm", live, deployment(3, "nginx:1"), t, "2026-01-02T03:01:00Z", /*force=*/true);
  // The creator's Update entry: everything the create added (objects and items that appeared
  // get "."), now without replicas.
  const Json updater_fields = j(R"({"f:spec": {"f:selector": {},
    "f:template": {".": {},
      "f:metadata": {".": {}, "f:labels": {".": {}, "f:app": {}}},
      "f:spec": {".": {}, "f:containers": {".": {},
        "k:{\"name\":\"app\"}": {".": {}, "f:image": {}, "f:name": {}}}}}}})");
  Json expected = deployment(3, "nginx:1");
  expected["metadata"]["managedFields"] =
      Json::array({entry("helm", "Apply", "apps/v1", "2026-01-02T03:01:00Z", kDeploymentFields),
                   entry("kubectl-client-side-apply", "Update", "apps/v1", "2026-01-02T03:00:00Z",
                         updater_fields)});
  EXPECT_EQ(object, expected);
}

TEST(Apply, ConflictMessage_GroupsByManagerInTheApiServersOrder) {
  const WriteTarget t = target(kDeployments, "web");
  Json live = applied_by("helm", nullptr, deployment(2, "nginx:1"), t, "2026-01-02T03:00:00Z");
  Json edited = live;
  edited["spec"]["template"]["spec"]["containers"][0]["image"] = "nginx:debug";
  live = record_update(live, edited, t, "kubectl-edit", at("2026-01-02T03:01:00Z"));

  const ApplyResult r =
      apply(live, deployment(4, "nginx:2"), t, "argocd", false, at("2026-01-02T03:02:00Z"));
  EXPECT_EQ(conflict_message(r.conflicts),
            "Apply failed with 2 conflicts: conflicts with \"helm\":\n- .spec.replicas\n"
            "conflicts with \"kubectl-edit\" using apps/v1:\n"
            "- .spec.template.spec.containers[name=\"app\"].image");
}

TEST(Apply, ConflictsWithBeforeFirstApply_OnAnObjectThatHasNoManagedFields) {
  const WriteTarget t = target(kDeployments, "web");
  Json live = deployment(1, "nginx:1");
  live["metadata"]["uid"] = "u-1";
  live["metadata"]["resourceVersion"] = "7";

  ApplyResult r =
      apply(live, deployment(3, "nginx:1"), t, "helm", false, at("2026-01-02T03:00:00Z"));
  EXPECT_EQ(conflict_message(r.conflicts),
            "Apply failed with 1 conflict: conflict with \"before-first-apply\" using apps/v1: "
            ".spec.replicas");

  // Applying what is there co-owns it; only the server-owned metadata stays unowned.
  r = apply(live, deployment(1, "nginx:1"), t, "helm", false, at("2026-01-02T03:00:00Z"));
  ASSERT_TRUE(r.conflicts.empty());
  EXPECT_FALSE(r.changed);
  const Json before_first_apply = j(R"({"f:spec": {"f:replicas": {}, "f:selector": {},
    "f:template": {".": {},
      "f:metadata": {".": {}, "f:labels": {".": {}, "f:app": {}}},
      "f:spec": {".": {}, "f:containers": {".": {},
        "k:{\"name\":\"app\"}": {".": {}, "f:image": {}, "f:name": {}}}}}}})");
  EXPECT_EQ(r.object["metadata"]["managedFields"],
            Json::array({entry("helm", "Apply", "apps/v1", "", kDeploymentFields),
                         entry("before-first-apply", "Update", "apps/v1", "2026-01-02T03:00:00Z",
                               before_first_apply)}));
}

// ---- Lists -----------------------------------------------------------------------------------

TEST(Apply, ContainersMergeByName_AndTheControllersStatusIsUntouched) {
  WriteTarget t = target(kDeployments, "web");
  t.reset_fields = {"status"};
  WriteTarget status = t;
  status.subresource = "status";
  status.reset_fields = {"spec"};

  Json live = applied_by("helm", nullptr, deployment(1, "nginx:1"), t, "2026-01-02T03:00:00Z");
  Json with_status = live;
  with_status["status"] =
      j(R"({"replicas": 1, "conditions": [{"type": "Available", "status": "True"}]})");
  live = record_update(live, with_status, status, "kube-controller-manager",
                       at("2026-01-02T03:01:00Z"));
  Json injected = live;
  injected["spec"]["template"]["spec"]["containers"].push_back(
      {{"name", "sidecar"}, {"image", "proxy:1"}});
  live = record_update(live, injected, t, "injector", at("2026-01-02T03:02:00Z"));

  // Helm upgrades its image; it never had the sidecar or the status. A status in its config is
  // not its to set on the main resource.
  Json config = deployment(1, "nginx:2");
  config["status"] = {{"replicas", 9}};
  const ApplyResult r = apply(live, config, t, "helm", false, at("2026-01-02T03:03:00Z"));
  ASSERT_TRUE(r.conflicts.empty()) << conflict_message(r.conflicts);
  EXPECT_TRUE(r.changed);

  Json expected = deployment(1, "nginx:2");
  expected["spec"]["template"]["spec"]["containers"].push_back(
      {{"name", "sidecar"}, {"image", "proxy:1"}});
  expected["status"] =
      j(R"({"replicas": 1, "conditions": [{"type": "Available", "status": "True"}]})");
  Json controller = entry("kube-controller-manager", "Update", "apps/v1", "2026-01-02T03:01:00Z",
                          j(R"({"f:status": {".": {}, "f:replicas": {},
                                 "f:conditions": {".": {}, "k:{\"type\":\"Available\"}":
                                                  {".": {}, "f:status": {}, "f:type": {}}}}})"));
  controller["subresource"] = "status";
  expected["metadata"]["managedFields"] = Json::array(
      {entry("helm", "Apply", "apps/v1", "2026-01-02T03:03:00Z", kDeploymentFields), controller,
       entry("injector", "Update", "apps/v1", "2026-01-02T03:02:00Z",
             j(R"({"f:spec": {"f:template": {"f:spec": {"f:containers":
                   {"k:{\"name\":\"sidecar\"}": {".": {}, "f:image": {}, "f:name": {}}}}}}})"))});
  EXPECT_EQ(r.object, expected);
}

TEST(Apply, ContainerDroppedFromTheConfig_IsRemoved_WhenNobodyElseOwnsIt) {
  const WriteTarget t = target(kDeployments, "web");
  Json two = deployment(1, "nginx:1");
  two["spec"]["template"]["spec"]["containers"].push_back({{"name", "old"}, {"image", "busybox"}});
  const Json live = applied_by("helm", nullptr, two, t, "2026-01-02T03:00:00Z");
  const Json object = applied_by("helm", live, deployment(1, "nginx:1"), t, "2026-01-02T03:01:00Z");
  EXPECT_EQ(object["spec"]["template"]["spec"]["containers"],
            j(R"([{"name": "app", "image": "nginx:1"}])"));
}

TEST(Apply, ListMapOrder_KeepsLiveOnlyItemsInPlace_AndSharedItemsInTheConfigsOrder) {
  const WriteTarget t = target(kDeployments, "web");
  auto with_containers = [](const Json& containers) {
    Json d = deployment(1, "x");
    d["spec"]["template"]["spec"]["containers"] = containers;
    return d;
  };
  // a, b and c are live and nobody owns them; the config reorders c before a and adds d.
  const Json live = with_containers(j(R"([{"name": "a"}, {"name": "b"}, {"name": "c"}])"));
  Json owned = live;
  owned["metadata"]["managedFields"] =
      Json::array({entry("other", "Update", "apps/v1", "2026-01-02T03:00:00Z",
                         j(R"({"f:spec": {"f:replicas": {}}})"))});
  const Json object = applied_by(
      "helm", owned, with_containers(j(R"([{"name": "c"}, {"name": "a"}, {"name": "d"}])")), t,
      "2026-01-02T03:01:00Z");
  EXPECT_EQ(object["spec"]["template"]["spec"]["containers"],
            j(R"([{"name": "b"}, {"name": "c"}, {"name": "a"}, {"name": "d"}])"));
}

TEST(Apply, AtomicList_IsReplacedWhole_AndConflictsAsOneField) {
  const WriteTarget t = target(kDeployments, "web");
  Json live = applied_by("helm", nullptr, deployment(1, "nginx:1"), t, "2026-01-02T03:00:00Z");
  Json edited = live;
  edited["spec"]["template"]["spec"]["containers"][0]["args"] = {"--a", "--b"};
  live = record_update(live, edited, t, "kubectl-edit", at("2026-01-02T03:01:00Z"));

  Json config = deployment(1, "nginx:1");
  config["spec"]["template"]["spec"]["containers"][0]["args"] = {"--c"};
  const ApplyResult r = apply(live, config, t, "helm", false, at("2026-01-02T03:02:00Z"));
  EXPECT_EQ(conflict_message(r.conflicts),
            "Apply failed with 1 conflict: conflict with \"kubectl-edit\" using apps/v1: "
            ".spec.template.spec.containers[name=\"app\"].args");

  const Json object = applied_by("helm", live, config, t, "2026-01-02T03:02:00Z", /*force=*/true);
  EXPECT_EQ(object["spec"]["template"]["spec"]["containers"][0]["args"], j(R"(["--c"])"));
  EXPECT_EQ(object["metadata"]["managedFields"][0]["fieldsV1"]["f:spec"]["f:template"]["f:spec"]
                  ["f:containers"]["k:{\"name\":\"app\"}"],
            j(R"({".": {}, "f:args": {}, "f:image": {}, "f:name": {}})"));
  // kubectl-edit owned only args: its entry is gone.
  EXPECT_EQ(object["metadata"]["managedFields"].size(), 1u);
}

// ---- Encoding --------------------------------------------------------------------------------

TEST(Apply, ManagedFieldsOfADeployment_MatchTheFieldsV1TheApiServerWrites) {
  const Json config = j(R"({"apiVersion": "apps/v1", "kind": "Deployment",
    "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"},
                 "finalizers": ["example.com/cleanup"]},
    "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
      "template": {"metadata": {"labels": {"app": "web"}},
        "spec": {"containers": [{"name": "app", "image": "nginx:1", "resources": {},
                                 "ports": [{"containerPort": 80}],
                                 "env": [{"name": "MODE", "value": "prod"}]}],
                 "volumes": [{"name": "data", "emptyDir": {}}]}}}})");
  const ApplyResult r = apply(nullptr, config, target(kDeployments, "web"), "helm", false,
                              at("2026-01-02T03:04:05Z"));
  ASSERT_TRUE(r.conflicts.empty());
  const Json expected = j(R"([{"manager": "helm", "operation": "Apply", "apiVersion": "apps/v1",
    "time": "2026-01-02T03:04:05Z", "fieldsType": "FieldsV1", "fieldsV1": {
      "f:metadata": {"f:finalizers": {"v:\"example.com/cleanup\"": {}},
                     "f:labels": {"f:app": {}}},
      "f:spec": {"f:replicas": {}, "f:selector": {},
        "f:template": {"f:metadata": {"f:labels": {"f:app": {}}},
          "f:spec": {
            "f:containers": {"k:{\"name\":\"app\"}": {".": {},
              "f:env": {"k:{\"name\":\"MODE\"}": {".": {}, "f:name": {}, "f:value": {}}},
              "f:image": {}, "f:name": {},
              "f:ports": {"k:{\"containerPort\":80,\"protocol\":\"TCP\"}":
                          {".": {}, "f:containerPort": {}}},
              "f:resources": {}}},
            "f:volumes": {"k:{\"name\":\"data\"}": {".": {}, "f:emptyDir": {}, "f:name": {}}}}}}}}])");
  EXPECT_EQ(r.object["metadata"]["managedFields"], expected);
}

// ---- Update operations -----------------------------------------------------------------------

TEST(RecordUpdate, AnUpdateAfterAnApply_TakesTheField_AndALaterApplyOfAnotherValueConflicts) {
  const WriteTarget t = target(kDeployments, "web");
  Json live = applied_by("helm", nullptr, deployment(2, "nginx:1"), t, "2026-01-02T03:00:00Z");
  Json scaled = live;
  scaled["spec"]["replicas"] = 5;
  live = record_update(live, scaled, t, "kubectl-edit", at("2026-01-02T03:01:00Z"));

  Json helm_fields = kDeploymentFields;
  helm_fields["f:spec"].erase("f:replicas");
  EXPECT_EQ(live["metadata"]["managedFields"],
            Json::array({entry("helm", "Apply", "apps/v1", "2026-01-02T03:00:00Z", helm_fields),
                         entry("kubectl-edit", "Update", "apps/v1", "2026-01-02T03:01:00Z",
                               j(R"({"f:spec": {"f:replicas": {}}})"))}));

  const ApplyResult r =
      apply(live, deployment(2, "nginx:1"), t, "helm", false, at("2026-01-02T03:02:00Z"));
  EXPECT_EQ(conflict_message(r.conflicts),
            "Apply failed with 1 conflict: conflict with \"kubectl-edit\" using apps/v1: "
            ".spec.replicas");
  // The value it has now is no conflict: helm co-owns it.
  const Json same = applied_by("helm", live, deployment(5, "nginx:1"), t, "2026-01-02T03:02:00Z");
  EXPECT_EQ(same["metadata"]["managedFields"][0]["fieldsV1"], kDeploymentFields);
  EXPECT_EQ(same["metadata"]["managedFields"][1]["manager"], "kubectl-edit");
}

TEST(RecordUpdate, LeavesAnUntrackedObjectUntracked_AndAnEmptyListResetsManagedFields) {
  const WriteTarget t = target(kube::kConfigMaps, "cm");
  const Json untracked = configmap(nullptr, {{"a", "1"}});
  const Json changed = configmap(nullptr, {{"a", "2"}});
  EXPECT_EQ(record_update(untracked, changed, t, "kubectl-edit", at("2026-01-02T03:00:00Z")),
            changed);

  const Json tracked = applied_by("kubectl", nullptr, untracked, t, "2026-01-02T03:00:00Z");
  const Json reset = with_managed_fields(changed, Json::array());
  EXPECT_EQ(record_update(tracked, reset, t, "kubectl-edit", at("2026-01-02T03:01:00Z")), changed);
}

TEST(RecordUpdate, RemovedFieldsLeaveEveryManager) {
  const WriteTarget t = target(kube::kConfigMaps, "cm");
  const Json live = applied_by("kubectl", nullptr, configmap(nullptr, {{"a", "1"}, {"b", "2"}}), t,
                               "2026-01-02T03:00:00Z");
  Json without_b = live;
  without_b["data"].erase("b");
  const Json object = record_update(live, without_b, t, "kubectl-edit", at("2026-01-02T03:01:00Z"));
  // kubectl-edit added and changed nothing, so it gets no entry.
  EXPECT_EQ(object["metadata"]["managedFields"],
            Json::array({entry("kubectl", "Apply", "v1", "2026-01-02T03:00:00Z",
                               j(R"({"f:data": {"f:a": {}}})"))}));
}

// ---- CRD schemas -----------------------------------------------------------------------------

const Json kPoolSchema = j(R"({"type": "object", "properties": {
  "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
  "spec": {"type": "object", "properties": {
    "workers": {"type": "array", "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name", "zone"],
                "items": {"type": "object", "properties": {
                  "name": {"type": "string"}, "zone": {"type": "string", "default": "a"},
                  "replicas": {"type": "integer"}}}},
    "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
    "options": {"type": "object", "x-kubernetes-map-type": "atomic",
                "additionalProperties": {"type": "string"}}}}}})");

Json pool(const Json& spec) {
  return {{"apiVersion", "example.com/v1"},
          {"kind", "Pool"},
          {"metadata", {{"name", "p"}, {"namespace", "default"}}},
          {"spec", spec}};
}

TEST(Apply, WithACrdSchema_MergesByItsListMapKeys_AndHonoursSetsAndAtomicMaps) {
  WriteTarget t = target(kPools, "p");
  t.schema = &kPoolSchema;
  const Json first = applied_by(
      "alice", nullptr,
      pool(j(
          R"({"workers": [{"name": "w1", "replicas": 1}], "tags": ["x"], "options": {"a": "1"}})")),
      t, "2026-01-02T03:00:00Z");
  EXPECT_EQ(first["metadata"]["managedFields"][0]["fieldsV1"],
            j(R"({"f:spec": {"f:options": {}, "f:tags": {"v:\"x\"": {}},
                   "f:workers": {"k:{\"name\":\"w1\",\"zone\":\"a\"}":
                                 {".": {}, "f:name": {}, "f:replicas": {}}}}})"));

  const Json second = applied_by(
      "bob", first,
      pool(j(R"({"workers": [{"name": "w2", "zone": "b", "replicas": 2}], "tags": ["y"]})")), t,
      "2026-01-02T03:01:00Z");
  EXPECT_EQ(
      second["spec"],
      j(R"({"workers": [{"name": "w1", "replicas": 1}, {"name": "w2", "zone": "b", "replicas": 2}],
                  "tags": ["x", "y"], "options": {"a": "1"}})"));
  EXPECT_EQ(second["metadata"]["managedFields"][1],
            entry("bob", "Apply", "example.com/v1", "2026-01-02T03:01:00Z",
                  j(R"({"f:spec": {"f:tags": {"v:\"y\"": {}},
                         "f:workers": {"k:{\"name\":\"w2\",\"zone\":\"b\"}":
                                       {".": {}, "f:name": {}, "f:replicas": {}, "f:zone": {}}}}})")));

  const ApplyResult r = apply(second, pool(j(R"({"options": {"b": "2"}})")), t, "bob", false,
                              at("2026-01-02T03:02:00Z"));
  EXPECT_EQ(conflict_message(r.conflicts),
            "Apply failed with 1 conflict: conflict with \"alice\": .spec.options");
}

TEST(Apply, WithoutASchema_ACustomResourcesListsAreAtomic) {
  const WriteTarget t = target(kPools, "p");
  const Json first =
      applied_by("alice", nullptr, pool(j(R"({"workers": [{"name": "w1"}], "tags": ["x"]})")), t,
                 "2026-01-02T03:00:00Z");
  const ApplyResult r = apply(first, pool(j(R"({"workers": [{"name": "w2"}], "tags": ["y"]})")), t,
                              "bob", false, at("2026-01-02T03:01:00Z"));
  EXPECT_EQ(
      conflict_message(r.conflicts),
      "Apply failed with 2 conflicts: conflicts with \"alice\":\n- .spec.tags\n- .spec.workers");
}

// ---- What the API server refuses -------------------------------------------------------------

void expect_api_error(const std::function<void()>& f, int code, const std::string& message) {
  try {
    f();
    ADD_FAILURE() << "no error; expected " << message;
  } catch (const kube::ApiError& e) {
    EXPECT_EQ(e.code(), code);
    EXPECT_EQ(std::string(e.what()), message);
  }
}

TEST(Apply, RefusesWhatTheApiServerRefuses_WithItsMessages) {
  const WriteTarget t = target(kDeployments, "web");
  const auto now = at("2026-01-02T03:00:00Z");
  expect_api_error([&] { apply(nullptr, deployment(1, "a"), t, "", false, now); }, 422,
                   "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is "
                   "required for apply patch");
  Json wrong_kind = deployment(1, "a");
  wrong_kind["kind"] = "ReplicaSet";
  expect_api_error([&] { apply(nullptr, wrong_kind, t, "helm", false, now); }, 400,
                   "invalid object type: apps/v1, Kind=ReplicaSet");
  Json core = deployment(1, "a");
  core["apiVersion"] = "v1";
  expect_api_error([&] { apply(nullptr, core, t, "helm", false, now); }, 400,
                   "invalid object type: /v1, Kind=Deployment");
  const Json with_fields = with_managed_fields(deployment(1, "a"), Json::array());
  expect_api_error([&] { apply(nullptr, with_fields, t, "helm", false, now); }, 400,
                   "metadata.managedFields must be nil");
  Json renamed = deployment(1, "a");
  renamed["metadata"]["name"] = "other";
  expect_api_error([&] { apply(nullptr, renamed, t, "helm", false, now); }, 400,
                   "the name of the object (other) does not match the name on the URL (web)");
  Json moved = deployment(1, "a");
  moved["metadata"]["namespace"] = "prod";
  expect_api_error([&] { apply(nullptr, moved, t, "helm", false, now); }, 400,
                   "the namespace of the object (prod) does not match the namespace on the "
                   "request (default)");
}

TEST(Apply, RefusesDuplicateAndKeylessListMapItems_AsStructuredMergeDiffReportsThem) {
  const WriteTarget t = target(kDeployments, "web");
  const auto now = at("2026-01-02T03:00:00Z");
  Json twice = deployment(1, "a");
  twice["spec"]["template"]["spec"]["containers"].push_back({{"name", "app"}, {"image", "b"}});
  expect_api_error([&] { apply(nullptr, twice, t, "helm", false, now); }, 500,
                   "failed to create typed patch object (default/web; apps/v1, Kind=Deployment): "
                   ".spec.template.spec.containers: duplicate entries for key [name=\"app\"]");
  Json keyless = deployment(1, "a");
  keyless["spec"]["template"]["spec"]["containers"][0]["env"] =
      j(R"([{"value": "1"}, {"name": "A"}, {"name": "A"}])");
  expect_api_error([&] { apply(nullptr, keyless, t, "helm", false, now); }, 500,
                   "failed to create typed patch object (default/web; apps/v1, Kind=Deployment): "
                   "errors:\n"
                   "  .spec.template.spec.containers[name=\"app\"].env: element 0: associative "
                   "list with keys has an element that omits all key fields [\"name\"] (and "
                   "doesn't have default values for any key fields)\n"
                   "  .spec.template.spec.containers[name=\"app\"].env: duplicate entries for key "
                   "[name=\"A\"]");
}

TEST(ApplyBody, ParsesYamlAndJson_AndRefusesANonObject) {
  EXPECT_EQ(parse_apply_body("apiVersion: v1\nkind: ConfigMap\ndata:\n  a: \"1\"\n"),
            j(R"({"apiVersion": "v1", "kind": "ConfigMap", "data": {"a": "1"}})"));
  EXPECT_EQ(parse_apply_body(R"({"kind": "ConfigMap"})"), j(R"({"kind": "ConfigMap"})"));
  expect_api_error([] { parse_apply_body("- a\n- b\n"); }, 400,
                   "error decoding YAML: json: cannot unmarshal array into Go value of type "
                   "map[string]interface {}");
}

TEST(FieldManager, FromTheUserAgent_IsItsFirstSegment) {
  EXPECT_EQ(
      manager_from_user_agent("kubectl-client-side-apply/v1.31.0 (linux/amd64) kubernetes/abc"),
      "kubectl-client-side-apply");
  EXPECT_EQ(manager_from_user_agent("Helm/4.0.0"), "Helm");
  EXPECT_EQ(manager_from_user_agent(std::string(200, 'm')), std::string(128, 'm'));
}

}  // namespace
}  // namespace kt::local

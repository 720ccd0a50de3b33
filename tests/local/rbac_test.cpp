// local/rbac: Kubernetes RBAC authorization against RBAC objects in a local::Store.
// Expected decisions follow the upstream rules (pkg/apis/rbac/v1/evaluation_helpers.go,
// pkg/registry/rbac/validation/rule.go); expected messages are written out from the Go formats
// (apiserver responsewriters.forbiddenMessage, apimachinery errors.NewForbidden, rule.go's binding
// descriptions), not captured from this code.
#include "local/rbac.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "local/builtin_resources.h"
#include "local/store.h"

namespace kt::local {
namespace {

using Json = nlohmann::json;
using Strings = std::vector<std::string>;

const std::string kOperatorNs = "kubetrain-system";
const std::string kOperatorUser = "system:serviceaccount:kubetrain-system:kubetrain-operator";

Json rule(const Strings& verbs, const Strings& api_groups, const Strings& resources,
          const Strings& resource_names = {}) {
  Json r = {{"verbs", verbs}, {"apiGroups", api_groups}, {"resources", resources}};
  if (!resource_names.empty()) r["resourceNames"] = resource_names;
  return r;
}

Json url_rule(const Strings& verbs, const Strings& urls) {
  return {{"verbs", verbs}, {"nonResourceURLs", urls}};
}

Json service_account(const std::string& ns, const std::string& name) {
  Json s = {{"kind", "ServiceAccount"}, {"name", name}};
  if (!ns.empty()) s["namespace"] = ns;
  return s;
}

Json group(const std::string& name) {
  return {{"apiGroup", "rbac.authorization.k8s.io"}, {"kind", "Group"}, {"name", name}};
}

Json user(const std::string& name) {
  return {{"apiGroup", "rbac.authorization.k8s.io"}, {"kind", "User"}, {"name", name}};
}

Json role_ref(const std::string& kind, const std::string& name) {
  return {{"apiGroup", "rbac.authorization.k8s.io"}, {"kind", kind}, {"name", name}};
}

RequestAttributes request(const std::string& verb, const std::string& api_group,
                          const std::string& resource, const std::string& ns,
                          const std::string& name = "", const std::string& subresource = "") {
  RequestAttributes r;
  r.verb = verb;
  r.api_group = api_group;
  r.resource = resource;
  r.subresource = subresource;
  r.ns = ns;
  r.name = name;
  return r;
}

RequestAttributes path_request(const std::string& verb, const std::string& path) {
  RequestAttributes r;
  r.verb = verb;
  r.resource_request = false;
  r.path = path;
  return r;
}

// A store holding RBAC objects, and the operator's ServiceAccount as the default user.
class Rbac : public ::testing::Test {
 protected:
  void cluster_role(const std::string& name, const Json& rules) {
    store.create(kClusterRoles, "",
                 {{"apiVersion", "rbac.authorization.k8s.io/v1"},
                  {"kind", "ClusterRole"},
                  {"metadata", {{"name", name}}},
                  {"rules", rules}});
  }
  void role(const std::string& ns, const std::string& name, const Json& rules) {
    store.create(kRoles, ns,
                 {{"apiVersion", "rbac.authorization.k8s.io/v1"},
                  {"kind", "Role"},
                  {"metadata", {{"name", name}, {"namespace", ns}}},
                  {"rules", rules}});
  }
  void cluster_role_binding(const std::string& name, const std::string& role,
                            const Json& subjects) {
    store.create(kClusterRoleBindings, "",
                 {{"apiVersion", "rbac.authorization.k8s.io/v1"},
                  {"kind", "ClusterRoleBinding"},
                  {"metadata", {{"name", name}}},
                  {"roleRef", role_ref("ClusterRole", role)},
                  {"subjects", subjects}});
  }
  void role_binding(const std::string& ns, const std::string& name, const Json& ref,
                    const Json& subjects) {
    store.create(kRoleBindings, ns,
                 {{"apiVersion", "rbac.authorization.k8s.io/v1"},
                  {"kind", "RoleBinding"},
                  {"metadata", {{"name", name}, {"namespace", ns}}},
                  {"roleRef", ref},
                  {"subjects", subjects}});
  }

  bool allowed(const RequestAttributes& r) { return authorize(store, op, r).allowed; }
  bool allowed_for(const UserInfo& u, const RequestAttributes& r) {
    return authorize(store, u, r).allowed;
  }

  Store store;
  const UserInfo op = service_account_user(kOperatorNs, "kubetrain-operator");
  const Json op_subject = Json::array({service_account(kOperatorNs, "kubetrain-operator")});
};

TEST(RbacUser, ServiceAccountUser_HasTheServiceAccountNameAndGroups) {
  const UserInfo u = service_account_user("team-a", "trainer");
  EXPECT_EQ(u.name, "system:serviceaccount:team-a:trainer");
  EXPECT_EQ(u.groups, (Strings{"system:serviceaccounts", "system:serviceaccounts:team-a",
                               "system:authenticated"}));
}

TEST_F(Rbac, NoBindings_DenyEveryResourceRequest) {
  EXPECT_FALSE(allowed(request("get", "", "pods", "team-a", "p")));
  EXPECT_FALSE(allowed(request("list", "", "nodes", "")));
}

// ---- Where bindings apply ------------------------------------------------------------------

TEST_F(Rbac, ClusterRoleBinding_AllowsInEveryNamespaceAndClusterWide) {
  cluster_role("jobs-reader",
               Json::array({rule({"get", "list", "watch"}, {"kubetrain.dev"}, {"trainingjobs"})}));
  cluster_role_binding("operator-jobs", "jobs-reader", op_subject);

  EXPECT_TRUE(allowed(request("list", "kubetrain.dev", "trainingjobs", "team-a")));
  EXPECT_TRUE(allowed(request("get", "kubetrain.dev", "trainingjobs", "team-b", "j")));
  EXPECT_TRUE(allowed(request("watch", "kubetrain.dev", "trainingjobs", "")));
  EXPECT_FALSE(allowed(request("delete", "kubetrain.dev", "trainingjobs", "team-a", "j")));
  EXPECT_FALSE(allowed(request("list", "", "trainingjobs", "team-a")));  // wrong group

  EXPECT_EQ(authorize(store, op, request("list", "kubetrain.dev", "trainingjobs", "team-a")).reason,
            "RBAC: allowed by ClusterRoleBinding \"operator-jobs\" of ClusterRole \"jobs-reader\" "
            "to ServiceAccount \"kubetrain-operator/kubetrain-system\"");
}

TEST_F(Rbac, RoleBindingToARole_AllowsOnlyInItsNamespace) {
  role("team-a", "pod-writer", Json::array({rule({"create", "delete"}, {""}, {"pods"})}));
  role_binding("team-a", "operator-pods", role_ref("Role", "pod-writer"), op_subject);

  EXPECT_TRUE(allowed(request("create", "", "pods", "team-a")));
  EXPECT_FALSE(allowed(request("create", "", "pods", "team-b")));
  EXPECT_FALSE(allowed(request("create", "", "pods", "")));  // across all namespaces
  EXPECT_EQ(authorize(store, op, request("delete", "", "pods", "team-a", "p")).reason,
            "RBAC: allowed by RoleBinding \"operator-pods/team-a\" of Role \"pod-writer\" to "
            "ServiceAccount \"kubetrain-operator/kubetrain-system\"");
}

TEST_F(Rbac, RoleBindingToAClusterRole_GrantsItsRulesOnlyInTheBindingsNamespace) {
  cluster_role("pods-and-nodes", Json::array({rule({"get"}, {""}, {"pods", "nodes"})}));
  role_binding("team-a", "operator-pods", role_ref("ClusterRole", "pods-and-nodes"), op_subject);

  EXPECT_TRUE(allowed(request("get", "", "pods", "team-a", "p")));
  EXPECT_FALSE(allowed(request("get", "", "pods", "team-b", "p")));
  EXPECT_FALSE(allowed(request("get", "", "nodes", "", "n1")));  // cluster-scoped: no namespace
}

TEST_F(Rbac, RoleBindingToARoleOfAnotherNamespace_FindsNoRole) {
  role("team-b", "pod-reader", Json::array({rule({"get"}, {""}, {"pods"})}));
  role_binding("team-a", "operator-pods", role_ref("Role", "pod-reader"), op_subject);

  const Decision d = authorize(store, op, request("get", "", "pods", "team-a", "p"));
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.reason,
            "pods \"p\" is forbidden: User \"" + kOperatorUser +
                "\" cannot get resource \"pods\" in API group \"\" in the namespace \"team-a\": "
                "RBAC: role.rbac.authorization.k8s.io \"pod-reader\" not found");
}

// ---- Rules ---------------------------------------------------------------------------------

TEST_F(Rbac, Subresource_NeedsItsOwnRule) {
  const RequestAttributes object_update =
      request("update", "kubetrain.dev", "trainingjobs", "team-a", "j");
  const RequestAttributes status_update =
      request("update", "kubetrain.dev", "trainingjobs", "team-a", "j", "status");
  cluster_role("jobs", Json::array({rule({"*"}, {"kubetrain.dev"}, {"trainingjobs"})}));
  cluster_role_binding("operator-jobs", "jobs", op_subject);
  EXPECT_TRUE(allowed(object_update));
  EXPECT_FALSE(allowed(status_update));

  // And the other way round: a status rule grants nothing on the object itself.
  const UserInfo status_writer = service_account_user(kOperatorNs, "status-writer");
  cluster_role(
      "jobs-status",
      Json::array({rule({"update", "patch"}, {"kubetrain.dev"}, {"trainingjobs/status"})}));
  cluster_role_binding("status-writer", "jobs-status",
                       Json::array({service_account(kOperatorNs, "status-writer")}));
  EXPECT_TRUE(allowed_for(status_writer, status_update));
  EXPECT_FALSE(allowed_for(status_writer, object_update));
}

TEST_F(Rbac, StarSlashSubresource_MatchesThatSubresourceOfEveryResource) {
  cluster_role("scaler", Json::array({rule({"update"}, {"apps"}, {"*/scale"})}));
  cluster_role_binding("operator-scale", "scaler", op_subject);

  EXPECT_TRUE(allowed(request("update", "apps", "deployments", "team-a", "d", "scale")));
  EXPECT_TRUE(allowed(request("update", "apps", "statefulsets", "team-a", "s", "scale")));
  EXPECT_FALSE(allowed(request("update", "apps", "deployments", "team-a", "d")));
  EXPECT_FALSE(allowed(request("update", "apps", "deployments", "team-a", "d", "status")));
}

TEST_F(Rbac, StarResource_MatchesResourcesAndTheirSubresources) {
  cluster_role("core-reader", Json::array({rule({"get"}, {""}, {"*"})}));
  cluster_role_binding("operator-core", "core-reader", op_subject);

  EXPECT_TRUE(allowed(request("get", "", "pods", "team-a", "p")));
  EXPECT_TRUE(allowed(request("get", "", "pods", "team-a", "p", "log")));
  EXPECT_FALSE(allowed(request("get", "apps", "deployments", "team-a", "d")));
}

TEST_F(Rbac, ResourceNames_RestrictGetAndUpdate_AndNeverMatchCreateOrCollections) {
  cluster_role("leader-lease",
               Json::array({rule({"get", "update", "create", "list", "deletecollection"},
                                 {"coordination.k8s.io"}, {"leases"}, {"kubetrain-leader"})}));
  cluster_role_binding("operator-lease", "leader-lease", op_subject);
  const std::string g = "coordination.k8s.io";

  EXPECT_TRUE(allowed(request("get", g, "leases", kOperatorNs, "kubetrain-leader")));
  EXPECT_TRUE(allowed(request("update", g, "leases", kOperatorNs, "kubetrain-leader")));
  EXPECT_FALSE(allowed(request("get", g, "leases", kOperatorNs, "other")));
  // A create carries no name when it is authorized, so the named rule cannot match it.
  EXPECT_FALSE(allowed(request("create", g, "leases", kOperatorNs)));
  EXPECT_FALSE(allowed(request("deletecollection", g, "leases", kOperatorNs)));
  EXPECT_FALSE(allowed(request("list", g, "leases", kOperatorNs)));
  // A list with the field selector metadata.name=kubetrain-leader is authorized with that name.
  EXPECT_TRUE(allowed(request("list", g, "leases", kOperatorNs, "kubetrain-leader")));

  // Creating needs a rule without resourceNames.
  cluster_role("lease-creator", Json::array({rule({"create"}, {g}, {"leases"})}));
  cluster_role_binding("operator-lease-create", "lease-creator", op_subject);
  EXPECT_TRUE(allowed(request("create", g, "leases", kOperatorNs)));
}

TEST_F(Rbac, VerbAndApiGroupWildcards_MatchEveryVerbAndGroup) {
  cluster_role("any-pods", Json::array({rule({"*"}, {"*"}, {"pods"})}));
  cluster_role_binding("operator-any-pods", "any-pods", op_subject);

  for (const char* verb :
       {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"})
    EXPECT_TRUE(allowed(request(verb, "", "pods", "team-a"))) << verb;
  EXPECT_TRUE(allowed(request("get", "metrics.k8s.io", "pods", "team-a", "p")));
  EXPECT_FALSE(allowed(request("get", "", "configmaps", "team-a", "c")));
}

TEST_F(Rbac, ARuleMustMatchVerbGroupAndResourceAtOnce) {
  // Two rules that together name every part of the request, but neither alone.
  cluster_role("split", Json::array({rule({"get"}, {""}, {"configmaps"}),
                                     rule({"delete"}, {""}, {"pods"})}));
  cluster_role_binding("operator-split", "split", op_subject);
  EXPECT_FALSE(allowed(request("get", "", "pods", "team-a", "p")));
  EXPECT_FALSE(allowed(request("delete", "", "configmaps", "team-a", "c")));
}

// ---- Subjects ------------------------------------------------------------------------------

TEST_F(Rbac, GroupSubject_OfANamespacesServiceAccounts_AllowsOnlyThatNamespacesAccounts) {
  cluster_role("events", Json::array({rule({"create"}, {""}, {"events"})}));
  cluster_role_binding("sa-events", "events",
                       Json::array({group("system:serviceaccounts:kubetrain-system")}));

  EXPECT_TRUE(allowed(request("create", "", "events", "team-a")));
  EXPECT_TRUE(allowed_for(service_account_user(kOperatorNs, "another"),
                          request("create", "", "events", "team-a")));
  EXPECT_FALSE(allowed_for(service_account_user("team-a", "kubetrain-operator"),
                           request("create", "", "events", "team-a")));
  EXPECT_EQ(authorize(store, op, request("create", "", "events", "team-a")).reason,
            "RBAC: allowed by ClusterRoleBinding \"sa-events\" of ClusterRole \"events\" to Group "
            "\"system:serviceaccounts:kubetrain-system\"");
}

TEST_F(Rbac, ServiceAccountSubject_InAnotherNamespace_IsDenied) {
  cluster_role("pods", Json::array({rule({"get"}, {""}, {"pods"})}));
  cluster_role_binding("wrong-ns", "pods",
                       Json::array({service_account("default", "kubetrain-operator")}));
  EXPECT_FALSE(allowed(request("get", "", "pods", "team-a", "p")));
}

TEST_F(Rbac, ServiceAccountSubjectWithoutNamespace_MeansTheRoleBindingsNamespace) {
  cluster_role("pods", Json::array({rule({"get"}, {""}, {"pods"})}));
  role_binding("team-a", "local-sa", role_ref("ClusterRole", "pods"),
               Json::array({service_account("", "trainer")}));
  EXPECT_TRUE(allowed_for(service_account_user("team-a", "trainer"),
                          request("get", "", "pods", "team-a", "p")));
  EXPECT_FALSE(allowed_for(service_account_user("team-b", "trainer"),
                           request("get", "", "pods", "team-a", "p")));
  EXPECT_EQ(authorize(store, service_account_user("team-a", "trainer"),
                      request("get", "", "pods", "team-a", "p"))
                .reason,
            "RBAC: allowed by RoleBinding \"local-sa/team-a\" of ClusterRole \"pods\" to "
            "ServiceAccount \"trainer/team-a\"");
}

TEST_F(Rbac, ServiceAccountSubjectWithoutNamespace_InAClusterRoleBinding_MatchesNobody) {
  cluster_role("pods", Json::array({rule({"get"}, {""}, {"pods"})}));
  cluster_role_binding("no-ns", "pods", Json::array({service_account("", "kubetrain-operator")}));
  EXPECT_FALSE(allowed(request("get", "", "pods", kOperatorNs, "p")));
}

TEST_F(Rbac, UserSubject_MatchesTheUserByName) {
  cluster_role("nodes", Json::array({rule({"list"}, {""}, {"nodes"})}));
  cluster_role_binding("alice-nodes", "nodes", Json::array({user("alice")}));
  EXPECT_TRUE(allowed_for({"alice", {"system:authenticated"}}, request("list", "", "nodes", "")));
  EXPECT_FALSE(allowed_for({"bob", {"system:authenticated"}}, request("list", "", "nodes", "")));
}

TEST_F(Rbac, SystemMasters_IsAllowedEverythingWithoutBindings) {
  EXPECT_TRUE(allowed_for({"admin", {"system:masters", "system:authenticated"}},
                          request("delete", "", "nodes", "", "n1")));
}

// ---- Missing roles -------------------------------------------------------------------------

TEST_F(Rbac, MissingRoles_AreNamedInTheDenial_AndOtherBindingsStillCount) {
  cluster_role_binding("gone-1", "gone-role", op_subject);
  cluster_role_binding("gone-2", "also-gone", op_subject);
  const RequestAttributes get_pod = request("get", "", "pods", "team-a", "p");
  const Decision d = authorize(store, op, get_pod);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.reason, forbidden_message(op, get_pod) +
                          ": RBAC: [clusterrole.rbac.authorization.k8s.io \"gone-role\" not found, "
                          "clusterrole.rbac.authorization.k8s.io \"also-gone\" not found]");

  cluster_role("pods", Json::array({rule({"get"}, {""}, {"pods"})}));
  cluster_role_binding("present", "pods", op_subject);
  EXPECT_TRUE(allowed(get_pod));
}

// ---- Non-resource URLs ---------------------------------------------------------------------

TEST_F(Rbac, Discovery_IsAllowedForEveryAuthenticatedUserByDefault) {
  for (const char* path : {"/api", "/api/v1", "/apis", "/apis/kubetrain.dev/v1alpha1", "/version",
                           "/openapi/v2", "/openapi/v3", "/healthz", "/livez", "/readyz"})
    EXPECT_TRUE(allowed(path_request("get", path))) << path;
  EXPECT_EQ(authorize(store, op, path_request("get", "/apis")).reason,
            "RBAC: allowed by ClusterRoleBinding \"system:discovery\" of ClusterRole "
            "\"system:discovery\" to Group \"system:authenticated\"");
  EXPECT_FALSE(allowed(path_request("post", "/api")));
  EXPECT_FALSE(allowed(path_request("get", "/apis-extra")));  // "/apis/*" is a prefix with '/'
}

TEST_F(Rbac, Discovery_ForAnUnauthenticatedUser_IsOnlyHealthAndVersion) {
  const UserInfo anonymous{"system:anonymous", {"system:unauthenticated"}};
  EXPECT_TRUE(allowed_for(anonymous, path_request("get", "/healthz")));
  EXPECT_TRUE(allowed_for(anonymous, path_request("get", "/version")));
  EXPECT_FALSE(allowed_for(anonymous, path_request("get", "/apis")));
}

TEST_F(Rbac, Metrics_IsDeniedUnlessAClusterRoleBindingGrantsIt) {
  EXPECT_FALSE(allowed(path_request("get", "/metrics")));

  // A RoleBinding cannot grant a path: non-resource requests have no namespace.
  cluster_role("metrics-reader", Json::array({url_rule({"get"}, {"/metrics", "/debug/*"})}));
  role_binding(kOperatorNs, "metrics", role_ref("ClusterRole", "metrics-reader"), op_subject);
  EXPECT_FALSE(allowed(path_request("get", "/metrics")));

  cluster_role_binding("metrics", "metrics-reader", op_subject);
  EXPECT_TRUE(allowed(path_request("get", "/metrics")));
  EXPECT_TRUE(allowed(path_request("get", "/debug/pprof/heap")));
  EXPECT_FALSE(allowed(path_request("get", "/metrics/slis")));  // exact entry, no prefix
  EXPECT_FALSE(allowed(path_request("put", "/metrics")));
}

// ---- Forbidden messages --------------------------------------------------------------------

TEST_F(Rbac, ForbiddenMessage_NamesTheObjectResourceGroupAndNamespace) {
  const Decision d = authorize(store, op, request("get", "", "pods", "team-a", "p"));
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.reason, "pods \"p\" is forbidden: User \"" + kOperatorUser +
                          "\" cannot get resource \"pods\" in API group \"\" in the namespace "
                          "\"team-a\"");
}

TEST_F(Rbac, ForbiddenMessage_ForASubresource_QuotesResourceSlashSubresource) {
  EXPECT_EQ(forbidden_message(op, request("get", "", "pods", "team-a", "p", "log")),
            "pods \"p\" is forbidden: User \"" + kOperatorUser +
                "\" cannot get resource \"pods/log\" in API group \"\" in the namespace "
                "\"team-a\"");
  EXPECT_EQ(
      forbidden_message(
          op, request("update", "kubetrain.dev", "trainingjobs", "team-a", "j", "status")),
      "trainingjobs.kubetrain.dev \"j\" is forbidden: User \"" + kOperatorUser +
          "\" cannot update resource \"trainingjobs/status\" in API group \"kubetrain.dev\" in "
          "the namespace \"team-a\"");
}

TEST_F(Rbac, ForbiddenMessage_ForACollection_HasNoName) {
  EXPECT_EQ(forbidden_message(op, request("list", "kubetrain.dev", "trainingjobs", "team-a")),
            "trainingjobs.kubetrain.dev is forbidden: User \"" + kOperatorUser +
                "\" cannot list resource \"trainingjobs\" in API group \"kubetrain.dev\" in the "
                "namespace \"team-a\"");
}

TEST_F(Rbac, ForbiddenMessage_ClusterScoped_SaysAtTheClusterScope) {
  EXPECT_EQ(forbidden_message(op, request("get", "", "nodes", "", "n1")),
            "nodes \"n1\" is forbidden: User \"" + kOperatorUser +
                "\" cannot get resource \"nodes\" in API group \"\" at the cluster scope");
  EXPECT_EQ(forbidden_message(op, request("watch", "coordination.k8s.io", "leases", "")),
            "leases.coordination.k8s.io is forbidden: User \"" + kOperatorUser +
                "\" cannot watch resource \"leases\" in API group \"coordination.k8s.io\" at the "
                "cluster scope");
}

TEST_F(Rbac, ForbiddenMessage_ForAPath) {
  const Decision d = authorize(store, op, path_request("get", "/metrics"));
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.reason, "forbidden: User \"" + kOperatorUser + "\" cannot get path \"/metrics\"");
}

TEST_F(Rbac, ForbiddenMessage_QuotesAsGoDoes_AndEscapesHtml) {
  // strconv.Quote escapes the quote and the tab; the sanitizer then replaces & < >.
  EXPECT_EQ(forbidden_message({"u", {}}, path_request("get", "/a\"b\t<c>&")),
            "forbidden: User \"u\" cannot get path \"/a\\\"b\\t&lt;c&gt;&amp;\"");
}

}  // namespace
}  // namespace kt::local

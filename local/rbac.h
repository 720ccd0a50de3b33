// Kubernetes RBAC authorization over the Roles, ClusterRoles, RoleBindings and ClusterRoleBindings
// a kube::Client holds (normally the local Store), so that `kubetrain local serve` can refuse a
// ServiceAccount what a real API server would refuse it — and a test can show that a Helm chart's
// rules are enough for the operator. Semantics follow k8s.io/kubernetes
// plugin/pkg/auth/authorizer/rbac (rbac.go), pkg/registry/rbac/validation/rule.go and
// pkg/apis/rbac/v1/evaluation_helpers.go:
//  * ClusterRoleBindings apply in every namespace and to cluster-scoped and non-resource
//    requests; RoleBindings apply only to requests in their own namespace. A RoleBinding may
//    reference a ClusterRole: its rules then apply in the binding's namespace only. A
//    ClusterRoleBinding can only reference a ClusterRole.
//  * Subjects: User (the user's name), Group (one of the user's groups), ServiceAccount
//    (system:serviceaccount:<ns>:<name>; in a RoleBinding the namespace defaults to the
//    binding's, in a ClusterRoleBinding a ServiceAccount subject without one matches nobody).
//  * A rule matches a resource request when verbs, apiGroups and resources match (`*` matches
//    anything; a resource request for a subresource matches only "resource/subresource" or
//    "*/subresource", never the bare resource) and, when resourceNames is non-empty, the request's
//    name is one of them. A create, a deletecollection and a list/watch without a
//    `metadata.name=` field selector carry no name, so a resourceNames rule never allows them.
//  * A non-resource request (a path) matches nonResourceURLs exactly or, for an entry ending in
//    `*`, by prefix; `*` alone matches every path.
//  * Roles missing from the store are not errors that deny outright: the other bindings still
//    count, and the missing ones are named in the denial ("RBAC: clusterrole... not found").
//
// What a real cluster adds, modelled here:
//  * the bootstrap policy every authenticated user gets (default_cluster_policy()): the
//    ClusterRoles system:discovery (GET /api, /api/*, /apis, /apis/*, /version, /version/,
//    /openapi, /openapi/*, /healthz, /livez, /readyz), system:public-info-viewer and
//    system:basic-user (create selfsubjectaccessreviews, selfsubjectrulesreviews,
//    selfsubjectreviews), bound to the group system:authenticated. They are built in because a
//    cluster creates them itself, and because the Store refuses names with ':'. They are consulted
//    before the stored bindings, as any ClusterRoleBinding;
//  * the group system:masters is allowed everything (the API server's privileged-group
//    authorizer, which runs before RBAC); the decision then has an empty reason, as upstream.
//
// Left out: ClusterRole aggregationRule (on a cluster a controller copies the selected roles'
// rules into the aggregated role; here only the `rules` stored on a ClusterRole count), the
// escalate/bind/impersonate checks other parts of the API server make, and label/field-selector
// authorization.
#pragma once

#include <string>
#include <vector>

#include "operator/kube/client.h"

namespace kt::local {

// Who makes a request, as the authenticator reports it.
struct UserInfo {
  std::string name;  // "system:serviceaccount:kubetrain-system:kubetrain-operator"
  std::vector<std::string> groups;
};

// The user a ServiceAccount token authenticates as: system:serviceaccount:<ns>:<name>, in the
// groups system:serviceaccounts, system:serviceaccounts:<ns> and system:authenticated.
UserInfo service_account_user(const std::string& ns, const std::string& name);

// What a request asks for, as the API server's RequestInfo names it (authorizer.Attributes).
//  * verb: get, list, watch, create, update, patch, delete, deletecollection for resources; the
//    lowercase HTTP method (get, post, ...) for non-resource requests;
//  * ns: the request's namespace ("" for cluster-scoped resources and across all namespaces;
//    for /api/v1/namespaces/<n> itself it is <n>, as upstream);
//  * name: the object's name; "" for create and collections, except that a list or watch with a
//    `metadata.name=<n>` field selector has name <n>.
struct RequestAttributes {
  std::string verb;
  std::string api_group;    // "" for the core group
  std::string resource;     // "pods"
  std::string subresource;  // "status", "log", ""
  std::string ns;
  std::string name;
  bool resource_request = true;
  std::string path;  // for a non-resource request: "/version", "/metrics"
};

struct Decision {
  bool allowed = false;
  // Allowed: which binding allowed it ("RBAC: allowed by ClusterRoleBinding \"x\" of ClusterRole
  // \"y\" to ServiceAccount \"sa/ns\""). Denied: the API server's 403 message,
  // forbidden_message() followed by ": RBAC: <errors>" when some bound role could not be read.
  std::string reason;
};

// Decides a request against the RBAC objects `store` holds (read on every call: no cache) and the
// built-in default policy. Throws nothing for missing roles; other store failures are reported
// in the denial as upstream does.
Decision authorize(kube::Client& store, const UserInfo& user, const RequestAttributes& request);

// The message of the API server's 403 Forbidden Status for this request
// (apiserver responsewriters.Forbidden, apimachinery errors.NewForbidden), e.g.
//   pods "p" is forbidden: User "u" cannot get resource "pods/log" in API group "" in the
//   namespace "ns"
//   trainingjobs.kubetrain.dev is forbidden: User "u" cannot list resource "trainingjobs" in API
//   group "kubetrain.dev" at the cluster scope
//   forbidden: User "u" cannot get path "/metrics"
std::string forbidden_message(const UserInfo& user, const RequestAttributes& request);

// The RBAC objects a cluster's bootstrap policy grants every authenticated user, as JSON
// ClusterRoles and ClusterRoleBindings (see the top of this file).
struct DefaultPolicy {
  std::vector<kube::Object> cluster_roles;
  std::vector<kube::Object> cluster_role_bindings;
};
const DefaultPolicy& default_cluster_policy();

}  // namespace kt::local

// The built-in resources the local control plane serves (docs/KUBE.md): what the operator uses
// plus what Helm and the chart use (namespaces, secrets, service accounts, deployments, RBAC,
// PodDisruptionBudgets, NetworkPolicies, PVCs), with the names discovery gives kubectl.
// The Store registers every one; the HTTP front end describes them in discovery.
#pragma once

#include <string>
#include <vector>

#include "operator/kube/client.h"

namespace kt::local {

// Collections only the local control plane needs (the operator's own are in kube/client.h).
extern const kube::Resource kNamespaces;
extern const kube::Resource kSecrets;
extern const kube::Resource kServiceAccounts;
extern const kube::Resource kDeployments;  // apps/v1
extern const kube::Resource kReplicaSets;  // apps/v1
using kube::kRoles;                        // rbac.authorization.k8s.io/v1
extern const kube::Resource kRoleBindings;
extern const kube::Resource kClusterRoles;
extern const kube::Resource kClusterRoleBindings;
extern const kube::Resource kPodDisruptionBudgets;  // policy/v1
extern const kube::Resource kNetworkPolicies;       // networking.k8s.io/v1

struct BuiltinResource {
  kube::Resource resource;
  std::string singular;
  std::vector<std::string> short_names;
  std::vector<std::string> categories;
  bool status = false;  // has a status subresource
};

const std::vector<BuiltinResource>& builtin_resources();

}  // namespace kt::local

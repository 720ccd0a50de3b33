#include "local/builtin_resources.h"

namespace kt::local {

using kube::Resource;

const Resource kNamespaces{"", "v1", "namespaces", "Namespace", false};
const Resource kSecrets{"", "v1", "secrets", "Secret", true};
const Resource kServiceAccounts{"", "v1", "serviceaccounts", "ServiceAccount", true};
const Resource kDeployments{"apps", "v1", "deployments", "Deployment", true};
const Resource kReplicaSets{"apps", "v1", "replicasets", "ReplicaSet", true};
const Resource kRoleBindings{"rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding",
                             true};
const Resource kClusterRoles{"rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole",
                             false};
const Resource kClusterRoleBindings{"rbac.authorization.k8s.io", "v1", "clusterrolebindings",
                                    "ClusterRoleBinding", false};
const Resource kPodDisruptionBudgets{"policy", "v1", "poddisruptionbudgets",
                                     "PodDisruptionBudget", true};
const Resource kNetworkPolicies{"networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy",
                                true};

// Short names and categories as a v1.32 API server's discovery lists them.
const std::vector<BuiltinResource>& builtin_resources() {
  static const std::vector<BuiltinResource> all = {
      {kube::kPods, "pod", {"po"}, {"all"}, true},
      {kube::kServices, "service", {"svc"}, {"all"}, true},
      {kube::kConfigMaps, "configmap", {"cm"}, {}, false},
      {kube::kNodes, "node", {"no"}, {}, true},
      {kube::kEvents, "event", {"ev"}, {}, false},
      {kNamespaces, "namespace", {"ns"}, {}, true},
      {kSecrets, "secret", {}, {}, false},
      {kServiceAccounts, "serviceaccount", {"sa"}, {}, false},
      {kube::kPersistentVolumeClaims, "persistentvolumeclaim", {"pvc"}, {}, true},
      {kube::kLeases, "lease", {}, {}, false},
      {kDeployments, "deployment", {"deploy"}, {"all"}, true},
      {kReplicaSets, "replicaset", {"rs"}, {"all"}, true},
      {kRoles, "role", {}, {}, false},
      {kRoleBindings, "rolebinding", {}, {}, false},
      {kClusterRoles, "clusterrole", {}, {}, false},
      {kClusterRoleBindings, "clusterrolebinding", {}, {}, false},
      {kPodDisruptionBudgets, "poddisruptionbudget", {"pdb"}, {}, true},
      {kNetworkPolicies, "networkpolicy", {"netpol"}, {}, false},
      {kube::kCustomResourceDefinitions, "customresourcedefinition", {"crd", "crds"}, {}, true},
  };
  return all;
}

}  // namespace kt::local

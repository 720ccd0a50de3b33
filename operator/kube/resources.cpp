#include "operator/kube/client.h"

namespace kt::kube {

const Resource kPods{"", "v1", "pods", "Pod", true};
const Resource kServices{"", "v1", "services", "Service", true};
const Resource kConfigMaps{"", "v1", "configmaps", "ConfigMap", true};
const Resource kNodes{"", "v1", "nodes", "Node", false};
const Resource kEvents{"", "v1", "events", "Event", true};
const Resource kPersistentVolumeClaims{"", "v1", "persistentvolumeclaims", "PersistentVolumeClaim",
                                       true};
const Resource kLeases{"coordination.k8s.io", "v1", "leases", "Lease", true};
const Resource kRoles{"rbac.authorization.k8s.io", "v1", "roles", "Role", true};
const Resource kCoschedulingPodGroups{"scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup",
                                      true};
const Resource kVolcanoPodGroups{"scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup", true};
const Resource kTrainingJobs{"kubetrain.dev", "v1alpha1", "trainingjobs", "TrainingJob", true};
const Resource kCustomResourceDefinitions{"apiextensions.k8s.io", "v1",
                                          "customresourcedefinitions", "CustomResourceDefinition",
                                          false};

}  // namespace kt::kube

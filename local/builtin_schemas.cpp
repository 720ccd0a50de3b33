#include "local/builtin_schemas.h"

#include <map>
#include <string>

#include "local/builtin_resources.h"

namespace kt::local {
namespace {

using Json = nlohmann::json;

// An object whose listed properties are typed and whose other fields are kept.
Json object(Json properties, Json required = Json::array()) {
  Json s = {{"type", "object"},
            {"x-kubernetes-preserve-unknown-fields", true},
            {"properties", std::move(properties)}};
  if (!required.empty()) s["required"] = std::move(required);
  return s;
}
Json string() { return {{"type", "string"}}; }
Json integer(int64_t minimum = INT64_MIN, int64_t maximum = INT64_MAX) {
  Json s = {{"type", "integer"}};
  if (minimum != INT64_MIN) s["minimum"] = minimum;
  if (maximum != INT64_MAX) s["maximum"] = maximum;
  return s;
}
Json boolean() { return {{"type", "boolean"}}; }
Json list(Json items) { return {{"type", "array"}, {"items", std::move(items)}}; }
Json strings() { return list(string()); }
Json map_of(Json values) { return {{"type", "object"}, {"additionalProperties", std::move(values)}}; }
Json any_object() { return {{"type", "object"}, {"x-kubernetes-preserve-unknown-fields", true}}; }
Json quantities() { return map_of({{"x-kubernetes-int-or-string", true}}); }

// IsDNS1123Label / IsDNS1123Subdomain (k8s.io/apimachinery/pkg/util/validation).
Json dns_label() {
  return {{"type", "string"}, {"maxLength", 63}, {"pattern", "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}};
}
Json dns_subdomain() {
  return {{"type", "string"},
          {"maxLength", 253},
          {"pattern", "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"}};
}
// validateLocalDescendingPath: relative, no ".." element.
Json relative_path() {
  return {{"type", "string"}, {"minLength", 1}, {"pattern", "^(?!/)(?!(.*/)?\\.\\.(/.*)?$).*$"}};
}

Json container() {
  return object({{"name", dns_label()},
                 {"image", string()},
                 {"imagePullPolicy", {{"type", "string"}, {"enum", {"Always", "IfNotPresent", "Never"}}}},
                 {"command", strings()},
                 {"args", strings()},
                 {"workingDir", string()},
                 {"env", list(object({{"name", string()}, {"value", string()}, {"valueFrom", any_object()}},
                                     {"name"}))},
                 {"ports", list(object({{"containerPort", integer(1, 65535)},
                                        {"name", string()},
                                        {"protocol", string()}},
                                       {"containerPort"}))},
                 {"resources", object({{"limits", quantities()}, {"requests", quantities()}})},
                 {"volumeMounts", list(object({{"name", string()},
                                               {"mountPath", {{"type", "string"}, {"minLength", 1}}},
                                               {"readOnly", boolean()},
                                               {"subPath", string()}},
                                              {"name", "mountPath"}))},
                 {"terminationMessagePath", string()},
                 {"securityContext", any_object()}},
                {"name"});
}

Json pod_spec() {
  const Json volume = object(
      {{"name", dns_label()},
       {"configMap", object({{"name", string()},
                             {"items", list(object({{"key", string()}, {"path", relative_path()}},
                                                   {"key", "path"}))}})},
       {"secret", object({{"secretName", string()}})},
       {"emptyDir", any_object()},
       {"hostPath", object({{"path", string()}}, {"path"})},
       {"persistentVolumeClaim",
        object({{"claimName", dns_subdomain()}, {"readOnly", boolean()}}, {"claimName"})}},
      {"name"});
  return object({{"containers", {{"type", "array"}, {"minItems", 1}, {"items", container()}}},
                 {"initContainers", list(container())},
                 {"volumes", list(volume)},
                 {"nodeName", string()},
                 {"nodeSelector", map_of(string())},
                 {"serviceAccountName", string()},
                 {"restartPolicy", {{"type", "string"}, {"enum", {"Always", "OnFailure", "Never"}}}},
                 {"terminationGracePeriodSeconds", integer(0)},
                 {"activeDeadlineSeconds", integer(1)},
                 {"hostname", string()},
                 {"subdomain", string()},
                 {"schedulerName", string()},
                 {"tolerations", list(any_object())},
                 {"affinity", any_object()},
                 {"imagePullSecrets", list(object({{"name", string()}}))},
                 {"securityContext", any_object()}},
                {"containers"});
}

Json workload() {  // Deployment and ReplicaSet
  return object({{"spec", object({{"replicas", integer(0)},
                                  {"selector", any_object()},
                                  {"template", object({{"metadata", any_object()},
                                                       {"spec", pod_spec()}})},
                                  {"revisionHistoryLimit", integer(0)},
                                  {"strategy", any_object()}})}});
}

Json rules() {
  return list(object({{"apiGroups", strings()},
                      {"resources", strings()},
                      {"verbs", strings()},
                      {"resourceNames", strings()},
                      {"nonResourceURLs", strings()}},
                     {"verbs"}));
}

Json binding() {
  return object(
      {{"roleRef", object({{"apiGroup", string()}, {"kind", string()}, {"name", string()}},
                          {"kind", "name"})},
       {"subjects", list(object({{"kind", string()},
                                 {"name", string()},
                                 {"namespace", string()},
                                 {"apiGroup", string()}},
                                {"kind", "name"}))}},
      {"roleRef"});
}

const std::map<std::string, Json>& schemas() {
  static const std::map<std::string, Json> all = {
      {kube::kPods.kind, object({{"spec", pod_spec()}}, {"spec"})},
      {kDeployments.kind, workload()},
      {kReplicaSets.kind, workload()},
      {kube::kServices.kind,
       object({{"spec", object({{"ports", list(object({{"port", integer(1, 65535)},
                                                      {"targetPort", {{"x-kubernetes-int-or-string", true}}},
                                                      {"name", string()},
                                                      {"protocol", string()}},
                                                     {"port"}))},
                                {"selector", map_of(string())},
                                {"clusterIP", string()},
                                {"type", string()}})}})},
      {kube::kConfigMaps.kind, object({{"data", map_of(string())}, {"binaryData", map_of(string())}})},
      {kSecrets.kind,
       object({{"data", map_of(string())}, {"stringData", map_of(string())}, {"type", string()}})},
      {kube::kPersistentVolumeClaims.kind,
       object({{"spec", object({{"accessModes", strings()},
                                {"resources", object({{"requests", quantities()},
                                                      {"limits", quantities()}})},
                                {"storageClassName", string()},
                                {"volumeName", string()}})}})},
      {kRoles.kind, object({{"rules", rules()}})},
      {kClusterRoles.kind, object({{"rules", rules()}})},
      {kRoleBindings.kind, binding()},
      {kClusterRoleBindings.kind, binding()},
      {kube::kLeases.kind, object({{"spec", object({{"holderIdentity", string()},
                                                    {"leaseDurationSeconds", integer(1)},
                                                    {"acquireTime", string()},
                                                    {"renewTime", string()},
                                                    {"leaseTransitions", integer(0)}})}})},
      {kube::kNodes.kind,
       object({{"spec", object({{"unschedulable", boolean()}, {"taints", list(any_object())}})},
               {"status", object({{"allocatable", quantities()}, {"capacity", quantities()}})}})},
  };
  return all;
}

}  // namespace

const nlohmann::json* builtin_schema(const kube::Resource& resource) {
  for (const BuiltinResource& b : builtin_resources()) {
    if (b.resource.group != resource.group || b.resource.plural != resource.plural) continue;
    const auto it = schemas().find(resource.kind);
    return it == schemas().end() ? nullptr : &it->second;
  }
  return nullptr;
}

}  // namespace kt::local

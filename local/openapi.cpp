#include "local/openapi.h"

#include <cstdio>

#include "local/discovery.h"

namespace kt::local {
namespace {

using kube::Object;

// "kubetrain.dev" -> "dev.kubetrain" (the API server's naming of definitions).
std::string reversed_group(const std::string& group) {
  std::vector<std::string> parts;
  std::size_t at = 0;
  while (at <= group.size()) {
    const auto dot = group.find('.', at);
    parts.push_back(group.substr(at, dot == std::string::npos ? std::string::npos : dot - at));
    if (dot == std::string::npos) break;
    at = dot + 1;
  }
  std::string out;
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) out += (out.empty() ? "" : ".") + *it;
  return out;
}

// FNV-1a of the document, so that a client's cache notices a changed CRD.
std::string hash_of(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llX", static_cast<unsigned long long>(h));
  return buf;
}

struct Served {
  std::string group, version, kind, plural;
  bool namespaced;
  const Object* schema;
};

Object query_parameter(const std::string& name, const std::string& type) {
  return {{"name", name}, {"in", "query"}, {"schema", {{"type", type}, {"uniqueItems", true}}}};
}

// One operation on the resource, tagged as the API server tags them: explain finds a
// resource's kind through its paths' x-kubernetes-group-version-kind, and kubectl's
// field-validation check reads the PATCH parameters.
Object operation(const Served& s, const std::string& action, const std::string& ref) {
  Object parameters = Object::array();
  if (action == "patch" || action == "put" || action == "post") {
    for (const char* p : {"dryRun", "fieldManager", "fieldValidation"})
      parameters.push_back(query_parameter(p, "string"));
    if (action == "patch") parameters.push_back(query_parameter("force", "boolean"));
  }
  if (action == "list" || action == "watch") {
    for (const char* p : {"labelSelector", "fieldSelector", "continue", "resourceVersion"})
      parameters.push_back(query_parameter(p, "string"));
    for (const char* p : {"limit", "timeoutSeconds"}) parameters.push_back(query_parameter(p, "integer"));
    parameters.push_back(query_parameter("watch", "boolean"));
  }
  Object op = {{"x-kubernetes-action", action},
               {"x-kubernetes-group-version-kind",
                {{"group", s.group}, {"version", s.version}, {"kind", s.kind}}},
               {"responses",
                {{"200",
                  {{"description", "OK"},
                   {"content",
                    {{"application/json", {{"schema", {{"$ref", ref}}}}}}}}}}}};
  if (!parameters.empty()) op["parameters"] = parameters;
  return op;
}

void add_paths(Object& paths, const Served& s, const std::string& ref) {
  const std::string base = "/apis/" + s.group + "/" + s.version + "/";
  const std::string collection =
      base + (s.namespaced ? "namespaces/{namespace}/" : "") + s.plural;
  const std::string item = collection + "/{name}";
  paths[collection] = {{"get", operation(s, "list", ref)}, {"post", operation(s, "post", ref)},
                       {"delete", operation(s, "deletecollection", ref)}};
  paths[item] = {{"get", operation(s, "get", ref)},
                 {"put", operation(s, "put", ref)},
                 {"patch", operation(s, "patch", ref)},
                 {"delete", operation(s, "delete", ref)}};
  paths[item + "/status"] = {{"get", operation(s, "get", ref)},
                             {"put", operation(s, "put", ref)},
                             {"patch", operation(s, "patch", ref)}};
  if (s.namespaced) paths[base + s.plural] = {{"get", operation(s, "list", ref)}};
}

std::vector<Served> served_versions(const std::vector<Object>& crds) {
  std::vector<Served> out;
  for (const Object& crd : crds) {
    const Object& spec = crd.value("spec", Object::object()).is_object() ? crd["spec"] : crd;
    if (!spec.contains("versions") || !spec["versions"].is_array()) continue;
    const std::string group = spec.value("group", "");
    const std::string kind = spec.value("names", Object::object()).value("kind", "");
    const std::string plural = spec.value("names", Object::object()).value("plural", "");
    const bool namespaced = spec.value("scope", "Namespaced") == "Namespaced";
    for (const Object& v : spec["versions"]) {
      if (!v.is_object() || !v.value("served", true)) continue;
      const Object* schema = nullptr;
      if (v.contains("schema") && v["schema"].is_object() &&
          v["schema"].contains("openAPIV3Schema"))
        schema = &v["schema"]["openAPIV3Schema"];
      out.push_back({group, v.value("name", ""), kind, plural, namespaced, schema});
    }
  }
  return out;
}

}  // namespace

Object openapi_v3_document(const std::vector<Object>& crds, const std::string& group,
                           const std::string& version) {
  Object schemas = Object::object();
  Object paths = Object::object();
  for (const Served& s : served_versions(crds)) {
    if (s.group != group || s.version != version) continue;
    Object schema = s.schema ? *s.schema : Object{{"type", "object"}};
    schema["x-kubernetes-group-version-kind"] =
        Object::array({{{"group", group}, {"kind", s.kind}, {"version", version}}});
    const std::string name = reversed_group(group) + "." + version + "." + s.kind;
    schemas[name] = schema;
    add_paths(paths, s, "#/components/schemas/" + name);
  }
  if (schemas.empty()) return nullptr;
  return {{"openapi", "3.0.0"},
          {"info", {{"title", "Kubernetes CRD Swagger"}, {"version", "v0.1.0"}}},
          {"paths", paths},
          {"components", {{"schemas", schemas}}}};
}

Object openapi_v3_index(const std::vector<Object>& crds) {
  Object paths = Object::object();
  for (const Served& s : served_versions(crds)) {
    const std::string path = "apis/" + s.group + "/" + s.version;
    if (paths.contains(path)) continue;
    const Object doc = openapi_v3_document(crds, s.group, s.version);
    paths[path] = {{"serverRelativeURL", "/openapi/v3/" + path + "?hash=" + hash_of(doc.dump())}};
  }
  return {{"paths", paths}};
}

Object openapi_v2_document() {
  return {{"swagger", "2.0"},
          {"info", {{"title", "Kubernetes"}, {"version", std::string("v") + kKubeMajor + "." + kKubeMinor + ".0"}}},
          {"paths", Object::object()},
          {"definitions", Object::object()}};
}

}  // namespace kt::local

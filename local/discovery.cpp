// Discovery (discovery.h): the served resources and the documents that describe them.
#include "local/discovery.h"

#include <algorithm>
#include <cctype>
#include <map>

#include "local/builtin_resources.h"

namespace kt::local {

using kube::Object;

namespace {

std::string lowercase(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

Object api_group(const std::string& group, const std::vector<std::string>& versions) {
  Object entries = Object::array();
  for (const auto& v : versions)
    entries.push_back({{"groupVersion", group + "/" + v}, {"version", v}});
  return {{"kind", "APIGroup"},
          {"apiVersion", "v1"},
          {"name", group},
          {"versions", entries},
          {"preferredVersion", entries.at(0)}};
}

}  // namespace

std::vector<ServedResource> builtin_served() {
  std::vector<ServedResource> out;
  for (const BuiltinResource& b : builtin_resources())
    out.push_back({b.resource, b.singular, b.short_names, b.categories, b.status});
  return out;
}

std::optional<ServedResource> served_from_crd(const Object& crd) {
  const Object spec = crd.value("spec", Object::object());
  const Object names = spec.value("names", Object::object());
  ServedResource s;
  s.resource.group = spec.value("group", "");
  s.resource.plural = names.value("plural", "");
  s.resource.kind = names.value("kind", "");
  s.resource.namespaced = spec.value("scope", "Namespaced") == "Namespaced";
  s.singular = names.value("singular", "");
  if (s.singular.empty()) s.singular = lowercase(s.resource.kind);
  for (const auto& n : names.value("shortNames", Object::array())) {
    if (n.is_string()) s.short_names.push_back(n.get<std::string>());
  }
  for (const auto& n : names.value("categories", Object::array())) {
    if (n.is_string()) s.categories.push_back(n.get<std::string>());
  }
  for (const auto& v : spec.value("versions", Object::array())) {
    if (s.resource.version.empty() || v.value("storage", false)) {
      s.resource.version = v.value("name", "");
      s.status = v.contains("subresources") && v["subresources"].contains("status");
      s.printer_columns = v.value("additionalPrinterColumns", Object::array());
    }
  }
  if (s.resource.group.empty() || s.resource.plural.empty() || s.resource.version.empty()) {
    return std::nullopt;
  }
  return s;
}

ServedResource served_without_crd(const kube::Resource& resource, bool status_subresource,
                                  std::vector<std::string> short_names) {
  ServedResource served;
  served.resource = resource;
  served.singular = lowercase(resource.kind);
  served.short_names = std::move(short_names);
  served.status = status_subresource;
  return served;
}

Object version_info() {
  return {{"major", kKubeMajor},
          {"minor", kKubeMinor},
          {"gitVersion", std::string("v") + kKubeMajor + "." + kKubeMinor + ".0-kubetrain-local"},
          {"platform", "linux/amd64"}};
}

Object api_versions(int port) {
  return {
      {"kind", "APIVersions"},
      {"versions", {"v1"}},
      {"serverAddressByClientCIDRs",
       {{{"clientCIDR", "0.0.0.0/0"}, {"serverAddress", "127.0.0.1:" + std::to_string(port)}}}}};
}

Object api_group_list(const std::vector<ServedResource>& served) {
  std::map<std::string, std::vector<std::string>> groups;  // group -> versions
  for (const ServedResource& s : served) {
    if (s.resource.group.empty()) continue;
    auto& versions = groups[s.resource.group];
    if (std::find(versions.begin(), versions.end(), s.resource.version) == versions.end()) {
      versions.push_back(s.resource.version);
    }
  }
  Object list = Object::array();
  for (const auto& [group, versions] : groups) list.push_back(api_group(group, versions));
  return {{"kind", "APIGroupList"}, {"apiVersion", "v1"}, {"groups", list}};
}

std::optional<Object> api_resource_list(const std::vector<ServedResource>& served,
                                        const std::string& group, const std::string& version) {
  Object resources = Object::array();
  const std::vector<std::string> verbs = {"create", "delete", "get",  "list",
                                          "patch",  "update", "watch"};
  for (const ServedResource& s : served) {
    if (s.resource.group != group || s.resource.version != version) continue;
    Object entry = {{"name", s.resource.plural},
                    {"singularName", s.singular},
                    {"namespaced", s.resource.namespaced},
                    {"kind", s.resource.kind},
                    {"verbs", verbs}};
    if (!s.short_names.empty()) entry["shortNames"] = s.short_names;
    if (!s.categories.empty()) entry["categories"] = s.categories;
    resources.push_back(entry);
    if (s.status) {
      resources.push_back({{"name", s.resource.plural + "/status"},
                           {"singularName", ""},
                           {"namespaced", s.resource.namespaced},
                           {"kind", s.resource.kind},
                           {"verbs", {"get", "patch", "update"}}});
    }
  }
  if (resources.empty()) return std::nullopt;
  return Object{{"kind", "APIResourceList"},
                {"apiVersion", "v1"},
                {"groupVersion", group.empty() ? version : group + "/" + version},
                {"resources", resources}};
}

}  // namespace kt::local

// RBAC authorization (rbac.h). Sources of each behaviour, all in k8s.io/kubernetes unless noted:
// rule matching: pkg/apis/rbac/v1/evaluation_helpers.go and RuleAllows in
// plugin/pkg/auth/authorizer/rbac/rbac.go; binding traversal, subjects and the "allowed by"
// descriptions: pkg/registry/rbac/validation/rule.go; the bootstrap policy:
// plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go; the 403 message:
// k8s.io/apiserver endpoints/handlers/responsewriters/errors.go and k8s.io/apimachinery
// pkg/api/errors NewForbidden; joined errors: apimachinery pkg/util/errors (aggregate).
#include "local/rbac.h"

#include <algorithm>
#include <optional>

#include "local/builtin_resources.h"

namespace kt::local {
namespace {

using kube::Object;

// The groups of user.Info that RBAC treats specially (apiserver pkg/authentication/user).
constexpr const char* kAllAuthenticated = "system:authenticated";
constexpr const char* kAllUnauthenticated = "system:unauthenticated";
constexpr const char* kPrivilegedGroup = "system:masters";

bool has(const std::vector<std::string>& set, const std::string& value) {
  return std::find(set.begin(), set.end(), value) != set.end();
}

// The strings of `obj[key]`; absent, null or non-string entries count as none.
std::vector<std::string> strings_of(const Object& obj, const char* key) {
  std::vector<std::string> out;
  if (!obj.is_object() || !obj.contains(key) || !obj[key].is_array()) return out;
  for (const Object& v : obj[key])
    if (v.is_string()) out.push_back(v.get<std::string>());
  return out;
}

std::string string_of(const Object& obj, const char* key) {
  if (!obj.is_object() || !obj.contains(key) || !obj[key].is_string()) return "";
  return obj[key].get<std::string>();
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// ---- Rule matching (evaluation_helpers.go) -----------------------------------------------

// verbs, apiGroups: an entry equal to the requested value, or "*".
bool matches_or_all(const std::vector<std::string>& entries, const std::string& requested) {
  for (const std::string& e : entries)
    if (e == "*" || e == requested) return true;
  return false;
}

// `combined` is "resource" or "resource/subresource". "*" matches everything, including
// subresources; "*/sub" matches that subresource of any resource.
bool resource_matches(const std::vector<std::string>& entries, const std::string& combined,
                      const std::string& subresource) {
  for (const std::string& e : entries) {
    if (e == "*" || e == combined) return true;
    if (!subresource.empty() && e == "*/" + subresource) return true;
  }
  return false;
}

// An empty resourceNames restricts nothing; otherwise the request must name one of them, so a
// request without a name (create, collections) never matches.
bool resource_name_matches(const std::vector<std::string>& names, const std::string& requested) {
  return names.empty() || has(names, requested);
}

// An entry equal to the path, "*", or "prefix*" matching by prefix.
bool non_resource_url_matches(const std::vector<std::string>& urls, const std::string& path) {
  for (const std::string& u : urls) {
    if (u == "*" || u == path) return true;
    if (!u.empty() && u.back() == '*') {
      const std::string prefix = u.substr(0, u.find_last_not_of('*') + 1);
      if (starts_with(path, prefix)) return true;
    }
  }
  return false;
}

bool rule_allows(const Object& rule, const RequestAttributes& request) {
  if (!matches_or_all(strings_of(rule, "verbs"), request.verb)) return false;
  if (!request.resource_request)
    return non_resource_url_matches(strings_of(rule, "nonResourceURLs"), request.path);
  const std::string combined =
      request.subresource.empty() ? request.resource : request.resource + "/" + request.subresource;
  return matches_or_all(strings_of(rule, "apiGroups"), request.api_group) &&
         resource_matches(strings_of(rule, "resources"), combined, request.subresource) &&
         resource_name_matches(strings_of(rule, "resourceNames"), request.name);
}

// ---- Subjects and bindings (rule.go) -----------------------------------------------------

// `binding_ns` is the RoleBinding's namespace, "" for a ClusterRoleBinding: a ServiceAccount
// subject without a namespace means one in the binding's namespace, and nobody cluster-wide.
bool applies_to_user(const UserInfo& user, const Object& subject, const std::string& binding_ns) {
  const std::string kind = string_of(subject, "kind");
  const std::string name = string_of(subject, "name");
  if (kind == "User") return user.name == name;
  if (kind == "Group") return has(user.groups, name);
  if (kind == "ServiceAccount") {
    std::string sa_ns = string_of(subject, "namespace");
    if (sa_ns.empty()) sa_ns = binding_ns;
    if (sa_ns.empty()) return false;
    return user.name == "system:serviceaccount:" + sa_ns + ":" + name;
  }
  return false;
}

// Go's %q for the strings these messages hold (strconv.Quote): quotes, backslashes and control
// characters escaped; other bytes, UTF-8 included, as they are.
std::string quote(const std::string& s) {
  static const std::string kEscaped = "\"\\\a\b\f\n\r\t\v";  // written as \ and a letter
  static const std::string kLetters = "\"\\abfnrtv";
  static const char* kHex = "0123456789abcdef";
  std::string out = "\"";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (const size_t i = kEscaped.find(c); i != std::string::npos) {
      out += '\\';
      out += kLetters[i];
    } else if (u < 0x20 || u == 0x7f) {
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 0xf];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// describeSubject: a ServiceAccount as "name/namespace", the namespace defaulted as above.
std::string describe_subject(const Object& subject, const std::string& binding_ns) {
  const std::string kind = string_of(subject, "kind");
  std::string name = string_of(subject, "name");
  if (kind == "ServiceAccount") {
    const std::string sa_ns = string_of(subject, "namespace");
    name += "/" + (sa_ns.empty() ? binding_ns : sa_ns);
  }
  return kind + " " + quote(name);
}

// `binding_ns` "" for a ClusterRoleBinding: `ClusterRoleBinding "b" of ClusterRole "r" to ...`;
// a RoleBinding is named "name/namespace".
std::string describe_binding(const Object& binding, const Object& subject,
                             const std::string& binding_ns) {
  const Object& meta = binding.value("metadata", Object::object());
  const Object& role_ref = binding.value("roleRef", Object::object());
  const std::string name = string_of(meta, "name");
  return (binding_ns.empty() ? "ClusterRoleBinding " + quote(name)
                             : "RoleBinding " + quote(name + "/" + binding_ns)) +
         " of " + string_of(role_ref, "kind") + " " + quote(string_of(role_ref, "name")) + " to " +
         describe_subject(subject, binding_ns);
}

// The rules a roleRef names (GetRoleReferenceRules); when it cannot be resolved, nothing, and
// why is added to `errors`. A Role is looked up in the binding's namespace: "" for a
// ClusterRoleBinding, where none can exist.
std::optional<Object> role_rules(kube::Client& store, const Object& role_ref,
                                 const std::string& binding_ns, std::vector<std::string>& errors) {
  const std::string kind = string_of(role_ref, "kind");
  const std::string name = string_of(role_ref, "name");
  if (kind == "ClusterRole") {
    for (const Object& role : default_cluster_policy().cluster_roles)
      if (role["metadata"]["name"] == name) return role["rules"];
  } else if (kind != "Role") {
    errors.push_back("unsupported role reference kind: " + quote(kind));
    return std::nullopt;
  }
  // The listers' NotFound: the singular resource qualified by the RBAC group.
  const std::string not_found = (kind == "Role" ? "role" : "clusterrole") +
                                std::string(".rbac.authorization.k8s.io ") + quote(name) +
                                " not found";
  if (kind == "Role" && binding_ns.empty()) {
    errors.push_back(not_found);
    return std::nullopt;
  }
  try {
    const Object role =
        kind == "Role" ? store.get(kRoles, binding_ns, name) : store.get(kClusterRoles, "", name);
    return role.value("rules", Object::array());
  } catch (const kube::ApiError& e) {
    errors.push_back(e.not_found() ? not_found : std::string(e.what()));
  } catch (const kt::Error& e) {
    errors.push_back(e.what());
  }
  return std::nullopt;
}

// The first of `bindings` (all in `binding_ns`, "" for ClusterRoleBindings) whose role allows
// the request, described for the Decision; resolution errors are added to `errors`.
std::optional<std::string> allowing_binding(kube::Client& store,
                                            const std::vector<Object>& bindings,
                                            const std::string& binding_ns, const UserInfo& user,
                                            const RequestAttributes& request,
                                            std::vector<std::string>& errors) {
  for (const Object& binding : bindings) {
    const Object subjects = binding.value("subjects", Object::array());
    const Object* subject = nullptr;
    for (const Object& s : subjects)
      if (applies_to_user(user, s, binding_ns)) {
        subject = &s;
        break;
      }
    if (subject == nullptr) continue;
    const std::optional<Object> rules =
        role_rules(store, binding.value("roleRef", Object::object()), binding_ns, errors);
    if (!rules || !rules->is_array()) continue;
    for (const Object& rule : *rules)
      if (rule_allows(rule, request))
        return "RBAC: allowed by " + describe_binding(binding, *subject, binding_ns);
  }
  return std::nullopt;
}

std::vector<Object> list_bindings(kube::Client& store, const kube::Resource& resource,
                                  const std::string& ns, std::vector<std::string>& errors) {
  try {
    return store.list(resource, ns, {}).items;
  } catch (const kt::Error& e) {
    errors.push_back(e.what());
  }
  return {};
}

// utilerrors.NewAggregate(...).Error(): one message as is, several deduplicated in brackets.
std::string aggregate(const std::vector<std::string>& errors) {
  std::vector<std::string> unique;
  for (const std::string& e : errors)
    if (!has(unique, e)) unique.push_back(e);
  if (unique.size() == 1) return unique[0];
  std::string joined;
  for (const std::string& e : unique) joined += (joined.empty() ? "" : ", ") + e;
  return "[" + joined + "]";
}

// responsewriters' sanitizer: nothing in the message may look like HTML.
std::string sanitize(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '&')
      out += "&amp;";
    else if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else
      out += c;
  }
  return out;
}

Object policy_rule(const std::vector<std::string>& verbs, const char* field,
                   const std::vector<std::string>& values, const char* api_group = nullptr) {
  Object rule = {{"verbs", verbs}, {field, values}};
  if (api_group != nullptr) rule["apiGroups"] = Object::array({api_group});
  return rule;
}

Object cluster_role(const std::string& name, Object rules) {
  return {{"apiVersion", "rbac.authorization.k8s.io/v1"},
          {"kind", "ClusterRole"},
          {"metadata", {{"name", name}}},
          {"rules", std::move(rules)}};
}

Object cluster_role_binding_to_groups(const std::string& role,
                                      const std::vector<std::string>& groups) {
  Object subjects = Object::array();
  for (const std::string& g : groups)
    subjects.push_back({{"apiGroup", "rbac.authorization.k8s.io"}, {"kind", "Group"}, {"name", g}});
  return {{"apiVersion", "rbac.authorization.k8s.io/v1"},
          {"kind", "ClusterRoleBinding"},
          {"metadata", {{"name", role}}},
          {"roleRef",
           {{"apiGroup", "rbac.authorization.k8s.io"}, {"kind", "ClusterRole"}, {"name", role}}},
          {"subjects", std::move(subjects)}};
}

}  // namespace

UserInfo service_account_user(const std::string& ns, const std::string& name) {
  return {"system:serviceaccount:" + ns + ":" + name,
          {"system:serviceaccounts", "system:serviceaccounts:" + ns, kAllAuthenticated}};
}

const DefaultPolicy& default_cluster_policy() {
  static const DefaultPolicy policy = [] {
    DefaultPolicy p;
    p.cluster_roles = {
        cluster_role("system:discovery",
                     Object::array({policy_rule(
                         {"get"}, "nonResourceURLs",
                         {"/livez", "/readyz", "/healthz", "/version", "/version/", "/openapi",
                          "/openapi/*", "/api", "/api/*", "/apis", "/apis/*"})})),
        cluster_role(
            "system:basic-user",
            Object::array({policy_rule({"create"}, "resources",
                                       {"selfsubjectaccessreviews", "selfsubjectrulesreviews"},
                                       "authorization.k8s.io"),
                           policy_rule({"create"}, "resources", {"selfsubjectreviews"},
                                       "authentication.k8s.io")})),
        cluster_role("system:public-info-viewer",
                     Object::array({policy_rule(
                         {"get"}, "nonResourceURLs",
                         {"/livez", "/readyz", "/healthz", "/version", "/version/"})})),
    };
    p.cluster_role_bindings = {
        cluster_role_binding_to_groups("system:discovery", {kAllAuthenticated}),
        cluster_role_binding_to_groups("system:basic-user", {kAllAuthenticated}),
        cluster_role_binding_to_groups("system:public-info-viewer",
                                       {kAllAuthenticated, kAllUnauthenticated}),
    };
    return p;
  }();
  return policy;
}

Decision authorize(kube::Client& store, const UserInfo& user, const RequestAttributes& request) {
  if (has(user.groups, kPrivilegedGroup)) return {true, ""};

  std::vector<std::string> errors;
  std::vector<Object> cluster_bindings = default_cluster_policy().cluster_role_bindings;
  for (Object& b : list_bindings(store, kClusterRoleBindings, "", errors))
    cluster_bindings.push_back(std::move(b));
  if (auto reason = allowing_binding(store, cluster_bindings, "", user, request, errors))
    return {true, *reason};
  if (!request.ns.empty()) {
    const std::vector<Object> bindings = list_bindings(store, kRoleBindings, request.ns, errors);
    if (auto reason = allowing_binding(store, bindings, request.ns, user, request, errors))
      return {true, *reason};
  }
  std::string reason = forbidden_message(user, request);
  if (!errors.empty()) reason += ": RBAC: " + aggregate(errors);
  return {false, reason};
}

std::string forbidden_message(const UserInfo& user, const RequestAttributes& request) {
  std::string detail;
  std::string group_resource;  // schema.GroupResource.String(): "resource.group"
  if (!request.resource_request) {
    detail =
        "User " + quote(user.name) + " cannot " + request.verb + " path " + quote(request.path);
  } else {
    const std::string combined = request.subresource.empty()
                                     ? request.resource
                                     : request.resource + "/" + request.subresource;
    detail =
        "User " + quote(user.name) + " cannot " + request.verb + " resource " + quote(combined) +
        " in API group " + quote(request.api_group) +
        (request.ns.empty() ? " at the cluster scope" : " in the namespace " + quote(request.ns));
    group_resource =
        request.api_group.empty() ? request.resource : request.resource + "." + request.api_group;
  }
  detail = sanitize(detail);
  if (group_resource.empty()) return "forbidden: " + detail;
  if (request.name.empty()) return group_resource + " is forbidden: " + detail;
  return group_resource + " " + quote(request.name) + " is forbidden: " + detail;
}

}  // namespace kt::local

#include "local/apply.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "api/error.h"
#include "api/yaml_json.h"
#include "operator/kube/objects.h"

namespace kt::local {
namespace {

using Json = nlohmann::json;
using kube::ApiError;

// Deeper than this, values are not walked (they count as one atomic value) and an applied config
// is refused: every walk here recurses once per level.
constexpr int kMaxDepth = 128;
// fieldManager's limit (apimachinery validation.FieldManagerMaxLength).
constexpr size_t kMaxFieldManagerBytes = 128;
const char* const kBeforeFirstApply = "before-first-apply";

// ---- Field sets ------------------------------------------------------------------------------

// One path element as FieldsV1 writes it: "f:<field>", "k:<json of the key fields>" (a list map
// item), "v:<json value>" (a set item), "i:<index>" (an item of a list we could not key).
using Path = std::vector<std::string>;

// A set of paths shaped as structured-merge-diff's fieldpath.Set: a node per path element;
// `member` says the path ending at this node is in the set (FieldsV1's ".": {} when the node
// also has children).
struct FieldSet {
  bool member = false;
  std::map<std::string, FieldSet> children;

  bool empty() const { return !member && children.empty(); }
  void insert(const Path& path) {
    FieldSet* node = this;
    for (const std::string& element : path) node = &node->children[element];
    node->member = true;
  }
  const FieldSet* child(const std::string& element) const {
    auto it = children.find(element);
    return it == children.end() ? nullptr : &it->second;
  }
};

void unite(FieldSet& into, const FieldSet& other) {
  into.member = into.member || other.member;
  for (const auto& [element, node] : other.children) unite(into.children[element], node);
}

// The paths that are members of both.
FieldSet intersect(const FieldSet& a, const FieldSet& b) {
  FieldSet out;
  out.member = a.member && b.member;
  for (const auto& [element, node] : a.children) {
    if (const FieldSet* other = b.child(element)) {
      FieldSet both = intersect(node, *other);
      if (!both.empty()) out.children.emplace(element, std::move(both));
    }
  }
  return out;
}

// Removes from `from` the paths that are members of `what` (fieldpath.Set.Difference).
void subtract(FieldSet& from, const FieldSet& what) {
  if (what.member) from.member = false;
  for (const auto& [element, node] : what.children) {
    auto it = from.children.find(element);
    if (it == from.children.end()) continue;
    subtract(it->second, node);
    if (it->second.empty()) from.children.erase(it);
  }
}

// Removes `path` and everything under it (fieldpath.Set.RecursiveDifference with one path).
void remove_subtree(FieldSet& from, const Path& path, size_t at = 0) {
  auto it = from.children.find(path[at]);
  if (it == from.children.end()) return;
  if (at + 1 == path.size()) {
    from.children.erase(it);
    return;
  }
  remove_subtree(it->second, path, at + 1);
  if (it->second.empty()) from.children.erase(it);
}

Json to_fields_v1(const FieldSet& set) {
  Json out = Json::object();
  if (set.member && !set.children.empty()) out["."] = Json::object();
  for (const auto& [element, node] : set.children) out[element] = to_fields_v1(node);
  return out;
}

FieldSet from_fields_v1(const Json& fields, int depth = 0) {
  FieldSet out;
  if (!fields.is_object() || depth > kMaxDepth) return out;
  for (const auto& [element, value] : fields.items()) {
    if (element == ".") {
      out.member = true;
      continue;
    }
    FieldSet node = from_fields_v1(value, depth + 1);
    if (value.is_object() && value.empty()) node.member = true;
    if (!node.empty()) out.children.emplace(element, std::move(node));
  }
  return out;
}

// Go's encoding/json (which structured-merge-diff's key encoding follows) escapes <, >, & and
// U+2028/U+2029 where nlohmann writes them as they are.
std::string go_json(const Json& value) {
  const std::string plain = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  std::string out;
  out.reserve(plain.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    const char c = plain[i];
    if (c == '<')
      out += "\\u003c";
    else if (c == '>')
      out += "\\u003e";
    else if (c == '&')
      out += "\\u0026";
    else if (c == '\xe2' && i + 2 < plain.size() && plain[i + 1] == '\x80' &&
             (plain[i + 2] == '\xa8' || plain[i + 2] == '\xa9')) {
      out += plain[i + 2] == '\xa8' ? "\\u2028" : "\\u2029";
      i += 2;
    } else {
      out += c;
    }
  }
  return out;
}

std::string quoted(const std::string& text) {
  return Json(text).dump(-1, ' ', false, Json::error_handler_t::replace);
}

// value.ToString: how a path prints a key or set value.
std::string value_string(const Json& v) {
  if (v.is_string()) return quoted(v.get<std::string>());
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + value_string(v[i]);
    return out + "]";
  }
  if (v.is_object()) {
    std::string out;
    for (const auto& [k, item] : v.items()) out += k + "=" + value_string(item);
    return out;
  }
  return v.dump();
}

// PathElement.String(): ".name", "[name=\"app\"]", "[=\"x\"]", "[3]".
std::string element_string(const std::string& element) {
  const std::string body = element.substr(2);
  switch (element[0]) {
    case 'f':
      return "." + body;
    case 'k': {
      const Json key = Json::parse(body, nullptr, false);
      std::string out = "[";
      bool first = true;
      if (key.is_object()) {
        for (const auto& [name, value] : key.items()) {
          out += (first ? "" : ",") + name + "=" + value_string(value);
          first = false;
        }
      }
      return out + "]";
    }
    case 'v':
      return "[=" + value_string(Json::parse(body, nullptr, false)) + "]";
    default:
      return "[" + body + "]";
  }
}

std::string path_string(const Path& path) {
  std::string out;
  for (const std::string& element : path) out += element_string(element);
  return out;
}

// fieldpath.Set.Iterate's order: a node's members first, then its children's subtrees.
template <typename F>
void for_each_member(const FieldSet& set, Path& prefix, const F& f) {
  for (const auto& [element, node] : set.children) {
    if (!node.member) continue;
    prefix.push_back(element);
    f(prefix);
    prefix.pop_back();
  }
  for (const auto& [element, node] : set.children) {
    if (node.children.empty()) continue;
    prefix.push_back(element);
    for_each_member(node, prefix, f);
    prefix.pop_back();
  }
}

Path dotted_path(const std::string& dotted) {
  Path path;
  size_t start = 0;
  while (start <= dotted.size()) {
    const size_t dot = dotted.find('.', start);
    const size_t end = dot == std::string::npos ? dotted.size() : dot;
    path.push_back("f:" + dotted.substr(start, end - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return path;
}

// The fields the server owns, never an applier or updater (stripmeta.go).
const FieldSet& server_owned_fields() {
  static const FieldSet set = [] {
    FieldSet s;
    for (const char* path :
         {"apiVersion", "kind", "metadata", "metadata.name", "metadata.namespace",
          "metadata.creationTimestamp", "metadata.selfLink", "metadata.uid", "metadata.clusterName",
          "metadata.generation", "metadata.managedFields", "metadata.resourceVersion"}) {
      s.insert(dotted_path(path));
    }
    return s;
  }();
  return set;
}

// ---- Types -----------------------------------------------------------------------------------

enum class Shape {
  Leaf,     // a scalar, an atomic list or an atomic object: owned and replaced whole
  Struct,   // an object of named fields: a field is a member only when null or {}
  Map,      // an object whose every entry is a member (maps without declared fields)
  ListMap,  // items keyed by `keys`
  ListSet,  // items are their own keys
};

struct Type {
  Shape shape = Shape::Leaf;
  std::vector<std::string> keys;       // ListMap
  Json key_defaults = Json::object();  // ListMap: a key field's default when an item omits it
};

// Where a value sits: its dotted pattern ("spec.template.spec.containers[].ports") for the
// built-in table, or its CRD schema node.
struct Pos {
  std::string pattern;
  const Json* node = nullptr;  // the CRD schema here (when `crd`)
  bool crd = false;
  bool deduced = false;  // no schema knows this place: objects are maps, lists atomic
  int depth = 0;
};

struct ListRule {
  std::vector<std::string> keys;  // empty: a set
  Json defaults = Json::object();
};

// What Kubernetes' OpenAPI says (x-kubernetes-list-type map/set, patchMergeKey), for the lists
// the operator's and Helm charts' objects use. Patterns are kind-agnostic: no other built-in kind
// has a different list at these paths.
const std::map<std::string, ListRule>& builtin_lists() {
  static const std::map<std::string, ListRule> rules = [] {
    std::map<std::string, ListRule> r;
    const Json tcp = {{"protocol", "TCP"}};
    for (const std::string pod :
         {"spec", "spec.template.spec", "spec.jobTemplate.spec.template.spec", "template.spec"}) {
      for (const char* containers : {"containers", "initContainers", "ephemeralContainers"}) {
        const std::string c = pod + "." + containers;
        r[c] = {{"name"}};
        r[c + "[].env"] = {{"name"}};
        r[c + "[].ports"] = {{"containerPort", "protocol"}, tcp};
        r[c + "[].volumeMounts"] = {{"mountPath"}};
        r[c + "[].volumeDevices"] = {{"devicePath"}};
      }
      for (const char* by_name :
           {"volumes", "imagePullSecrets", "resourceClaims", "schedulingGates"}) {
        r[pod + "." + by_name] = {{"name"}};
      }
      r[pod + ".hostAliases"] = {{"ip"}};
      r[pod + ".topologySpreadConstraints"] = {{"topologyKey", "whenUnsatisfiable"}};
    }
    r["spec.ports"] = {{"port", "protocol"}, tcp};  // a Service's
    r["metadata.ownerReferences"] = {{"uid"}};
    r["metadata.finalizers"] = {};
    r["status.conditions"] = {{"type"}};
    return r;
  }();
  return rules;
}

// Objects Kubernetes marks +structType=atomic at these places (LabelSelector).
bool builtin_atomic_object(const std::string& kind, const std::string& pattern) {
  static const std::set<std::string> selector_kinds = {
      "Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job", "PodDisruptionBudget"};
  if (pattern == "spec.selector") return selector_kinds.count(kind) > 0;
  if (pattern == "spec.jobTemplate.spec.selector") return kind == "CronJob";
  if (pattern == "spec.podSelector") return kind == "NetworkPolicy";
  return false;
}

class Types {
 public:
  Types(std::string kind, const Json* crd_schema)
      : kind_(std::move(kind)),
        schema_(crd_schema && crd_schema->is_object() ? crd_schema : nullptr) {}

  Pos root() const {
    Pos p;
    p.node = schema_;
    p.crd = schema_ != nullptr;
    return p;
  }

  Pos field(const Pos& at, const std::string& name) const {
    Pos p;
    p.pattern = at.pattern.empty() ? name : at.pattern + "." + name;
    p.depth = at.depth + 1;
    p.deduced = at.deduced;
    if (at.deduced || !at.crd) return p;
    // metadata is ObjectMeta for every kind, not what the CRD says.
    if (at.depth == 0 && name == "metadata") return p;
    p.crd = true;
    const Json& node = *at.node;
    auto props = node.find("properties");
    if (props != node.end() && props->is_object() && props->contains(name)) {
      p.node = &(*props)[name];
      return p;
    }
    auto extra = node.find("additionalProperties");
    if (extra != node.end() && extra->is_object()) {
      p.node = &*extra;
      return p;
    }
    p.deduced = true;  // preserve-unknown-fields, additionalProperties: true, or undeclared
    return p;
  }

  Pos item(const Pos& at) const {
    Pos p = at;
    p.pattern += "[]";
    p.depth = at.depth + 1;
    if (at.crd && !at.deduced) {
      auto items = at.node->find("items");
      if (items != at.node->end() && items->is_object())
        p.node = &*items;
      else
        p.deduced = true;
    }
    return p;
  }

  Type of(const Pos& at, const Json& value) const {
    Type t;
    if (at.depth > kMaxDepth || !(value.is_object() || value.is_array())) return t;
    if (at.deduced) {
      if (value.is_object()) t.shape = Shape::Map;
      return t;
    }
    if (at.crd) return crd_type(*at.node, value);
    if (value.is_object()) {
      if (!builtin_atomic_object(kind_, at.pattern)) t.shape = Shape::Struct;
      return t;
    }
    auto rule = builtin_lists().find(at.pattern);
    if (rule != builtin_lists().end()) {
      t.shape = rule->second.keys.empty() ? Shape::ListSet : Shape::ListMap;
      t.keys = rule->second.keys;
      t.key_defaults = rule->second.defaults;
    }
    return t;
  }

 private:
  static Type crd_type(const Json& node, const Json& value) {
    Type t;
    if (value.is_object()) {
      if (node.value("x-kubernetes-map-type", "") == "atomic") return t;
      const bool has_props = node.contains("properties");
      auto extra = node.find("additionalProperties");
      const bool has_extra = extra != node.end() && (extra->is_object() || *extra == true);
      if (has_props || !(has_extra || node.value("x-kubernetes-preserve-unknown-fields", false)))
        t.shape = Shape::Struct;
      else
        t.shape = Shape::Map;
      return t;
    }
    const std::string list_type = node.value("x-kubernetes-list-type", "atomic");
    if (list_type == "set") {
      t.shape = Shape::ListSet;
    } else if (list_type == "map") {
      t.shape = Shape::ListMap;
      for (const Json& key : node.value("x-kubernetes-list-map-keys", Json::array()))
        if (key.is_string()) t.keys.push_back(key.get<std::string>());
      auto items = node.find("items");
      if (items != node.end() && items->is_object() && items->contains("properties")) {
        const Json& props = (*items)["properties"];
        for (const std::string& key : t.keys) {
          if (props.contains(key) && props[key].is_object() && props[key].contains("default"))
            t.key_defaults[key] = props[key]["default"];
        }
      }
      if (t.keys.empty()) t.shape = Shape::Leaf;
    }
    return t;
  }

  std::string kind_;
  const Json* schema_;
};

// A list item's path element (listItemToPathElement); nullopt with `error` set when it has none.
std::optional<std::string> element_of(const Json& item, const Type& list, std::string* error) {
  if (list.shape == Shape::ListMap) {
    if (item.is_null()) {
      *error = "associative list with keys may not have a null element";
      return std::nullopt;
    }
    if (!item.is_object()) {
      *error = "associative list with keys may not have non-map elements";
      return std::nullopt;
    }
    Json key = Json::object();
    for (const std::string& field : list.keys) {
      if (item.contains(field))
        key[field] = item[field];
      else if (list.key_defaults.contains(field))
        key[field] = list.key_defaults[field];
    }
    if (key.empty()) {
      *error = "associative list with keys has an element that omits all key fields " +
               go_json(list.keys) + " (and doesn't have default values for any key fields)";
      return std::nullopt;
    }
    return "k:" + go_json(key);
  }
  if (item.is_object())
    *error = "associative list without keys has an element that's a map type";
  else if (item.is_array())
    *error = "not supported: associative list with lists as elements";
  else if (item.is_null())
    *error = "associative list without keys has an element that's an explicit null";
  else
    return "v:" + go_json(item);
  return std::nullopt;
}

// The path elements of a list's items, in order. An item that has none (only in a live object
// written around apply) is addressed by its index, so that it is kept as it is.
std::vector<std::string> elements_of(const Json& list, const Type& type) {
  std::vector<std::string> out;
  std::string error;
  for (size_t i = 0; i < list.size(); ++i)
    out.push_back(element_of(list[i], type, &error).value_or("i:" + std::to_string(i)));
  return out;
}

// ---- The walks -------------------------------------------------------------------------------

bool is_granular_object(Shape s) {
  return s == Shape::Struct || s == Shape::Map;
}
bool is_keyed_list(Shape s) {
  return s == Shape::ListMap || s == Shape::ListSet;
}

// Errors as structured-merge-diff's validation reports an applied config it cannot type:
// ".spec.containers: element 0: ..." and ".spec.containers: duplicate entries for key [...]".
void validate_config(const Json& v, const Pos& at, const Types& types, Path& path,
                     std::vector<std::string>& errors) {
  const Type t = types.of(at, v);
  if (is_granular_object(t.shape)) {
    for (const auto& [name, child] : v.items()) {
      path.push_back("f:" + name);
      validate_config(child, types.field(at, name), types, path, errors);
      path.pop_back();
    }
  } else if (is_keyed_list(t.shape)) {
    std::set<std::string> seen;
    for (size_t i = 0; i < v.size(); ++i) {
      std::string error;
      const auto element = element_of(v[i], t, &error);
      if (!element) {
        errors.push_back(path_string(path) + ": element " + std::to_string(i) + ": " + error);
        continue;
      }
      if (!seen.insert(*element).second) {
        errors.push_back(path_string(path) + ": duplicate entries for key " +
                         element_string(*element));
        continue;
      }
      path.push_back(*element);
      validate_config(v[i], types.item(at), types, path, errors);
      path.pop_back();
    }
  }
}

// The fields a config sets (TypedValue.ToFieldSet).
void collect_fields(const Json& v, const Pos& at, const Types& types, Path& path, FieldSet& out) {
  const Type t = types.of(at, v);
  if (t.shape == Shape::Leaf) {
    if (!path.empty()) out.insert(path);
    return;
  }
  if (is_granular_object(t.shape)) {
    for (const auto& [name, child] : v.items()) {
      path.push_back("f:" + name);
      collect_fields(child, types.field(at, name), types, path, out);
      if (t.shape == Shape::Map || child.is_null() || (child.is_object() && child.empty()))
        out.insert(path);
      path.pop_back();
    }
    return;
  }
  const std::vector<std::string> elements = elements_of(v, t);
  for (size_t i = 0; i < v.size(); ++i) {
    path.push_back(elements[i]);
    collect_fields(v[i], types.item(at), types, path, out);
    out.insert(path);
    path.pop_back();
  }
}

// The config merged over the live value (TypedValue.Merge): the config wins on leaves, granular
// objects merge per key (a null removes the key), keyed lists per item in the order
// structured-merge-diff gives them: shared items in the config's order, live-only items where
// they were.
Json merge_value(const Json* live, const Json& config, const Pos& at, const Types& types) {
  const Type t = types.of(at, config);
  if (t.shape == Shape::Leaf) return config;
  if (is_granular_object(t.shape)) {
    Json out = live && live->is_object() ? *live : Json::object();
    for (const auto& [name, child] : config.items()) {
      if (child.is_null()) {
        out.erase(name);
        continue;
      }
      const Json* live_child = out.contains(name) ? &out[name] : nullptr;
      Json merged = merge_value(live_child, child, types.field(at, name), types);
      out[name] = std::move(merged);
    }
    return out;
  }
  const Pos item_at = types.item(at);
  Json out = Json::array();
  if (!live || !live->is_array()) {
    for (const Json& item : config) out.push_back(merge_value(nullptr, item, item_at, types));
    return out;
  }
  const std::vector<std::string> lhs = elements_of(*live, t);
  const std::vector<std::string> rhs = elements_of(config, t);
  std::map<std::string, size_t> live_index, config_index;
  for (size_t i = 0; i < lhs.size(); ++i) live_index.emplace(lhs[i], i);
  for (size_t j = 0; j < rhs.size(); ++j) config_index.emplace(rhs[j], j);
  std::vector<std::string> shared;  // in the config's order
  for (const std::string& e : rhs)
    if (live_index.count(e)) shared.push_back(e);
  size_t next_shared = 0;
  std::set<std::string> emitted;
  auto take_config = [&](size_t j) {
    auto l = live_index.find(rhs[j]);
    out.push_back(merge_value(l == live_index.end() ? nullptr : &(*live)[l->second], config[j],
                              item_at, types));
    emitted.insert(rhs[j]);
    if (next_shared < shared.size() && shared[next_shared] == rhs[j]) ++next_shared;
  };
  size_t i = 0, j = 0;
  while (i < lhs.size() || j < rhs.size()) {
    if (i < lhs.size() && j < rhs.size()) {
      if (lhs[i] == rhs[j]) {
        take_config(j);
        ++i, ++j;
        continue;
      }
      // A shared item the config puts later: it comes with the config's order.
      if (config_index.count(lhs[i]) && next_shared < shared.size() &&
          shared[next_shared] != lhs[i]) {
        ++i;
        continue;
      }
    }
    if (i < lhs.size()) {
      if (!config_index.count(lhs[i])) {
        out.push_back((*live)[i]);
        ++i;
        continue;
      }
      if (emitted.count(lhs[i])) ++i;
    }
    if (j < rhs.size()) {
      take_config(j);
      ++j;
    }
  }
  return out;
}

struct Comparison {
  FieldSet added, modified, removed;
};

bool same_category(const Json& a, const Json& b) {
  return a.is_object() == b.is_object() && a.is_array() == b.is_array();
}

bool empty_or_absent(const Json* v) {
  return !v || ((v->is_object() || v->is_array()) && v->empty());
}

// TypedValue.Compare: leaves added, modified or removed, plus every object, map entry and list
// item that appears or disappears as a whole.
void compare_values(const Json* lhs, const Json* rhs, const Pos& at, const Types& types, Path& path,
                    Comparison& out) {
  const Json& v = rhs ? *rhs : *lhs;
  const Type t = types.of(at, v);
  const bool leaf = t.shape == Shape::Leaf || (lhs && rhs && !same_category(*lhs, *rhs)) ||
                    (empty_or_absent(lhs) && empty_or_absent(rhs));
  if (leaf) {
    if (path.empty()) return;
    if (!lhs)
      out.added.insert(path);
    else if (!rhs)
      out.removed.insert(path);
    else if (*lhs != *rhs)
      out.modified.insert(path);
    return;
  }
  if (is_granular_object(t.shape)) {
    std::set<std::string> names;
    if (lhs)
      for (const auto& [name, _] : lhs->items()) names.insert(name);
    if (rhs)
      for (const auto& [name, _] : rhs->items()) names.insert(name);
    for (const std::string& name : names) {
      const Json* l = lhs && lhs->contains(name) ? &(*lhs)[name] : nullptr;
      const Json* r = rhs && rhs->contains(name) ? &(*rhs)[name] : nullptr;
      path.push_back("f:" + name);
      compare_values(l, r, types.field(at, name), types, path, out);
      path.pop_back();
    }
  } else {
    std::map<std::string, const Json*> left, right;
    std::vector<std::string> order;
    if (lhs) {
      const auto elements = elements_of(*lhs, t);
      for (size_t i = 0; i < elements.size(); ++i)
        if (left.emplace(elements[i], &(*lhs)[i]).second) order.push_back(elements[i]);
    }
    if (rhs) {
      const auto elements = elements_of(*rhs, t);
      for (size_t i = 0; i < elements.size(); ++i)
        if (right.emplace(elements[i], &(*rhs)[i]).second && !left.count(elements[i]))
          order.push_back(elements[i]);
    }
    const Pos item_at = types.item(at);
    for (const std::string& element : order) {
      auto l = left.find(element);
      auto r = right.find(element);
      path.push_back(element);
      compare_values(l == left.end() ? nullptr : l->second, r == right.end() ? nullptr : r->second,
                     item_at, types, path, out);
      path.pop_back();
    }
  }
  if (path.empty()) return;
  if (!lhs)
    out.added.insert(path);
  else if (!rhs)
    out.removed.insert(path);
}

// A path the set holds once named fields with owned children count as owned themselves
// (fieldpath.Set.EnsureNamedFieldsAreMembers; list items and set values do not).
bool holds(const FieldSet* node, const std::string& element) {
  return node && (node->member || (element[0] == 'f' && !node->children.empty()));
}

// Removes what the applier owned last time and no longer applies, unless someone owns it now
// (merge.Updater.prune with addBackOwnedItems and addBackDanglingItems). An object or list
// emptied by this goes too (RemoveItems leaves it null, which the API server drops).
void prune_value(Json& v, const Pos& at, const Types& types, const FieldSet& last,
                 const FieldSet* managed) {
  const Type t = types.of(at, v);
  if (is_granular_object(t.shape)) {
    for (const auto& [element, last_node] : last.children) {
      if (element[0] != 'f') continue;
      const std::string name = element.substr(2);
      if (!v.contains(name)) continue;
      const FieldSet* managed_node = managed ? managed->child(element) : nullptr;
      if (holds(&last_node, element) && !holds(managed_node, element)) {
        v.erase(name);
        continue;
      }
      if (last_node.children.empty()) continue;
      Json& child = v[name];
      const bool had_content = (child.is_object() || child.is_array()) && !child.empty();
      prune_value(child, types.field(at, name), types, last_node, managed_node);
      if (had_content && child.empty()) v.erase(name);
    }
  } else if (is_keyed_list(t.shape)) {
    const std::vector<std::string> elements = elements_of(v, t);
    const Pos item_at = types.item(at);
    Json kept = Json::array();
    for (size_t i = 0; i < v.size(); ++i) {
      const FieldSet* last_node = last.child(elements[i]);
      if (last_node) {
        const FieldSet* managed_node = managed ? managed->child(elements[i]) : nullptr;
        if (holds(last_node, elements[i]) && !holds(managed_node, elements[i])) continue;
        if (!last_node->children.empty())
          prune_value(v[i], item_at, types, *last_node, managed_node);
      }
      kept.push_back(std::move(v[i]));
    }
    v = std::move(kept);
  }
}

void erase_dotted(Json& object, const std::string& dotted) {
  Json* node = &object;
  size_t start = 0;
  while (node->is_object()) {
    const size_t dot = dotted.find('.', start);
    const std::string name = dotted.substr(start, dot == std::string::npos ? dot : dot - start);
    if (dot == std::string::npos) {
      node->erase(name);
      return;
    }
    auto it = node->find(name);
    if (it == node->end()) return;
    node = &*it;
    start = dot + 1;
  }
}

bool deeper_than(const Json& v, int limit) {
  if (!(v.is_object() || v.is_array())) return false;
  if (limit == 0) return true;
  for (const Json& child : v)
    if (deeper_than(child, limit - 1)) return true;
  return false;
}

// ---- Managers --------------------------------------------------------------------------------

struct Manager {
  std::string name;
  bool applied = false;  // "Apply" (else "Update")
  std::string api_version;
  std::string subresource;
  std::string time;  // RFC 3339, "" when the entry has none
  FieldSet fields;
};

// Keyed by the API server's manager identifier (BuildManagerIdentifier: the entry as JSON without
// fields and time, and without apiVersion for appliers), whose sorted order the conflict message
// follows.
using Managers = std::map<std::string, Manager>;

std::string identity(const std::string& name, bool applied, const std::string& api_version,
                     const std::string& subresource) {
  std::string out =
      "{\"manager\":" + go_json(name) + ",\"operation\":\"" + (applied ? "Apply" : "Update") + "\"";
  if (!applied) out += ",\"apiVersion\":" + go_json(api_version);
  if (!subresource.empty()) out += ",\"subresource\":" + go_json(subresource);
  return out + "}";
}

std::string identity(const Manager& m) {
  return identity(m.name, m.applied, m.api_version, m.subresource);
}

std::string string_at(const Json& object, const char* key) {
  if (!object.is_object()) return "";
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

// DecodeManagedFields, leniently: an entry the API server could not decode is left out.
Managers decode_managers(const Json& entries) {
  Managers out;
  if (!entries.is_array()) return out;
  for (const Json& entry : entries) {
    const std::string operation = string_at(entry, "operation");
    Manager m;
    m.name = string_at(entry, "manager");
    m.applied = operation == "Apply";
    m.api_version = string_at(entry, "apiVersion");
    m.subresource = string_at(entry, "subresource");
    m.time = string_at(entry, "time");
    if ((operation != "Apply" && operation != "Update") || m.api_version.empty() ||
        string_at(entry, "fieldsType") != "FieldsV1")
      continue;
    if (entry.contains("fieldsV1")) m.fields = from_fields_v1(entry["fieldsV1"]);
    out[identity(m)] = std::move(m);
  }
  return out;
}

// encodeManagedFields with sortEncodedManagedFields' order: Apply before Update, then by time,
// manager, apiVersion, subresource.
Json encode_managers(const Managers& managers) {
  std::vector<const Manager*> sorted;
  for (const auto& [_, m] : managers) sorted.push_back(&m);
  std::stable_sort(sorted.begin(), sorted.end(), [](const Manager* p, const Manager* q) {
    return std::make_tuple(!p->applied, p->time, p->name, p->api_version, p->subresource) <
           std::make_tuple(!q->applied, q->time, q->name, q->api_version, q->subresource);
  });
  Json out = Json::array();
  for (const Manager* m : sorted) {
    Json entry = {{"manager", m->name},
                  {"operation", m->applied ? "Apply" : "Update"},
                  {"apiVersion", m->api_version},
                  {"fieldsType", "FieldsV1"},
                  {"fieldsV1", to_fields_v1(m->fields)}};
    if (!m->time.empty()) entry["time"] = m->time;
    if (!m->subresource.empty()) entry["subresource"] = m->subresource;
    out.push_back(std::move(entry));
  }
  return out;
}

void store_managers(Json& object, const Managers& managers) {
  if (!object.contains("metadata") || !object["metadata"].is_object())
    object["metadata"] = Json::object();
  if (managers.empty())
    object["metadata"].erase("managedFields");
  else
    object["metadata"]["managedFields"] = encode_managers(managers);
}

std::string describe(const Manager& m) {
  std::string out = quoted(m.name);
  if (!m.subresource.empty()) out += " with subresource " + quoted(m.subresource);
  if (!m.applied) out += " using " + m.api_version;
  return out;
}

// ---- Shared steps ----------------------------------------------------------------------------

const Json* managed_fields_of(const Json& object) {
  if (!object.is_object() || !object.contains("metadata")) return nullptr;
  const Json& meta = object["metadata"];
  if (!meta.is_object() || !meta.contains("managedFields")) return nullptr;
  return &meta["managedFields"];
}

Json without_managed_fields(Json object) {
  if (object.is_object() && object.contains("metadata") && object["metadata"].is_object())
    object["metadata"].erase("managedFields");
  return object;
}

// What a create starts from: the API server's New() of the kind. A built-in's zero value has its
// top-level structs, so they are not "added" by the first write; a custom resource's has nothing.
Json empty_object_like(const Json& object, bool builtin) {
  Json out = Json::object();
  if (!builtin) return out;
  out["metadata"] = Json::object();
  for (const char* top : {"spec", "status"})
    if (object.contains(top) && object[top].is_object()) out[top] = Json::object();
  return out;
}

Comparison compare_objects(const Json& old_object, const Json& new_object, const Types& types,
                           const WriteTarget& target) {
  Comparison cmp;
  Path path;
  compare_values(&old_object, &new_object, types.root(), types, path, cmp);
  for (const std::string& reset : target.reset_fields) {
    const Path p = dotted_path(reset);
    remove_subtree(cmp.added, p);
    remove_subtree(cmp.modified, p);
    remove_subtree(cmp.removed, p);
  }
  return cmp;
}

// merge.Updater.update: every manager but `self` owning a field the write changes conflicts;
// without force they are returned (sorted by manager), with force (and always for updates) the
// fields leave them. Removed fields leave everyone but `self`; empty managers go.
std::vector<ApplyConflict> settle_ownership(const Comparison& cmp, Managers& managers,
                                            const std::string& self, bool force) {
  FieldSet changed = cmp.modified;
  unite(changed, cmp.added);
  std::map<std::string, FieldSet> taken;
  for (const auto& [key, m] : managers) {
    if (key == self) continue;
    FieldSet both = intersect(m.fields, changed);
    if (!both.empty()) taken.emplace(key, std::move(both));
  }
  if (!force && !taken.empty()) {
    std::vector<ApplyConflict> conflicts;
    for (const auto& [key, fields] : taken) {
      const Manager& m = managers.at(key);
      Path prefix;
      for_each_member(fields, prefix, [&](const Path& p) {
        conflicts.push_back({m.name, describe(m), path_string(p)});
      });
    }
    return conflicts;
  }
  for (auto it = managers.begin(); it != managers.end();) {
    if (it->first != self) {
      auto t = taken.find(it->first);
      if (t != taken.end()) subtract(it->second.fields, t->second);
      subtract(it->second.fields, cmp.removed);
    }
    it = it->second.fields.empty() ? managers.erase(it) : std::next(it);
  }
  return {};
}

// The ownership of what an object held before anyone applied (skipnonapplied.go).
void add_before_first_apply(const Json& live, const Types& types, const WriteTarget& target,
                            Managers& managers, const std::string& now) {
  const Comparison cmp =
      compare_objects(empty_object_like(live, target.schema == nullptr), live, types, target);
  Manager m;
  m.name = kBeforeFirstApply;
  m.api_version = target.resource.api_version();
  m.subresource = target.subresource;
  m.time = now;
  m.fields = cmp.modified;
  unite(m.fields, cmp.added);
  subtract(m.fields, server_owned_fields());
  if (!m.fields.empty()) managers[identity(m)] = std::move(m);
}

std::string gvk_string(const std::string& api_version, const std::string& kind) {
  // schema.GroupVersionKind.String(): "apps/v1, Kind=Deployment", "/v1, Kind=Pod".
  const std::string gv =
      api_version.find('/') == std::string::npos ? "/" + api_version : api_version;
  return gv + ", Kind=" + kind;
}

}  // namespace

// ---- Public API ------------------------------------------------------------------------------

void check_apply_field_manager(const std::string& manager) {
  const std::string prefix = "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: ";
  if (manager.empty())
    throw ApiError(422, "Invalid", prefix + "Required value: is required for apply patch");
  if (manager.size() > kMaxFieldManagerBytes)
    throw ApiError(422, "Invalid",
                   prefix + "Too long: may not be more than " +
                       std::to_string(kMaxFieldManagerBytes) + " bytes");
  for (size_t i = 0; i < manager.size(); ++i) {
    const unsigned char c = manager[i];
    if (c < 0x20 || c == 0x7f) {
      char rune[16];
      std::snprintf(rune, sizeof(rune), "U+%04X", c);
      throw ApiError(422, "Invalid",
                     prefix + "Invalid value: " + quoted(manager) + ": invalid character " + rune +
                         " (at position " + std::to_string(i) + ")");
    }
  }
}

kube::Object parse_apply_body(const std::string& body) {
  Json object;
  try {
    object = api::yaml_to_json(body, "apply patch");
  } catch (const kt::Error& e) {
    throw ApiError(400, "BadRequest", std::string("error decoding YAML: ") + e.what());
  }
  if (object.is_null()) return Json::object();
  if (!object.is_object()) {
    throw ApiError(400, "BadRequest",
                   std::string("error decoding YAML: json: cannot unmarshal ") +
                       (object.is_array()    ? "array"
                        : object.is_string() ? "string"
                                             : "number") +
                       " into Go value of type map[string]interface {}");
  }
  return object;
}

ApplyResult apply(const kube::Object& live, const kube::Object& applied, const WriteTarget& target,
                  const std::string& manager, bool force,
                  std::chrono::system_clock::time_point now) {
  check_apply_field_manager(manager);
  if (!applied.is_object()) throw ApiError(400, "BadRequest", "error decoding YAML: not an object");
  const std::string api_version = string_at(applied, "apiVersion");
  const std::string kind = string_at(applied, "kind");
  if (api_version != target.resource.api_version() || kind != target.resource.kind)
    throw ApiError(400, "BadRequest", "invalid object type: " + gvk_string(api_version, kind));
  if (const Json* sent = managed_fields_of(applied); sent && !sent->is_null())
    throw ApiError(400, "BadRequest", "metadata.managedFields must be nil");
  const Json meta = applied.value("metadata", Json::object());
  const std::string object_ref = string_at(meta, "namespace") + "/" + string_at(meta, "name") +
                                 "; " + gvk_string(api_version, kind);
  if (deeper_than(applied, kMaxDepth)) {
    throw ApiError(500, "",
                   "failed to create typed patch object (" + object_ref + "): nested more than " +
                       std::to_string(kMaxDepth) + " levels");
  }

  const Types types(target.resource.kind, target.schema);
  Json config = applied;
  for (const std::string& reset : target.reset_fields) erase_dotted(config, reset);
  {
    std::vector<std::string> errors;
    Path path;
    validate_config(config, types.root(), types, path, errors);
    if (!errors.empty()) {
      std::string text = errors.size() == 1 ? errors[0] : "errors:";
      if (errors.size() > 1)
        for (const std::string& e : errors) text += "\n  " + e;
      throw ApiError(500, "", "failed to create typed patch object (" + object_ref + "): " + text);
    }
  }

  const std::string now_text = kube::rfc3339(now);
  ApplyResult result;
  result.created = live.is_null();
  const Json live_object = result.created ? Json::object() : without_managed_fields(live);
  Managers managers;
  if (!result.created) {
    if (const Json* entries = managed_fields_of(live)) managers = decode_managers(*entries);
    if (managers.empty()) add_before_first_apply(live_object, types, target, managers, now_text);
  }

  FieldSet config_fields;
  {
    Path path;
    collect_fields(config, types.root(), types, path, config_fields);
  }
  const std::string self = identity(manager, true, "", target.subresource);
  Manager previous;
  if (auto it = managers.find(self); it != managers.end()) previous = it->second;

  Json merged = merge_value(&live_object, config, types.root(), types);
  if (!previous.fields.empty()) {
    FieldSet managed = config_fields;
    for (const auto& [key, m] : managers)
      if (key != self) unite(managed, m.fields);
    prune_value(merged, types.root(), types, previous.fields, &managed);
  }

  Manager mine = previous;
  mine.name = manager;
  mine.applied = true;
  mine.api_version = target.resource.api_version();
  mine.subresource = target.subresource;
  mine.fields = config_fields;
  managers[self] = std::move(mine);
  result.conflicts =
      settle_ownership(compare_objects(live_object, merged, types, target), managers, self, force);
  if (!result.conflicts.empty()) return result;
  if (auto it = managers.find(self); it != managers.end()) {
    subtract(it->second.fields, server_owned_fields());
    if (it->second.fields.empty()) managers.erase(it);
  }

  result.changed = merged != live_object;
  if (auto it = managers.find(self); it != managers.end() && result.changed)
    it->second.time = now_text;

  Json& merged_meta = merged["metadata"];
  if (!merged_meta.is_object()) merged_meta = Json::object();
  const std::string name = string_at(merged_meta, "name");
  if (name != target.name) {
    throw ApiError(400, "BadRequest",
                   "the name of the object (" + name + ") does not match the name on the URL (" +
                       target.name + ")");
  }
  if (target.resource.namespaced) {
    const std::string ns = string_at(merged_meta, "namespace");
    if (ns.empty()) {
      merged_meta["namespace"] = target.ns;
    } else if (ns != target.ns) {
      throw ApiError(400, "BadRequest",
                     "the namespace of the object (" + ns +
                         ") does not match the namespace on the request (" + target.ns + ")");
    }
  }
  store_managers(merged, managers);
  result.object = std::move(merged);
  return result;
}

kube::Object record_update(const kube::Object& live, kube::Object updated,
                           const WriteTarget& target, const std::string& manager,
                           std::chrono::system_clock::time_point now) {
  const bool creating = live.is_null();
  // decodeLiveOrNew: the request's own managedFields unless on a subresource; [] or [{}] reset.
  Managers managers;
  bool reset = false;
  const Json* sent = target.subresource.empty() ? managed_fields_of(updated) : nullptr;
  if (sent && sent->is_array() &&
      (sent->empty() || (sent->size() == 1 && (*sent)[0] == Json::object()))) {
    reset = true;
  } else if (sent) {
    managers = decode_managers(*sent);
  }
  if (!reset && managers.empty() && !creating) {
    if (const Json* entries = managed_fields_of(live)) managers = decode_managers(*entries);
  }
  updated = without_managed_fields(std::move(updated));
  // An existing object nobody tracks stays untracked (skipnonapplied.go).
  if (!creating && managers.empty()) return updated;

  const Types types(target.resource.kind, target.schema);
  const Json old_object = creating ? empty_object_like(updated, target.schema == nullptr)
                                   : without_managed_fields(live);
  const Comparison cmp = compare_objects(old_object, updated, types, target);
  settle_ownership(cmp, managers, /*self=*/"", /*force=*/true);

  FieldSet written = cmp.modified;
  unite(written, cmp.added);
  subtract(written, server_owned_fields());
  if (!written.empty()) {
    const std::string key =
        identity(manager, false, target.resource.api_version(), target.subresource);
    Manager& m = managers[key];
    m.name = manager;
    m.applied = false;
    m.api_version = target.resource.api_version();
    m.subresource = target.subresource;
    m.time = kube::rfc3339(now);
    unite(m.fields, written);
  }
  store_managers(updated, managers);
  return updated;
}

std::string manager_from_user_agent(const std::string& user_agent) {
  const std::string prefix = user_agent.substr(0, user_agent.find('/'));
  std::string out;
  for (size_t i = 0; i < prefix.size();) {
    const unsigned char c = prefix[i];
    size_t length = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
    length = std::min(length, prefix.size() - i);
    if (c < 0x20 || c == 0x7f) {
      i += length;
      continue;
    }
    if (out.size() + length > kMaxFieldManagerBytes) break;
    out += prefix.substr(i, length);
    i += length;
  }
  return out;
}

std::string conflict_message(const std::vector<ApplyConflict>& conflicts) {
  if (conflicts.size() == 1) {
    return "Apply failed with 1 conflict: conflict with " + conflicts[0].manager_description +
           ": " + conflicts[0].field;
  }
  // Grouped by manager; apply() returns them sorted by manager already.
  std::string text;
  std::string current;
  bool first = true;
  for (const ApplyConflict& c : conflicts) {
    if (first || c.manager_description != current) {
      text += std::string(first ? "" : "\n") + "conflicts with " + c.manager_description + ":";
      current = c.manager_description;
      first = false;
    }
    text += "\n- " + c.field;
  }
  return "Apply failed with " + std::to_string(conflicts.size()) + " conflicts: " + text;
}

kube::ApiError conflict_error(const std::vector<ApplyConflict>& conflicts) {
  return ApiError(409, "Conflict", conflict_message(conflicts));
}

kube::Object conflict_status(const std::vector<ApplyConflict>& conflicts) {
  Json causes = Json::array();
  for (const ApplyConflict& c : conflicts) {
    causes.push_back({{"reason", "FieldManagerConflict"},
                      {"message", "conflict with " + c.manager_description},
                      {"field", c.field}});
  }
  return {{"kind", "Status"},
          {"apiVersion", "v1"},
          {"metadata", Json::object()},
          {"status", "Failure"},
          {"message", conflict_message(conflicts)},
          {"reason", "Conflict"},
          {"details", {{"causes", causes}}},
          {"code", 409}};
}

}  // namespace kt::local

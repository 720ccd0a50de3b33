// Label and field selectors (selectors.h): parsed into requirements, then matched.
#include "operator/kube/selectors.h"

#include <algorithm>
#include <map>
#include <sstream>

namespace kt::kube {

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string cur;
  int depth = 0;  // commas inside "in (a,b)" do not split requirements
  for (char c : s) {
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (c == sep && depth == 0) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  return parts;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

ApiError bad_selector(const std::string& what, const std::string& selector) {
  return ApiError(400, "BadRequest", "unable to parse " + what + " selector \"" + selector + "\"");
}

std::optional<std::string> label_of(const Object& obj, const std::string& key) {
  const auto meta = obj.find("metadata");
  if (meta == obj.end() || !meta->is_object()) return std::nullopt;
  const auto labels = meta->find("labels");
  if (labels == meta->end() || !labels->is_object()) return std::nullopt;
  const auto it = labels->find(key);
  if (it == labels->end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

const std::map<std::string, Object::json_pointer>& supported_fields() {
  static const std::map<std::string, Object::json_pointer> kFields = {
      {"metadata.name", Object::json_pointer("/metadata/name")},
      {"metadata.namespace", Object::json_pointer("/metadata/namespace")},
      {"spec.nodeName", Object::json_pointer("/spec/nodeName")},
      {"status.phase", Object::json_pointer("/status/phase")},
      // Events (kubectl describe asks for an object's events with these) and secrets.
      {"involvedObject.kind", Object::json_pointer("/involvedObject/kind")},
      {"involvedObject.namespace", Object::json_pointer("/involvedObject/namespace")},
      {"involvedObject.name", Object::json_pointer("/involvedObject/name")},
      {"involvedObject.uid", Object::json_pointer("/involvedObject/uid")},
      {"involvedObject.apiVersion", Object::json_pointer("/involvedObject/apiVersion")},
      {"involvedObject.resourceVersion", Object::json_pointer("/involvedObject/resourceVersion")},
      {"involvedObject.fieldPath", Object::json_pointer("/involvedObject/fieldPath")},
      {"reason", Object::json_pointer("/reason")},
      {"reportingComponent", Object::json_pointer("/reportingComponent")},
      {"source", Object::json_pointer("/source/component")},
      {"type", Object::json_pointer("/type")},
  };
  return kFields;
}

}  // namespace

std::vector<LabelRequirement> parse_label_selector(const std::string& selector) {
  using Op = LabelRequirement::Op;
  std::vector<LabelRequirement> out;
  if (trim(selector).empty()) return out;
  for (const std::string& raw : split(selector, ',')) {
    const std::string req = trim(raw);
    if (req.empty()) throw bad_selector("label", selector);
    // Set-based: "key in (a,b)", "key notin (a)".
    const auto paren = req.find('(');
    if (paren != std::string::npos) {
      if (req.back() != ')') throw bad_selector("label", selector);
      std::istringstream head(req.substr(0, paren));
      std::string key, op;
      head >> key >> op;
      if (key.empty() || (op != "in" && op != "notin")) throw bad_selector("label", selector);
      LabelRequirement r{key, op == "in" ? Op::kIn : Op::kNotIn, {}};
      for (const auto& v : split(req.substr(paren + 1, req.size() - paren - 2), ','))
        r.values.push_back(trim(v));
      out.push_back(std::move(r));
      continue;
    }
    // Equality-based: "k=v", "k==v", "k!=v"; existence: "k", "!k".
    const auto ne = req.find("!=");
    const auto eq = req.find('=');
    if (ne != std::string::npos) {
      out.push_back({trim(req.substr(0, ne)), Op::kNotIn, {trim(req.substr(ne + 2))}});
    } else if (eq != std::string::npos) {
      const size_t vstart = req.compare(eq, 2, "==") == 0 ? eq + 2 : eq + 1;
      const std::string key = trim(req.substr(0, eq));
      if (key.empty()) throw bad_selector("label", selector);
      out.push_back({key, Op::kIn, {trim(req.substr(vstart))}});
    } else if (req[0] == '!') {
      out.push_back({trim(req.substr(1)), Op::kDoesNotExist, {}});
    } else {
      if (req.find(' ') != std::string::npos) throw bad_selector("label", selector);
      out.push_back({req, Op::kExists, {}});
    }
  }
  return out;
}

std::vector<FieldRequirement> parse_field_selector(const std::string& selector) {
  std::vector<FieldRequirement> out;
  if (trim(selector).empty()) return out;
  for (const std::string& raw : split(selector, ',')) {
    const std::string req = trim(raw);
    const auto ne = req.find("!=");
    const auto eq = req.find('=');
    if (eq == std::string::npos) throw bad_selector("field", selector);
    const bool negate = ne != std::string::npos;
    const std::string field = trim(req.substr(0, negate ? ne : eq));
    const size_t vstart = negate ? ne + 2 : (req.compare(eq, 2, "==") == 0 ? eq + 2 : eq + 1);
    if (!supported_fields().count(field))
      throw ApiError(400, "BadRequest",
                     "field label not supported: " + field +
                         " (supported: metadata.name, metadata.namespace, spec.nodeName, "
                         "status.phase, involvedObject.*, reason, type, source)");
    out.push_back({field, negate, trim(req.substr(vstart))});
  }
  return out;
}

bool matches(const Object& obj, const std::vector<LabelRequirement>& selector) {
  using Op = LabelRequirement::Op;
  for (const LabelRequirement& r : selector) {
    const auto value = label_of(obj, r.key);
    const bool in =
        value && std::find(r.values.begin(), r.values.end(), *value) != r.values.end();
    switch (r.op) {
      case Op::kIn:
        if (!in) return false;
        break;
      case Op::kNotIn:
        if (in) return false;
        break;
      case Op::kExists:
        if (!value) return false;
        break;
      case Op::kDoesNotExist:
        if (value) return false;
        break;
    }
  }
  return true;
}

std::string field_value(const Object& obj, const std::string& field) {
  const auto it = supported_fields().find(field);
  if (it == supported_fields().end()) return "";
  if (obj.contains(it->second) && obj.at(it->second).is_string())
    return obj.at(it->second).get<std::string>();
  return "";
}

bool matches(const Object& obj, const std::vector<FieldRequirement>& selector) {
  for (const FieldRequirement& r : selector)
    if ((field_value(obj, r.field) == r.value) == r.negate) return false;
  return true;
}

bool matches_label_selector(const Object& obj, const std::string& selector) {
  return matches(obj, parse_label_selector(selector));
}

bool matches_field_selector(const Object& obj, const std::string& selector) {
  return matches(obj, parse_field_selector(selector));
}

std::optional<std::string> required_label_value(const std::vector<LabelRequirement>& selector,
                                                const std::string& key) {
  for (const LabelRequirement& r : selector)
    if (r.key == key && r.op == LabelRequirement::Op::kIn && r.values.size() == 1)
      return r.values[0];
  return std::nullopt;
}

std::optional<std::string> required_field_value(const std::vector<FieldRequirement>& selector,
                                                const std::string& field) {
  for (const FieldRequirement& r : selector)
    if (r.field == field && !r.negate) return r.value;
  return std::nullopt;
}

bool label_selector_implies(const std::vector<LabelRequirement>& narrower,
                            const std::vector<LabelRequirement>& wider) {
  using Op = LabelRequirement::Op;
  for (const LabelRequirement& w : wider) {
    const bool implied = std::any_of(narrower.begin(), narrower.end(), [&](const auto& n) {
      if (n.key != w.key) return false;
      if (n.op == w.op && n.values == w.values) return true;
      return w.op == Op::kExists && n.op == Op::kIn;  // k in (...) implies k exists
    });
    if (!implied) return false;
  }
  return true;
}

}  // namespace kt::kube

#include "local/schema.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string_view>
#include <utility>

// The API server is Go; its messages are Go fmt output. Sources, by the part of this file:
//   messages: k8s.io/kube-openapi pkg/validation/errors/schema.go ("%s in %s should ..."),
//     converted by apiextensions-apiserver pkg/apiserver/validation/validation.go
//     (kubeOpenAPIResultToFieldErrors) into apimachinery pkg/util/validation/field/errors.go
//     (ErrorBody: int/float/bool with %v, strings with %q, anything else as JSON);
//   which checks run for which value, and in which order: kube-openapi validate/schema.go
//     (type, allOf/anyOf/oneOf/not, string, format, number, slice, enum, object) and
//     validate/{type,validator,values,object_validator,slice_validator,schema_props}.go;
//   pruning, null pruning, defaulting, list types: apiextensions-apiserver
//     pkg/apiserver/schema/{pruning,defaulting,listtype}.
namespace kt::local {
namespace {

using Json = nlohmann::json;

// ---- Go's text forms -------------------------------------------------------------------------

// One UTF-8 sequence at s[i]: the rune and its width, or width 1 and ok=false for an invalid byte
// (as Go's utf8.DecodeRuneInString: overlong forms and surrogates are invalid).
struct Rune {
  char32_t value;
  size_t width;
  bool ok;
};

Rune decode_rune(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return {c, 1, true};
  size_t width = 0;
  char32_t r = 0, min = 0;
  if ((c & 0xE0) == 0xC0) {
    width = 2, r = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    width = 3, r = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    width = 4, r = c & 0x07, min = 0x10000;
  } else {
    return {0xFFFD, 1, false};
  }
  if (i + width > s.size()) return {0xFFFD, 1, false};
  for (size_t k = 1; k < width; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return {0xFFFD, 1, false};
    r = (r << 6) | (byte(i + k) & 0x3F);
  }
  if (r < min || r > 0x10FFFF || (r >= 0xD800 && r <= 0xDFFF)) return {0xFFFD, 1, false};
  return {r, width, true};
}

// Go's utf8.RuneCountInString: what minLength/maxLength count (an invalid byte is one rune).
int64_t rune_count(std::string_view s) {
  int64_t n = 0;
  for (size_t i = 0; i < s.size(); i += decode_rune(s, i).width) ++n;
  return n;
}

// unicode.IsPrint for non-ASCII runes, approximately: the separators, controls, format characters
// and private-use runes that strconv.Quote escapes.
bool is_print(char32_t r) {
  if (r <= 0xA0 || r == 0xAD || r == 0x1680 || r == 0x3000 || r == 0xFEFF) return false;
  if ((r >= 0x2000 && r <= 0x200F) || (r >= 0x2028 && r <= 0x202F) ||
      (r >= 0x205F && r <= 0x206F) || (r >= 0xE000 && r <= 0xF8FF) ||
      (r >= 0xFFF9 && r <= 0xFFFB) || r == 0xFFFE || r == 0xFFFF)
    return false;
  return true;
}

void append_hex(std::string& out, uint32_t v, int digits) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (int shift = (digits - 1) * 4; shift >= 0; shift -= 4) out += kHex[(v >> shift) & 0xF];
}

// strconv.Quote (what %q prints).
std::string go_quote(std::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const Rune r = decode_rune(s, i);
    if (!r.ok) {
      out += "\\x";
      append_hex(out, static_cast<unsigned char>(s[i]), 2);
    } else if (r.value < 0x80) {
      switch (r.value) {
        case '\a':
          out += "\\a";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\v':
          out += "\\v";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '"':
          out += "\\\"";
          break;
        default:
          if (r.value < 0x20 || r.value == 0x7F) {
            out += "\\x";
            append_hex(out, r.value, 2);
          } else {
            out += static_cast<char>(r.value);
          }
      }
    } else if (is_print(r.value)) {
      out.append(s.substr(i, r.width));
    } else if (r.value < 0x10000) {
      out += "\\u";
      append_hex(out, r.value, 4);
    } else {
      out += "\\U";
      append_hex(out, r.value, 8);
    }
    i += r.width;
  }
  return out + "\"";
}

// The shortest digits that read back as v (v finite, not zero): v = 0.DIGITS × 10^point.
struct Decimal {
  bool negative = false;
  std::string digits;
  int point = 0;
};

Decimal shortest_decimal(double v) {
  char buf[64];
  const auto end = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific).ptr;
  const std::string_view text(buf, end - buf);  // "-1.2345e+06"
  Decimal d;
  size_t i = 0;
  if (text[i] == '-') d.negative = true, ++i;
  const size_t e = text.find('e');
  for (; i < e; ++i)
    if (text[i] != '.') d.digits += text[i];
  while (d.digits.size() > 1 && d.digits.back() == '0') d.digits.pop_back();
  int exponent = 0;
  std::from_chars(text.data() + e + (text[e + 1] == '+' ? 2 : 1), text.data() + text.size(),
                  exponent);
  d.point = exponent + 1;
  return d;
}

// strconv.FormatFloat(v, 'e', -1, 64): "1.5e-07", "1e+21".
std::string exponent_form(const Decimal& d) {
  std::string out = d.negative ? "-" : "";
  out += d.digits[0];
  if (d.digits.size() > 1) out += "." + d.digits.substr(1);
  const int exponent = d.point - 1;
  out += exponent < 0 ? "e-" : "e+";
  const std::string digits = std::to_string(std::abs(exponent));
  return out + (digits.size() < 2 ? "0" : "") + digits;
}

// strconv.FormatFloat(v, 'f', -1, 64): "0.0006", "123456".
std::string fixed_form(const Decimal& d) {
  std::string out = d.negative ? "-" : "";
  const int n = static_cast<int>(d.digits.size());
  if (d.point <= 0) {
    out += "0";
  } else {
    for (int k = 0; k < d.point; ++k) out += k < n ? d.digits[k] : '0';
  }
  if (n > d.point) {
    out += ".";
    for (int k = d.point; k < n; ++k) out += k < 0 ? '0' : d.digits[k];
  }
  return out;
}

// fmt's %v of a float64 (%g, shortest): exponent form below 1e-4 and from 1e+06 up.
std::string go_float(double v) {
  if (v == 0) return std::signbit(v) ? "-0" : "0";
  if (!std::isfinite(v)) return std::isnan(v) ? "NaN" : (v > 0 ? "+Inf" : "-Inf");
  const Decimal d = shortest_decimal(v);
  const int exponent = d.point - 1;
  return exponent < -4 || exponent >= 6 ? exponent_form(d) : fixed_form(d);
}

// encoding/json's float64: fixed form unless below 1e-6 or from 1e21 up, "e-07" written "e-7".
std::string go_json_float(double v) {
  if (v == 0) return std::signbit(v) ? "-0" : "0";
  if (!std::isfinite(v)) return "null";  // not reachable from parsed JSON
  const Decimal d = shortest_decimal(v);
  const double a = std::fabs(v);
  if (a >= 1e-6 && a < 1e21) return fixed_form(d);
  std::string out = exponent_form(d);
  const size_t n = out.size();
  if (n >= 4 && out[n - 4] == 'e' && out[n - 3] == '-' && out[n - 2] == '0') out.erase(n - 2, 1);
  return out;
}

// encoding/json's string, with its default HTML escaping.
void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const Rune r = decode_rune(s, i);
    if (!r.ok) {
      out += "\\ufffd";
    } else if (r.value == '"' || r.value == '\\') {
      out += '\\';
      out += static_cast<char>(r.value);
    } else if (r.value == '\n') {
      out += "\\n";
    } else if (r.value == '\r') {
      out += "\\r";
    } else if (r.value == '\t') {
      out += "\\t";
    } else if (r.value == '\b') {
      out += "\\b";
    } else if (r.value == '\f') {
      out += "\\f";
    } else if (r.value < 0x20 || r.value == '<' || r.value == '>' || r.value == '&' ||
               r.value == 0x2028 || r.value == 0x2029) {
      out += "\\u";
      append_hex(out, r.value, 4);
    } else {
      out.append(s.substr(i, r.width));
    }
    i += r.width;
  }
  out += '"';
}

bool is_int64(const Json& v) {
  return v.is_number_integer() &&
         (!v.is_number_unsigned() ||
          v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
}

// json.Marshal of a decoded value (Go decodes an integer beyond int64 as a float64). Objects print
// with sorted keys, as Go sorts map keys and nlohmann keeps them sorted. Deeper than
// kMaxSchemaDepth prints "..." (Go has no such limit; nothing here recurses without one).
void append_json(std::string& out, const Json& v, int depth) {
  if (depth > kMaxSchemaDepth) {
    out += "...";
    return;
  }
  switch (v.type()) {
    case Json::value_t::null:
      out += "null";
      break;
    case Json::value_t::boolean:
      out += v.get<bool>() ? "true" : "false";
      break;
    case Json::value_t::number_integer:
      out += std::to_string(v.get<int64_t>());
      break;
    case Json::value_t::number_unsigned:
      out += is_int64(v) ? std::to_string(v.get<uint64_t>())
                         : go_json_float(static_cast<double>(v.get<uint64_t>()));
      break;
    case Json::value_t::number_float:
      out += go_json_float(v.get<double>());
      break;
    case Json::value_t::string:
      append_json_string(out, v.get_ref<const std::string&>());
      break;
    case Json::value_t::array: {
      out += '[';
      bool first = true;
      for (const auto& item : v) {
        if (!first) out += ',';
        first = false;
        append_json(out, item, depth + 1);
      }
      out += ']';
      break;
    }
    case Json::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, item] : v.items()) {
        if (!first) out += ',';
        first = false;
        append_json_string(out, key);
        out += ':';
        append_json(out, item, depth + 1);
      }
      out += '}';
      break;
    }
    default:
      out += "null";
  }
}

std::string go_json(const Json& v) {
  std::string out;
  append_json(out, v, 0);
  return out;
}

// A field.Error's BadValue as ErrorBody prints it.
std::string bad_value(const Json& v) {
  if (is_int64(v)) return std::to_string(v.get<int64_t>());
  if (v.is_number()) return go_float(v.get<double>());
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_string()) return go_quote(v.get_ref<const std::string&>());
  return go_json(v);
}

// ---- field.Error constructors (apimachinery validation/field) -------------------------------

FieldError required_error(const std::string& field) {
  return {"FieldValueRequired", field, "Required value"};
}
FieldError invalid_error(const std::string& field, const std::string& bad,
                         const std::string& detail, const char* type = "FieldValueInvalid") {
  return {type, field, "Invalid value: " + bad + (detail.empty() ? "" : ": " + detail)};
}
FieldError not_supported_error(const std::string& field, const std::string& bad,
                               const std::vector<std::string>& values) {
  std::string body = "Unsupported value: " + bad;
  for (size_t i = 0; i < values.size(); ++i)
    body += (i == 0 ? ": supported values: " : ", ") + go_quote(values[i]);
  return {"FieldValueNotSupported", field, body};
}
FieldError too_long_error(const std::string& field, int64_t max_bytes) {
  return {"FieldValueTooLong", field,
          "Too long: may not be more than " + std::to_string(max_bytes) +
              (max_bytes == 1 ? " byte" : " bytes")};
}
FieldError too_many_error(const std::string& field, int64_t actual, int64_t max_items) {
  return {"FieldValueTooMany", field,
          "Too many: " + std::to_string(actual) + ": must have at most " +
              std::to_string(max_items) + (max_items == 1 ? " item" : " items")};
}
FieldError duplicate_error(const std::string& field, const std::string& bad) {
  return {"FieldValueDuplicate", field, "Duplicate value: " + bad};
}
FieldError forbidden_error(const std::string& field, const std::string& detail) {
  return {"FieldValueForbidden", field, "Forbidden: " + detail};
}

// kube-openapi names a value by a dotted path ("" at the root, "spec.model", ".key" for a map
// value at the root); apiextensions makes it a field.Path with the leading dot trimmed, and
// field.Path prints a nil path as "<nil>".
std::string field_of(const std::string& name) {
  if (name.empty() || name == ".") return "<nil>";
  return name[0] == '.' ? name.substr(1) : name;
}
std::string property_path(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}
std::string index_path(const std::string& path, size_t i) {
  return path + "[" + std::to_string(i) + "]";
}

// ---- Schema keywords ------------------------------------------------------------------------

const Json* member(const Json& s, const char* key) {
  if (!s.is_object()) return nullptr;
  const auto it = s.find(key);
  return it == s.end() ? nullptr : &*it;
}
bool is_true(const Json& s, const char* key) {
  const Json* m = member(s, key);
  return m && m->is_boolean() && m->get<bool>();
}
std::optional<double> number_keyword(const Json& s, const char* key) {
  const Json* m = member(s, key);
  if (!m || !m->is_number()) return std::nullopt;
  return m->get<double>();
}
std::optional<int64_t> count_keyword(const Json& s, const char* key) {
  const Json* m = member(s, key);
  if (!m || !m->is_number()) return std::nullopt;
  if (is_int64(*m)) return m->get<int64_t>();
  const double d = m->get<double>();
  if (!std::isfinite(d) || d != std::trunc(d) || std::fabs(d) > 9e18) return std::nullopt;
  return static_cast<int64_t>(d);
}
const Json* property_schema(const Json& s, const std::string& key) {
  const Json* props = member(s, "properties");
  if (!props || !props->is_object()) return nullptr;
  const auto it = props->find(key);
  return it == props->end() || !it->is_object() ? nullptr : &*it;
}
const Json* items_schema(const Json& s) {
  const Json* items = member(s, "items");
  return items && items->is_object() ? items : nullptr;
}
// additionalProperties: absent; a schema; or true/false (no schema).
struct Additional {
  bool present = false;
  const Json* schema = nullptr;
  bool allows = true;
};
Additional additional_properties(const Json& s) {
  const Json* m = member(s, "additionalProperties");
  if (m && m->is_object()) return {true, m, true};
  if (m && m->is_boolean()) return {true, nullptr, m->get<bool>()};
  return {};
}
const Json* field_schema(const Json& s, const std::string& key) {
  if (const Json* p = property_schema(s, key)) return p;
  return additional_properties(s).schema;
}
// The types a value may have: x-kubernetes-int-or-string is "integer" or "string" (apiextensions
// ConvertJSONSchemaPropsWithPostProcess), no type is any type.
std::vector<std::string> types_of(const Json& s) {
  if (is_true(s, "x-kubernetes-int-or-string")) return {"integer", "string"};
  const Json* t = member(s, "type");
  if (t && t->is_string() && !t->get_ref<const std::string&>().empty())
    return {t->get<std::string>()};
  return {};
}
bool has_type(const std::vector<std::string>& types, std::string_view t) {
  return std::find(types.begin(), types.end(), t) != types.end();
}
bool has_default(const Json& s) {
  const Json* d = member(s, "default");
  return d && !d->is_null();
}
bool is_meta_field(const std::string& key) {
  return key == "apiVersion" || key == "kind" || key == "metadata";
}
// The formats checked here (the API server checks a few more; unsupported ones it strips).
std::string checked_format(const Json& s) {
  const Json* f = member(s, "format");
  if (!f || !f->is_string()) return "";
  const std::string& name = f->get_ref<const std::string&>();
  return name == "date-time" || name == "datetime" || name == "date" ? name : "";
}

// ---- Values ---------------------------------------------------------------------------------

enum class Kind { kNull, kBoolean, kInteger, kNumber, kString, kArray, kObject };

Kind kind_of(const Json& v) {
  switch (v.type()) {
    case Json::value_t::boolean:
      return Kind::kBoolean;
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return is_int64(v) ? Kind::kInteger : Kind::kNumber;
    case Json::value_t::number_float:
      return Kind::kNumber;
    case Json::value_t::string:
      return Kind::kString;
    case Json::value_t::array:
      return Kind::kArray;
    case Json::value_t::object:
      return Kind::kObject;
    default:
      return Kind::kNull;
  }
}

const char* type_name(Kind k) {
  switch (k) {
    case Kind::kNull:
      return "null";
    case Kind::kBoolean:
      return "boolean";
    case Kind::kInteger:
      return "integer";
    case Kind::kNumber:
      return "number";
    case Kind::kString:
      return "string";
    case Kind::kArray:
      return "array";
    case Kind::kObject:
      return "object";
  }
  return "";
}

// The Go format name kube-openapi gives a decoded value (int64, float64; "" for the others).
const char* go_format_name(Kind k) {
  return k == Kind::kInteger ? "int64" : k == Kind::kNumber ? "float64" : "";
}

// go-openapi swag.IsFloat64AJSONInteger: integral within 2^53, to a relative 1e-9.
bool is_json_integer(double f) {
  constexpr double kMaxJsonFloat = 9007199254740991.0;  // 2^53 - 1
  if (!std::isfinite(f) || f < -kMaxJsonFloat || f > kMaxJsonFloat) return false;
  const double rounded = std::round(f);
  if (f == rounded) return true;
  if (rounded == 0) return false;
  return std::fabs(f - rounded) < 1e-9 * std::fabs(rounded);
}

bool fits_int64(double d) {
  return std::isfinite(d) && d == std::trunc(d) && std::fabs(d) < 9e18;
}

// Whether v has containers nested deeper than `limit` levels, without recursion.
bool deeper_than(const Json& v, int limit) {
  std::vector<std::pair<const Json*, int>> stack{{&v, 0}};
  while (!stack.empty()) {
    const auto [node, depth] = stack.back();
    stack.pop_back();
    if (!node->is_structured()) continue;
    if (depth >= limit) return true;
    for (const auto& child : *node) stack.push_back({&child, depth + 1});
  }
  return false;
}

// A key under which equal values (as the API server compares them) collide: scalars by Go type
// and value (int64 1 and float64 1 differ), compounds by their JSON. nullopt for values too deep to
// compare without recursing past the bound.
std::optional<std::string> identity_key(const Json& v) {
  switch (kind_of(v)) {
    case Kind::kNull:
      return "n";
    case Kind::kBoolean:
      return v.get<bool>() ? "b1" : "b0";
    case Kind::kInteger:
      return "i" + std::to_string(v.get<int64_t>());
    case Kind::kNumber:
      return "f" + go_json(v);
    case Kind::kString:
      return "s" + v.get<std::string>();
    default:
      if (deeper_than(v, kMaxSchemaDepth)) return std::nullopt;
      return "c" + go_json(v);
  }
}

// Enum membership: reflect.DeepEqual after converting to the enum value's type, so that numbers
// compare by value; compounds compare by their JSON.
bool enum_matches(const Json& v, const Json& candidate) {
  if (v.is_number() && candidate.is_number()) {
    if (is_int64(v) && is_int64(candidate)) return v.get<int64_t>() == candidate.get<int64_t>();
    return v.get<double>() == candidate.get<double>();
  }
  if (v.type() != candidate.type()) return false;
  if (v.is_string())
    return v.get_ref<const std::string&>() == candidate.get_ref<const std::string&>();
  if (v.is_boolean()) return v.get<bool>() == candidate.get<bool>();
  const auto a = identity_key(v), b = identity_key(candidate);
  return a && b && *a == *b;
}

// ---- The walk -------------------------------------------------------------------------------

// A compiled pattern, or why it does not compile; compiled once per apply_structural_schema.
struct Pattern {
  std::optional<std::regex> regex;
  std::string error;
};
using PatternCache = std::map<std::string, Pattern>;

// Errors of one validation (a whole object, or one allOf/anyOf/oneOf/not branch).
struct Walk {
  PatternCache* patterns;
  std::vector<FieldError> errors;
  bool overflow = false;
  std::set<std::string> too_deep_fields;

  void add(FieldError e) {
    if (errors.size() < kMaxSchemaErrors) {
      errors.push_back(std::move(e));
    } else {
      overflow = true;
    }
  }
  void add_all(const Walk& other) {
    for (const auto& e : other.errors) add(e);
    overflow = overflow || other.overflow;
  }
  // One error per place where the walk stops descending.
  void too_deep(const std::string& field) {
    if (too_deep_fields.insert(field).second)
      add(forbidden_error(field,
                          "nested more than " + std::to_string(kMaxSchemaDepth) + " levels deep"));
  }
  bool ok() const { return errors.empty() && !overflow; }
};

// -- 1. unknown fields (pruning/algorithm.go) --

class Pruner {
 public:
  Pruner(Walk& walk, bool remove, std::vector<std::string>& unknown)
      : walk_(walk), remove_(remove), unknown_(unknown) {}

  // `root`: the resource root, where apiVersion/kind/metadata are kept as in an embedded resource.
  void prune(Json& x, const Json* s, const std::string& path, int depth, bool root) {
    if (x.is_structured() && depth > kMaxSchemaDepth) {
      walk_.too_deep(field_of(path));
      return;
    }
    if (s && is_true(*s, "x-kubernetes-preserve-unknown-fields")) {
      skip_prune(x, *s, path, depth);
      return;
    }
    if (x.is_object()) {
      std::vector<std::string> unknown_keys;
      const bool embedded = root || (s && is_true(*s, "x-kubernetes-embedded-resource"));
      const Additional additional = s ? additional_properties(*s) : Additional{};
      for (auto& [key, value] : x.items()) {
        if (s && embedded && is_meta_field(key)) continue;
        if (const Json* p = s ? property_schema(*s, key) : nullptr) {
          prune(value, p, property_path(path, key), depth + 1, false);
        } else if (additional.present) {
          prune(value, additional.schema, property_path(path, key), depth + 1, false);
        } else {
          unknown_keys.push_back(key);
        }
      }
      for (const auto& key : unknown_keys) {
        unknown_.push_back(property_path(path, key));
        if (remove_) x.erase(key);
      }
    } else if (x.is_array()) {
      const Json* items = s ? items_schema(*s) : nullptr;
      for (size_t i = 0; i < x.size(); ++i)
        prune(x[i], items, index_path(path, i), depth + 1, false);
    }
  }

 private:
  // Under x-kubernetes-preserve-unknown-fields: keep every field, prune the declared ones.
  void skip_prune(Json& x, const Json& s, const std::string& path, int depth) {
    if (x.is_object()) {
      const bool embedded = is_true(s, "x-kubernetes-embedded-resource");
      const Additional additional = additional_properties(s);
      for (auto& [key, value] : x.items()) {
        if (embedded && is_meta_field(key)) continue;
        if (const Json* p = property_schema(s, key)) {
          prune(value, p, property_path(path, key), depth + 1, false);
        } else if (additional.present) {
          prune(value, additional.schema, property_path(path, key), depth + 1, false);
        }
      }
    } else if (x.is_array()) {
      const Json* items = items_schema(s);
      if (!items) return;
      for (size_t i = 0; i < x.size(); ++i) {
        if (x[i].is_structured() && depth + 1 > kMaxSchemaDepth) {
          walk_.too_deep(field_of(index_path(path, i)));
          continue;
        }
        skip_prune(x[i], *items, index_path(path, i), depth + 1);
      }
    }
  }

  Walk& walk_;
  const bool remove_;
  std::vector<std::string>& unknown_;
};

// -- 1b. non-nullable nulls without a default (defaulting/prunenulls.go) --

void prune_nulls(Json& x, const Json* s, int depth) {
  if (!s || depth > kMaxSchemaDepth) return;  // the validation reports the depth
  if (x.is_object()) {
    std::vector<std::string> drop;
    for (auto& [key, value] : x.items()) {
      const Json* child = field_schema(*s, key);
      if (value.is_null() && child && !is_true(*child, "nullable") && !has_default(*child)) {
        drop.push_back(key);
      } else {
        prune_nulls(value, child, depth + 1);
      }
    }
    for (const auto& key : drop) x.erase(key);
  } else if (x.is_array()) {
    const Json* items = items_schema(*s);
    for (auto& item : x) prune_nulls(item, items, depth + 1);
  }
}

// -- 2. defaults (defaulting/algorithm.go) --

void apply_defaults(Json& x, const Json* s, int depth) {
  if (!s || depth > kMaxSchemaDepth) return;
  // An integral float in an integer field: the API server accepts it (isFloatInt) and writes it
  // back as an integer, since Go prints 2.0 as 2.
  if (x.is_number_float() && has_type(types_of(*s), "integer")) {
    const double d = x.get<double>();
    if (is_json_integer(d) && d == std::round(d)) x = static_cast<int64_t>(d);
  }
  if (x.is_object()) {
    if (const Json* props = member(*s, "properties"); props && props->is_object()) {
      for (const auto& [key, prop] : props->items()) {
        if (!has_default(prop)) continue;
        const auto it = x.find(key);
        if (it == x.end() || (it->is_null() && !is_true(prop, "nullable")))
          x[key] = prop["default"];
      }
    }
    const Additional additional = additional_properties(*s);
    for (auto& [key, value] : x.items()) {
      if (const Json* p = property_schema(*s, key)) {
        apply_defaults(value, p, depth + 1);
      } else if (additional.schema) {
        if (value.is_null() && !is_true(*additional.schema, "nullable"))
          value = additional.schema->value("default", Json());
        apply_defaults(value, additional.schema, depth + 1);
      }
    }
  } else if (x.is_array()) {
    const Json* items = items_schema(*s);
    if (!items) return;
    for (auto& item : x) {
      if (item.is_null() && !is_true(*items, "nullable")) item = items->value("default", Json());
      apply_defaults(item, items, depth + 1);
    }
  }
}

// -- 3. validation (kube-openapi validate) --

void validate(const Json& x, const Json& s, const std::string& path, int depth, Walk& walk);

// "%s in body must be of type %s: %q" (errors.InvalidType with a string value).
FieldError type_error(const std::string& path, const std::string& expected,
                      const std::string& got) {
  return invalid_error(field_of(path), go_quote(got),
                       path + " in body must be of type " + expected + ": " + go_quote(got),
                       "FieldValueTypeInvalid");
}

std::string join(const std::vector<std::string>& parts, const char* separator) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? separator : "") + parts[i];
  return out;
}

// typeValidator.Validate.
void check_type(Kind k, const Json& x, const Json& s, const std::vector<std::string>& types,
                const std::string& path, Walk& walk) {
  const std::string format = checked_format(s);
  const bool float_int =
      k == Kind::kNumber && is_json_integer(x.get<double>()) && has_type(types, "integer");
  const bool int_float = k == Kind::kInteger && has_type(types, "number");
  const bool type_ok = has_type(types, type_name(k)) || float_int || int_float;
  if (!format.empty() && k != Kind::kString && k != Kind::kArray && !type_ok) {
    walk.add(type_error(path, format, go_format_name(k)));
    return;
  }
  // kube-openapi passes a string for any format'ed non-numeric schema (and an array too; here an
  // array gets the type error, as a string field should).
  if (!format.empty() && k == Kind::kString && !has_type(types, "number") &&
      !has_type(types, "integer"))
    return;
  if (!types.empty() && !type_ok) walk.add(type_error(path, join(types, ","), type_name(k)));
}

// "%q must validate ..." messages: not field errors in kube-openapi, so apiextensions reports them
// with a nil field path and an empty value.
FieldError composition_error(const std::string& message) {
  return invalid_error("<nil>", "\"\"", message);
}

Walk branch_walk(const Json& x, const Json& branch, const std::string& path, int depth,
                 const Walk& parent) {
  Walk w{parent.patterns, {}, false, {}};
  validate(x, branch, path, depth + 1, w);
  return w;
}

// schemaPropsValidator: anyOf, oneOf, allOf, not. Of failing alternatives the errors of the one
// with the fewest are reported (kube-openapi picks the one with the most passing checks).
void check_compositions(const Json& x, const Json& s, const std::string& path, int depth,
                        Walk& walk) {
  const auto branches = [&](const char* key) {
    std::vector<const Json*> out;
    if (const Json* list = member(s, key); list && list->is_array())
      for (const auto& b : *list)
        if (b.is_object()) out.push_back(&b);
    return out;
  };
  const auto fewest_errors = [](std::vector<Walk>& failures) -> const Walk* {
    const Walk* best = nullptr;
    for (const auto& f : failures)
      if (!best || f.errors.size() < best->errors.size()) best = &f;
    return best;
  };
  if (const auto any_of = branches("anyOf"); !any_of.empty()) {
    std::vector<Walk> failures;
    bool matched = false;
    for (const Json* b : any_of) {
      Walk w = branch_walk(x, *b, path, depth, walk);
      if (w.ok()) {
        matched = true;
        break;
      }
      failures.push_back(std::move(w));
    }
    if (!matched) {
      walk.add(composition_error(go_quote(path) + " must validate at least one schema (anyOf)"));
      walk.add_all(*fewest_errors(failures));
    }
  }
  if (const auto one_of = branches("oneOf"); !one_of.empty()) {
    std::vector<Walk> failures;
    int valid = 0;
    for (const Json* b : one_of) {
      Walk w = branch_walk(x, *b, path, depth, walk);
      if (w.ok()) {
        ++valid;
      } else {
        failures.push_back(std::move(w));
      }
    }
    if (valid != 1) {
      walk.add(composition_error(
          go_quote(path) + " must validate one and only one schema (oneOf). " +
          (valid == 0 ? std::string("Found none valid")
                      : "Found " + std::to_string(valid) + " valid alternatives")));
      if (valid == 0) walk.add_all(*fewest_errors(failures));
    }
  }
  if (const auto all_of = branches("allOf"); !all_of.empty()) {
    size_t valid = 0;
    for (const Json* b : all_of) {
      Walk w = branch_walk(x, *b, path, depth, walk);
      if (w.ok()) ++valid;
      walk.add_all(w);
    }
    if (valid != all_of.size())
      walk.add(composition_error(go_quote(path) + " must validate all the schemas (allOf)" +
                                 (valid == 0 ? ". None validated" : "")));
  }
  if (const Json* n = member(s, "not"); n && n->is_object()) {
    if (branch_walk(x, *n, path, depth, walk).ok())
      walk.add(composition_error(go_quote(path) + " must not validate the schema (not)"));
  }
}

// stringValidator: maxLength, minLength, pattern; the first failure only.
void check_string(const std::string& value, const Json& s, const std::string& path, Walk& walk) {
  const std::string field = field_of(path);
  const int64_t runes = rune_count(value);
  if (const auto max = count_keyword(s, "maxLength"); max && runes > *max) {
    walk.add(too_long_error(field, *max));
    return;
  }
  if (const auto min = count_keyword(s, "minLength"); min && runes < *min) {
    walk.add(invalid_error(
        field, go_quote(value),
        path + " in body should be at least " + std::to_string(*min) + " chars long"));
    return;
  }
  const Json* pattern = member(s, "pattern");
  if (!pattern || !pattern->is_string() || pattern->get_ref<const std::string&>().empty()) return;
  const std::string& source = pattern->get_ref<const std::string&>();
  if (value.size() > kMaxPatternInputBytes) {  // std::regex would recurse per character
    walk.add(too_long_error(field, static_cast<int64_t>(kMaxPatternInputBytes)));
    return;
  }
  auto [it, inserted] = walk.patterns->try_emplace(source);
  if (inserted) {
    try {
      it->second.regex.emplace(source, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      it->second.error = e.what();
    }
  }
  const Pattern& compiled = it->second;
  if (!compiled.regex) {
    walk.add(invalid_error(field, go_quote(value),
                           path + " in body should match '" + source +
                               ", but pattern is invalid: " + compiled.error + "'"));
    return;
  }
  try {
    // Go's Regexp.MatchString: a match anywhere (patterns anchor themselves with ^ and $).
    if (!std::regex_search(value, *compiled.regex))
      walk.add(
          invalid_error(field, go_quote(value), path + " in body should match '" + source + "'"));
  } catch (const std::regex_error& e) {
    walk.add(invalid_error(
        field, go_quote(value),
        path + " in body could not be matched against '" + source + "': " + e.what()));
  }
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// strfmt IsDate: time.Parse("2006-01-02").
bool is_date(std::string_view s) {
  if (s.size() != 10 || s[4] != '-' || s[7] != '-' || !all_digits(s.substr(0, 4)) ||
      !all_digits(s.substr(5, 2)) || !all_digits(s.substr(8, 2)))
    return false;
  const int year = std::stoi(std::string(s.substr(0, 4)));
  const int month = std::stoi(std::string(s.substr(5, 2)));
  const int day = std::stoi(std::string(s.substr(8, 2)));
  if (month < 1 || month > 12 || day < 1) return false;
  static constexpr int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
  return day <= kDays[month - 1] + (month == 2 && leap ? 1 : 0);
}

// strfmt IsDateTime: lower-cased, split at 't', a date, then
// ^([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))$ with hh<=23, mm,ss<=59.
bool is_date_time(std::string_view text) {
  if (text.size() < 4) return false;
  std::string lower(text);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const size_t t = lower.find('t');
  if (t == std::string::npos || !is_date(std::string_view(lower).substr(0, t))) return false;
  const size_t next_t = lower.find('t', t + 1);
  const std::string_view time = std::string_view(lower).substr(
      t + 1, next_t == std::string::npos ? std::string::npos : next_t - t - 1);
  if (time.size() < 9 || time[2] != ':' || time[5] != ':' || !all_digits(time.substr(0, 2)) ||
      !all_digits(time.substr(3, 2)) || !all_digits(time.substr(6, 2)))
    return false;
  if (time.substr(0, 2) > "23" || time.substr(3, 2) > "59" || time.substr(6, 2) > "59")
    return false;
  const auto is_offset = [](std::string_view z) {
    return z == "z" || (z.size() == 6 && (z[0] == '+' || z[0] == '-') &&
                        all_digits(z.substr(1, 2)) && z[3] == ':' && all_digits(z.substr(4, 2)));
  };
  const std::string_view rest = time.substr(8);
  if (is_offset(rest)) return true;
  // (.[0-9]+): any one character, then digits; an offset never starts with a digit.
  size_t k = 1;
  while (k < rest.size() && rest[k] >= '0' && rest[k] <= '9') ++k;
  return k > 1 && is_offset(rest.substr(k));
}

void check_format(const std::string& value, const Json& s, const std::string& path, Walk& walk) {
  const std::string format = checked_format(s);
  if (format.empty()) return;
  const bool ok = format == "date" ? is_date(value) : is_date_time(value);
  if (!ok) walk.add(type_error(path, format, value));
}

// numberValidator: multipleOf, minimum, maximum. Integers compare as integers against an integral
// bound (and print it as one), otherwise as float64.
void check_number(const Json& x, const Json& s, const std::string& path, Walk& walk) {
  const bool integer = is_int64(x);
  const int64_t iv = integer ? x.get<int64_t>() : 0;
  const double fv = x.get<double>();
  const std::string field = field_of(path), bad = bad_value(x);
  const auto shown = [&](double bound) {
    return integer && fits_int64(bound) ? std::to_string(static_cast<int64_t>(bound))
                                        : go_float(bound);
  };
  if (const auto factor = number_keyword(s, "multipleOf")) {
    if (*factor <= 0) {
      walk.add(invalid_error(
          field, shown(*factor),
          "factor MultipleOf declared for " + path + " must be positive: " + shown(*factor)));
    } else {
      bool multiple;
      if (integer && fits_int64(*factor)) {
        multiple = iv % static_cast<int64_t>(*factor) == 0;
      } else {
        multiple = is_json_integer(*factor < 1 ? (1 / *factor) * fv : fv / *factor);
      }
      if (!multiple)
        walk.add(
            invalid_error(field, bad, path + " in body should be a multiple of " + shown(*factor)));
    }
  }
  const auto bound = [&](const char* keyword, const char* exclusive_keyword, bool lower) {
    const auto limit = number_keyword(s, keyword);
    if (!limit) return;
    const bool exclusive = is_true(s, exclusive_keyword);
    bool fails;
    if (integer && fits_int64(*limit)) {
      const auto l = static_cast<int64_t>(*limit);
      fails = lower ? (exclusive ? iv <= l : iv < l) : (exclusive ? iv >= l : iv > l);
    } else {
      fails = lower ? (exclusive ? fv <= *limit : fv < *limit)
                    : (exclusive ? fv >= *limit : fv > *limit);
    }
    if (fails)
      walk.add(invalid_error(field, bad,
                             path + " in body should be " +
                                 (lower ? "greater than " : "less than ") +
                                 (exclusive ? "" : "or equal to ") + shown(*limit)));
  };
  bound("minimum", "exclusiveMinimum", true);
  bound("maximum", "exclusiveMaximum", false);
}

// schemaSliceValidator: items, minItems, maxItems, uniqueItems.
void check_array(const Json& x, const Json& s, const std::string& path, int depth, Walk& walk) {
  if (const Json* items = items_schema(s)) {
    for (size_t i = 0; i < x.size() && !walk.overflow; ++i)
      validate(x[i], *items, index_path(path, i), depth + 1, walk);
  }
  const auto size = static_cast<int64_t>(x.size());
  const std::string field = field_of(path);
  if (const auto min = count_keyword(s, "minItems"); min && size < *min)
    walk.add(
        invalid_error(field, std::to_string(size),
                      path + " in body should have at least " + std::to_string(*min) + " items"));
  if (const auto max = count_keyword(s, "maxItems"); max && size > *max)
    walk.add(too_many_error(field, size, *max));
  if (is_true(s, "uniqueItems")) {
    std::set<std::string> seen;
    for (const auto& item : x) {
      const auto key = identity_key(item);
      if (key && !seen.insert(*key).second) {
        walk.add(invalid_error(field, "\"\"", path + " in body shouldn't contain duplicates"));
        break;
      }
    }
  }
}

// basicCommonValidator: enum (null never matches: kube-openapi skips a nil value's comparison).
void check_enum(const Json& x, const Json& s, const std::string& path, Walk& walk) {
  const Json* values = member(s, "enum");
  if (!values || !values->is_array() || values->empty()) return;
  if (!x.is_null())
    for (const auto& candidate : *values)
      if (enum_matches(x, candidate)) return;
  std::vector<std::string> shown;
  for (const auto& v : *values) shown.push_back(v.is_string() ? v.get<std::string>() : go_json(v));
  walk.add(not_supported_error(field_of(path), bad_value(x), shown));
}

// objectValidator: minProperties, maxProperties, additionalProperties, properties, required.
void check_object(const Json& x, const Json& s, const std::string& path, int depth, Walk& walk) {
  const auto count = static_cast<int64_t>(x.size());
  const std::string field = field_of(path);
  if (const auto min = count_keyword(s, "minProperties"); min && count < *min)
    walk.add(invalid_error(
        field, std::to_string(count),
        path + " in body should have at least " + std::to_string(*min) + " properties"));
  if (const auto max = count_keyword(s, "maxProperties"); max && count > *max)
    walk.add(too_many_error(field, count, *max));
  const Additional additional = additional_properties(s);
  for (const auto& [key, value] : x.items()) {
    if (walk.overflow) return;
    if (property_schema(s, key)) continue;
    if (additional.present && !additional.allows) {
      walk.add(invalid_error(field, go_quote(key),
                             path + "." + key + " in body is a forbidden property"));
    } else if (additional.schema) {
      validate(value, *additional.schema, path + "." + key, depth + 1, walk);
    }
  }
  for (const auto& [key, value] : x.items()) {
    if (walk.overflow) return;
    if (const Json* p = property_schema(s, key))
      validate(value, *p, property_path(path, key), depth + 1, walk);
  }
  if (const Json* required = member(s, "required"); required && required->is_array()) {
    for (const auto& key : *required)
      if (key.is_string() && !x.contains(key.get<std::string>()))
        walk.add(required_error(field_of(path + "." + key.get<std::string>())));
  }
}

void validate(const Json& x, const Json& s, const std::string& path, int depth, Walk& walk) {
  if (walk.overflow || !s.is_object()) return;
  if (depth > kMaxSchemaDepth) {
    walk.too_deep(field_of(path));
    return;
  }
  const Kind k = kind_of(x);
  const std::vector<std::string> types = types_of(s);
  if (k == Kind::kNull) {
    if (!types.empty() && !is_true(s, "nullable"))
      walk.add(type_error(path, join(types, ","), "null"));
    check_enum(x, s, path, walk);
    return;
  }
  check_type(k, x, s, types, path, walk);
  check_compositions(x, s, path, depth, walk);
  if (k == Kind::kString) {
    check_string(x.get_ref<const std::string&>(), s, path, walk);
    check_format(x.get_ref<const std::string&>(), s, path, walk);
  }
  if (k == Kind::kInteger || k == Kind::kNumber) check_number(x, s, path, walk);
  if (k == Kind::kArray) check_array(x, s, path, depth, walk);
  check_enum(x, s, path, walk);
  if (k == Kind::kObject) check_object(x, s, path, depth, walk);
}

// -- 3b. x-kubernetes-list-type (listtype/validation.go), with field.Path's spelling --

void list_types_value(const Json& x, const Json& s, const std::string& path, int depth, Walk& walk);

// validateListSet: the second appearance of each repeated value.
std::vector<size_t> repeated(const std::vector<const Json*>& values) {
  std::map<std::string, int> seen;
  std::vector<size_t> out;
  for (size_t i = 0; i < values.size(); ++i) {
    const auto key = identity_key(*values[i]);
    if (key && ++seen[*key] == 2) out.push_back(i);
  }
  return out;
}

void list_types_array(const Json& x, const Json& s, const std::string& path, int depth,
                      Walk& walk) {
  const Json* list_type = member(s, "x-kubernetes-list-type");
  if (list_type && *list_type == "set") {
    std::vector<const Json*> items;
    for (const auto& item : x) items.push_back(&item);
    for (size_t i : repeated(items))
      walk.add(duplicate_error(index_path(path, i), bad_value(x[i])));
  } else if (list_type && *list_type == "map") {
    std::vector<std::string> key_fields;
    if (const Json* keys = member(s, "x-kubernetes-list-map-keys"); keys && keys->is_array())
      for (const auto& k : *keys)
        if (k.is_string()) key_fields.push_back(k.get<std::string>());
    bool objects = true;
    for (size_t i = 0; i < x.size() && objects; ++i) {
      if (!x[i].is_null() && !x[i].is_object()) {
        walk.add(invalid_error(index_path(path, i), bad_value(x[i]),
                               "must be an object for an array of list-type map"));
        objects = false;
      }
    }
    if (objects && x.size() > 1) {
      // Each item's key: {field: value} of the key fields it has ({} for none).
      std::vector<Json> keys;
      for (const auto& item : x) {
        Json key = Json::object();
        for (const auto& f : key_fields)
          if (item.is_object() && item.contains(f)) key[f] = item[f];
        keys.push_back(std::move(key));
      }
      std::vector<const Json*> key_ptrs;
      for (const auto& k : keys) key_ptrs.push_back(&k);
      for (size_t i : repeated(key_ptrs))
        walk.add(duplicate_error(index_path(path, i), go_json(keys[i])));
    }
  }
  if (const Json* items = items_schema(s))
    for (size_t i = 0; i < x.size(); ++i)
      list_types_value(x[i], *items, index_path(path, i), depth + 1, walk);
}

void list_types_object(const Json& x, const Json& s, const std::string& path, int depth,
                       Walk& walk) {
  const Additional additional = additional_properties(s);
  for (const auto& [key, value] : x.items()) {
    if (const Json* p = property_schema(s, key)) {
      list_types_value(value, *p, property_path(path, key), depth + 1, walk);
    } else if (additional.schema) {
      list_types_value(value, *additional.schema, path + "[" + key + "]", depth + 1, walk);
    }
  }
}

void list_types_value(const Json& x, const Json& s, const std::string& path, int depth,
                      Walk& walk) {
  if (walk.overflow || depth > kMaxSchemaDepth) return;  // validate() reported the depth
  if (x.is_array()) list_types_array(x, s, path, depth, walk);
  if (x.is_object()) list_types_object(x, s, path, depth, walk);
}

}  // namespace

SchemaResult apply_structural_schema(const nlohmann::json& schema, nlohmann::json& obj,
                                     bool prune) {
  PatternCache patterns;
  Walk walk{&patterns, {}, false, {}};
  SchemaResult result;
  Pruner(walk, prune, result.unknown_fields).prune(obj, &schema, "", 0, /*root=*/true);
  std::sort(result.unknown_fields.begin(), result.unknown_fields.end());
  prune_nulls(obj, &schema, 0);
  apply_defaults(obj, &schema, 0);
  validate(obj, schema, "", 0, walk);
  if (schema.is_object()) list_types_value(obj, schema, "", 0, walk);

  result.causes = std::move(walk.errors);
  if (walk.overflow)
    result.causes.push_back(
        {"FieldValueTooMany", "",
         "too many errors, only the first " + std::to_string(kMaxSchemaErrors) + " are reported"});
  for (const auto& cause : result.causes)
    result.errors.push_back(cause.field.empty() ? cause.body : cause.to_string());
  return result;
}

const nlohmann::json* find_version_schema(const nlohmann::json& crd, const std::string& version) {
  const Json* spec = member(crd, "spec");
  const Json* versions = spec ? member(*spec, "versions") : nullptr;
  if (!versions || !versions->is_array()) return nullptr;
  for (const auto& v : *versions) {
    const Json* name = member(v, "name");
    if (!name || *name != version) continue;
    const Json* s = member(v, "schema");
    const Json* open_api = s ? member(*s, "openAPIV3Schema") : nullptr;
    return open_api && open_api->is_object() ? open_api : nullptr;
  }
  return nullptr;
}

std::string format_invalid(const std::string& qualified_kind, const std::string& name,
                           const std::vector<std::string>& errors) {
  std::vector<std::string> distinct;
  std::set<std::string> seen;
  for (const auto& e : errors)
    if (seen.insert(e).second) distinct.push_back(e);
  std::string out = qualified_kind + " " + go_quote(name) + " is invalid";
  if (distinct.empty()) return out;
  if (distinct.size() == 1) return out + ": " + distinct[0];
  return out + ": [" + join(distinct, ", ") + "]";
}

std::string unknown_field_warning(const std::string& path) {
  return "unknown field \"" + path + "\"";
}

std::string strict_decoding_error(const std::vector<std::string>& unknown_fields) {
  std::vector<std::string> parts;
  for (const auto& path : unknown_fields) parts.push_back(unknown_field_warning(path));
  return "strict decoding error: " + join(parts, ", ");
}

}  // namespace kt::local

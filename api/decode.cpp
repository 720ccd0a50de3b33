#include "api/decode.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "api/error.h"
#include "api/quantity.h"

namespace kt::api {
namespace {

const Json& empty_object() {
  static const Json kEmpty = Json::object();
  return kEmpty;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      const bool same = std::tolower(a[i - 1]) == std::tolower(b[j - 1]);
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (same ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string describe_json(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return value.get<bool>() ? "true" : "false";
    case Json::value_t::string:
      return "\"" + value.get<std::string>() + "\"";
    case Json::value_t::array:
      return "a list";
    case Json::value_t::object:
      return "a map";
    default:
      return value.dump();
  }
}

ObjectReader::ObjectReader(const Json& value, std::string path)
    : ObjectReader(value, std::move(path), nullptr) {}

ObjectReader::ObjectReader(const Json& value, std::string path, std::vector<FieldError>* errors)
    : object_(&empty_object()), path_(std::move(path)), errors_(errors) {
  if (value.is_object())
    object_ = &value;
  else if (!value.is_null())
    fail(path_.empty() ? "<document>" : path_, "must be a map, got " + describe_json(value));
}

void ObjectReader::fail(const std::string& path, std::string problem) const {
  if (!errors_) throw FieldError(path, std::move(problem));
  errors_->emplace_back(path, std::move(problem));
}

std::string ObjectReader::path_of(const std::string& key) const {
  return path_.empty() ? key : path_ + "." + key;
}

bool ObjectReader::has(const std::string& key) const {
  auto it = object_->find(key);
  return it != object_->end() && !it->is_null();
}

const Json* ObjectReader::field(const std::string& key) {
  read_.insert(key);
  auto it = object_->find(key);
  if (it == object_->end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<std::string> ObjectReader::string(const std::string& key) {
  const Json* v = field(key);
  if (!v) return std::nullopt;
  if (v->is_string()) return v->get<std::string>();
  fail(path_of(key), "must be a string, got " + describe_json(*v));
  return std::nullopt;
}

std::optional<int64_t> ObjectReader::integer(const std::string& key) {
  const Json* v = field(key);
  if (!v) return std::nullopt;
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (std::floor(d) == d && std::fabs(d) < 9e18) return static_cast<int64_t>(d);
  }
  fail(path_of(key), "must be an integer, got " + describe_json(*v));
  return std::nullopt;
}

std::optional<double> ObjectReader::number(const std::string& key) {
  const Json* v = field(key);
  if (!v) return std::nullopt;
  if (v->is_number()) return v->get<double>();
  fail(path_of(key), "must be a number, got " + describe_json(*v));
  return std::nullopt;
}

std::optional<bool> ObjectReader::boolean(const std::string& key) {
  const Json* v = field(key);
  if (!v) return std::nullopt;
  if (v->is_boolean()) return v->get<bool>();
  fail(path_of(key), "must be true or false, got " + describe_json(*v));
  return std::nullopt;
}

std::optional<int64_t> ObjectReader::integer_or_auto(const std::string& key) {
  const Json* v = field(key);
  if (!v) return std::nullopt;
  if (v->is_string() && v->get<std::string>() == "auto") return std::nullopt;
  if (v->is_number_integer()) return v->get<int64_t>();
  fail(path_of(key), "must be an integer or \"auto\", got " + describe_json(*v));
  return std::nullopt;
}

std::optional<double> ObjectReader::number_or_auto(const std::string& key) {
  const Json* v = field(key);
  if (!v) return std::nullopt;
  if (v->is_string() && v->get<std::string>() == "auto") return std::nullopt;
  if (v->is_number()) return v->get<double>();
  fail(path_of(key), "must be a number or \"auto\", got " + describe_json(*v));
  return std::nullopt;
}

std::optional<double> ObjectReader::quantity_or_auto(const std::string& key) {
  const Json* v = field(key);
  if (!v) return std::nullopt;
  if (v->is_number()) return v->get<double>();
  if (v->is_string()) {
    const auto& s = v->get_ref<const std::string&>();
    if (s == "auto") return std::nullopt;
    if (auto q = parse_quantity(s)) return q;
  }
  fail(path_of(key), "must be a quantity such as 60Gi or \"auto\", got " + describe_json(*v));
  return std::nullopt;
}

std::map<std::string, std::string> ObjectReader::string_map(const std::string& key) {
  std::map<std::string, std::string> out;
  const Json* v = field(key);
  if (!v) return out;
  if (!v->is_object()) {
    fail(path_of(key), "must be a map, got " + describe_json(*v));
    return out;
  }
  for (auto it = v->begin(); it != v->end(); ++it) {
    if (it->is_string())
      out[it.key()] = it->get<std::string>();
    else
      fail(path_of(key) + "." + it.key(), "must be a string, got " + describe_json(*it));
  }
  return out;
}

Json ObjectReader::raw(const std::string& key) {
  const Json* v = field(key);
  return v ? *v : Json();
}

ObjectReader ObjectReader::object(const std::string& key) {
  const Json* v = field(key);
  return ObjectReader(v ? *v : empty_object(), path_of(key), errors_);
}

void ObjectReader::finish() const {
  if (allow_unknown_) return;
  for (auto it = object_->begin(); it != object_->end(); ++it) {
    if (read_.count(it.key())) continue;
    std::string best;
    size_t best_distance = 3;  // suggest only close matches
    for (const auto& known : read_) {
      const size_t d = edit_distance(it.key(), known);
      if (d < best_distance) {
        best_distance = d;
        best = known;
      }
    }
    std::string problem = "unknown field";
    if (!best.empty()) problem += " (did you mean \"" + best + "\"?)";
    fail(path_of(it.key()), problem);
  }
}

}  // namespace kt::api

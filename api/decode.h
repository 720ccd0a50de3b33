// Strict, path-aware reading of JSON objects: every accessor names the field in its error
// ("spec.training.steps: must be an integer, got \"ten\"") and finish() rejects unknown fields
// with a suggestion, as `kubectl apply --validate=strict` does.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "api/yaml_json.h"

namespace kt::api {

class ObjectReader {
 public:
  // `value` must be an object or null (null reads as an empty object).
  // The reader keeps a pointer to `value`: it must outlive the reader (no temporaries).
  ObjectReader(const Json& value, std::string path);
  ObjectReader(Json&& value, std::string path) = delete;

  std::string path_of(const std::string& key) const;
  bool has(const std::string& key) const;

  std::optional<std::string> string(const std::string& key);
  std::optional<int64_t> integer(const std::string& key);
  std::optional<double> number(const std::string& key);
  std::optional<bool> boolean(const std::string& key);
  // An integer, or the string "auto" (returned as nullopt, like a missing field).
  std::optional<int64_t> integer_or_auto(const std::string& key);
  std::optional<double> number_or_auto(const std::string& key);
  // A Kubernetes quantity ("60Gi") or a plain number; "auto" reads as nullopt.
  std::optional<double> quantity_or_auto(const std::string& key);
  std::map<std::string, std::string> string_map(const std::string& key);
  // The field as it is (for pass-through parts such as tolerations); null when missing.
  Json raw(const std::string& key);
  // A nested object (missing reads as empty).
  ObjectReader object(const std::string& key);

  // Throws FieldError for the first field that no accessor read.
  void finish() const;
  // Marks every field read (for objects where unknown fields are allowed, like metadata).
  void allow_unknown() { allow_unknown_ = true; }

 private:
  const Json* field(const std::string& key);

  const Json* object_;
  std::string path_;
  std::set<std::string> read_;
  bool allow_unknown_ = false;
};

// "an integer" / "a string" ... for messages.
std::string describe_json(const Json& value);

}  // namespace kt::api

// Strict, path-aware reading of JSON objects: every accessor names the field in its error
// ("spec.training.steps: must be an integer, got \"ten\"") and finish() rejects unknown fields
// with a suggestion, as `kubectl apply --validate=strict` does.
//
// Two modes. By default the first problem throws FieldError. Given an error list, a reader (and
// every reader object() makes from it) records each problem there and reads the field as missing,
// so that one pass reports all of a document's problems, as the API server does.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "api/error.h"

#include "api/yaml_json.h"

namespace kt::api {

class ObjectReader {
 public:
  // `value` must be an object or null (null reads as an empty object).
  // The reader keeps a pointer to `value`: it must outlive the reader (no temporaries).
  ObjectReader(const Json& value, std::string path);
  ObjectReader(Json&& value, std::string path) = delete;
  // Collecting mode: problems go to `errors` (which must outlive the reader), nothing throws.
  ObjectReader(const Json& value, std::string path, std::vector<FieldError>* errors);
  ObjectReader(Json&& value, std::string path, std::vector<FieldError>* errors) = delete;

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

  // Reports every field that no accessor read (throws FieldError for the first one by default).
  void finish() const;
  // Reports a problem at `path`: throws FieldError, or records it in collecting mode.
  void fail(const std::string& path, std::string problem) const;
  // Marks every field read (for objects where unknown fields are allowed, like metadata).
  void allow_unknown() { allow_unknown_ = true; }

 private:
  const Json* field(const std::string& key);

  const Json* object_;
  std::string path_;
  std::vector<FieldError>* errors_ = nullptr;  // collecting mode when set
  std::set<std::string> read_;
  bool allow_unknown_ = false;
};

// "an integer" / "a string" ... for messages.
std::string describe_json(const Json& value);

}  // namespace kt::api

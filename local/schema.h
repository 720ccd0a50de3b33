// What kube-apiserver's apiextensions does with a CustomResourceDefinition's structural schema
// (`spec.versions[].schema.openAPIV3Schema`) on create, update and patch, so that the local
// control plane accepts, rewrites and rejects custom resources as a cluster would:
//
//  1. unknown fields (apiextensions-apiserver pkg/apiserver/schema/pruning): every field the
//     schema does not declare, as "spec.colour" / "spec.tolerations[0].foo" (sorted). Kept:
//     subtrees under `x-kubernetes-preserve-unknown-fields: true` (their declared properties are
//     still walked), map values under `additionalProperties`, apiVersion/kind/metadata at the root
//     and in `x-kubernetes-embedded-resource` objects. metadata is never walked: the API server
//     checks it as ObjectMeta, not with the CRD schema. Non-nullable nulls without a default are
//     dropped as well (schema/defaulting/prunenulls.go);
//  2. defaults (schema/defaulting/algorithm.go): a missing property, or a non-nullable null, gets
//     a copy of its `default` wherever its parent object exists; a defaulted object is itself
//     defaulted. An integral JSON float in an integer field (2.0) becomes the integer (the API
//     server accepts it and hands it back as `2`);
//  3. validation (kube-openapi pkg/validation/validate, messages converted to field.Error by
//     apiextensions pkg/apiserver/validation, then x-kubernetes-list-type map/set by
//     schema/listtype): type (integer is a number; a float is an integer when integral), nullable,
//     x-kubernetes-int-or-string, enum, minimum/maximum/exclusive* (OpenAPI v3.0 booleans),
//     multipleOf, minLength/maxLength (in runes, as the API server counts, though its message says
//     "bytes"), pattern, format date-time and date, required, properties, additionalProperties
//     (schema, true or false), items, minItems/maxItems, uniqueItems, minProperties/maxProperties,
//     allOf/anyOf/oneOf/not, x-kubernetes-list-type map (x-kubernetes-list-map-keys) and set.
//     Messages are field.Error's text, e.g.
//       spec.training.steps: Invalid value: 0: spec.training.steps in body should be greater than
//       or equal to 1 spec.parallelism.offload: Unsupported value: "sometimes": supported values:
//       "auto", "none" spec.model: Required value
//
// Not done here: x-kubernetes-validations (CEL; the operator checks what its rules say, see
// crds/trainingjobs.kubetrain.dev.yaml), ObjectMeta validation (names, labels), the embedded
// resources' apiVersion/kind checks, validation ratcheting on update, formats other than date-time
// and date (the API server checks some more, e.g. uuid, hostname), and `pattern` in the API
// server's dialect (Go RE2): patterns run as ECMAScript std::regex, which agrees on the common
// subset (classes, anchors, groups, repetition).
//
// Bounds, so that no input can exhaust the stack or the log: values nested more than
// kMaxSchemaDepth levels get one error at that depth instead of being walked; at most
// kMaxSchemaErrors errors are kept, then one "too many errors" entry; std::regex recurses once or
// more per character, so a string longer than kMaxPatternInputBytes is not matched against a
// pattern but reported as Too long. Beyond those, deep values are never copied or compared
// recursively. Nothing throws except std::bad_alloc; a malformed schema keyword (the API server
// refuses such a CRD) is ignored.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kt::local {

inline constexpr int kMaxSchemaDepth = 64;
inline constexpr size_t kMaxSchemaErrors = 100;
inline constexpr size_t kMaxPatternInputBytes = 2048;

// One field.Error, split the way a metav1.Status cause carries it.
struct FieldError {
  std::string type;   // the cause type: "FieldValueInvalid", "FieldValueRequired", ...
  std::string field;  // "spec.training.steps"
  std::string body;   // "Invalid value: 0: spec.training.steps in body should be ..."
  std::string to_string() const { return field + ": " + body; }
};

struct SchemaResult {
  std::vector<std::string> unknown_fields;  // "spec.colour", sorted
  // "spec.model: Required value", in walk order; past kMaxSchemaErrors the last entry is
  // "too many errors, only the first 100 are reported" (its cause has an empty field).
  std::vector<std::string> errors;
  std::vector<FieldError> causes;  // errors[i] as a Status cause
};

// Defaults `obj`, prunes its unknown fields when `prune` (fieldValidation Ignore or Warn; with
// Strict the caller rejects a non-empty unknown_fields instead), and validates it. `obj` is changed
// in place; unknown fields are reported whether or not they are pruned.
SchemaResult apply_structural_schema(const nlohmann::json& schema, nlohmann::json& obj, bool prune);

// `spec.versions[i].schema.openAPIV3Schema` of a CustomResourceDefinition (apiextensions.k8s.io/v1)
// for the version named `version`; nullptr when that version or its schema is missing.
const nlohmann::json* find_version_schema(const nlohmann::json& crd, const std::string& version);

// The 422 Invalid message (apimachinery errors.NewInvalid with field.ErrorList.ToAggregate):
// `TrainingJob.kubetrain.dev "x" is invalid: [spec.a: ..., spec.b: ...]`, duplicates dropped,
// brackets only around two or more. `qualified_kind` is "Kind.group" ("Pod" for the core group).
std::string format_invalid(const std::string& qualified_kind, const std::string& name,
                           const std::vector<std::string>& errors);

// `unknown field "spec.colour"`: the warning fieldValidation=Warn returns for each unknown field.
std::string unknown_field_warning(const std::string& path);

// The 400 BadRequest message under fieldValidation=Strict:
// `strict decoding error: unknown field "spec.colour", unknown field "spec.x"`.
std::string strict_decoding_error(const std::vector<std::string>& unknown_fields);

}  // namespace kt::local

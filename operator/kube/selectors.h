// Label and field selectors as the API server reads them from ?labelSelector= and
// ?fieldSelector=: the local Store filters lists and watches with them, the Deployment controller
// matches pods to a ReplicaSet's selector, and the informer cache (cache.h) answers lists with
// them and picks an index from their equality requirements.
//  * label selectors: =, ==, !=, in, notin, exists (k), !exists (!k);
//  * field selectors: metadata.name, metadata.namespace, spec.nodeName, status.phase, and the
//    fields of events (involvedObject.*, reason, reportingComponent, source, type); =, ==, !=.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "operator/kube/client.h"

namespace kt::kube {

struct LabelRequirement {
  enum class Op { kIn, kNotIn, kExists, kDoesNotExist };  // "k=v" is kIn {v}, "k!=v" kNotIn {v}
  std::string key;
  Op op;
  std::vector<std::string> values;
};

struct FieldRequirement {
  std::string field;  // "spec.nodeName"
  bool negate;        // "!="
  std::string value;
};

// Parse a selector ("" has no requirements). Throw ApiError 400 on a malformed one, or on a
// field the API server does not index.
std::vector<LabelRequirement> parse_label_selector(const std::string& selector);
std::vector<FieldRequirement> parse_field_selector(const std::string& selector);

bool matches(const Object& obj, const std::vector<LabelRequirement>& selector);
bool matches(const Object& obj, const std::vector<FieldRequirement>& selector);

// Whether `obj` matches `selector` ("" matches everything). Both throw ApiError 400 on a
// malformed selector, whether or not the object matches.
bool matches_label_selector(const Object& obj, const std::string& selector);
bool matches_field_selector(const Object& obj, const std::string& selector);

// The one value `key` must have under `selector` ("k=v", "k==v", "k in (v)"), if it says so.
std::optional<std::string> required_label_value(const std::vector<LabelRequirement>& selector,
                                                const std::string& key);
std::optional<std::string> required_field_value(const std::vector<FieldRequirement>& selector,
                                                const std::string& field);

// Whether every object matching `narrower` also matches `wider`, judged requirement by
// requirement (each of `wider`'s is in `narrower`, or is "k" exists where `narrower` asks k in
// a set). False negatives only: a cache filtered by `wider` can answer a list by `narrower`.
bool label_selector_implies(const std::vector<LabelRequirement>& narrower,
                            const std::vector<LabelRequirement>& wider);

// The object's string at a field selector's field ("" when absent), as the API server compares.
std::string field_value(const Object& obj, const std::string& field);

}  // namespace kt::kube

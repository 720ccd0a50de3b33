// local/schema: the API server's structural-schema semantics (pruning, defaulting,
// validation) against the real TrainingJob CRD and small inline schemas. Expected messages are
// written out from the Go formats (kube-openapi errors/schema.go, apimachinery field/errors.go),
// not captured from this code.
#include "local/schema.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "api/yaml_json.h"
#include "tests/support/crd.h"

namespace kt::local {
namespace {

using Json = nlohmann::json;
using Strings = std::vector<std::string>;
using test::training_job_crd;

const Json& job_schema() {
  static const Json* schema = find_version_schema(training_job_crd(), "v1alpha1");
  return *schema;
}

// A TrainingJob with the smallest valid spec, then `spec_patch` merged in (RFC 7386).
Json job(const Json& spec_patch = Json::object()) {
  Json j = {{"apiVersion", "kubetrain.dev/v1alpha1"},
            {"kind", "TrainingJob"},
            {"metadata", {{"name", "j"}, {"namespace", "default"}}},
            {"spec", {{"model", {{"preset", "tiny"}}}, {"training", {{"steps", 10}}}}}};
  j["spec"].merge_patch(spec_patch);
  return j;
}

Strings errors_of(const Json& schema, Json obj) {
  return apply_structural_schema(schema, obj, true).errors;
}

// A root schema with one property `x` under spec: errors then read "spec.x: ...".
Json spec_x(const Json& x_schema) {
  return {{"type", "object"},
          {"properties", {{"spec", {{"type", "object"}, {"properties", {{"x", x_schema}}}}}}}};
}
Strings errors_for_x(const Json& x_schema, const Json& x) {
  return errors_of(spec_x(x_schema), {{"spec", {{"x", x}}}});
}

// ---- The real CRD --------------------------------------------------------------------------

TEST(Schema, FindsTheVersionsSchema_AndNothingForAnUnknownVersion) {
  ASSERT_NE(find_version_schema(training_job_crd(), "v1alpha1"), nullptr);
  EXPECT_EQ(find_version_schema(training_job_crd(), "v1alpha1")->value("type", ""), "object");
  EXPECT_EQ(find_version_schema(training_job_crd(), "v1"), nullptr);
  EXPECT_EQ(find_version_schema(Json::object(), "v1alpha1"), nullptr);
}

TEST(Schema, ExampleJobs_HaveNoErrorsAndNoUnknownFields) {
  int examples = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(KT_SOURCE_DIR) + "/examples/jobs")) {
    Json obj = api::load_document(entry.path().string());
    const SchemaResult r = apply_structural_schema(job_schema(), obj, true);
    EXPECT_TRUE(r.errors.empty()) << entry.path() << ": " << Json(r.errors).dump();
    EXPECT_TRUE(r.unknown_fields.empty()) << entry.path() << ": " << Json(r.unknown_fields).dump();
    ++examples;
  }
  EXPECT_GE(examples, 7);
}

TEST(Schema, RejectsEnumValue_WithSupportedValues) {
  EXPECT_EQ(errors_of(job_schema(), job({{"parallelism", {{"offload", "sometimes"}}}})),
            Strings{"spec.parallelism.offload: Unsupported value: \"sometimes\": supported values: "
                    "\"auto\", \"none\", \"optimizer\", \"window\""});
}

TEST(Schema, ReportsUnknownFields_WithTheirPaths_AndPrunesThem) {
  Json obj = job({{"colour", "blue"},
                  {"model", {{"foo", 1}}},
                  {"resources", {{"tolerations", {{{"key", "gpu"}}}}}}});
  obj["spec"]["checkpoint"] = {{"volume", {{"emptyDir", Json::object()}}}, {"bogus", true}};
  const SchemaResult r = apply_structural_schema(job_schema(), obj, true);
  EXPECT_EQ(r.unknown_fields, (Strings{"spec.checkpoint.bogus", "spec.colour", "spec.model.foo"}));
  EXPECT_TRUE(r.errors.empty()) << Json(r.errors).dump();
  EXPECT_FALSE(obj["spec"].contains("colour"));
  EXPECT_FALSE(obj["spec"]["model"].contains("foo"));
  EXPECT_FALSE(obj["spec"]["checkpoint"].contains("bogus"));
  EXPECT_EQ(obj["spec"]["model"]["preset"], "tiny");
}

TEST(Schema, ReportsButKeepsUnknownFields_WhenNotPruning) {
  Json obj = job({{"colour", "blue"}});
  const SchemaResult r = apply_structural_schema(job_schema(), obj, false);
  EXPECT_EQ(r.unknown_fields, Strings{"spec.colour"});
  EXPECT_EQ(obj["spec"]["colour"], "blue");
  EXPECT_EQ(strict_decoding_error(r.unknown_fields),
            "strict decoding error: unknown field \"spec.colour\"");
}

TEST(Schema, UnknownFieldsInsideArrays_AreNamedByIndex) {
  Json obj = job();
  obj["status"] = {{"conditions",
                    {{{"type", "Running"}, {"status", "True"}},
                     {{"type", "Planned"}, {"status", "True"}, {"extra", 1}}}}};
  const SchemaResult r = apply_structural_schema(job_schema(), obj, true);
  EXPECT_EQ(r.unknown_fields, Strings{"status.conditions[1].extra"});
  EXPECT_FALSE(obj["status"]["conditions"][1].contains("extra"));
}

TEST(Schema, KeepsMetadataAndTypeMeta_AndPreserveUnknownFieldsSubtrees) {
  Json obj = job({{"resources",
                   {{"affinity", {{"nodeAffinity", {{"anything", {{"deep", {1, 2, 3}}}}}}}},
                    {"tolerations", {{{"key", "gpu"}, {"operator", "Exists"}, {"effect", "X"}}}},
                    {"resources", {{"limits", {{"memory", "8Gi"}}}}},
                    {"nodeSelector", {{"pool", "gpu"}, {"zone", "a"}}}}},
                  {"data", {{"volume", {{"persistentVolumeClaim", {{"claimName", "d"}}}}}}},
                  {"parallelism", {{"overlap", "on"}, {"gpuUpdateFraction", 0.5}}}});
  obj["metadata"]["labels"] = {{"a", "b"}};
  obj["metadata"]["somethingNew"] = {{"x", 1}};
  const Json before = obj;
  const SchemaResult r = apply_structural_schema(job_schema(), obj, true);
  EXPECT_TRUE(r.unknown_fields.empty()) << Json(r.unknown_fields).dump();
  EXPECT_TRUE(r.errors.empty()) << Json(r.errors).dump();
  EXPECT_EQ(obj["metadata"], before["metadata"]);
  EXPECT_EQ(obj["apiVersion"], before["apiVersion"]);
  for (const char* key : {"affinity", "tolerations", "resources", "nodeSelector"})
    EXPECT_EQ(obj["spec"]["resources"][key], before["spec"]["resources"][key]) << key;
  EXPECT_EQ(obj["spec"]["data"]["volume"], before["spec"]["data"]["volume"]);
  EXPECT_EQ(obj["spec"]["parallelism"]["overlap"], "on");
}

TEST(Schema, EmbeddedResource_KeepsItsTypeMetaAndMetadata_ButPrunesTheRest) {
  const Json schema =
      spec_x({{"type", "object"},
              {"x-kubernetes-embedded-resource", true},
              {"properties",
               {{"spec", {{"type", "object"}, {"properties", {{"a", {{"type", "string"}}}}}}}}}});
  Json obj = {{"spec",
               {{"x",
                 {{"apiVersion", "v1"},
                  {"kind", "Pod"},
                  {"metadata", {{"name", "p"}, {"odd", 1}}},
                  {"spec", {{"a", "ok"}, {"b", 1}}},
                  {"status", Json::object()}}}}}};
  const SchemaResult r = apply_structural_schema(schema, obj, true);
  EXPECT_EQ(r.unknown_fields, (Strings{"spec.x.spec.b", "spec.x.status"}));
  EXPECT_EQ(obj["spec"]["x"]["metadata"], Json({{"name", "p"}, {"odd", 1}}));
  EXPECT_EQ(obj["spec"]["x"]["kind"], "Pod");
}

TEST(Schema, FillsDefaults_WhereTheParentExists) {
  Json obj = job({{"parallelism", Json::object()}});
  const SchemaResult r = apply_structural_schema(job_schema(), obj, true);
  EXPECT_TRUE(r.errors.empty()) << Json(r.errors).dump();
  const Json& training = obj["spec"]["training"];
  EXPECT_EQ(training["globalBatchSize"], 32);
  EXPECT_EQ(training["learningRate"], 0.0006);
  EXPECT_EQ(training["precision"], "auto");
  EXPECT_EQ(training["seed"], 1337);
  EXPECT_FALSE(training.contains("warmupSteps"));  // no default
  EXPECT_EQ(obj["spec"]["parallelism"]["recompute"], "auto");
  EXPECT_EQ(obj["spec"]["parallelism"]["offload"], "auto");
  // No default for the objects themselves: absent parents stay absent.
  EXPECT_FALSE(obj["spec"].contains("checkpoint"));
  EXPECT_FALSE(obj["spec"].contains("runPolicy"));
}

TEST(Schema, DefaultObject_IsItselfDefaulted) {
  const Json schema = Json::parse(R"({"type": "object", "properties": {
      "a": {"type": "object", "default": {}, "properties": {
        "b": {"type": "integer", "default": 3},
        "c": {"type": "object", "properties": {"d": {"type": "string", "default": "x"}}}}}}})");
  Json obj = Json::object();
  EXPECT_TRUE(apply_structural_schema(schema, obj, true).errors.empty());
  EXPECT_EQ(obj, Json::parse(R"({"a": {"b": 3}})"));
}

TEST(Schema, NonNullableNull_IsDefaultedOrDropped_NullableNullIsKept) {
  const Json schema = Json::parse(R"({"type": "object", "properties": {
      "d": {"type": "integer", "default": 5},
      "n": {"type": "integer"},
      "k": {"type": "integer", "nullable": true}}})");
  Json obj = {{"d", nullptr}, {"n", nullptr}, {"k", nullptr}};
  EXPECT_TRUE(apply_structural_schema(schema, obj, true).errors.empty());
  EXPECT_EQ(obj, Json({{"d", 5}, {"k", nullptr}}));
}

TEST(Schema, NullArrayItem_OfANonNullableType_IsATypeError) {
  EXPECT_EQ(errors_for_x({{"type", "array"}, {"items", {{"type", "integer"}}}}, {1, nullptr}),
            Strings{"spec.x[1]: Invalid value: \"null\": spec.x[1] in body must be of type "
                    "integer: \"null\""});
}

// ---- Types and numbers ---------------------------------------------------------------------

TEST(Schema, RejectsWrongType_NamingTheValuesType) {
  EXPECT_EQ(errors_of(job_schema(), job({{"training", {{"steps", "many"}}}})),
            Strings{"spec.training.steps: Invalid value: \"string\": spec.training.steps in body "
                    "must be of type integer: \"string\""});
  EXPECT_EQ(errors_of(job_schema(), job({{"model", "tiny"}})),
            Strings{"spec.model: Invalid value: \"string\": spec.model in body must be of type "
                    "object: \"string\""});
  EXPECT_EQ(errors_of(job_schema(), job({{"resources", {{"cpuOnly", "yes"}}}})),
            Strings{"spec.resources.cpuOnly: Invalid value: \"string\": spec.resources.cpuOnly in "
                    "body must be of type boolean: \"string\""});
}

TEST(Schema, Integer_RejectsAFraction_AcceptsAnIntegralFloatAsTheInteger) {
  EXPECT_EQ(errors_of(job_schema(), job({{"training", {{"steps", 1.5}}}})),
            Strings{"spec.training.steps: Invalid value: \"number\": spec.training.steps in body "
                    "must be of type integer: \"number\""});
  Json obj = job({{"training", {{"steps", 2.0}}}});
  EXPECT_TRUE(apply_structural_schema(job_schema(), obj, true).errors.empty());
  EXPECT_TRUE(obj["spec"]["training"]["steps"].is_number_integer());
  EXPECT_EQ(obj["spec"]["training"]["steps"], 2);
}

TEST(Schema, Number_AcceptsAnInteger) {
  EXPECT_TRUE(errors_of(job_schema(), job({{"training", {{"learningRate", 1}}}})).empty());
}

TEST(Schema, Minimum_AndExclusiveMinimum) {
  EXPECT_EQ(errors_of(job_schema(), job({{"training", {{"steps", 0}}}})),
            Strings{"spec.training.steps: Invalid value: 0: spec.training.steps in body should be "
                    "greater than or equal to 1"});
  EXPECT_EQ(errors_of(job_schema(), job({{"training", {{"learningRate", 0}}}})),
            Strings{"spec.training.learningRate: Invalid value: 0: spec.training.learningRate in "
                    "body should be greater than 0"});
  EXPECT_EQ(errors_for_x({{"type", "number"}, {"minimum", 0.5}}, 0.25),
            Strings{"spec.x: Invalid value: 0.25: spec.x in body should be greater than or equal "
                    "to 0.5"});
  EXPECT_TRUE(errors_for_x({{"type", "number"}, {"minimum", 0.5}}, 0.5).empty());
}

TEST(Schema, Maximum_AndExclusiveMaximum) {
  EXPECT_EQ(
      errors_for_x({{"type", "integer"}, {"maximum", 10}}, 11),
      Strings{"spec.x: Invalid value: 11: spec.x in body should be less than or equal to 10"});
  EXPECT_TRUE(errors_for_x({{"type", "integer"}, {"maximum", 10}}, 10).empty());
  EXPECT_EQ(errors_for_x({{"type", "integer"}, {"maximum", 10}, {"exclusiveMaximum", true}}, 10),
            Strings{"spec.x: Invalid value: 10: spec.x in body should be less than 10"});
}

TEST(Schema, Numbers_PrintAsGoPrintsThem) {
  EXPECT_EQ(errors_for_x({{"type", "number"}, {"maximum", 1e-6}}, 0.00002),
            Strings{"spec.x: Invalid value: 2e-05: spec.x in body should be less than or equal to "
                    "1e-06"});
  EXPECT_EQ(errors_for_x({{"type", "number"}, {"maximum", 100000}}, 1234567.5),
            Strings{"spec.x: Invalid value: 1.2345675e+06: spec.x in body should be less than or "
                    "equal to 100000"});
}

TEST(Schema, MultipleOf) {
  EXPECT_EQ(errors_for_x({{"type", "integer"}, {"multipleOf", 2}}, 7),
            Strings{"spec.x: Invalid value: 7: spec.x in body should be a multiple of 2"});
  EXPECT_TRUE(errors_for_x({{"type", "integer"}, {"multipleOf", 2}}, 8).empty());
  EXPECT_TRUE(errors_for_x({{"type", "number"}, {"multipleOf", 0.1}}, 0.3).empty());
  EXPECT_EQ(errors_for_x({{"type", "number"}, {"multipleOf", 0.25}}, 0.3),
            Strings{"spec.x: Invalid value: 0.3: spec.x in body should be a multiple of 0.25"});
}

TEST(Schema, IntOrString_TakesEitherAndTheKeywordsOfWhicheverItIs) {
  const auto micro = [](const Json& v) {
    return errors_of(job_schema(), job({{"training", {{"microBatchSize", v}}}}));
  };
  EXPECT_TRUE(micro(4).empty());
  EXPECT_TRUE(micro("auto").empty());
  EXPECT_EQ(micro("4"), Strings{"spec.training.microBatchSize: Invalid value: \"4\": "
                                "spec.training.microBatchSize in body should match '^auto$'"});
  EXPECT_EQ(micro(0), Strings{"spec.training.microBatchSize: Invalid value: 0: "
                              "spec.training.microBatchSize in body should be greater than or "
                              "equal to 1"});
  EXPECT_EQ(micro(true), Strings{"spec.training.microBatchSize: Invalid value: \"boolean\": "
                                 "spec.training.microBatchSize in body must be of type "
                                 "integer,string: \"boolean\""});
}

TEST(Schema, Enum_OfNonStrings_ListsThemAsJson) {
  EXPECT_EQ(errors_for_x({{"enum", {1, 2.5, true}}}, 3),
            Strings{"spec.x: Unsupported value: 3: supported values: \"1\", \"2.5\", \"true\""});
  EXPECT_TRUE(errors_for_x({{"enum", {1, 2.5, true}}}, 2.5).empty());
  EXPECT_TRUE(errors_for_x({{"enum", {1, 2.5, true}}}, 1.0).empty());
}

TEST(Schema, StringValues_AreQuotedAsGoQuotesThem) {
  EXPECT_EQ(errors_for_x({{"type", "string"}, {"enum", {"a"}}}, "b\"c\n\x01"),
            Strings{R"(spec.x: Unsupported value: "b\"c\n\x01": supported values: "a")"});
}

// ---- Strings -------------------------------------------------------------------------------

TEST(Schema, Pattern) {
  EXPECT_EQ(errors_for_x({{"type", "string"}, {"pattern", "^a$"}}, "x"),
            Strings{"spec.x: Invalid value: \"x\": spec.x in body should match '^a$'"});
  EXPECT_TRUE(errors_for_x({{"type", "string"}, {"pattern", "^a$"}}, "a").empty());
  // Go's MatchString finds a match anywhere: an unanchored pattern matches inside.
  EXPECT_TRUE(errors_for_x({{"type", "string"}, {"pattern", "b"}}, "abc").empty());
  EXPECT_TRUE(
      errors_of(job_schema(), job({{"parallelism", {{"gpuMemoryBudget", "60Gi"}}}})).empty());
  EXPECT_EQ(errors_of(job_schema(), job({{"parallelism", {{"gpuMemoryBudget", "lots"}}}})).size(),
            1u);
}

TEST(Schema, InvalidPattern_IsReportedNotThrown) {
  const Strings e = errors_for_x({{"type", "string"}, {"pattern", "(a"}}, "a");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].rfind("spec.x: Invalid value: \"a\": spec.x in body should match '(a, but "
                       "pattern is invalid: ",
                       0),
            0u)
      << e[0];
}

TEST(Schema, MaxLength_CountsRunes_AndSaysBytes) {
  EXPECT_EQ(errors_for_x({{"type", "string"}, {"maxLength", 5}}, "abcdef"),
            Strings{"spec.x: Too long: may not be more than 5 bytes"});
  EXPECT_TRUE(errors_for_x({{"type", "string"}, {"maxLength", 5}}, "\u00e9\u00e9\u00e9\u00e9\u00e9")
                  .empty());
  EXPECT_EQ(errors_for_x({{"type", "string"}, {"maxLength", 1}}, "ab"),
            Strings{"spec.x: Too long: may not be more than 1 byte"});
}

TEST(Schema, MinLength) {
  EXPECT_EQ(
      errors_for_x({{"type", "string"}, {"minLength", 3}}, "ab"),
      Strings{"spec.x: Invalid value: \"ab\": spec.x in body should be at least 3 chars long"});
  EXPECT_TRUE(errors_for_x({{"type", "string"}, {"minLength", 3}}, "abc").empty());
}

TEST(Schema, DateTime_IsRfc3339) {
  const auto start = [](const Json& v) {
    Json obj = job();
    obj["status"] = {{"startTime", v}};
    return errors_of(job_schema(), obj);
  };
  EXPECT_TRUE(start("2026-01-01T00:00:00Z").empty());
  EXPECT_TRUE(start("2026-01-01T10:20:30.123456+02:00").empty());
  EXPECT_TRUE(start("2024-02-29t23:59:59z").empty());
  EXPECT_EQ(start("yesterday"),
            Strings{"status.startTime: Invalid value: \"yesterday\": status.startTime in body must "
                    "be of type date-time: \"yesterday\""});
  EXPECT_EQ(start("2026-02-30T00:00:00Z").size(), 1u);
  EXPECT_EQ(start("2026-01-01T24:00:00Z").size(), 1u);
  EXPECT_EQ(start("2026-01-01T00:00:00").size(), 1u);  // no offset
}

// ---- Arrays and objects --------------------------------------------------------------------

TEST(Schema, MinItems_MaxItems_UniqueItems) {
  const Json s = {
      {"type", "array"}, {"minItems", 2}, {"maxItems", 3}, {"items", {{"type", "string"}}}};
  EXPECT_EQ(errors_for_x(s, {"a"}),
            Strings{"spec.x: Invalid value: 1: spec.x in body should have at least 2 items"});
  EXPECT_EQ(errors_for_x(s, {"a", "b", "c", "d"}),
            Strings{"spec.x: Too many: 4: must have at most 3 items"});
  EXPECT_TRUE(errors_for_x(s, {"a", "b"}).empty());
  const Json unique = {{"type", "array"}, {"uniqueItems", true}};
  EXPECT_EQ(errors_for_x(unique, {1, 2, 1}),
            Strings{"spec.x: Invalid value: \"\": spec.x in body shouldn't contain duplicates"});
  EXPECT_TRUE(errors_for_x(unique, {1, 2, "1"}).empty());
}

TEST(Schema, MinProperties_MaxProperties) {
  const Json s = {{"type", "object"},
                  {"minProperties", 2},
                  {"maxProperties", 2},
                  {"additionalProperties", {{"type", "integer"}}}};
  EXPECT_EQ(errors_for_x(s, {{"a", 1}}),
            Strings{"spec.x: Invalid value: 1: spec.x in body should have at least 2 properties"});
  EXPECT_EQ(errors_for_x(s, {{"a", 1}, {"b", 2}, {"c", 3}}),
            Strings{"spec.x: Too many: 3: must have at most 2 items"});
}

TEST(Schema, AdditionalProperties_ValidatesMapValues) {
  EXPECT_EQ(
      errors_of(job_schema(), job({{"resources", {{"nodeSelector", {{"pool", 1}}}}}})),
      Strings{"spec.resources.nodeSelector.pool: Invalid value: \"integer\": "
              "spec.resources.nodeSelector.pool in body must be of type string: \"integer\""});
  EXPECT_EQ(errors_for_x({{"type", "object"},
                          {"properties", {{"a", {{"type", "string"}}}}},
                          {"additionalProperties", false}},
                         {{"a", "x"}, {"b", "y"}}),
            Strings{"spec.x: Invalid value: \"b\": spec.x.b in body is a forbidden property"});
}

TEST(Schema, Required) {
  EXPECT_EQ(errors_of(job_schema(), job({{"model", nullptr}})),
            Strings{"spec.model: Required value"});
  Json no_spec = job();
  no_spec.erase("spec");
  EXPECT_EQ(errors_of(job_schema(), no_spec), Strings{"spec: Required value"});
  Json obj = job();
  obj["status"] = {{"conditions", {{{"type", "Running"}}}}};
  EXPECT_EQ(errors_of(job_schema(), obj), Strings{"status.conditions[0].status: Required value"});
}

TEST(Schema, ListTypeMap_RejectsDuplicateKeys) {
  Json obj = job();
  obj["status"] = {{"conditions",
                    {{{"type", "Ready"}, {"status", "True"}},
                     {{"type", "Planned"}, {"status", "True"}},
                     {{"type", "Ready"}, {"status", "False"}}}}};
  EXPECT_EQ(errors_of(job_schema(), obj),
            Strings{"status.conditions[2]: Duplicate value: {\"type\":\"Ready\"}"});
  const Json two_keys = {
      {"type", "array"},
      {"x-kubernetes-list-type", "map"},
      {"x-kubernetes-list-map-keys", {"a", "b"}},
      {"items", {{"type", "object"}, {"x-kubernetes-preserve-unknown-fields", true}}}};
  EXPECT_EQ(errors_for_x(two_keys,
                         {{{"a", 1}, {"b", "x"}}, {{"a", 1}, {"b", "y"}}, {{"b", "x"}, {"a", 1}}}),
            Strings{"spec.x[2]: Duplicate value: {\"a\":1,\"b\":\"x\"}"});
  EXPECT_EQ(
      errors_for_x({{"type", "array"},
                    {"x-kubernetes-list-type", "map"},
                    {"x-kubernetes-list-map-keys", {"a"}}},
                   {1, {{"a", 1}}}),
      Strings{"spec.x[0]: Invalid value: 1: must be an object for an array of list-type map"});
}

TEST(Schema, ListTypeSet_RejectsRepeatedValues_OnceEach) {
  const Json s = {
      {"type", "array"}, {"x-kubernetes-list-type", "set"}, {"items", {{"type", "string"}}}};
  EXPECT_EQ(errors_for_x(s, {"a", "b", "a", "a", "b"}),
            (Strings{"spec.x[2]: Duplicate value: \"a\"", "spec.x[4]: Duplicate value: \"b\""}));
  EXPECT_TRUE(errors_for_x(s, {"a", "b"}).empty());
}

TEST(Schema, AnyOfOneOfNot_ReportAsTheApiServerDoes) {
  const Json any = {{"type", "integer"}, {"anyOf", {{{"minimum", 10}}, {{"maximum", 0}}}}};
  EXPECT_TRUE(errors_for_x(any, 11).empty());
  EXPECT_EQ(
      errors_for_x(any, 5),
      (Strings{"<nil>: Invalid value: \"\": \"spec.x\" must validate at least one schema (anyOf)",
               "spec.x: Invalid value: 5: spec.x in body should be greater than or equal to 10"}));
  const Json one = {{"type", "integer"}, {"oneOf", {{{"minimum", 0}}, {{"maximum", 10}}}}};
  EXPECT_EQ(errors_for_x(one, 5),
            Strings{"<nil>: Invalid value: \"\": \"spec.x\" must validate one and only one schema "
                    "(oneOf). Found 2 valid alternatives"});
  EXPECT_TRUE(errors_for_x(one, 11).empty());
  const Json negated = {{"type", "string"}, {"not", {{"enum", {"no"}}}}};
  EXPECT_EQ(errors_for_x(negated, "no"),
            Strings{"<nil>: Invalid value: \"\": \"spec.x\" must not validate the schema (not)"});
  EXPECT_TRUE(errors_for_x(negated, "yes").empty());
}

TEST(Schema, CollectsEveryError_WithItsPath) {
  Json obj = job({{"training", {{"steps", 0}, {"precision", "fp8"}}},
                  {"parallelism", {{"offload", "sometimes"}}},
                  {"colour", "blue"}});
  obj["spec"].erase("model");
  const SchemaResult r = apply_structural_schema(job_schema(), obj, true);
  EXPECT_EQ(r.unknown_fields, Strings{"spec.colour"});
  const Strings expected = {
      "spec.parallelism.offload: Unsupported value: \"sometimes\": supported values: \"auto\", "
      "\"none\", \"optimizer\", \"window\"",
      "spec.training.precision: Unsupported value: \"fp8\": supported values: \"auto\", \"bf16\", "
      "\"fp32\"",
      "spec.training.steps: Invalid value: 0: spec.training.steps in body should be greater than "
      "or equal to 1",
      "spec.model: Required value"};
  EXPECT_EQ(r.errors, expected);
  ASSERT_EQ(r.causes.size(), 4u);
  EXPECT_EQ(r.causes[3].type, "FieldValueRequired");
  EXPECT_EQ(r.causes[3].field, "spec.model");
  EXPECT_EQ(r.causes[0].type, "FieldValueNotSupported");
  EXPECT_EQ(r.causes[2].body,
            "Invalid value: 0: spec.training.steps in body should be greater than or equal to 1");
}

// ---- Bounds --------------------------------------------------------------------------------

// [[[...]]] `levels` deep, built without recursion (and never copied: copying recurses).
Json nested_arrays(int levels) {
  Json v = Json::array();
  for (int i = 1; i < levels; ++i) {
    Json outer = Json::array();
    outer.push_back(std::move(v));
    v = std::move(outer);
  }
  return v;
}

TEST(Schema, VeryDeepValue_InAPreserveUnknownFieldsField_IsKeptAndNotWalked) {
  Json obj = job();
  obj["spec"]["resources"] = {{"affinity", Json::object()}};
  obj["spec"]["resources"]["affinity"]["deep"] = nested_arrays(100000);
  const SchemaResult r = apply_structural_schema(job_schema(), obj, true);
  EXPECT_TRUE(r.errors.empty()) << Json(r.errors).dump();
  EXPECT_TRUE(r.unknown_fields.empty());
  EXPECT_TRUE(obj["spec"]["resources"]["affinity"]["deep"].is_array());
}

TEST(Schema, VeryDeepValue_InATypedField_GetsOneBoundedError) {
  Json obj = job();
  obj["spec"]["resources"] = {{"tolerations", Json::array()}};
  obj["spec"]["resources"]["tolerations"].push_back(nested_arrays(100000));
  EXPECT_EQ(apply_structural_schema(job_schema(), obj, true).errors,
            Strings{"spec.resources.tolerations[0]: Invalid value: \"array\": "
                    "spec.resources.tolerations[0] in body must be of type object: \"array\""});
}

TEST(Schema, VeryDeepValue_UnderADeepSchema_StopsAtTheDepthLimit) {
  Json deep_schema = {{"type", "integer"}};
  for (int i = 0; i < 200; ++i)
    deep_schema = Json{{"type", "array"}, {"items", std::move(deep_schema)}};
  Json obj = {{"spec", {{"x", nested_arrays(100000)}}}};
  // spec is level 1 and spec.x level 2, so level 65 is spec.x followed by 63 indexes.
  std::string path = "spec.x";
  for (int level = 3; level <= kMaxSchemaDepth + 1; ++level) path += "[0]";
  EXPECT_EQ(apply_structural_schema(spec_x(deep_schema), obj, true).errors,
            Strings{path + ": Forbidden: nested more than 64 levels deep"});
}

TEST(Schema, HugeString_AgainstAPattern_IsTooLongNotACrash) {
  const std::string huge(1 << 20, '1');
  EXPECT_EQ(errors_of(job_schema(), job({{"parallelism", {{"gpuMemoryBudget", huge}}}})),
            Strings{"spec.parallelism.gpuMemoryBudget: Too long: may not be more than 2048 bytes"});
  // Up to the bound the pattern is matched (a quantity of 2048 digits matches).
  EXPECT_TRUE(
      errors_of(job_schema(), job({{"parallelism",
                                    {{"gpuMemoryBudget", huge.substr(0, kMaxPatternInputBytes)}}}}))
          .empty());
}

TEST(Schema, ErrorCount_IsBounded) {
  Json many = Json::array();
  for (int i = 0; i < 1000; ++i) many.push_back("x");
  const Strings e = errors_for_x({{"type", "array"}, {"items", {{"type", "integer"}}}}, many);
  ASSERT_EQ(e.size(), kMaxSchemaErrors + 1);
  EXPECT_EQ(e[0],
            "spec.x[0]: Invalid value: \"string\": spec.x[0] in body must be of type integer: "
            "\"string\"");
  EXPECT_EQ(e.back(), "too many errors, only the first 100 are reported");
}

// ---- Messages ------------------------------------------------------------------------------

TEST(Schema, FormatInvalid_IsTheApiServers422Message) {
  EXPECT_EQ(format_invalid("TrainingJob.kubetrain.dev", "x", {"spec.model: Required value"}),
            "TrainingJob.kubetrain.dev \"x\" is invalid: spec.model: Required value");
  EXPECT_EQ(format_invalid(
                "TrainingJob.kubetrain.dev", "x",
                {"spec.a: Required value", "spec.b: Required value", "spec.a: Required value"}),
            "TrainingJob.kubetrain.dev \"x\" is invalid: [spec.a: Required value, spec.b: Required "
            "value]");
  EXPECT_EQ(format_invalid("TrainingJob.kubetrain.dev", "x",
                           {"spec.a: Required value", "spec.a: Required value"}),
            "TrainingJob.kubetrain.dev \"x\" is invalid: spec.a: Required value");
}

TEST(Schema, UnknownFieldMessages_AreTheDecodersWording) {
  EXPECT_EQ(unknown_field_warning("spec.colour"), "unknown field \"spec.colour\"");
  EXPECT_EQ(
      strict_decoding_error({"spec.colour", "spec.model.foo"}),
      "strict decoding error: unknown field \"spec.colour\", unknown field \"spec.model.foo\"");
}

}  // namespace
}  // namespace kt::local

// crds/trainingjobs.kubetrain.dev.yaml against api/training_job: the schema has every field the
// decoder reads (and no field it does not), the same enums and the same defaults.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "api/model.h"
#include "api/training_job.h"
#include "api/yaml_json.h"
#include "local/store.h"
#include "tests/support/crd.h"

namespace kt {
namespace {

using api::Json;
using test::training_job_crd;

const Json& root_schema() {
  return training_job_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
}

// Every field of `value` has a schema (recursing until a pass-through subtree). Collects the
// paths that have none.
void find_unknown(const Json& value, const Json& schema, const std::string& path,
                  std::vector<std::string>& unknown) {
  if (!value.is_object() || schema.value("x-kubernetes-preserve-unknown-fields", false)) return;
  if (schema.contains("additionalProperties")) return;  // a map (nodeSelector)
  for (const auto& [key, child] : value.items()) {
    if (!schema.contains("properties") || !schema["properties"].contains(key)) {
      unknown.push_back(path + "." + key);
      continue;
    }
    find_unknown(child, schema["properties"][key], path + "." + key, unknown);
  }
}

// Every schema property appears in `value` (which must have every field set). Collects the
// paths that do not.
void find_missing(const Json& value, const Json& schema, const std::string& path,
                  std::vector<std::string>& missing) {
  if (!schema.contains("properties")) return;
  for (const auto& [key, child] : schema["properties"].items()) {
    if (!value.is_object() || !value.contains(key)) {
      missing.push_back(path + "." + key);
      continue;
    }
    find_missing(value[key], child, path + "." + key, missing);
  }
}

// A spec with every optional field set, so that to_json emits every field.
api::TrainingJobSpec full_spec() {
  api::TrainingJobSpec s;
  s.model = {"tiny", 2, 64, 4, 256, 256, 64};
  s.training.steps = 10;
  s.training.micro_batch_size = 4;
  s.training.warmup_steps = 2;
  s.training.precision = api::Precision::kFp32;
  s.data.source = api::DataSource::kTokens;
  s.data.path = "/data/*.bin";
  s.data.volume = {{"persistentVolumeClaim", {{"claimName", "data"}}}};
  s.resources.max_nodes = 2;
  s.resources.min_nodes = 1;
  s.resources.gpus_per_node = 4;
  s.resources.node_selector = {{"pool", "gpu"}};
  s.resources.tolerations = Json::array({{{"key", "gpu"}, {"operator", "Exists"}}});
  s.resources.affinity = {{"nodeAffinity", Json::object()}};
  s.resources.image = "worker:1";
  s.resources.resources = {{"limits", {{"memory", "8Gi"}}}};
  s.parallelism = {
      2,   1,   2,    2,    true, true, api::Recompute::kFull, api::OffloadMode::kWindow, 2,
      0.5, 1e9, true, true, 1,    2};
  s.checkpoint.volume = {{"emptyDir", Json::object()}};
  s.run_policy.active_deadline_seconds = 60;
  s.run_policy.ttl_seconds_after_finished = 60;
  s.run_policy.scheduling = {api::GangScheduler::kVolcano, "research", 120};
  return s;
}

api::TrainingJobStatus full_status() {
  api::TrainingJobStatus s;
  s.phase = api::JobPhase::kRunning;
  s.conditions = {{"Running", "True", "Training", "step 1", 1, "2026-01-01T00:00:00Z"}};
  s.plan = api::PlanSummary{};
  s.plan->cut_layer = 1;  // (encoded only when set)
  s.plan->cut_tp = 2;
  s.plan->virtual_stages = 2;  // (encoded only when > 1)
  s.progress.loss = 1;
  s.progress.eta_seconds = 1;
  s.progress.step_seconds = 1;
  s.last_checkpoint_step = 1;
  s.start_time = s.completion_time = "2026-01-01T00:00:00Z";
  s.plan_history = {{"2026-01-01T00:00:00Z", "Autotune", "m", "a", "b", 2, 1, 1.5}};
  s.autotune = api::AutotuneStatus{1, 0, 1.5, 2, 1, "m"};
  return s;
}

TEST(TrainingJobCrd, SpecSchema_HasExactlyTheDecodersFields) {
  const Json spec_schema = root_schema()["properties"]["spec"];
  const Json spec = api::to_json(full_spec());
  std::vector<std::string> unknown, missing;
  find_unknown(spec, spec_schema, "spec", unknown);
  find_missing(spec, spec_schema, "spec", missing);
  EXPECT_TRUE(unknown.empty()) << "fields without a schema: " << Json(unknown).dump();
  EXPECT_TRUE(missing.empty()) << "schema fields the decoder does not know: "
                               << Json(missing).dump();
  // And the decoder accepts the full spec back (no field is spelled differently).
  const Json manifest = {{"apiVersion", api::kApiVersion},
                         {"kind", "TrainingJob"},
                         {"metadata", {{"name", "j"}}},
                         {"spec", spec}};
  EXPECT_NO_THROW(api::decode_training_job(manifest));
}

TEST(TrainingJobCrd, StatusSchema_HasExactlyTheStatusFields) {
  const Json status_schema = root_schema()["properties"]["status"];
  const Json status = api::to_json(full_status());
  std::vector<std::string> unknown, missing;
  find_unknown(status, status_schema, "status", unknown);
  // Conditions are an array: check the item schema separately.
  find_unknown(status["conditions"][0], status_schema["properties"]["conditions"]["items"],
               "status.conditions[]", unknown);
  find_missing(status, status_schema, "status", missing);
  EXPECT_TRUE(unknown.empty()) << Json(unknown).dump();
  EXPECT_TRUE(missing.empty()) << Json(missing).dump();
}

TEST(TrainingJobCrd, Examples_UseOnlySchemaFields) {
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(KT_SOURCE_DIR) + "/examples/jobs")) {
    std::vector<std::string> unknown;
    find_unknown(api::load_document(entry.path().string())["spec"],
                 root_schema()["properties"]["spec"], "spec", unknown);
    EXPECT_TRUE(unknown.empty()) << entry.path() << ": " << Json(unknown).dump();
  }
}

std::set<std::string> enum_of(const std::string& pointer) {
  std::set<std::string> out;
  for (const auto& v : root_schema().at(Json::json_pointer(pointer))["enum"]) out.insert(v);
  return out;
}

template <class E>
std::set<std::string> names(std::initializer_list<E> values, bool with_auto) {
  std::set<std::string> out;
  for (E v : values) out.insert(std::string(api::to_string(v)));
  if (with_auto) out.insert("auto");
  return out;
}

TEST(TrainingJobCrd, Enums_AreTheApis) {
  const std::string spec = "/properties/spec/properties";
  EXPECT_EQ(
      enum_of(spec + "/parallelism/properties/recompute"),
      names({api::Recompute::kNone, api::Recompute::kCommAware, api::Recompute::kFull}, true));
  EXPECT_EQ(
      enum_of(spec + "/parallelism/properties/offload"),
      names({api::OffloadMode::kNone, api::OffloadMode::kOptimizer, api::OffloadMode::kWindow},
            true));
  EXPECT_EQ(enum_of(spec + "/training/properties/precision"),
            names({api::Precision::kBf16, api::Precision::kFp32}, true));
  EXPECT_EQ(enum_of(spec + "/data/properties/source"),
            names({api::DataSource::kSynthetic, api::DataSource::kTokens}, false));
  EXPECT_EQ(
      enum_of(spec + "/runPolicy/properties/cleanPodPolicy"),
      names({api::CleanPodPolicy::kAll, api::CleanPodPolicy::kRunning, api::CleanPodPolicy::kNone},
            false));
  EXPECT_EQ(enum_of(spec + "/runPolicy/properties/schedulingPolicy/properties/gangScheduler"),
            names({api::GangScheduler::kNone, api::GangScheduler::kCoscheduling,
                   api::GangScheduler::kVolcano, api::GangScheduler::kKueue},
                  false));
  std::set<std::string> presets;
  for (const auto& p : api::model_presets()) presets.insert(p.name);
  EXPECT_EQ(enum_of(spec + "/model/properties/preset"), presets);
  std::set<std::string> phases;
  for (int i = 0; i <= static_cast<int>(api::JobPhase::kSuspended); ++i)
    phases.insert(std::string(api::to_string(static_cast<api::JobPhase>(i))));
  EXPECT_EQ(enum_of("/properties/status/properties/phase"), phases);
}

// Every schema default equals what the decoder fills in for a spec that leaves the field out.
void check_defaults(const Json& schema, const Json& decoded, const std::string& path) {
  if (schema.contains("default")) {
    EXPECT_EQ(schema["default"], decoded) << path;
  }
  if (!schema.contains("properties")) return;
  for (const auto& [key, child] : schema["properties"].items())
    if (child.contains("default") || child.contains("properties"))
      check_defaults(child, decoded.is_object() && decoded.contains(key) ? decoded[key] : Json(),
                     path + "." + key);
}

TEST(TrainingJobCrd, Defaults_AreTheDecoders) {
  const Json minimal = {{"apiVersion", api::kApiVersion},
                        {"kind", "TrainingJob"},
                        {"metadata", {{"name", "j"}}},
                        {"spec", {{"model", {{"preset", "tiny"}}}, {"training", {{"steps", 1}}}}}};
  const Json decoded = api::to_json(api::decode_training_job(minimal).spec);
  check_defaults(root_schema()["properties"]["spec"], decoded, "spec");
}

TEST(TrainingJobCrd, Maximums_AreTheValidatorsLimits) {
  // The API server refuses what validate() would (kubectl apply fails at the door, not the
  // operator later), with the same numbers.
  const Json& spec = root_schema()["properties"]["spec"]["properties"];
  using ML = api::ModelLimits;
  using JL = api::JobLimits;
  const std::vector<std::pair<std::string, int64_t>> limits = {
      {"/model/properties/layers", ML::kLayers},
      {"/model/properties/hidden", ML::kHidden},
      {"/model/properties/heads", ML::kHeads},
      {"/model/properties/ffnHidden", ML::kFfnHidden},
      {"/model/properties/vocab", ML::kVocab},
      {"/model/properties/seqLen", ML::kSeqLen},
      {"/training/properties/steps", JL::kSteps},
      {"/training/properties/globalBatchSize", JL::kGlobalBatchSize},
      {"/training/properties/microBatchSize", JL::kGlobalBatchSize},
      {"/resources/properties/maxNodes", JL::kNodes},
      {"/resources/properties/minNodes", JL::kNodes},
      {"/resources/properties/gpusPerNode", JL::kGpusPerNode},
      {"/parallelism/properties/tensorParallel", JL::kParallel},
      {"/parallelism/properties/dataParallel", JL::kParallel},
      {"/checkpoint/properties/keep", JL::kCheckpointKeep},
      {"/runPolicy/properties/backoffLimit", JL::kBackoffLimit},
  };
  for (const auto& [pointer, limit] : limits) {
    const Json& field = spec.at(Json::json_pointer(pointer));
    ASSERT_TRUE(field.contains("maximum")) << pointer;
    EXPECT_EQ(field["maximum"].get<int64_t>(), limit) << pointer;
  }
}

TEST(TrainingJobCrd, PrinterColumns_AreDesignsAndPointAtSchemaFields) {
  std::vector<std::string> columns, wide;
  for (const auto& c : training_job_crd()["spec"]["versions"][0]["additionalPrinterColumns"]) {
    (c.value("priority", 0) == 0 ? columns : wide).push_back(c["name"]);
    const std::string path = c["jsonPath"];  // ".status.plan.tp"
    if (path == ".metadata.creationTimestamp") continue;
    Json node = root_schema();
    size_t start = 1;
    while (start < path.size()) {
      const size_t dot = path.find('.', start);
      const std::string key = path.substr(start, dot == std::string::npos ? dot : dot - start);
      ASSERT_TRUE(node.contains("properties") && node["properties"].contains(key)) << path;
      node = node["properties"][key];
      start = dot == std::string::npos ? path.size() : dot + 1;
    }
  }
  const std::vector<std::string> design = {"Phase", "Nodes", "TP",    "DP",       "Offload",
                                           "Step",  "Loss",  "Tok/s", "Restarts", "Age"};
  EXPECT_EQ(columns, design);
  // -o wide: the pipeline stages and their virtual stages, the sharded optimizer and the
  // cutpoint's second TP degree, and the measured step time beside the predicted one.
  EXPECT_EQ(wide,
            (std::vector<std::string>{"PP", "VPP", "ZeRO", "Cut TP", "Step s", "Predicted s"}));
  EXPECT_EQ(training_job_crd()["spec"]["names"]["shortNames"], Json::array({"tj"}));
  EXPECT_EQ(training_job_crd()["spec"]["names"]["categories"], Json::array({"all"}));
}

TEST(TrainingJobCrd, TheLocalStoreServesTheResourceItDefines) {
  local::Store store;
  store.create(kube::kCustomResourceDefinitions, "", training_job_crd());
  kube::Object job = store.create(
      kube::kTrainingJobs, "default",
      {{"metadata", {{"name", "j"}}},
       {"spec", {{"model", {{"preset", "tiny"}}}, {"training", {{"steps", 5}}}}}});
  job["status"] = {{"phase", "Running"}};
  EXPECT_FALSE(store.update(kube::kTrainingJobs, "default", job).contains("status"));
  EXPECT_EQ(store.update_status(kube::kTrainingJobs, "default", job)["status"]["phase"], "Running");
}

TEST(TrainingJobCrd, TheLocalStoreAppliesItsSchema_DefaultsPrunesAndRefusesWithFieldPaths) {
  local::Store store;
  store.create(kube::kCustomResourceDefinitions, "", training_job_crd());
  const kube::Object job = store.create(
      kube::kTrainingJobs, "default",
      {{"metadata", {{"name", "j"}}},
       {"spec",
        {{"colour", "blue"}, {"model", {{"preset", "tiny"}}}, {"training", {{"steps", 5}}}}}});
  EXPECT_FALSE(job["spec"].contains("colour"));                  // pruned
  EXPECT_EQ(job["spec"]["training"]["globalBatchSize"], 32);     // defaulted
  try {
    store.create(kube::kTrainingJobs, "default",
                 {{"metadata", {{"name", "bad"}}},
                  {"spec",
                   {{"model", {{"preset", "tiny"}}},
                    {"training", {{"steps", 0}}},
                    {"parallelism", {{"offload", "sometimes"}}}}}});
    FAIL() << "an invalid TrainingJob was stored";
  } catch (const kube::ApiError& e) {
    EXPECT_EQ(e.code(), 422);
    const std::string message = e.what();
    EXPECT_NE(message.find("TrainingJob.kubetrain.dev \"bad\" is invalid"), std::string::npos);
    EXPECT_NE(message.find("spec.parallelism.offload: Unsupported value: \"sometimes\""),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("spec.training.steps: Invalid value: 0"), std::string::npos) << message;
    EXPECT_EQ(e.details()["causes"].size(), 2u);
  }
  // A status that breaks the schema is refused too (the API server validates the whole object).
  kube::Object bad_status = store.get(kube::kTrainingJobs, "default", "j");
  bad_status["status"] = {{"phase", "Dancing"}};
  EXPECT_THROW(store.update_status(kube::kTrainingJobs, "default", bad_status), kube::ApiError);
}

}  // namespace
}  // namespace kt

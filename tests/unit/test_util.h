// Small helpers shared by the unit tests: building jobs and inventories in code.
#pragma once

#include <string>

#include "api/inventory.h"
#include "api/training_job.h"
#include "api/yaml_json.h"

namespace kt::test {

inline std::string source_path(const std::string& relative) {
  return std::string(KT_SOURCE_DIR) + "/" + relative;
}

inline api::TrainingJob job_from_yaml(const std::string& yaml) {
  return api::decode_training_job(api::yaml_to_json(yaml));
}

// A job with explicit dims and optional extra spec YAML appended under `spec:`.
inline api::TrainingJob gpt_job(const std::string& model_yaml, const std::string& extra = "",
                                int global_batch = 256) {
  // `extra` may bring its own training section.
  const bool own_training = extra.find("  training:") != std::string::npos;
  return job_from_yaml(
      "apiVersion: kubetrain.dev/v1alpha1\nkind: TrainingJob\n"
      "metadata: {name: t}\nspec:\n  model: " +
      model_yaml + "\n" +
      (own_training
           ? std::string()
           : "  training: {steps: 100, globalBatchSize: " + std::to_string(global_batch) + "}\n") +
      extra);
}

inline api::Inventory cluster(const std::string& name) {
  return api::load_inventory(source_path("examples/clusters/" + name + ".yaml"));
}

inline api::Inventory inventory_from_yaml(const std::string& yaml) {
  return api::inventory_from_document(api::yaml_to_json(yaml), "test");
}

}  // namespace kt::test

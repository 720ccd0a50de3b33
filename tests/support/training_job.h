// A TrainingJob object as a client sends it to the API server, for the operator tests.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace kt::test {

// The tiny preset for 10 steps in the default namespace; everything else left to the defaults.
inline nlohmann::json tiny_job_object(const std::string& name) {
  return {{"apiVersion", "kubetrain.dev/v1alpha1"},
          {"kind", "TrainingJob"},
          {"metadata", {{"name", name}}},
          {"spec", {{"model", {{"preset", "tiny"}}}, {"training", {{"steps", 10}}}}}};
}

}  // namespace kt::test

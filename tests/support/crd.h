// The TrainingJob CRD as the repo ships it (crds/trainingjobs.kubetrain.dev.yaml), read once.
// The test target defines KT_SOURCE_DIR.
#pragma once

#include <string>

#include "api/yaml_json.h"

namespace kt::test {

inline const api::Json& training_job_crd() {
  static const api::Json doc =
      api::load_document(std::string(KT_SOURCE_DIR) + "/crds/trainingjobs.kubetrain.dev.yaml");
  return doc;
}

}  // namespace kt::test

// libFuzzer harness: TrainingJob manifests (api/training_job.h), as `kubetrain validate`, `plan`,
// `run` and the operator read them: YAML or JSON, decoded strictly, then validated. Any input
// must decode or be refused with kt::Error (FieldError, ValidationError); a decoded job's JSON
// must decode again to the same job (to_json ∘ decode is a fixed point), and validation must
// not depend on the round trip.
//   fuzz/run.sh training_job 60
#include <cstddef>
#include <cstdint>
#include <string>

#include "api/error.h"
#include "api/training_job.h"
#include "api/yaml_json.h"
#include "fuzz/fuzz_check.h"

namespace {

using kt::api::Json;

std::string messages(const std::vector<kt::FieldError>& errors) {
  std::string text;
  for (const auto& e : errors) text += std::string(e.what()) + "\n";
  return text;
}

void check(const Json& manifest) {
  kt::api::TrainingJob job;
  try {
    job = kt::api::decode_training_job(manifest);
  } catch (const kt::Error&) {
    return;
  }
  const std::vector<kt::FieldError> errors = kt::api::validate(job);
  for (const auto& e : errors) (void)e.what();
  if (errors.empty()) (void)kt::api::resolve_model(job.spec.model);
  const Json encoded = kt::api::to_json(job);
  const std::string text = encoded.dump(-1, ' ', false, Json::error_handler_t::replace);
  kt::api::TrainingJob again;
  try {
    again = kt::api::decode_training_job(encoded);
  } catch (const kt::Error& e) {
    FUZZ_CHECK(false, std::string("the job's own JSON does not decode: ") + e.what() + "\n" + text);
  }
  FUZZ_CHECK(kt::api::to_json(again) == encoded, "decode(to_json(job)) differs:\n" + text);
  FUZZ_CHECK(messages(kt::api::validate(again)) == messages(errors),
             "validation differs after the round trip:\n" + messages(errors) + "vs\n" +
                 messages(kt::api::validate(again)) + text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(kt::fuzz::as_text(data, size));
  try {
    check(kt::api::yaml_to_json(text, "job.yaml"));
  } catch (const kt::Error&) {
  }
  try {
    check(kt::api::parse_json(text, "job.json"));
  } catch (const kt::Error&) {
  }
  return 0;
}

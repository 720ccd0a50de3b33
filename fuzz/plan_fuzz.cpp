// libFuzzer harness: Plan JSON (api/plan.h), what the worker reads from the ConfigMap the
// operator wrote (or from a file a user edited). Any input must decode or be refused with
// kt::Error; a decoded plan's JSON must decode to the same plan with the same hash.
//   fuzz/run.sh plan 60
#include <cstddef>
#include <cstdint>
#include <string>

#include "api/error.h"
#include "api/plan.h"
#include "api/yaml_json.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kt::api::Json;
  kt::api::Plan plan;
  try {
    plan = kt::api::decode_plan(kt::api::parse_json(std::string(kt::fuzz::as_text(data, size)),
                                                    "plan.json"));
  } catch (const kt::Error&) {
    return 0;
  }
  const std::string hash = kt::api::compute_plan_hash(plan);
  FUZZ_CHECK(hash.size() == 16, hash);
  const Json encoded = kt::api::to_json(plan);
  const std::string text = encoded.dump(-1, ' ', false, Json::error_handler_t::replace);
  kt::api::Plan again;
  try {
    again = kt::api::decode_plan(encoded);
  } catch (const kt::Error& e) {
    FUZZ_CHECK(false, std::string("the plan's own JSON does not decode: ") + e.what() + "\n" + text);
  }
  FUZZ_CHECK(kt::api::to_json(again) == encoded, "decode(to_json(plan)) differs:\n" + text);
  FUZZ_CHECK(kt::api::compute_plan_hash(again) == hash, "the hash changed in a round trip\n" + text);
  return 0;
}

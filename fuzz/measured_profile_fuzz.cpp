// libFuzzer harness: measured hardware profiles (api/measured_profile.h), as `kubetrain plan
// --profile FILE` reads them. Input: the document (YAML or JSON). It must decode or be refused
// with a kt::Error (a FieldError naming the field, or the YAML reader's error); a decoded
// profile has every figure finite and positive (latency and interference may be 0) and reads
// back the same from its own JSON.
//   fuzz/run.sh measured_profile 60
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "api/error.h"
#include "api/measured_profile.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(kt::fuzz::as_text(data, size));
  kt::api::MeasuredProfile m;
  try {
    m = kt::api::decode_measured_profile(kt::api::yaml_to_json(text, "profile"));
  } catch (const kt::Error&) {
    return 0;
  }
  const auto& p = m.profile;
  for (double v : {p.peak_bf16_flops, p.peak_fp32_flops, p.achieved_fraction, p.memory_bandwidth,
                   p.host_link_bandwidth, p.intra_allreduce_busbw, p.inter_node_bandwidth,
                   p.cpu_adam_params_per_core})
    FUZZ_CHECK(std::isfinite(v) && v > 0, "a figure is " + std::to_string(v));
  FUZZ_CHECK(p.achieved_fraction <= 1, "achievedFraction " + std::to_string(p.achieved_fraction));
  FUZZ_CHECK(std::isfinite(p.allreduce_latency) && p.allreduce_latency >= 0, "latency");
  FUZZ_CHECK(std::isfinite(p.overlap_interference) && p.overlap_interference >= 0, "interference");
  const kt::api::Json again = kt::api::to_json(kt::api::decode_measured_profile(kt::api::to_json(m)));
  FUZZ_CHECK(again == kt::api::to_json(m), again.dump());
  return 0;
}

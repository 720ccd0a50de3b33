// libFuzzer harness: hardware profiles (api/hardware.h): the GPU product a node reports
// (nvidia.com/gpu.product) and the kubetrain.dev/* override annotations on it. Input: the
// product, then "key=value" annotation lines, separated by newlines. A product either finds a
// profile or none; overrides apply or throw FieldError naming the annotation; an applied
// override leaves every figure finite and positive where it must be.
//   fuzz/run.sh hardware 60
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "api/error.h"
#include "api/hardware.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto lines = kt::fuzz::split(kt::fuzz::as_text(data, size), '\n', 64);
  const kt::api::HardwareProfile* profile = kt::api::find_profile(lines[0]);
  if (profile) {
    FUZZ_CHECK(kt::api::find_profile(profile->name) == profile, profile->name);
  }
  std::map<std::string, std::string> annotations;
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t eq = lines[i].find('=');
    std::string key = lines[i].substr(0, eq);
    if (key.find('/') == std::string::npos) key = "kubetrain.dev/" + key;
    annotations[key] = eq == std::string::npos ? "" : lines[i].substr(eq + 1);
  }
  const kt::api::HardwareProfile& base = profile ? *profile : kt::api::cpu_profile();
  kt::api::HardwareProfile hw;
  try {
    hw = kt::api::apply_overrides(base, annotations, "nodes[0]");
  } catch (const kt::FieldError& e) {
    FUZZ_CHECK(e.path().rfind("nodes[0].annotations.", 0) == 0, e.what());
    return 0;
  }
  FUZZ_CHECK(hw.achieved_fraction > 0 && hw.achieved_fraction <= 1,
             std::to_string(hw.achieved_fraction));
  for (double x : {hw.peak_bf16_flops, hw.peak_fp32_flops, hw.memory_bytes, hw.memory_bandwidth,
                   hw.host_link_bandwidth, hw.intra_allreduce_busbw, hw.inter_node_bandwidth,
                   hw.allreduce_latency, hw.cpu_adam_params_per_core}) {
    FUZZ_CHECK(std::isfinite(x) && x >= 0, "a figure is " + std::to_string(x));
  }
  return 0;
}

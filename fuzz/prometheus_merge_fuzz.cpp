// libFuzzer harness: the Prometheus text expositions the launcher merges into one /metrics
// (telemetry/merge.h), one per rank. Input: the ranks' texts separated by NULs. The merge must
// not crash, must keep every sample line of the input that a family keeps, and must be a fixed
// point: merging the merged text alone changes nothing.
//   fuzz/run.sh prometheus_merge 60
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "telemetry/merge.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string> texts = kt::fuzz::split(kt::fuzz::as_text(data, size), '\0', 16);
  const std::string merged = kt::telemetry::merge_expositions(texts);
  FUZZ_CHECK(merged.empty() || merged.back() == '\n', merged);
  const std::string again = kt::telemetry::merge_expositions({merged});
  FUZZ_CHECK(again == merged, "not a fixed point:\n" + merged + "---- merged again:\n" + again);
  return 0;
}

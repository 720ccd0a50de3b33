// libFuzzer harness: rank 0's progress as the operator reads it (operator/controller/progress.h)
// from whatever answers on a worker pod's metrics port, or from its termination message. Any
// text must parse without throwing; every value kept must be finite, the label maps bounded, and
// a sample appended for a known metric must be what is then read.
//   fuzz/run.sh worker_progress 60
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_check.h"
#include "operator/controller/progress.h"

namespace {

void check_finite(const std::optional<double>& v, const char* what) {
  if (v) FUZZ_CHECK(std::isfinite(*v), std::string(what) + " is not finite");
}

void check_map(const std::map<std::string, double>& map, const char* what) {
  FUZZ_CHECK(map.size() <= kt::controller::kMaxProgressLabels,
             std::string(what) + ": " + std::to_string(map.size()) + " labels");
  for (const auto& [label, value] : map) {
    FUZZ_CHECK(label.size() <= kt::controller::kMaxProgressLabelBytes, "a long label kept");
    FUZZ_CHECK(std::isfinite(value), std::string(what) + "[" + label + "] is not finite");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(kt::fuzz::as_text(data, size));
  const kt::controller::WorkerProgress p = kt::controller::parse_worker_progress(text);
  check_finite(p.steps, "steps");
  check_finite(p.step, "step");
  check_finite(p.loss, "loss");
  check_finite(p.tokens_per_second, "tokens_per_second");
  check_finite(p.last_checkpoint_step, "last_checkpoint_step");
  check_finite(p.checkpoint_consecutive_failures, "checkpoint_consecutive_failures");
  check_map(p.phase_seconds, "phase_seconds");
  check_map(p.checkpoint_failures, "checkpoint_failures");
  // A last line that is a plain sample of the loss is read, whatever came before it (a line of
  // its own: the text before it ends with a newline).
  const kt::controller::WorkerProgress q =
      kt::controller::parse_worker_progress(text + "\nkubetrain_worker_loss 1.25\n");
  FUZZ_CHECK(q.loss && *q.loss == 1.25, "an appended loss sample was not read");
  return 0;
}

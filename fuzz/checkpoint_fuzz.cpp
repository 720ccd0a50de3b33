// libFuzzer harness: a checkpoint's small files (worker/checkpoint.h): the `latest` pointer and
// metadata.json, with the data cursor in it as the synthetic data source restores it. Input: the
// `latest` text (at most 64 bytes are read from the file), a NUL, then metadata.json. Anything
// must be read or refused with a std::runtime_error (kt::Error: unreadable here; otherwise
// damage, after which the loader tries the previous checkpoint), never another exception; a
// step that `latest` names reads back from its directory name.
//   fuzz/run.sh checkpoint 60
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "api/error.h"
#include "fuzz/fuzz_check.h"
#include "worker/checkpoint.h"
#include "worker/data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = kt::fuzz::split(kt::fuzz::as_text(data, size), '\0', 2);
  const std::string latest = parts[0].substr(0, 64);
  const kt::worker::LatestPointer pointer = kt::worker::parse_latest_pointer(latest);
  int64_t step = 120;
  if (pointer.step) {
    FUZZ_CHECK(*pointer.step >= 0 && pointer.problem.empty(), latest);
    step = *pointer.step;
    char name[32];
    std::snprintf(name, sizeof name, "step-%08lld\n", static_cast<long long>(step));
    FUZZ_CHECK(kt::worker::parse_latest_pointer(name).step == step, name);
  } else {
    FUZZ_CHECK(!pointer.problem.empty(), latest);
  }
  if (parts.size() < 2) return 0;
  kt::worker::CheckpointMeta meta;
  try {
    meta = kt::worker::parse_checkpoint_metadata(parts[1], "/ckpt/step-00000120", step);
  } catch (const std::runtime_error&) {
    return 0;
  }
  FUZZ_CHECK(meta.step == step, "step " + std::to_string(meta.step));
  // The data cursor, as the worker restores it after loading.
  static kt::worker::SyntheticMarkov source(16, 1, 2, 1, 0, 2);
  try {
    source.restore(meta.data_cursor);
    (void)source.cursor();
  } catch (const kt::Error&) {
  }
  return 0;
}

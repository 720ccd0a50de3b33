// libFuzzer harness: manifests (api/yaml_json.h), the YAML/JSON every CLI command and local
// serve reads. Any input must parse or be refused with kt::Error.
//   fuzz/run.sh yaml 60
#include <cstddef>
#include <cstdint>
#include <string>

#include "api/error.h"
#include "api/yaml_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    // Not dumped: a non-UTF-8 string would make nlohmann's dump() throw (api/utf8.h).
    (void)kt::api::yaml_to_json(text, "fuzz.yaml");
  } catch (const kt::Error&) {
  }
  try {
    (void)kt::api::parse_json(text, "fuzz.json");
  } catch (const kt::Error&) {
  }
  return 0;
}

// libFuzzer harness: Kubernetes protobuf request bodies (local/protobuf.h), what
// `kubetrain local serve` decodes from any client. Any input must decode or be refused with an
// ApiError; a crash, leak, hang or sanitizer report is a finding.
//   fuzz/run.sh kube_protobuf 60
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "local/protobuf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const kt::kube::Object object =
        kt::local::decode_kubernetes_protobuf(std::string_view(reinterpret_cast<const char*>(data), size));
    (void)object.dump();  // what the server then stores and serves must be valid JSON
  } catch (const kt::kube::ApiError&) {
  }
  return 0;
}

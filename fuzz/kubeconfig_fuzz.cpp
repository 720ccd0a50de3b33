// libFuzzer harness: kubeconfig files (operator/kube/config.h), what the operator and
// `kubetrain` read from --kubeconfig, $KUBECONFIG or ~/.kube/config. Input: a context name, a
// newline, then the file. Any input must give a Config or be refused with kt::Error naming the
// file; a Config always names a server.
//   fuzz/run.sh kubeconfig 60
#include <cstddef>
#include <cstdint>
#include <string>

#include "api/error.h"
#include "fuzz/fuzz_check.h"
#include "operator/kube/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = kt::fuzz::split(kt::fuzz::as_text(data, size), '\n', 2);
  const std::string text = parts.size() > 1 ? parts[1] : parts[0];
  for (const std::string& context : {std::string(), parts[0]}) {
    try {
      const kt::kube::Config config =
          kt::kube::parse_kubeconfig(text, "/fuzz/.kube/config", context);
      FUZZ_CHECK(!config.server.empty(), "a config without a server");
      FUZZ_CHECK(!config.namespace_.empty(), "a config without a namespace");
    } catch (const kt::Error& e) {
      FUZZ_CHECK(std::string(e.what()).find("/fuzz/.kube/config") != std::string::npos, e.what());
    }
  }
  return 0;
}

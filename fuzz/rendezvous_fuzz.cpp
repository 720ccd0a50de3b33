// libFuzzer harness: the rendezvous store's wire protocol (worker/rendezvous_protocol.h), what
// rank 0's store reads from every rank's connection. Input: the bytes a client sends. Messages
// are read one after another as the server does, until the stream ends or a bound is hit; each
// must re-encode to exactly the bytes it was read from, and parse as a request or be refused
// with kt::Error (the server then replies error).
//   fuzz/run.sh rendezvous 60
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "api/error.h"
#include "fuzz/fuzz_check.h"
#include "worker/rendezvous_protocol.h"

namespace rdv = kt::worker::rendezvous;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  size_t at = 0;
  auto read_exact = [&](void* out, size_t n) {
    if (n > size - at) return false;
    std::memcpy(out, data + at, n);
    at += n;
    return true;
  };
  for (;;) {
    const size_t start = at;
    rdv::Message message;
    if (!rdv::read_message(read_exact, message)) break;
    const std::string wire = rdv::encode_message(message);
    FUZZ_CHECK(wire.size() == at - start && std::memcmp(wire.data(), data + start, wire.size()) == 0,
               "a message does not re-encode to its bytes");
    try {
      const rdv::Request request = rdv::parse_request(message);
      FUZZ_CHECK(request.timeout.count() >= 0 && request.timeout.count() <= 86'400'000,
                 std::to_string(request.timeout.count()));
      FUZZ_CHECK(request.op == rdv::Request::Op::kWait || request.keys.size() == 1, "keys");
    } catch (const kt::Error& e) {
      FUZZ_CHECK(std::string(e.what()).rfind("rendezvous request: ", 0) == 0, e.what());
    }
  }
  return 0;
}

// The wire format of the rendezvous store (worker/rendezvous.h), apart from the sockets so that
// it can be tested and fuzzed on bytes: a message is a u32 field count followed by (u32 length,
// bytes) per field, all big endian. Requests:
//   set KEY VALUE                      -> ok
//   get KEY TIMEOUT_MS ABORT_KEY       -> ok VALUE | timeout KEY | abort WHY
//   wait TIMEOUT_MS ABORT_KEY KEY...   -> ok | timeout MISSING... | abort WHY
// and error WHY for anything else.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace kt::worker::rendezvous {

using Message = std::vector<std::string>;

// Bounds that keep a confused or hostile peer from making us allocate gigabytes.
inline constexpr uint32_t kMaxFields = 1 << 16;
inline constexpr uint32_t kMaxFieldBytes = 64u << 20;

std::string encode_message(const Message& message);

// Reads one message through `read_exact` (which fills exactly `size` bytes or returns false).
// False when the stream ended or a count or length is over the bounds.
bool read_message(const std::function<bool(void* data, size_t size)>& read_exact,
                  Message& message);

// A request, checked: its op and arguments. Timeouts are clamped to [0, a day] so that deadline
// arithmetic cannot overflow.
struct Request {
  enum class Op { kSet, kGet, kWait } op = Op::kSet;
  std::vector<std::string> keys;  // set, get: one
  std::string value;              // set
  std::chrono::milliseconds timeout{0};
  std::string abort_key;  // "" for none
};

// Throws kt::Error("rendezvous request: ...") naming what is wrong (the server replies error).
Request parse_request(const Message& message);

}  // namespace kt::worker::rendezvous

#include "worker/rendezvous_protocol.h"

#include <arpa/inet.h>

#include <algorithm>
#include <charconv>

#include "api/error.h"

namespace kt::worker::rendezvous {
namespace {

constexpr uint32_t kReadPieceBytes = 64 << 10;

void append_u32(std::string& out, uint32_t value) {
  const uint32_t be = htonl(value);
  out.append(reinterpret_cast<const char*>(&be), sizeof(be));
}

bool read_u32(const std::function<bool(void*, size_t)>& read_exact, uint32_t& value) {
  uint32_t be = 0;
  if (!read_exact(&be, sizeof(be))) return false;
  value = ntohl(be);
  return true;
}

// A decimal count of milliseconds, clamped to a day.
std::chrono::milliseconds parse_millis(const std::string& text, const char* op) {
  long long ms = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), ms);
  if (text.empty() || end != text.data() + text.size() ||
      (ec != std::errc() && ec != std::errc::result_out_of_range)) {
    throw Error(std::string("rendezvous request: ") + op + ": the timeout \"" + text.substr(0, 32) +
                "\" is not a number of milliseconds");
  }
  if (ec == std::errc::result_out_of_range) ms = text[0] == '-' ? 0 : 86'400'000;
  return std::chrono::milliseconds(std::clamp<long long>(ms, 0, 86'400'000));
}

}  // namespace

std::string encode_message(const Message& message) {
  std::string wire;
  append_u32(wire, static_cast<uint32_t>(message.size()));
  for (const auto& field : message) {
    append_u32(wire, static_cast<uint32_t>(field.size()));
    wire += field;
  }
  return wire;
}

bool read_message(const std::function<bool(void*, size_t)>& read_exact, Message& message) {
  uint32_t fields = 0;
  if (!read_u32(read_exact, fields) || fields > kMaxFields) return false;
  message.assign(fields, {});
  for (auto& field : message) {
    uint32_t size = 0;
    if (!read_u32(read_exact, size) || size > kMaxFieldBytes) return false;
    // Grown as the bytes arrive: a length alone does not get a peer 64 MiB of our memory.
    for (uint32_t left = size; left > 0;) {
      const uint32_t piece = std::min<uint32_t>(left, kReadPieceBytes);
      const size_t at = field.size();
      field.resize(at + piece);
      if (!read_exact(field.data() + at, piece)) return false;
      left -= piece;
    }
  }
  return true;
}

Request parse_request(const Message& message) {
  if (message.empty()) throw Error("rendezvous request: empty");
  const std::string& op = message[0];
  Request request;
  if (op == "set" && message.size() == 3) {
    request.op = Request::Op::kSet;
    request.keys = {message[1]};
    request.value = message[2];
  } else if (op == "get" && message.size() == 4) {
    request.op = Request::Op::kGet;
    request.keys = {message[1]};
    request.timeout = parse_millis(message[2], "get");
    request.abort_key = message[3];
  } else if (op == "wait" && message.size() >= 3) {
    request.op = Request::Op::kWait;
    request.timeout = parse_millis(message[1], "wait");
    request.abort_key = message[2];
    request.keys.assign(message.begin() + 3, message.end());
  } else {
    throw Error("rendezvous request: unknown request " + op.substr(0, 32) + " with " +
                std::to_string(message.size() - 1) + " argument(s)");
  }
  return request;
}

}  // namespace kt::worker::rendezvous

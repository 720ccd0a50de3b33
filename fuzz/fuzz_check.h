// Shared by the libFuzzer harnesses: the input as text or as parts, and FUZZ_CHECK, an invariant
// that aborts (a finding) with the input's story when it fails.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace kt::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// The input cut at `separator` into at most `max_parts` parts (the last keeps the rest).
inline std::vector<std::string> split(std::string_view text, char separator, size_t max_parts) {
  std::vector<std::string> parts;
  while (parts.size() + 1 < max_parts) {
    const size_t at = text.find(separator);
    if (at == std::string_view::npos) break;
    parts.emplace_back(text.substr(0, at));
    text.remove_prefix(at + 1);
  }
  parts.emplace_back(text);
  return parts;
}

[[noreturn]] inline void invariant_failed(const char* condition, const char* file, int line,
                                          const std::string& detail) {
  std::fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n  %s\n", file, line, condition,
               detail.substr(0, 4000).c_str());
  std::abort();
}

}  // namespace kt::fuzz

#define FUZZ_CHECK(cond, detail)                                                   \
  do {                                                                             \
    if (!(cond)) ::kt::fuzz::invariant_failed(#cond, __FILE__, __LINE__, (detail)); \
  } while (0)

// Well-formed UTF-8 as RFC 3629 §4 defines it: no overlong forms, no surrogates, nothing past
// U+10FFFF. JSON text must be UTF-8 (RFC 8259 §8.1) and nlohmann's dump() throws on anything
// else, so every outside string that can end up in JSON is checked where it comes in.
#pragma once

#include <cstddef>
#include <string_view>

namespace kt::api {

// The offset of the first byte that is not part of well-formed UTF-8; npos when all are.
size_t invalid_utf8_offset(std::string_view text);

}  // namespace kt::api

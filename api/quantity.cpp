#include "api/quantity.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace kt::api {

std::optional<double> parse_quantity(std::string_view text) {
  if (text.empty()) return std::nullopt;
  // Number part: optional sign, digits, optional fraction. Kubernetes does not accept ".5"
  // without a leading digit either, but accepting it is harmless.
  size_t i = 0;
  if (text[i] == '+' || text[i] == '-') ++i;
  size_t digits = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) {
    if (text[i] != '.') ++digits;
    ++i;
  }
  if (digits == 0) return std::nullopt;
  const std::string number(text.substr(0, i));
  char* end = nullptr;
  double value = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size()) return std::nullopt;
  std::string_view suffix = text.substr(i);
  if (suffix.empty()) return value;
  if (suffix[0] == 'e' || suffix[0] == 'E') {
    std::string exponent(suffix.substr(1));
    if (exponent.empty()) return std::nullopt;
    char* exp_end = nullptr;
    long e = std::strtol(exponent.c_str(), &exp_end, 10);
    if (exp_end != exponent.c_str() + exponent.size()) return std::nullopt;
    return value * std::pow(10.0, static_cast<double>(e));
  }
  struct Suffix {
    std::string_view name;
    double factor;
  };
  static constexpr Suffix kSuffixes[] = {
      {"Ki", 0x1p10}, {"Mi", 0x1p20}, {"Gi", 0x1p30}, {"Ti", 0x1p40}, {"Pi", 0x1p50},
      {"Ei", 0x1p60}, {"m", 1e-3},    {"k", 1e3},     {"M", 1e6},     {"G", 1e9},
      {"T", 1e12},    {"P", 1e15},    {"E", 1e18},
  };
  for (const auto& s : kSuffixes) {
    if (suffix == s.name) return value * s.factor;
  }
  return std::nullopt;
}

std::string fmt(const char* format, double value) {
  char buf[96];
  std::snprintf(buf, sizeof buf, format, value);
  return buf;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  double v = bytes;
  while (std::fabs(v) >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%.0f B", v);
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

std::string format_count(double count) {
  const char* suffix = "";
  double value = count;
  if (count >= 1e9) {
    value = count / 1e9;
    suffix = " B";
  } else if (count >= 1e6) {
    value = count / 1e6;
    suffix = " M";
  } else if (count >= 1e3) {
    value = count / 1e3;
    suffix = " k";
  }
  const int decimals = value >= 100 ? 0 : value >= 10 ? 1 : 2;
  char text[64];
  std::snprintf(text, sizeof text, "%.*f%s", *suffix ? decimals : 0, value, suffix);
  return text;
}

}  // namespace kt::api

// Kubernetes resource quantities ("60Gi", "80G", "500m", "1.5e9") as plain numbers.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace kt::api {

// Parses a quantity in the Kubernetes grammar (binary suffixes Ki..Ei, decimal k..E, milli m,
// or an exponent). Returns nullopt when `text` is not a quantity.
std::optional<double> parse_quantity(std::string_view text);

// printf-style formatting of one number: fmt("%.2f×", 1.234) == "1.23×".
std::string fmt(const char* format, double value);

// Formats bytes for people: "93.1 GiB", "512.0 MiB".
std::string format_bytes(double bytes);
// A count with an SI suffix and 3 significant digits: "1.56 B", "124 M", "223 k", "12".
std::string format_count(double count);

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;

}  // namespace kt::api

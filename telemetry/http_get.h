// A plain-socket HTTP/1.0 GET for scraping /metrics endpoints (the launcher's ranks, the
// operator's rank 0): no HTTP library needed, and a deadline on every wait.
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace kt::telemetry {

// The body of http://host:port/path when the answer is 200, else std::nullopt (refused,
// timed out, another status, or a response of more than `max_bytes`: a pod's /metrics is a few
// KiB, and whatever answers on its port cannot make the caller hold more). `host` is an IPv4
// address.
inline constexpr size_t kMaxHttpGetBytes = 4u << 20;
std::optional<std::string> http_get(const std::string& host, int port, const std::string& path,
                                    std::chrono::milliseconds timeout = std::chrono::seconds(2),
                                    size_t max_bytes = kMaxHttpGetBytes);

}  // namespace kt::telemetry

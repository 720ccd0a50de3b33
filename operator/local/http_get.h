// A plain-socket HTTP/1.0 GET for the local node's endpoints (a worker's /metrics on
// 127.0.0.1): no HTTP library needed, and a deadline on every wait.
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace kt::local {

// The body of http://host:port/path when the answer is 200, else std::nullopt (refused,
// timed out, another status). `host` is an IPv4 address.
std::optional<std::string> http_get(const std::string& host, int port, const std::string& path,
                                    std::chrono::milliseconds timeout = std::chrono::seconds(2));

}  // namespace kt::local

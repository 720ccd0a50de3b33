#include "telemetry/http_get.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>

namespace kt::telemetry {

std::optional<std::string> http_get(const std::string& host, int port, const std::string& path,
                                    std::chrono::milliseconds timeout, size_t max_bytes) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) return std::nullopt;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  timeval tv{static_cast<time_t>(timeout.count() / 1000),
             static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  std::string response;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request =
        "GET " + path + " HTTP/1.0\r\nHost: " + host + "\r\nConnection: close\r\n\r\n";
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
        static_cast<ssize_t>(request.size())) {
      char buffer[8192];
      ssize_t n;
      while ((n = ::recv(fd, buffer, sizeof(buffer), 0)) > 0) {
        response.append(buffer, static_cast<size_t>(n));
        if (response.size() > max_bytes) {
          ::close(fd);
          return std::nullopt;
        }
      }
    }
  }
  ::close(fd);
  const size_t header_end = response.find("\r\n\r\n");
  if (header_end == std::string::npos || response.compare(0, 7, "HTTP/1.") != 0 ||
      response.size() < 13 || response.compare(8, 5, " 200 ") != 0)
    return std::nullopt;
  std::string headers = response.substr(0, header_end);
  for (auto& c : headers) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string body = response.substr(header_end + 4);
  if (headers.find("transfer-encoding: chunked") == std::string::npos) return body;
  // De-chunk: "<hex size>\r\n<data>\r\n" ... "0\r\n\r\n".
  std::string out;
  size_t at = 0;
  while (at < body.size()) {
    const size_t eol = body.find("\r\n", at);
    if (eol == std::string::npos) return std::nullopt;
    const size_t size = std::strtoul(body.substr(at, eol - at).c_str(), nullptr, 16);
    if (size == 0) break;
    if (eol + 2 + size > body.size()) return std::nullopt;
    out.append(body, eol + 2, size);
    at = eol + 2 + size + 2;
  }
  return out;
}

}  // namespace kt::telemetry

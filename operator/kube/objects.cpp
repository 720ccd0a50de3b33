#include "operator/kube/objects.h"

#include <ctime>

#include "api/quantity.h"

namespace kt::kube {

using Clock = std::chrono::system_clock;

std::string rfc3339(Clock::time_point t) {
  const std::time_t secs = Clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string now_rfc3339() {
  return rfc3339(Clock::now());
}

std::optional<Clock::time_point> parse_rfc3339(const std::string& text) {
  std::tm tm{};
  if (text.empty() || !strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &tm)) return std::nullopt;
  return Clock::from_time_t(timegm(&tm));
}

double pod_request(const Object& pod, const std::string& resource) {
  double total = 0;
  for (const auto& c : pod["spec"].value("containers", Object::array())) {
    if (!c.is_object()) continue;
    const auto res = c.value("resources", Object::object());
    if (!res.is_object()) continue;
    for (const char* kind : {"requests", "limits"}) {
      const auto m = res.value(kind, Object::object());
      if (!m.is_object() || !m.contains(resource)) continue;
      const auto& v = m[resource];
      if (v.is_number()) total += v.get<double>();
      else if (v.is_string()) total += api::parse_quantity(v.get<std::string>()).value_or(0);
      break;  // requests, or limits when there are no requests
    }
  }
  return total;
}

double pod_gpu_request(const Object& pod) {
  return pod_request(pod, "nvidia.com/gpu");
}

}  // namespace kt::kube

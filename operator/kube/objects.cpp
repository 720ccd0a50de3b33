#include "operator/kube/objects.h"

#include <algorithm>
#include <ctime>

#include "api/error.h"
#include "api/quantity.h"
#include "api/yaml_json.h"

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

namespace {

constexpr const char* kWatchEventTypes[] = {"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"};

// A metadata field that must be a string when present (`required`: and be present, non-empty).
void check_metadata_string(const Object& meta, const char* field, bool required,
                           const std::string& type) {
  const auto it = meta.find(field);
  if (it == meta.end() || it->is_null()) {
    if (required) throw Error("watch event " + type + ": object.metadata." + field + ": missing");
    return;
  }
  if (!it->is_string() || (required && it->get_ref<const std::string&>().empty())) {
    throw Error("watch event " + type + ": object.metadata." + field + ": must be a" +
                (required ? " non-empty" : "") + " string, got " + it->dump(-1, ' ', false,
                Object::error_handler_t::replace).substr(0, 100));
  }
}

}  // namespace

WatchEvent parse_watch_event(const std::string& line) {
  const Object frame = api::parse_json(line, "watch event");
  if (!frame.is_object()) throw Error("watch event: not a JSON object");
  const auto type_field = frame.find("type");
  if (type_field == frame.end() || !type_field->is_string()) {
    throw Error("watch event: type: missing or not a string");
  }
  const std::string& type = type_field->get_ref<const std::string&>();
  WatchEvent event{WatchEventType::Added, Object()};
  const auto known = std::find(std::begin(kWatchEventTypes), std::end(kWatchEventTypes), type);
  if (known == std::end(kWatchEventTypes)) {
    throw Error("watch event: unknown type \"" + type.substr(0, 32) + "\"");
  }
  event.type = static_cast<WatchEventType>(known - std::begin(kWatchEventTypes));
  const auto object = frame.find("object");
  if (object == frame.end() || !object->is_object()) {
    throw Error("watch event " + type + ": object: missing or not an object");
  }
  if (event.type != WatchEventType::Error) {
    const auto meta = object->find("metadata");
    if (meta == object->end() || !meta->is_object()) {
      throw Error("watch event " + type + ": object.metadata: missing or not an object");
    }
    const bool bookmark = event.type == WatchEventType::Bookmark;
    check_metadata_string(*meta, "name", !bookmark, type);
    check_metadata_string(*meta, "namespace", false, type);
    check_metadata_string(*meta, "resourceVersion", bookmark, type);
  }
  event.object = *object;
  return event;
}

std::string watch_event_line(const WatchEvent& event) {
  const Object frame = {{"type", kWatchEventTypes[static_cast<int>(event.type)]},
                        {"object", event.object}};
  return frame.dump();
}

std::int64_t version_number(const std::string& version) {
  if (version.empty() || version.size() > 18) return -1;
  for (char c : version)
    if (c < '0' || c > '9') return -1;
  return std::stoll(version);
}

std::int64_t resource_version_number(const Object& object) {
  const auto meta = object.find("metadata");
  if (meta == object.end() || !meta->is_object()) return -1;
  const auto version = meta->find("resourceVersion");
  return version != meta->end() && version->is_string()
             ? version_number(version->get<std::string>())
             : -1;
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

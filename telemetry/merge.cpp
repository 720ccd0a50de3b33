#include "telemetry/merge.h"

#include <cstring>
#include <map>
#include <set>
#include <sstream>

namespace kt::telemetry {
namespace {

struct MergedFamily {
  std::string help;  // the text after "# HELP name ", as escaped in the input
  std::string type;  // "counter", "gauge", "histogram", "summary", "untyped"; "" if not stated
  std::vector<std::string> samples;
  std::set<std::string> series;  // "name{labels}" of the samples, to drop repeats
};

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == ':';
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() > suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The family a sample name belongs to, given the TYPEs seen so far: http_seconds_bucket belongs
// to http_seconds if that is a histogram.
std::string family_of(const std::string& sample_name,
                      const std::map<std::string, MergedFamily>& families) {
  if (auto it = families.find(sample_name); it != families.end() && !it->second.type.empty()) {
    return sample_name;
  }
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    if (!ends_with(sample_name, suffix)) continue;
    const std::string base = sample_name.substr(0, sample_name.size() - std::strlen(suffix));
    const auto it = families.find(base);
    if (it == families.end()) continue;
    const std::string& type = it->second.type;
    if (type == "histogram" || (type == "summary" && std::string(suffix) != "_bucket")) return base;
  }
  return sample_name;
}

// "# HELP name text" / "# TYPE name type": the name and the rest, or false for other comments.
bool parse_descriptor(const std::string& line, const char* keyword, std::string& name,
                      std::string& rest) {
  const std::string head = std::string("# ") + keyword + " ";
  if (line.compare(0, head.size(), head) != 0) return false;
  size_t i = head.size();
  while (i < line.size() && line[i] == ' ') ++i;
  const size_t start = i;
  while (i < line.size() && is_name_char(line[i])) ++i;
  name = line.substr(start, i - start);
  if (i < line.size() && line[i] == ' ') ++i;
  rest = line.substr(i);
  return !name.empty();
}

// The series of a sample line ("name{labels}"), i.e. everything before the value. Label values
// may contain spaces and '}' inside quotes, so the quotes are followed.
std::string series_of(const std::string& line) {
  size_t i = 0;
  while (i < line.size() && is_name_char(line[i])) ++i;
  if (i < line.size() && line[i] == '{') {
    bool quoted = false;
    for (++i; i < line.size(); ++i) {
      if (quoted && line[i] == '\\') {
        ++i;
      } else if (line[i] == '"') {
        quoted = !quoted;
      } else if (!quoted && line[i] == '}') {
        ++i;
        break;
      }
    }
  }
  return line.substr(0, i);
}

}  // namespace

std::string merge_expositions(const std::vector<std::string>& texts) {
  std::map<std::string, MergedFamily> families;  // sorted by name: the output order
  for (const auto& text : texts) {
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (line.empty()) continue;
      std::string name, rest;
      if (line[0] == '#') {
        if (parse_descriptor(line, "HELP", name, rest)) {
          auto& family = families[name];
          if (family.help.empty()) family.help = rest;
        } else if (parse_descriptor(line, "TYPE", name, rest)) {
          auto& family = families[name];
          if (family.type.empty()) family.type = rest;
        }
        continue;
      }
      const std::string series = series_of(line);
      size_t name_end = 0;
      while (name_end < series.size() && is_name_char(series[name_end])) ++name_end;
      auto& family = families[family_of(series.substr(0, name_end), families)];
      if (family.series.insert(series).second) family.samples.push_back(line);
    }
  }
  std::string out;
  for (const auto& [name, family] : families) {
    if (family.samples.empty()) continue;  // declared, but no rank had a sample
    if (!family.help.empty()) out += "# HELP " + name + " " + family.help + "\n";
    out += "# TYPE " + name + " " + (family.type.empty() ? "untyped" : family.type) + "\n";
    for (const auto& sample : family.samples) out += sample + "\n";
  }
  return out;
}

}  // namespace kt::telemetry

#include "api/yaml_json.h"

#include <yaml-cpp/yaml.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string_view>
#include <vector>

#include "api/error.h"
#include "api/utf8.h"

namespace kt::api {
namespace {

// YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution).
const std::regex kNull("^(null|Null|NULL|~|)$");
const std::regex kTrue("^(true|True|TRUE)$");
const std::regex kFalse("^(false|False|FALSE)$");
const std::regex kInt("^[-+]?[0-9]+$");
const std::regex kFloat("^[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?$");

// Bounds on outside documents: std::regex and yaml-cpp recurse (per character, per nesting
// level), and aliases let a 600-byte document expand into billions of values.
constexpr size_t kMaxScalarMatched = 1024;   // longer plain scalars are strings, never matched
constexpr int kMaxDepth = 100;               // nested collections
constexpr size_t kMaxValues = 1'000'000;     // values after expanding aliases
constexpr size_t kMaxBytes = 64 << 20;       // scalar and key bytes after expanding aliases

Json plain_scalar(const std::string& s) {
  if (s.size() > kMaxScalarMatched) return s;  // not a number YAML or JSON can mean anyway
  if (std::regex_match(s, kNull)) return nullptr;
  if (std::regex_match(s, kTrue)) return true;
  if (std::regex_match(s, kFalse)) return false;
  const bool integer = std::regex_match(s, kInt);
  if (integer || std::regex_match(s, kFloat)) {
    try {
      if (integer) return std::stoll(s);
    } catch (const std::out_of_range&) {
      // Beyond int64: a float, if it is one.
    }
    try {
      return std::stod(s);
    } catch (const std::out_of_range&) {
      throw Error("the number " + (s.size() > 40 ? s.substr(0, 40) + "..." : s) +
                  " is out of range");
    }
  }
  return s;
}

struct Budget {
  size_t values = 0;
  size_t bytes = 0;
  // Counts `n` more bytes of scalars and keys: a few aliases of one long string would otherwise
  // expand a small file into gigabytes within the value bound.
  void add_bytes(size_t n) {
    bytes += n;
    if (bytes > kMaxBytes)
      throw Error("more than " + std::to_string(kMaxBytes >> 20) +
                  " MiB of text (after expanding aliases): refused");
  }
};

Json convert(const YAML::Node& node, int depth, Budget& budget) {
  if (++budget.values > kMaxValues) {
    throw Error("more than " + std::to_string(kMaxValues) +
                " values (after expanding aliases): refused");
  }
  if (depth > kMaxDepth) {
    const auto mark = node.Mark();
    throw Error("line " + std::to_string(mark.line + 1) + ": nested more than " +
                std::to_string(kMaxDepth) + " levels deep (or an alias that contains itself)");
  }
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Scalar:
      budget.add_bytes(node.Scalar().size());
      // yaml-cpp tags quoted / block scalars "!" and plain ones "?".
      if (node.Tag() == "!") return node.Scalar();
      return plain_scalar(node.Scalar());
    case YAML::NodeType::Sequence: {
      Json out = Json::array();
      for (const auto& item : node) out.push_back(convert(item, depth + 1, budget));
      return out;
    }
    case YAML::NodeType::Map: {
      Json out = Json::object();
      for (const auto& kv : node) {
        const std::string key = kv.first.Scalar();
        budget.add_bytes(key.size());
        if (out.contains(key)) {
          const auto mark = kv.first.Mark();
          throw Error("line " + std::to_string(mark.line + 1) + ": duplicate key \"" + key + "\"");
        }
        out[key] = convert(kv.second, depth + 1, budget);
      }
      return out;
    }
  }
  return nullptr;
}

// One document per file: a `---` (or `...`) line after content starts another, which YAML::Load
// would silently drop. A linear scan of the lines (yaml-cpp 0.7's LoadAll loops without end on
// some malformed streams: the fuzzer found one): content is any line that is not blank, a
// comment or a directive; a marker line at column 0 after content, followed by more content,
// is a second document.
void check_one_document(const std::string& text) {
  bool content = false, marker_after_content = false;
  size_t documents = 0, start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string_view line(text.data() + start, end - start);
    const bool marker = (line.substr(0, 3) == "---" || line.substr(0, 3) == "...") &&
                        (line.size() == 3 || line[3] == ' ' || line[3] == '\t' || line[3] == '\r');
    if (marker) {
      if (content) marker_after_content = true;
      // "--- value" carries content on the marker's line.
      const size_t rest = line.find_first_not_of(" \t\r", 3);
      if (rest != std::string_view::npos && line[rest] != '#' && line.substr(0, 3) == "---") {
        if (marker_after_content) ++documents;
        marker_after_content = false;
        content = true;
        if (documents == 0) documents = 1;
      }
    } else {
      const size_t first = line.find_first_not_of(" \t\r");
      const bool blank = first == std::string_view::npos || line[first] == '#' ||
                         (first == 0 && line[0] == '%');
      if (!blank) {
        if (!content || marker_after_content) ++documents;
        content = true;
        marker_after_content = false;
      }
    }
    start = end + 1;
  }
  if (documents > 1)
    throw Error(std::to_string(documents) +
                " YAML documents: one is read from each file (split them, one per file)");
}

bool reads_as_non_string(const std::string& s) {
  return std::regex_match(s, kNull) || std::regex_match(s, kTrue) || std::regex_match(s, kFalse) ||
         std::regex_match(s, kInt) || std::regex_match(s, kFloat) ||
         s.find_first_of(":#\n'\"{}[]&*!|>%@`") != std::string::npos || s.front() == ' ' ||
         s.back() == ' ' || s.front() == '-' || s.front() == '?';
}

void emit(YAML::Emitter& out, const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      out << YAML::Null;
      break;
    case Json::value_t::boolean:
      out << (v.get<bool>() ? "true" : "false");
      break;
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
    case Json::value_t::number_float:
      out << v.dump();  // nlohmann prints the shortest round-tripping form
      break;
    case Json::value_t::string: {
      const auto& s = v.get_ref<const std::string&>();
      if (s.empty() || reads_as_non_string(s)) out << YAML::DoubleQuoted;
      out << s;
      break;
    }
    case Json::value_t::array:
      if (v.empty()) {
        out << YAML::Flow << YAML::BeginSeq << YAML::EndSeq;
        break;
      }
      out << YAML::BeginSeq;
      for (const auto& item : v) emit(out, item);
      out << YAML::EndSeq;
      break;
    case Json::value_t::object:
      if (v.empty()) {
        out << YAML::Flow << YAML::BeginMap << YAML::EndMap;
        break;
      }
      out << YAML::BeginMap;
      for (auto it = v.begin(); it != v.end(); ++it) {
        out << YAML::Key << it.key() << YAML::Value;
        emit(out, it.value());
      }
      out << YAML::EndMap;
      break;
    default:
      out << v.dump();
  }
}

// yaml-cpp's parser recurses per flow collection ("[[[[..."): refuse deep ones before it runs.
// Block collections nest by indentation, which a document cannot deepen as cheaply.
void check_flow_depth(const std::string& text) {
  int depth = 0;
  char quote = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quote) {
      if (c == '\\' && quote == '"') ++i;
      else if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#') {
      while (i < text.size() && text[i] != '\n') ++i;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxDepth)
        throw Error("nested more than " + std::to_string(kMaxDepth) + " levels deep");
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
}

}  // namespace

Json parse_json(const std::string& text, const std::string& source) {
  try {
    // The keys seen in each open object: a duplicate is an error, as in YAML (RFC 8259 leaves
    // it to the reader; taking the last, as nlohmann does, hides a typo'd override).
    std::vector<std::set<std::string>> keys;
    return Json::parse(text, [&](int depth, Json::parse_event_t event, Json& parsed) {
      if (depth > kMaxDepth)
        throw Error(source + ": nested more than " + std::to_string(kMaxDepth) + " levels deep");
      if (event == Json::parse_event_t::object_start) {
        keys.emplace_back();
      } else if (event == Json::parse_event_t::object_end) {
        if (!keys.empty()) keys.pop_back();
      } else if (event == Json::parse_event_t::key && !keys.empty()) {
        const std::string key = parsed.get<std::string>();
        if (!keys.back().insert(key).second)
          throw Error(source + ": duplicate key \"" + key + "\"");
      }
      return true;
    });
  } catch (const Json::parse_error& e) {
    throw Error(source + ": malformed JSON: " + e.what());
  } catch (const Json::out_of_range& e) {
    throw Error(source + ": a number is out of range: " + e.what());
  }
}

Json yaml_to_json(const std::string& text, const std::string& source) {
  // A YAML stream is Unicode (YAML 1.2 §5.2; yaml-cpp reads UTF-8) and JSON text must be UTF-8:
  // a stray Latin-1 byte in a label once made `-o json` abort in nlohmann's dump().
  if (const size_t bad = invalid_utf8_offset(text); bad != std::string::npos) {
    const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(bad), '\n');
    throw Error(source + ":" + std::to_string(line) + ": not UTF-8 (byte " + std::to_string(bad) +
                ")");
  }
  try {
    check_flow_depth(text);
    check_one_document(text);
    Budget budget;
    return convert(YAML::Load(text), 0, budget);
  } catch (const YAML::Exception& e) {
    throw Error(source + ":" + std::to_string(e.mark.line + 1) + ":" +
                std::to_string(e.mark.column + 1) + ": malformed YAML: " + e.msg);
  } catch (const Error& e) {
    throw Error(source + ": " + e.what());
  }
}

std::string json_to_yaml(const Json& value) {
  YAML::Emitter out;
  emit(out, value);
  return std::string(out.c_str()) + "\n";
}

std::string read_file(const std::string& path, size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw Error("cannot read " + path + ": " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat info {};
  if (::fstat(fd, &info) != 0) throw Error("cannot read " + path + ": " + std::strerror(errno));
  if (!S_ISREG(info.st_mode))
    throw Error("cannot read " + path + ": not a regular file (" +
                (S_ISDIR(info.st_mode)    ? "a directory"
                 : S_ISFIFO(info.st_mode) ? "a FIFO"
                 : S_ISCHR(info.st_mode)  ? "a character device"
                 : S_ISSOCK(info.st_mode) ? "a socket"
                                          : "not a file") +
                ")");
  if (static_cast<uint64_t>(info.st_size) > max_bytes)
    throw Error("cannot read " + path + ": " + std::to_string(info.st_size) +
                " bytes, more than the limit of " + std::to_string(max_bytes));
  std::string text;
  text.resize(static_cast<size_t>(info.st_size));
  size_t have = 0;
  // Read to the end (a file that grew since fstat is cut at the bound, and said so).
  for (;;) {
    if (have == text.size()) {
      if (text.size() >= max_bytes + 1) break;
      text.resize(std::min(max_bytes + 1, std::max<size_t>(4096, text.size() * 2)));
    }
    const ssize_t n = ::read(fd, text.data() + have, text.size() - have);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error("cannot read " + path + ": " + std::strerror(errno));
    }
    if (n == 0) break;
    have += static_cast<size_t>(n);
  }
  if (have > max_bytes)
    throw Error("cannot read " + path + ": more than the limit of " + std::to_string(max_bytes) +
                " bytes");
  text.resize(have);
  return text;
}

Json load_document(const std::string& path) {
  const std::string text = read_file(path);
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && (text[first] == '{' || text[first] == '[')) {
    return parse_json(text, path);
  }
  return yaml_to_json(text, path);
}

}  // namespace kt::api

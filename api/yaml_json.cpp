#include "api/yaml_json.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>

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
    return Json::parse(text, [&](int depth, Json::parse_event_t, Json&) {
      if (depth > kMaxDepth)
        throw Error(source + ": nested more than " + std::to_string(kMaxDepth) + " levels deep");
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

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path + ": " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
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

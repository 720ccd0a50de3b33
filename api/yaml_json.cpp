#include "api/yaml_json.h"

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>

#include "api/error.h"

namespace kt::api {
namespace {

// YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution).
const std::regex kNull("^(null|Null|NULL|~|)$");
const std::regex kTrue("^(true|True|TRUE)$");
const std::regex kFalse("^(false|False|FALSE)$");
const std::regex kInt("^[-+]?[0-9]+$");
const std::regex kFloat("^[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?$");

Json plain_scalar(const std::string& s) {
  if (std::regex_match(s, kNull)) return nullptr;
  if (std::regex_match(s, kTrue)) return true;
  if (std::regex_match(s, kFalse)) return false;
  if (std::regex_match(s, kInt)) {
    try {
      return std::stoll(s);
    } catch (const std::out_of_range&) {
      return std::stod(s);
    }
  }
  if (std::regex_match(s, kFloat)) return std::stod(s);
  return s;
}

Json convert(const YAML::Node& node) {
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
      for (const auto& item : node) out.push_back(convert(item));
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
        out[key] = convert(kv.second);
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

}  // namespace

Json yaml_to_json(const std::string& text, const std::string& source) {
  try {
    return convert(YAML::Load(text));
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
    try {
      return Json::parse(text);
    } catch (const Json::parse_error& e) {
      throw Error(path + ": malformed JSON: " + e.what());
    }
  }
  return yaml_to_json(text, path);
}

}  // namespace kt::api

// YAML <-> JSON. Every manifest is decoded from a JSON value, so that YAML files, the API
// server's JSON and test fixtures go through one decoder with one set of error messages.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace kt::api {

using Json = nlohmann::json;

// Parses one YAML document. Plain scalars become null/bool/int/float where YAML 1.2's core
// schema says so; quoted scalars stay strings. Throws kt::Error naming `source`, line and column.
// Bounded for outside input: at most 100 nested collections and 10^6 values after expanding
// aliases (a self-containing alias or a "billion laughs" document is refused), numbers beyond
// double's range are an error, plain scalars over 1 KiB are strings.
Json yaml_to_json(const std::string& text, const std::string& source = "<input>");

// JSON with the same depth bound; throws kt::Error naming `source`.
Json parse_json(const std::string& text, const std::string& source = "<input>");

// Emits YAML that yaml_to_json reads back to the same value (strings that would read as
// numbers or booleans are quoted).
std::string json_to_yaml(const Json& value);

// The largest manifest, inventory or plan read_file() reads by default (the API server's request
// limit is 3 MiB; this leaves room for hand-written files).
constexpr size_t kMaxDocumentBytes = 16 << 20;

// Reads a whole regular file of at most `max_bytes`, never blocking on a FIFO or reading a
// device; throws kt::Error("cannot read <path>: <reason>") naming what is wrong.
std::string read_file(const std::string& path, size_t max_bytes = kMaxDocumentBytes);

// Parses a file as YAML or JSON (JSON is YAML, but a JSON parse gives better messages for .json).
Json load_document(const std::string& path);

}  // namespace kt::api

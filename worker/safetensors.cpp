#include "worker/safetensors.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "api/error.h"

namespace kt::worker::safetensors {
namespace {

using Json = nlohmann::json;

constexpr uint64_t kBytesPerF32 = 4;

std::string shape_text(const std::vector<int64_t>& shape) {
  return Json(shape).dump();
}

// Bytes of an F32 tensor of `shape`, or false on a negative dimension or overflow.
bool f32_bytes(const std::vector<int64_t>& shape, uint64_t& bytes) {
  uint64_t n = kBytesPerF32;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  bytes = n;
  return true;
}

}  // namespace

std::string encode_header(const std::vector<TensorInfo>& tensors,
                          const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  uint64_t offset = 0;
  for (const TensorInfo& t : tensors) {
    uint64_t bytes = 0;
    if (!f32_bytes(t.shape, bytes)) {
      throw Error("safetensors: tensor " + t.name + " has an invalid shape " + shape_text(t.shape));
    }
    if (t.name == "__metadata__" || header.contains(t.name)) {
      throw Error("safetensors: tensor name " + t.name + " is reserved or used twice");
    }
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string json = header.dump();
  json.resize((json.size() + 7) / 8 * 8, ' ');  // the data block starts 8-byte aligned
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json;
}

uint64_t decode_header_length(const unsigned char (&first8)[8], uint64_t file_bytes,
                              const std::string& file) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(first8[i]) << (8 * i);
  if (n < 2) throw Error(file + ": header length " + std::to_string(n) + " is too small");
  if (n > kMaxHeaderBytes) {
    throw Error(file + ": header length " + std::to_string(n) + " exceeds the limit of " +
                std::to_string(kMaxHeaderBytes) + " bytes");
  }
  if (file_bytes < 8 || n > file_bytes - 8) {
    throw Error(file + ": header length " + std::to_string(n) + " exceeds the file size " +
                std::to_string(file_bytes));
  }
  return n;
}

Header decode_header(std::string_view header_json, uint64_t file_bytes, const std::string& file) {
  const uint64_t data_start = 8 + header_json.size();
  if (file_bytes < data_start) {
    throw Error(file + ": the file (" + std::to_string(file_bytes) +
                " bytes) is shorter than its header");
  }
  const uint64_t data_bytes = file_bytes - data_start;
  if (header_json.empty() || header_json.front() != '{') {
    throw Error(file + ": the header does not start with '{'");
  }
  Json json;
  try {
    json = Json::parse(header_json);
  } catch (const Json::exception& e) {
    throw Error(file + ": the header is not valid JSON (" + std::string(e.what()) + ")");
  }
  if (!json.is_object()) throw Error(file + ": the header is not a JSON object");

  Header header;
  header.data_start = data_start;
  for (const auto& [name, entry] : json.items()) {
    const std::string where = file + ": tensor " + name;
    if (name == "__metadata__") {
      if (!entry.is_object()) throw Error(file + ": __metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) throw Error(file + ": __metadata__." + key + " is not a string");
        header.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object()) throw Error(where + " is not an object");
    const Json* dtype = entry.contains("dtype") ? &entry["dtype"] : nullptr;
    if (!dtype || !dtype->is_string()) throw Error(where + " has no dtype");
    if (*dtype != "F32") {
      throw Error(where + " has dtype " + dtype->get<std::string>() + "; only F32 is supported");
    }
    TensorInfo info;
    info.name = name;
    if (!entry.contains("shape") || !entry["shape"].is_array()) {
      throw Error(where + " has no shape array");
    }
    for (const Json& d : entry["shape"]) {
      if (!d.is_number_unsigned()) throw Error(where + " has a bad shape " + entry["shape"].dump());
      info.shape.push_back(static_cast<int64_t>(std::min<uint64_t>(d.get<uint64_t>(), INT64_MAX)));
    }
    const Json* offsets = entry.contains("data_offsets") ? &entry["data_offsets"] : nullptr;
    if (!offsets || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
      throw Error(where + " has no data_offsets pair of non-negative integers");
    }
    info.begin = (*offsets)[0].get<uint64_t>();
    info.end = (*offsets)[1].get<uint64_t>();
    if (info.begin > info.end || info.end > data_bytes) {
      throw Error(where + " has data_offsets " + offsets->dump() + " outside the data block of " +
                  std::to_string(data_bytes) + " bytes");
    }
    uint64_t bytes = 0;
    if (!f32_bytes(info.shape, bytes) || bytes != info.end - info.begin) {
      throw Error(where + " has data_offsets " + offsets->dump() + " inconsistent with shape " +
                  shape_text(info.shape) + " of F32");
    }
    header.tensors.push_back(std::move(info));
  }

  // The tensors must tile the data block: sorted by offset, each starts where the previous ends.
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  uint64_t expected = 0;
  for (const TensorInfo& t : header.tensors) {
    if (t.begin < expected) throw Error(file + ": tensor " + t.name + " overlaps another tensor");
    if (t.begin > expected) {
      throw Error(file + ": the data block has a gap before tensor " + t.name);
    }
    expected = t.end;
  }
  if (expected != data_bytes) {
    throw Error(file + ": the tensors cover " + std::to_string(expected) +
                " bytes but the data block has " + std::to_string(data_bytes));
  }
  return header;
}

}  // namespace kt::worker::safetensors

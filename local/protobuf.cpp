#include "local/protobuf.h"

#include <cstdint>
#include <ctime>
#include <map>
#include <optional>

#include "api/utf8.h"

namespace kt::local {
namespace {

using kube::ApiError;
using kube::Object;

ApiError malformed(const std::string& why) {
  return ApiError(400, "BadRequest", "the request body is not a valid Kubernetes protobuf: " + why);
}

// One protobuf message's fields, read in order.
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  bool done() const { return at_ >= data_.size(); }

  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (at_ >= data_.size()) throw malformed("truncated varint");
      const auto byte = static_cast<unsigned char>(data_[at_++]);
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return value;
    }
    throw malformed("varint longer than 10 bytes");
  }
  std::string_view bytes() {
    const uint64_t n = varint();
    if (n > data_.size() - at_) throw malformed("length past the end of the body");
    const std::string_view out = data_.substr(at_, n);
    at_ += n;
    return out;
  }
  void skip(int wire_type) {
    switch (wire_type) {
      case 0: varint(); return;
      case 1: advance(8); return;
      case 2: bytes(); return;
      case 5: advance(4); return;
      default: throw malformed("unsupported wire type " + std::to_string(wire_type));
    }
  }

 private:
  void advance(size_t n) {
    if (n > data_.size() - at_) throw malformed("truncated fixed-width field");
    at_ += n;
  }
  std::string_view data_;
  size_t at_ = 0;
};

// Calls `visit(number, bytes)` for each length-delimited field of `data`; skips the others.
template <typename Visit>
void for_each_bytes_field(std::string_view data, Visit visit) {
  Reader r(data);
  while (!r.done()) {
    const uint64_t key = r.varint();
    if ((key & 7) != 2) {
      r.skip(static_cast<int>(key & 7));
      continue;
    }
    visit(static_cast<int>(key >> 3), r.bytes());
  }
}

enum class Type { kString, kBytes, kBool, kInt, kMessage, kStringMap, kBytesMap, kTime };

struct Field {
  const char* json;
  Type type;
  bool repeated = false;
  const struct Message* message = nullptr;
};
struct Message {
  std::map<int, Field> fields;
};

// k8s.io/apimachinery meta/v1 and k8s.io/api core/v1 generated.proto.
const Message kOwnerReference{{{1, {"kind", Type::kString}},
                               {3, {"name", Type::kString}},
                               {4, {"uid", Type::kString}},
                               {5, {"apiVersion", Type::kString}},
                               {6, {"controller", Type::kBool}},
                               {7, {"blockOwnerDeletion", Type::kBool}}}};
const Message kObjectMeta{{{1, {"name", Type::kString}},
                           {2, {"generateName", Type::kString}},
                           {3, {"namespace", Type::kString}},
                           {5, {"uid", Type::kString}},
                           {6, {"resourceVersion", Type::kString}},
                           {7, {"generation", Type::kInt}},
                           {8, {"creationTimestamp", Type::kTime}},
                           {11, {"labels", Type::kStringMap}},
                           {12, {"annotations", Type::kStringMap}},
                           {13, {"ownerReferences", Type::kMessage, true, &kOwnerReference}},
                           {14, {"finalizers", Type::kString, true}}}};
const Message kSecret{{{1, {"metadata", Type::kMessage, false, &kObjectMeta}},
                       {2, {"data", Type::kBytesMap}},
                       {3, {"type", Type::kString}},
                       {4, {"stringData", Type::kStringMap}},
                       {5, {"immutable", Type::kBool}}}};
const Message kConfigMap{{{1, {"metadata", Type::kMessage, false, &kObjectMeta}},
                          {2, {"data", Type::kStringMap}},
                          {3, {"binaryData", Type::kBytesMap}},
                          {4, {"immutable", Type::kBool}}}};
const Message kNamespaceSpec{{{1, {"finalizers", Type::kString, true}}}};
const Message kNamespace{{{1, {"metadata", Type::kMessage, false, &kObjectMeta}},
                          {2, {"spec", Type::kMessage, false, &kNamespaceSpec}}}};
const Message kPreconditions{{{1, {"uid", Type::kString}}, {2, {"resourceVersion", Type::kString}}}};
const Message kDeleteOptions{{{1, {"gracePeriodSeconds", Type::kInt}},
                              {2, {"preconditions", Type::kMessage, false, &kPreconditions}},
                              {3, {"orphanDependents", Type::kBool}},
                              {4, {"propagationPolicy", Type::kString}},
                              {5, {"dryRun", Type::kString, true}}}};

std::string base64(std::string_view in) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t n = (static_cast<unsigned char>(in[i]) << 16) |
                       (static_cast<unsigned char>(in[i + 1]) << 8) |
                       static_cast<unsigned char>(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += kAlphabet[(n >> s) & 63];
  }
  if (i + 1 == in.size()) {
    const uint32_t n = static_cast<unsigned char>(in[i]) << 16;
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    const uint32_t n = (static_cast<unsigned char>(in[i]) << 16) |
                       (static_cast<unsigned char>(in[i + 1]) << 8);
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += kAlphabet[(n >> 6) & 63];
    out += '=';
  }
  return out;
}

// A JSON string must be UTF-8; protobuf strings are, but a hostile body need not be.
std::string checked_string(std::string_view s) {
  if (api::invalid_utf8_offset(s) != std::string_view::npos) throw malformed("a string is not UTF-8");
  return std::string(s);
}

Object decode(std::string_view data, const Message& message, int depth);

Object decode_value(Reader& r, int wire_type, const Field& f, int depth) {
  switch (f.type) {
    case Type::kString:
      if (wire_type != 2) throw malformed(std::string(f.json) + ": expected a string");
      return checked_string(r.bytes());
    case Type::kBytes:
      return base64(r.bytes());
    case Type::kBool:
      return r.varint() != 0;
    case Type::kInt:
      return static_cast<int64_t>(r.varint());
    case Type::kMessage:
      return decode(r.bytes(), *f.message, depth + 1);
    case Type::kTime: {
      Reader t(r.bytes());
      int64_t seconds = 0;
      while (!t.done()) {
        const uint64_t key = t.varint();
        if ((key >> 3) == 1 && (key & 7) == 0) seconds = static_cast<int64_t>(t.varint());
        else t.skip(static_cast<int>(key & 7));
      }
      // metav1.Time's range (years 0001-9999), formatted without std::chrono, whose
      // nanosecond clock ends in 2262.
      if (seconds < -62135596800 || seconds > 253402300799) throw malformed("a time is out of range");
      const std::time_t when = static_cast<std::time_t>(seconds);
      std::tm tm{};
      gmtime_r(&when, &tm);
      char text[32];
      std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
      return std::string(text);
    }
    case Type::kStringMap:
    case Type::kBytesMap:
      break;
  }
  return nullptr;
}

Object decode(std::string_view data, const Message& message, int depth) {
  if (depth > 32) throw malformed("nested more than 32 levels deep");
  Reader r(data);
  Object out = Object::object();
  while (!r.done()) {
    const uint64_t key = r.varint();
    const int number = static_cast<int>(key >> 3), wire_type = static_cast<int>(key & 7);
    const auto it = message.fields.find(number);
    if (it == message.fields.end()) {
      r.skip(wire_type);
      continue;
    }
    const Field& f = it->second;
    if (f.type == Type::kStringMap || f.type == Type::kBytesMap) {
      if (wire_type != 2) throw malformed(std::string(f.json) + ": expected a map entry");
      std::string k;
      Object v = "";
      for_each_bytes_field(r.bytes(), [&](int number, std::string_view bytes) {
        if (number == 1) k = checked_string(bytes);
        else if (number == 2)
          v = f.type == Type::kBytesMap ? Object(base64(bytes)) : Object(checked_string(bytes));
      });
      if (!out.contains(f.json)) out[f.json] = Object::object();
      out[f.json][k] = v;
      continue;
    }
    Object value = decode_value(r, wire_type, f, depth);
    // proto2 writes every optional scalar, set or not; the JSON form omits the empty ones
    // (omitempty), and so does the object a JSON client would have sent: "" namespace, 0
    // generation, a zero creationTimestamp.
    if (!f.repeated && (value == Object("") || value == Object(0) || value == Object(false) ||
                        value == Object("1970-01-01T00:00:00Z")))
      continue;
    if (f.repeated) {
      if (!out.contains(f.json)) out[f.json] = Object::array();
      out[f.json].push_back(std::move(value));
    } else {
      out[f.json] = std::move(value);
    }
  }
  return out;
}

}  // namespace

Object decode_kubernetes_protobuf(std::string_view body) {
  if (body.size() < 4 || body.substr(0, 4) != std::string_view("k8s\0", 4))
    throw malformed("no \"k8s\\0\" prefix");
  // runtime.Unknown: typeMeta 1 {apiVersion 1, kind 2}, raw 2.
  std::string api_version, kind;
  std::string_view raw;
  for_each_bytes_field(body.substr(4), [&](int number, std::string_view bytes) {
    if (number == 1) {
      for_each_bytes_field(bytes, [&](int type_number, std::string_view text) {
        if (type_number == 1) api_version = checked_string(text);
        else if (type_number == 2) kind = checked_string(text);
      });
    } else if (number == 2) {
      raw = bytes;
    }
  });
  static const std::map<std::string, const Message*> kKinds = {
      {"Secret", &kSecret}, {"ConfigMap", &kConfigMap}, {"Namespace", &kNamespace},
      {"DeleteOptions", &kDeleteOptions}};
  const auto it = kKinds.find(kind);
  if (it == kKinds.end()) {
    throw ApiError(415, "UnsupportedMediaType",
                   "the local control plane reads protobuf bodies of Secret, ConfigMap, Namespace "
                   "and DeleteOptions only, not \"" + kind + "\"; send JSON");
  }
  Object out = decode(raw, *it->second, 0);
  out["apiVersion"] = api_version;
  out["kind"] = kind;
  return out;
}

}  // namespace kt::local

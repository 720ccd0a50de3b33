// Kubernetes protobuf bodies (client-go's typed clients send them) decoded as the Store's JSON.
// The bodies are encoded here by hand from core/v1 generated.proto's field numbers.
#include "local/protobuf.h"

#include <gtest/gtest.h>

namespace kt::local {
namespace {

std::string varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
  return out;
}
std::string field(int number, const std::string& bytes) {  // length-delimited
  return varint(static_cast<uint64_t>(number) << 3 | 2) + varint(bytes.size()) + bytes;
}
std::string field_varint(int number, uint64_t v) {
  return varint(static_cast<uint64_t>(number) << 3) + varint(v);
}
std::string envelope(const std::string& api_version, const std::string& kind,
                     const std::string& raw) {
  return std::string("k8s\0", 4) + field(1, field(1, api_version) + field(2, kind)) + field(2, raw);
}

TEST(KubernetesProtobuf, HelmsReleaseSecret_DecodesToTheJsonOfTheSameSecret) {
  const std::string meta = field(1, "sh.helm.release.v1.kt.v1") + field(3, "kubetrain-system") +
                           field(11, field(1, "owner") + field(2, "helm")) +
                           field(11, field(1, "status") + field(2, "deployed")) +
                           field_varint(99, 7);  // an unknown field is skipped
  const std::string secret = field(1, meta) + field(2, field(1, "release") + field(2, "hi!\xff")) +
                             field(3, "helm.sh/release.v1") + field_varint(5, 1);
  const kube::Object obj = decode_kubernetes_protobuf(envelope("v1", "Secret", secret));
  EXPECT_EQ(obj["apiVersion"], "v1");
  EXPECT_EQ(obj["kind"], "Secret");
  EXPECT_EQ(obj["metadata"]["name"], "sh.helm.release.v1.kt.v1");
  EXPECT_EQ(obj["metadata"]["namespace"], "kubetrain-system");
  EXPECT_EQ(obj["metadata"]["labels"], (kube::Object{{"owner", "helm"}, {"status", "deployed"}}));
  EXPECT_EQ(obj["data"]["release"], "aGkh/w==");  // base64 of the 4 bytes, as JSON carries bytes
  EXPECT_EQ(obj["type"], "helm.sh/release.v1");
  EXPECT_EQ(obj["immutable"], true);
}

TEST(KubernetesProtobuf, NamespaceAndDeleteOptions_Decode) {
  const kube::Object ns =
      decode_kubernetes_protobuf(envelope("v1", "Namespace", field(1, field(1, "team-a"))));
  EXPECT_EQ(ns["metadata"]["name"], "team-a");
  const kube::Object options =
      decode_kubernetes_protobuf(envelope("v1", "DeleteOptions", field(4, "Foreground")));
  EXPECT_EQ(options["propagationPolicy"], "Foreground");
}

TEST(KubernetesProtobuf, MalformedOrUnknownBodies_AreRefusedNotCrashed) {
  auto code_of = [](const std::string& body) {
    try {
      decode_kubernetes_protobuf(body);
    } catch (const kube::ApiError& e) {
      return e.code();
    }
    return 0;
  };
  EXPECT_EQ(code_of("{\"kind\":\"Secret\"}"), 400);                         // not protobuf
  EXPECT_EQ(code_of(envelope("v1", "Pod", "")), 415);                        // a kind not read
  // Every cut inside the object's bytes (after the envelope's typeMeta) is refused: a length
  // then points past the end. (A cut between whole fields is a valid, shorter message.)
  const std::string raw = field(2, field(3, "Opaque"));
  const std::string whole = envelope("v1", "Secret", field(3, "Opaque"));
  for (size_t cut = whole.size() - raw.size() + 1; cut < whole.size(); ++cut)
    EXPECT_EQ(code_of(whole.substr(0, cut)), 400) << "cut at " << cut;
  EXPECT_EQ(code_of(envelope("v1", "Secret", field(3, "\xc3("))), 400);      // not UTF-8
  EXPECT_EQ(code_of(envelope("v1", "Secret", field(3, "\xc0\x80"))), 400);   // overlong (fuzzer)
  EXPECT_EQ(code_of(envelope("v1", "Secret", field(3, "\xed\xa0\x80"))), 400);  // a surrogate
  EXPECT_EQ(code_of(envelope("v1", "Secret", field(3, "\xf4\x90\x80\x80"))), 400);  // > U+10FFFF
  EXPECT_EQ(code_of(envelope("v1", "Secret", field(3, "\xe2\x82\xac\xf0\x9f\x98\x80"))), 0);  // "€😀"
  // A creationTimestamp in year 2982 (the fuzzer's: std::chrono's nanosecond clock overflowed on
  // it) is a time; one past 9999 is refused.
  const std::string late_time = field(8, varint(1u << 3) + varint(31943687160ull));
  EXPECT_EQ(decode_kubernetes_protobuf(envelope("v1", "Secret", field(1, late_time)))["metadata"]
                ["creationTimestamp"],
            "2982-04-03T14:26:00Z");
  const std::string too_late = field(8, varint(1u << 3) + varint(253402300800ull));
  EXPECT_EQ(code_of(envelope("v1", "Secret", field(1, too_late))), 400);
  const std::string a_time = field(8, varint(1u << 3) + varint(1764628800ull));
  EXPECT_EQ(decode_kubernetes_protobuf(envelope("v1", "Secret", field(1, a_time)))["metadata"]
                ["creationTimestamp"],
            "2025-12-01T22:40:00Z");
  std::string deep = field(3, "x");
  for (int i = 0; i < 40; ++i) deep = field(13, deep);                       // ownerReferences...
  EXPECT_EQ(code_of(envelope("v1", "Secret", field(1, deep))), 0);           // fields skipped
}

}  // namespace
}  // namespace kt::local

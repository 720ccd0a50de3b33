// libFuzzer harness: safetensors headers (worker/safetensors.h), what the worker reads from
// every checkpoint shard. Input: 8 bytes (little-endian) of data block that follows what is
// given, then the file: its 8-byte header length N and the N-byte JSON header. Any input must
// decode or be refused with kt::Error naming the file; a decoded header, encoded again, must
// decode to the same tensors and metadata.
//   fuzz/run.sh safetensors 60
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "api/error.h"
#include "fuzz/fuzz_check.h"
#include "worker/safetensors.h"

namespace st = kt::worker::safetensors;

namespace {

bool same(const st::TensorInfo& a, const st::TensorInfo& b) {
  return a.name == b.name && a.shape == b.shape && a.begin == b.begin && a.end == b.end;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 16) return 0;
  uint64_t extra = 0;
  for (int i = 0; i < 8; ++i) extra |= static_cast<uint64_t>(data[i]) << (8 * i);
  extra %= uint64_t{1} << 40;  // what follows in the file: up to a TiB of tensor data
  const uint8_t* file = data + 8;
  const uint64_t file_bytes = (size - 8) + extra;
  st::Header header;
  try {
    unsigned char first8[8];
    std::memcpy(first8, file, 8);
    const uint64_t n = st::decode_header_length(first8, file_bytes, "rank-00000.safetensors");
    if (n > size - 16) return 0;  // the header lies beyond what was given: not readable here
    header = st::decode_header(
        std::string_view(reinterpret_cast<const char*>(file) + 8, n), file_bytes,
        "rank-00000.safetensors");
  } catch (const kt::Error& e) {
    FUZZ_CHECK(std::string(e.what()).rfind("rank-00000.safetensors: ", 0) == 0, e.what());
    return 0;
  }
  // Encoded again (tensors back to back in offset order), it reads back the same.
  const std::string encoded = st::encode_header(header.tensors, header.metadata);
  uint64_t tensor_bytes = 0;
  for (const auto& t : header.tensors) tensor_bytes += t.end - t.begin;
  FUZZ_CHECK(header.data_start + tensor_bytes == file_bytes, "the tensors do not tile the file");
  unsigned char first8[8];
  std::memcpy(first8, encoded.data(), 8);
  st::Header again;
  try {
    const uint64_t file2 = encoded.size() + tensor_bytes;
    const uint64_t n = st::decode_header_length(first8, file2, "again");
    again = st::decode_header(std::string_view(encoded).substr(8, n), file2, "again");
  } catch (const kt::Error& e) {
    FUZZ_CHECK(false, std::string("an encoded header does not decode: ") + e.what());
  }
  FUZZ_CHECK(again.metadata == header.metadata, "metadata differs after a round trip");
  FUZZ_CHECK(again.tensors.size() == header.tensors.size(), "tensor count differs");
  for (size_t i = 0; i < again.tensors.size(); ++i) {
    FUZZ_CHECK(same(again.tensors[i], header.tensors[i]), "tensor " + header.tensors[i].name);
  }
  return 0;
}

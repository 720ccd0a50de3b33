// libFuzzer harness: llm.c's binary headers, the model file (worker/llmc_file.h,
// decode_llmc_header) and the token shards (worker/data.h). Input: 8 bytes of file size (little
// endian), then the 256 int32 header words (zero-filled when short). Both headers must be
// accepted or refused with kt::Error naming the file; accepted ones must agree with the size.
//   fuzz/run.sh llmc 60
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "api/error.h"
#include "fuzz/fuzz_check.h"
#include "worker/llmc_file.h"
#include "worker/data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  uint64_t file_bytes = 0;
  std::memcpy(&file_bytes, data, 8);
  std::array<int32_t, 256> header{};
  std::memcpy(header.data(), data + 8, std::min<size_t>(size - 8, sizeof(header)));
  try {
    const kt::worker::LlmcDims d = kt::worker::decode_llmc_header(header, file_bytes, "model.bin");
    FUZZ_CHECK(d.max_seq_len > 0 && d.vocab_size > 0 && d.num_layers > 0 && d.num_heads > 0 &&
                   d.channels % d.num_heads == 0 && d.padded_vocab_size >= d.vocab_size,
               "accepted dims");
    FUZZ_CHECK(file_bytes > 1024 && (file_bytes - 1024) % 4 == 0, std::to_string(file_bytes));
  } catch (const kt::Error& e) {
    FUZZ_CHECK(std::string(e.what()).rfind("model.bin: ", 0) == 0, e.what());
  }
  const auto signed_bytes = static_cast<int64_t>(file_bytes >> 1);  // a file size is below 2^63
  try {
    const int64_t tokens =
        kt::worker::decode_token_shard_header(header, signed_bytes, "shard_000.bin");
    FUZZ_CHECK(tokens >= 0 && signed_bytes == 1024 + 2 * tokens, std::to_string(tokens));
  } catch (const kt::Error& e) {
    FUZZ_CHECK(std::string(e.what()).rfind("shard_000.bin: ", 0) == 0, e.what());
  }
  return 0;
}

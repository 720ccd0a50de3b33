// llm.c's model file: header checks, export and import (worker/llmc_file.h).
#include "worker/llmc_file.h"

#include <fcntl.h>

#include <bit>
#include <limits>

#include "api/error.h"
#include "worker/durable_file.h"
#include "worker/gpt_layout.h"

namespace kt::worker {
namespace {

static_assert(std::endian::native == std::endian::little,
              "llm.c files hold little-endian data written straight from memory");

constexpr int32_t kLlmcMagic = 20240326;
constexpr int32_t kLlmcVersionFp32 = 3;
constexpr int32_t kLlmcVersionBf16 = 5;
constexpr size_t kLlmcHeaderInts = 256;
constexpr size_t kLlmcHeaderBytes = kLlmcHeaderInts * sizeof(int32_t);
// Parameter shapes in llm.c's order (train_gpt2.c: fill_in_parameter_sizes), from the parameter
// table: llm.c's files hold GPT-2 shapes, so F = 4C.
std::vector<std::vector<int64_t>> llmc_shapes(const LlmcDims& d) {
  GptConfig c;
  c.max_seq_len = d.max_seq_len;
  c.vocab = d.vocab_size;
  c.padded_vocab = d.padded_vocab_size;
  c.layers = d.num_layers;
  c.heads = d.num_heads;
  c.channels = d.channels;
  c.ffn = 4 * static_cast<int64_t>(d.channels);
  std::vector<std::vector<int64_t>> shapes;
  for (int i = 0; i < kNumParamTensors; ++i) shapes.push_back(gpt_llmc_shape(c, i));
  return shapes;
}

std::string dims_text(const LlmcDims& d) {
  return "maxT=" + std::to_string(d.max_seq_len) + " V=" + std::to_string(d.vocab_size) +
         " L=" + std::to_string(d.num_layers) + " NH=" + std::to_string(d.num_heads) +
         " C=" + std::to_string(d.channels) + " Vp=" + std::to_string(d.padded_vocab_size);
}

// Checks the dims and returns the file size they imply.
uint64_t llmc_file_bytes(const LlmcDims& d, const std::string& path) {
  if (d.max_seq_len <= 0 || d.vocab_size <= 0 || d.num_layers <= 0 || d.num_heads <= 0 ||
      d.channels <= 0 || d.padded_vocab_size < d.vocab_size || d.channels % d.num_heads != 0) {
    throw Error(path + ": invalid llm.c dims " + dims_text(d));
  }
  // Every dim is below 2^31, so each tensor is below 2^95 elements: count in 128 bits.
  unsigned __int128 floats = 0;
  for (const auto& shape : llmc_shapes(d)) {
    unsigned __int128 n = 1;
    for (int64_t x : shape) n *= static_cast<uint64_t>(x);
    floats += n;
  }
  const unsigned __int128 bytes = kLlmcHeaderBytes + floats * 4;
  if (bytes > std::numeric_limits<int64_t>::max()) {
    throw Error(path + ": llm.c dims " + dims_text(d) + " are too large");
  }
  return static_cast<uint64_t>(bytes);
}

void check_llmc_views(const std::string& path, const LlmcDims& d,
                      const std::vector<TensorView>& params) {
  if (params.size() != static_cast<size_t>(kNumParamTensors)) {
    throw Error(path + ": llm.c files hold 16 parameter tensors, the model gave " +
                std::to_string(params.size()));
  }
  const auto shapes = llmc_shapes(d);
  for (size_t i = 0; i < params.size(); ++i) {
    int64_t n = 1;
    for (int64_t x : shapes[i]) n *= x;
    if (params[i].numel() != n || (n > 0 && params[i].data == nullptr)) {
      throw Error(path + ": tensor " + params[i].name + " has shape " +
                  shape_text(params[i].shape) + " but llm.c's " + kParams[i].name + " is " +
                  shape_text(shapes[i]) + " for " + dims_text(d));
    }
  }
}

// Reads and checks the header of an open llm.c file; the file is then at the first parameter.
LlmcDims read_llmc_header(CheckedFile& file, const std::string& path) {
  const uint64_t size = file.size();
  std::array<int32_t, kLlmcHeaderInts> header{};
  if (size < kLlmcHeaderBytes || !file.read_exact(header.data(), kLlmcHeaderBytes)) {
    throw Error(path + ": truncated: " + std::to_string(size) + " bytes, less than llm.c's " +
                std::to_string(kLlmcHeaderBytes) + "-byte header");
  }
  return decode_llmc_header(header, size, path);
}

}  // namespace

LlmcDims decode_llmc_header(const std::array<int32_t, 256>& header, uint64_t size,
                            const std::string& path) {
  if (header[0] != kLlmcMagic) {
    throw Error(path + ": bad magic " + std::to_string(header[0]) + ", expected " +
                std::to_string(kLlmcMagic) + " (llm.c model file)");
  }
  if (header[1] == kLlmcVersionBf16) {
    throw Error(path + ": version 5 is llm.c's bf16 model file; only version 3 (fp32) is " +
                "supported");
  }
  if (header[1] != kLlmcVersionFp32) {
    throw Error(path + ": unsupported llm.c model file version " + std::to_string(header[1]) +
                "; only version 3 (fp32) is supported");
  }
  const LlmcDims d{header[2], header[3], header[4], header[5], header[6], header[7]};
  const uint64_t expected = llmc_file_bytes(d, path);
  if (size != expected) {
    throw Error(path + ": " + std::to_string(size) + " bytes but its header (" + dims_text(d) +
                ") needs " + std::to_string(expected) + (size < expected ? ": truncated" : ""));
  }
  return d;
}

void export_llmc(const std::string& path, const LlmcDims& dims,
                 const std::vector<TensorView>& params) {
  llmc_file_bytes(dims, path);
  check_llmc_views(path, dims, params);
  std::array<int32_t, kLlmcHeaderInts> header{};
  header[0] = kLlmcMagic;
  header[1] = kLlmcVersionFp32;
  header[2] = dims.max_seq_len;
  header[3] = dims.vocab_size;
  header[4] = dims.num_layers;
  header[5] = dims.num_heads;
  header[6] = dims.channels;
  header[7] = dims.padded_vocab_size;
  replace_file_atomically(path, [&](CheckedFile& file) {
    file.write_all(header.data(), kLlmcHeaderBytes);
    for (const TensorView& p : params) file.write_all(p.data, p.bytes());
  });
}

LlmcDims read_llmc_dims(const std::string& path) {
  CheckedFile file(path, O_RDONLY);
  return read_llmc_header(file, path);
}

void import_llmc(const std::string& path, const LlmcDims& expected,
                 const std::vector<TensorView>& params) {
  CheckedFile file(path, O_RDONLY);
  const LlmcDims d = read_llmc_header(file, path);
  std::string differences;
  auto compare = [&](const char* name, int have, int want) {
    if (have == want) return;
    differences += std::string(differences.empty() ? "" : ", ") + name + "=" +
                   std::to_string(have) + " (the model has " + std::to_string(want) + ")";
  };
  compare("maxT", d.max_seq_len, expected.max_seq_len);
  compare("V", d.vocab_size, expected.vocab_size);
  compare("L", d.num_layers, expected.num_layers);
  compare("NH", d.num_heads, expected.num_heads);
  compare("C", d.channels, expected.channels);
  compare("Vp", d.padded_vocab_size, expected.padded_vocab_size);
  if (!differences.empty()) throw Error(path + ": the file's dims differ: " + differences);
  check_llmc_views(path, d, params);
  for (const TensorView& p : params) {
    if (!file.read_exact(p.data, p.bytes())) {
      throw Error(path + ": truncated in " + p.name);
    }
  }
}

}  // namespace kt::worker

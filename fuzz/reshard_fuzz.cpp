// libFuzzer harness: resharding resume (worker/checkpoint.h). Input: a shard's safetensors JSON
// header (its slice metadata above all); the harness appends the data block the header's
// data_offsets ask for (at most 1 MiB), writes the shard with a metadata.json whose size and
// SHA-256 are right, and loads the checkpoint into a small GPT at TP 1 and as rank 1 of TP 2 —
// the views that assemble their slices from whatever the header claims. Anything must load or
// be refused with a std::runtime_error (kt::Error: damage or a model that does not fit), never
// another exception, and never a read or write outside a buffer (ASan).
//   fuzz/run.sh reshard 60
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint.h"
#include "worker/gpt_layout.h"
#include "worker/sha256.h"

namespace {

// seeds.py writes a TP 2 rank-0 header of this model.
kt::worker::GptConfig config() {
  kt::worker::GptConfig c;
  c.max_seq_len = 8;
  c.vocab = 30;
  c.padded_vocab = 32;
  c.layers = 1;
  c.heads = 2;
  c.channels = 8;
  c.ffn = 16;
  return c;
}

void write(const std::string& path, const std::string& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

struct Layout {
  std::vector<float> storage[3];
  kt::worker::CheckpointTensors tensors;
  Layout(int64_t t, int64_t r) {
    const auto sizes = kt::worker::gpt_param_sizes(config(), t);
    int64_t n = 0;
    for (int64_t s : sizes) n += s;
    std::vector<kt::worker::TensorView>* groups[3] = {&tensors.params, &tensors.adam_m,
                                                      &tensors.adam_v};
    for (int g = 0; g < 3; ++g) {
      storage[g].assign(static_cast<size_t>(n), 0.0f);
      *groups[g] = kt::worker::gpt_rank_views(config(), t, r, storage[g].data());
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // One scratch checkpoint directory per fuzzing process, removed when it exits.
  struct Scratch {
    std::string path;
    Scratch() {
      char pattern[] = "/tmp/kt-reshard-fuzz-XXXXXX";
      if (!::mkdtemp(pattern)) std::abort();
      path = pattern;
    }
    ~Scratch() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  };
  static const Scratch scratch;
  const std::string& root = scratch.path;
  std::string header(kt::fuzz::as_text(data, size));
  // The data block: as long as the largest end offset the header names (else none).
  uint64_t block = 0;
  const nlohmann::json doc = nlohmann::json::parse(header, nullptr, false);
  if (doc.is_object())
    for (const auto& [name, entry] : doc.items())
      if (entry.is_object() && entry.contains("data_offsets") && entry["data_offsets"].is_array() &&
          entry["data_offsets"].size() == 2 && entry["data_offsets"][1].is_number_unsigned())
        block = std::max(block, entry["data_offsets"][1].get<uint64_t>());
  if (block > (1u << 20)) return 0;
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string file(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) file[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  file += header;
  for (uint64_t i = 0; i < block; ++i) file.push_back(static_cast<char>(i * 37 % 251));
  const std::string dir = root + "/step-00000005";
  ::mkdir(dir.c_str(), 0755);
  write(dir + "/rank-00000.safetensors", file);
  kt::worker::Sha256 sha;
  sha.update(file.data(), file.size());
  const nlohmann::json metadata = {
      {"format", "kubetrain-checkpoint/v1"}, {"step", 5},
      {"dataCursor", nlohmann::json::object()}, {"rng", nlohmann::json::object()},
      {"planHash", "p"}, {"loss", 1.0}, {"extra", nlohmann::json::object()},
      {"checksumAlgorithm", "sha256"},
      {"files", {{"rank-00000.safetensors", {{"bytes", file.size()},
                                              {"checksum", sha.hex_digest()}}}}}};
  write(dir + "/metadata.json", metadata.dump());
  write(root + "/latest", "step-00000005\n");
  for (const auto& [t, r] : {std::pair<int64_t, int64_t>{1, 0}, {2, 1}}) {
    Layout layout(t, r);
    try {
      (void)kt::worker::load_latest_checkpoint(root, layout.tensors);
    } catch (const std::runtime_error&) {
    }
  }
  return 0;
}

// llm.c's model file (train_gpt2.c: gpt2_build_from_checkpoint, gpt2_write_to_checkpoint): a
// header of 256 × int32 (magic 20240326, version 3, maxT, V, L, NH, C, Vp; the rest 0), then the
// 16 fp32 parameter tensors in llm.c's order. Importing starts a run from llm.c's weights;
// `kubetrain-worker export-llmc` writes a checkpoint's weights for llm.c (docs/CHECKPOINTS.md,
// "llm.c interop").
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "worker/tensor_view.h"

namespace kt::worker {

struct LlmcDims {
  int max_seq_len, vocab_size, num_layers, num_heads, channels, padded_vocab_size;
};

// Writes `params`, the 16 tensors of worker/gpt.h in llm.c's order (their sizes are checked
// against `dims`), atomically (worker/durable_file.h).
void export_llmc(const std::string& path, const LlmcDims& dims,
                 const std::vector<TensorView>& params);
// Reads the header (throws kt::Error naming the file on a bad magic / version / size).
LlmcDims read_llmc_dims(const std::string& path);
// Checks a header (its 256 words) against the size of the file `path` it came from.
LlmcDims decode_llmc_header(const std::array<int32_t, 256>& header, uint64_t file_bytes,
                            const std::string& path);
// Reads the parameters into `params`; the file's dims must equal `expected` (the model's).
void import_llmc(const std::string& path, const LlmcDims& expected,
                 const std::vector<TensorView>& params);

}  // namespace kt::worker

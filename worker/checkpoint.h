// Checkpoints: safetensors shards plus a metadata JSON, written atomically.
//
// Layout under the checkpoint directory:
//   step-00000120/rank-00000.safetensors   one shard per rank: fp32 master weights and AdamW
//                                          moments ("param/<name>", "adam_m/<name>",
//                                          "adam_v/<name>"), each recording its slice of the
//                                          logical tensor in the safetensors __metadata__
//   step-00000120/metadata.json            step, data cursor, RNG state, plan hash, loss, and a
//                                          checksum of every shard file
//   latest                                 "step-00000120\n", replaced atomically
// A checkpoint is built in a temporary directory, every file fsync'd, the directory renamed into
// place and the parent fsync'd, then `latest` is replaced (write temp, fsync, rename). The
// newest `keep` checkpoints are kept.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "worker/tensor_view.h"

namespace kt::worker {

struct CheckpointMeta {
  int64_t step = 0;
  nlohmann::json data_cursor;
  nlohmann::json rng;
  std::string plan_hash;
  double loss = 0;
  nlohmann::json extra;  // free-form (e.g. the model dims, the world layout)
};

struct CheckpointTensors {
  std::vector<TensorView> params;  // fp32 master weights
  std::vector<TensorView> adam_m;  // same names and shapes as params
  std::vector<TensorView> adam_v;
};

// Single-rank writer for now (rank 0 of world 1); returns the checkpoint's directory.
std::string save_checkpoint(const std::string& root, const CheckpointMeta& meta,
                            const CheckpointTensors& tensors, int keep);

// Several ranks, one checkpoint: the ranks holding distinct slices (the TP ranks of DP group 0)
// each write their shard, rank-<shard_index>.safetensors with a small rank-<i>.json (bytes,
// checksum), into one temporary directory on the shared checkpoint volume; after `barrier` the
// leader (global rank 0) writes metadata.json listing every shard, publishes the directory and
// replaces `latest`; a second barrier keeps the others from running ahead of the commit. Every
// rank of the job must call it with the same step. Returns the checkpoint's directory.
struct ShardedSave {
  int shard_index = 0;
  int shard_count = 1;
  bool writes = true;  // false on DP replicas: their slices are already written
  bool leader = true;
  std::function<void()> barrier;  // over all ranks of the job
};
std::string save_checkpoint(const std::string& root, const CheckpointMeta& meta,
                            const CheckpointTensors& tensors, int keep, const ShardedSave& save);

// Loads the newest valid checkpoint into `tensors` (names and shapes must match; throws
// kt::Error naming the tensor otherwise). A checkpoint whose checksum or structure is bad is
// reported on stderr and the previous one is tried. nullopt when there is none.
std::optional<CheckpointMeta> load_latest_checkpoint(const std::string& root,
                                                     const CheckpointTensors& tensors);

// llm.c's model file (header 256 × int32: magic 20240326, version 3, maxT, V, L, NH, C, Vp;
// then the fp32 parameters in llm.c's order). `params` are the 16 tensors of worker/gpt.h in
// that order.
struct LlmcDims {
  int max_seq_len, vocab_size, num_layers, num_heads, channels, padded_vocab_size;
};
void export_llmc(const std::string& path, const LlmcDims& dims,
                 const std::vector<TensorView>& params);
// Reads the header (throws kt::Error naming the file on a bad magic / version / size).
LlmcDims read_llmc_dims(const std::string& path);
void import_llmc(const std::string& path, const LlmcDims& expected,
                 const std::vector<TensorView>& params);

}  // namespace kt::worker

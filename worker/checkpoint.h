// The checkpoint protocol: safetensors shards plus a metadata JSON, written atomically, loaded
// with fallback past damaged checkpoints (docs/CHECKPOINTS.md).
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

#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/error.h"
#include "worker/durable_file.h"
#include "worker/tensor_view.h"

namespace kt::worker {

struct CheckpointMeta {
  int64_t step = 0;
  nlohmann::json data_cursor;
  nlohmann::json rng;
  std::string plan_hash;
  double loss = 0;
  nlohmann::json extra;  // free-form (e.g. the model dims, the world layout)
  // Loading: how many of this rank's tensors were assembled from slices of another layout.
  int64_t resharded = 0;
};

struct CheckpointTensors {
  std::vector<TensorView> params;  // fp32 master weights
  std::vector<TensorView> adam_m;  // same names and shapes as params
  std::vector<TensorView> adam_v;
};

// A system call of a checkpoint save or load failed; err() is its errno (ENOSPC: disk full, EROFS:
// read-only, EACCES: no permission, ...). A failed save removes its partial files and leaves
// `latest` and the earlier checkpoints as they were; the trainer reports it and saves again at
// the next interval.
using CheckpointIoError = IoError;

// Single-rank writer for now (rank 0 of world 1); returns the checkpoint's directory.
std::string save_checkpoint(const std::string& root, const CheckpointMeta& meta,
                            const CheckpointTensors& tensors, int keep);

// Several ranks, one checkpoint: the ranks holding distinct slices (the TP ranks of DP group 0)
// each write their shard, rank-<shard_index>.safetensors with a small rank-<i>.json (bytes,
// checksum), into one temporary directory on the shared checkpoint volume; after `barrier` the
// leader (global rank 0) writes metadata.json listing every shard, publishes the directory and
// replaces `latest`; a second barrier keeps the others from running ahead of the commit. Every
// rank of the job must call it with the same step. Returns the checkpoint's directory. A rank
// whose part fails still meets every barrier (no rank is left waiting); with `all_ok`, every
// rank then throws when any rank failed, so that all agree whether the checkpoint exists.
struct ShardedSave {
  int shard_index = 0;
  int shard_count = 1;
  bool writes = true;  // false on DP replicas: their slices are already written
  // Further shards this rank writes, by index (a cutpoint's layers after the cut, whose TP
  // ranks and DP replicas are not the ones before it).
  std::vector<std::pair<int, CheckpointTensors>> more;
  bool leader = true;
  std::function<void()> barrier;  // over all ranks of the job
  // Over all ranks of the job: true when every rank passed true (also a barrier). Optional.
  std::function<bool(bool ok)> all_ok;
};
std::string save_checkpoint(const std::string& root, const CheckpointMeta& meta,
                            const CheckpointTensors& tensors, int keep, const ShardedSave& save);

// One writer per checkpoint directory: an exclusive flock(2) on <root>/.lock (created with the
// directory), held while the object lives; it records the holder ("pid 42 on host-a"). The
// writing rank takes it (global rank 0: the other ranks of the same job write their shards under
// its lock). A second job pointed at the same directory is refused instead of interleaving its
// checkpoints with the first one's. flock locks are released when the process dies, also on NFS
// (Linux maps them to POSIX locks there).
class CheckpointLock {
 public:
  // Retries for up to `wait` (a previous holder may still be exiting); then throws kt::Error
  // naming the directory and the holder.
  static CheckpointLock acquire(const std::string& root, std::chrono::milliseconds wait);
  CheckpointLock(CheckpointLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  CheckpointLock& operator=(CheckpointLock&&) = delete;
  CheckpointLock(const CheckpointLock&) = delete;
  ~CheckpointLock();

 private:
  explicit CheckpointLock(int fd) : fd_(fd) {}
  int fd_;
};

// Loads the newest valid checkpoint into `tensors` (names and shapes must match; throws
// kt::Error naming the tensor otherwise). A checkpoint whose checksum or structure is bad is
// reported on stderr and the previous one is tried. nullopt when there is none.
std::optional<CheckpointMeta> load_latest_checkpoint(const std::string& root,
                                                     const CheckpointTensors& tensors);

// The readings of a checkpoint's small files, apart from the disk (the loader uses them; tests
// and fuzz/ call them on bytes). Both throw kt::Error for a checkpoint this build cannot read and
// another std::runtime_error for a damaged one (the loader then tries the previous checkpoint).
//
// `latest` ("step-00000120\n"): the step it names, or why it names none.
struct LatestPointer {
  std::optional<int64_t> step;
  std::string problem;  // when there is no step: "it holds \"...\", not a step directory name"
};
LatestPointer parse_latest_pointer(std::string_view text);
// metadata.json of the checkpoint directory `dir` of `step`: every field present and typed, the
// step the directory's, each shard record a plain file name with bytes and checksum.
CheckpointMeta parse_checkpoint_metadata(std::string_view text, const std::string& dir,
                                         int64_t step);

}  // namespace kt::worker

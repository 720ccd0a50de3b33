// Collective communication between the ranks of a job (docs/WORKER.md, "Groups and
// collectives"): one interface, a Gloo backend over TCP for CPU ranks (the NCCL group for CUDA
// ranks is worker/comm_nccl.h), process groups for tensor and data parallelism from the Plan (TP
// groups are consecutive ranks inside a node), and the counters the comm metrics need.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "api/error.h"

namespace kt::worker {

enum class ReduceOp { kSum, kMax };

// An asynchronous collective in flight. wait() blocks until it completed (rethrowing its error);
// the time a caller spends blocked in wait() is the group's "exposed" communication time.
class CommWork {
 public:
  virtual ~CommWork() = default;
  virtual void wait() = 0;
};

struct CommStats {
  int64_t collectives = 0;  // operations issued (all kinds)
  int64_t allreduces = 0;   // of which all-reduces
  int64_t bytes = 0;        // payload bytes of this rank's buffers
  double seconds = 0;       // time the operations took on the communication thread
  double exposed_seconds = 0;  // time callers were blocked waiting for them

  CommStats& operator+=(const CommStats& more) {
    collectives += more.collectives;
    allreduces += more.allreduces;
    bytes += more.bytes;
    seconds += more.seconds;
    exposed_seconds += more.exposed_seconds;
    return *this;
  }
};

// One process group. Operations are executed in issue order on the group's communication
// thread; every rank of the group must issue the same operations in the same order.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;  // within the group
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;  // "tp", "dp", "world"

  // In place over `count` floats at `data`, which must stay valid until wait() returns.
  virtual std::shared_ptr<CommWork> allreduce_async(float* data, size_t count, ReduceOp op) = 0;
  void allreduce(float* data, size_t count, ReduceOp op = ReduceOp::kSum) {
    allreduce_async(data, count, op)->wait();
  }
  // out[r·count .. (r+1)·count) = rank r's in[0 .. count).
  virtual void allgather(const float* in, float* out, size_t count) = 0;
  // The same, returning at once where the group has a communication thread (Gloo); in and out
  // must stay valid until wait() returns. By default it runs now and returns a finished work.
  virtual std::shared_ptr<CommWork> allgather_async(const float* in, float* out, size_t count);
  // out[0 .. count) = Σ_ranks in[rank·count .. (rank+1)·count).
  virtual void reduce_scatter(const float* in, float* out, size_t count) = 0;
  // The same, returning at once where the group has a communication thread (Gloo); in and out
  // must stay valid until wait() returns. By default it runs now and returns a finished work.
  virtual std::shared_ptr<CommWork> reduce_scatter_async(const float* in, float* out, size_t count);
  virtual void broadcast(float* data, size_t count, int root) = 0;
  virtual void barrier() = 0;
  // Point to point (pipeline stages): `count` floats to or from group rank `peer`. A send is
  // matched with the peer's recv in issue order (per direction). Both return at once; the
  // buffer must stay valid until wait() returns. A send never waits for the receiver to be
  // ready before returning, so two stages may send to each other before either receives (the
  // 1F1B schedule does). They do not run on the group's communication thread: a group that
  // carries them should carry no collective at the same time. By default: refused (kt::Error).
  virtual std::shared_ptr<CommWork> send_async(const float* data, size_t count, int peer);
  virtual std::shared_ptr<CommWork> recv_async(float* data, size_t count, int peer);

  virtual CommStats stats() const = 0;
};

// A work that completed when it was made (the synchronous defaults below).
struct FinishedWork : CommWork {
  void wait() override {}
};
inline std::shared_ptr<CommWork> Communicator::allgather_async(const float* in, float* out,
                                                               size_t count) {
  allgather(in, out, count);
  return std::make_shared<FinishedWork>();
}
inline std::shared_ptr<CommWork> Communicator::reduce_scatter_async(const float* in, float* out,
                                                                    size_t count) {
  reduce_scatter(in, out, count);
  return std::make_shared<FinishedWork>();
}

inline std::shared_ptr<CommWork> Communicator::send_async(const float*, size_t, int peer) {
  throw Error("group " + name() + " has no point-to-point send (to rank " + std::to_string(peer) +
              ")");
}
inline std::shared_ptr<CommWork> Communicator::recv_async(float*, size_t, int peer) {
  throw Error("group " + name() + " has no point-to-point receive (from rank " +
              std::to_string(peer) + ")");
}

// Sums `n` doubles over `group` in place, through its float all-reduce: each as a float and the
// float's remainder, so that the total keeps about 14 digits. At most 4 values.
inline void allreduce_doubles(Communicator& group, double* values, size_t n) {
  float parts[8];
  KT_CHECK(n <= 4, "allreduce_doubles sums at most 4 values");
  for (size_t i = 0; i < n; ++i) {
    parts[2 * i] = static_cast<float>(values[i]);
    parts[2 * i + 1] = static_cast<float>(values[i] - static_cast<double>(parts[2 * i]));
  }
  group.allreduce(parts, 2 * n);
  for (size_t i = 0; i < n; ++i)
    values[i] = static_cast<double>(parts[2 * i]) + static_cast<double>(parts[2 * i + 1]);
}

// A group of one rank: every collective is the identity (TP = 1 or DP = 1).
std::unique_ptr<Communicator> make_single_rank_communicator(const std::string& name);

// How a rank finds the others: the rendezvous store on rank 0 at MASTER_ADDR:MASTER_PORT.
struct RendezvousConfig {
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int rank = 0;
  int world_size = 1;
  std::string job_id = "job";  // prefixes every key: attempts and jobs never collide
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  static RendezvousConfig from_env();  // MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, KUBETRAIN_JOB_ID
};

// The groups of one rank. Ranks are laid out TP fastest, then DP, then pipeline stages
// (Megatron's order): stage s holds ranks [s·tp·dp, (s+1)·tp·dp); inside it, rank w of the
// stage is TP rank w % tp of DP rank ⌊w/tp⌋. Groups: world; TP (consecutive ranks); DP (the
// stage's ranks with the same TP rank); PP (the ranks with the same place w in every stage:
// group rank = stage, for the activations and gradients between stages); and, with stages, the
// embedding group (the first and the last stage's rank at w, which sum the tied wte's gradient),
// null on the other stages and without stages. tp · dp · pp must equal world_size.
//
// With a cutpoint (api::ParallelConfig::cut_layer) without stages, the layers after the cut
// have groups of their own over the same ranks: tp2 (consecutive runs of cut_tp ranks), dp2
// (the ranks with the same rank % cut_tp), and the cut group, over which the activations
// re-shard: with n = min(tp, cut_tp) and m = max(tp, cut_tp), the ranks of one run of m with the
// same rank % n (group rank (rank % m) / n), whose samples the wider TP group joins. Null
// without one. With stages (per-stage TP: the stages from cut_stage on run at cut_tp), those
// stages' TP and DP groups are of their own degree (place w: TP rank w % cut_tp of DP rank
// ⌊w/cut_tp⌋), the first of them and the last have the cut group (of the stage's places, as
// above), and the embedding group is every rank of the first and the last stage (the two hold
// the tied embeddings in different TP layouts: worker/cutpoint.h sums them as logical tensors).
struct ProcessGroups {
  std::unique_ptr<Communicator> world, tp, dp, pp, embedding;
  std::unique_ptr<Communicator> tp2, dp2, cut;
};
// Where `rank` sits in each group of the layout above: the group's name, its key among the
// job's groups (equal keys: the same group), the rank in it and its size (0: no such group).
struct GroupPlace {
  std::string name, key;
  int rank = 0, size = 0;
};
struct RankPlaces {
  GroupPlace world, tp, dp, pp, embedding, tp2, dp2, cut;
};
// cut_tp 0: no cutpoint; cut_stage: with stages and a cutpoint, the first stage at cut_tp.
RankPlaces rank_places(int rank, int world, int tp, int dp, int pp = 1, int cut_tp = 0,
                       int cut_stage = 0);
// Connects to the others (rank 0 also hosts the store). Throws kt::Error with a clear message
// on a timeout (naming MASTER_ADDR:MASTER_PORT and the missing ranks), a port in use, or a
// world-size mismatch between ranks. cut_tp > 0: also the cutpoint's groups (cut_stage: with
// stages, the first stage at cut_tp).
ProcessGroups connect_process_groups(const RendezvousConfig& config, int tp, int dp, int pp = 1,
                                     int cut_tp = 0, int cut_stage = 0);

}  // namespace kt::worker

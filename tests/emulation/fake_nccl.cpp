// libnccl for the emulated CUDA runtime (tests/emulation/README.md): a shared library that
// worker/comm_nccl.cpp dlopens through KUBETRAIN_NCCL_LIBRARY, so the NCCL group's own code runs
// in CI with ranks on threads of one process. Declared by the toolkit's nccl.h.
//
// A collective is one operation on its stream for the stream-order checker (it reads the send
// buffer and writes the receive buffer there, as NCCL's kernel does), and its data moves at once:
// the ranks of a communicator meet at each collective (in issue order, which NCCL requires of its
// callers too), rank 0 computes the result in fp32, and every rank copies its part out. Sums of
// bf16 are taken in fp32 and rounded once.
//
// It resolves kt::emulation::device_op from the test executable (built with ENABLE_EXPORTS).
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/bf16.h"
#include "tests/emulation/stream_order.h"

namespace {
namespace em = kt::emulation;

// The ranks of one communicator.
struct Clique {
  Clique(std::string id, int n) : key(std::move(id)), size(n), sends(n), recvs(n) {}
  const std::string key;  // the unique id's bytes: its entry in g_cliques
  const int size;
  std::mutex mutex;
  std::condition_variable changed;
  int arrived = 0;
  uint64_t generation = 0;
  bool broken = false;  // a rank stopped coming: every later call fails
  int members = 0;
  std::vector<const void*> sends;
  std::vector<void*> recvs;
  std::vector<float> result;
  // Point to point: the messages sent and not yet received, by (from, to), in order.
  std::map<std::pair<int, int>, std::vector<std::vector<float>>> mail;
};

std::mutex g_mutex;
std::map<std::string, std::shared_ptr<Clique>> g_cliques;  // by unique id

// Every rank of the clique arrives before any leaves; false when one never comes (60 s).
bool meet(Clique& c) {
  std::unique_lock lock(c.mutex);
  if (c.broken) return false;
  const uint64_t generation = c.generation;
  if (++c.arrived == c.size) {
    c.arrived = 0;
    ++c.generation;
    c.changed.notify_all();
    return true;
  }
  if (!c.changed.wait_for(lock, std::chrono::seconds(60),
                          [&] { return c.generation != generation || c.broken; }) ||
      c.broken) {
    c.broken = true;
    c.changed.notify_all();
    std::fprintf(stderr, "emulated NCCL: a rank did not reach the collective within 60 s\n");
    return false;
  }
  return true;
}

size_t element_bytes(ncclDataType_t type) {
  return type == ncclBfloat16 ? 2 : 4;
}
float load(const void* p, size_t i, ncclDataType_t type) {
  if (type == ncclBfloat16) return kt::kernels::bf16_to_float(static_cast<const uint16_t*>(p)[i]);
  return static_cast<const float*>(p)[i];
}
void store(void* p, size_t i, float value, ncclDataType_t type) {
  if (type == ncclBfloat16)
    static_cast<uint16_t*>(p)[i] = kt::kernels::float_to_bf16(value);
  else
    static_cast<float*>(p)[i] = value;
}

enum class Kind { kAllReduce, kAllGather, kReduceScatter, kBroadcast };

}  // namespace

struct ncclComm {
  std::shared_ptr<Clique> clique;
  int rank;
};

namespace {

// `count`: elements per rank in (send) for all-gather, out (recv) for reduce-scatter, both for
// all-reduce and broadcast.
ncclResult_t collective(Kind kind, const char* what, const void* send, void* recv, size_t count,
                        ncclDataType_t type, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream) {
  if (!comm || (type != ncclFloat && type != ncclBfloat16) || (op != ncclSum && op != ncclMax))
    return ncclInvalidArgument;
  Clique& c = *comm->clique;
  const int n = c.size, rank = comm->rank;
  const size_t bytes = element_bytes(type);
  const size_t in = kind == Kind::kReduceScatter ? count * n : count;
  const size_t out = kind == Kind::kAllGather ? count * n : count;
  em::device_op(stream, what, {em::reads(send, in * bytes), em::writes(recv, out * bytes)});
  c.sends[rank] = send;
  c.recvs[rank] = recv;
  if (!meet(c)) return ncclSystemError;
  if (rank == 0) {  // everyone's input is in place and nobody has written yet
    c.result.assign(kind == Kind::kAllGather ? count * n : in, 0.0f);
    if (kind == Kind::kAllGather) {
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i) c.result[r * count + i] = load(c.sends[r], i, type);
    } else if (kind == Kind::kBroadcast) {
      for (size_t i = 0; i < count; ++i) c.result[i] = load(c.sends[root], i, type);
    } else {
      for (size_t i = 0; i < in; ++i) {
        float acc = load(c.sends[0], i, type);
        for (int r = 1; r < n; ++r) {
          const float x = load(c.sends[r], i, type);
          acc = op == ncclSum ? acc + x : std::max(acc, x);
        }
        c.result[i] = acc;
      }
    }
  }
  if (!meet(c)) return ncclSystemError;
  const size_t from = kind == Kind::kReduceScatter ? rank * count : 0;
  for (size_t i = 0; i < out; ++i) store(recv, i, c.result[from + i], type);
  if (!meet(c)) return ncclSystemError;  // the result buffer is free again
  return ncclSuccess;
}

}  // namespace

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static std::atomic<int> next{0};
  std::memset(id->internal, 0, sizeof id->internal);
  std::snprintf(id->internal, sizeof id->internal, "emulated-nccl-%d", next++);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  std::shared_ptr<Clique> clique;
  {
    std::lock_guard lock(g_mutex);
    const std::string key(id.internal, sizeof id.internal);
    auto& slot = g_cliques[key];
    if (!slot) slot = std::make_shared<Clique>(key, nranks);
    if (slot->size != nranks) return ncclInvalidUsage;
    ++slot->members;
    clique = slot;
  }
  *comm = new ncclComm{clique, rank};
  return meet(*clique) ? ncclSuccess : ncclSystemError;  // initialisation is collective
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  {
    std::lock_guard lock(g_mutex);
    if (--comm->clique->members == 0) g_cliques.erase(comm->clique->key);
  }
  delete comm;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclInvalidArgument:
      return "invalid argument (emulated NCCL: float or bfloat16, sum or max)";
    case ncclInvalidUsage:
      return "invalid usage (emulated NCCL: ranks disagree on the group size)";
    case ncclSystemError:
      return "system error (emulated NCCL: a rank never reached the collective)";
    default:
      return "emulated NCCL error";
  }
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return collective(Kind::kAllReduce, "ncclAllReduce", send, recv, count, type, op, 0, comm,
                    stream);
}
ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  return collective(Kind::kAllGather, "ncclAllGather", send, recv, count, type, ncclSum, 0, comm,
                    stream);
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return collective(Kind::kReduceScatter, "ncclReduceScatter", send, recv, count, type, op, 0, comm,
                    stream);
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  return collective(Kind::kBroadcast, "ncclBroadcast", send, recv, count, type, ncclSum, root, comm,
                    stream);
}
// Point to point: a send copies its data into the pair's mailbox and returns (so a group's send
// never waits for its receive); a receive waits for the pair's next message (60 s), as the
// stream-order checker sees one operation each.
ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  if (!comm || (type != ncclFloat && type != ncclBfloat16) || peer < 0 ||
      peer >= comm->clique->size)
    return ncclInvalidArgument;
  em::device_op(stream, "ncclSend", {em::reads(send, count * element_bytes(type))});
  std::vector<float> message(count);
  for (size_t i = 0; i < count; ++i) message[i] = load(send, i, type);
  Clique& c = *comm->clique;
  std::lock_guard lock(c.mutex);
  c.mail[{comm->rank, peer}].push_back(std::move(message));
  c.changed.notify_all();
  return ncclSuccess;
}
ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  if (!comm || (type != ncclFloat && type != ncclBfloat16) || peer < 0 ||
      peer >= comm->clique->size)
    return ncclInvalidArgument;
  em::device_op(stream, "ncclRecv", {em::writes(recv, count * element_bytes(type))});
  Clique& c = *comm->clique;
  std::unique_lock lock(c.mutex);
  auto& box = c.mail[{peer, comm->rank}];
  if (!c.changed.wait_for(lock, std::chrono::seconds(60),
                          [&] { return !box.empty() || c.broken; }) ||
      c.broken) {
    c.broken = true;
    c.changed.notify_all();
    std::fprintf(stderr, "emulated NCCL: no message from rank %d within 60 s\n", peer);
    return ncclSystemError;
  }
  std::vector<float> message = std::move(box.front());
  box.erase(box.begin());
  if (message.size() != count) return ncclInvalidUsage;
  for (size_t i = 0; i < count; ++i) store(recv, i, message[i], type);
  return ncclSuccess;
}
// Calls inside a group run as they come: the ranks issue the same sequence, so they still meet.
ncclResult_t ncclGroupStart() {
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  return ncclSuccess;
}

}  // extern "C"

// Data parallelism for the CUDA model (docs/WORKER.md): the sum of gradient ranges over the ranks
// of the DP group, in place in device memory, started as each layer's gradients become final in
// the last micro-batch's backward, so that it overlaps the backward of the layers below.
//
// Two implementations:
//   NCCL (worker/comm_nccl.h): ncclAllReduce on the reducer's own stream, after an event the
//     compute stream recorded; nothing blocks the host. Needs one GPU per rank (NCCL refuses two
//     ranks on one device).
//   host (make_host_gradient_reducer): device → pinned host → the group's Communicator (Gloo over
//     TCP) → device, synchronously. Slower; it serves ranks that share a GPU (a workstation
//     with fewer GPUs than ranks, or the device check on one GPU) and machines without NCCL.
// Both sum; the model scales its loss by 1/dp, so the sums are the global batch's mean gradient.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "worker/comm.h"
#include "worker/cuda_device.h"

namespace kt::worker {

enum class DeviceDtype { kFloat32, kBfloat16 };

class GradientReducer {
 public:
  using Ranges = std::vector<std::pair<float*, size_t>>;  // device pointer, float count
  virtual ~GradientReducer() = default;
  virtual int rank() const = 0;              // this rank's place in the group
  virtual int size() const = 0;              // ranks in the group
  virtual const char* backend() const = 0;   // "nccl" or "host"
  // Sums every range over the group (in place), after `ready` (an event recorded on the stream
  // that produced them). Every rank must reduce the same ranges in the same order.
  virtual void reduce(const Ranges& ranges, const CudaEvent& ready) = 0;
  // The distributed optimizer (ZeRO-1): `bucket` (size() · count floats) summed over the group,
  // rank r's part [r·count, (r+1)·count) of the sums into `shard`, after `ready`; `done` is
  // recorded where the bucket may be written again and the shard read.
  virtual void reduce_scatter(const float* bucket, float* shard, size_t count,
                              const CudaEvent& ready, CudaEvent& done) = 0;
  // bucket[r·count, (r+1)·count) := rank r's `shard` (`count` elements of `type`; the shard may
  // be this rank's own place in the bucket), after `ready`; `done` recorded once it is in place.
  virtual void all_gather(const void* shard, void* bucket, size_t count, DeviceDtype type,
                          const CudaEvent& ready, CudaEvent& done) = 0;
  // Work enqueued on `stream` from now on waits for every reduction issued so far.
  virtual void join(CudaStream& stream) = 0;
  // Bytes summed so far (this rank's buffers) and the seconds the host was blocked in reduce
  // or join (the exposed communication time).
  virtual CommStats stats() const = 0;
};

// Tensor parallelism's collectives for the CUDA model: all-reduces of device buffers ordered by
// events. The model issues every one on the device's TP communication stream: after `ready`
// (recorded on the compute stream when the input was written), and records `done` there when the
// result is in place; the compute stream waits for `done` where it reads the result — at once, or
// (Oases' sub-batches) after computing the other sub-batch. NCCL runs on that stream without
// blocking the host; the host implementation waits for `ready`, sums through the group's
// Communicator (Gloo) and copies back before it returns.
class StreamCollectives {
 public:
  virtual ~StreamCollectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend() const = 0;  // "nccl" or "host"
  // `count` elements at device `data` := their sum (or max) over the group, on `stream`.
  virtual void allreduce_after(void* data, size_t count, DeviceDtype type, ReduceOp op,
                               const CudaEvent& ready, CudaEvent& done, CudaStream& stream) = 0;
  virtual CommStats stats() const = 0;
};
std::unique_ptr<StreamCollectives> make_host_stream_collectives(Communicator& group,
                                                                CudaDevice& device);

// Pipeline stages' transfers between CUDA ranks (the PP group): bf16 activations to the next
// stage, their gradients to the one before, each exchange a send and/or a receive with its peers
// (Megatron-LM's pairs, send_forward_recv_backward and the like: NCCL's sends wait for their
// receives, so a stage that sends and then receives pairs them in one group). `count` bf16 at
// device `send` to group rank `to`, `count` from group rank `from` into device `recv` (either
// null), on `stream` after `ready`; `done` is recorded there once both are complete. NCCL runs
// them with ncclSend/ncclRecv in one group; the host implementation stages them through pinned
// memory and the group's Communicator (Gloo's point to point) and returns when they are done.
// The interleaved schedule's groups hold up to two sends and two receives
// (worker/pipeline_order.h): exchange_group issues them in the order given, which is the order a
// pair of ranks matches them in.
struct PointToPointOp {
  const void* send = nullptr;  // or
  void* recv = nullptr;
  int peer = 0;
  size_t count = 0;  // bf16 elements; 0: the group's (per-stage TP: each side of the cut its own)
};
class StreamPointToPoint {
 public:
  virtual ~StreamPointToPoint() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend() const = 0;  // "nccl" or "host"
  virtual void exchange_group(const std::vector<PointToPointOp>& ops, size_t count,
                              const CudaEvent& ready, CudaEvent& done, CudaStream& stream) = 0;
  void exchange(const void* send, int to, void* recv, int from, size_t count,
                const CudaEvent& ready, CudaEvent& done, CudaStream& stream) {
    std::vector<PointToPointOp> ops;
    if (send) ops.push_back({send, nullptr, to});
    if (recv) ops.push_back({nullptr, recv, from});
    exchange_group(ops, count, ready, done, stream);
  }
  virtual CommStats stats() const = 0;
};
std::unique_ptr<StreamPointToPoint> make_host_point_to_point(Communicator& group,
                                                             CudaDevice& device);

// Which collectives (DP reducer, TP all-reduces) a job's CUDA ranks use, decided alike on every
// rank from facts gathered from all of them: `mode` (KUBETRAIN_CUDA_COMM: "auto", "nccl" or
// "host"), the GPU of each rank as
// `gpu_keys` (any equal-length identity per rank; equal keys = ranks sharing a GPU), and why
// NCCL cannot run somewhere ("" when libnccl loads on every rank). NCCL when it can, else the
// host; `reason` says why for the log. Throws kt::Error for an unknown mode, or for "nccl" where
// NCCL cannot run.
struct ReducerChoice {
  std::string backend;  // "nccl" or "host"
  std::string reason;
};
ReducerChoice choose_reducer(const std::string& mode,
                             const std::vector<std::vector<float>>& gpu_keys,
                             const std::string& no_nccl);

// The host-staged reducer over `group` (its allreduce), copying through pinned memory of
// `device` on its data-parallel stream.
std::unique_ptr<GradientReducer> make_host_gradient_reducer(Communicator& group,
                                                            CudaDevice& device);

}  // namespace kt::worker

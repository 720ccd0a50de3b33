#include "worker/comm_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <mutex>
#include <vector>

#include "api/error.h"

namespace kt::worker {
namespace {

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw Error(std::string(what) + " failed: " + cudaGetErrorString(status));
}

void check_nccl(ncclResult_t status, const char* what) {
  if (status != ncclSuccess)
    throw Error(std::string(what) + " failed: " + ncclGetErrorString(status) +
                " (a rank died, or NCCL_DEBUG=INFO says more)");
}

class NcclCommunicator;

class NcclWork : public CommWork {
 public:
  NcclWork(NcclCommunicator& owner, cudaEvent_t event) : owner_(owner), event_(event) {}
  ~NcclWork() override { cudaEventDestroy(event_); }
  void wait() override;

 private:
  NcclCommunicator& owner_;
  cudaEvent_t event_;
  bool done_ = false;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(const ncclUniqueId& id, std::string name, int rank, int size, int device)
      : name_(std::move(name)), rank_(rank), size_(size), device_(device) {
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_nccl(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
  }
  ~NcclCommunicator() override {
    if (comm_) ncclCommDestroy(comm_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  std::shared_ptr<CommWork> allreduce_async(float* data, size_t count, ReduceOp op) override {
    check_nccl(ncclAllReduce(data, data, count, ncclFloat, op == ReduceOp::kSum ? ncclSum : ncclMax,
                             comm_, stream_),
               "ncclAllReduce");
    count_op(count * sizeof(float), true);
    return record();
  }
  void allgather(const float* in, float* out, size_t count) override {
    check_nccl(ncclAllGather(in, out, count, ncclFloat, comm_, stream_), "ncclAllGather");
    count_op(count * sizeof(float), false);
    record()->wait();
  }
  void reduce_scatter(const float* in, float* out, size_t count) override {
    check_nccl(ncclReduceScatter(in, out, count, ncclFloat, ncclSum, comm_, stream_),
               "ncclReduceScatter");
    count_op(count * size_ * sizeof(float), false);
    record()->wait();
  }
  void broadcast(float* data, size_t count, int root) override {
    check_nccl(ncclBroadcast(data, data, count, ncclFloat, root, comm_, stream_), "ncclBroadcast");
    count_op(count * sizeof(float), false);
    record()->wait();
  }
  void barrier() override {
    // NCCL has no barrier: a one-float all-reduce on a scratch buffer orders the ranks.
    if (!scratch_) check_cuda(cudaMalloc(&scratch_, sizeof(float)), "cudaMalloc");
    allreduce_async(scratch_, 1, ReduceOp::kSum)->wait();
  }
  CommStats stats() const override {
    std::lock_guard lock(mutex_);
    return stats_;
  }
  void add_exposed(double seconds) {
    std::lock_guard lock(mutex_);
    stats_.exposed_seconds += seconds;
    // NCCL runs asynchronously on the GPU: its busy time is not observable from the host
    // without timing events per op; the blocked time is the lower bound we report.
    stats_.seconds += seconds;
  }

 private:
  std::shared_ptr<CommWork> record() {
    cudaEvent_t event;
    check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventRecord(event, stream_), "cudaEventRecord");
    return std::make_shared<NcclWork>(*this, event);
  }
  void count_op(size_t bytes, bool allreduce) {
    std::lock_guard lock(mutex_);
    ++stats_.collectives;
    if (allreduce) ++stats_.allreduces;
    stats_.bytes += static_cast<int64_t>(bytes);
  }

  std::string name_;
  int rank_, size_, device_;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  float* scratch_ = nullptr;
  mutable std::mutex mutex_;
  CommStats stats_;
};

void NcclWork::wait() {
  if (done_) return;
  const auto t0 = std::chrono::steady_clock::now();
  check_cuda(cudaEventSynchronize(event_), "cudaEventSynchronize");
  owner_.add_exposed(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  done_ = true;
}

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(gloo::rendezvous::Store& store,
                                                     const std::string& key,
                                                     const std::string& name, int rank, int size,
                                                     int device) {
  if (size == 1) return make_single_rank_communicator(name);
  ncclUniqueId id;
  if (rank == 0) {
    check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    store.set(key, std::vector<char>(id.internal, id.internal + sizeof(id.internal)));
  } else {
    const std::vector<char> bytes = store.get(key);
    if (bytes.size() != sizeof(id.internal))
      throw Error("rendezvous: NCCL id under " + key + " has " + std::to_string(bytes.size()) +
                  " bytes, expected " + std::to_string(sizeof(id.internal)));
    std::copy(bytes.begin(), bytes.end(), id.internal);
  }
  return std::make_unique<NcclCommunicator>(id, name, rank, size, device);
}

}  // namespace kt::worker

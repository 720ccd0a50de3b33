#include "worker/comm_nccl.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "api/error.h"

namespace kt::worker {
namespace {

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw Error(std::string(what) + " failed: " + cudaGetErrorString(status));
}

// The NCCL entry points we use, from the library loaded at run time.
struct NcclApi {
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  std::string error;  // why loading failed; "" when loaded

  static const NcclApi& get() {
    static const NcclApi api = load();
    return api;
  }

 private:
  static NcclApi load() {
    NcclApi api;
    const char* configured = std::getenv("KUBETRAIN_NCCL_LIBRARY");
    const std::string path = configured && *configured ? configured : "libnccl.so.2";
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* why = dlerror();
      api.error = "cannot load " + path + " (" + (why ? why : "dlopen failed") +
                  "; set KUBETRAIN_NCCL_LIBRARY to libnccl.so.2's path)";
      return api;
    }
    auto bind = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (!fn && api.error.empty()) api.error = path + " has no " + name;
    };
    bind(api.get_unique_id, "ncclGetUniqueId");
    bind(api.comm_init_rank, "ncclCommInitRank");
    bind(api.comm_destroy, "ncclCommDestroy");
    bind(api.error_string, "ncclGetErrorString");
    bind(api.all_reduce, "ncclAllReduce");
    bind(api.all_gather, "ncclAllGather");
    bind(api.reduce_scatter, "ncclReduceScatter");
    bind(api.broadcast, "ncclBroadcast");
    bind(api.group_start, "ncclGroupStart");
    bind(api.group_end, "ncclGroupEnd");
    bind(api.send, "ncclSend");
    bind(api.recv, "ncclRecv");
    return api;  // the library stays loaded for the process's life
  }
};

const NcclApi& nccl() {
  const NcclApi& api = NcclApi::get();
  if (!api.error.empty()) throw Error("NCCL: " + api.error);
  return api;
}

void check_nccl(ncclResult_t status, const char* what) {
  if (status != ncclSuccess)
    throw Error(std::string(what) + " failed: " + nccl().error_string(status) +
                " (a rank died, two ranks share a GPU, or NCCL_DEBUG=INFO says more)");
}

class NcclGroup;

class NcclWork : public CommWork {
 public:
  NcclWork(NcclGroup& owner, cudaEvent_t event) : owner_(owner), event_(event) {}
  ~NcclWork() override { cudaEventDestroy(event_); }
  void wait() override;

 private:
  NcclGroup& owner_;
  cudaEvent_t event_;
  bool done_ = false;
};

class NcclGroup : public Communicator,
                  public GradientReducer,
                  public StreamCollectives,
                  public StreamPointToPoint {
 public:
  NcclGroup(const ncclUniqueId& id, std::string name, int rank, int size, int device)
      : name_(std::move(name)), rank_(rank), size_(size), device_(device) {
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
    check_nccl(nccl().comm_init_rank(&comm_, size_, id, rank_), "ncclCommInitRank");
  }
  ~NcclGroup() override {
    if (comm_) nccl().comm_destroy(comm_);
    if (scratch_) cudaFree(scratch_);
    if (done_) cudaEventDestroy(done_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  const char* backend() const override { return "nccl"; }

  // ---- Communicator
  std::shared_ptr<CommWork> allreduce_async(float* data, size_t count, ReduceOp op) override {
    check_nccl(nccl().all_reduce(data, data, count, ncclFloat,
                                 op == ReduceOp::kSum ? ncclSum : ncclMax, comm_, stream_),
               "ncclAllReduce");
    count_op(count * sizeof(float), true);
    return record();
  }
  void allgather(const float* in, float* out, size_t count) override {
    check_nccl(nccl().all_gather(in, out, count, ncclFloat, comm_, stream_), "ncclAllGather");
    count_op(count * size_ * sizeof(float), false);
    record()->wait();
  }
  void reduce_scatter(const float* in, float* out, size_t count) override {
    check_nccl(nccl().reduce_scatter(in, out, count, ncclFloat, ncclSum, comm_, stream_),
               "ncclReduceScatter");
    count_op(count * size_ * sizeof(float), false);
    record()->wait();
  }
  void broadcast(float* data, size_t count, int root) override {
    check_nccl(nccl().broadcast(data, data, count, ncclFloat, root, comm_, stream_),
               "ncclBroadcast");
    count_op(count * sizeof(float), false);
    record()->wait();
  }
  void barrier() override {
    // NCCL has no barrier: a one-float all-reduce on a scratch buffer orders the ranks.
    if (!scratch_) check_cuda(cudaMalloc(&scratch_, sizeof(float)), "cudaMalloc");
    allreduce_async(scratch_, 1, ReduceOp::kSum)->wait();
  }

  // Issue the gradient sums on `stream` (in its order) instead of the group's own stream.
  void serialize_on(CudaStream* stream) { serialize_on_ = stream; }

  // ---- GradientReducer: one NCCL group call per reduce, after `ready`
  void reduce(const Ranges& ranges, const CudaEvent& ready) override {
    cudaStream_t stream = reduction_stream(ready);
    check_nccl(nccl().group_start(), "ncclGroupStart");
    size_t bytes = 0;
    for (const auto& [data, count] : ranges) {
      const ncclResult_t status =
          nccl().all_reduce(data, data, count, ncclFloat, ncclSum, comm_, stream);
      if (status != ncclSuccess) {
        nccl().group_end();
        check_nccl(status, "ncclAllReduce");
      }
      bytes += count * sizeof(float);
    }
    check_nccl(nccl().group_end(), "ncclGroupEnd");
    std::lock_guard lock(mutex_);
    stats_.collectives += static_cast<int64_t>(ranges.size());
    stats_.allreduces += static_cast<int64_t>(ranges.size());
    stats_.bytes += static_cast<int64_t>(bytes);
  }
  // The distributed optimizer's collectives, on the stream of the sums (in their order).
  void reduce_scatter(const float* bucket, float* shard, size_t count, const CudaEvent& ready,
                      CudaEvent& done) override {
    cudaStream_t stream = reduction_stream(ready);
    check_nccl(nccl().reduce_scatter(bucket, shard, count, ncclFloat, ncclSum, comm_, stream),
               "ncclReduceScatter");
    check_cuda(cudaEventRecord(done.handle(), stream), "cudaEventRecord");
    count_op(count * size_ * sizeof(float), false);
  }
  void all_gather(const void* shard, void* bucket, size_t count, DeviceDtype type,
                  const CudaEvent& ready, CudaEvent& done) override {
    const bool bf16 = type == DeviceDtype::kBfloat16;
    cudaStream_t stream = reduction_stream(ready);
    check_nccl(
        nccl().all_gather(shard, bucket, count, bf16 ? ncclBfloat16 : ncclFloat, comm_, stream),
        "ncclAllGather");
    check_cuda(cudaEventRecord(done.handle(), stream), "cudaEventRecord");
    count_op(count * size_ * (bf16 ? 2 : 4), false);
  }
  void join(CudaStream& stream) override {
    check_cuda(cudaEventRecord(done_, serialize_on_ ? serialize_on_->handle() : stream_),
               "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream.handle(), done_, 0), "cudaStreamWaitEvent");
  }

  // ---- StreamCollectives: on the caller's stream, between two events
  void allreduce_after(void* data, size_t count, DeviceDtype type, ReduceOp op,
                       const CudaEvent& ready, CudaEvent& done, CudaStream& stream) override {
    const bool bf16 = type == DeviceDtype::kBfloat16;
    stream.wait(ready);
    check_nccl(nccl().all_reduce(data, data, count, bf16 ? ncclBfloat16 : ncclFloat,
                                 op == ReduceOp::kSum ? ncclSum : ncclMax, comm_, stream.handle()),
               "ncclAllReduce");
    stream.record(done);
    count_op(count * (bf16 ? 2 : 4), true);
  }

  // ---- StreamPointToPoint: the send and the receive in one group, on the caller's stream
  void exchange_group(const std::vector<PointToPointOp>& ops, size_t count, const CudaEvent& ready,
                      CudaEvent& done, CudaStream& stream) override {
    stream.wait(ready);
    check_nccl(nccl().group_start(), "ncclGroupStart");
    ncclResult_t status = ncclSuccess;
    const char* failed = "ncclSend";
    size_t elements = 0;
    for (const PointToPointOp& op : ops) {
      if (status != ncclSuccess) break;
      failed = op.send ? "ncclSend" : "ncclRecv";
      const size_t n = op.count ? op.count : count;
      elements += n;
      status = op.send ? nccl().send(op.send, n, ncclBfloat16, op.peer, comm_, stream.handle())
                       : nccl().recv(op.recv, n, ncclBfloat16, op.peer, comm_, stream.handle());
    }
    const ncclResult_t ended = nccl().group_end();
    check_nccl(status, failed);
    check_nccl(ended, "ncclGroupEnd");
    stream.record(done);
    count_op(elements * 2, false);
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
  // The stream the gradient reductions run on, once it waits for `ready`.
  cudaStream_t reduction_stream(const CudaEvent& ready) {
    cudaStream_t stream = serialize_on_ ? serialize_on_->handle() : stream_;
    check_cuda(cudaStreamWaitEvent(stream, ready.handle(), 0), "cudaStreamWaitEvent");
    return stream;
  }
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
  cudaEvent_t done_ = nullptr;
  ncclComm_t comm_ = nullptr;
  float* scratch_ = nullptr;
  CudaStream* serialize_on_ = nullptr;
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

// The NCCL id travels as the bytes of 32 floats through `bootstrap`'s broadcast (a copy: no
// arithmetic touches them).
std::unique_ptr<NcclGroup> connect(Communicator& bootstrap, int device) {
  nccl();  // fail before any collective if libnccl is missing (every rank fails alike)
  static_assert(sizeof(ncclUniqueId) % sizeof(float) == 0);
  float words[sizeof(ncclUniqueId) / sizeof(float)] = {};
  ncclUniqueId id;
  if (bootstrap.rank() == 0) {
    check_nccl(nccl().get_unique_id(&id), "ncclGetUniqueId");
    std::memcpy(words, &id, sizeof id);
  }
  bootstrap.broadcast(words, sizeof words / sizeof(float), 0);
  std::memcpy(&id, words, sizeof id);
  return std::make_unique<NcclGroup>(id, bootstrap.name(), bootstrap.rank(), bootstrap.size(),
                                     device);
}

}  // namespace

bool nccl_available(std::string* why) {
  const NcclApi& api = NcclApi::get();
  if (why) *why = api.error;
  return api.error.empty();
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device) {
  return connect(bootstrap, device);
}

std::unique_ptr<GradientReducer> make_nccl_gradient_reducer(Communicator& bootstrap, int device,
                                                            CudaStream* serialize_on) {
  auto group = connect(bootstrap, device);
  group->serialize_on(serialize_on);
  return group;
}

std::unique_ptr<StreamCollectives> make_nccl_stream_collectives(Communicator& bootstrap,
                                                                int device) {
  return connect(bootstrap, device);
}

std::unique_ptr<StreamPointToPoint> make_nccl_point_to_point(Communicator& bootstrap, int device) {
  return connect(bootstrap, device);
}

}  // namespace kt::worker

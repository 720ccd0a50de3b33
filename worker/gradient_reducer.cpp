#include "worker/gradient_reducer.h"

#include <chrono>

#include "api/error.h"
#include "kernels/bf16.h"
#include "worker/host_access.h"

namespace kt::worker {
namespace {

// Both host implementations: copy to pinned memory, sum over the group's Communicator (Gloo),
// copy back, each step synchronised (the staging buffer is reused).
class HostCollectives : public GradientReducer, public StreamCollectives {
 public:
  HostCollectives(Communicator& group, CudaDevice& device) : group_(group), device_(device) {}
  ~HostCollectives() override {
    if (staging_) device_.deallocate_pinned(staging_);
  }
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  const char* backend() const override { return "host"; }
  CommStats stats() const override { return stats_; }

  // GradientReducer: on the data-parallel stream, after `ready`; the sums are in place on return.
  void reduce(const Ranges& ranges, const CudaEvent& ready) override {
    CudaStream& stream = device_.stream(StreamRole::kDataParallelComm);
    stream.wait(ready);
    for (const auto& [data, count] : ranges)
      sum_through_host(data, count, DeviceDtype::kFloat32, ReduceOp::kSum, stream);
  }
  void join(CudaStream&) override {}  // every operation returns with its result in place

  // The distributed optimizer's collectives, staged like the sums: [bucket | shard] in pinned
  // memory.
  void reduce_scatter(const float* bucket, float* shard, size_t count, const CudaEvent& ready,
                      CudaEvent& done) override {
    const auto t0 = std::chrono::steady_clock::now();
    CudaStream& stream = device_.stream(StreamRole::kDataParallelComm);
    stream.wait(ready);
    const size_t n = count * static_cast<size_t>(size());
    auto* staged = static_cast<float*>(staging((n + count) * sizeof(float), stream));
    device_.copy(staged, bucket, n * sizeof(float), stream);
    stream.synchronize();
    host_writes("host collectives", staged, (n + count) * sizeof(float));
    group_.reduce_scatter(staged, staged + n, count);
    device_.copy(shard, staged + n, count * sizeof(float), stream);
    stream.synchronize();
    stream.record(done);
    count_op(n * sizeof(float), t0, false);
  }
  void all_gather(const void* shard, void* bucket, size_t count, DeviceDtype type,
                  const CudaEvent& ready, CudaEvent& done) override {
    const auto t0 = std::chrono::steady_clock::now();
    CudaStream& stream = device_.stream(StreamRole::kDataParallelComm);
    stream.wait(ready);
    const size_t n = count * static_cast<size_t>(size());
    const size_t element = type == DeviceDtype::kBfloat16 ? 2 : 4;
    void* staged = staging(element * n, stream);  // the shard, then the gathered bucket
    device_.copy(staged, shard, element * count, stream);
    stream.synchronize();
    host_writes("host collectives", staged, element * n);
    if (type == DeviceDtype::kFloat32) {
      floats_.assign(static_cast<const float*>(staged), static_cast<const float*>(staged) + count);
      group_.allgather(floats_.data(), static_cast<float*>(staged), count);
    } else {  // bf16 through floats: both conversions are exact
      auto* bits = static_cast<uint16_t*>(staged);
      floats_.resize(count + n);
      for (size_t i = 0; i < count; ++i) floats_[i] = kernels::bf16_to_float(bits[i]);
      group_.allgather(floats_.data(), floats_.data() + count, count);
      for (size_t i = 0; i < n; ++i) bits[i] = kernels::float_to_bf16(floats_[count + i]);
    }
    device_.copy(bucket, staged, element * n, stream);
    stream.synchronize();
    stream.record(done);
    count_op(element * n, t0, false);
  }

  // StreamCollectives: the result is in place when this returns (and `done` says so).
  void allreduce_after(void* data, size_t count, DeviceDtype type, ReduceOp op,
                       const CudaEvent& ready, CudaEvent& done, CudaStream& stream) override {
    stream.wait(ready);
    sum_through_host(data, count, type, op, stream);
    stream.record(done);
  }

 private:
  void sum_through_host(void* data, size_t count, DeviceDtype type, ReduceOp op,
                        CudaStream& stream) {
    const auto t0 = std::chrono::steady_clock::now();
    const size_t bytes = count * (type == DeviceDtype::kBfloat16 ? 2 : 4);
    staging(bytes, stream);
    device_.copy(staging_, data, bytes, stream);
    stream.synchronize();
    host_writes("host collectives", staging_, bytes);  // (read and written in place)
    if (type == DeviceDtype::kFloat32) {
      group_.allreduce(static_cast<float*>(staging_), count, op);
    } else {  // summed in fp32, rounded to bf16 once
      auto* bits = static_cast<uint16_t*>(staging_);
      floats_.resize(count);
      for (size_t i = 0; i < count; ++i) floats_[i] = kernels::bf16_to_float(bits[i]);
      group_.allreduce(floats_.data(), count, op);
      for (size_t i = 0; i < count; ++i) bits[i] = kernels::float_to_bf16(floats_[i]);
    }
    device_.copy(data, staging_, bytes, stream);
    stream.synchronize();
    count_op(bytes, t0, true);
  }

  // The pinned staging buffer, at least `bytes` (it grows to the largest operation in the first
  // step, then stays).
  void* staging(size_t bytes, CudaStream& stream) {
    if (bytes > capacity_) {
      stream.synchronize();
      if (staging_) device_.deallocate_pinned(staging_);
      staging_ = device_.allocate_pinned(bytes, MemoryKind::kWorkspace);
      capacity_ = bytes;
    }
    return staging_;
  }
  void count_op(size_t bytes, std::chrono::steady_clock::time_point t0, bool allreduce) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++stats_.collectives;
    if (allreduce) ++stats_.allreduces;
    stats_.bytes += static_cast<int64_t>(bytes);
    stats_.seconds += seconds;
    stats_.exposed_seconds += seconds;  // the host waits for all of it
  }

  Communicator& group_;
  CudaDevice& device_;
  void* staging_ = nullptr;
  size_t capacity_ = 0;
  std::vector<float> floats_;
  CommStats stats_;
};

// Pipeline transfers through pinned memory and the group's point to point (Gloo): the bf16 as
// pairs in floats (a copy: no arithmetic touches them). Synchronous, as the sums above.
class HostPointToPoint : public StreamPointToPoint {
 public:
  HostPointToPoint(Communicator& group, CudaDevice& device) : group_(group), device_(device) {}
  ~HostPointToPoint() override {
    for (void* p : staging_)
      if (p) device_.deallocate_pinned(p);
  }
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  const char* backend() const override { return "host"; }
  CommStats stats() const override { return stats_; }

  void exchange_group(const std::vector<PointToPointOp>& ops, size_t count, const CudaEvent& ready,
                      CudaEvent& done, CudaStream& stream) override {
    const auto t0 = std::chrono::steady_clock::now();
    size_t bytes = 0, total = 0;  // the largest op's, and all of them
    for (const PointToPointOp& op : ops) {
      const size_t n = op.count ? op.count : count;
      KT_CHECK(n % 2 == 0, "pipeline transfers carry bf16 in pairs (an even count)");
      bytes = std::max(bytes, n * 2);
      total += n * 2;
    }
    auto bytes_of = [&](const PointToPointOp& op) { return (op.count ? op.count : count) * 2; };
    stream.wait(ready);
    if (bytes > capacity_ || staging_.size() < ops.size()) {
      stream.synchronize();
      for (void* p : staging_)
        if (p) device_.deallocate_pinned(p);
      capacity_ = std::max(capacity_, bytes);
      staging_.assign(std::max(staging_.size(), ops.size()), nullptr);
      for (void*& p : staging_) p = device_.allocate_pinned(capacity_, MemoryKind::kWorkspace);
    }
    // Sends staged and posted first (Gloo's sends return at once), then the receives, each
    // posted in the group's order.
    std::vector<std::shared_ptr<CommWork>> works(ops.size());
    for (size_t i = 0; i < ops.size(); ++i) {
      if (!ops[i].send) continue;
      device_.copy(staging_[i], ops[i].send, bytes_of(ops[i]), stream);
    }
    stream.synchronize();
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].send) {
        host_reads("pipeline send", staging_[i], bytes_of(ops[i]));
        works[i] = group_.send_async(static_cast<const float*>(staging_[i]), bytes_of(ops[i]) / 4,
                                     ops[i].peer);
      } else {
        works[i] =
            group_.recv_async(static_cast<float*>(staging_[i]), bytes_of(ops[i]) / 4, ops[i].peer);
      }
    }
    for (size_t i = 0; i < ops.size(); ++i) {
      works[i]->wait();
      if (ops[i].send) continue;
      host_writes("pipeline receive", staging_[i], bytes_of(ops[i]));
      device_.copy(ops[i].recv, staging_[i], bytes_of(ops[i]), stream);
    }
    stream.synchronize();  // the staging is reused by the next exchange
    stream.record(done);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++stats_.collectives;
    stats_.bytes += static_cast<int64_t>(total);
    stats_.seconds += seconds;
    stats_.exposed_seconds += seconds;
  }

 private:
  Communicator& group_;
  CudaDevice& device_;
  std::vector<void*> staging_;  // pinned, one per operation of a group
  size_t capacity_ = 0;
  CommStats stats_;
};

}  // namespace

std::unique_ptr<StreamPointToPoint> make_host_point_to_point(Communicator& group,
                                                             CudaDevice& device) {
  return std::make_unique<HostPointToPoint>(group, device);
}

std::unique_ptr<StreamCollectives> make_host_stream_collectives(Communicator& group,
                                                                CudaDevice& device) {
  return std::make_unique<HostCollectives>(group, device);
}

ReducerChoice choose_reducer(const std::string& mode,
                             const std::vector<std::vector<float>>& gpu_keys,
                             const std::string& no_nccl) {
  if (mode != "auto" && mode != "nccl" && mode != "host")
    throw Error("KUBETRAIN_CUDA_COMM='" + mode + "': expected nccl, host or auto");
  std::string why_not;
  for (size_t a = 0; a < gpu_keys.size() && why_not.empty(); ++a)
    for (size_t b = a + 1; b < gpu_keys.size(); ++b)
      if (gpu_keys[a] == gpu_keys[b]) {
        why_not = "ranks " + std::to_string(a) + " and " + std::to_string(b) + " share a GPU";
        break;
      }
  if (why_not.empty()) why_not = no_nccl;
  if (mode == "nccl" && !why_not.empty())
    throw Error("KUBETRAIN_CUDA_COMM=nccl, but " + why_not +
                " (NCCL needs one GPU per rank; KUBETRAIN_CUDA_COMM=host sums through the host)");
  if (mode == "host") return {"host", "KUBETRAIN_CUDA_COMM=host"};
  if (!why_not.empty()) return {"host", why_not};
  return {"nccl", "one GPU per rank"};
}

std::unique_ptr<GradientReducer> make_host_gradient_reducer(Communicator& group,
                                                            CudaDevice& device) {
  return std::make_unique<HostCollectives>(group, device);
}

}  // namespace kt::worker

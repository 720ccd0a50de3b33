// The CUDA model on several ranks, each a thread of this process with its own CudaDevice and
// model on the test's GPU: data parallelism (worker/gradient_reducer.h), tensor parallelism
// (the stream collectives) and both together, over an in-process host group and, where two ranks
// can use it, NCCL; and the NCCL reducer's plumbing on one rank.
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "tests/gpu/gpu_tests.h"
#include "tests/gpu/test_support.h"
#include "worker/cuda_cutpoint.h"
#include "worker/cuda_pipeline.h"
#include "worker/gradient_reducer.h"
#ifdef KUBETRAIN_WITH_NCCL
#include "worker/comm_nccl.h"
#endif

namespace kt::gpu_test {
namespace {

// A group of ranks that are threads of this process: each collective meets at a barrier, then
// every rank reads the others' buffers (sums in rank order, so every rank gets the same bits).
// Stands in for Gloo, which the GPU-only build does not have; the host reducer sees only the
// Communicator interface.
class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), buffers_(static_cast<size_t>(size)) {}
  int size() const { return size_; }

  class Rank : public worker::Communicator {
   public:
    Rank(ThreadGroup& group, int rank) : group_(group), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return group_.size_; }
    const std::string& name() const override { return name_; }
    std::shared_ptr<worker::CommWork> allreduce_async(float* data, size_t count,
                                                      worker::ReduceOp op) override {
      group_.publish(rank_, data);
      std::vector<float> out(count);
      for (size_t i = 0; i < count; ++i) {
        float acc = group_.buffers_[0][i];
        for (int r = 1; r < group_.size_; ++r) {
          const float x = group_.buffers_[static_cast<size_t>(r)][i];
          acc = op == worker::ReduceOp::kSum ? acc + x : std::max(acc, x);
        }
        out[i] = acc;
      }
      group_.arrive();  // everyone has read every buffer
      std::copy(out.begin(), out.end(), data);
      ++stats_.allreduces;
      stats_.bytes += static_cast<int64_t>(count * 4);
      return std::make_shared<Done>();
    }
    void allgather(const float* in, float* out, size_t count) override {
      group_.publish(rank_, const_cast<float*>(in));
      for (int r = 0; r < group_.size_; ++r)
        std::copy(group_.buffers_[static_cast<size_t>(r)],
                  group_.buffers_[static_cast<size_t>(r)] + count, out + r * count);
      group_.arrive();
    }
    void reduce_scatter(const float* in, float* out, size_t count) override {
      group_.publish(rank_, const_cast<float*>(in));
      std::vector<float> part(count);
      const size_t from = static_cast<size_t>(rank_) * count;
      for (size_t i = 0; i < count; ++i) {  // in rank order, as allreduce_async
        float acc = group_.buffers_[0][from + i];
        for (int r = 1; r < group_.size_; ++r)
          acc += group_.buffers_[static_cast<size_t>(r)][from + i];
        part[i] = acc;
      }
      group_.arrive();
      std::copy(part.begin(), part.end(), out);
    }
    void broadcast(float* data, size_t count, int root) override {
      group_.publish(rank_, data);
      std::vector<float> value(group_.buffers_[static_cast<size_t>(root)],
                               group_.buffers_[static_cast<size_t>(root)] + count);
      group_.arrive();
      std::copy(value.begin(), value.end(), data);
    }
    void barrier() override { group_.arrive(); }
    // Point to point (pipeline stages): a send copies into the pair's mailbox and returns; a
    // receive waits for the pair's next message.
    std::shared_ptr<worker::CommWork> send_async(const float* data, size_t count,
                                                 int peer) override {
      std::lock_guard lock(group_.mutex_);
      group_.mail_[{rank_, peer}].emplace_back(data, data + count);
      group_.changed_.notify_all();
      return std::make_shared<Done>();
    }
    std::shared_ptr<worker::CommWork> recv_async(float* data, size_t count, int peer) override {
      std::unique_lock lock(group_.mutex_);
      auto& box = group_.mail_[{peer, rank_}];
      group_.changed_.wait(lock, [&] { return !box.empty() || group_.aborted_; });
      if (box.empty()) throw Error("ThreadGroup: another rank failed");
      if (box.front().size() != count) throw Error("ThreadGroup: message of another size");
      std::copy(box.front().begin(), box.front().end(), data);
      box.erase(box.begin());
      return std::make_shared<Done>();
    }
    worker::CommStats stats() const override { return stats_; }

   private:
    struct Done : worker::CommWork {
      void wait() override {}
    };
    ThreadGroup& group_;
    int rank_;
    std::string name_ = "dp";
    worker::CommStats stats_;
  };

 private:
  void publish(int rank, float* data) {
    buffers_[static_cast<size_t>(rank)] = data;
    arrive();
  }
  void arrive() {  // a reusable barrier; throws once a rank has failed (no one waits forever)
    std::unique_lock lock(mutex_);
    if (aborted_) throw Error("ThreadGroup: another rank failed");
    const int64_t generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      changed_.notify_all();
    } else {
      changed_.wait(lock, [&] { return generation_ != generation || aborted_; });
      if (aborted_) throw Error("ThreadGroup: another rank failed");
    }
  }

 public:
  void abort() {
    std::lock_guard lock(mutex_);
    aborted_ = true;
    changed_.notify_all();
  }

 private:
  bool aborted_ = false;
  std::map<std::pair<int, int>, std::vector<std::vector<float>>> mail_;  // by (from, to)
  int size_;
  std::vector<float*> buffers_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int arrived_ = 0;
  int64_t generation_ = 0;
};

// Runs `n` ranks of an in-process group on threads, each with its own CudaDevice on the test's
// GPU: rank_run(r, device, comm) trains rank r. The first exception of any rank lands in `error`.
std::vector<DpRun> run_ranks(
    int n, const std::function<DpRun(int, CudaDevice&, worker::Communicator&)>& rank_run,
    std::string* error) {
  ThreadGroup group(n);
  std::vector<DpRun> ranks(static_cast<size_t>(n));
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        CudaDevice device((g_device->ordinal() + r) % CudaDevice::device_count());
        ThreadGroup::Rank comm(group, r);
        ranks[r] = rank_run(r, device, comm);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        group.abort();  // the other ranks' next collective fails instead of waiting forever
      }
    });
  for (auto& thread : threads) thread.join();
  for (const std::string& e : errors)  // the failure itself, not the others' aborts
    if (!e.empty() && (error->empty() || error->find("another rank failed") != std::string::npos))
      *error = e;
  return ranks;
}

// The collectives the multi-rank tests run over: the host (Gloo's role, here an in-process group)
// always; NCCL where two ranks can use it — under emulation (tests/emulation/fake_nccl.cpp), or
// on a machine with 2+ GPUs and libnccl (NCCL refuses two ranks on one GPU).
std::vector<std::string> rank_backends() {
  std::vector<std::string> backends{"host"};
#ifdef KUBETRAIN_WITH_NCCL
  std::string why;
  const bool loads = worker::nccl_available(&why);
#ifdef KT_CUDA_EMULATED
  const bool two_gpus = true;  // the emulated NCCL joins ranks that share the emulated GPU
#else
  const bool two_gpus = CudaDevice::device_count() >= 2;
  if (loads && !two_gpus) why = "needs 2 GPUs, this machine has 1";
#endif
  if (loads && two_gpus) backends.emplace_back("nccl");
  static bool said = false;  // once per run, not once per test
  if (!said && !why.empty())
    std::printf("NOT RUN  the NCCL variants of the 2-rank tests: %s\n", why.c_str());
  said = true;
#endif
  return backends;
}

// `serialize_on`: NCCL's sums on that stream (as the trainer does when TP is on NCCL too).
std::unique_ptr<worker::GradientReducer> make_reducer(
    const std::string& backend, worker::Communicator& comm, CudaDevice& device,
    [[maybe_unused]] worker::CudaStream* serialize_on = nullptr) {
#ifdef KUBETRAIN_WITH_NCCL
  if (backend == "nccl")
    return worker::make_nccl_gradient_reducer(comm, device.ordinal(), serialize_on);
#endif
  return worker::make_host_gradient_reducer(comm, device);
}

std::unique_ptr<worker::StreamCollectives> make_stream_collectives(const std::string& backend,
                                                                   worker::Communicator& comm,
                                                                   CudaDevice& device) {
#ifdef KUBETRAIN_WITH_NCCL
  if (backend == "nccl") return worker::make_nccl_stream_collectives(comm, device.ordinal());
#endif
  return worker::make_host_stream_collectives(comm, device);
}

// Two data-parallel ranks on one GPU (threads, each with its own CudaDevice and model), summing
// through the host reducer, each on half of every batch with loss scale 1/2, against one rank on
// the whole batch: step-1 gradients within 2e-2 (bf16 activations: cuBLASLt may pick other
// kernels for the other shape, so roundings differ as between two bf16 runs; a missing sum is off
// by 1/2, a missing 1/dp by 2×), the 3 losses within 5e-3 — and the two replicas bit-identical (a
// replica that drifted would train a different model). With gpuUnits 1 too (the offloaded units'
// copies must take the sums).
void test_cuda_gpt_data_parallel() {
  const GptConfig c = kSmallGpt;
  const int64_t B = 2, T = 32, steps = 3, dp = 2;
  std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> batches;
  for (int64_t s = 0; s < steps; ++s) batches.push_back(random_batch(dp * B * T, c.vocab));
  const DpRun whole = train_steps(*g_device, c, dp * B, T, CudaGptOptions{}, 1.0f, steps,
                                  [&](int64_t s) { return batches[s]; });
  CudaGptOptions recompute_options;
  recompute_options.recompute = api::Recompute::kFull;
  const DpRun whole_recompute = train_steps(*g_device, c, dp * B, T, recompute_options, 1.0f,
                                            steps, [&](int64_t s) { return batches[s]; });
  // Everything on the device; offload: optimizer at gpuUnits 1; window offload (gpuUnits 1, one
  // slot, recompute full: the sums taken in the slot).
  for (const std::string& backend : rank_backends()) {
    for (int64_t device_units : {int64_t{-1}, int64_t{1}, int64_t{0}}) {
      const bool window = device_units == 0;
      const std::string tag = " [" + backend + "]" +
                              (device_units < 0 ? ""
                               : window         ? " (window 1)"
                                                : " (gpuUnits 1)");
      const DpRun& one = window ? whole_recompute : whole;
      std::string error;
      const auto ranks = run_ranks(
          static_cast<int>(dp),
          [&](int r, CudaDevice& device, worker::Communicator& comm) {
            auto reducer = make_reducer(backend, comm, device);
            CudaGptOptions options;
            options.reducer = reducer.get();
            options.device_units = window ? 1 : device_units;
            options.window = window ? 1 : 0;
            if (window) options.recompute = api::Recompute::kFull;
            options.cpu_threads = 1;
            return train_steps(device, c, B, T, options, 1.0f / dp, steps, [&](int64_t s) {
              const auto& [tok, tgt] = batches[s];
              const int64_t n = B * T;
              return std::make_pair(
                  std::vector<int32_t>(tok.begin() + r * n, tok.begin() + (r + 1) * n),
                  std::vector<int32_t>(tgt.begin() + r * n, tgt.begin() + (r + 1) * n));
            });
          },
          &error);
      if (!error.empty()) {
        check(false, "data parallel" + tag + ": " + error);
        continue;
      }
      expect_close(ranks[0].grads1, widen(one.grads1), 2e-2,
                   "data parallel 2 ranks: step-1 summed gradients vs one rank" + tag);
      double worst = 0;
      for (int64_t s = 0; s < steps; ++s) {
        const double mean = (ranks[0].losses[s] + ranks[1].losses[s]) / 2;
        worst = std::max(worst, std::abs(mean - one.losses[s]) / one.losses[s]);
      }
      const bool identical =
          ranks[0].weights == ranks[1].weights && ranks[0].grads1 == ranks[1].grads1;
      check(worst < 5e-3, "data parallel" + tag + ": mean loss differs from one rank's by " +
                              std::to_string(worst));
      check(identical, "data parallel" + tag + ": the two replicas' gradients or weights differ");
      if (worst < 5e-3 && identical)
        std::printf("ok    %-44s losses worst rel diff %.1e (tol 5e-03), replicas bit-identical\n",
                    ("data parallel, 2 ranks" + tag).c_str(), worst);
    }
  }
}

// Two TP ranks' runs against `whole`, TP 1 on the same batches: their step-1 gradients, put
// together in the whole model's layout, within 3e-2 of it; the replicated tensors' gradients and
// final weights bit-identical on both ranks. True when both identities hold.
bool check_tp_ranks(const GptConfig& c, const DpRun& rank0, const DpRun& rank1, const DpRun& whole,
                    const std::string& tag) {
  const int tp = 2;
  F assembled(whole.grads1.size(), std::nanf(""));
  F grads[2] = {rank0.grads1, rank1.grads1};  // (views are over mutable data)
  bool replicated_same = true;
  for (int r = 0; r < tp; ++r) {
    const auto views = worker::gpt_rank_views(c, tp, r, grads[r].data());
    const auto other = worker::gpt_rank_views(c, tp, 1 - r, grads[1 - r].data());
    const auto whole_views = worker::gpt_whole_views(c, assembled.data());
    for (int i = 0; i < worker::kNumParamTensors; ++i) {
      if (views[i].logical_shape.empty()) {
        std::copy(views[i].data, views[i].data + views[i].numel(), whole_views[i].data);
        replicated_same = replicated_same && std::equal(views[i].data,
                                                        views[i].data + views[i].numel(),
                                                        other[i].data);
      } else {
        worker::gpt_paste_slice(views[i], whole_views[i].data);
      }
    }
  }
  expect_close(assembled, widen(whole.grads1), 3e-2, tag + ": step-1 gradients vs TP 1");
  check(replicated_same, tag + ": replicated tensors' gradients differ between the ranks");
  F weights[2] = {rank0.weights, rank1.weights};
  bool weights_same = true;
  const auto w0 = worker::gpt_rank_views(c, tp, 0, weights[0].data());
  const auto w1 = worker::gpt_rank_views(c, tp, 1, weights[1].data());
  for (int i = 0; i < worker::kNumParamTensors; ++i)
    if (w0[i].logical_shape.empty())
      weights_same =
          weights_same && std::equal(w0[i].data, w0[i].data + w0[i].numel(), w1[i].data);
  check(weights_same, tag + ": replicated weights differ between the ranks after 3 steps");
  return replicated_same && weights_same;
}

// Tensor parallelism on one GPU: 2 TP ranks (threads, each its own CudaDevice and model, the
// all-reduces through the host collectives over an in-process group) against TP 1 on the same
// batches: losses within 5e-3 and step-1 gradients (the ranks' slices put together) within 3e-2
// (partial products are rounded to bf16 before their sum, so activations round differently than
// at TP 1); the replicated tensors' gradients and final weights bit-identical on both ranks (they
// are computed from the same summed activations). Also with recompute full and offload gpuUnits 1,
// and with the Oases schedule (2 sub-batches: each lane's all-reduces behind events on the TP
// stream while the other lane computes), alone and with commAware recompute.
void test_cuda_gpt_tensor_parallel() {
  const GptConfig c = kSmallGpt;  // NH 2: one head per rank; Vp 96: 48 rows each, V 91
  const int64_t B = 2, T = 32, steps = 3, tp = 2;
  std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> batches;
  for (int64_t s = 0; s < steps; ++s) batches.push_back(random_batch(B * T, c.vocab));
  auto batch_of = [&](int64_t s) { return batches[s]; };
  const DpRun whole = train_steps(*g_device, c, B, T, CudaGptOptions{}, 1.0f, steps, batch_of);
  struct Variant {
    const char* tag;
    int64_t device_units;
    api::Recompute recompute;
    int sub_batches;
    int64_t window = 0;
  };
  for (const std::string& backend : rank_backends()) {
    for (const Variant v :
         {Variant{"", -1, api::Recompute::kNone, 1},
          Variant{" (recompute full, gpuUnits 1)", 1, api::Recompute::kFull, 1},
          Variant{" (Oases: 2 sub-batches)", -1, api::Recompute::kNone, 2},
          Variant{" (2 sub-batches, commAware)", -1, api::Recompute::kCommAware, 2},
          Variant{" (2 sub-batches, full, window 1)", 1, api::Recompute::kFull, 2,
                  1}}) {
      const std::string tag = "tensor parallel, 2 ranks [" + backend + "]" + v.tag;
      std::string error;
      auto ranks = run_ranks(
          static_cast<int>(tp),
          [&](int, CudaDevice& device, worker::Communicator& comm) {
            auto collectives = make_stream_collectives(backend, comm, device);
            CudaGptOptions options;
            options.tp = collectives.get();
            options.device_units = v.device_units;
            options.recompute = v.recompute;
            options.sub_batches = v.sub_batches;
            options.window = v.window;
            options.cpu_threads = 1;
            return train_steps(device, c, B, T, options, 1.0f, steps, batch_of, &comm);
          },
          &error);
      if (!error.empty()) {
        check(false, tag + ": " + error);
        continue;
      }
      double worst = 0;
      for (int64_t s = 0; s < steps; ++s)
        worst = std::max(worst, std::abs(ranks[0].losses[s] - whole.losses[s]) / whole.losses[s]);
      check(worst < 5e-3, tag + ": losses differ from TP 1 by " + std::to_string(worst));
      check(ranks[0].losses == ranks[1].losses, tag + ": the ranks' losses differ");
      const bool same = check_tp_ranks(c, ranks[0], ranks[1], whole, tag);
      if (worst < 5e-3 && same)
        std::printf("ok    %-44s losses worst rel diff %.1e (tol 5e-03)\n", tag.c_str(), worst);
    }
  }
}

// Data and tensor parallelism together, as the trainer runs a DP 2 × TP 2 plan: 4 ranks, TP groups
// {0,1} {2,3} and DP groups {0,2} {1,3}, each DP replica on half of the batch, against DP 1 × TP 1
// on the whole batch. With NCCL, the gradient sums go on the TP communication stream as the
// trainer issues them (serialize_on), behind the TP all-reduces in issue order. Mean losses within
// 5e-3; each TP pair as in the TP test; the two DP replicas of each TP rank bit-identical.
using Batches = std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>>;

// DP × TP ranks (TP fastest: rank r is TP rank r % tp of DP rank r / tp), each training `steps`
// on its DP rank's part of every batch with `base`'s options, over in-process groups and the
// backend's collectives (the DP sums on the TP stream where TP is on, as the trainer orders them).
std::vector<DpRun> run_dp_tp(const std::string& backend, int dp, int tp, const GptConfig& c,
                             int64_t B, int64_t T, const CudaGptOptions& base,
                             const Batches& batches, std::string* error) {
  std::vector<std::unique_ptr<ThreadGroup>> tp_groups, dp_groups;
  for (int g = 0; g < dp; ++g) tp_groups.push_back(std::make_unique<ThreadGroup>(tp));
  for (int g = 0; g < tp; ++g) dp_groups.push_back(std::make_unique<ThreadGroup>(dp));
  return run_ranks(
      dp * tp,
      [&](int r, CudaDevice& device, worker::Communicator&) {
        const int tp_rank = r % tp, dp_rank = r / tp;
        try {
          ThreadGroup::Rank tp_comm(*tp_groups[dp_rank], tp_rank);
          ThreadGroup::Rank dp_comm(*dp_groups[tp_rank], dp_rank);
          auto collectives = tp > 1 ? make_stream_collectives(backend, tp_comm, device) : nullptr;
          auto reducer = make_reducer(
              backend, dp_comm, device,
              tp > 1 ? &device.stream(worker::StreamRole::kTensorParallelComm) : nullptr);
          CudaGptOptions options = base;
          options.tp = collectives.get();
          options.reducer = reducer.get();
          options.cpu_threads = 1;
          return train_steps(
              device, c, B, T, options, 1.0f / static_cast<float>(dp),
              static_cast<int64_t>(batches.size()),
              [&](int64_t s) {
                const auto& [tok, tgt] = batches[s];
                const int64_t n = B * T;
                return std::make_pair(std::vector<int32_t>(tok.begin() + dp_rank * n,
                                                           tok.begin() + (dp_rank + 1) * n),
                                      std::vector<int32_t>(tgt.begin() + dp_rank * n,
                                                           tgt.begin() + (dp_rank + 1) * n));
              },
              tp > 1 ? &tp_comm : nullptr, &dp_comm);
        } catch (...) {  // the subgroups' other members must not wait forever either
          for (auto& g : tp_groups) g->abort();
          for (auto& g : dp_groups) g->abort();
          throw;
        }
      },
      error);
}

void test_cuda_gpt_data_and_tensor_parallel() {
  const GptConfig c = kSmallGpt;
  const int64_t B = 2, T = 32, steps = 3, dp = 2, tp = 2;
  Batches batches;
  for (int64_t s = 0; s < steps; ++s) batches.push_back(random_batch(dp * B * T, c.vocab));
  const DpRun whole = train_steps(*g_device, c, dp * B, T, CudaGptOptions{}, 1.0f, steps,
                                  [&](int64_t s) { return batches[s]; });
  for (const std::string& backend : rank_backends()) {
    for (const int sub_batches : {1, 2}) {
      const std::string tag = "DP 2 x TP 2 [" + backend + "]" +
                              (sub_batches == 2 ? " (Oases: 2 sub-batches, gpuUnits 1)" : "");
      CudaGptOptions options;
      options.sub_batches = sub_batches;
      options.device_units = sub_batches == 2 ? 1 : -1;
      std::string error;
      const auto ranks = run_dp_tp(backend, dp, tp, c, B, T, options, batches, &error);
      if (!error.empty()) {
        check(false, tag + ": " + error);
        continue;
      }
      double worst = 0;
      for (int64_t s = 0; s < steps; ++s) {
        const double mean = (ranks[0].losses[s] + ranks[2].losses[s]) / 2;
        worst = std::max(worst, std::abs(mean - whole.losses[s]) / whole.losses[s]);
      }
      check(worst < 5e-3, tag + ": mean loss differs from DP 1 x TP 1 by " + std::to_string(worst));
      const bool same = check_tp_ranks(c, ranks[0], ranks[1], whole, tag);
      const bool replicas = ranks[0].weights == ranks[2].weights &&
                            ranks[1].weights == ranks[3].weights &&
                            ranks[0].grads1 == ranks[2].grads1 && ranks[1].grads1 == ranks[3].grads1;
      check(replicas, tag + ": the DP replicas' gradients or weights differ");
      if (worst < 5e-3 && same && replicas)
        std::printf("ok    %-44s losses worst rel diff %.1e (tol 5e-03), replicas bit-identical\n",
                    tag.c_str(), worst);
    }
  }
}

// The distributed optimizer (ZeRO-1, worker/cuda_offload.h) against the plain data-parallel
// optimizer on the same ranks and batches: DP 2 and DP 2 × TP 2 (the shards cut across
// TP-sharded and replicated tensors, whose squares the norm keeps apart), 3 steps each. The
// reduce-scatter sums what the all-reduce sums, in the same order; only the norm's squares are
// summed in another order, so the clipping scale may differ in its last bit, which can flip a
// bf16 rounding of a weight and drift the next steps (seen: weights 1.1e-4 for one seed, usually
// 0–4e-9). So losses within 1e-4 and final weights within 1e-3 of the plain optimizer's; the DP
// replicas' weights (each all-gathered from both ranks' shards) bit-identical. A rank that
// skipped the unpack of the all-gather fails both (losses 4e-3, weights 2.5e-2); a shard cut at
// the wrong place would update the wrong parameters. With offload optimizer too (DP 2 with the
// layers' shards on the CPU, DP 2 × TP 2 with every shard there: each rank's CPU updates its
// shard, whose bf16 values the next forward all-gathers), against the unsharded engine with the
// same offload. With the offload window too (DP 2 with every layer streamed through one slot, DP 2
// × TP 2 with the first layer resident): each rank keeps a streamed layer's whole bf16 copy and
// gradient accumulator in host memory, reduce-scatters the slot's sums in the last micro-batch,
// updates its shard on the CPU and all-gathers the new shards into the host copies the slots load.
void test_cuda_gpt_distributed_optimizer() {
  const GptConfig c = kSmallGpt;
  const int64_t B = 2, T = 32, steps = 3, dp = 2;
  Batches batches;
  for (int64_t s = 0; s < steps; ++s) batches.push_back(random_batch(dp * B * T, c.vocab));
  for (const std::string& backend : rank_backends()) {
    struct Case {
      int tp;
      int64_t device_units, window;
    };
    for (const auto& [tp, device_units, window] : {Case{1, -1, 0}, Case{2, -1, 0}, Case{1, 1, 0},
                                                   Case{2, 0, 0}, Case{1, 1, 1}, Case{2, 2, 1}}) {
      const std::string tag =
          "distributed optimizer, DP 2" + std::string(tp > 1 ? " x TP 2" : "") +
          (device_units >= 0 ? " (offload: " + std::to_string(device_units) + " units on the GPU)"
                             : std::string()) +
          (window > 0 ? " (window " + std::to_string(window) + ")" : "") + " [" + backend + "]";
      CudaGptOptions plain;
      plain.device_units = device_units;  // the unsharded engine's offload alike
      plain.window = window;
      if (window > 0) plain.recompute = api::Recompute::kFull;
      CudaGptOptions sharded = plain;
      sharded.distributed_optimizer = true;
      std::string error;
      const auto want =
          run_dp_tp(backend, static_cast<int>(dp), tp, c, B, T, plain, batches, &error);
      const auto got = error.empty() ? run_dp_tp(backend, static_cast<int>(dp), tp, c, B, T,
                                                 sharded, batches, &error)
                                     : want;
      if (!error.empty()) {
        check(false, tag + ": " + error);
        continue;
      }
      double worst_loss = 0, worst_weights = 0;
      bool replicas = true;
      // With offload, each rank moves its shard only: 1/DP of the unsharded engine's bytes each
      // way (the shards are padded to a multiple of DP). The gradients go home in every step;
      // the new weights come back in the unsharded engine's update, but with the shards in the
      // unit's next forward (its all-gather), so the last step's are not counted: 1/2 · 2/3.
      const double want_d2h = 0.5, want_h2d = 0.5 * static_cast<double>(steps - 1) / steps;
      double worst_traffic = 0;
      for (size_t r = 0; r < got.size(); ++r) {
        for (int64_t s = 0; s < steps; ++s)
          worst_loss = std::max(worst_loss,
                                std::abs(got[r].losses[s] - want[r].losses[s]) / want[r].losses[s]);
        worst_weights = std::max(worst_weights, rel_error(got[r].weights, widen(want[r].weights)));
        replicas &= got[r].weights == got[(r + static_cast<size_t>(tp)) % got.size()].weights;
        if (device_units < 0 || window > 0) continue;  // (a window moves whole layers each way)
        worst_traffic =
            std::max({worst_traffic,
                      std::abs(static_cast<double>(got[r].d2h) / static_cast<double>(want[r].d2h) -
                               want_d2h),
                      std::abs(static_cast<double>(got[r].h2d) / static_cast<double>(want[r].h2d) -
                               want_h2d)});
      }
      if (device_units >= 0 && window == 0) {
        check(worst_traffic < 0.02, tag + ": the ranks' offload bytes are " +
                                        std::to_string(worst_traffic) +
                                        " from 1/2 (d2h) and 1/3 (h2d) of the unsharded engine's");
        if (worst_traffic < 0.02)
          std::printf(
              "ok    %-44s each rank moves 1/2 of the unsharded engine's gradient bytes "
              "and 1/3 of its weight bytes (within %.3f)\n",
              tag.c_str(), worst_traffic);
      }
      check(worst_loss < 1e-4,
            tag + ": losses differ from the plain optimizer's by " + std::to_string(worst_loss));
      check(worst_weights < 1e-3, tag + ": final weights differ from the plain optimizer's by " +
                                      std::to_string(worst_weights));
      check(replicas, tag + ": the DP replicas' weights differ");
      if (worst_loss < 1e-4 && worst_weights < 1e-3 && replicas)
        std::printf(
            "ok    %-44s losses %.1e (tol 1e-04), weights %.1e (tol 1e-03) from the plain "
            "optimizer, replicas bit-identical\n",
            tag.c_str(), worst_loss, worst_weights);
    }
  }
}

// A pipeline case: PP × DP × TP ranks (Megatron's order: TP fastest, then DP, then stages), the
// step's micro-batches `micro[step][dp·m]` (each B·T tokens and targets; DP rank r takes
// r·m .. r·m + m − 1), `sharded`: the distributed optimizer, `v`: virtual stages (chunks per
// stage). Each rank returns its losses (the last stage's) and its final weights (its chunks'
// layouts, one after the other).
std::vector<DpRun> run_pipeline(const std::string& backend, int pp, int dp, int tp, bool sharded,
                                int64_t device_units, const GptConfig& c, int64_t B, int64_t T,
                                int64_t m, const std::vector<Batches>& micro, std::string* error,
                                int v = 1, int64_t window = 0) {
  const int world = pp * dp * tp;
  std::vector<std::unique_ptr<ThreadGroup>> tp_groups, dp_groups, pp_groups, embedding_groups;
  for (int g = 0; g < pp * dp; ++g) tp_groups.push_back(std::make_unique<ThreadGroup>(tp));
  for (int g = 0; g < pp * tp; ++g) dp_groups.push_back(std::make_unique<ThreadGroup>(dp));
  for (int g = 0; g < dp * tp; ++g) {
    pp_groups.push_back(std::make_unique<ThreadGroup>(pp));
    embedding_groups.push_back(std::make_unique<ThreadGroup>(2));
  }
  auto abort_all = [&] {
    for (auto* groups : {&tp_groups, &dp_groups, &pp_groups, &embedding_groups})
      for (auto& g : *groups) g->abort();
  };
  return run_ranks(
      world,
      [&](int r, CudaDevice& device, worker::Communicator&) {
        const int w = r % (dp * tp), stage = r / (dp * tp);
        const int tp_rank = w % tp, dp_rank = w / tp;
        try {
          ThreadGroup::Rank tp_comm(*tp_groups[stage * dp + dp_rank], tp_rank);
          ThreadGroup::Rank dp_comm(*dp_groups[stage * tp + tp_rank], dp_rank);
          ThreadGroup::Rank pp_comm(*pp_groups[w], stage);
          const bool ends = stage == 0 || stage == pp - 1;
          std::optional<ThreadGroup::Rank> embedding_comm;
          if (ends) embedding_comm.emplace(*embedding_groups[w], stage == 0 ? 0 : 1);
          worker::CudaStream& serial = device.stream(worker::StreamRole::kTensorParallelComm);
          auto collectives = tp > 1 ? make_stream_collectives(backend, tp_comm, device) : nullptr;
          auto reducer = dp > 1 ? make_reducer(backend, dp_comm, device, &serial) : nullptr;
          auto embedding = ends ? make_reducer(backend, *embedding_comm, device, &serial) : nullptr;
          std::unique_ptr<worker::StreamPointToPoint> p2p;
#ifdef KUBETRAIN_WITH_NCCL
          if (backend == "nccl") p2p = worker::make_nccl_point_to_point(pp_comm, device.ordinal());
#endif
          if (!p2p) p2p = worker::make_host_point_to_point(pp_comm, device);
          GptConfig local = c;
          local.layers = c.layers / (pp * v);
          const worker::PipelineOrder order = worker::pipeline_order(pp, stage, v, m);
          std::vector<std::unique_ptr<CudaGpt>> chunks;
          std::vector<CudaGpt*> chunk_list;
          for (int k = 0; k < v; ++k) {
            const int64_t place = worker::virtual_stage(pp, stage, k);
            CudaGptOptions options;
            options.tp = collectives.get();
            options.reducer = reducer.get();
            options.distributed_optimizer = sharded;
            // A stage's units are its copy of the embeddings', then its chunks' layers chunk
            // after chunk, the first device_units on the GPU (api::chunk_device_units).
            options.device_units =
                device_units <= 0
                    ? device_units
                    : 1 + std::clamp<int64_t>(device_units - 1 - k * local.layers, 0, local.layers);
            options.stage.first_layer = place * local.layers;
            options.stage.model_layers = c.layers;
            options.stage.first = place == 0;
            options.stage.last = place == int64_t{pp} * v - 1;
            options.stage.in_flight = order.in_flight[static_cast<size_t>(k)];
            // Window offload streams the layers past device_units (it needs recompute).
            options.window = window;
            if (window > 0) options.recompute = api::Recompute::kFull;
            options.embedding =
                options.stage.first || options.stage.last ? embedding.get() : nullptr;
            chunks.push_back(std::make_unique<CudaGpt>(device, local, B, T, options));
            chunks.back()->init_weights(g_seed);
            chunk_list.push_back(chunks.back().get());
          }
          CudaGpt& gpt = *chunks.back();  // the loss's (on the last stage)
          worker::CudaPipeline pipeline(chunk_list, device, *p2p, serial);
          DpRun run;
          for (size_t s = 0; s < micro.size(); ++s) {
            for (CudaGpt* chunk : chunk_list) chunk->zero_grad();
            int64_t next = dp_rank * m;
            pipeline.step(m, 1.0f / static_cast<float>(m * dp),
                          [&](std::vector<int32_t>& tok, std::vector<int32_t>& tgt) {
                            tok = micro[s][static_cast<size_t>(next)].first;
                            tgt = micro[s][static_cast<size_t>(next)].second;
                            ++next;
                          });
            run.losses.push_back(gpt.mean_loss());
            // The norm as the trainer takes it (worker/trainer.cpp, global_norm).
            double sums[2] = {0, 0};
            for (CudaGpt* chunk : chunk_list) {
              double more[2];
              chunk->grad_sums_of_squares(&more[0], &more[1]);
              sums[0] += more[0];
              sums[1] += more[1];
            }
            if (gpt.distributed_optimizer()) worker::allreduce_doubles(dp_comm, sums, 2);
            float sharded32 = static_cast<float>(sums[0]);
            if (tp > 1) tp_comm.allreduce(&sharded32, 1);
            double total = static_cast<double>(sharded32) + sums[1];
            worker::allreduce_doubles(pp_comm, &total, 1);
            const double norm = std::sqrt(total);
            for (CudaGpt* chunk : chunk_list)
              chunk->update(clipped_adam_step(static_cast<int64_t>(s), norm), 0.1f);
          }
          for (CudaGpt* chunk : chunk_list) {
            F weights(static_cast<size_t>(chunk->num_parameters()));
            chunk->get_parameters(weights.data());
            run.weights.insert(run.weights.end(), weights.begin(), weights.end());
          }
          return run;
        } catch (...) {  // the other groups' members must not wait forever either
          abort_all();
          throw;
        }
      },
      error);
}

// A rank's weights `mine` (its layout: TP rank r of t, layers [first, first + layers) of c) split
// into its per-layer tensors' and its unit 0's, beside the same slices of `whole` (c's llm.c
// layout), through the checkpoints' views.
struct RankSlices {
  F got_layers, got_unit0, want_layers, want_unit0;
};
RankSlices rank_slices(const GptConfig& c, int64_t t, int64_t r, int64_t first, int64_t layers,
                       const F& mine, const F& whole) {
  GptConfig local = c;
  local.layers = layers;
  const auto views = worker::gpt_rank_views(c, t, r, nullptr, first, layers);
  const auto sizes = worker::gpt_param_sizes(local, t);
  const auto whole_sizes = worker::gpt_param_sizes(c, 1);
  RankSlices out;
  int64_t at = 0, whole_at = 0;
  for (int i = 0; i < worker::kNumParamTensors; ++i) {
    const bool per_layer = worker::kParams[static_cast<size_t>(i)].per_layer;
    std::vector<float> slice(static_cast<size_t>(sizes[i]));
    worker::TensorView view = views[static_cast<size_t>(i)];
    view.data = slice.data();
    worker::gpt_copy_slice(whole.data() + whole_at, view);
    F& got = per_layer ? out.got_layers : out.got_unit0;
    F& want = per_layer ? out.want_layers : out.want_unit0;
    got.insert(got.end(), mine.begin() + at, mine.begin() + at + sizes[i]);
    want.insert(want.end(), slice.begin(), slice.end());
    at += sizes[i];
    whole_at += whole_sizes[i];
  }
  return out;
}

// One rank accumulating the `micro` batches of each step in order (each B·T, the loss scaled by
// 1/their count): the pipeline and cutpoint tests' reference. Losses and final weights.
DpRun one_rank_steps(const GptConfig& c, int64_t B, int64_t T, const std::vector<Batches>& micro) {
  DpRun one;
  CudaGpt gpt(*g_device, c, B, T, CudaGptOptions{});
  gpt.init_weights(g_seed);
  for (size_t s = 0; s < micro.size(); ++s) {
    gpt.zero_grad();
    const auto& batches = micro[s];
    for (size_t i = 0; i < batches.size(); ++i)
      gpt.train_micro_step(batches[i].first.data(), batches[i].second.data(),
                           1.0f / static_cast<float>(batches.size()), i + 1 == batches.size());
    one.losses.push_back(gpt.mean_loss());
    const double norm = std::sqrt(gpt.grad_sum_of_squares());
    gpt.update(clipped_adam_step(static_cast<int64_t>(s), norm), 0.1f);
  }
  one.weights.resize(gpt.num_parameters());
  gpt.get_parameters(one.weights.data());
  return one;
}

// Pipeline stages on CUDA ranks (worker/cuda_pipeline.h, 1F1B with Megatron's paired
// transfers) against one rank accumulating the same micro-batches in the same order: PP 2 and
// PP 4 (the stages between keep up to 3 micro-batches in flight), PP 2 × DP 2 with the
// distributed optimizer, PP 2 × TP 2 — 3 steps of 4 micro-batches each. Every stage's losses (the
// last's) and final weights (its layers, and the embeddings' unit on the first and the last
// stage, which sum its gradients) match the one rank's within 5e-3: the same bf16 math, its fp32
// sums in another order (the embeddings' two halves, the DP sums, TP's partial sums), which can
// flip a bf16 rounding of a weight and so drift by ~1e-3 over the steps (seen: PP 4 6e-4, TP 2
// 3.3e-3; PP 2 alone usually 1e-8). Skipping the embeddings' sum between the stages fails it. The
// stages between leave their copy of the embeddings at its initial values.
void test_cuda_gpt_pipeline() {
  const GptConfig c{32, 91, 96, 4, 2, 64, 256};  // kSmallGpt with 4 layers
  const int64_t B = 2, T = 32, m = 4, steps = 3;
  struct Case {
    int pp, dp, tp;
    bool sharded;
    int64_t device_units;  // offload optimizer: a stage's first units on the GPU (-1: all)
    int v = 1;             // virtual stages
    int64_t window = 0;    // offload window: slots for the layers past device_units
  };
  const std::vector<Case> cases{
      {2, 1, 1, false, -1},      {4, 1, 1, false, -1},      {2, 2, 1, true, -1},
      {2, 1, 2, false, -1},      {2, 1, 1, false, 0},       {2, 2, 1, false, 1},
      {4, 1, 1, false, 0},       {2, 2, 1, true, 0},        {2, 1, 1, false, -1, 2},
      {2, 2, 1, true, -1, 2},    {2, 1, 2, false, -1, 2},   {2, 1, 1, false, 0, 2},
      {2, 2, 1, true, 2, 2},     {2, 1, 1, false, 1, 1, 1}, {2, 2, 1, false, 1, 1, 1},
      {2, 1, 2, false, 1, 1, 1}, {2, 1, 1, false, 1, 2, 1}, {2, 2, 1, true, 1, 1, 1}};
  for (const Case& k : cases) {
    std::vector<Batches> micro(static_cast<size_t>(steps));
    for (auto& step : micro)
      for (int64_t i = 0; i < k.dp * m; ++i) step.push_back(random_batch(B * T, c.vocab));
    // One rank, the dp·m micro-batches accumulated in order.
    const DpRun one = one_rank_steps(c, B, T, micro);
    F initial(one.weights.size());
    worker::gpt_init_rank(c, 1, 0, g_seed, initial.data());
    const double loss_tol = 5e-3, weight_tol = 5e-3;
    for (const std::string& backend : rank_backends()) {
      const std::string tag =
          "pipeline PP " + std::to_string(k.pp) +
          (k.dp > 1 ? " x DP " + std::to_string(k.dp) : "") +
          (k.tp > 1 ? " x TP " + std::to_string(k.tp) : "") +
          (k.v > 1 ? " x " + std::to_string(k.v) + " virtual" : "") +
          (k.sharded ? " (distributed optimizer)" : "") +
          (k.device_units >= 0
               ? " (offload: " + std::to_string(k.device_units) + " units on the GPU)"
               : "") +
          (k.window > 0 ? " (window " + std::to_string(k.window) + ")" : "") +
          " [" + backend + "]";
      std::string error;
      const auto ranks = run_pipeline(backend, k.pp, k.dp, k.tp, k.sharded, k.device_units, c, B, T,
                                      m, micro, &error, k.v, k.window);
      if (!error.empty()) {
        check(false, tag + ": " + error);
        continue;
      }
      double worst_loss = 0, worst_weights = 0;
      bool untouched = true;
      const int per_stage = k.dp * k.tp;
      for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
        const int stage = r / per_stage, tp_rank = r % k.tp;
        if (stage == k.pp - 1)
          for (int64_t s = 0; s < steps; ++s) {
            // The DP mean: DP rank 0's and the others' losses averaged.
            double mean = 0;
            for (int d = 0; d < k.dp; ++d)
              mean += ranks[static_cast<size_t>(stage * per_stage + d * k.tp + tp_rank)].losses[s];
            mean /= k.dp;
            worst_loss = std::max(worst_loss, std::abs(mean - one.losses[s]) / one.losses[s]);
          }
        // Each chunk's slice (its TP rows, its virtual stage's layers) of the one rank's weights
        // and of the initial ones, in the rank's layout.
        const int64_t layers = c.layers / (k.pp * k.v);
        const F& all = ranks[static_cast<size_t>(r)].weights;
        const size_t per_chunk = all.size() / static_cast<size_t>(k.v);
        for (int chunk = 0; chunk < k.v; ++chunk) {
          const int64_t place = worker::virtual_stage(k.pp, stage, chunk);
          const F mine(all.begin() + static_cast<std::ptrdiff_t>(chunk * per_chunk),
                       all.begin() + static_cast<std::ptrdiff_t>((chunk + 1) * per_chunk));
          const RankSlices trained =
              rank_slices(c, k.tp, tp_rank, place * layers, layers, mine, one.weights);
          worst_weights =
              std::max(worst_weights, rel_error(trained.got_layers, widen(trained.want_layers)));
          if (place == 0 || place == int64_t{k.pp} * k.v - 1)
            worst_weights =
                std::max(worst_weights, rel_error(trained.got_unit0, widen(trained.want_unit0)));
          else
            untouched &=
                trained.got_unit0 ==
                rank_slices(c, k.tp, tp_rank, place * layers, layers, mine, initial).want_unit0;
        }
      }
      check(worst_loss < loss_tol,
            tag + ": losses differ from one rank's by " + std::to_string(worst_loss));
      check(worst_weights < weight_tol,
            tag + ": final weights differ from one rank's by " + std::to_string(worst_weights));
      check(untouched, tag + ": a stage between changed its copy of the embeddings");
      if (worst_loss < loss_tol && worst_weights < weight_tol && untouched)
        std::printf("ok    %-44s losses %.1e (tol %.0e), weights %.1e (tol %.0e) from one rank\n",
                    tag.c_str(), worst_loss, loss_tol, worst_weights, weight_tol);
    }
  }
}

// A cutpoint case (worker/cuda_cutpoint.h): layers [0, cut) at TP t1, the rest at TP t2, over
// `world` ranks in the worker's groups (worker/comm.h, cutpoint_places); `sharded`: the
// distributed optimizer in both segments. Each first-segment DP rank d takes the step's
// micro-batches d·m .. d·m + m − 1 (B1·T each). Each rank returns its losses (the second
// segment's) and both segments' final weights (each in its TP layout, with its copy of unit 0).
struct CutRun {
  std::vector<double> losses;
  F before, after;
};
std::vector<CutRun> run_cutpoint(const std::string& backend, int world, int t1, int t2, int cut,
                                 bool sharded, int sub_batches, const GptConfig& c, int64_t B1,
                                 int64_t T, int64_t m, const std::vector<Batches>& micro,
                                 std::string* error, int64_t device_units = -1,
                                 int64_t window = 0) {
  const int dp1 = world / t1, dp2 = world / t2, hi = std::max(t1, t2), lo = std::min(t1, t2);
  std::vector<std::unique_ptr<ThreadGroup>> tp1_groups, dp1_groups, tp2_groups, dp2_groups,
      cut_groups;
  for (int g = 0; g < dp1; ++g) tp1_groups.push_back(std::make_unique<ThreadGroup>(t1));
  for (int g = 0; g < t1; ++g) dp1_groups.push_back(std::make_unique<ThreadGroup>(dp1));
  for (int g = 0; g < dp2; ++g) tp2_groups.push_back(std::make_unique<ThreadGroup>(t2));
  for (int g = 0; g < t2; ++g) dp2_groups.push_back(std::make_unique<ThreadGroup>(dp2));
  for (int g = 0; g < world / hi * lo; ++g)
    cut_groups.push_back(std::make_unique<ThreadGroup>(hi / lo));
  auto abort_all = [&] {
    for (auto* groups : {&tp1_groups, &dp1_groups, &tp2_groups, &dp2_groups, &cut_groups})
      for (auto& g : *groups) g->abort();
  };
  std::vector<CutRun> runs(static_cast<size_t>(world));
  run_ranks(
      world,
      [&](int r, CudaDevice& device, worker::Communicator& world_comm) {
        try {
          ThreadGroup::Rank tp1_comm(*tp1_groups[r / t1], r % t1);
          ThreadGroup::Rank dp1_comm(*dp1_groups[r % t1], r / t1);
          ThreadGroup::Rank tp2_comm(*tp2_groups[r / t2], r % t2);
          ThreadGroup::Rank dp2_comm(*dp2_groups[r % t2], r / t2);
          ThreadGroup::Rank cut_comm(*cut_groups[r / hi * lo + r % lo], r % hi / lo);
          worker::CudaStream& serial = device.stream(worker::StreamRole::kTensorParallelComm);
          auto tp1 = t1 > 1 ? make_stream_collectives(backend, tp1_comm, device) : nullptr;
          auto tp2 = t2 > 1 ? make_stream_collectives(backend, tp2_comm, device) : nullptr;
          auto dp1_reducer = dp1 > 1 ? make_reducer(backend, dp1_comm, device, &serial) : nullptr;
          auto dp2_reducer = dp2 > 1 ? make_reducer(backend, dp2_comm, device, &serial) : nullptr;
          auto cut_reducer = make_reducer(backend, cut_comm, device, &serial);
          auto world_reducer = make_reducer(backend, world_comm, device, &serial);
          CudaGptOptions o1, o2;
          o1.tp = tp1.get();
          o1.reducer = dp1_reducer.get();
          o1.stage = worker::PipelineStage{0, c.layers, true, false, 1};
          o2.tp = tp2.get();
          o2.reducer = dp2_reducer.get();
          o2.stage = worker::PipelineStage{cut, c.layers, false, true, 1};
          for (CudaGptOptions* o : {&o1, &o2}) {
            o->distributed_optimizer = sharded;
            o->unit0_elsewhere = true;
            o->sub_batches = sub_batches;  // on the TP-2 side (TP 1 runs one lane)
            // Window offload: each segment streams its layers past its device units.
            o->window = window;
            if (window > 0) o->recompute = api::Recompute::kFull;
          }
          // Offload optimizer: the model's first device_units units (the embeddings', then the
          // layers in order) on the GPU, each segment its part (api::part_device_units).
          if (device_units >= 1) {
            o1.device_units = 1 + std::clamp<int64_t>(device_units - 1, 0, cut);
            o2.device_units = 1 + std::clamp<int64_t>(device_units - 1 - cut, 0, c.layers - cut);
          }
          GptConfig c1 = c, c2 = c;
          c1.layers = cut;
          c2.layers = c.layers - cut;
          CudaGpt before(device, c1, B1, T, o1);
          CudaGpt after(device, c2, B1 * t2 / t1, T, o2);
          before.init_weights(g_seed);
          after.init_weights(g_seed);
          worker::CudaCutpoint cutpoint(before, after, device, cut_comm, *cut_reducer,
                                        *world_reducer);
          CutRun run;
          for (size_t s = 0; s < micro.size(); ++s) {
            before.zero_grad();
            after.zero_grad();
            for (int64_t i = 0; i < m; ++i) {
              const auto& batch = micro[s][static_cast<size_t>(r / t1 * m + i)];
              cutpoint.micro_step(batch.first.data(), batch.second.data(),
                                  1.0f / static_cast<float>(m * dp2), i + 1 == m);
            }
            cutpoint.sum_unit0();
            run.losses.push_back(after.mean_loss());
            // The norm as the trainer takes it (worker/trainer.cpp, global_norm with after_cut).
            double total = 0;
            for (auto [gpt, tp_comm, dp_comm] :
                 {std::tuple{&before, &tp1_comm, &dp1_comm}, {&after, &tp2_comm, &dp2_comm}}) {
              double sums[2];
              gpt->grad_sums_of_squares(&sums[0], &sums[1]);
              if (gpt->distributed_optimizer()) worker::allreduce_doubles(*dp_comm, sums, 2);
              float sharded32 = static_cast<float>(sums[0]);
              if (tp_comm->size() > 1) tp_comm->allreduce(&sharded32, 1);
              total += static_cast<double>(sharded32) + sums[1];
            }
            const AdamWStep step = clipped_adam_step(static_cast<int64_t>(s), std::sqrt(total));
            before.update(step, 0.1f);
            after.update(step, 0.1f);
          }
          run.before.resize(before.num_parameters());
          before.get_parameters(run.before.data());
          run.after.resize(after.num_parameters());
          after.get_parameters(run.after.data());
          runs[static_cast<size_t>(r)] = std::move(run);
          return DpRun{};
        } catch (...) {  // the other groups' members must not wait forever either
          abort_all();
          throw;
        }
      },
      error);
  return runs;
}

// Oases' cutpoint on CUDA ranks (worker/cuda_cutpoint.h) against one rank accumulating the same
// micro-batches: TP 1 → 2 (the activations all-gathered at the cut), TP 2 → 1 (split; also with
// the Oases sub-batches on the TP-2 side), and
// TP 1 → 2 over 4 ranks with the distributed optimizer in both segments (DP 4, then DP 2) — 3
// steps of 2 micro-batches per rank. The losses (the second segment's, averaged over its DP
// ranks) and every rank's final weights — both segments' layers and both copies of the
// embeddings' unit, each in its TP layout — match the one rank's within 1e-2: bf16 math whose
// fp32 sums run in another order, which flips bf16 roundings that AdamW's first steps turn into
// whole updates (measured 3.8e-3–4.4e-3 over 5 seeds, every case: the TP-2 side's partial sums
// reach every layer through the backward; PP 2 × TP 2 gives 3.1e-3–3.5e-3). Skipping the world
// sum of the embeddings fails it by 3.8e-2–4.6e-2, taking the wrong block at the cut by
// 6.8e-2–7.8e-2. The case's narrower side is TP 1; its copy of the embeddings must equal the
// wider side's, bit for bit.
void test_cuda_gpt_cutpoint() {
  const GptConfig c{32, 91, 96, 4, 2, 64, 256};  // kSmallGpt with 4 layers
  const int64_t B1 = 2, T = 32, m = 2, steps = 3, cut = 2;
  struct Case {
    int world, t1, t2;
    bool sharded;
    int sub_batches;
    int64_t device_units = -1;  // offload optimizer: the model's first units on the GPU
    int64_t window = 0;         // offload window: slots for each segment's streamed layers
  };
  const std::vector<Case> cases{// TP 1 on one side
                                {2, 1, 2, false, 1},
                                {2, 2, 1, false, 1},
                                {2, 2, 1, false, 2},
                                {4, 1, 2, true, 1},
                                // offload optimizer: layers 1-3 on the CPU (both segments'),
                                // and layer 3 only (the second's), sharded
                                {2, 1, 2, false, 1, 2},
                                {4, 1, 2, true, 1, 4},
                                // the window: every layer streamed (2 per segment), and the
                                // second segment's only
                                {2, 1, 2, false, 1, 1, 1},
                                {2, 2, 1, false, 1, 3, 1}};
  for (const Case& k : cases) {
    const int dp1 = k.world / k.t1, dp2 = k.world / k.t2;
    std::vector<Batches> micro(static_cast<size_t>(steps));
    for (auto& step : micro)
      for (int64_t i = 0; i < dp1 * m; ++i) step.push_back(random_batch(B1 * T, c.vocab));
    const DpRun one = one_rank_steps(c, B1, T, micro);
    const double tol = 1e-2;
    for (const std::string& backend : rank_backends()) {
      const std::string tag =
          "cutpoint TP " + std::to_string(k.t1) + " -> " + std::to_string(k.t2) +
          " at layer 2 of 4, " + std::to_string(k.world) + " ranks" +
          (k.sharded ? " (distributed optimizer)" : "") +
          (k.sub_batches > 1 ? " (Oases: 2 sub-batches)" : "") +
          (k.device_units >= 0
               ? " (offload: " + std::to_string(k.device_units) + " units on the GPU)"
               : "") +
          (k.window > 0 ? " (window " + std::to_string(k.window) + ")" : "") + " [" + backend + "]";
      std::string error;
      const auto ranks =
          run_cutpoint(backend, k.world, k.t1, k.t2, static_cast<int>(cut), k.sharded,
                       k.sub_batches, c, B1, T, m, micro, &error, k.device_units, k.window);
      if (!error.empty()) {
        check(false, tag + ": " + error);
        continue;
      }
      double worst_loss = 0, worst_weights = 0;
      bool copies = true;
      for (int64_t s = 0; s < steps; ++s) {
        double mean = 0;  // over the second segment's DP ranks (its TP rank 0s)
        for (int d = 0; d < dp2; ++d) mean += ranks[static_cast<size_t>(d * k.t2)].losses[s];
        mean /= dp2;
        worst_loss = std::max(worst_loss, std::abs(mean - one.losses[s]) / one.losses[s]);
      }
      for (int r = 0; r < k.world; ++r) {
        const CutRun& run = ranks[static_cast<size_t>(r)];
        for (const RankSlices& got :
             {rank_slices(c, k.t1, r % k.t1, 0, cut, run.before, one.weights),
              rank_slices(c, k.t2, r % k.t2, cut, c.layers - cut, run.after, one.weights)})
          for (auto [mine, want] :
               {std::pair{&got.got_layers, &got.want_layers}, {&got.got_unit0, &got.want_unit0}})
            worst_weights = std::max(worst_weights, rel_error(*mine, widen(*want)));
        // Both copies of the embeddings' unit took the same sums and the same AdamW: the TP-1
        // side's copy, with wte cut to the other side's rows, is the other's bit for bit.
        const bool wide_after = k.t2 > k.t1;
        const int wide = std::max(k.t1, k.t2), wide_rank = r % wide;
        const RankSlices narrow_side =
            wide_after ? rank_slices(c, 1, 0, 0, cut, run.before, one.weights)
                       : rank_slices(c, 1, 0, cut, c.layers - cut, run.after, one.weights);
        const RankSlices wide_side =
            wide_after
                ? rank_slices(c, wide, wide_rank, cut, c.layers - cut, run.after, one.weights)
                : rank_slices(c, wide, wide_rank, 0, cut, run.before, one.weights);
        const size_t rows = static_cast<size_t>(c.padded_vocab * c.channels / wide);
        F expected(narrow_side.got_unit0.begin() + wide_rank * rows,
                   narrow_side.got_unit0.begin() + (wide_rank + 1) * rows);
        expected.insert(expected.end(), narrow_side.got_unit0.begin() + wide * rows,
                        narrow_side.got_unit0.end());
        copies &= expected == wide_side.got_unit0;
      }
      check(worst_loss < tol,
            tag + ": losses differ from one rank's by " + std::to_string(worst_loss));
      check(worst_weights < tol,
            tag + ": final weights differ from one rank's by " + std::to_string(worst_weights));
      check(copies, tag + ": the two segments' copies of the embeddings differ");
      if (worst_loss < tol && worst_weights < tol && copies)
        std::printf(
            "ok    %-44s losses %.1e, weights %.1e from one rank (tol %.0e), the "
            "embeddings' copies bit-identical\n",
            tag.c_str(), worst_loss, worst_weights, tol);
    }
  }
}

}  // namespace

std::vector<NamedTest> parallel_tests() {
  return {{"gpt data parallel", test_cuda_gpt_data_parallel},
          {"gpt distributed optimizer", test_cuda_gpt_distributed_optimizer},
          {"gpt pipeline stages", test_cuda_gpt_pipeline},
          {"gpt cutpoint", test_cuda_gpt_cutpoint},
          {"gpt tensor parallel", test_cuda_gpt_tensor_parallel},
          {"gpt data and tensor parallel", test_cuda_gpt_data_and_tensor_parallel}};
}

// The NCCL reducer's plumbing on one GPU (NCCL refuses two ranks on one device, so the sum itself
// and its ordering need 2+ GPUs): libnccl loads, the id travels over the bootstrap group, the
// grouped all-reduces and the stream joins run, and a group of one — whose all-reduce is the
// identity, so this cannot see an ordering bug — trains as without a reducer.
void test_nccl_reducer_single_rank() {
#ifdef KUBETRAIN_WITH_NCCL
  std::string why;
  if (!worker::nccl_available(&why)) {
    check(false, "NCCL reducer: " + why);
    return;
  }
  const GptConfig c = kSmallGpt;
  const int64_t B = 2, T = 32, steps = 3;
  std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> batches;
  for (int64_t s = 0; s < steps; ++s) batches.push_back(random_batch(B * T, c.vocab));
  for (int64_t device_units : {int64_t{-1}, int64_t{1}}) {
    const std::string tag = device_units < 0 ? "" : " (gpuUnits 1)";
    CudaGptOptions options;
    options.device_units = device_units;
    const DpRun plain = train_steps(*g_device, c, B, T, options, 1.0f, steps,
                                    [&](int64_t s) { return batches[s]; });
    ThreadGroup group(1);
    ThreadGroup::Rank bootstrap(group, 0);
    auto reducer = worker::make_nccl_gradient_reducer(bootstrap, g_device->ordinal());
    options.reducer = reducer.get();
    const DpRun nccl = train_steps(*g_device, c, B, T, options, 1.0f, steps,
                                   [&](int64_t s) { return batches[s]; });
    // Not bitwise: wte's backward adds with atomics (order not fixed) in both runs.
    expect_close(nccl.grads1, widen(plain.grads1), 1e-5,
                 "NCCL reducer, one rank: step-1 gradients vs no reducer" + tag);
    double worst = 0;
    for (int64_t s = 0; s < steps; ++s)
      worst = std::max(worst, std::abs(nccl.losses[s] - plain.losses[s]) / plain.losses[s]);
    check(worst < 1e-5, "NCCL reducer, one rank" + tag + ": losses differ from no reducer by " +
                            std::to_string(worst));
    expect_close(nccl.weights, widen(plain.weights), 1e-3,
                 "NCCL reducer, one rank: step-3 weights vs no reducer" + tag);
    check(reducer->stats().allreduces > 0, "NCCL reducer" + tag + ": issued no all-reduce");
  }
#else
  check(false, "NCCL reducer: gpu_tests was built without nccl.h");
#endif
}

}  // namespace kt::gpu_test

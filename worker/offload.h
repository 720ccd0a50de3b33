// The optimizer step and the offload engine of one rank (SynergyScale, STRONGHOLD, ZeRO-Offload;
// docs/WORKER.md, "The offload engine"; docs/PLANNER.md §8). The model's parameters form offload
// units — unit 0 the embeddings (wte, wpe) and the final LayerNorm, unit l + 1 transformer layer
// l — and the Plan says, per unit, where its AdamW runs and whether its parameters stay on the
// device:
//   * none:      every unit resident and updated on the device;
//   * optimizer: units [0, gpuUnits) updated on the device; the rest keep fp32 master weights,
//                AdamW moments and a gradient copy in host memory: their gradients go device→host
//                once final (after the DP all-reduce), CPU AdamW updates them, and the new
//                parameters go host→device before the next forward reads them;
//   * window:    as optimizer, and the CPU-updated layers ("streamed") keep no parameters on the
//                device: they pass through a ring of W device slots, fetched ahead of use in the
//                forward and the backward; their activation checkpoints and gradients leave the
//                device after every micro-batch (gradients accumulate in host memory).
// Data parallelism is the engine's too (as in the CUDA engine, worker/cuda_offload.h): in the last
// micro-batch each unit's gradients are all-reduced over the DP group as soon as they are final,
// bucket by bucket behind the backward of the layers below, before their copy home, the norm and
// AdamW read them; the streamed layers' host copies are all-reduced after the backward.
// The distributed optimizer (ZeRO-1, Megatron's --use-distributed-optimizer; plan
// distributedOptimizer over DP > 1, with any offload: docs/WORKER.md): each unit's parameters,
// packed in its slices' order and padded to a multiple of the DP size d, fall into d equal shards;
// rank r keeps the AdamW moments of shard r only. After the backward each unit's gradients are
// reduce-scattered (rank r gets shard r's sums), the gradient norm is summed over the shards, every
// rank updates its shard, and the updated shards are all-gathered into every rank's parameters
// beside the next forward, each unit waited for before the forward reads it. A streamed layer
// (window) keeps its whole master and gradient accumulator, reduce-scatters its host sums after
// the backward, and all-gathers its updated shard into every rank's master in the update.
// Checkpoints see the full moments: they are all-gathered for the save (a transient full copy),
// and a restore's full moments are cut to the shard by start().
// Four lanes with events between them: compute (the caller's thread), host→device, device→host
// and the CPU optimizer pool. No op reads a unit before its parameters have landed: the engine
// waits for the landing event, and a streamed layer read while evicted fails a KT_CHECK (with
// `poison_evicted`, its device copy is NaN while evicted, so a missed wait shows in the loss).
//
// On the CPU backend the device is host memory too, so every copy is host-to-host; the model
// keeps its llm.c-layout buffers and the window's W slots are enforced as a residency ring over
// them (docs/WORKER.md says what the CUDA backend changes). The AdamW moments of every unit live
// in one llm.c-layout buffer — on the device without offload, in host memory with it — which is
// what checkpoints save.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "api/plan.h"
#include "kernels/ops.h"
#include "worker/comm.h"
#include "worker/device.h"
#include "worker/gpt.h"
#include "worker/tensor_view.h"

namespace kt::worker {

// Host bytes the engine allocates for a plan on one rank (master weights, gradient copies and
// activation checkpoints of offloaded units, and the AdamW moments), from the plan alone.
int64_t offload_host_bytes(const api::Plan& plan);

// Throws kt::Error before anything is allocated when the ranks of this node would need more
// host memory than `available_bytes` (MemAvailable when 0).
void check_host_memory(const api::Plan& plan, int64_t available_bytes = 0);
// MemAvailable from /proc/meminfo, in bytes (0 when unreadable).
int64_t available_host_bytes();

// AdamW of one offload unit where its parameters are (moments m and v in llm.c's layout), with
// Gpt::decays' per-tensor weight decay; a bf16 model's bf16 weight copy is written in the same
// pass (and the model told so).
void update_on_device(Gpt& model, int64_t unit, float* m, float* v, kernels::AdamWStep step,
                      float weight_decay);

struct OffloadOptions {
#ifdef NDEBUG
  bool poison_evicted = false;
#else
  bool poison_evicted = true;
#endif
  int64_t tile_floats = 1 << 18;  // CPU AdamW tile: its copy overlaps the next tile's math
  bool record_timeline = false;
  // The units [0, device_units) on the device (-1: the plan's gpuUnits): a virtual stage's chunk
  // holds a part of its stage's units (api::chunk_device_units).
  int64_t device_units = -1;
};

// One busy interval of a lane, seconds since the engine started.
struct LaneSpan {
  std::string lane;  // compute | h2d | d2h | cpu-optimizer
  std::string what;  // "fwd L3", "params L3", "adam L3", ...
  double start = 0, end = 0;
};

class OffloadEngine final : public Gpt::UnitObserver {
 public:
  // `dp`: the rank's data-parallel group (nullptr or a group of one: no reduction).
  OffloadEngine(const api::Plan& plan, Gpt& model, Communicator* dp, OffloadOptions options = {});
  ~OffloadEngine() override;
  OffloadEngine(const OffloadEngine&) = delete;
  OffloadEngine& operator=(const OffloadEngine&) = delete;

  // AdamW moments in llm.c's layout (views for checkpoints). With the distributed optimizer they
  // exist in full only from construction to start() (for a restore) and inside
  // with_all_parameters (for a save).
  std::vector<TensorView> adam_m_views() const { return model_.views(m_.data()); }
  std::vector<TensorView> adam_v_views() const { return model_.views(v_.data()); }
  bool distributed_optimizer() const { return zero_; }

  // Pipeline stages (the model's PipelineStage): `embedding`, on the first and the last stage,
  // is the group of the two, over which the tensors that are not per layer (offload unit 0: the
  // tied wte, wpe, the final LayerNorm) have their gradients summed in the last micro-batch,
  // before the DP sum, so that both stages hold and update the same values; `norm_counts_unit0`:
  // whether sum_of_squares counts them (on the first stage only); `unit0_used`: false on the
  // stages between, which never read them: their copy is neither summed nor updated. Default: no
  // stages.
  void set_pipeline(Communicator* embedding, bool norm_counts_unit0, bool unit0_used) {
    embedding_ = embedding;
    norm_counts_unit0_ = norm_counts_unit0;
    unit0_used_ = unit0_used;
  }

  // A cutpoint's segments (worker/cutpoint.h): the tensors that are not per layer are summed by
  // the caller — over every rank, in both segments' TP layouts at once — after finish_backward;
  // the engine neither sums them over DP nor waits for them, and takes the sums with
  // unit0_summed(). With unit 0 on the device only (api::not_yet_executable).
  void reduce_unit0_elsewhere() {
    KT_CHECK(!units_[0].cpu, "unit 0 is summed elsewhere only where it is updated on the device");
    unit0_elsewhere_ = true;
  }
  // After the caller summed unit 0's gradients in the model: with the distributed optimizer,
  // this rank's shard of them goes where the reduce-scatter would have put it.
  void unit0_summed();

  // After the model's parameters were initialised or loaded: take the master copies and leave
  // only the window's first W streamed layers on the device.
  void start();

  bool cpu_updated(int64_t unit) const { return units_[unit].cpu; }
  bool streamed(int64_t unit) const { return units_[unit].streamed; }

  // Micro-batch protocol, from the trainer: begin_micro_batch, the model's forward and backward
  // (which call the UnitObserver hooks; grads_final starts a unit's DP all-reduces in the last
  // micro-batch), then after the last micro-batch finish_backward.
  void begin_micro_batch(int64_t micro, int64_t micro_batches);
  // Waits for every DP sum and every gradient to be home; all-reduces the streamed layers' host
  // gradients over the DP group, in layer order on this thread so that every rank issues the same
  // order.
  void finish_backward();

  // Σ g² of this rank's gradients: [0] over tensors split across TP ranks, [1] over replicated.
  void sum_of_squares(double out[2]) const;
  // AdamW on every unit with `step` (per-tensor weight decay from Gpt::decays): device units now,
  // CPU units on the optimizer pool with their new parameters streaming back tile by tile.
  // Returns without waiting for the CPU units; the next forward waits per unit.
  void update(kernels::AdamWStep step, float weight_decay);

  // Waits for every lane (before a checkpoint or the end of training).
  void synchronize();
  // Runs `fn` with every parameter's current value on the device (streamed layers' masters are
  // copied in for the call and evicted again), and the full moments (adam_*_views): for
  // checkpoints and exports. Every DP rank calls it together (the distributed optimizer
  // all-gathers the moments).
  void with_all_parameters(const std::function<void()>& fn);

  // Bytes moved since the engine started, and seconds of AdamW by where it ran.
  int64_t h2d_bytes() const { return h2d_bytes_.load(); }
  int64_t d2h_bytes() const { return d2h_bytes_.load(); }
  double cpu_optimizer_seconds() const { return cpu_seconds_.load(); }
  // Seconds the copy lanes (h2d and d2h) were busy, and seconds the compute thread waited for
  // copies to land (or for the CPU AdamW a fetch waits on) since the engine started.
  double transfer_seconds() const { return transfer_seconds_.load(); }
  double exposed_transfer_seconds() const { return exposed_transfer_seconds_; }
  double device_optimizer_seconds() const { return device_seconds_; }
  std::vector<LaneSpan> timeline() const;
  void clear_timeline();

  // UnitObserver
  void before_forward(int64_t unit) override;
  void forward_params_done(int64_t unit) override;
  void forward_activations_done(int64_t unit) override;
  void before_backward(int64_t unit) override;
  void grads_final(int64_t unit) override;

 private:
  enum class Residency { kResident, kFetching, kEvicted };
  struct Checkpoint {
    DeviceBuffer host;
    Event home, back;
    bool has_back = false;
  };
  struct Unit {
    std::vector<Gpt::Slice> slices;
    int64_t floats = 0;
    bool cpu = false;       // AdamW on the host
    bool streamed = false;  // window: parameters only in host memory between uses
    int64_t stream_index = -1;  // position among streamed layers
    DeviceBuffer master, grads;  // host: fp32 master weights and gradient copy (cpu units)
    // Streamed layers: the activation checkpoint of each micro-batch in flight, by the model's
    // activation slot (one without pipeline stages; 1F1B keeps several forwards ahead of their
    // backwards).
    std::vector<Checkpoint> checkpoints;
    Residency residency = Residency::kResident;
    Event landed;      // parameters on the device
    Event grads_home;  // gradients copied to the host
    Event updated;     // CPU AdamW done
  };

  void fetch(int64_t unit);   // host→device of a streamed layer's master
  void evict(int64_t unit);   // frees its slot
  void wait_landed(int64_t unit, const char* pass);
  void copy_grads_home(int64_t unit, std::vector<std::shared_ptr<CommWork>> dp_work);
  void embedding_grads_final();  // grads_final(0)
  // Unit 0's sums (over the embedding group, then DP) and its copy home, in the last micro-batch.
  void reduce_unit0();
  // Starts the DP all-reduce of unit `u`'s `slices` (last micro-batch, DP > 1), packed into the
  // unit's bucket; the works, also kept to be waited for in finish_backward.
  std::vector<std::shared_ptr<CommWork>> reduce(
      int64_t u, const std::vector<std::pair<float*, int64_t>>& slices);
  void copy_checkpoint_back(int64_t layer);
  // At the start of a forward (or backward) sweep: its first `slots` streamed layers resident.
  // The sweeps' own prefetch leaves them so where a backward follows a forward and a forward a
  // backward; pipeline stages also run forwards (backwards) back to back, where the last sweep
  // left the wrong end of the stage in the slots.
  void begin_sweep(bool forward);
  // The distributed optimizer's shard of a unit: [begin, end) of its packed parameters (empty
  // where the padding takes the whole shard), `size` floats per rank, at `offset` in the shard
  // buffers.
  struct Shard {
    int64_t begin = 0, end = 0, size = 0, offset = 0;
  };
  // fn(tensor, model offset, offset in the shard, count) for each piece of unit u's shard.
  void for_each_shard_piece(int64_t u,
                            const std::function<void(int, int64_t, int64_t, int64_t)>& fn) const;
  // The distributed optimizer's reduce-scatter of unit u's gradients (packed into its bucket).
  std::shared_ptr<CommWork> reduce_scatter_unit(int64_t u);
  // AdamW on the rank's shards; starts each unit's all-gather of the new shards.
  void update_shards(const kernels::AdamWStep& step, float weight_decay);
  void finish_gather(int64_t u);  // waits for unit u's all-gather and writes its parameters
  // Every rank's shard of `shards` (a shard buffer) into `full` (llm.c layout), unit by unit.
  void all_gather_shards(const float* shards, float* full);
  int64_t streamed_unit(int64_t index) const { return first_streamed_ + index; }
  void span(const std::string& lane, const std::string& what,
            std::chrono::steady_clock::time_point start);
  void wait_on_compute(const Event& event);  // and count the wait as exposed transfer time

  Gpt& model_;
  Communicator* dp_;  // nullptr: DP 1
  Communicator* embedding_ = nullptr;  // set_pipeline
  bool norm_counts_unit0_ = true, unit0_used_ = true;
  bool unit0_deferred_ = false;  // embedding_grads_final waits for finish_backward
  bool unit0_elsewhere_ = false;  // reduce_unit0_elsewhere
  OffloadOptions options_;
  std::vector<std::shared_ptr<CommWork>> reductions_;  // this step's DP sums in flight
  // Per unit, the packed gradients its DP sum runs on: kept across steps (a step's sums are all
  // waited for in finish_backward before the next begins), so no step allocates them anew.
  std::vector<std::vector<float>> dp_buckets_;
  std::vector<Unit> units_;
  int64_t first_streamed_ = 0, num_streamed_ = 0, slots_ = 0;
  int64_t micro_ = 0, micro_batches_ = 1;
  DeviceBuffer m_, v_;
  bool zero_ = false;  // the distributed optimizer
  std::vector<Shard> shards_;
  DeviceBuffer shard_m_, shard_v_, shard_grads_, shard_send_;
  std::vector<std::shared_ptr<CommWork>> gathers_;  // per unit, until the forward reads it
  std::shared_ptr<Device> host_;
  std::atomic<int64_t> h2d_bytes_{0}, d2h_bytes_{0};
  std::atomic<double> cpu_seconds_{0}, transfer_seconds_{0};
  double exposed_transfer_seconds_ = 0;  // the compute thread's
  double device_seconds_ = 0;
  std::chrono::steady_clock::time_point epoch_;
  mutable std::mutex timeline_mutex_;
  std::vector<LaneSpan> timeline_;
  std::chrono::steady_clock::time_point compute_start_;
  // Declared last: destroyed first, so queued work finishes while the buffers above still exist.
  Stream h2d_{"h2d"}, d2h_{"d2h"}, cpu_{"cpu-optimizer"};
};

}  // namespace kt::worker

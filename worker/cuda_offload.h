// The parameters, the optimizer step and the offload engine of a CUDA rank: the counterpart of
// the CPU `OffloadEngine` (worker/offload.h), with the same offload units (0: wte, wpe and the
// final LayerNorm; l + 1: layer l), the same modes and the same lanes — compute (the model's
// stream), h2d, d2h, and the CPU optimizer thread — ordered by CUDA events:
//   * none:      every unit's fp32 master weights and AdamW moments on the device, updated by
//                one multi-tensor AdamW launch per decay class that also writes the bf16 copy;
//   * optimizer: units [device_units, L] keep master, moments and a gradient copy in pinned host
//                memory (SynergyScale's CPU/GPU split): their gradients go d2h as they become
//                final in the last micro-batch, the CPU thread runs AdamW in forward order, and
//                the new bf16 weights go h2d before the next forward reads the unit;
//   * window:    as optimizer, and the CPU-updated layers ("streamed", StrongHold) have no place
//                on the device: they pass through `window` slots of one layer each, loaded ahead
//                of use in the forward and the backward; their gradients leave the slot after
//                every micro-batch (summed in host memory), and their activation checkpoints go
//                to pinned memory through a ring of two device buffers per lane.
// Data parallelism is the engine's too, as on the CPU: as a unit's gradients become final in the
// last micro-batch it sums them over the DP group (the GradientReducer) before its copy, the norm
// and AdamW read them.
// The distributed optimizer (ZeRO-1, Megatron's --use-distributed-optimizer; the CPU engine's
// sharding): each unit's parameters, packed in its slices' order and padded to a multiple of the
// DP size d, fall into d equal shards; this rank keeps the fp32 master weights and the moments of
// its shard r only (12/d bytes per parameter instead of 12). As a unit's gradients become final in
// the last micro-batch they are packed into a bucket (one of two, in turn) on the data-parallel
// stream and reduce-scattered, shard r's sums landing in the rank's shard gradients; the norm is
// the shards' (the trainer sums it over DP); AdamW updates the shard and writes its bf16 weights
// into a gather bucket, which is all-gathered and unpacked into every rank's bf16 parameters on
// the data-parallel stream, unit by unit, the next forward waiting for each unit's. The fp32
// gradients stay whole on every rank (accumulated over micro-batches, as Megatron's buffer).
// With offload the host units keep their shards in host memory (their CPU updates them; the next
// forward all-gathers the new bf16 shards); a streamed layer's slot sums are reduce-scattered in
// the last micro-batch, and its gathered shards go into its whole host copy, which its slot loads.
//
// The model (worker/cuda_gpt.h) holds the activations and the math: it reads a layer's weights
// and gradients through layer_weight / layer_grad and tells the engine where the schedule is
// (before_forward, forward_done, before_backward, grads_final), as the CPU model tells its
// UnitObserver.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "api/enums.h"
#include "kernels/cuda/ops.h"
#include "kernels/ops.h"
#include "worker/cuda_device.h"
#include "worker/gpt_layout.h"
#include "worker/gradient_reducer.h"

namespace kt::worker {

// Memory taken on a CudaDevice, typed and sized in elements (bytes only inside), counted under
// its MemoryKind and given back when the owner goes, after the device has finished with it.
class CudaAllocations {
 public:
  explicit CudaAllocations(CudaDevice& device) : device_(device) {}
  ~CudaAllocations();
  CudaAllocations(const CudaAllocations&) = delete;
  CudaAllocations& operator=(const CudaAllocations&) = delete;
  template <typename T>
  T* device(int64_t n, MemoryKind kind) {
    return static_cast<T*>(device_bytes(static_cast<size_t>(n) * sizeof(T), kind));
  }
  template <typename T>
  T* pinned(int64_t n, MemoryKind kind) {
    return static_cast<T*>(pinned_bytes(static_cast<size_t>(n) * sizeof(T), kind));
  }
  void* device_bytes(size_t bytes, MemoryKind kind);
  void* pinned_bytes(size_t bytes, MemoryKind kind);

 private:
  CudaDevice& device_;
  std::vector<void*> device_blocks_, pinned_blocks_;
};

// The bytes of `n` elements of T: copies and memsets are sized in elements, as the buffers are.
template <typename T>
constexpr size_t bytes(int64_t n) {
  return static_cast<size_t>(n) * sizeof(T);
}

// Where one TP rank's parameters live on the device. The per-layer tensors hold only the
// resident layers [0, resident_layers) (all of them without window offload); a window slot holds
// one streamed layer's slice of each per-layer tensor.
struct CudaParamLayout {
  int64_t layers = 0, resident_layers = 0, tp = 1;
  std::array<int64_t, kNumParamTensors> sizes{}, offsets{};  // the whole model (llm.c layout)
  int64_t params = 0;
  std::array<int64_t, kNumParamTensors> dsizes{}, doffsets{};  // on the device
  int64_t dparams = 0;
  std::array<int64_t, kNumParamTensors> slot_offsets{};  // the per-layer tensors within a slot
  int64_t slot_params = 0;

  // A whole-model offset of `tensor` on the device (for a resident part).
  int64_t device_offset(int tensor, int64_t offset) const {
    return doffsets[tensor] + offset - offsets[tensor];
  }
  // Resident layer l's slice of a per-layer tensor on the device.
  int64_t layer_offset(int tensor, int64_t l) const {
    return doffsets[tensor] + l * (sizes[tensor] / layers);
  }
};
CudaParamLayout cuda_param_layout(const GptConfig& config, int64_t tp, int64_t resident_layers);

struct CudaOffloadOptions {
  // Units [0, device_units) are updated on the device (-1: all of them).
  int64_t device_units = -1;
  // > 0: offload window (needs device_units >= 1, and recompute: the streamed layers' inputs are
  // their checkpoints).
  int64_t window = 0;
  api::Recompute recompute = api::Recompute::kNone;
  int cpu_threads = 1;                // OpenMP threads of the CPU optimizer
  GradientReducer* reducer = nullptr;  // data parallelism (nullptr: one rank)
  // The distributed optimizer (ZeRO-1) over the reducer's group, when it has more than one rank
  // (with any offload: a host unit keeps its shard; a streamed layer also its whole bf16 copy and
  // gradient accumulator).
  bool distributed_optimizer = false;
  // Pipeline stages: the first and the last stage's group, over which they sum unit 0's
  // gradients after the DP sum (null: none); whether the norm counts unit 0 (the first stage's
  // only) and whether AdamW updates it (not on the stages between, which never use it).
  GradientReducer* embedding = nullptr;
  bool counts_unit0 = true, updates_unit0 = true;
  // A cutpoint's segments (worker/cuda_cutpoint.h): unit 0's gradients are summed by the caller,
  // over every rank in both segments' TP layouts at once, after the backward; the engine does not
  // sum them over DP and takes the sums with unit0_summed(). Unit 0 on the device.
  bool unit0_elsewhere = false;
  // Pipeline stages: the model's activation slots (micro-batches in flight from a forward to its
  // backward); the streamed layers' checkpoints are kept per slot in host memory.
  int in_flight = 1;
};

class CudaOffloadEngine {
 public:
  // Allocates the parameters (bf16 copy and fp32 gradients of what is resident), the masters
  // and moments, the slots and the host buffers, and starts the CPU optimizer thread when a unit
  // is updated there. `context` runs the device AdamW and casts on the compute stream.
  CudaOffloadEngine(CudaDevice& device, const GptConfig& config, int64_t tp,
                    const kernels::cuda::Context& context, const CudaOffloadOptions& options);
  ~CudaOffloadEngine();
  CudaOffloadEngine(const CudaOffloadEngine&) = delete;
  CudaOffloadEngine& operator=(const CudaOffloadEngine&) = delete;

  const CudaParamLayout& layout() const { return layout_; }
  int64_t device_units() const { return device_units_; }
  int64_t window() const { return window_; }
  // Whether layer l streams through a window slot; whether its activation checkpoint does.
  bool streamed(int64_t l) const { return window_ > 0 && l >= layout_.resident_layers; }
  bool checkpoint_streamed(int64_t l) const { return streamed(l) && l < layout_.layers; }

  // The resident parameters (bf16) and gradients (fp32), device layout; a layer's slice of a
  // per-layer tensor wherever it lives (its slot when streamed).
  const kernels::cuda::bf16* params16() const { return params16_; }
  float* grads() const { return grads_; }
  const kernels::cuda::bf16* layer_weight(int tensor, int64_t l);
  float* layer_grad(int tensor, int64_t l);

  // Host arrays in the whole model's llm.c layout (params floats). Each waits for queued work;
  // set_parameters refreshes the bf16 copies.
  void set_parameters(const float* host);
  void get_parameters(float* host);
  void set_moments(const float* m, const float* v);
  void get_moments(float* m, float* v);
  void get_gradients(float* host);

  // The step, from the model: begin_step before the gradients are zeroed (the last step's
  // copies and sums are done with them); before_forward(unit) before an op reads the unit
  // (before unit 1 the window's first layers are fetched too); forward_done(l) when layer l's
  // forward no longer reads its weights (its slot goes to the layer `window` above);
  // before_backward(l, first) before layer l's backward (a streamed layer back in its slot, its
  // gradients started there: zero in the step's first micro-batch, else the sum so far);
  // grads_final(unit, last) when the unit's gradients of this micro-batch are complete.
  void begin_step();
  void before_forward(int64_t unit);
  void forward_done(int64_t l);
  void before_backward(int64_t l, bool first_micro_batch);
  void grads_final(int64_t unit, bool last_micro_batch);
  // Work enqueued on `stream` from now on waits for the DP sums issued so far.
  void join_reductions(CudaStream& stream);
  // Pipeline stages: the first and the last stage sum unit 0's gradients over the embedding
  // group, once the step's schedule is over (the norm and update call it; once per step).
  void sum_embeddings();
  // After the caller summed unit 0's gradients (CudaOffloadOptions::unit0_elsewhere), on the
  // compute stream: with the distributed optimizer, the rank's shard of them goes where the
  // reduce-scatter would have put it.
  void unit0_summed();
  // Adds Σ g² of the gradients only in host memory (the streamed layers') to the sharded and
  // replicated sums (after the backward).
  void add_host_sums_of_squares(double* sharded, double* replicated);
  // The distributed optimizer: whether it is on; Σ g² of this rank's shards enqueued on the
  // compute stream into device doubles sums[0] (the TP-sharded tensors') and sums[1] (the
  // replicated ones'), after the reduce-scatters.
  bool distributed_optimizer() const { return zero_; }
  void add_shard_sums_of_squares(double* sums);
  // AdamW on every unit (weight decay on the decayed tensors): the device units' now, the CPU
  // units' queued in forward order; the next forward waits per unit.
  void update(const kernels::AdamWStep& step, float weight_decay);
  // Waits for the CPU optimizer and the device.
  void synchronize();

  // Activation checkpoints of the streamed layers, one ring per lane of `parts` tensors of `n`
  // bf16 each (add_checkpoint_lane once per lane, in lane order, before the step). The ring's
  // device buffer for layer l's part, or nullptr when l's checkpoint is not streamed (the model
  // keeps its own). before_write: the forward is about to write layer l's checkpoint (its ring
  // slot's last copy out is done); out: the forward has read it for the last time (copy out);
  // in: bring it back for the backward (once; `wait`: the compute stream waits for it, else a
  // prefetch); done: the layer's backward has read it.
  // With pipeline stages each activation slot has its own host copies (use_slot: the model's
  // active one); the device ring is shared, a slot's checkpoint copied in again where another's
  // forward took its place.
  void add_checkpoint_lane(int parts, int64_t n);
  void use_slot(int slot) { active_slot_ = slot; }
  kernels::cuda::bf16* checkpoint_buffer(int lane, int64_t l, int part);
  void checkpoint_before_write(int lane, int64_t l);
  void checkpoint_out(int lane, int64_t l);
  void checkpoint_in(int lane, int64_t l, bool wait);
  void checkpoint_done(int lane, int64_t l);

  // Offload traffic since construction, and the CPU optimizer's busy seconds.
  int64_t h2d_bytes() const { return h2d_bytes_.load(); }
  int64_t d2h_bytes() const { return d2h_bytes_.load(); }
  double cpu_optimizer_seconds() const;

 private:
  struct HostSlice {  // a slice of a CPU-updated unit: its whole-model offset, and in host buffers
    int tensor;
    int64_t offset;
    int64_t packed;
    int64_t count;
  };
  struct Unit {
    bool on_device = true;
    std::vector<HostSlice> host_slices;
    GradientReducer::Ranges grad_ranges;  // its gradients on the device (for the reducer)
    std::unique_ptr<CudaEvent> grads_final, grads_copied, weights_copied;
    bool pending = false;  // the CPU update of the last step has not reached its h2d copy yet
    bool gather_due = false;  // the distributed optimizer: its CPU-updated shard awaits the gather
    bool shard_home = false;  // ... and its shard gradients of this step went home already
  };
  // A window slot: one streamed layer's bf16 weights and fp32 gradients on the device.
  struct Slot {
    kernels::cuda::bf16* weights = nullptr;
    float* grads = nullptr;
    int64_t layer = -1;  // the layer whose weights it holds (or is loading)
    std::unique_ptr<CudaEvent> loaded, weights_free, grads_free;
  };
  // A lane's checkpoint ring: pinned copies layer by layer, two device buffers, their events
  // (written, copied out, copied in, used by the backward) and the layer copied in (or -1).
  struct Ring {
    int parts = 0;
    int64_t n = 0;
    std::array<std::array<kernels::cuda::bf16*, 3>, 2> buffers{};
    kernels::cuda::bf16* host = nullptr;
    std::array<std::unique_ptr<CudaEvent>, 2> written, out, in, used;
    std::array<int64_t, 2> holds{-1, -1};  // (a checkpoint_key)
  };

  // The distributed optimizer's shard of a unit: `size` floats per rank (its packed slices
  // padded to d·size), at `offset` in the rank's shard arrays; the pieces of the rank's shard,
  // each a run of one tensor.
  struct ShardPiece {
    int tensor;
    int64_t offset;    // whole-model offset
    int64_t in_shard;  // from the shard's start
    int64_t count;
  };
  struct Shard {
    int64_t size = 0, offset = 0;
    std::vector<ParamSlice> slices;  // the unit's, in packed order
    std::vector<ShardPiece> pieces;
  };
  // Two buckets in turn: a unit's packed fp32 gradients (d·size) or bf16 weights, and the events
  // of their collective (ready: written; done: the collective has finished with it).
  template <typename T>
  struct Bucket {
    T* data = nullptr;
    std::unique_ptr<CudaEvent> ready, done, free;  // free: the unpack has read it
  };

  void allocate();
  void allocate_shards();
  void refresh_bf16();  // bf16 copies := masters (all units), synchronous
  // Its packed gradients, on the DP stream; returns the event recorded once the shard's sums are
  // in place.
  const CudaEvent& reduce_scatter(int64_t unit);

  void update_shards(const kernels::AdamWStep& step, float weight_decay);
  // The distributed optimizer with offload optimizer: a host unit's shard updated by the CPU,
  // and its new bf16 values all-gathered into every rank's weights (before its next forward).
  void cpu_update_shard(int64_t unit, kernels::AdamWStep step, float weight_decay);
  void gather_host_shard(int64_t unit);
  void copy_shard_home(int64_t unit, const CudaEvent& ready);
  // Between the whole-model host array and the rank's shards of every unit (the device units'
  // in `device`, the host units' in `host`): set, or all-gathered (every DP rank together).
  void scatter_shards(const float* whole, float* device, float* host);
  void gather_shards(const float* device, const float* host, float* whole);
  bool unit_streamed(int64_t unit) const { return unit > 0 && streamed(unit - 1); }
  Slot& slot_of(int64_t l) {
    return slots_[static_cast<size_t>((l - layout_.resident_layers) % window_)];
  }
  int ring_of(int64_t l) const { return static_cast<int>((l - layout_.resident_layers) % 2); }
  kernels::cuda::bf16* ring_host(const Ring& ring, int64_t l) const {
    const int64_t streamed_layers = c_.layers - layout_.resident_layers;
    return ring.host +
           (active_slot_ * streamed_layers + l - layout_.resident_layers) * ring.parts * ring.n;
  }
  // Layer l's checkpoint of the active slot, as a ring buffer's `holds`.
  int64_t checkpoint_key(int64_t l) const { return active_slot_ * c_.layers + l; }
  void copy_grads_home(Unit& u, const CudaEvent& ready, bool sums,
                       const GradientReducer::Ranges* slot_ranges);
  void load_layer(int64_t l);  // into its slot (after the CPU's update and the slot's last reader)
  void use_layer(int64_t l);   // ... and the compute stream waits for it
  void wait_cpu_update(const Unit& u);
  void cpu_update(int64_t unit, kernels::AdamWStep step, float weight_decay);
  void run_cpu_tasks();
  void wait_cpu_idle();

  CudaDevice& device_;
  GptConfig c_;
  const kernels::cuda::Context& ctx_;
  int64_t device_units_ = 0, window_ = 0;
  int cpu_threads_ = 1;
  GradientReducer* reducer_ = nullptr;
  GradientReducer* embedding_ = nullptr;
  bool counts_unit0_ = true, updates_unit0_ = true, unit0_elsewhere_ = false;
  std::unique_ptr<CudaEvent> embedding_ready_;
  bool embedding_pending_ = false;              // the step's unit 0 awaits the stages' sum
  const CudaEvent* embedding_after_ = nullptr;  // with the shards: its reduce-scatter's end
  CudaParamLayout layout_;
  CudaAllocations memory_;

  kernels::cuda::bf16* params16_ = nullptr;
  float* grads_ = nullptr;
  std::vector<Slot> slots_;
  // The device units' fp32 masters and moments, packed by device_slices_; their AdamW lists.
  float *dmaster_ = nullptr, *dm_ = nullptr, *dv_ = nullptr;
  std::vector<ParamSlice> device_slices_;
  std::vector<kernels::cuda::AdamWTensor> device_tensors_[2];  // [decays]
  // The host units' pinned masters, moments, gradients and bf16 staging, packed unit by unit.
  int64_t host_packed_ = 0;
  float *hmaster_ = nullptr, *hm_ = nullptr, *hv_ = nullptr, *hgrads_ = nullptr;
  uint16_t* hparams16_ = nullptr;
  // With the distributed optimizer those hold the host units' shards; a streamed layer also keeps
  // its whole bf16 copy (what its slot loads, the all-gather's unpack) and gradient accumulator,
  // packed by its host_slices here.
  uint16_t* hstream16_ = nullptr;
  float* hstream_grads_ = nullptr;
  int64_t stream_packed_ = 0;
  uint16_t* stream16() const { return zero_ ? hstream16_ : hparams16_; }
  float* stream_grads() const { return zero_ ? hstream_grads_ : hgrads_; }
  std::vector<Unit> units_;
  std::vector<Ring> rings_;
  int in_flight_ = 1, active_slot_ = 0;
  // The distributed optimizer: the shards (dmaster_, dm_, dv_ hold the rank's shards of the
  // device units then; with offload optimizer hmaster_, hm_, hv_, hgrads_ and hparams16_ the
  // host units' from shard_host_base_ on: a shard at offset o is at o − shard_host_base_ there),
  // the shard gradients of every unit, and the buckets.
  bool zero_ = false;
  std::vector<Shard> shards_;
  float* shard_grads_ = nullptr;
  int64_t shard_host_base_ = 0;
  std::unique_ptr<CudaEvent> shard_grads_ready_;
  std::array<Bucket<float>, 2> grad_buckets_;
  std::array<Bucket<kernels::cuda::bf16>, 2> weight_buckets_;
  int next_grad_bucket_ = 0, next_weight_bucket_ = 0;

  // The CPU optimizer thread.
  std::thread cpu_thread_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> cpu_tasks_;
  bool cpu_busy_ = false, stopping_ = false;
  std::exception_ptr cpu_error_;
  double cpu_seconds_ = 0;
  std::atomic<int64_t> h2d_bytes_{0}, d2h_bytes_{0};
};

}  // namespace kt::worker

// GPT-2 on the CUDA device of a rank in bf16 mixed precision (DESIGN.md §7): bf16 weights and activations
// on the device, fp32 gradients, fp32 master weights and AdamW moments — on the device, or, for
// the offload units the Plan gives to the CPU (`offload: optimizer`, SynergyScale's CPU/GPU split
// of the optimizer), in pinned host memory, updated by the CPU while the device goes on.
//
// The parameter layout is the CPU model's (worker/gpt_layout.h), so seeds, checkpoints and llm.c
// files mean the same model on both. The step, for the units updated on the CPU:
//   backward (last micro-batch): as each layer's gradients become final, the d2h stream copies
//     them into pinned memory (waiting on an event the compute stream recorded);
//   update: the device units' AdamW is one multi-tensor launch per decay class on the compute
//     stream; the CPU optimizer thread runs AdamW on the host units in forward order (each after
//     its gradient copy landed), writes their bf16 weights into pinned memory and issues their
//     h2d copy;
//   next forward: before a host unit's first op, the compute stream waits for that unit's h2d
//     copy (the trainer thread waits only until the copy is issued), so the first layers compute
//     while the CPU still updates the later ones.
// Attention is the flash-style bf16 kernel (kernels/cuda/flash_attention.cu: no T×T matrix; the
// rows' log-sum-exp kept per layer) for the head sizes it is built for (32, 64, 128), else the
// fp32 kernels' (the T×T matrix materialised per layer).
// Data parallelism (options.reducer, worker/gradient_reducer.h): as each unit's gradients become
// final in the last backward, the reducer sums them over the DP group (NCCL on its own stream
// behind the compute stream's event); the unit's d2h copy, the norm and the device AdamW wait
// for the sums.
// Recompute (options.recompute): worker/recompute.h says what each mode keeps (both devices alike).
// Tensor parallelism (options.tp, Megatron's split, the CPU model's layout): each rank holds its
// heads of qkv and attproj, its ffn units of fc and fcproj and its rows of wte; the row-parallel
// outputs (attention projection, fc2) and the column-parallel input gradients (of qkv and fc, and
// the LM head's) are all-reduced in bf16 on the TP communication stream, the embedding and the
// cross-entropy are vocabulary-parallel. With options.sub_batches = 2 (Oases) the micro-batch is
// split in two lanes, interleaved op by op, so that each lane's all-reduce runs while the other
// lane computes.
// Window offload (options.window): see CudaGptOptions. The streamed layers' activation checkpoints
// (worker/recompute.h) go to pinned memory through a ring of two device buffers per lane.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "api/enums.h"
#include "kernels/cuda/ops.h"
#include "worker/cuda_device.h"
#include "worker/gpt_layout.h"
#include "worker/gradient_reducer.h"
#include "worker/recompute.h"

namespace kt::worker {

struct CudaGptOptions {
  // Offload units [0, device_units) keep their master weights and moments on the device and are
  // updated there; the rest (offload: optimizer) in pinned host memory, updated by the CPU.
  // Default (-1): every unit on the device.
  int64_t device_units = -1;
  // offload: window (StrongHold's streaming, with the CPU-updated layers): when > 0, the layers
  // of the host units [device_units, L] are not kept on the device at all — their bf16 weights
  // and fp32 gradients live in `window` slots of one layer each, loaded from pinned memory before
  // the layer's forward and again before its backward, its gradients copied out (accumulated in
  // host memory) after each micro-batch's backward. Needs recompute and device_units ≥ 1.
  int64_t window = 0;
  int cpu_threads = 1;  // OpenMP threads of the CPU optimizer
  // Data parallelism: sums each unit's gradients over the DP group as they become final in the
  // last micro-batch's backward (nullptr: one rank). The trainer scales the loss by 1/dp.
  GradientReducer* reducer = nullptr;
  // worker/recompute.h. The re-run of kFull skips fc2's GEMM too: the backward reads neither its
  // output nor the residual sum after it (the next layer's input is kept).
  api::Recompute recompute = api::Recompute::kNone;
  // Tensor parallelism (Megatron): this rank's group; nullptr = TP 1. The model then holds rank
  // r's slices (gpt_rank_views) and all-reduces activations on the TP communication stream.
  StreamCollectives* tp = nullptr;
  // With TP, 2: the Oases schedule (two half micro-batches, one's all-reduces overlapping the
  // other's compute; B must be even). 1 otherwise (and always at TP 1).
  int sub_batches = 1;
};

class CudaGpt {
 public:
  // Allocates everything (throws kt::Error naming what did not fit) on `device`, whose compute
  // stream runs the kernels. B×T is the micro-batch.
  CudaGpt(CudaDevice& device, const GptConfig& config, int64_t B, int64_t T,
          const CudaGptOptions& options = {});
  ~CudaGpt();
  CudaGpt(const CudaGpt&) = delete;
  CudaGpt& operator=(const CudaGpt&) = delete;

  int64_t num_parameters() const { return num_params_; }
  const std::array<int64_t, kNumParamTensors>& param_sizes() const { return sizes_; }
  int64_t batch() const { return B_; }
  int64_t seq_len() const { return T_; }
  int64_t device_units() const { return device_units_; }
  // Training FLOPs of one B×T micro-batch: 6·P·BT + attention 12·L·C·T·BT (as the CPU model).
  double flops_per_micro_step() const;

  // GPT-2's initialisation from `seed` (worker/gpt_layout.h: the CPU model's values).
  void init_weights(uint64_t seed);
  // The fp32 master weights (num_parameters() floats, llm.c layout), and the AdamW moments. Each
  // call waits for queued work first; set_* refresh the bf16 copy.
  void set_parameters(const float* host);
  void get_parameters(float* host);
  void set_moments(const float* m, const float* v);
  void get_moments(float* m, float* v);
  // The fp32 gradients accumulated so far (num_parameters() floats; waits for queued work).
  void get_gradients(float* host);

  // Starts an accumulation: gradients and the loss sum are zeroed.
  void zero_grad();
  // Enqueues forward and backward of one micro-batch (inputs and targets: B·T host tokens);
  // parameter gradients accumulate, scaled by `loss_scale` (1/accumulation steps for a mean).
  // `last`: the last micro-batch of the step (its backward starts the gradient copies of the
  // CPU-updated units).
  void train_micro_step(const int32_t* inputs, const int32_t* targets, float loss_scale,
                        bool last);
  // Mean loss of the micro-batches since zero_grad (waits for them).
  double mean_loss();
  // Σ g² over every gradient, in double (waits for the backward).
  double grad_sum_of_squares();
  // The same split into the TP-sharded tensors' (sum those over the TP group) and the replicated
  // ones' (the same on every TP rank).
  void grad_sums_of_squares(double* sharded, double* replicated);
  // Whether a tensor is split over the TP ranks (false for every tensor at TP 1).
  bool sharded(int tensor_index) const;
  int64_t tp_size() const { return t_; }
  int64_t tp_rank() const { return tr_; }
  // AdamW on every parameter: `step` as given, with step.weight_decay = weight_decay for the
  // decayed tensors and 0 for the others. Returns once the device's part is enqueued and the
  // CPU's queued; the next forward waits for what it needs.
  void update(const kernels::AdamWStep& step, float weight_decay);
  // Waits for everything: device streams and the CPU optimizer.
  void synchronize();

  // Offload traffic since construction, and the CPU optimizer's busy seconds.
  int64_t h2d_bytes() const { return h2d_bytes_.load(); }
  int64_t d2h_bytes() const { return d2h_bytes_.load(); }
  double cpu_optimizer_seconds() const;

 private:
  struct Lane;  // below
  struct HostSlice {  // a slice of a CPU-updated unit: where it lives on the device and the host
    int tensor;
    int64_t offset;  // in the device's parameter / gradient buffers
    int64_t packed;  // in the host buffers
    int64_t count;
  };
  struct Unit {
    bool on_device = true;
    std::vector<HostSlice> host_slices;
    GradientReducer::Ranges grad_ranges;  // its gradients on the device (for the reducer)
    std::unique_ptr<CudaEvent> grads_final, grads_copied, weights_copied;
    bool pending = false;  // the CPU update of the last step has not reached its h2d copy yet
  };
  // A window slot: one streamed layer's bf16 weights and fp32 gradients on the device.
  struct Slot {
    kernels::cuda::bf16* weights = nullptr;
    float* grads = nullptr;
    int64_t layer = -1;  // the layer whose weights it holds (or is loading)
    std::unique_ptr<CudaEvent> loaded, weights_free, grads_free;
  };
  void allocate();
  // Device (take) or pinned host (take_pinned) memory for `n` elements of T, given back with the
  // model; sizes are in elements everywhere, bytes only here.
  template <typename T>
  T* take(int64_t n, MemoryKind kind) {
    return static_cast<T*>(take_bytes(static_cast<size_t>(n) * sizeof(T), kind));
  }
  template <typename T>
  T* take_pinned(int64_t n, MemoryKind kind) {
    return static_cast<T*>(take_pinned_bytes(static_cast<size_t>(n) * sizeof(T), kind));
  }
  void* take_bytes(size_t bytes, MemoryKind kind);
  void* take_pinned_bytes(size_t bytes, MemoryKind kind);
  void refresh_bf16();       // bf16 copy := master (all units), synchronous
  void before_unit(int64_t unit);  // the next forward is about to read unit's weights
  void wait_cpu_update(const Unit& u);  // the CPU's AdamW of u (last step) has written its weights
  // Window offload: whether layer l streams; its slot; load its weights into the slot (after the
  // CPU's update and the slot's last reader); make the compute stream wait for them; start its
  // gradients in the slot (zero, or the micro-batches' sum so far); its weights' and gradients'
  // addresses wherever they live.
  bool streamed(int64_t l) const { return window_ > 0 && l >= dev_layers_; }
  bool unit_streamed(int64_t unit) const { return unit > 0 && streamed(unit - 1); }
  Slot& slot_of(int64_t l) { return slots_[static_cast<size_t>((l - dev_layers_) % window_)]; }
  void load_layer(int64_t l);
  // The streamed layers' activation checkpoints: whether layer l's input streams; before the
  // forward writes it (its ring slot's last copy out has finished); after the forward's last read
  // (copy out); before the layer's backward (copy in, once; `wait`: the compute stream waits for
  // it, else it is a prefetch); after it (the slot may be reloaded).
  bool checkpoint_streamed(int64_t l) const { return streamed(l) && l < c_.layers; }
  int ring_of(int64_t l) const { return static_cast<int>((l - dev_layers_) % 2); }
  void checkpoint_before_write(Lane& lane, int64_t l);
  void checkpoint_out(Lane& lane, int64_t l);
  void checkpoint_in(Lane& lane, int64_t l, bool wait);
  void checkpoint_done(Lane& lane, int64_t l);
  void use_layer(int64_t l);
  void start_layer_grads(int64_t l);
  const kernels::cuda::bf16* layer_weight(int tensor, int64_t l);
  float* layer_grad(int tensor, int64_t l);
  int64_t dev_offset(int tensor, int64_t offset) const {  // a full-layout offset on the device
    return doffsets_[tensor] + offset - offsets_[tensor];
  }
  void unit_grads_final(int64_t unit, bool last);
  void join_reductions(CudaStream& stream);  // stream waits for the DP sums issued so far
  // A lane's forward and backward pieces (cuda_gpt.cpp lists the schedule).
  void attention_forward(Lane& lane, int64_t l, bool rerun);
  void mlp_forward(Lane& lane, int64_t l, bool rerun);
  void rerun_layer(Lane& lane, int64_t l);
  // The TP all-reduce of a lane's buffer on the TP stream; `now`: the compute stream waits for it
  // at once, else at the lane's next finish_allreduce.
  void lane_allreduce(Lane& lane, void* data, int64_t count, DeviceDtype type, ReduceOp op,
                      bool now);
  void finish_allreduce(Lane& lane);
  // Where layer l's activations live: its own buffers, or (recompute) the one working set; the
  // summed outputs of its attention projection and fc2: per layer with commAware (part of the
  // checkpoint, worker/recompute.h), else one buffer for all.
  int64_t work_index(int64_t l) const { return recompute_ == api::Recompute::kNone ? l : 0; }
  int64_t proj_index(int64_t l) const { return recompute_ == api::Recompute::kCommAware ? l : 0; }
  // Layer l's checkpoint tensors (worker/recompute.h: CheckpointTensor order), B·T·C each.
  std::array<kernels::cuda::bf16*, 3> checkpoint_of(const Lane& lane, int64_t l) const;
  void cpu_update(int64_t unit, kernels::AdamWStep step, float weight_decay);
  void run_cpu_tasks();
  void wait_cpu_idle();

  CudaDevice& device_;
  GptConfig c_;
  int64_t B_, T_;
  int64_t device_units_;
  int cpu_threads_;
  api::Recompute recompute_;
  GradientReducer* reducer_;
  StreamCollectives* tp_;
  int64_t t_ = 1, tr_ = 0;  // TP size and rank
  // Per rank: attention channels and heads, ffn units, vocabulary rows (from vocab_lo_, of which
  // vocab_valid_ are real tokens).
  int64_t Cl_ = 0, NHl_ = 0, Fl_ = 0, Vl_ = 0, vocab_lo_ = 0, vocab_valid_ = 0;
  std::unique_ptr<kernels::cuda::Context> ctx_;
  std::array<int64_t, kNumParamTensors> sizes_{};
  std::array<int64_t, kNumParamTensors> offsets_{};
  int64_t num_params_ = 0;
  std::vector<void*> allocations_, pinned_allocations_;
  // On the device the per-layer tensors hold only the first dev_layers_ layers (all of them
  // without window offload): sizes and offsets there.
  int64_t window_ = 0, dev_layers_ = 0, dev_params_ = 0;
  std::array<int64_t, kNumParamTensors> dsizes_{}, doffsets_{};
  std::array<int64_t, kNumParamTensors> slot_offsets_{};  // layer tensors within a slot
  int64_t slot_params_ = 0;
  std::vector<Slot> slots_;

  // Parameters: the bf16 copy and fp32 gradients of everything resident on the device (the
  // device layout above); fp32 master and moments of the device units, packed by the device
  // tensors list; of the host units, packed.
  kernels::cuda::bf16* params16_ = nullptr;
  float* grads_ = nullptr;
  float *dmaster_ = nullptr, *dm_ = nullptr, *dv_ = nullptr;
  std::vector<kernels::cuda::AdamWTensor> device_tensors_[2];  // [decays]
  std::vector<ParamSlice> device_slices_;                       // ranges, packed in this order
  int64_t device_packed_ = 0, host_packed_ = 0;
  float *hmaster_ = nullptr, *hm_ = nullptr, *hv_ = nullptr, *hgrads_ = nullptr;
  uint16_t* hparams16_ = nullptr;
  std::vector<Unit> units_;

  // One lane per sub-batch (Oases: with TP and 2 sub-batches each lane is half of the
  // micro-batch, and one lane's all-reduce runs while the other computes; else one lane): its
  // activations (bf16 unless named 32; per layer where indexed, one working set with recompute),
  // and the events of its all-reduce in flight.
  struct Lane {
    int64_t B = 0, row0 = 0;  // its sequences, and the first of them in the micro-batch
    std::vector<kernels::cuda::bf16*> res, ln1, qkv, atty, res2, ln2, fch, fchg;
    // The summed row-parallel outputs (proj_index): without commAware attproj[0] and fcproj[0]
    // are one buffer, as nothing reads either output after the residual add that follows it.
    std::vector<kernels::cuda::bf16*> attproj, fcproj;
    std::vector<float*> ln1_mean, ln1_rstd, ln2_mean, ln2_rstd, att, lse;
    kernels::cuda::bf16 *lnf = nullptr, *logits = nullptr, *dres = nullptr,
                        *dtmp_c = nullptr, *dtmp_3c = nullptr, *dtmp_f = nullptr;
    float *lnf_mean = nullptr, *lnf_rstd = nullptr, *ce_max = nullptr, *ce_sums = nullptr;
    std::unique_ptr<CudaEvent> partial, summed;  // its all-reduce's input written; result in place
    bool in_flight = false;  // an all-reduce was issued that the compute stream has not waited for
    // Window offload: the streamed layers' checkpoints (checkpoint_of) in pinned memory, layer
    // by layer; on the device a ring of 2 checkpoints (a streamed layer's res, attproj and fcproj
    // point into it), with its events: written, copied out, copied in, used by the backward.
    kernels::cuda::bf16* host_checkpoints = nullptr;
    std::array<std::unique_ptr<CudaEvent>, 2> ring_written, ring_out, ring_in, ring_used;
    std::array<int64_t, 2> ring_holds{-1, -1};  // the layer copied in (backward), else -1
  };
  std::vector<Lane> lanes_;
  bool flash_ = false;  // flash attention (else the materialised fp32 one)
  // Shared by the lanes (only compute-stream work uses them): attention scratch, the losses (B·T),
  // and the materialised attention's fp32 buffers (sized for the larger lane).
  void* attention_scratch_ = nullptr;
  float *losses_ = nullptr, *qkv32_ = nullptr, *atty32_ = nullptr, *preatt_ = nullptr,
        *datt_ = nullptr, *dpreatt_ = nullptr, *dqkv32_ = nullptr, *dc32_ = nullptr;
  double* norm_ = nullptr;  // device Σ g²
  int32_t* tokens_ = nullptr;  // inputs then targets, 2·B·T on the device
  // Pinned staging: two token buffers (inputs|targets) with their copy events; the loss sums.
  int32_t* token_staging_[2] = {nullptr, nullptr};
  std::unique_ptr<CudaEvent> staging_free_[2];
  int staging_next_ = 0;
  std::vector<float*> loss_host_;  // per micro-batch of the step: B·T losses (pinned)
  int64_t micro_ = 0;              // micro-batches since zero_grad
  double* norm_host_ = nullptr;

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

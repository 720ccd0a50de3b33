// GPT-2 on the CUDA device of a rank in bf16 mixed precision (docs/WORKER.md): bf16 weights and
// activations, fp32 gradients, fp32 master weights and AdamW moments. This file is the math: the
// activations, one layer's forward and backward, tensor parallelism and the Oases lanes. Where
// the parameters live, the optimizer step, data parallelism's gradient sums and the offload modes
// (optimizer: SynergyScale's CPU/GPU split; window: StrongHold's streaming) are the offload
// engine's (worker/cuda_offload.h, the counterpart of the CPU OffloadEngine); the model calls its
// hooks where the schedule reaches a unit, as the CPU model calls its UnitObserver.
//
// The parameter layout is the CPU model's (worker/gpt_layout.h), so seeds, checkpoints and llm.c
// files mean the same model on both.
// Attention is the flash-style bf16 kernel (kernels/cuda/flash_attention.cu: no T×T matrix; the
// rows' log-sum-exp kept per layer) for the head sizes it is built for (32, 64, 128), else the
// fp32 kernels' (the T×T matrix materialised per layer).
// Recompute (options.recompute): worker/recompute.h says what each mode keeps (both devices alike).
// Tensor parallelism (options.tp, Megatron's split, the CPU model's layout): each rank holds its
// heads of qkv and attproj, its ffn units of fc and fcproj and its rows of wte; the row-parallel
// outputs (attention projection, fc2) and the column-parallel input gradients (of qkv and fc, and
// the LM head's) are all-reduced in bf16 on the TP communication stream, the embedding and the
// cross-entropy are vocabulary-parallel. With options.sub_batches = 2 (Oases) the micro-batch is
// split in two lanes, interleaved op by op, so that each lane's all-reduce runs while the other
// lane computes.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "api/enums.h"
#include "kernels/cuda/ops.h"
#include "worker/cuda_device.h"
#include "worker/cuda_offload.h"
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
  // The distributed optimizer (ZeRO-1) over the reducer's group (worker/cuda_offload.h): each
  // rank keeps its shard of the masters and moments; needs every unit on the device.
  bool distributed_optimizer = false;
  // worker/recompute.h. The re-run of kFull skips fc2's GEMM too: the backward reads neither its
  // output nor the residual sum after it (the next layer's input is kept).
  api::Recompute recompute = api::Recompute::kNone;
  // Tensor parallelism (Megatron): this rank's group; nullptr = TP 1. The model then holds rank
  // r's slices (gpt_rank_views) and all-reduces activations on the TP communication stream.
  StreamCollectives* tp = nullptr;
  // With TP, 2: the Oases schedule (two half micro-batches, one's all-reduces overlapping the
  // other's compute; B must be even). 1 otherwise (and always at TP 1).
  int sub_batches = 1;
  // Pipeline parallelism (worker/gpt_layout.h): this rank's stage, whose layers the config
  // counts; every unit on the device (no offload). `embedding`: the first and the last stage's
  // group, over which they sum the tied embeddings' unit (null elsewhere and without stages).
  PipelineStage stage;
  GradientReducer* embedding = nullptr;
  // A cutpoint's segment (worker/cuda_cutpoint.h): unit 0's gradients are summed by the caller
  // (add_unit0_gradients, take_unit0_gradients), not over the reducer's group.
  bool unit0_elsewhere = false;
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

  int64_t num_parameters() const { return engine_->layout().params; }
  const std::array<int64_t, kNumParamTensors>& param_sizes() const {
    return engine_->layout().sizes;
  }
  int64_t batch() const { return B_; }
  int64_t num_layers() const { return c_.layers; }
  int64_t channels() const { return c_.channels; }
  int64_t seq_len() const { return T_; }
  int64_t device_units() const { return engine_->device_units(); }
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
  // The fp32 gradients accumulated so far (num_parameters() floats; waits for queued work): with
  // DP the sums, except with the distributed optimizer (this rank's own; the sums are sharded).
  // get_parameters and get_moments gather the shards: every DP rank calls them together.
  void get_gradients(float* host);

  // Starts an accumulation: gradients and the loss sum are zeroed.
  void zero_grad();
  // Enqueues forward and backward of one micro-batch (inputs and targets: B·T host tokens);
  // parameter gradients accumulate, scaled by `loss_scale` (1/accumulation steps for a mean).
  // `last`: the last micro-batch of the step (its backward starts the gradient copies of the
  // CPU-updated units).
  void train_micro_step(const int32_t* inputs, const int32_t* targets, float loss_scale,
                        bool last);
  // The same in two halves, for pipeline stages (1F1B runs other micro-batches between a
  // micro-batch's forward and its backward). `slot` < stage.in_flight holds the micro-batch's
  // activations and tokens from its forward to its backward. Activations and their gradients
  // between stages are B·T·C bf16 on the device, read and written in the compute stream's order:
  // a stage after the first reads `input` (the caller made the compute stream wait for it), a
  // stage before the last writes `output`; in the backward, a stage before the last reads
  // `output_grad`, one after the first writes `input_grad`. The last stage's backward must follow
  // its forward of the same slot directly (1F1B does). `last`: the step's last micro-batch.
  void forward_micro(int slot, const int32_t* inputs, const int32_t* targets, float loss_scale,
                     const kernels::cuda::bf16* input = nullptr,
                     kernels::cuda::bf16* output = nullptr);
  void backward_micro(int slot, bool last, const kernels::cuda::bf16* output_grad = nullptr,
                      kernels::cuda::bf16* input_grad = nullptr);
  const PipelineStage& stage() const { return stage_; }
  // A cutpoint's segments (worker/cuda_cutpoint.h), on the compute stream after the backward:
  // unit 0's gradients (wte, wpe, lnfw, lnfb) in their logical layout — the unsharded tensors
  // one after another, unit0_floats() of them, on the device. add_unit0_gradients adds this
  // rank's slices into `logical` (a replicated tensor from TP rank 0 only, so that a sum over
  // every rank counts it once per TP group); take_unit0_gradients copies them back out of it
  // (and the distributed optimizer's shard takes its part).
  int64_t unit0_floats() const;
  void add_unit0_gradients(float* logical);
  void take_unit0_gradients(const float* logical);
  // Mean loss of the micro-batches since zero_grad (waits for them; 0 on a stage before the
  // last).
  double mean_loss();
  // Σ g² over every gradient, in double (waits for the backward).
  double grad_sum_of_squares();
  // The same split into the TP-sharded tensors' (sum those over the TP group) and the replicated
  // ones' (the same on every TP rank). With the distributed optimizer: this rank's shards' (sum
  // both over the DP group too).
  void grad_sums_of_squares(double* sharded, double* replicated);
  bool distributed_optimizer() const { return engine_->distributed_optimizer(); }
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
  int64_t h2d_bytes() const { return engine_->h2d_bytes(); }
  int64_t d2h_bytes() const { return engine_->d2h_bytes(); }
  double cpu_optimizer_seconds() const { return engine_->cpu_optimizer_seconds(); }

 private:
  struct Lane;  // below
  void allocate();
  // A layer's weights and gradients wherever they live (worker/cuda_offload.h).
  const kernels::cuda::bf16* w(int tensor, int64_t l) { return engine_->layer_weight(tensor, l); }
  float* g(int tensor, int64_t l) { return engine_->layer_grad(tensor, l); }
  // A tensor that is not per layer: its bf16 weights and its gradients on the device.
  const kernels::cuda::bf16* w(int tensor) const {
    return engine_->params16() + engine_->layout().doffsets[tensor];
  }
  float* g(int tensor) const { return engine_->grads() + engine_->layout().doffsets[tensor]; }
  // A lane's forward and backward pieces (cuda_gpt.cpp lists the schedule).
  void attention_forward(Lane& lane, int64_t l, bool rerun);
  void mlp_forward(Lane& lane, int64_t l, bool rerun);
  void rerun_layer(Lane& lane, int64_t l);
  void mlp_backward(Lane& lane, int64_t l);
  void attention_backward(Lane& lane, int64_t l);
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

  // Pipeline stages: the slot whose lanes and tokens the ops use.
  void use_slot(int slot);
  std::vector<Lane>& lanes() { return slots_[static_cast<size_t>(active_slot_)]; }

  CudaDevice& device_;
  GptConfig c_;
  PipelineStage stage_;
  int64_t B_, T_;
  api::Recompute recompute_;
  StreamCollectives* tp_;
  int64_t t_ = 1, tr_ = 0;  // TP size and rank
  // Per rank: attention channels and heads, ffn units, vocabulary rows (from vocab_lo_, of which
  // vocab_valid_ are real tokens).
  int64_t Cl_ = 0, NHl_ = 0, Fl_ = 0, Vl_ = 0, vocab_lo_ = 0, vocab_valid_ = 0;
  // The activations' memory is declared first, so it goes last: after the engine (parameters,
  // optimizer, offload lanes) and the context its AdamW and casts run on (~CudaGpt).
  CudaAllocations memory_;
  std::unique_ptr<kernels::cuda::Context> ctx_;
  std::unique_ptr<CudaOffloadEngine> engine_;

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
    int index = 0;  // its checkpoint ring in the engine
  };
  // The lanes of each micro-batch in flight (one slot without stages). A slot after the first
  // has its own activations, and shares the first's scratch (the activation gradients, the
  // logits, the cross-entropy's buffers), which no micro-batch keeps from forward to backward.
  std::vector<std::vector<Lane>> slots_;
  int active_slot_ = 0;
  bool flash_ = false;  // flash attention (else the materialised fp32 one)
  // Shared by the lanes (only compute-stream work uses them): attention scratch, the losses (B·T),
  // and the materialised attention's fp32 buffers (sized for the larger lane).
  void* attention_scratch_ = nullptr;
  float *losses_ = nullptr, *qkv32_ = nullptr, *atty32_ = nullptr, *preatt_ = nullptr,
        *datt_ = nullptr, *dpreatt_ = nullptr, *dqkv32_ = nullptr, *dc32_ = nullptr;
  double* norm_ = nullptr;  // device Σ g²
  int32_t* tokens_ = nullptr;  // the active slot's inputs then targets, 2·B·T on the device
  std::vector<int32_t*> slot_tokens_;
  // Pinned staging: two token buffers (inputs|targets) with their copy events; the loss sums.
  int32_t* token_staging_[2] = {nullptr, nullptr};
  std::unique_ptr<CudaEvent> staging_free_[2];
  int staging_next_ = 0;
  std::vector<float*> loss_host_;  // per micro-batch of the step: B·T losses (pinned)
  int64_t micro_ = 0;              // losses since zero_grad (the last stage's micro-batches)
  int64_t backwards_ = 0;          // backward passes since zero_grad
  double* norm_host_ = nullptr;
};

}  // namespace kt::worker

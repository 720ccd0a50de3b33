// GPT-2 on one rank, llm.c style: one allocation for all parameters (in llm.c's order and shapes,
// so llm.c checkpoints import and export), one for their gradients, one for the activations of a
// B×T batch and one for the activations' gradients. Letters: B batch, T time, C channels, L
// layers, NH heads, F ffn hidden, V vocabulary, Vp padded vocabulary.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "api/enums.h"
#include "api/model.h"
#include "worker/comm.h"
#include "worker/device.h"
#include "worker/gpt_layout.h"
#include "worker/recompute.h"
#include "worker/tensor_view.h"

namespace kt::worker {

// GptConfig and the parameter table (kParams): worker/gpt_layout.h.

// Tensor parallelism in Megatron's layout (Shoeybi et al. 2019): qkv and fc are column-parallel
// (each rank holds NH/t heads and F/t hidden units), attention projection and fc2 row-parallel
// (partial sums all-reduced; their biases added once, by TP rank 0), the token embedding and LM
// head vocab-parallel (Vp/t rows each) with a vocab-parallel cross-entropy. LayerNorms, wpe and
// the row-parallel biases are replicated. Per layer and micro-batch: 2 all-reduces forward and 2
// backward, plus one for the embedding and one for the LM head's input gradient, plus two small
// ones (B·T and 2·B·T floats) for the cross-entropy's max and sums.
struct TensorParallel {
  int rank = 0;
  int size = 1;
  Communicator* group = nullptr;  // required when size > 1
};

class Gpt {
 public:
  // `sub_batches` = 2 splits every micro-batch in two halves whose TP all-reduces overlap the
  // other half's compute (Oases); B must then be even. Results equal sub_batches = 1 up to
  // floating-point reassociation.
  // `recompute`: what each mode keeps is worker/recompute.h (the same on both devices). kFull's
  // re-run here includes fc2 with its all-reduce (2 per layer, as the planner counts). With
  // recompute, one layer's working set is shared by all layers.
  // `precision` bf16: every matmul runs in bf16 (kernels::cpu::matmul_*_bf16) on a bf16 copy of
  // the matmul weights; its inputs are rounded to bf16 on the way in, products summed in fp32.
  // Everything else (LayerNorm, GELU, attention, the loss, gradients, AdamW) stays fp32. The
  // copy of a unit is made from the fp32 parameters (the master weights) by the first forward of
  // a step (after zero_grad) or of an evaluate, unless the optimizer already wrote it
  // (bf16_written) after the last step.
  Gpt(const GptConfig& config, int64_t B, int64_t T, std::shared_ptr<Device> device,
      TensorParallel tp = {}, int sub_batches = 1, api::Recompute recompute = api::Recompute::kNone,
      api::Precision precision = api::Precision::kFp32, PipelineStage stage = {});

  // GPT-2's initialisation (Radford et al. 2019; llm.c): weights N(0, 0.02), the residual
  // projections (attprojw, fcprojw) N(0, 0.02/√(2L)), biases 0, LayerNorm weights 1. A TP rank
  // draws the whole logical tensor and keeps its slice, so every TP degree starts from the same
  // model.
  void init_weights(uint64_t seed);

  // Forward on inputs (B,T) → mean loss over targets (B,T).
  float evaluate(const int32_t* inputs, const int32_t* targets);
  // Forward and backward of one micro-batch; parameter gradients are ACCUMULATED, each scaled by
  // `loss_scale` (1 / gradient-accumulation steps for a mean over the whole step). Returns the
  // micro-batch's mean loss.
  float train_micro_step(const int32_t* inputs, const int32_t* targets, float loss_scale);
  // The same in two halves, for pipeline stages (1F1B runs a micro-batch's forward and backward
  // apart, other micro-batches between them). `slot` < in_flight holds the micro-batch's
  // activations from its forward to its backward; inputs and targets must stay valid until then.
  // A stage after the first reads its input activations (B,T,C) from `input`; a stage before
  // the last writes its output (B,T,C) to `output` and returns 0 (the last returns the loss).
  // The last stage's backward must follow its forward of the same slot directly (1F1B does).
  float forward_micro(int slot, const int32_t* inputs, const int32_t* targets, float loss_scale,
                      const float* input = nullptr, float* output = nullptr);
  // A stage before the last reads the gradient of its output from `output_grad`; a stage after
  // the first writes the gradient of its input to `input_grad`. Calls grads_final(0) at the end.
  void backward_micro(int slot, const float* output_grad = nullptr, float* input_grad = nullptr);
  const PipelineStage& stage() const { return stage_; }
  // The slot whose activations the lanes hold: the last forward_micro's or backward_micro's.
  int active_slot() const { return active_slot_; }
  // Starts a new accumulation: the small tensors are zeroed now; the matmul weights' gradients
  // are overwritten (not accumulated) by the next backward, which saves a 4·P-byte memset.
  void zero_grad();
  // The offload engine's view of the schedule, by offload unit (0: embeddings, wpe and the final
  // LayerNorm; l + 1: layer l). Every op reads the parameters of exactly one unit. before_*(u)
  // runs before the first op of unit u in a pass (any sub-batch), after_forward(u) once every
  // sub-batch's last forward op of u has run and its all-reduce is done, so u's activations are
  // final. Null: no calls.
  struct UnitObserver {
    virtual ~UnitObserver() = default;
    // Before the first op of unit u in the forward (lane 0 is about to run it).
    virtual void before_forward(int64_t unit) = 0;
    // No op of this forward reads unit u's parameters any more (its last op ran on every lane).
    virtual void forward_params_done(int64_t unit) = 0;
    // Unit u's activations of this forward are final (every lane's all-reduces done).
    virtual void forward_activations_done(int64_t unit) = 0;
    // Before the first op of unit u in the backward.
    virtual void before_backward(int64_t unit) = 0;
    // Unit u's parameter gradients of this micro-batch are complete (every sub-batch's backward
    // through it ran): a layer's after its ln1 backward, so that its data-parallel all-reduce
    // starts while the backward goes on through the layers below; unit 0's at the end.
    virtual void grads_final(int64_t unit) = 0;
  };
  UnitObserver* unit_observer = nullptr;
  // The slices of layer l's activation checkpoint (worker/recompute.h: its input; with commAware
  // also its summed attention projection and fc2 outputs), over every sub-batch. Empty without
  // recompute.
  std::vector<std::pair<float*, int64_t>> layer_checkpoint_slices(int64_t l) const;
  // The pieces of layer l's parameters (one slice of each stacked per-layer tensor), and those of
  // the embedding unit (wte, wpe, lnfw, lnfb), with the tensor index of each piece.
  using Slice = ParamSlice;
  std::vector<Slice> unit_slices(int64_t unit) const;
  // The pieces of layer l's gradients (one slice of each stacked per-layer tensor).
  std::vector<std::pair<float*, int64_t>> layer_gradient_slices(int64_t l) const;

  // bf16 plans: the bf16 copy (at the fp32 parameters' offsets; null in fp32), and the
  // optimizer's word that it wrote unit u's copy from the parameters it just updated, so that the
  // next step's forward need not round them again.
  uint16_t* bf16_weights() const { return bf16_weights_; }
  void bf16_written(int64_t unit) {
    if (bf16_weights_) bf16_epoch_[unit] = epoch_ + 1;
  }

  const GptConfig& config() const { return config_; }
  api::Precision precision() const {
    return bf16_weights_ ? api::Precision::kBf16 : api::Precision::kFp32;
  }
  const std::shared_ptr<Device>& device() const { return device_; }
  int64_t batch() const { return B_; }
  int64_t seq_len() const { return T_; }
  int64_t num_parameters() const { return num_params_; }
  float* params() const { return params_.data(); }
  float* grads() const { return grads_.data(); }
  // Views of the 16 tensors of the parameters (or of their gradients), llm.c's order and shapes;
  // with TP > 1 the sharded ones carry their slice of the logical tensor (qkv as (L, 3, C, C)).
  std::vector<TensorView> parameter_views() const { return views(params_.data()); }
  std::vector<TensorView> gradient_views() const { return views(grads_.data()); }
  // Same layout over an external buffer of num_parameters() floats (AdamW moments).
  std::vector<TensorView> views(float* base) const;
  // Whether AdamW decays a tensor: matrices yes, biases and LayerNorm parameters no.
  static bool decays(int tensor_index);
  // Whether a tensor is split across TP ranks (else every TP rank holds the same values).
  bool sharded(int tensor_index) const;
  const TensorParallel& tensor_parallel() const { return tp_; }
  // Training FLOPs of one B×T micro-batch (forward + backward): 6·P·BT + attention 12·L·C·T·BT.
  double flops_per_micro_step() const;

 private:
  struct Params;  // pointers into params_ (or grads_)
  struct Acts;    // pointers into an activation buffer
  // One sub-batch in flight: its activations, their gradients, and its pending all-reduce.
  struct Lane {
    int64_t B = 0;
    DeviceBuffer acts, grad_acts;
    std::vector<float> ce_scratch;  // vocab-parallel cross-entropy: max, sums, target logits
    const int32_t* inputs = nullptr;
    const int32_t* targets = nullptr;
    float dloss = 0;         // d(loss)/d(token loss); 0: forward only
    bool accumulate = true;  // weight gradients: accumulate (else overwrite)
    float mean_loss = 0;
    std::shared_ptr<CommWork> pending;
    // Pipeline stages: this lane's rows of the stage's input and output activations and of
    // their gradients.
    const float* stage_input = nullptr;
    float* stage_output = nullptr;
    const float* stage_output_grad = nullptr;
    float* stage_input_grad = nullptr;
  };
  // Pipeline stages: the lanes' activations of the micro-batches in flight, by slot (the active
  // slot's are in the lanes, its entry here empty), and each slot's tokens.
  void use_slot(int slot);
  std::vector<std::vector<DeviceBuffer>> slot_acts_;
  std::vector<std::pair<const int32_t*, const int32_t*>> slot_tokens_;
  int active_slot_ = 0;
  PipelineStage stage_;
  Params params_at(float* base) const;
  Acts acts_at(const Lane& lane, float* base) const;
  std::array<int64_t, 22> lane_activation_sizes(const Lane& lane) const;
  // The forward and backward passes as sequences of ops; op k of a lane returns the buffer to
  // all-reduce over the TP group after it (or {nullptr, 0}). Op k+1 of a lane starts only when
  // that all-reduce is done; with two lanes, one lane's all-reduce runs while the other lane
  // computes (the Oases schedule).
  int64_t forward_ops() const { return 2 * config_.layers + 2; }
  int64_t backward_ops() const {
    return (recompute_ == api::Recompute::kNone ? 3 : 5) * config_.layers + 3;
  }
  // The offload unit op k of a pass reads (0: embeddings and head, l + 1: layer l).
  int64_t op_unit(bool backward, int64_t k) const;
  // Layer l's offset (in layers) into a working-set tensor and into attproj/fcproj.
  int64_t slot(int64_t l) const { return recompute_ == api::Recompute::kNone ? l : 0; }
  int64_t proj_slot(int64_t l) const { return recompute_ == api::Recompute::kFull ? 0 : l; }
  std::pair<float*, int64_t> attention_forward_block(Lane& lane, int64_t l, bool project);
  std::pair<float*, int64_t> mlp_forward_block(Lane& lane, int64_t l, bool project);
  std::pair<float*, int64_t> layer_backward_op(Lane& lane, int64_t l, bool mlp_half);
  void ln1_backward(Lane& lane, int64_t l);
  void zero_working_set_grads(Lane& lane);
  std::pair<float*, int64_t> forward_op(Lane& lane, int64_t k);
  std::pair<float*, int64_t> backward_op(Lane& lane, int64_t k);
  void run(bool backward);
  void start(const int32_t* inputs, const int32_t* targets, float dloss);
  float finish_loss();
  void tp_allreduce(float* data, int64_t count, ReduceOp op = ReduceOp::kSum);
  void vocab_parallel_cross_entropy(Lane& lane, float* losses, float* dlogits, const float* logits);
  // The matmuls, in the model's precision; `weight` points into params_.
  void gemm_forward(float* out, const float* inp, const float* weight, const float* bias,
                    int64_t BT, int64_t C, int64_t OC) const;
  void gemm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int64_t BT, int64_t C, int64_t OC,
                     bool accumulate) const;
  // bf16: rounds unit u's matmul weights into the bf16 copy unless it is current.
  void refresh_bf16(int64_t unit);

  GptConfig config_;
  int64_t B_, T_;
  std::shared_ptr<Device> device_;
  TensorParallel tp_;
  api::Recompute recompute_;
  // Per-rank dims: attention channels C/t, heads NH/t, ffn F/t, vocabulary rows Vp/t.
  int64_t Cl_ = 0, NHl_ = 0, Fl_ = 0, Vl_ = 0, vocab_offset_ = 0;
  std::array<int64_t, kNumParamTensors> param_sizes_{};
  int64_t num_params_ = 0;
  DeviceBuffer params_, grads_;
  // bf16: the matmul weights' bf16 copy at the fp32 offsets (2 bytes per parameter, held in a
  // float buffer of half the count so the device counts it). A unit's copy is current while its
  // epoch equals epoch_, which every zero_grad and evaluate advances.
  DeviceBuffer bf16_buffer_;
  uint16_t* bf16_weights_ = nullptr;
  std::vector<int64_t> bf16_epoch_;
  int64_t epoch_ = 0;
  std::vector<Lane> lanes_;
  bool overwrite_weight_grads_ = false;  // set by zero_grad, cleared by the next backward
};

}  // namespace kt::worker

// Oases' cutpoint on CUDA ranks (docs/WORKER.md, "Cutpoints on CUDA ranks"): the CPU worker's
// scheme (worker/cutpoint.h) with the activations on the device. The two segments are CudaGpts
// built as the two stages of a pipeline on one rank — layers [0, k) at TP t₁ with the
// embeddings, layers [k, L) at TP t₂ with the LM head — each with its own TP collectives and DP
// reducer; this class joins them:
//   * at the cut, the first segment's output (B₁·T·C bf16, the same on its t₁ TP ranks) becomes
//     the second's input: all-gathered on the device over the cut group where TP widens (the
//     wider group computes the B₂ = B₁·t₂/t₁ sequences of the t₂/t₁ narrower groups together),
//     the rank's block of it where TP narrows. The backward mirrors it: the second segment's
//     input gradient is the rank's block of the first's output gradient, or all-gathered into
//     it. The tokens follow on the host (the second segment's loss needs its targets).
//   * the tied embedding: each segment holds its own copy of unit 0 (wte in its TP layout). After
//     the step's last backward, both add their gradients into one device buffer of the logical
//     tensors, which is summed over every rank of the job (one all-reduce: both TP layouts and
//     every data-parallel replica at once), and both take their slices back, so that both copies
//     get the same gradients and, through the same AdamW, stay equal.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "worker/cuda_gpt.h"
#include "worker/cutpoint_tokens.h"

namespace kt::worker {

// Unit 0's gradients of `models` (a cutpoint's segments; with per-stage TP, the first or the
// last stage's model) summed as logical tensors over `group` (the world; both end stages'
// ranks), written back into each: `logical` (unit0_floats() on the device) is scratch, `ready`
// an event of the caller's. On the compute stream.
void sum_unit0_on_device(const std::vector<CudaGpt*>& models, CudaDevice& device,
                         GradientReducer& group, float* logical, CudaEvent& ready);

class CudaCutpoint {
 public:
  // `before` and `after`: the segments (after's micro-batch B₂); `cut_comm`: the rank's cut
  // group (the tokens, on the host); `cut`: the same group's device all-gathers; `world`: the
  // device sum of unit 0 over every rank. NCCL's operations of every group run on one stream
  // (the trainer's choice), so the ranks' collectives cannot cross.
  CudaCutpoint(CudaGpt& before, CudaGpt& after, CudaDevice& device, Communicator& cut_comm,
               GradientReducer& cut, GradientReducer& world);
  ~CudaCutpoint();
  CudaCutpoint(const CudaCutpoint&) = delete;
  CudaCutpoint& operator=(const CudaCutpoint&) = delete;

  // One micro-batch of B₁ sequences (host tokens) through both segments: the first's forward, the
  // cut, the second's forward and backward, the cut back, the first's backward. Gradients
  // accumulate as CudaGpt::train_micro_step's; `loss_scale` is the second segment's
  // (1/(accumulation · its DP degree)); `last`: the step's last micro-batch. The loss is
  // after.mean_loss().
  void micro_step(const int32_t* inputs, const int32_t* targets, float loss_scale, bool last);
  // After the step's last micro-batch, before the norm: unit 0's gradients summed over the world
  // in both segments.
  void sum_unit0();

 private:
  CudaGpt &before_, &after_;
  CudaDevice& device_;
  GradientReducer &cut_, &world_;
  bool widens_;
  int64_t n1_, n2_;  // activations before and after the cut: B₁·T·C, B₂·T·C
  CutpointTokens tokens_;
  std::vector<int32_t> inputs2_, targets2_;
  CudaAllocations memory_;
  kernels::cuda::bf16 *out1_ = nullptr, *in2_ = nullptr, *grad_in2_ = nullptr,
                      *grad_out1_ = nullptr;
  float* unit0_ = nullptr;
  std::unique_ptr<CudaEvent> ready_, done_;
};

}  // namespace kt::worker

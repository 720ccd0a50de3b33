// Oases' cutpoint (Li et al. 2023, §4) on one rank: the model in two segments with different
// tensor-parallel degrees over the same ranks — layers [0, k) at TP t₁ (DP world/t₁), layers
// [k, L) at TP t₂ (DP world/t₂). Each segment is a Gpt built as a pipeline stage of the whole
// model (the first holds the embeddings, the second the LM head) with its own TP and DP groups
// and its own offload engine; this file is what joins them:
//   * the activations at the cut: the first segment's output of B₁ sequences is the same on its
//     t₁ TP ranks. Where the TP group widens (t₂ > t₁) a rank all-gathers it over the cut group
//     (comm.h: the t₂/t₁ ranks of its t₂-run with the same rank % t₁), whose samples the wider
//     group computes together: B₂ = B₁·t₂/t₁ sequences. Where it narrows (t₂ < t₁) each of the
//     t₁/t₂ groups after the cut takes its part of the B₁ sequences. The backward mirrors it: the
//     input gradient of the second segment (the same on its TP ranks) is sliced, or all-gathered.
//     The tokens follow the activations (the second segment's loss needs its targets).
//   * the tied embedding: wte is held twice on every rank, rows of Vp/t₁ for the embedding and
//     rows of Vp/t₂ for the LM head. Their gradients, with wpe's and the final LayerNorm's, are
//     summed into one buffer of the logical (unsharded) tensors over every rank of the job, each
//     segment adding its slices (a replicated tensor from TP rank 0 only): that is the sum over
//     both TP layouts and every data-parallel replica at once. Each segment then takes its
//     slices back, so both copies get the same gradients and (through the same AdamW) stay equal.
#pragma once

#include <cstdint>
#include <vector>

#include "worker/comm.h"
#include "worker/cutpoint_tokens.h"
#include "worker/gpt.h"

namespace kt::worker {

class CutpointReshard {
 public:
  // `cut`: the rank's cut group; `tp`, `cut_tp`: the TP degrees before and after the cut; B₁×T:
  // the micro-batch before the cut, C the channels.
  CutpointReshard(Communicator& cut, int64_t tp, int64_t cut_tp, int64_t B1, int64_t T,
                  int64_t C);
  int64_t batch_before() const { return B1_; }
  int64_t batch_after() const { return B2_; }
  // One micro-batch of B₁ sequences through both segments: the first's forward, the cut, the
  // second's forward and backward, the cut back, the first's backward. Parameter gradients
  // accumulate as Gpt::train_micro_step's; `loss_scale` is the second segment's (1/(accumulation
  // · its DP degree)). Returns the second segment's mean loss over its B₂ sequences.
  float micro_step(Gpt& before, Gpt& after, const int32_t* inputs, const int32_t* targets,
                   float loss_scale);
  // The first segment's output (B₁·T·C) → the second's input (B₂·T·C); the tokens (B₁·T each)
  // likewise.
  void activations(const float* before, float* after);
  void tokens(const int32_t* inputs, const int32_t* targets, int32_t* inputs_after,
              int32_t* targets_after);
  // A micro-batch's tokens replaced by those after the cut.
  void tokens(std::vector<int32_t>& inputs, std::vector<int32_t>& targets) {
    tokens_.reshard(inputs, targets);
  }
  // The second segment's input gradient (B₂·T·C) → the first's output gradient (B₁·T·C).
  void gradients(const float* after, float* before);

 private:
  Communicator& cut_;
  bool widens_;
  int64_t B1_, B2_, T_, C_;
  CutpointTokens tokens_;
  std::vector<int32_t> inputs2_, targets2_;
  std::vector<float> out1_, in2_, grad_in2_, grad_out1_;
};

// Sums the gradients of the tensors that are not per layer (wte, wpe, lnfw, lnfb) of `models`
// (a cutpoint's two segments; with per-stage TP, the first or the last stage's model) over
// `group` (the world; the embedding group of both stages' ranks) as above, and writes the sums
// back into each. `buffer`: scratch of the logical tensors' size, kept between steps.
void sum_unit0(const std::vector<Gpt*>& models, Communicator& group, std::vector<float>& buffer);

}  // namespace kt::worker

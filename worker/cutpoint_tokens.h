// The tokens at a cutpoint (worker/cutpoint.h, worker/cuda_cutpoint.h): the second segment's
// loss needs the targets of the sequences it computes, which follow the activations across the
// cut — all-gathered over the cut group where TP widens (each rank's B₁ sequences in cut-group
// rank order), the rank's block of them where it narrows. Header-only: the CPU model's cutpoint
// and the CUDA one (whose GPU-only build has no CPU model) share it.
#pragma once

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "worker/comm.h"

namespace kt::worker {

class CutpointTokens {
 public:
  // `n1`, `n2`: tokens per micro-batch before and after the cut (B₁·T, B₂·T).
  CutpointTokens(Communicator& cut, bool widens, int64_t n1, int64_t n2)
      : cut_(cut), widens_(widens), n1_(n1), n2_(n2) {}

  // A micro-batch's inputs and targets replaced by those after the cut.
  void reshard(std::vector<int32_t>& inputs, std::vector<int32_t>& targets) {
    std::vector<int32_t> inputs_after(static_cast<size_t>(n2_)), targets_after(inputs_after.size());
    reshard(inputs.data(), targets.data(), inputs_after.data(), targets_after.data());
    inputs = std::move(inputs_after);
    targets = std::move(targets_after);
  }
  // B₁·T inputs and targets → B₂·T of each.
  void reshard(const int32_t* inputs, const int32_t* targets, int32_t* inputs_after,
               int32_t* targets_after) {
    if (!widens_) {
      for (auto [from, to] : {std::pair{inputs, inputs_after}, {targets, targets_after}})
        std::memcpy(to, from + cut_.rank() * n2_, static_cast<size_t>(n2_) * sizeof(int32_t));
      return;
    }
    // As floats, exact below 2²⁴ (vocabularies are bounded far below: api::ModelLimits), in one
    // all-gather: each rank's inputs then targets.
    in_.resize(static_cast<size_t>(2 * n1_));
    out_.resize(static_cast<size_t>(2 * n2_));
    for (int64_t i = 0; i < n1_; ++i) {
      in_[static_cast<size_t>(i)] = static_cast<float>(inputs[i]);
      in_[static_cast<size_t>(n1_ + i)] = static_cast<float>(targets[i]);
    }
    cut_.allgather(in_.data(), out_.data(), static_cast<size_t>(2 * n1_));
    for (int64_t r = 0; r < cut_.size(); ++r)
      for (int64_t i = 0; i < n1_; ++i) {
        inputs_after[r * n1_ + i] =
            static_cast<int32_t>(out_[static_cast<size_t>(2 * r * n1_ + i)]);
        targets_after[r * n1_ + i] =
            static_cast<int32_t>(out_[static_cast<size_t>(2 * r * n1_ + n1_ + i)]);
      }
  }

 private:
  Communicator& cut_;
  bool widens_;
  int64_t n1_, n2_;
  std::vector<float> in_, out_;
};

}  // namespace kt::worker

#include "worker/cutpoint.h"

#include <algorithm>
#include <cstring>

#include "api/error.h"

namespace kt::worker {

CutpointReshard::CutpointReshard(Communicator& cut, int64_t tp, int64_t cut_tp, int64_t B1,
                                 int64_t T, int64_t C)
    : cut_(cut),
      widens_(cut_tp > tp),
      B1_(B1),
      B2_(B1 * cut_tp / tp),
      T_(T),
      C_(C),
      tokens_(cut, widens_, B1_ * T_, B2_ * T_) {
  KT_CHECK(cut_tp != tp && B2_ * tp == B1 * cut_tp, "a cutpoint changes TP and splits the batch");
  KT_CHECK(cut.size() == std::max(tp, cut_tp) / std::min(tp, cut_tp),
           "the cut group joins the samples of max(tp, cut_tp) / min(tp, cut_tp) TP groups");
}

float CutpointReshard::micro_step(Gpt& before, Gpt& after, const int32_t* inputs,
                                  const int32_t* targets, float loss_scale) {
  const size_t n1 = static_cast<size_t>(B1_ * T_), n2 = static_cast<size_t>(B2_ * T_);
  inputs2_.resize(n2);
  targets2_.resize(n2);
  for (auto* b : {&out1_, &grad_out1_}) b->resize(n1 * static_cast<size_t>(C_));
  for (auto* b : {&in2_, &grad_in2_}) b->resize(n2 * static_cast<size_t>(C_));
  before.forward_micro(0, inputs, targets, loss_scale, nullptr, out1_.data());
  tokens(inputs, targets, inputs2_.data(), targets2_.data());
  activations(out1_.data(), in2_.data());
  const float loss =
      after.forward_micro(0, inputs2_.data(), targets2_.data(), loss_scale, in2_.data(), nullptr);
  after.backward_micro(0, nullptr, grad_in2_.data());
  gradients(grad_in2_.data(), grad_out1_.data());
  before.backward_micro(0, grad_out1_.data(), nullptr);
  return loss;
}

void CutpointReshard::activations(const float* before, float* after) {
  const int64_t n2 = B2_ * T_ * C_;
  if (widens_)
    cut_.allgather(before, after, static_cast<size_t>(B1_ * T_ * C_));
  else
    std::memcpy(after, before + cut_.rank() * n2, static_cast<size_t>(n2) * sizeof(float));
}

void CutpointReshard::gradients(const float* after, float* before) {
  const int64_t n1 = B1_ * T_ * C_;
  if (widens_)
    std::memcpy(before, after + cut_.rank() * n1, static_cast<size_t>(n1) * sizeof(float));
  else
    cut_.allgather(after, before, static_cast<size_t>(B2_ * T_ * C_));
}

void CutpointReshard::tokens(const int32_t* inputs, const int32_t* targets, int32_t* inputs_after,
                             int32_t* targets_after) {
  tokens_.reshard(inputs, targets, inputs_after, targets_after);
}

namespace {

// Where each tensor that is not per layer starts in the logical buffer, and its rows' length:
// wte (Vp, C), wpe (T, C), lnfw (C), lnfb (C) in kParams order.
struct Unit0Layout {
  std::vector<int> tensors;
  std::vector<int64_t> base, row;
  int64_t floats = 0;
};

Unit0Layout unit0_layout(const Gpt& model) {
  Unit0Layout layout;
  const auto views = model.gradient_views();
  for (int i = 0; i < kNumParamTensors; ++i) {
    if (kParams[static_cast<size_t>(i)].per_layer) continue;
    const TensorView& v = views[static_cast<size_t>(i)];
    const auto& shape = v.logical_shape.empty() ? v.shape : v.logical_shape;
    int64_t n = 1, row = 1;
    for (size_t d = 0; d < shape.size(); ++d) {
      n *= shape[d];
      if (d > 0) row *= shape[d];
    }
    layout.tensors.push_back(i);
    layout.base.push_back(layout.floats);
    layout.row.push_back(row);
    layout.floats += n;
  }
  return layout;
}

// Where a view's slice starts in its logical tensor (slices of these tensors are whole rows).
int64_t slice_start(const TensorView& v, int64_t row) {
  if (v.offset.empty()) return 0;
  for (size_t d = 1; d < v.offset.size(); ++d)
    KT_CHECK(v.offset[d] == 0 && v.shape[d] == v.logical_shape[d],
             "a tensor that is not per layer is split by rows only");
  return v.offset[0] * row;
}

}  // namespace

void sum_unit0(const std::vector<Gpt*>& models, Communicator& group, std::vector<float>& buffer) {
  const Unit0Layout layout = unit0_layout(*models.front());
  buffer.assign(static_cast<size_t>(layout.floats), 0.0f);
  for (Gpt* model : models) {
    const auto views = model->gradient_views();
    for (size_t k = 0; k < layout.tensors.size(); ++k) {
      const int i = layout.tensors[k];
      // A replicated tensor is the same on every TP rank: counted once per TP group.
      if (!model->sharded(i) && model->tensor_parallel().rank != 0) continue;
      const TensorView& v = views[static_cast<size_t>(i)];
      float* to = buffer.data() + layout.base[k] + slice_start(v, layout.row[k]);
      for (int64_t j = 0; j < v.numel(); ++j) to[j] += v.data[j];
    }
  }
  group.allreduce(buffer.data(), buffer.size());
  for (Gpt* model : models) {
    const auto views = model->gradient_views();
    for (size_t k = 0; k < layout.tensors.size(); ++k) {
      const TensorView& v = views[static_cast<size_t>(layout.tensors[k])];
      const float* from = buffer.data() + layout.base[k] + slice_start(v, layout.row[k]);
      std::memcpy(v.data, from, static_cast<size_t>(v.numel()) * sizeof(float));
    }
  }
}

}  // namespace kt::worker

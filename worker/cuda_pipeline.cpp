#include "worker/cuda_pipeline.h"

#include <algorithm>

#include "api/error.h"

namespace kt::worker {

using kernels::cuda::bf16;

CudaPipeline::CudaPipeline(std::vector<CudaGpt*> chunks, CudaDevice& device, StreamPointToPoint& pp,
                           CudaStream& comm)
    : chunks_(std::move(chunks)),
      device_(device),
      pp_(pp),
      comm_(comm),
      count_(static_cast<size_t>(chunks_.at(0)->batch() * chunks_[0]->seq_len() *
                                 chunks_[0]->channels())),
      memory_(device),
      ready_(std::make_unique<CudaEvent>()),
      done_(std::make_unique<CudaEvent>()) {
  const int p = pp.size(), s = pp.rank(), v = static_cast<int>(chunks_.size());
  const auto n = static_cast<int64_t>(count_);
  for (int c = 0; c < v; ++c) {
    const PipelineStage& stage = chunks_[static_cast<size_t>(c)]->stage();
    const int64_t place = virtual_stage(p, s, c);
    KT_CHECK(p > 1 && stage.first == (place == 0) && stage.last == (place + 1 == int64_t{p} * v),
             "the pipeline group does not match the model chunks' stages");
    Buffers& b = buffers_.emplace_back();
    if (!stage.first) {
      b.act_in = memory_.device<bf16>(n, MemoryKind::kActivations);
      b.grad_out = memory_.device<bf16>(n, MemoryKind::kActivations);
    }
    if (!stage.last) {
      b.act_out = memory_.device<bf16>(n, MemoryKind::kActivations);
      b.grad_in = memory_.device<bf16>(n, MemoryKind::kActivations);
    }
  }
}

CudaPipeline::~CudaPipeline() = default;

void CudaPipeline::exchange(const std::vector<PipelineTransfer>& group) {
  if (group.empty()) return;
  std::vector<PointToPointOp> ops;
  for (const PipelineTransfer& t : group) {
    const Buffers& b = buffers_[static_cast<size_t>(t.chunk)];
    if (t.send)
      ops.push_back({t.activations ? b.act_out : b.grad_out, nullptr, t.peer});
    else
      ops.push_back({nullptr, t.activations ? b.act_in : b.grad_in, t.peer});
  }
  CudaStream& compute = device_.stream(StreamRole::kCompute);
  compute.record(*ready_);
  pp_.exchange_group(ops, count_, *ready_, *done_, comm_);
  compute.wait(*done_);
}

void CudaPipeline::step(int64_t m, float loss_scale, const Take& take) {
  const PipelineOrder order =
      pipeline_order(pp_.size(), pp_.rank(), static_cast<int>(chunks_.size()), m);
  // Every micro-batch's tokens (the first and the last virtual stage read them); the models copy
  // them to the device in their forward.
  inputs_.resize(static_cast<size_t>(m));
  targets_.resize(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i)
    take(inputs_[static_cast<size_t>(i)], targets_[static_cast<size_t>(i)]);
  for (size_t j = 0; j < order.ops.size(); ++j) {
    exchange(order.groups[j]);
    const PipelineOp& op = order.ops[j];
    CudaGpt& model = *chunks_[static_cast<size_t>(op.chunk)];
    const Buffers& b = buffers_[static_cast<size_t>(op.chunk)];
    const int slot = static_cast<int>(op.micro % model.stage().in_flight);
    if (op.forward) {
      const auto i = static_cast<size_t>(op.micro);
      model.forward_micro(slot, inputs_[i].data(), targets_[i].data(), loss_scale, b.act_in,
                          b.act_out);
    } else {
      model.backward_micro(slot, op.micro == m - 1, b.grad_in, b.grad_out);
    }
  }
  exchange(order.groups.back());
}

}  // namespace kt::worker

#include "worker/cuda_pipeline.h"

#include <algorithm>

#include "api/error.h"

namespace kt::worker {

using kernels::cuda::bf16;

CudaPipeline::CudaPipeline(std::vector<CudaGpt*> chunks, CudaDevice& device, StreamPointToPoint& pp,
                           CudaStream& comm, CudaStageCut cut)
    : chunks_(std::move(chunks)),
      device_(device),
      pp_(pp),
      comm_(comm),
      cut_(cut),
      count_(static_cast<size_t>(chunks_.at(0)->batch() * chunks_[0]->seq_len() *
                                 chunks_[0]->channels())),
      count_in_(cut.activations ? static_cast<size_t>(cut.batch_before * chunks_[0]->seq_len() *
                                                      chunks_[0]->channels())
                                : count_),
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
      b.act_in = memory_.device<bf16>(static_cast<int64_t>(count_in_), MemoryKind::kActivations);
      b.grad_out = memory_.device<bf16>(static_cast<int64_t>(count_in_), MemoryKind::kActivations);
    }
    if (!stage.last) {
      b.act_out = memory_.device<bf16>(n, MemoryKind::kActivations);
      b.grad_in = memory_.device<bf16>(n, MemoryKind::kActivations);
    }
  }
  if (cut_.activations) {
    KT_CHECK(v == 1 && !chunks_[0]->stage().first &&
                 (cut_.widens ? count_ == count_in_ * cut_.activations->size()
                              : count_in_ == count_ * cut_.activations->size()),
             "the re-shard between stages joins or splits the batch over the cut group");
    resharded_ = memory_.device<bf16>(n, MemoryKind::kActivations);
    resharded_grad_ = memory_.device<bf16>(n, MemoryKind::kActivations);
  }
  if (cut_.tokens) {
    const int64_t T = chunks_[0]->seq_len(), B2 = chunks_[0]->batch();
    const int64_t B1 = cut_.widens ? B2 / cut_.tokens->size() : B2 * cut_.tokens->size();
    tokens_.emplace(*cut_.tokens, cut_.widens, B1 * T, B2 * T);
  }
}

CudaPipeline::~CudaPipeline() = default;

void CudaPipeline::exchange(const std::vector<PipelineTransfer>& group) {
  if (group.empty()) return;
  std::vector<PointToPointOp> ops;
  for (const PipelineTransfer& t : group) {
    const Buffers& b = buffers_[static_cast<size_t>(t.chunk)];
    // Activations to the next stage and gradients from it: count_; from and to the one before:
    // count_in_.
    const size_t count = t.activations == t.send ? count_ : count_in_;
    if (t.send)
      ops.push_back({t.activations ? b.act_out : b.grad_out, nullptr, t.peer, count});
    else
      ops.push_back({nullptr, t.activations ? b.act_in : b.grad_in, t.peer, count});
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
  for (int64_t i = 0; i < m; ++i) {
    auto& inputs = inputs_[static_cast<size_t>(i)];
    auto& targets = targets_[static_cast<size_t>(i)];
    take(inputs, targets);
    if (tokens_) tokens_->reshard(inputs, targets);  // into the last stage's layout
  }
  CudaStream& compute = device_.stream(StreamRole::kCompute);
  // All-gathers `count` bf16 of `from` into `to` over the cut group, after the compute stream's
  // work so far; the compute stream then waits for it.
  auto all_gather = [&](const bf16* from, bf16* to, size_t count) {
    compute.record(*ready_);
    cut_.activations->all_gather(from, to, count, DeviceDtype::kBfloat16, *ready_, *done_);
    compute.wait(*done_);
  };
  const int64_t r = cut_.activations ? cut_.activations->rank() : 0;
  for (size_t j = 0; j < order.ops.size(); ++j) {
    exchange(order.groups[j]);
    const PipelineOp& op = order.ops[j];
    CudaGpt& model = *chunks_[static_cast<size_t>(op.chunk)];
    const Buffers& b = buffers_[static_cast<size_t>(op.chunk)];
    const int slot = static_cast<int>(op.micro % model.stage().in_flight);
    if (op.forward) {
      const auto i = static_cast<size_t>(op.micro);
      const bf16* input = b.act_in;
      if (cut_.activations && cut_.widens) {
        all_gather(b.act_in, resharded_, count_in_);
        input = resharded_;
      } else if (cut_.activations) {
        input = b.act_in + static_cast<size_t>(r) * count_;
      }
      model.forward_micro(slot, inputs_[i].data(), targets_[i].data(), loss_scale, input,
                          b.act_out);
    } else if (cut_.activations) {
      model.backward_micro(slot, op.micro == m - 1, b.grad_in, resharded_grad_);
      if (cut_.widens)  // this rank's block of the gathered batch goes back
        device_.copy(b.grad_out, resharded_grad_ + static_cast<size_t>(r) * count_in_,
                     count_in_ * sizeof(bf16), compute);
      else
        all_gather(resharded_grad_, b.grad_out, count_);
    } else {
      model.backward_micro(slot, op.micro == m - 1, b.grad_in, b.grad_out);
    }
  }
  exchange(order.groups.back());
}

}  // namespace kt::worker

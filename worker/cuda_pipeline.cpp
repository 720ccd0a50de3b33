#include "worker/cuda_pipeline.h"

#include <algorithm>

#include "api/error.h"

namespace kt::worker {

using kernels::cuda::bf16;

CudaPipeline::CudaPipeline(CudaGpt& model, CudaDevice& device, StreamPointToPoint& pp,
                           CudaStream& comm)
    : model_(model),
      device_(device),
      pp_(pp),
      comm_(comm),
      count_(static_cast<size_t>(model.batch() * model.seq_len() * model.channels())),
      memory_(device),
      ready_(std::make_unique<CudaEvent>()),
      done_(std::make_unique<CudaEvent>()) {
  const PipelineStage& stage = model.stage();
  KT_CHECK(pp.size() > 1 && stage.first == (pp.rank() == 0) &&
               stage.last == (pp.rank() + 1 == pp.size()),
           "the pipeline group does not match the model's stage");
  const auto n = static_cast<int64_t>(count_);
  if (!stage.first) {
    act_in_ = memory_.device<bf16>(n, MemoryKind::kActivations);
    grad_out_ = memory_.device<bf16>(n, MemoryKind::kActivations);
  }
  if (!stage.last) {
    act_out_ = memory_.device<bf16>(n, MemoryKind::kActivations);
    grad_in_ = memory_.device<bf16>(n, MemoryKind::kActivations);
  }
}

CudaPipeline::~CudaPipeline() = default;

void CudaPipeline::exchange(const bf16* send, int to, bf16* recv, int from) {
  if (!send && !recv) return;
  CudaStream& compute = device_.stream(StreamRole::kCompute);
  compute.record(*ready_);
  pp_.exchange(send, to, recv, from, count_, *ready_, *done_, comm_);
  compute.wait(*done_);
}

void CudaPipeline::step(int64_t m, float loss_scale, const Take& take) {
  const int s = pp_.rank(), p = pp_.size();
  const int in_flight = model_.stage().in_flight;
  const int64_t warmup = std::min<int64_t>(p - s - 1, m), remaining = m - warmup;
  int64_t forwards = 0, backwards = 0;
  auto forward = [&] {
    take(inputs_, targets_);
    model_.forward_micro(static_cast<int>(forwards % in_flight), inputs_.data(), targets_.data(),
                         loss_scale, act_in_, act_out_);
    ++forwards;
  };
  auto backward = [&] {
    model_.backward_micro(static_cast<int>(backwards % in_flight), backwards == m - 1, grad_in_,
                          grad_out_);
    ++backwards;
  };
  // Megatron's transfers; on the first stage the ones with the stage before are none, on the
  // last the ones with the stage after.
  auto recv_forward = [&] { exchange(nullptr, 0, act_in_, s - 1); };
  auto send_forward = [&] { exchange(act_out_, s + 1, nullptr, 0); };
  auto recv_backward = [&] { exchange(nullptr, 0, grad_in_, s + 1); };
  auto send_backward = [&] { exchange(grad_out_, s - 1, nullptr, 0); };
  auto send_forward_recv_backward = [&] { exchange(act_out_, s + 1, grad_in_, s + 1); };
  auto send_backward_recv_forward = [&] { exchange(grad_out_, s - 1, act_in_, s - 1); };

  for (int64_t i = 0; i < warmup; ++i) {
    recv_forward();
    forward();
    send_forward();
  }
  if (remaining > 0) recv_forward();
  for (int64_t i = 0; i < remaining; ++i) {
    forward();
    send_forward_recv_backward();
    backward();
    if (i + 1 == remaining)
      send_backward();
    else
      send_backward_recv_forward();
  }
  for (int64_t i = 0; i < warmup; ++i) {
    recv_backward();
    backward();
    send_backward();
  }
}

}  // namespace kt::worker

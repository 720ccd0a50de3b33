#include "worker/cuda_cutpoint.h"

#include <cuda_runtime.h>

#include "api/error.h"
#include "kernels/cuda/check.h"

namespace kt::worker {

using kernels::cuda::bf16;

CudaCutpoint::CudaCutpoint(CudaGpt& before, CudaGpt& after, CudaDevice& device,
                           Communicator& cut_comm, GradientReducer& cut, GradientReducer& world)
    : before_(before),
      after_(after),
      device_(device),
      cut_(cut),
      world_(world),
      widens_(after.tp_size() > before.tp_size()),
      n1_(before.batch() * before.seq_len() * before.channels()),
      n2_(after.batch() * after.seq_len() * after.channels()),
      tokens_(cut_comm, widens_, before.batch() * before.seq_len(),
              after.batch() * after.seq_len()),
      memory_(device),
      ready_(std::make_unique<CudaEvent>()),
      done_(std::make_unique<CudaEvent>()) {
  const int64_t wide = widens_ ? after.tp_size() : before.tp_size(),
                narrow = widens_ ? before.tp_size() : after.tp_size();
  KT_CHECK(after.tp_size() != before.tp_size() && wide % narrow == 0 &&
               cut.size() == wide / narrow && cut_comm.size() == cut.size() &&
               (widens_ ? n2_ == n1_ * cut.size() : n1_ == n2_ * cut.size()),
           "a cutpoint changes TP and splits the batch over its cut group");
  KT_CHECK(before.stage().first && !before.stage().last && !after.stage().first &&
               after.stage().last && before.stage().in_flight == 1 && after.stage().in_flight == 1,
           "a cutpoint's segments are the first and the last stage of one rank");
  // Where TP widens the second segment's input is gathered and the first's output gradient is
  // read in place (the rank's block); where it narrows, the other way round.
  out1_ = memory_.device<bf16>(n1_, MemoryKind::kActivations);
  grad_in2_ = memory_.device<bf16>(n2_, MemoryKind::kActivations);
  if (widens_)
    in2_ = memory_.device<bf16>(n2_, MemoryKind::kActivations);
  else
    grad_out1_ = memory_.device<bf16>(n1_, MemoryKind::kActivations);
  unit0_ = memory_.device<float>(before.unit0_floats(), MemoryKind::kWorkspace);
  inputs2_.resize(static_cast<size_t>(after.batch() * after.seq_len()));
  targets2_.resize(inputs2_.size());
}

CudaCutpoint::~CudaCutpoint() = default;

void CudaCutpoint::micro_step(const int32_t* inputs, const int32_t* targets, float loss_scale,
                              bool last) {
  CudaStream& compute = device_.stream(StreamRole::kCompute);
  // All-gathers `count` bf16 of `from` into `to` over the cut group, after the compute stream's
  // work so far; the compute stream then waits for it.
  auto all_gather = [&](const bf16* from, bf16* to, int64_t count) {
    compute.record(*ready_);
    cut_.all_gather(from, to, static_cast<size_t>(count), DeviceDtype::kBfloat16, *ready_, *done_);
    compute.wait(*done_);
  };
  const int64_t r = cut_.rank();
  before_.forward_micro(0, inputs, targets, loss_scale, nullptr, out1_);
  tokens_.reshard(inputs, targets, inputs2_.data(), targets2_.data());
  if (widens_) all_gather(out1_, in2_, n1_);
  after_.forward_micro(0, inputs2_.data(), targets2_.data(), loss_scale,
                       widens_ ? in2_ : out1_ + r * n2_, nullptr);
  after_.backward_micro(0, last, nullptr, grad_in2_);
  if (!widens_) all_gather(grad_in2_, grad_out1_, n2_);
  before_.backward_micro(0, last, widens_ ? grad_in2_ + r * n1_ : grad_out1_, nullptr);
}

void CudaCutpoint::sum_unit0() {
  sum_unit0_on_device({&before_, &after_}, device_, world_, unit0_, *ready_);
}

void sum_unit0_on_device(const std::vector<CudaGpt*>& models, CudaDevice& device,
                         GradientReducer& group, float* logical, CudaEvent& ready) {
  CudaStream& compute = device.stream(StreamRole::kCompute);
  const int64_t n = models.front()->unit0_floats();
  KT_CUDA_CHECK(cudaMemsetAsync(logical, 0, bytes<float>(n), compute.handle()));
  for (CudaGpt* model : models) model->add_unit0_gradients(logical);
  compute.record(ready);
  group.reduce({{logical, static_cast<size_t>(n)}}, ready);
  group.join(compute);
  for (CudaGpt* model : models) model->take_unit0_gradients(logical);
}

}  // namespace kt::worker

// One optimizer step's micro-batches on a CUDA pipeline stage (docs/WORKER.md, "Pipeline stages
// on CUDA ranks"), in Megatron-LM's 1F1B schedule (forward_backward_pipelining_without_
// interleaving; Narayanan et al. SC21 §2.2): stage s of p runs min(p − s − 1, m) warm-up
// forwards, then alternates one forward and one backward, then the remaining backwards. The
// transfers are Megatron's too, a stage's send paired with the receive that follows it
// (send_forward_recv_backward, send_backward_recv_forward), because NCCL's sends wait for their
// receives: two stages that each sent before receiving would wait for each other.
// The compute stream waits for each exchange before it goes on, so one buffer of each kind
// serves every micro-batch (the model copies its input into the slot's activations, and its
// output out of them).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "worker/cuda_gpt.h"

namespace kt::worker {

class CudaPipeline {
 public:
  // `pp`: the PP group (group rank = stage); its exchanges run on `comm` (the stream the rank's
  // other NCCL operations use, so that no two communicators' operations run at once).
  CudaPipeline(CudaGpt& model, CudaDevice& device, StreamPointToPoint& pp, CudaStream& comm);
  ~CudaPipeline();
  CudaPipeline(const CudaPipeline&) = delete;
  CudaPipeline& operator=(const CudaPipeline&) = delete;

  // The step's `m` micro-batches (after the model's zero_grad), each's tokens from `take`
  // (every stage takes every micro-batch, in order), the loss scaled by `loss_scale`. The
  // gradients are final (the DP sums started) when it returns; the loss is the last stage's
  // model.mean_loss().
  using Take = std::function<void(std::vector<int32_t>& inputs, std::vector<int32_t>& targets)>;
  void step(int64_t m, float loss_scale, const Take& take);

 private:
  // Sends `send` to stage `to` and/or receives into `recv` from stage `from` (null: none), after
  // the compute stream's work so far; the compute stream then waits for both.
  void exchange(const kernels::cuda::bf16* send, int to, kernels::cuda::bf16* recv, int from);

  CudaGpt& model_;
  CudaDevice& device_;
  StreamPointToPoint& pp_;
  CudaStream& comm_;
  size_t count_;  // B·T·C
  CudaAllocations memory_;
  kernels::cuda::bf16 *act_in_ = nullptr, *act_out_ = nullptr, *grad_in_ = nullptr,
                      *grad_out_ = nullptr;
  std::unique_ptr<CudaEvent> ready_, done_;
  std::vector<int32_t> inputs_, targets_;
};

}  // namespace kt::worker

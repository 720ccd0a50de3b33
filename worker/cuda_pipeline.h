// One optimizer step's micro-batches on a CUDA pipeline stage (docs/WORKER.md, "Pipeline stages
// on CUDA ranks"), in the order of worker/pipeline_order.h: Megatron-LM's 1F1B
// (forward_backward_pipelining_without_interleaving; Narayanan et al. SC21 §2.2), or with virtual
// stages the interleaved schedule (forward_backward_pipelining_with_interleaving), whose model
// chunks are the models given (chunk c: virtual stage c·p + s). Each of the order's groups of
// transfers is one NCCL group (Megatron's send_forward_recv_backward and its siblings), because
// NCCL's sends wait for their receives: two stages that each sent before receiving would wait
// for each other. The compute stream waits for each group before it goes on, so one buffer of
// each kind per chunk serves every micro-batch (the model copies its input into the slot's
// activations, and its output out of them).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "worker/cuda_gpt.h"
#include "worker/cutpoint_tokens.h"
#include "worker/pipeline_order.h"

namespace kt::worker {

// Per-stage TP (a cutpoint between stages, api::cut_stage; worker/cuda_cutpoint.h's re-shard):
// the first stage after the cut receives the stage before's activations in its layout (B₁
// sequences) and re-shards them on the device over its cut group before its forward — an
// all-gather where TP widens, its block where it narrows — and its input gradient back after
// its backward; the last stage re-shards each micro-batch's tokens on the host.
struct CudaStageCut {
  GradientReducer* activations = nullptr;  // the first stage after the cut: its cut group's
  int64_t batch_before = 0;                // B₁ (there)
  Communicator* tokens = nullptr;          // the last stage: its cut group (host)
  bool widens = false;                     // TP after the cut > before
};

class CudaPipeline {
 public:
  // `pp`: the PP group (group rank = stage); its exchanges run on `comm` (the stream the rank's
  // other NCCL operations use, so that no two communicators' operations run at once).
  CudaPipeline(std::vector<CudaGpt*> chunks, CudaDevice& device, StreamPointToPoint& pp,
               CudaStream& comm, CudaStageCut cut = {});
  ~CudaPipeline();
  CudaPipeline(const CudaPipeline&) = delete;
  CudaPipeline& operator=(const CudaPipeline&) = delete;

  // The step's `m` micro-batches (after the models' zero_grad), each's tokens from `take`
  // (every stage takes every micro-batch, in order), the loss scaled by `loss_scale`. The
  // gradients are final (the DP sums started) when it returns; the loss is the last virtual
  // stage's model's mean_loss().
  using Take = std::function<void(std::vector<int32_t>& inputs, std::vector<int32_t>& targets)>;
  void step(int64_t m, float loss_scale, const Take& take);

 private:
  // One group's sends and receives, after the compute stream's work so far; the compute stream
  // then waits for them.
  void exchange(const std::vector<PipelineTransfer>& group);

  struct Buffers {  // per chunk (null where the chunk has no stage before or after it)
    kernels::cuda::bf16 *act_in = nullptr, *act_out = nullptr, *grad_in = nullptr,
                        *grad_out = nullptr;
  };
  std::vector<CudaGpt*> chunks_;
  CudaDevice& device_;
  StreamPointToPoint& pp_;
  CudaStream& comm_;
  CudaStageCut cut_;
  size_t count_;                              // B·T·C: to the next stage
  size_t count_in_;                           // from the one before (B₁·T·C at the cut)
  kernels::cuda::bf16* resharded_ = nullptr;  // at the cut: the input's and its gradient's
  kernels::cuda::bf16* resharded_grad_ = nullptr;
  std::optional<CutpointTokens> tokens_;
  CudaAllocations memory_;
  std::vector<Buffers> buffers_;
  std::unique_ptr<CudaEvent> ready_, done_;
  std::vector<std::vector<int32_t>> inputs_, targets_;
};

}  // namespace kt::worker

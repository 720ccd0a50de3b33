// A GPT-2 training step composed from the CUDA kernels (bf16 activations and parameter copies,
// fp32 master weights, gradients and AdamW moments; attention internals fp32), for gpu_tests'
// training check and the GPT-2 124M tokens/s row of scripts/device-check.sh. A harness, not the
// worker's model: worker/gpt.cpp does not run on CUDA yet (docs/WORKER.md, "The CUDA runtime").
// Letters as in kernels/ops.h.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cuda/ops.h"
#include "worker/cuda_device.h"

namespace kt::gpu_harness {

struct GptDims {
  int64_t L, C, NH, V, Vp, T, B;
  int64_t parameters() const;  // 12·L·C² + 13·L·C + (Vp + T)·C + 2·C
};

class GptBf16 {
 public:
  // Allocates everything (throws kt::Error when the device memory does not suffice) and
  // initialises the weights GPT-2 style from `seed` (normal 0.02, projections 0.02/√(2L)).
  GptBf16(worker::CudaDevice& device, const kernels::cuda::Context& ctx, const GptDims& dims,
          uint64_t seed);
  ~GptBf16();
  GptBf16(const GptBf16&) = delete;
  GptBf16& operator=(const GptBf16&) = delete;

  // One step on tokens/targets (B·T each, host): forward, backward, AdamW (no clipping). Returns
  // the mean loss of the forward (synchronises when `read_loss`, else returns NaN).
  float step(const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets,
             float learning_rate, bool read_loss);

 private:
  void build(uint64_t seed);
  void* alloc(size_t bytes, worker::MemoryKind kind);

  worker::CudaDevice& device_;
  const kernels::cuda::Context& ctx_;
  GptDims d_;
  std::vector<void*> allocations_;
  int64_t step_ = 0;
  // parameters: fp32 master, grads, moments; bf16 copy; offsets of each tensor (in elements)
  float *master_, *grads_, *m_, *v_;
  kernels::cuda::bf16* params16_;
  struct Offsets {
    int64_t wte, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw,
        fcprojb, lnfw, lnfb, total;
  } off_;
  // activations (bf16 unless named 32), per layer where indexed
  std::vector<kernels::cuda::bf16*> res_, ln1_, qkv_, atty_, res2_, ln2_, fch_, fchg_;
  std::vector<float*> ln1_mean_, ln1_rstd_, ln2_mean_, ln2_rstd_, att_;
  kernels::cuda::bf16 *lnf_, *logits_, *proj_tmp_, *dres_, *dtmp_c_, *dtmp_3c_, *dtmp_4c_a_,
      *dtmp_4c_b_;
  float *lnf_mean_, *lnf_rstd_, *losses_, *enc32_, *qkv32_, *atty32_, *preatt_, *datt_, *dpreatt_,
      *dqkv32_, *dc32_;
  int32_t *tokens_, *targets_;
};

}  // namespace kt::gpu_harness

// What the GPU tests (tests/gpu/*_tests.cpp) and the GPU benchmarks (bench/gpu_bench.cpp) share:
// the pass/fail count, the error measure, host-side bf16, device arrays from the CUDA device's
// caching allocator, seeded random inputs, and a few AdamW steps of the CUDA model.
//
// Error measure (METHOD.md): ‖got − ref64‖ / ‖ref64‖. Tolerances: fp32 kernels 2e-5; bf16
// results 1e-2 (one bf16 rounding is 2^-9 relative); fp32 results of bf16 operands 1e-4.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/ops.h"
#include "kernels/reference.h"
#include "tests/support/rel_error.h"
#include "worker/comm.h"
#include "worker/cuda_device.h"
#include "worker/cuda_gpt.h"

namespace kt::gpu_test {

namespace ref = kernels::reference;
namespace gpu = kernels::cuda;
using gpu::bf16;
using kernels::AdamWStep;
using worker::CudaDevice;
using worker::CudaGpt;
using worker::CudaGptOptions;
using worker::GptConfig;
using worker::MemoryKind;
using F = std::vector<float>;
using D = std::vector<double>;

// ---- checks: every one counted, a failure printed with the seed that reproduces it ----------
extern int g_checks, g_failures;
extern unsigned g_seed;

void check(bool ok, const std::string& what);

using test::rel_error;  // the error measure above (tests/support/rel_error.h)

void expect_close(const F& got, const D& want, double tol, const std::string& what);

// ---- host-side bf16 (round to nearest even), independent of CUDA's conversion ---------------
uint16_t to_bf16_bits(float x);
float from_bf16_bits(uint16_t b);
F round_bf16(const F& x);

// ---- device arrays from the CUDA device's caching allocator ---------------------------------
extern CudaDevice* g_device;  // the device under test, set by the program's main

template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    ptr_ = static_cast<T*>(
        g_device->allocate(std::max<size_t>(1, n) * sizeof(T), MemoryKind::kWorkspace));
    poison();
  }
  template <class U>
  explicit DeviceArray(const std::vector<U>& host) : DeviceArray(host.size()) {
    upload(host);
  }
  ~DeviceArray() { g_device->deallocate(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return ptr_; }
  operator T*() const { return ptr_; }
  // The kernels run on the device's non-blocking compute stream, which does not wait for the
  // legacy default stream that cudaMemset/cudaMemcpy use: every fill ends with a device sync.
  void poison() {  // 0xff bytes: NaN in fp32 and bf16
    KT_CUDA_CHECK(cudaMemset(ptr_, 0xff, n_ * sizeof(T)));
    KT_CUDA_CHECK(cudaDeviceSynchronize());
  }
  void zero() {
    KT_CUDA_CHECK(cudaMemset(ptr_, 0, n_ * sizeof(T)));
    KT_CUDA_CHECK(cudaDeviceSynchronize());
  }
  void upload(const std::vector<T>& host) {
    KT_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
    KT_CUDA_CHECK(cudaDeviceSynchronize());
  }
  void upload(const F& host) requires std::is_same_v<T, bf16> {
    std::vector<bf16> b(host.size());
    for (size_t i = 0; i < host.size(); ++i) b[i].bits = to_bf16_bits(host[i]);
    upload(b);
  }
  std::vector<T> raw() const {
    std::vector<T> host(n_);
    KT_CUDA_CHECK(cudaDeviceSynchronize());
    KT_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  F floats() const {
    if constexpr (std::is_same_v<T, bf16>) {
      F out(n_);
      const auto b = raw();
      for (size_t i = 0; i < n_; ++i) out[i] = from_bf16_bits(b[i].bits);
      return out;
    } else {
      return raw();
    }
  }

 private:
  T* ptr_;
  size_t n_;
};

// ---- random inputs, all from g_rng (seeded with g_seed) -------------------------------------
extern std::mt19937 g_rng;
F random(size_t n, float scale = 1.0f);
std::vector<int32_t> random_tokens(size_t n, int32_t vocab);
D widen(const F& x);

// ---- the CUDA model (worker/cuda_gpt.h) -------------------------------------------------------
// maxT V Vp L NH C F; head size 32: the flash attention path (test_cuda_gpt_memorises covers
// the materialised one, head size 16).
inline const GptConfig kSmallGpt{32, 91, 96, 2, 2, 64, 256};

// A sequence and its next-token targets (B·T each) drawn from a vocabulary of V.
std::pair<std::vector<int32_t>, std::vector<int32_t>> random_batch(int64_t BT, int64_t V);

// The tests' AdamW step `step` (0-based): learning rate 2e-3, the gradients clipped at norm 1.
AdamWStep clipped_adam_step(int64_t step, double norm);

// One run of `steps` AdamW steps (clipped at norm 1) on the given batches (token pairs of B·T),
// returning every loss, the gradients of step 1, the weights after the last step, and the
// offload traffic (bytes each way between device and host).
struct DpRun {
  std::vector<double> losses;
  F grads1, weights;
  int64_t h2d = 0, d2h = 0;
};
// `tp_group`: with tensor parallelism, the group over which the sharded tensors' squares are
// summed for the global norm (as the trainer does); `dp_group`: with the distributed optimizer,
// the group over which the shards' squares are summed first.
DpRun train_steps(
    CudaDevice& device, const GptConfig& c, int64_t B, int64_t T, const CudaGptOptions& options,
    float loss_scale, int64_t steps,
    const std::function<std::pair<std::vector<int32_t>, std::vector<int32_t>>(int64_t step)>&
        batch_of,
    worker::Communicator* tp_group = nullptr, worker::Communicator* dp_group = nullptr);

}  // namespace kt::gpu_test

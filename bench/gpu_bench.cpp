// bench_gpu: the GPU timings of scripts/device-check.sh (needs a CUDA GPU; built with the CUDA
// path, not run by `make bench`).
//
//   bench_gpu --kernels  kernel times at GPT-2 124M shapes against measured ceilings (cuBLASLt
//                        bf16 GEMM, D2D and pinned H2D/D2H copies)
//   bench_gpu --gpt      GPT-2 124M bf16 training tokens/s and MFU on the CUDA model the worker
//                        runs (worker/cuda_gpt), with and without offload and recompute
//   bench_gpu            both
//
// Exit status 0 when the timings ran, 2 with no usable GPU, 1 on an error.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/gpu/test_support.h"

namespace kt::gpu_test {
namespace {

// Median milliseconds of `fn` over `reps` runs after 2 warm-up runs, timed with CUDA events.
double time_ms(cudaStream_t stream, int reps, const std::function<void()>& fn) {
  cudaEvent_t start, stop;
  KT_CUDA_CHECK(cudaEventCreate(&start));
  KT_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 2; ++i) fn();
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    KT_CUDA_CHECK(cudaEventRecord(start, stream));
    fn();
    KT_CUDA_CHECK(cudaEventRecord(stop, stream));
    KT_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    KT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

struct Row {
  std::string name;
  double ms, amount;  // amount: bytes or FLOPs
  bool flops;
};

void bench(const gpu::Context& ctx) {
  cudaStream_t s = ctx.stream();
  std::vector<Row> rows;
  // Random device data (never zeros) without drawing billions of host samples: a pool of 2^24
  // normal floats, scaled and tiled.
  const F pool = random(size_t{1} << 24);
  auto fill = [&](DeviceArray<float>& arr, size_t n, float scale) {
    F chunk(pool.size());
    for (size_t i = 0; i < pool.size(); ++i) chunk[i] = pool[i] * scale;
    for (size_t at = 0; at < n; at += chunk.size())
      KT_CUDA_CHECK(cudaMemcpy(arr.get() + at, chunk.data(),
                               std::min(chunk.size(), n - at) * sizeof(float),
                               cudaMemcpyHostToDevice));
    KT_CUDA_CHECK(cudaDeviceSynchronize());
  };
  auto fill16 = [&](DeviceArray<bf16>& arr, size_t n, float scale) {
    std::vector<bf16> chunk(pool.size());
    for (size_t i = 0; i < pool.size(); ++i) chunk[i].bits = to_bf16_bits(pool[i] * scale);
    for (size_t at = 0; at < n; at += chunk.size())
      KT_CUDA_CHECK(cudaMemcpy(arr.get() + at, chunk.data(),
                               std::min(chunk.size(), n - at) * sizeof(bf16),
                               cudaMemcpyHostToDevice));
    KT_CUDA_CHECK(cudaDeviceSynchronize());
  };
  // Ceilings: D2D copy, pinned H2D/D2H, bf16 and fp32 GEMM.
  const size_t copy_bytes = size_t{1} << 30;
  void* a = g_device->allocate(copy_bytes, MemoryKind::kWorkspace);
  void* b = g_device->allocate(copy_bytes, MemoryKind::kWorkspace);
  KT_CUDA_CHECK(cudaMemset(a, 1, copy_bytes));
  KT_CUDA_CHECK(cudaDeviceSynchronize());
  rows.push_back(
      {"ceiling: D2D copy 1 GiB",
       time_ms(
           s, 10,
           [&] { KT_CUDA_CHECK(cudaMemcpyAsync(b, a, copy_bytes, cudaMemcpyDeviceToDevice, s)); }),
       2.0 * copy_bytes, false});
  const size_t pin_bytes = size_t{256} << 20;
  void* host = g_device->allocate_pinned(pin_bytes, MemoryKind::kWorkspace);
  std::memset(host, 1, pin_bytes);
  rows.push_back(
      {"ceiling: H2D pinned 256 MiB",
       time_ms(
           s, 10,
           [&] { KT_CUDA_CHECK(cudaMemcpyAsync(a, host, pin_bytes, cudaMemcpyHostToDevice, s)); }),
       1.0 * pin_bytes, false});
  rows.push_back(
      {"ceiling: D2H pinned 256 MiB",
       time_ms(
           s, 10,
           [&] { KT_CUDA_CHECK(cudaMemcpyAsync(host, a, pin_bytes, cudaMemcpyDeviceToHost, s)); }),
       1.0 * pin_bytes, false});
  g_device->deallocate_pinned(host);
  g_device->deallocate(a);
  g_device->deallocate(b);
  {
    const int64_t M = 8192;
    DeviceArray<bf16> x(M * M), w(M * M), y(M * M);
    fill16(x, M * M, 1.0f);
    fill16(w, M * M, 0.01f);
    rows.push_back(
        {"ceiling: bf16 GEMM 8192³ (cuBLASLt)",
         time_ms(s, 10, [&] { gpu::matmul_forward_bf16(ctx, y, x, w, nullptr, M, M, M); }),
         2.0 * M * M * M, true});
    const int64_t M2 = 4096;
    DeviceArray<float> xf(M2 * M2), wf(M2 * M2), yf(M2 * M2);
    fill(xf, M2 * M2, 1.0f);
    fill(wf, M2 * M2, 0.01f);
    rows.push_back(
        {"fp32 GEMM 4096³ (no TF32)",
         time_ms(s, 5, [&] { gpu::matmul_forward(ctx, yf, xf, wf, nullptr, M2, M2, M2); }),
         2.0 * M2 * M2 * M2, true});
  }
  // GPT-2 124M shapes, micro-batch 16 × 1024.
  const int64_t B = 16, T = 1024, C = 768, NH = 12, Vp = 50304, V = 50257, BT = B * T;
  {
    DeviceArray<bf16> x(BT * C), w(3 * C * C), bias(3 * C), y(BT * 3 * C), dy(BT * 3 * C),
        dx(BT * C);
    DeviceArray<float> dw(3 * C * C), db(3 * C);
    fill16(x, BT * C, 1.0f);
    fill16(w, 3 * C * C, 0.02f);
    fill16(bias, 3 * C, 1.0f);
    fill16(dy, BT * 3 * C, 1.0f);
    fill16(dx, BT * C, 1.0f);
    rows.push_back(
        {"matmul_forward_bf16 QKV 16384×768→2304 +bias",
         time_ms(s, 20, [&] { gpu::matmul_forward_bf16(ctx, y, x, w, bias, BT, C, 3 * C); }),
         2.0 * BT * C * 3 * C, true});
    rows.push_back(
        {"matmul_backward_bf16 QKV",
         time_ms(s, 20,
                 [&] { gpu::matmul_backward_bf16(ctx, dx, dw, db, dy, x, w, BT, C, 3 * C, true); }),
         4.0 * BT * C * 3 * C, true});
  }
  {
    DeviceArray<float> x(BT * C), y(BT * C), w(C), bb(C), mean(BT), rstd(BT), dy(BT * C),
        dx(BT * C), dw(C), db(C);
    fill(x, BT * C, 1.0f);
    fill(w, C, 1.0f);
    fill(bb, C, 1.0f);
    fill(dy, BT * C, 1.0f);
    fill(dx, BT * C, 1.0f);
    fill(dw, C, 1.0f);
    fill(db, C, 1.0f);
    rows.push_back(
        {"layernorm_forward 16384×768",
         time_ms(s, 20, [&] { gpu::layernorm_forward(ctx, y, mean, rstd, x, w, bb, BT, C); }),
         2.0 * BT * C * 4, false});
    rows.push_back(
        {"layernorm_backward",
         time_ms(s, 20,
                 [&] { gpu::layernorm_backward(ctx, dx, dw, db, dy, x, w, mean, rstd, BT, C); }),
         4.0 * BT * C * 4, false});
    rows.push_back({"residual_forward",
                    time_ms(s, 20, [&] { gpu::residual_forward(ctx, y, x, dy, BT * C); }),
                    3.0 * BT * C * 4, false});
  }
  {
    const int64_t N = BT * 4 * C;
    DeviceArray<float> x(N), y(N), dy(N);
    fill(x, N, 1.0f);
    fill(dy, N, 1.0f);
    rows.push_back({"gelu_forward 16384×3072",
                    time_ms(s, 20, [&] { gpu::gelu_forward(ctx, y, x, N); }), 2.0 * N * 4, false});
    y.zero();
    rows.push_back({"gelu_backward", time_ms(s, 20, [&] { gpu::gelu_backward(ctx, y, x, dy, N); }),
                    4.0 * N * 4, false});
  }
  {
    const int64_t att = B * NH * T * T;
    DeviceArray<float> qkv(BT * 3 * C), out(BT * C), pre(att), a(att), dout(BT * C),
        dqkv(BT * 3 * C), dpre(att), datt(att);
    fill(qkv, BT * 3 * C, 1.0f);
    fill(dout, BT * C, 1.0f);
    fill(dqkv, BT * 3 * C, 1.0f);
    const double flops = 4.0 * B * NH * T * T / 2 * (C / NH);  // causal: half the T² pairs
    rows.push_back(
        {"attention_forward B16 NH12 T1024 (fp32)",
         time_ms(s, 3, [&] { gpu::attention_forward(ctx, out, pre, a, qkv, B, T, C, NH); }), flops,
         true});
    rows.push_back(
        {"attention_backward",
         time_ms(
             s, 3,
             [&] { gpu::attention_backward(ctx, dqkv, dpre, datt, dout, qkv, a, B, T, C, NH); }),
         2.0 * flops, true});
  }
  {
    // The same shape and FLOP convention in bf16 (flash: no T×T matrix): forward counts the two
    // causal products QKᵀ and PV, backward twice that (recomputed products not counted).
    const int64_t hs = C / NH;
    DeviceArray<bf16> qkv(BT * 3 * C), out(BT * C), dout(BT * C), dqkv(BT * 3 * C);
    DeviceArray<float> lse(B * NH * T);
    DeviceArray<unsigned char> scratch(gpu::attention_backward_bf16_scratch_bytes(B, T, C, NH));
    fill16(qkv, BT * 3 * C, 1.0f);
    fill16(dout, BT * C, 1.0f);
    const double flops = 4.0 * B * NH * T * T / 2 * hs;  // causal: half the T² pairs
    rows.push_back(
        {"attention_forward_bf16 flash B16 NH12 T1024",
         time_ms(s, 20, [&] { gpu::attention_forward_bf16(ctx, out, lse, qkv, B, T, C, NH); }),
         flops, true});
    rows.push_back({"attention_backward_bf16 flash",
                    time_ms(s, 20,
                            [&] {
                              gpu::attention_backward_bf16(ctx, dqkv, scratch, dout, qkv, out, lse,
                                                           B, T, C, NH);
                            }),
                    2.0 * flops, true});
  }
  {
    DeviceArray<float> logits(BT * Vp), losses(BT);
    fill(logits, BT * Vp, 2.0f);
    DeviceArray<int32_t> targets(random_tokens(BT, static_cast<int32_t>(V)));
    DeviceArray<float> dlogits(BT * Vp);
    rows.push_back({"softmax_cross_entropy 16384×50304",
                    time_ms(s, 10,
                            [&] {
                              gpu::softmax_cross_entropy(ctx, losses, dlogits, logits, targets, BT,
                                                         V, Vp, 1.0f / BT);
                            }),
                    2.0 * BT * Vp * 4, false});
  }
  {
    const int64_t P = 124475904;  // GPT-2 124M (docs/PLANNER.md §2)
    DeviceArray<float> p(P), g(P), m(P), v(P);
    DeviceArray<bf16> p16(P);
    fill(p, P, 1.0f);
    fill(g, P, 1.0f);
    fill(m, P, 0.1f);
    fill(v, P, 0.1f);
    const gpu::AdamWTensor t{p, g, m, v, p16, P};
    AdamWStep step;
    rows.push_back({"adamw_update_multi 124M params (+bf16 copy)",
                    time_ms(s, 10, [&] { gpu::adamw_update_multi(ctx, &t, 1, step); }), P * 30.0,
                    false});  // read p g m v, write p m v (28 B) + bf16 p (2 B)
  }
  double copy_gbs = 0, gemm_tflops = 0;
  for (const Row& r : rows) {
    if (r.name.rfind("ceiling: D2D", 0) == 0) copy_gbs = r.amount / r.ms / 1e6;
    if (r.name.rfind("ceiling: bf16 GEMM", 0) == 0) gemm_tflops = r.amount / r.ms / 1e9;
  }
  std::printf("\n%-46s %10s %14s %10s\n", "kernel / ceiling", "ms", "achieved", "of ceiling");
  for (const Row& r : rows) {
    const double rate = r.flops ? r.amount / r.ms / 1e9 : r.amount / r.ms / 1e6;
    const double ceiling = r.flops ? gemm_tflops : copy_gbs;
    const bool is_ceiling = r.name.rfind("ceiling:", 0) == 0;
    char pct[32] = "";
    if (!is_ceiling && ceiling > 0) std::snprintf(pct, sizeof pct, "%.1f%%", 100 * rate / ceiling);
    std::printf("%-46s %10.3f %9.1f %-4s %10s\n", r.name.c_str(), r.ms, rate,
                r.flops ? "TF/s" : "GB/s", pct);
  }
  std::printf(
      "(rates: bytes moved = each input read once + each output written once; GEMM and "
      "attention in FLOP. Percentages against the D2D copy and the bf16 GEMM ceilings.)\n");
  std::printf("GPT-2 124M training: `bench_gpu --gpt` (the CUDA model the worker runs).\n");
}

// GPT-2 124M (T 1024, bf16) on the CUDA model: tokens/s and MFU for the largest micro-batch that
// fits, with every unit's AdamW on the device and with offload: optimizer. One step is
// zero_grad, one micro-batch, the global norm and AdamW, as the worker runs it; the time is the
// median of per-step wall times with the work of each step finished (CPU AdamW included). MFU
// counts model FLOPs 6·N·tokens + 12·L·C·T·tokens (the PERFORMANCE.md convention) against
// 989.4 TFLOP/s, the H100/H200 SXM dense bf16 datasheet peak.
void gpt_bench() {
  const GptConfig c{1024, 50257, 50304, 12, 12, 768, 3072};
  const double peak = 989.4e12;  // H100/H200 SXM dense bf16, datasheet
  std::printf("\nGPT-2 124M bf16 training on the CUDA model (worker/cuda_gpt), T 1024:\n");
  std::printf("%-44s %6s %9s %10s %9s %6s %7s\n", "configuration", "micro", "step ms", "tokens/s",
              "TFLOP/s", "MFU", "loss");
  int64_t fits = 0;
  for (int64_t B : {256, 128, 64, 32, 16, 8}) {
    try {
      CudaGpt probe(*g_device, c, B, 1024);
      fits = B;
      break;
    } catch (const Error& e) {
      std::printf("micro-batch %ld does not fit: %s\n", static_cast<long>(B), e.what());
      g_device->release_cached();
    }
  }
  if (fits == 0) {
    std::printf("GPT-2 124M: no micro-batch fits\n");
    return;
  }
  g_device->release_cached();
  struct Variant {
    const char* name;
    int64_t device_units;
    api::Recompute recompute = api::Recompute::kNone;
  };
  const int threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  for (Variant variant :
       {Variant{"offload none (AdamW on the GPU)", -1},
        Variant{"offload optimizer, gpuUnits 7 (6 layers on CPU)", 7},
        Variant{"offload optimizer, gpuUnits 1 (all layers on CPU)", 1},
        Variant{"offload none, recompute full", -1, api::Recompute::kFull},
        Variant{"offload none, recompute commAware", -1, api::Recompute::kCommAware}}) {
    CudaGptOptions options;
    options.device_units = variant.device_units;
    options.recompute = variant.recompute;
    options.cpu_threads = threads;
    CudaGpt gpt(*g_device, c, fits, 1024, options);
    gpt.init_weights(1234);
    const auto [tok, tgt] = random_batch(fits * 1024, c.vocab);
    std::vector<double> times;
    double loss = 0;
    for (int i = 0; i < 8; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      gpt.zero_grad();
      gpt.train_micro_step(tok.data(), tgt.data(), 1.0f, true);
      const double norm = std::sqrt(gpt.grad_sum_of_squares());
      AdamWStep adam;
      adam.learning_rate = 6e-4f;
      adam.t = i + 1;
      adam.grad_scale = norm > 1.0 ? static_cast<float>(1.0 / norm) : 1.0f;
      gpt.update(adam, 0.1f);
      gpt.synchronize();
      loss = gpt.mean_loss();
      if (i >= 2) times.push_back(std::chrono::duration<double>(
                                      std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    const double sec = times[times.size() / 2];
    const double flops = gpt.flops_per_micro_step();
    std::printf("%-44s %6ld %9.1f %10.0f %9.1f %5.1f%% %7.3f  activations %.1f GiB\n",
                variant.name, static_cast<long>(fits), sec * 1e3, fits * 1024.0 / sec,
                flops / sec / 1e12, 100.0 * flops / sec / peak, loss,
                g_device->device_memory_stats().in_use_bytes[MemoryKind::kActivations] /
                    1073741824.0);
    g_device->release_cached();
  }
  std::printf("(median of 6 steps after 2 warm-up; each step waits for its CPU AdamW, so the "
              "offload rows do not count the overlap with the next forward; MFU of %.1f TFLOP/s)\n",
              peak / 1e12);
}

}  // namespace
}  // namespace kt::gpu_test

int main(int argc, char** argv) {
  using namespace kt::gpu_test;
  const bool kernels = argc < 2 || std::strcmp(argv[1], "--kernels") == 0;
  const bool gpt = argc < 2 || std::strcmp(argv[1], "--gpt") == 0;
  if (!kernels && !gpt) {
    std::printf("usage: bench_gpu [--kernels | --gpt]\n");
    return 64;
  }
  if (CudaDevice::device_count() == 0) {
    std::printf("bench_gpu: NOT RUN — no usable CUDA device (%s)\n",
                CudaDevice::unavailable_reason().c_str());
    return 2;
  }
  g_seed = std::random_device{}();
  g_rng.seed(g_seed);
  try {
    CudaDevice device(0);
    g_device = &device;
    std::printf("bench_gpu on %s (%s, %.1f GiB), seed %u\n", device.name().c_str(),
                device.product().c_str(), device.total_memory_bytes() / 1073741824.0, g_seed);
    gpu::Context ctx(device.stream(kt::worker::StreamRole::kCompute).handle());
    if (kernels) bench(ctx);
    if (gpt) gpt_bench();
    KT_CUDA_CHECK(cudaDeviceSynchronize());
  } catch (const std::exception& e) {
    std::printf("FAIL  exception: %s\n", e.what());
    return 1;
  }
  return 0;
}

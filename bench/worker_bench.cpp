// Worker benchmark (CPU): the machine's single-GEMM peak, then one GPT-2 124M training step at
// B=4, T=64 (forward, backward, global norm, AdamW) against it — in fp32 against the sgemm peak,
// and in bf16 (where the CPU has AMX-BF16 or AVX512-BF16) against the same run's bf16 matmul
// peak (oneDNN's matmul primitive at 1024³, before and after the bf16 steps).
// Usage: bench_worker [steps]   (default 7 timed steps after 2 warm-up steps)
#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <dnnl.hpp>
#include <fstream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "api/model.h"
#include "kernels/ops.h"
#include "worker/device.h"
#include "worker/gpt.h"
#include "worker/offload.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string idle_note() {
  std::ifstream in("/proc/loadavg");
  std::string load;
  std::getline(in, load);
  return load;
}

// Random values in [-1, 1): GEMM peaks are measured on real data. Untouched memory is the
// kernel's shared zero page, which the caches serve, and zeros also draw less power: oneDNN's
// bf16 matmul ran 2–3× faster on them here (3.8 against 1.2–1.9 TFLOP/s at 256 × 768 × 3072).
std::vector<float> random_values(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// GFLOP/s of oneDNN's matmul primitive for (M,K)·(K,N) with inputs in `type`, fp32 output, on
// random inputs: whether the bf16 path (AVX512-BF16 / AMX where the CPU has them) is worth
// offering.
double matmul_gflops(dnnl::memory::data_type type, int64_t M, int64_t N, int64_t K) {
  using dnnl::memory;
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const memory::desc a({M, K}, type, memory::format_tag::ab);
  const memory::desc b({K, N}, type, memory::format_tag::ab);
  const memory::desc c({M, N}, memory::data_type::f32, memory::format_tag::ab);
  dnnl::matmul matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), engine));
  memory A(a, engine), B(b, engine), C(c, engine);
  for (auto [m, n, seed] : {std::tuple{&A, M * K, 1u}, std::tuple{&B, K * N, 2u}}) {
    const std::vector<float> values = random_values(static_cast<size_t>(n), seed);
    if (type == memory::data_type::bf16)
      kt::kernels::cpu::to_bf16(static_cast<uint16_t*>(m->get_data_handle()), values.data(), n);
    else
      std::copy(values.begin(), values.end(), static_cast<float*>(m->get_data_handle()));
  }
  std::fill_n(static_cast<float*>(C.get_data_handle()), M * N, 0.0f);
  std::vector<double> times;
  for (int i = 0; i < 25; ++i) {
    const auto t0 = Clock::now();
    matmul.execute(stream, {{DNNL_ARG_SRC, A}, {DNNL_ARG_WEIGHTS, B}, {DNNL_ARG_DST, C}});
    stream.wait();
    if (i >= 5) times.push_back(seconds_since(t0));
  }
  return 2.0 * M * N * K / median(times) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::max(5, std::atoi(argv[1])) : 7;
  std::printf("threads %d, /proc/loadavg: %s\n", omp_get_max_threads(), idle_note().c_str());

  // 1. Single-GEMM peak: oneDNN sgemm 1024³, all cores, 30 runs after 10 warm-ups, before and
  //    again after the model steps; the peak is the median of all 60, so that the machine's mood
  //    during one half does not decide the fraction.
  const int64_t n = 1024;
  std::vector<float> a = random_values(n * n, 3), b = random_values(n * n, 4), c(n * n);
  std::vector<double> all_gemm;
  auto gemm_peak = [&] {
    std::vector<double> times;
    for (int i = 0; i < 40; ++i) {
      const auto t0 = Clock::now();
      dnnl_sgemm('N', 'N', n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
      if (i >= 10) times.push_back(seconds_since(t0));
    }
    all_gemm.insert(all_gemm.end(), times.begin(), times.end());
    return 2.0 * n * n * n / median(times);
  };
  const double peak_before = gemm_peak();
  std::printf("%-40s %10.1f GFLOP/s (median of 30)\n", "sgemm 1024x1024x1024 (oneDNN), before",
              peak_before / 1e9);

  // 2. GPT-2 124M training step, B=4, T=64, in fp32 and in bf16 (bf16 matmuls on a bf16 copy
  //    of the weights, refreshed by the step's first forward; fp32 master weights and AdamW).
  const kt::api::ModelDims dims = kt::api::find_model_preset("gpt2-124m")->dims;
  const int64_t B = 4, T = 64;
  auto device = kt::worker::Device::cpu();
  struct StepTimes {
    double step, fwd_bwd, opt, flops;
  };
  auto model_steps = [&](kt::api::Precision precision) {
    kt::worker::Gpt model(kt::worker::GptConfig::from(dims), B, T, device, {}, 1,
                          kt::api::Recompute::kNone, precision);
    model.init_weights(1337);
    auto m = device->allocate_floats(model.num_parameters(), kt::worker::MemoryKind::kOptimizer);
    auto v = device->allocate_floats(model.num_parameters(), kt::worker::MemoryKind::kOptimizer);
    std::mt19937 rng(1);
    std::uniform_int_distribution<int32_t> tok(0, 50256);
    std::vector<int32_t> x(B * T), y(B * T);
    for (auto& t : x) t = tok(rng);
    for (auto& t : y) t = tok(rng);
    std::vector<double> step_s, fwd_bwd_s, opt_s;
    for (int i = 0; i < steps + 2; ++i) {
      const auto t0 = Clock::now();
      model.zero_grad();
      model.train_micro_step(x.data(), y.data(), 1.0f);
      const double fb = seconds_since(t0);
      const auto t1 = Clock::now();
      const double norm =
          std::sqrt(kt::kernels::cpu::sum_of_squares(model.grads(), model.num_parameters()));
      kt::kernels::AdamWStep s;
      s.t = i + 1;
      s.grad_scale = norm > 1.0 ? static_cast<float>(1.0 / norm) : 1.0f;
      // What the trainer runs without offload (bf16: the weights' bf16 copy in the same pass).
      for (int64_t u = 0; u <= dims.layers; ++u)
        kt::worker::update_on_device(model, u, m.data(), v.data(), s, 0.1f);
      const double opt = seconds_since(t1);
      if (i >= 2) {
        step_s.push_back(seconds_since(t0));
        fwd_bwd_s.push_back(fb);
        opt_s.push_back(opt);
      }
    }
    return StepTimes{median(step_s), median(fwd_bwd_s), median(opt_s),
                     model.flops_per_micro_step()};
  };
  const StepTimes fp32 = model_steps(kt::api::Precision::kFp32);
  const bool has_bf16 = !kt::kernels::cpu::bf16_matmul_isa().empty();
  std::vector<double> bf16_peaks;
  auto bf16_peak = [&] {
    bf16_peaks.push_back(matmul_gflops(dnnl::memory::data_type::bf16, n, n, n));
    return bf16_peaks.back();
  };
  StepTimes bf16{};
  if (has_bf16) {
    std::printf("%-40s %10.1f GFLOP/s (median of 20)\n", "bf16 matmul 1024^3 (oneDNN), before",
                bf16_peak());
    bf16 = model_steps(kt::api::Precision::kBf16);
    std::printf("%-40s %10.1f GFLOP/s (median of 20)\n", "bf16 matmul 1024^3 (oneDNN), after",
                bf16_peak());
  }
  const double peak_after = gemm_peak();
  std::printf("%-40s %10.1f GFLOP/s (median of 30)\n", "sgemm 1024x1024x1024 (oneDNN), after",
              peak_after / 1e9);
  const double peak = 2.0 * n * n * n / median(all_gemm);
  std::printf("%-40s %10.1f GFLOP/s (median of all 60)\n", "sgemm peak used", peak / 1e9);
  const double flops = fp32.flops;
  std::printf("%-40s %10.3f s   (forward+backward %.3f s, norm+AdamW %.3f s; median of %d)\n",
              "GPT-2 124M step, B=4 T=64, fp32", fp32.step, fp32.fwd_bwd, fp32.opt, steps);
  std::printf("%-40s %10.0f\n", "tokens/s", B * T / fp32.step);
  std::printf("%-40s %10.1f GFLOP/s = %.1f%% of the sgemm peak "
              "(6·N·tokens + 12·L·C·T·tokens)\n", "achieved", flops / fp32.step / 1e9, 100 * flops / fp32.step / peak);
  if (has_bf16) {
    const double peak16 = (bf16_peaks[0] + bf16_peaks[1]) / 2 * 1e9;
    std::printf("%-40s %10.3f s   (forward+backward %.3f s, norm+AdamW %.3f s; median of %d)\n",
                ("GPT-2 124M step, B=4 T=64, bf16 (" + kt::kernels::cpu::bf16_matmul_isa() + ")")
                    .c_str(),
                bf16.step, bf16.fwd_bwd, bf16.opt, steps);
    std::printf("%-40s %10.0f   (%.2fx the fp32 step)\n", "tokens/s", B * T / bf16.step,
                fp32.step / bf16.step);
    std::printf("%-40s %10.1f GFLOP/s = %.1f%% of the bf16 matmul peak (mean of before/after)\n",
                "achieved", flops / bf16.step / 1e9, 100 * flops / bf16.step / peak16);
  } else {
    std::printf("bf16 step: skipped, this CPU has neither AMX-BF16 nor AVX512-BF16\n");
  }

  // 3. The bf16 option: oneDNN's matmul primitive, fp32 vs bf16 inputs, on the model's shapes.
  std::printf("\n%-40s %12s %12s %8s\n", "oneDNN matmul primitive (M x K x N)", "fp32 GFLOP/s",
              "bf16 GFLOP/s", "ratio");
  const int64_t shapes[][3] = {
      {1024, 1024, 1024}, {256, 768, 3072}, {256, 3072, 768}, {256, 768, 50304}};
  for (const auto& sh : shapes) {
    const double f32 = matmul_gflops(dnnl::memory::data_type::f32, sh[0], sh[2], sh[1]);
    const double bf16 = matmul_gflops(dnnl::memory::data_type::bf16, sh[0], sh[2], sh[1]);
    char name[64];
    std::snprintf(name, sizeof name, "%lld x %lld x %lld", static_cast<long long>(sh[0]),
                  static_cast<long long>(sh[1]), static_cast<long long>(sh[2]));
    std::printf("%-40s %12.1f %12.1f %7.1fx\n", name, f32, bf16, bf16 / f32);
  }
  std::printf("/proc/loadavg after: %s\n", idle_note().c_str());
  return 0;
}

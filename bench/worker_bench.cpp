// Worker benchmark (CPU): the machine's single-GEMM peak, then one GPT-2 124M training step at
// B=4, T=64 (forward, backward, global norm, AdamW) against it.
// Usage: bench_worker [steps]   (default 7 timed steps after 2 warm-up steps)
#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "api/model.h"
#include "kernels/ops.h"
#include "worker/device.h"
#include "worker/gpt.h"

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

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::max(5, std::atoi(argv[1])) : 7;
  std::printf("threads %d, /proc/loadavg: %s\n", omp_get_max_threads(), idle_note().c_str());

  // 1. Single-GEMM peak: oneDNN sgemm 1024³, all cores, median of 30.
  const int64_t n = 1024;
  std::vector<float> a(n * n, 1.0f), b(n * n, 0.5f), c(n * n);
  std::vector<double> gemm;
  for (int i = 0; i < 33; ++i) {
    const auto t0 = Clock::now();
    dnnl_sgemm('N', 'N', n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    if (i >= 3) gemm.push_back(seconds_since(t0));
  }
  const double peak = 2.0 * n * n * n / median(gemm);
  std::printf("%-40s %10.1f GFLOP/s (median of 30, best %.1f)\n", "sgemm 1024x1024x1024 (oneDNN)",
              peak / 1e9, 2.0 * n * n * n / *std::min_element(gemm.begin(), gemm.end()) / 1e9);

  // 2. GPT-2 124M training step, B=4, T=64.
  const kt::api::ModelDims dims = kt::api::find_model_preset("gpt2-124m")->dims;
  const int64_t B = 4, T = 64;
  auto device = kt::worker::Device::cpu();
  kt::worker::Gpt model(kt::worker::GptConfig::from(dims), B, T, device);
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
    s.weight_decay = 0.1f;
    kt::kernels::cpu::adamw_update(model.params(), model.grads(), m.data(), v.data(),
                                   model.num_parameters(), s);
    const double opt = seconds_since(t1);
    if (i >= 2) {
      step_s.push_back(seconds_since(t0));
      fwd_bwd_s.push_back(fb);
      opt_s.push_back(opt);
    }
  }
  const double step = median(step_s);
  const double flops = model.flops_per_micro_step();
  std::printf("%-40s %10.3f s   (forward+backward %.3f s, norm+AdamW %.3f s; median of %d)\n",
              "GPT-2 124M step, B=4 T=64", step, median(fwd_bwd_s), median(opt_s), steps);
  std::printf("%-40s %10.0f\n", "tokens/s", B * T / step);
  std::printf("%-40s %10.1f GFLOP/s = %.1f%% of the sgemm peak (6·N·tokens + 12·L·C·T·tokens)\n",
              "achieved", flops / step / 1e9, 100 * flops / step / peak);
  return 0;
}

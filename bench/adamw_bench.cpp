// CPU AdamW throughput against the memory roofline measured in the same run: a STREAM-like
// in-place triad (a = a + s·b: reads a and b, writes a — like AdamW, no write-allocate traffic)
// gives the sustainable bandwidth; AdamW touches 28 bytes per parameter (read p, g, m, v; write
// p, m, v), so bandwidth / 28 B is the most parameters per second any CPU AdamW can reach.
// The mixed-precision kernel (bf16 gradients in, fp32 master, bf16 weights out — what the offload
// engine runs for a bf16 plan) also touches 28 bytes per parameter.
// Usage: bench_adamw   (10^7 and 10^8 parameters; median of 5 after 1 warm-up)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "kernels/ops.h"
#include "kernels/reference.h"

namespace {

template <class F>
double median_seconds(F&& f, int reps = 5) {
  f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main() {
  std::printf("threads %d\n", omp_get_max_threads());
  std::printf("%-12s %12s %14s %12s %10s %14s %10s %12s\n", "parameters", "triad GB/s",
              "roofline Mp/s", "fp32 Mp/s", "of roof", "bf16 i/o Mp/s", "of roof",
              "scalar Mp/s");
  for (const int64_t n : {int64_t{10'000'000}, int64_t{100'000'000}}) {
    std::vector<float> p(n, 0.5f), g(n, 0.01f), m(n, 0.0f), v(n, 0.0f);
    const double triad = median_seconds([&] {
      float* a = m.data();
      const float* b = g.data();
#pragma omp parallel for simd
      for (int64_t i = 0; i < n; ++i) a[i] = a[i] + 1.5f * b[i];
    });
    const double bandwidth = 3.0 * 4 * n / triad;  // two reads, one write
    std::fill(m.begin(), m.end(), 0.0f);
    kt::kernels::AdamWStep step;
    step.weight_decay = 0.1f;
    const double fast = median_seconds([&] {
      kt::kernels::cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, step);
      ++step.t;
    });
    std::vector<uint16_t> g16(n, 0x3c23), p16(n);  // 0.00995 in bf16
    const double mixed = median_seconds([&] {
      kt::kernels::cpu::adamw_update_mixed(p.data(), nullptr, g16.data(), m.data(), v.data(),
                                           p16.data(), n, step);
      ++step.t;
    });
    const double scalar = median_seconds([&] {
      kt::kernels::reference::adamw_update(p.data(), g.data(), m.data(), v.data(), n, step);
      ++step.t;
    }, 3);
    const double roofline = bandwidth / 28.0;
    std::printf("%-12lld %12.1f %14.1f %12.1f %9.0f%% %14.1f %9.0f%% %12.1f\n",
                static_cast<long long>(n), bandwidth / 1e9, roofline / 1e6, n / fast / 1e6,
                100 * (n / fast) / roofline, n / mixed / 1e6, 100 * (n / mixed) / roofline,
                n / scalar / 1e6);
  }
  return 0;
}

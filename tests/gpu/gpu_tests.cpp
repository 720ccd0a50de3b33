// gpu_tests: the GPU tests, a plain program with its own checks (GoogleTest is not on the GPU
// machine). The tests live by subject in kernel_tests.cpp, model_tests.cpp and
// parallel_tests.cpp (gpu_tests.h), their helpers in test_support.h; the GPU benchmarks are
// bench/gpu_bench.cpp (bench_gpu).
//
//   gpu_tests [SEED]               the CUDA device and every kernel, then the CUDA model on one
//                                  rank and on several, then the NCCL reducer on one rank
//   gpu_tests --model-only [SEED]  the CUDA model's tests only (what the emulated build runs:
//                                  tests/emulation/README.md)
//
// SEED (default: random) seeds every random input; a failure prints it. Exit status 0 only if
// every check passed; with no usable GPU it says so and exits 2 (never counted as a pass).
#include "tests/gpu/gpu_tests.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "tests/gpu/test_support.h"
#ifdef KT_CUDA_EMULATED
#include "tests/emulation/stream_order.h"
#endif

namespace kt::gpu_test {
namespace {

// The CUDA model's tests, one rank then several, in this order (the inputs are drawn from one
// seeded generator). Under emulation each is also checked for stream-order races
// (tests/emulation/stream_order.h).
void run_model_tests() {
  std::vector<NamedTest> tests = model_tests();
  for (const NamedTest& t : parallel_tests()) tests.push_back(t);
  for (const auto& [name, test] : tests) {
#ifdef KT_CUDA_EMULATED
    const size_t before = emulation::stream_order_races();
    test();
    const size_t races = emulation::stream_order_races() - before;
    check(races == 0, std::string(name) + ": " + std::to_string(races) +
                          " stream-order races (printed above as STREAM-ORDER RACE)");
#else
    (void)name;
    test();
#endif
  }
}

}  // namespace
}  // namespace kt::gpu_test

int main(int argc, char** argv) {
  using namespace kt::gpu_test;
  if (argc > 1 &&
      (std::strcmp(argv[1], "--bench") == 0 || std::strcmp(argv[1], "--gpt-bench") == 0)) {
    std::printf("gpu_tests: %s moved to bench_gpu (bench_gpu --kernels, bench_gpu --gpt)\n",
                argv[1]);
    return 64;
  }
  const bool model_mode = argc > 1 && std::strcmp(argv[1], "--model-only") == 0;
  if (CudaDevice::device_count() == 0) {
    std::printf(
        "gpu_tests: NOT RUN — no usable CUDA device (%s). These tests need a GPU: run "
        "scripts/device-check.sh on a GPU machine.\n",
        CudaDevice::unavailable_reason().c_str());
    return 2;
  }
#if defined(KT_CUDA_EMULATED) && defined(KT_EMULATED_NCCL)
  setenv("KUBETRAIN_NCCL_LIBRARY", KT_EMULATED_NCCL, 0);  // the emulated libnccl, unless named
#endif
  g_seed = argc > 2 ? static_cast<unsigned>(std::stoul(argv[2])) : std::random_device{}();
  if (!model_mode && argc > 1) g_seed = static_cast<unsigned>(std::stoul(argv[1]));
  g_rng.seed(g_seed);
  try {
    CudaDevice device(0);
    g_device = &device;
    std::printf("gpu_tests on %s (%s, %.1f GiB), seed %u\n", device.name().c_str(),
                device.product().c_str(), device.total_memory_bytes() / 1073741824.0, g_seed);
    gpu::Context ctx(device.stream(kt::worker::StreamRole::kCompute).handle());
    if (model_mode) {
      run_model_tests();
    } else {
      run_kernel_tests(ctx);
      run_model_tests();
      test_nccl_reducer_single_rank();
    }
    KT_CUDA_CHECK(cudaDeviceSynchronize());
  } catch (const std::exception& e) {
    std::printf("FAIL  exception: %s\n", e.what());
    return 1;
  }
  std::printf("%d checks, %d failed\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}

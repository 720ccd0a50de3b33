// `kubetrain-worker profile` on a GPU node (worker/profile.h: measure_gpu_profile): the figures
// the cost model consumes, per GPU, measured with the kernels and the model the CUDA worker runs.
// Timings are host wall-clock from enqueue to the stream's synchronisation, medians of a few
// repetitions of work that takes milliseconds (the synchronisation's microseconds are noise).
// Letters: B batch, T time, C channels, OC output channels (kernels/cuda/ops.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "api/error.h"
#include "api/hardware.h"
#include "api/model.h"
#include "worker/comm.h"
#include "worker/profile.h"

#ifdef KUBETRAIN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/ops.h"
#include "worker/cuda_device.h"
#include "worker/cuda_gpt.h"
#ifdef KUBETRAIN_WITH_NCCL
#include "worker/comm_nccl.h"
#endif
#endif

namespace kt::worker {

#ifdef KUBETRAIN_WITH_CUDA
namespace {

namespace kc = kernels::cuda;
using profiling::median_seconds;
using profiling::say;

// Seconds per call of `enqueue` (asynchronous work on a stream that `sync` waits for): the median
// of reps timings of n calls and one sync, n chosen so that a timing takes at least 20 ms (a
// GPT-2 124M micro-batch's GEMMs take a tenth of a millisecond on an H200, and the host's
// synchronisation tens of microseconds).
double seconds_per_call(int reps, const std::function<void()>& enqueue,
                        const std::function<void()>& sync) {
  const double once = median_seconds(1, [&] { enqueue(), sync(); });
  const int n = static_cast<int>(std::clamp(std::ceil(0.02 / std::max(once, 1e-7)), 1.0, 10000.0));
  return median_seconds(reps,
                        [&] {
                          for (int i = 0; i < n; ++i) enqueue();
                          sync();
                        }) /
         n;
}

// Device memory of `count` elements of T, freed with the device's allocator.
template <typename T>
struct DeviceArray {
  CudaDevice* device = nullptr;
  T* data = nullptr;
  DeviceArray(CudaDevice& d, int64_t count, MemoryKind kind) : device(&d) {
    data = static_cast<T*>(d.allocate(static_cast<size_t>(count) * sizeof(T), kind));
  }
  ~DeviceArray() { device->deallocate(data); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
};

// `count` uniform values in [-1, 1) from `seed`, on the device, in fp32 and in bf16.
void fill_random(CudaDevice& device, const kc::Context& ctx, float* out32, kc::bf16* out16,
                 int64_t count, uint32_t seed) {
  const std::vector<float> host = profiling::random_floats(count, seed);
  CudaStream& stream = device.stream(StreamRole::kCompute);
  device.copy(out32, host.data(), host.size() * sizeof(float), stream);
  if (out16) kc::cast_to_bf16(ctx, out16, out32, count);
  stream.synchronize();
}

// One of the model's GEMMs at BT rows: inp (BT,C) · weight (OC,C)ᵀ, forward and backward, in
// bf16 (the CUDA model's precision) and in fp32.
struct GemmOnDevice {
  int64_t C, OC;
  std::unique_ptr<DeviceArray<float>> inp32, weight32, out32, dinp32, dweight, dbias;
  std::unique_ptr<DeviceArray<kc::bf16>> inp16, weight16, out16, dinp16;
};

std::vector<GemmOnDevice> gemms_on_device(CudaDevice& device, const kc::Context& ctx,
                                          const api::ModelDims& m, int64_t BT) {
  const int64_t C = m.hidden, F = m.ffn_hidden;
  // qkv, the attention projection, fc, fc2 and the LM head (as the CPU profile's model_gemms).
  const std::pair<int64_t, int64_t> shapes[] = {
      {C, 3 * C}, {C, C}, {C, F}, {F, C}, {C, m.padded_vocab()}};
  std::vector<GemmOnDevice> out;
  uint32_t seed = 1;
  for (const auto& [in, o] : shapes) {
    GemmOnDevice g{in, o, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}};
    auto f32 = [&](int64_t n) {
      return std::make_unique<DeviceArray<float>>(device, n, MemoryKind::kWorkspace);
    };
    auto b16 = [&](int64_t n) {
      return std::make_unique<DeviceArray<kc::bf16>>(device, n, MemoryKind::kWorkspace);
    };
    g.inp32 = f32(BT * in), g.weight32 = f32(o * in), g.out32 = f32(BT * o);
    g.dinp32 = f32(BT * in), g.dweight = f32(o * in), g.dbias = f32(o);
    g.inp16 = b16(BT * in), g.weight16 = b16(o * in), g.out16 = b16(BT * o);
    g.dinp16 = b16(BT * in);
    fill_random(device, ctx, g.inp32->data, g.inp16->data, BT * in, seed++);
    fill_random(device, ctx, g.weight32->data, g.weight16->data, o * in, seed++);
    fill_random(device, ctx, g.out32->data, g.out16->data, BT * o, seed++);  // the backward's dout
    out.push_back(std::move(g));
  }
  return out;
}

// Enqueues one forward and backward of every GEMM; returns their FLOPs (6·BT·C·OC each).
double enqueue_gemms(const kc::Context& ctx, std::vector<GemmOnDevice>& gemms, int64_t BT,
                     bool bf16) {
  double flops = 0;
  for (GemmOnDevice& g : gemms) {
    if (bf16) {
      kc::matmul_forward_bf16(ctx, g.out16->data, g.inp16->data, g.weight16->data, nullptr, BT,
                              g.C, g.OC);
      kc::matmul_backward_bf16(ctx, g.dinp16->data, g.dweight->data, g.dbias->data, g.out16->data,
                               g.inp16->data, g.weight16->data, BT, g.C, g.OC, false, false);
    } else {
      kc::matmul_forward(ctx, g.out32->data, g.inp32->data, g.weight32->data, nullptr, BT, g.C,
                         g.OC);
      kc::matmul_backward(ctx, g.dinp32->data, g.dweight->data, g.dbias->data, g.out32->data,
                          g.inp32->data, g.weight32->data, BT, g.C, g.OC);
    }
    flops += 6.0 * static_cast<double>(BT) * static_cast<double>(g.C) * static_cast<double>(g.OC);
  }
  return flops;
}

// Median seconds of one micro-batch (forward and backward, bf16) of the CUDA model.
double micro_batch_seconds(CudaDevice& device, const api::ModelDims& m, int64_t B, int64_t T,
                           int reps, api::Recompute recompute) {
  CudaGptOptions options;
  options.recompute = recompute;
  CudaGpt model(device, GptConfig::from(m), B, T, options);
  model.init_weights(1);
  std::vector<int32_t> tokens(static_cast<size_t>(B * T + 1));
  std::mt19937 rng(3);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(m.vocab));
  return seconds_per_call(
      reps,
      [&] {
        model.zero_grad();
        model.train_micro_step(tokens.data(), tokens.data() + 1, 1.0f, true);
      },
      [&] { model.synchronize(); });
}

// The built-in profile of the node kind measured: `kind` when given (the operator passes the
// node's), else the GPU's product; the two must agree where both are known.
api::HardwareProfile kind_profile(const std::string& product, const std::string& kind) {
  const api::HardwareProfile* of_product = api::find_profile(product);
  if (kind.empty()) {
    if (!of_product || of_product->is_cpu)
      throw Error("profile: the GPU is a \"" + product +
                  "\", which is not a known product (docs/HARDWARE.md lists them); name its "
                  "node kind with --kind");
    return *of_product;
  }
  const api::HardwareProfile* of_kind = api::find_profile(kind);
  if (!of_kind || of_kind->is_cpu)
    throw Error("profile: --kind \"" + kind +
                "\" is not a GPU node kind (docs/HARDWARE.md lists the known products)");
  if (of_product && of_product->name != of_kind->name)
    throw Error("profile: --kind " + kind + " names " + of_kind->name + ", and this GPU is a \"" +
                product + "\" (" + of_product->name + ")");
  return *of_kind;
}

std::string version_text(int version) {  // 13000 -> "13.0"
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

}  // namespace

std::optional<api::MeasuredProfile> measure_gpu_profile(const ProfileOptions& options) {
  if (options.device == "cpu") return std::nullopt;
  const int gpus = CudaDevice::device_count();
  if (gpus == 0) {
    if (options.device == "auto") return std::nullopt;
    throw Error("profile: --device cuda, and no GPU is usable here: " +
                CudaDevice::unavailable_reason());
  }
  const profiling::Shapes shapes = profiling::shapes_of(options);
  const api::ModelDims& m = shapes.model;
  const int64_t B = shapes.B, T = shapes.T, BT = B * T;
  const int reps = shapes.reps;

  api::MeasuredProfile out;
  auto& record = out.measurements;
  std::unique_ptr<CudaDevice> device = std::make_unique<CudaDevice>(0);
  out.profile = kind_profile(device->product(), options.kind);
  auto& hw = out.profile;
  hw.memory_bytes = static_cast<double>(device->total_memory_bytes());
  hw.has_bf16 = device->compute_capability() >= 80;
  std::fprintf(stderr,
               "profile: %s (%s, node kind %s), %d GPU(s); the GEMMs and one micro-batch of "
               "L=%lld h=%lld at B=%lld T=%lld\n",
               device->name().c_str(), device->product().c_str(), hw.name.c_str(), gpus,
               static_cast<long long>(m.layers), static_cast<long long>(m.hidden),
               static_cast<long long>(B), static_cast<long long>(T));
  CudaStream& compute = device->stream(StreamRole::kCompute);
  auto ctx = std::make_unique<kc::Context>(compute.handle());

  // 1. The model's GEMMs (cuBLASLt): bf16 (tensor cores) and fp32.
  double gemm16_rate = 0, gemm_alone_s = 0;
  std::vector<GemmOnDevice> gemms = gemms_on_device(*device, *ctx, m, BT);
  {
    double flops = 0;
    auto sync = [&] { compute.synchronize(); };
    gemm_alone_s = seconds_per_call(
        reps, [&] { flops = enqueue_gemms(*ctx, gemms, BT, true); }, sync);
    gemm16_rate = flops / gemm_alone_s;
    hw.peak_bf16_flops = gemm16_rate;
    record["bf16GemmFlopsPerSecond"] = gemm16_rate;
    say("model GEMMs in bf16 (fwd + bwd)", gemm16_rate / 1e12, "TFLOP/s");
    const double s = seconds_per_call(
        reps, [&] { flops = enqueue_gemms(*ctx, gemms, BT, false); }, sync);
    hw.peak_fp32_flops = flops / s;
    record["gemmFlopsPerSecond"] = flops / s;
    say("model GEMMs in fp32 (fwd + bwd)", flops / s / 1e12, "TFLOP/s");
  }

  // 2. One micro-batch of the CUDA model (bf16), then with full recompute, then plain again
  //    (bracketing the recompute: the clocks' drift falls out of the difference).
  {
    const double micro_flops = profiling::micro_batch_flops(shapes);
    const double step_s = micro_batch_seconds(*device, m, B, T, reps, api::Recompute::kNone);
    const double full_s = micro_batch_seconds(*device, m, B, T, reps, api::Recompute::kFull);
    const double again_s = micro_batch_seconds(*device, m, B, T, reps, api::Recompute::kNone);
    const double step_rate = micro_flops / step_s;
    // The CUDA worker trains in bf16 only: one η for both precisions.
    hw.achieved_fraction = std::clamp(step_rate / gemm16_rate, 0.01, 1.0);
    hw.achieved_fraction_bf16 = hw.achieved_fraction;
    record["bf16MicroBatchSeconds"] = step_s;
    record["bf16MicroBatchSecondsAfterwards"] = again_s;
    record["bf16MicroBatchFullRecomputeSeconds"] = full_s;
    say("bf16 micro-batch (fwd + bwd, the model's FLOPs)", step_rate / 1e12, "TFLOP/s");
    say("  = achieved fraction of the bf16 GEMM rate", hw.achieved_fraction, "");
    hw.recompute_rate_ratio =
        profiling::recompute_rate_ratio(m, B, T, micro_flops, step_s, full_s, again_s);
    say("bf16 micro-batch with full recompute", full_s * 1e3, "ms");
    say("  = recompute rate over the micro-batch's", hw.recompute_rate_ratio, "");
  }

  // 3. Pinned host<->device copies, each direction alone and both at once (the offload engine's
  //    gradients go down while parameters come up).
  {
    const int64_t bytes = options.quick ? (int64_t{16} << 20) : (int64_t{256} << 20);
    void* host_up = device->allocate_pinned(bytes, MemoryKind::kOptimizer);
    void* host_down = device->allocate_pinned(bytes, MemoryKind::kOptimizer);
    DeviceArray<char> up(*device, bytes, MemoryKind::kWorkspace);
    DeviceArray<char> down(*device, bytes, MemoryKind::kWorkspace);
    CudaStream& h2d = device->stream(StreamRole::kHostToDevice);
    CudaStream& d2h = device->stream(StreamRole::kDeviceToHost);
    const double n = static_cast<double>(bytes);
    const double h2d_s = median_seconds(reps, [&] {
      device->copy(up.data, host_up, bytes, h2d);
      h2d.synchronize();
    });
    const double d2h_s = median_seconds(reps, [&] {
      device->copy(host_down, down.data, bytes, d2h);
      d2h.synchronize();
    });
    const double both_s = median_seconds(reps, [&] {
      device->copy(up.data, host_up, bytes, h2d);
      device->copy(host_down, down.data, bytes, d2h);
      h2d.synchronize();
      d2h.synchronize();
    });
    device->deallocate_pinned(host_up);
    device->deallocate_pinned(host_down);
    // Per direction, achievable: the slower direction alone (the cost model's PCIe lanes each
    // carry one direction; both at once is recorded).
    hw.host_link_bandwidth = std::min(n / h2d_s, n / d2h_s);
    record["pinnedHostToDeviceBytesPerSecond"] = n / h2d_s;
    record["pinnedDeviceToHostBytesPerSecond"] = n / d2h_s;
    record["pinnedBothDirectionsBytesPerSecondEach"] = n / both_s;
    say("pinned host -> device", n / h2d_s / 1e9, "GB/s");
    say("pinned device -> host", n / d2h_s / 1e9, "GB/s");
    say("both at once, each direction", n / both_s / 1e9, "GB/s");
  }

  // 4. AdamW on the device (the CUDA model's multi-tensor kernel, with the bf16 copy) and on the
  //    host's cores (the offload engine's). The cost model charges the device's AdamW
  //    api::kAdamBytesPerParam bytes per parameter at memoryBandwidth, so the kernel's rate sets
  //    that figure; a device-to-device copy's bandwidth is recorded beside it.
  {
    const int64_t n = options.quick ? (int64_t{1} << 22) : (int64_t{1} << 26);
    DeviceArray<float> p(*device, n, MemoryKind::kParams), g(*device, n, MemoryKind::kGrads);
    DeviceArray<float> mo(*device, n, MemoryKind::kOptimizer), v(*device, n, MemoryKind::kOptimizer);
    DeviceArray<kc::bf16> p16(*device, n, MemoryKind::kParams);
    fill_random(*device, *ctx, p.data, p16.data, n, 21);
    fill_random(*device, *ctx, g.data, nullptr, n, 22);
    fill_random(*device, *ctx, mo.data, nullptr, n, 23);
    fill_random(*device, *ctx, v.data, nullptr, n, 24);
    kc::AdamWTensor tensor{p.data, g.data, mo.data, v.data, p16.data, n};
    kernels::AdamWStep step;
    step.learning_rate = 1e-4f;
    auto sync = [&] { compute.synchronize(); };
    const double adam_s = seconds_per_call(
        reps, [&] { kc::adamw_update_multi(*ctx, &tensor, 1, step); }, sync);
    const double rate = static_cast<double>(n) / adam_s;
    hw.memory_bandwidth = rate * api::kAdamBytesPerParam;
    record["deviceAdamwParamsPerSecond"] = rate;
    say("AdamW on the device", rate / 1e9, "G params/s");
    say("  = memory bandwidth (its bytes per parameter)", hw.memory_bandwidth / 1e9, "GB/s");
    const double copy_s = seconds_per_call(
        reps,
        [&] { device->copy(g.data, p.data, static_cast<size_t>(n) * sizeof(float), compute); },
        sync);
    record["deviceCopyBytesPerSecond"] = 2.0 * 4.0 * static_cast<double>(n) / copy_s;
    say("device -> device copy (read + write)", 8.0 * static_cast<double>(n) / copy_s / 1e9,
        "GB/s");
    const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const double cpu_rate = profiling::cpu_adamw_params_per_second(
        options.quick ? (int64_t{1} << 20) : (int64_t{1} << 23), reps);
    hw.cpu_adam_params_per_core = cpu_rate / threads;
    record["adamwParamsPerSecond"] = cpu_rate;
    say("AdamW on the host, all threads", cpu_rate / 1e6, "M params/s");
  }

  // 5. NCCL between two GPUs of this node (ranks 0 and 1, threads of this process): all-reduce
  //    latency and bus bandwidth, and how much slower GPU 0's GEMMs run while all-reduces go on
  //    beside them (the Oases overlap's interference). One GPU, or no libnccl: the built-in
  //    figures stay.
  std::string nccl_note = "one GPU: the all-reduce figures are the built-in profile's";
#ifdef KUBETRAIN_WITH_NCCL
  std::string why;
  const bool nccl = gpus >= 2 && nccl_available(&why);
  if (gpus >= 2 && !nccl) nccl_note = "libnccl did not load (" + why + ")";
  if (nccl) {
    const int64_t big = options.quick ? (int64_t{1} << 20) : (int64_t{1} << 24);  // floats
    const int small_times = options.quick ? 20 : 100, big_times = options.quick ? 2 : 8;
    double small_s = 0, big_s = 0, beside_s = 0;
    // GEMMs alone again, right before, so that both timings see the same clocks: `inner`
    // sequences of them per timing, as beside the all-reduces.
    const int inner = static_cast<int>(std::clamp(std::ceil(0.02 / gemm_alone_s), 1.0, 10000.0));
    auto gemm_sequences = [&] {
      for (int i = 0; i < inner; ++i) enqueue_gemms(*ctx, gemms, BT, true);
      compute.synchronize();
    };
    gemm_alone_s = median_seconds(reps, gemm_sequences);
    // Each rank: a device, an NCCL group over the Gloo bootstrap, the same calls in the same
    // order. Rank 0 times; it tells rank 1 how many all-reduces cover its GEMMs.
    auto run_rank = [&](Communicator& bootstrap) {
      const int rank = bootstrap.rank();
      std::unique_ptr<CudaDevice> second_gpu;
      if (rank == 1) second_gpu = std::make_unique<CudaDevice>(1);  // current on this thread
      CudaDevice& mine = rank == 0 ? *device : *second_gpu;
      DeviceArray<float> x(mine, big, MemoryKind::kWorkspace);
      std::unique_ptr<Communicator> group = make_nccl_communicator(bootstrap, mine.ordinal());
      auto many = [&](int times, size_t count) {
        for (int i = 0; i < times; ++i) group->allreduce(x.data, count);
      };
      const double s1 = median_seconds(reps, [&] { many(small_times, 1); }) / small_times;
      const double s2 = median_seconds(reps, [&] { many(big_times, big); }) / big_times;
      // Twice the GEMMs' time alone: they run slower beside the all-reduces.
      float cover = static_cast<float>(std::ceil(2.0 * gemm_alone_s / std::max(s2, 1e-9))) + 1.0f;
      bootstrap.broadcast(&cover, 1, 0);
      const int count = static_cast<int>(std::min(cover, 1000.0f));
      // The all-reduces are enqueued first (asynchronous, on the group's stream), so that the
      // GEMMs run beside them from start to end; only the GEMMs are timed.
      std::vector<double> beside;
      for (int r = 0; r <= reps; ++r) {
        std::vector<std::shared_ptr<CommWork>> works;
        for (int i = 0; i < count; ++i)
          works.push_back(group->allreduce_async(x.data, big, ReduceOp::kSum));
        if (rank == 0) {
          const auto t0 = std::chrono::steady_clock::now();
          gemm_sequences();
          if (r > 0)
            beside.push_back(
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        for (auto& w : works) w->wait();
      }
      if (rank == 0) {
        std::sort(beside.begin(), beside.end());
        small_s = s1, big_s = s2, beside_s = beside[beside.size() / 2];
      }
    };
    profiling::with_second_rank(run_rank, run_rank, profiling::SecondRank::kThread);
    const double bytes = 4.0 * static_cast<double>(big);
    profiling::set_two_rank_figures(hw, record, "2 GPUs, NCCL", small_s, big_s, bytes, gemm_alone_s,
                                    beside_s);
    record["ncclAllreduce1FloatSeconds"] = small_s;
    record["ncclAllreduceBigSeconds"] = big_s;
    record["ncclAllreduceBigBytes"] = bytes;
    nccl_note.clear();
  }
#endif
  if (!nccl_note.empty()) std::fprintf(stderr, "profile: all-reduce: %s\n", nccl_note.c_str());

  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  profiling::finish_profile(
      out, options, shapes,
      {{"gpu", device->product()},
       {"gpus", std::to_string(gpus)},
       {"driver", "CUDA " + version_text(driver) + " (runtime " + version_text(runtime) + ")"}});
  ctx.reset();
  return out;
}

#else  // built without the CUDA path

std::optional<api::MeasuredProfile> measure_gpu_profile(const ProfileOptions& options) {
  if (options.device == "cuda")
    throw Error("profile: --device cuda, and this kubetrain-worker was built without the CUDA "
                "path (nvcc was not found at build time)");
  return std::nullopt;
}

#endif

}  // namespace kt::worker

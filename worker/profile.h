// `kubetrain-worker profile`: measures on this machine what the planner's cost model consumes
// and writes a measured hardware profile (api/measured_profile.h) in the built-in profiles'
// schema, with its provenance. CPU nodes (docs/PLANNER.md, "Hardware profiles"):
//   * peakFp32Flops: the model's own GEMMs (forward and backward of qkv, the projection, fc,
//     fc2 and the LM head at the micro-batch's rows), per core;
//   * achievedFraction: a whole micro-batch's forward and backward of the same model (the real
//     Gpt), as a fraction of that GEMM rate;
//   * memoryBandwidth (a triad), hostLinkBandwidth (memcpy, one thread) and
//     cpuAdamParamsPerCore (the CPU AdamW kernel), per core;
//   * intraAllreduceBusbw and allreduceLatency: Gloo all-reduces between this process and a
//     child, 2 ranks over loopback TCP (α from a 1-float all-reduce, bus bandwidth from 4 MiB);
//   * overlapInterference: how much slower the GEMMs run while those all-reduces go on.
// GPU nodes: measure_gpu_profile (worker/cuda_profile.cpp) measures the same figures per GPU.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "api/hardware.h"
#include "api/measured_profile.h"
#include "api/plan.h"

namespace kt::worker {

class Communicator;  // worker/comm.h

struct ProfileOptions {
  // The model and micro-batch whose shapes are measured (a plan's), or GPT-2 124M at B 4, T 64.
  const api::Plan* plan = nullptr;
  int threads = 0;     // 0: every core of this machine
  bool quick = false;  // small shapes and few repetitions (tests): seconds, not half a minute
  std::string version, command;
  // "cpu", "cuda", or "auto": the GPU where this machine has one.
  std::string device = "auto";
  // The node kind a GPU profile is for (a built-in profile's name or alias, as the operator
  // knows it from the node's labels); "": the GPU's own product name.
  std::string kind;
};

// Runs the measurements (progress on stderr) and returns the profile of a CPU node.
api::MeasuredProfile measure_profile(const ProfileOptions& options);

// The profile of a GPU node, per GPU (docs/HARDWARE.md, "Measured profiles"): the model's bf16
// and fp32 GEMMs (cuBLASLt), one micro-batch of the CUDA model with and without full recompute,
// pinned host<->device copies, the device and the CPU AdamW, and — where the node has 2+ GPUs and
// libnccl — NCCL all-reduces between two of them and the GEMMs' slow-down beside them.
// Nothing when options.device is "cpu", or "auto" on a machine without a usable GPU; throws when
// it is "cuda" and there is none (or this worker was built without the CUDA path).
std::optional<api::MeasuredProfile> measure_gpu_profile(const ProfileOptions& options);

// What the CPU and the GPU profilers share (worker/profile.cpp).
namespace profiling {

// The model and micro-batch measured: a plan's, else GPT-2 124M at B 4, T 64 (tiny with quick).
struct Shapes {
  api::ModelDims model;
  int64_t B = 4, T = 64;
  int reps = 7;  // timings per median
};
Shapes shapes_of(const ProfileOptions& options);

// `n` uniform values in [-1, 1) from `seed`.
std::vector<float> random_floats(int64_t n, uint32_t seed);
// The training FLOPs of one B×T micro-batch of the model (api/flops.h).
double micro_batch_flops(const Shapes& shapes);
// The median of `reps` timings of fn (after one warm-up).
double median_seconds(int reps, const std::function<void()>& fn);
// One line of progress on stderr.
void say(const std::string& what, double value, const char* unit);
// The CPU AdamW kernel's parameters per second with this process's OpenMP threads.
double cpu_adamw_params_per_second(int64_t n, int reps);
// From a 2-rank group's timings — one all-reduce of 1 float, one of `big_bytes`, the GEMMs alone
// and beside all-reduces — the profile's allreduceLatency (α per ring step), intraAllreduceBusbw
// and overlapInterference, by the cost model's all-reduce time 2(n−1)·α + 2(n−1)/n · bytes /
// busbw with n = 2 (planner/cost_model.h).
// Says them (`ranks`: "2 processes", "2 GPUs") and records the GEMM timings in `record`.
void set_two_rank_figures(api::HardwareProfile& hw, std::map<std::string, double>& record,
                          const std::string& ranks, double one_float_seconds, double big_seconds,
                          double big_bytes, double gemm_alone_seconds, double gemm_beside_seconds);
// The profile's recomputeRateRatio from a micro-batch's seconds without recompute, with full
// recompute and without again (bracketing: the machine's drift between them falls out). Full
// recompute re-runs every layer's forward, (8bsh² + 4bshf + 4bs²h)·L FLOPs (planner/
// cost_model.h); the ratio is their rate over the micro-batch's (`step_flops` / `plain`),
// clamped to the decoder's [0.5, 3].
double recompute_rate_ratio(const api::ModelDims& m, int64_t B, int64_t T, double step_flops,
                            double plain_seconds, double full_seconds, double plain_again_seconds);
// The profile's provenance — host, CPU model, the model's shapes, date, version, command, and
// `device`'s entries (gpu, threads, driver, …) — and its source line; marks it measured.
void finish_profile(api::MeasuredProfile& out, const ProfileOptions& options, const Shapes& shapes,
                    const std::map<std::string, std::string>& device);

// Runs `second` as rank 1 and `first` as rank 0 of a 2-rank Gloo group over loopback TCP; waits
// for the second. kProcess: a child process, as two ranks of a node are. kThread: a thread of
// this process, for ranks that each use a GPU (CUDA does not survive fork). Throws if either
// fails.
enum class SecondRank { kProcess, kThread };
void with_second_rank(const std::function<void(Communicator&)>& second,
                      const std::function<void(Communicator&)>& first,
                      SecondRank where = SecondRank::kProcess);

}  // namespace profiling

}  // namespace kt::worker

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
#pragma once

#include <string>

#include "api/measured_profile.h"
#include "api/plan.h"

namespace kt::worker {

struct ProfileOptions {
  // The model and micro-batch whose shapes are measured (a plan's), or GPT-2 124M at B 4, T 64.
  const api::Plan* plan = nullptr;
  int threads = 0;     // 0: every core of this machine
  bool quick = false;  // small shapes and few repetitions (tests): seconds, not half a minute
  std::string version, command;
};

// Runs the measurements (progress on stderr) and returns the profile.
api::MeasuredProfile measure_profile(const ProfileOptions& options);

}  // namespace kt::worker

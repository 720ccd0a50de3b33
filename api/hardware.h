// Hardware profiles: the figures the planner's cost model needs for one kind of accelerator (or
// for a CPU-only node), keyed by GPU product. Built-in figures come from vendor datasheets and
// papers, each cited where it is defined (api/hardware_profiles.cpp, docs/HARDWARE.md); nodes
// override them with annotations (kubetrain.dev/...), and measured profiles will replace them.
//
// Units: FLOP/s, bytes/s, bytes, seconds. All bandwidths are bytes per second in ONE direction.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace kt::api {

enum class LinkKind { kNvlink, kPcie, kLoopback };
std::string_view to_string(LinkKind k);

struct HardwareProfile {
  std::string name;                  // canonical key, e.g. "H200", "RTX-3090", "cpu"
  std::vector<std::string> aliases;  // GPU Feature Discovery product strings it matches
  bool is_cpu = false;               // a CPU-only node: one "slot" per core, no device memory

  // Compute. For a GPU: per device. For the cpu profile: per core.
  double peak_bf16_flops = 0;      // dense tensor-core bf16 (fp16 where the GPU has no bf16)
  double peak_fp32_flops = 0;      // dense fp32 (non-tensor-core)
  double achieved_fraction = 0.5;  // η: sustained fraction of peak in transformer GEMMs
  // η for bf16 where it differs from η (0: the same). CPUs: bf16 speeds up the matmuls (AMX) and
  // not the memory-bound rest of a step (AdamW, row kernels), so the step keeps a smaller share
  // of the bf16 peak.
  double achieved_fraction_bf16 = 0;
  // GPUs: false when bf16 is emulated / planned with the fp16 peak. The cpu profile: whether the
  // CPU is known to have bf16 matmul instructions (AMX-BF16 or AVX512-BF16) — from Node Feature
  // Discovery labels (apply_cpu_features) or a measured profile; built in: false (unknown).
  bool has_bf16 = true;

  // Memory. For a GPU: per device. For the cpu profile: 0 (the node's memory is used).
  double memory_bytes = 0;
  double memory_bandwidth = 0;  // HBM/GDDR bytes/s (per core for cpu)

  // Links.
  double host_link_bandwidth = 0;  // host<->device per direction, achievable (PCIe), per GPU
  LinkKind intra_link = LinkKind::kPcie;
  double intra_allreduce_busbw = 0;  // achievable all-reduce bus bandwidth inside a node
  double inter_node_bandwidth = 0;   // per node, all NICs together
  double allreduce_latency = 0;      // α: per ring step

  // Host side.
  double cpu_adam_params_per_core = 0;  // CPU AdamW parameters/s per core

  // Compute's slow-down while a TP all-reduce runs beside it (the Oases overlap): an op that
  // hides an all-reduce of duration c takes interference·min(op, c) longer. Built-in: an
  // engineering estimate; a measured profile measures it.
  double overlap_interference = 0.15;
  // The recompute pass's FLOP rate over the micro-batch's rate. Recomputing a layer's forward
  // right before its backward runs faster than the micro-batch's average: its inputs are in
  // cache, and the backward after it finds its activations there too (measured 1.2-1.3 on this
  // project's 2-core build machine: full recompute added 29 ms to a 110 ms step whose layers'
  // forward FLOPs take 36 ms at the step's rate). Built-in: 1.
  double recompute_rate_ratio = 1;
  // Measured over predicted time of each phase, folded back from running jobs (planner/
  // calibration.h): the cost model multiplies its phase times by these. 1: no evidence.
  double compute_scale = 1;        // forward, backward and recompute
  double tp_comm_scale = 1;        // TP all-reduces
  double dp_comm_scale = 1;        // DP gradient all-reduces
  double transfer_scale = 1;       // host<->device copies
  double cpu_optimizer_scale = 1;  // CPU AdamW

  std::string source;  // short citation summary; details in docs/HARDWARE.md
  bool measured = false;  // from a measured profile (api/measured_profile.h), not built in
};

// AdamW touches 28 bytes per parameter: reads grad (2), fp32 master, m, v (12), writes master,
// m, v (12) and the 16-bit parameter copy (2). Memory-bound on every device: the cost model
// charges a device's AdamW these bytes at memory_bandwidth, and a measured GPU profile sets
// memory_bandwidth from the AdamW kernel's parameters/s times these bytes.
inline constexpr double kAdamBytesPerParam = 28;

const std::vector<HardwareProfile>& builtin_profiles();
// Matches a product name or alias, ignoring case and treating ' ', '_' and '-' alike.
// nullptr when unknown.
const HardwareProfile* find_profile(std::string_view product);
const HardwareProfile& cpu_profile();

// A CPU profile with what Node Feature Discovery's labels say the node's CPU has:
// feature.node.kubernetes.io/cpu-cpuid.AMXBF16 = "true" (AMX tiles: bf16 matmuls at several
// times the fp32 rate) or .AVX512BF16 = "true" (vdpbf16ps: about twice fp32) make has_bf16 true
// and set the bf16 peak and η. `kubetrain local serve` labels this machine's Node the same way.
HardwareProfile apply_cpu_features(HardwareProfile profile,
                                   const std::map<std::string, std::string>& labels);
inline constexpr const char* kNfdAmxBf16 = "feature.node.kubernetes.io/cpu-cpuid.AMXBF16";
inline constexpr const char* kNfdAvx512Bf16 = "feature.node.kubernetes.io/cpu-cpuid.AVX512BF16";

// Per-node overrides from annotations. Keys (values are plain numbers in the units named):
//   kubetrain.dev/pcie-gbps            host<->device GB/s (gigabytes) per direction
//   kubetrain.dev/intra-busbw-gbps     all-reduce bus GB/s inside the node
//   kubetrain.dev/inter-node-gbps      GB/s per node across nodes
//   kubetrain.dev/gpu-link             nvlink | pcie
//   kubetrain.dev/peak-tflops          dense bf16 TFLOP/s per GPU (fp32 per core on CPU nodes)
//   kubetrain.dev/achieved-fraction    η in (0, 1]
//   kubetrain.dev/cpu-adam-mparams     CPU Adam million params/s per core
//   kubetrain.dev/allreduce-latency-us α in microseconds
// Throws FieldError("<path>.annotations.<key>", ...) on a malformed value.
HardwareProfile apply_overrides(HardwareProfile profile,
                                const std::map<std::string, std::string>& annotations,
                                const std::string& path);

}  // namespace kt::api

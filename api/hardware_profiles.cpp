// Built-in hardware profiles and per-node overrides (declared in api/hardware.h).
//
// Every figure carries its source. Datasheet figures are the vendor's; figures marked ESTIMATE are
// engineering estimates with the reasoning next to them (docs/HARDWARE.md collects both). Measured
// profiles (`kubetrain-worker profile`) and node annotations replace any of them.
//
// Conventions: datasheet "GB/s" and "TB/s" are decimal (1e9, 1e12 bytes/s); bandwidths are per
// direction. Memory capacity is the nominal "N GB" read as N GiB, which is about what nvidia-smi
// reports for these parts (e.g. 24576 MiB on a 24 GB RTX 3090); the inventory's measured GPU
// memory, when known, replaces it (api/inventory.cpp).

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

#include "api/error.h"
#include "api/hardware.h"

namespace kt::api {
namespace {

constexpr double kGB = 1e9;  // bytes/s per datasheet GB/s
constexpr double kGiB = 1024.0 * 1024 * 1024;
constexpr double kTflops = 1e12;
constexpr double kUs = 1e-6;

// Host <-> device, achievable per direction with pinned memory (ESTIMATE from the raw link rate):
// PCIe 5.0 x16 is 63 GB/s raw per direction, 4.0 x16 31.5 GB/s, 3.0 x16 15.75 GB/s (PCI-SIG
// base specifications, 128b/130b encoding); DMA after TLP/flow-control overhead typically reaches
// ~80% (the CUDA bandwidthTest sample reports ~24-26 GB/s on 4.0 x16 and ~12-13 GB/s on 3.0 x16).
constexpr double kPcie5x16 = 50 * kGB;
constexpr double kPcie4x16 = 25 * kGB;
constexpr double kPcie3x16 = 12 * kGB;

// α, per ring step (ESTIMATE): nccl-tests small-message all_reduce takes ~10-30 µs on 8 NVLink
// GPUs, i.e. ~1-2 µs for each of the 2(n-1) = 14 ring steps; PCIe peer-to-peer adds switch/root
// complex hops; without P2P each step is a copy through pinned host memory plus a proxy-thread
// handoff (NCCL's SHM transport), so it is slower again.
constexpr double kAlphaNvlink = 2 * kUs;
constexpr double kAlphaPcieP2p = 5 * kUs;
constexpr double kAlphaPcieViaHost = 10 * kUs;

// CPU AdamW is memory-bound. Roofline: per parameter it reads and writes the fp32 master weight
// (8 B), m (8 B) and v (8 B) and reads the fp32 gradient (4 B) = 28 B (an fp16 gradient plus an
// fp16 weight copy written back is the same 28 B). Its ~15 flops/param on 16 AVX-512 lanes take
// ~1 cycle/param (~3 G params/s per core), ~10x faster than memory feeds them, so params/s per
// core = (sustained DRAM bandwidth per core) / 28 B. All cores run Adam at once, so the per-core
// figure is the socket's sustained bandwidth (~80% of the channel peak, STREAM-like) divided by its
// cores.
constexpr double kAdamBytesPerParam = 28;
// DDR5 hosts (DGX H100/H200: 2x Xeon 8480C, 56 cores and 8x DDR5-4800 = 307 GB/s per socket;
// 0.8 * 307 / 56 = 4.4 GB/s per core) -> ~160 M params/s per core. ESTIMATE.
constexpr double kAdamDdr5Host = 4.5 * kGB / kAdamBytesPerParam;
// DGX A100 (2x EPYC 7742, 64 cores and 8x DDR4-3200 = 205 GB/s per socket; 0.8 * 205 / 64 =
// 2.6 GB/s per core) -> ~90 M params/s per core: many cores share the channels. ESTIMATE.
constexpr double kAdamDgxA100Host = 2.5 * kGB / kAdamBytesPerParam;
// Commodity DDR4 servers holding 4-8 PCIe GPUs (e.g. 2x 20-32-core Xeon/EPYC, 6-8 channels of
// DDR4-2933/3200 = 140-205 GB/s per socket): ~4 GB/s per core -> ~140 M params/s. ESTIMATE.
constexpr double kAdamDdr4Host = 4 * kGB / kAdamBytesPerParam;
// DGX-1V (2x Xeon E5-2698 v4, 20 cores and 4x DDR4-2400 = 77 GB/s per socket; 0.8 * 77 / 20 =
// 3.1 GB/s per core) -> ~110 M params/s per core. ESTIMATE.
constexpr double kAdamDgx1Host = 3 * kGB / kAdamBytesPerParam;

std::vector<HardwareProfile> make_gpu_profiles() {
  std::vector<HardwareProfile> p;

  // ---- H200 SXM ----
  p.push_back({
      .name = "H200",
      .aliases = {"NVIDIA-H200", "NVIDIA-H200-141GB-HBM3e", "H200-SXM", "H200-SXM5", "H200-141GB"},
      // NVIDIA H200 Tensor Core GPU datasheet (2024): BF16 1,979 TFLOPS *with sparsity* -> dense
      // half; same GH100 compute as the H100 SXM (H100 whitepaper 2022, Table 3: 989.4 dense).
      .peak_bf16_flops = 989.4 * kTflops,
      .peak_fp32_flops = 67 * kTflops,  // H200 datasheet (2024): FP32 67 TFLOPS
      // Narayanan et al. SC'21 (Megatron-LM, "Efficient Large-Scale Language Model Training on
      // GPU Clusters"): 44-52% of peak sustained end to end on A100s; we plan with 0.5.
      .achieved_fraction = 0.5,
      .memory_bytes = 141 * kGiB,        // H200 datasheet (2024): 141 GB HBM3e
      .memory_bandwidth = 4800 * kGB,    // H200 datasheet (2024): 4.8 TB/s
      .host_link_bandwidth = kPcie5x16,  // H200 datasheet: PCIe Gen5 (128 GB/s bidirectional)
      .intra_link = LinkKind::kNvlink,   // NVLink 4, 900 GB/s bidirectional via NVSwitch
      // ESTIMATE: nccl-tests all_reduce_perf on 8x H100/H200 SXM reports ~360-370 GB/s busbw with
      // ring and ~450-480 GB/s with NVLink SHARP at GB-sized messages; TP all-reduces are a few
      // MB, below the asymptote, so 400 GB/s.
      .intra_allreduce_busbw = 400 * kGB,
      // DGX H200 user guide: 8x ConnectX-7 at 400 Gb/s for the compute fabric = 400 GB/s per node.
      .inter_node_bandwidth = 400 * kGB,
      .allreduce_latency = kAlphaNvlink,
      .cpu_adam_params_per_core = kAdamDdr5Host,
      .source = "NVIDIA H200 datasheet 2024; H100 whitepaper 2022 Table 3; DGX H200 (8x400Gb/s); "
                "busbw nccl-tests-style estimate",
  });

  // ---- H100 SXM5 80 GB ----
  p.push_back({
      .name = "H100-SXM",
      .aliases = {"NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-SXM5-80GB", "H100", "H100-SXM5",
                  "H100-SXM5-80GB", "H100-80GB", "H100-80GB-HBM3"},
      // NVIDIA H100 Tensor Core GPU datasheet (2022/2023): BF16 1,979 TFLOPS with sparsity;
      // NVIDIA H100 architecture whitepaper (2022), Table 3: 989.4 dense.
      .peak_bf16_flops = 989.4 * kTflops,
      .peak_fp32_flops = 67 * kTflops,  // H100 datasheet: SXM FP32 67 TFLOPS
      .achieved_fraction = 0.5,         // Narayanan et al. SC'21, as for the H200
      .memory_bytes = 80 * kGiB,        // H100 datasheet: 80 GB HBM3
      .memory_bandwidth = 3350 * kGB,   // H100 datasheet: SXM 3.35 TB/s
      .host_link_bandwidth = kPcie5x16,
      .intra_link = LinkKind::kNvlink,     // NVLink 4, 900 GB/s bidirectional via NVSwitch
      .intra_allreduce_busbw = 400 * kGB,  // ESTIMATE, as for the H200 (same NVLink 4 fabric)
      .inter_node_bandwidth = 400 * kGB,   // DGX H100: 8x ConnectX-7 400 Gb/s = 400 GB/s per node
      .allreduce_latency = kAlphaNvlink,
      .cpu_adam_params_per_core = kAdamDdr5Host,
      .source = "NVIDIA H100 datasheet 2022; H100 whitepaper 2022 Table 3; DGX H100 (8x400Gb/s); "
                "busbw nccl-tests-style estimate",
  });

  // ---- H100 PCIe 80 GB ----
  p.push_back({
      .name = "H100-PCIe",
      .aliases = {"NVIDIA-H100-PCIe", "NVIDIA-H100-PCIe-80GB", "H100-PCIe-80GB"},
      // H100 datasheet (2022): PCIe BF16 1,513 TFLOPS with sparsity; whitepaper Table 3: 756 dense.
      .peak_bf16_flops = 756 * kTflops,
      .peak_fp32_flops = 51 * kTflops,  // H100 datasheet: PCIe FP32 51 TFLOPS
      // ESTIMATE: 350 W board power (vs 700 W SXM) lowers sustained clocks under tensor load.
      .achieved_fraction = 0.45,
      .memory_bytes = 80 * kGiB,       // H100 datasheet: PCIe 80 GB HBM2e
      .memory_bandwidth = 2000 * kGB,  // H100 datasheet: PCIe 2 TB/s
      .host_link_bandwidth = kPcie5x16,
      // Optional NVLink bridges join pairs only; the default is PCIe (gpu-link overrides).
      .intra_link = LinkKind::kPcie,
      // ESTIMATE: 8x H100 PCIe (P2P over Gen5 switches) all_reduce busbw ~35-45 GB/s in
      // nccl-tests reports; 40 GB/s is ~80% of the achievable x16 link.
      .intra_allreduce_busbw = 40 * kGB,
      // ESTIMATE: a PCIe-card server with 2x 200 Gb/s NICs = 50 GB/s per node.
      .inter_node_bandwidth = 50 * kGB,
      .allreduce_latency = kAlphaPcieP2p,
      .cpu_adam_params_per_core = kAdamDdr5Host,
      .source = "NVIDIA H100 datasheet 2022; H100 whitepaper 2022 Table 3; busbw, inter-node and "
                "eta estimates",
  });

  // ---- A100 SXM4 80 GB ----
  p.push_back({
      .name = "A100-SXM-80GB",
      .aliases = {"NVIDIA-A100-SXM4-80GB", "A100-SXM4-80GB", "A100-80GB", "A100-SXM", "A100"},
      // NVIDIA A100 Tensor Core GPU datasheet (2021): BF16 312 TFLOPS dense (624 with sparsity).
      .peak_bf16_flops = 312 * kTflops,
      .peak_fp32_flops = 19.5 * kTflops,  // A100 datasheet: FP32 19.5 TFLOPS
      .achieved_fraction = 0.5,           // Narayanan et al. SC'21: 52% of peak on A100 SXM
      .memory_bytes = 80 * kGiB,          // A100 datasheet: 80 GB HBM2e
      .memory_bandwidth = 2039 * kGB,     // A100 datasheet: SXM 80 GB 2,039 GB/s
      .host_link_bandwidth = kPcie4x16,   // A100 datasheet: PCIe Gen4 (64 GB/s bidirectional)
      .intra_link = LinkKind::kNvlink,    // NVLink 3, 600 GB/s bidirectional via NVSwitch
      // ESTIMATE: nccl-tests all_reduce_perf on 8x A100 SXM (DGX A100) reports ~230-240 GB/s
      // busbw at large messages.
      .intra_allreduce_busbw = 230 * kGB,
      // DGX A100 user guide: 8x ConnectX-6 HDR 200 Gb/s compute NICs = 200 GB/s per node.
      .inter_node_bandwidth = 200 * kGB,
      .allreduce_latency = kAlphaNvlink,
      .cpu_adam_params_per_core = kAdamDgxA100Host,
      .source = "NVIDIA A100 datasheet 2021; DGX A100 (8x200Gb/s); busbw nccl-tests-style "
                "estimate; eta Narayanan et al. SC'21",
  });

  // ---- A100 PCIe 40 GB ----
  p.push_back({
      .name = "A100-PCIe-40GB",
      .aliases = {"NVIDIA-A100-PCIE-40GB", "A100-PCIe", "A100-40GB-PCIe"},
      .peak_bf16_flops = 312 * kTflops,   // A100 datasheet (2021): BF16 312 TFLOPS dense
      .peak_fp32_flops = 19.5 * kTflops,  // A100 datasheet: FP32 19.5 TFLOPS
      // ESTIMATE: 250 W board power (vs 400 W SXM) lowers sustained clocks.
      .achieved_fraction = 0.45,
      .memory_bytes = 40 * kGiB,       // A100 datasheet: PCIe 40 GB HBM2
      .memory_bandwidth = 1555 * kGB,  // A100 datasheet: PCIe 40 GB 1,555 GB/s
      .host_link_bandwidth = kPcie4x16,
      .intra_link = LinkKind::kPcie,  // NVLink bridges join pairs only
      // ESTIMATE: ring all-reduce with P2P over Gen4 is bounded by the ~25 GB/s link; switch and
      // cross-socket hops cost ~20% -> 20 GB/s.
      .intra_allreduce_busbw = 20 * kGB,
      .inter_node_bandwidth = 25 * kGB,  // ESTIMATE: 2x 100 Gb/s NICs
      .allreduce_latency = kAlphaPcieP2p,
      .cpu_adam_params_per_core = kAdamDdr4Host,
      .source = "NVIDIA A100 datasheet 2021; busbw, inter-node and eta estimates",
  });

  // ---- L40S ----
  p.push_back({
      .name = "L40S",
      .aliases = {"NVIDIA-L40S", "L40S-48GB"},
      // NVIDIA L40S datasheet (2023): BF16 362.05 TFLOPS dense (733 with sparsity).
      .peak_bf16_flops = 362.05 * kTflops,
      .peak_fp32_flops = 91.6 * kTflops,  // L40S datasheet: FP32 91.6 TFLOPS
      // ESTIMATE: GDDR6 gives 1/4 of an H100's bandwidth for 1/3 of its bf16 peak, so the
      // memory-bound (non-GEMM) part of a step weighs more.
      .achieved_fraction = 0.45,
      .memory_bytes = 48 * kGiB,          // L40S datasheet: 48 GB GDDR6 with ECC
      .memory_bandwidth = 864 * kGB,      // L40S datasheet: 864 GB/s
      .host_link_bandwidth = kPcie4x16,   // L40S datasheet: PCIe Gen4 x16, 64 GB/s bidirectional
      .intra_link = LinkKind::kPcie,      // no NVLink on the L40S
      .intra_allreduce_busbw = 20 * kGB,  // ESTIMATE: P2P over Gen4, as for the A100 PCIe
      .inter_node_bandwidth = 25 * kGB,   // ESTIMATE: 2x 100 Gb/s NICs
      .allreduce_latency = kAlphaPcieP2p,
      .cpu_adam_params_per_core = kAdamDdr5Host,
      .source = "NVIDIA L40S datasheet 2023; busbw, inter-node and eta estimates",
  });

  // ---- L4 ----
  p.push_back({
      .name = "L4",
      .aliases = {"NVIDIA-L4", "L4-24GB"},
      // NVIDIA L4 datasheet (2023): FP16/BF16 242 TFLOPS *with sparsity* -> 121 dense.
      .peak_bf16_flops = 121 * kTflops,
      .peak_fp32_flops = 30.3 * kTflops,  // L4 datasheet: FP32 30.3 TFLOPS
      // ESTIMATE: the 72 W power cap holds clocks well under boost in sustained GEMMs and 300 GB/s
      // makes the non-GEMM ops slow.
      .achieved_fraction = 0.35,
      .memory_bytes = 24 * kGiB,         // L4 datasheet: 24 GB GDDR6
      .memory_bandwidth = 300 * kGB,     // L4 datasheet: 300 GB/s
      .host_link_bandwidth = kPcie4x16,  // L4 datasheet: PCIe Gen4 x16
      .intra_link = LinkKind::kPcie,
      // ESTIMATE: P2P over Gen4 as for the L40S; without P2P it is ~10 GB/s (see RTX-3090).
      .intra_allreduce_busbw = 20 * kGB,
      .inter_node_bandwidth = 12.5 * kGB,  // ESTIMATE: one 100 Gb/s NIC
      .allreduce_latency = kAlphaPcieP2p,
      .cpu_adam_params_per_core = kAdamDdr5Host,
      .source = "NVIDIA L4 datasheet 2023; busbw, inter-node and eta estimates",
  });

  // ---- GeForce RTX 4090 ----
  p.push_back({
      .name = "RTX-4090",
      .aliases = {"NVIDIA-GeForce-RTX-4090", "GeForce-RTX-4090", "RTX4090", "4090"},
      // NVIDIA Ada GPU architecture whitepaper (2022), RTX 4090 table: peak BF16 tensor 165.2
      // TFLOPS with FP32 accumulate (330.4 with sparsity). GeForce parts run FP32-accumulate at
      // half the FP16-accumulate rate, and training accumulates in FP32.
      .peak_bf16_flops = 165.2 * kTflops,
      .peak_fp32_flops = 82.6 * kTflops,  // Ada whitepaper: FP32 82.6 TFLOPS
      .achieved_fraction = 0.45,          // ESTIMATE: consumer part, below datacenter 0.5
      .memory_bytes = 24 * kGiB,          // Ada whitepaper: 24 GB GDDR6X
      .memory_bandwidth = 1008 * kGB,     // Ada whitepaper: 21 Gbps x 384 bit = 1,008 GB/s
      .host_link_bandwidth = kPcie4x16,
      .intra_link = LinkKind::kPcie,  // no NVLink connector on the 4090
      // ESTIMATE: no PCIe P2P on GeForce, so NCCL stages every ring step through pinned host
      // memory; see RTX-3090.
      .intra_allreduce_busbw = 10 * kGB,
      .inter_node_bandwidth = 12.5 * kGB,  // ESTIMATE: 100 Gb/s Ethernet/InfiniBand per server
      .allreduce_latency = kAlphaPcieViaHost,
      .cpu_adam_params_per_core = kAdamDdr4Host,
      .source = "NVIDIA Ada GPU architecture whitepaper 2022; busbw, inter-node and eta estimates",
  });

  // ---- GeForce RTX 3090 (Oases' testbed: 8 servers x 4 GPUs on PCIe) ----
  p.push_back({
      .name = "RTX-3090",
      .aliases = {"NVIDIA-GeForce-RTX-3090", "GeForce-RTX-3090", "RTX3090", "3090"},
      // NVIDIA Ampere GA102 GPU architecture whitepaper (2020/2021), Appendix A (GeForce RTX
      // 3090): peak BF16 tensor 71 TFLOPS with FP32 accumulate (142 with sparsity).
      .peak_bf16_flops = 71 * kTflops,
      .peak_fp32_flops = 35.6 * kTflops,  // GA102 whitepaper, Appendix A: FP32 35.6 TFLOPS
      .achieved_fraction = 0.45,          // ESTIMATE: consumer part, below datacenter 0.5
      .memory_bytes = 24 * kGiB,          // GA102 whitepaper: 24 GB GDDR6X
      .memory_bandwidth = 936 * kGB,      // GA102 whitepaper: 19.5 Gbps x 384 bit = 936 GB/s
      .host_link_bandwidth = kPcie4x16,
      // An NVLink bridge (56.25 GB/s per direction) joins pairs only: a per-node override.
      .intra_link = LinkKind::kPcie,
      // ESTIMATE: GeForce drivers expose no PCIe P2P, so NCCL's SHM transport moves each ring
      // step D2H into pinned host memory and H2D on the peer. Each GPU's x16 link (~25 GB/s per
      // direction) carries both its send and its receive, the host copy and proxy handoff cost
      // about half of it again, and root-complex/cross-socket traffic competes: ~10 GB/s. This
      // reproduces Oases' observation on this testbed: for h = 4096, s = 1024, b = 1, t = 4 one
      // attention forward is ~39 GFLOP per GPU, 1.2 ms at 0.45 * 71 TFLOP/s, and its all-reduce
      // of 8 MiB bf16 costs 2*(3/4)*8.4 MB / 10 GB/s = 1.3 ms.
      .intra_allreduce_busbw = 10 * kGB,
      .inter_node_bandwidth = 12.5 * kGB,  // ESTIMATE: 100 Gb/s Ethernet/InfiniBand per server
      .allreduce_latency = kAlphaPcieViaHost,
      .cpu_adam_params_per_core = kAdamDdr4Host,
      .source = "NVIDIA GA102 whitepaper Appendix A; busbw estimate (PCIe 4.0 without P2P), "
                "inter-node and eta estimates",
  });

  // ---- V100 SXM2 32 GB (no bf16) ----
  p.push_back({
      .name = "V100-SXM2-32GB",
      .aliases = {"Tesla-V100-SXM2-32GB", "NVIDIA-V100-SXM2-32GB", "V100-SXM2", "V100-32GB",
                  "V100"},
      // NVIDIA Tesla V100 datasheet (2018): SXM2 tensor performance 125 TFLOPS (fp16 inputs, dense;
      // Volta has no bf16 and no sparsity).
      .peak_bf16_flops = 125 * kTflops,
      .peak_fp32_flops = 15.7 * kTflops,  // V100 datasheet: SXM2 FP32 15.7 TFLOPS
      // Shoeybi et al. 2019 (Megatron-LM): 39 TFLOP/s sustained on one V100 = 30% of peak;
      // Ren et al. 2021 (ZeRO-Offload) report 40 TFLOP/s on a V100 (32%).
      .achieved_fraction = 0.3,
      .has_bf16 = false,
      .memory_bytes = 32 * kGiB,         // V100 datasheet: 32 GB HBM2
      .memory_bandwidth = 900 * kGB,     // V100 datasheet: 900 GB/s
      .host_link_bandwidth = kPcie3x16,  // V100 datasheet: PCIe Gen3, 32 GB/s bidirectional
      .intra_link = LinkKind::kNvlink,   // NVLink 2, 300 GB/s bidirectional (hybrid cube-mesh)
      // ESTIMATE: 6 NVLink 2 links x 25 GB/s = 150 GB/s per direction per GPU; NCCL's rings over
      // the DGX-1 cube-mesh reach ~85% -> ~130 GB/s.
      .intra_allreduce_busbw = 130 * kGB,
      .inter_node_bandwidth = 50 * kGB,  // DGX-1V: 4x EDR InfiniBand 100 Gb/s = 50 GB/s per node
      .allreduce_latency = kAlphaNvlink,
      .cpu_adam_params_per_core = kAdamDgx1Host,
      .source = "NVIDIA Tesla V100 datasheet 2018; DGX-1V (4x100Gb/s); eta Shoeybi et al. 2019; "
                "busbw estimate",
  });

  // ---- T4 (no bf16) ----
  p.push_back({
      .name = "T4",
      .aliases = {"Tesla-T4", "NVIDIA-T4", "T4-16GB"},
      // NVIDIA T4 datasheet (2019): mixed precision (FP16/FP32) 65 TFLOPS dense; no bf16 on Turing.
      .peak_bf16_flops = 65 * kTflops,
      .peak_fp32_flops = 8.1 * kTflops,  // T4 datasheet: FP32 8.1 TFLOPS
      // ESTIMATE: the 70 W cap throttles clocks far below boost in sustained tensor-core GEMMs.
      .achieved_fraction = 0.3,
      .has_bf16 = false,
      .memory_bytes = 16 * kGiB,         // T4 datasheet: 16 GB GDDR6 (ECC on leaves ~15 GiB)
      .memory_bandwidth = 320 * kGB,     // T4 datasheet: 320+ GB/s
      .host_link_bandwidth = kPcie3x16,  // T4 datasheet: PCIe Gen3 x16
      .intra_link = LinkKind::kPcie,
      // ESTIMATE: P2P over Gen3, ~80% of the ~12 GB/s link.
      .intra_allreduce_busbw = 10 * kGB,
      .inter_node_bandwidth = 6.25 * kGB,  // ESTIMATE: 2x 25 Gb/s Ethernet, typical of T4 servers
      .allreduce_latency = kAlphaPcieP2p,
      .cpu_adam_params_per_core = kAdamDdr4Host,
      .source = "NVIDIA T4 datasheet 2019; busbw, inter-node and eta estimates",
  });

  return p;
}

HardwareProfile make_cpu_profile() {
  return {
      .name = "cpu",
      .aliases = {},
      .is_cpu = true,
      // Per CORE of an AVX-512 server core, measured on the build machine (AMD EPYC Zen 4;
      // docs/HARDWARE.md, "Sources"): oneDNN sgemm 1024^3 fp32 reaches 110.8 GFLOP/s on one thread
      // and 219.5 on two. AVX512-BF16 (vdpbf16ps) doubles the FMA rate per instruction, so bf16
      // is ~2x fp32 (ESTIMATE). Whether a node's CPU has bf16 at all is unknown until its labels
      // say so (apply_cpu_features): CPU nodes are planned in fp32 unless they do.
      .peak_bf16_flops = 220e9,
      .peak_fp32_flops = 110e9,
      // ESTIMATE: the peak above is already a measured sgemm; transformer GEMMs of training
      // shapes plus the non-GEMM ops keep ~80% of it.
      .achieved_fraction = 0.8,
      .has_bf16 = false,
      .memory_bytes = 0,  // the node's memory is used
      // ESTIMATE: sustained DRAM bandwidth per core, between a loaded many-core socket (~5 GB/s
      // per core) and a lightly shared one (~20+ GB/s single-thread STREAM).
      .memory_bandwidth = 10 * kGB,
      // ESTIMATE: memcpy bandwidth of one core (read + write streams share the core's bandwidth).
      .host_link_bandwidth = 8 * kGB,
      .intra_link = LinkKind::kLoopback,
      // Measured on the build machine while it was shared (docs/HARDWARE.md, "Sources"): Gloo over
      // loopback TCP, 2 processes, 4 MiB all-reduce in 3.3 ms = ~1.3 GB/s algbw; for n = 2
      // busbw = algbw * 2(n-1)/n = algbw.
      .intra_allreduce_busbw = 1.3 * kGB,
      .inter_node_bandwidth = 1.25 * kGB,  // ESTIMATE: 10 GbE between CPU nodes
      // ESTIMATE: a TCP round through the kernel per ring step (Gloo, loopback or LAN).
      .allreduce_latency = 50 * kUs,
      // Roofline above: 10 GB/s / 28 B = ~357 M params/s per core. ESTIMATE.
      .cpu_adam_params_per_core = 10 * kGB / kAdamBytesPerParam,
      .source =
          "measured sgemm and Gloo on the build machine (docs/HARDWARE.md); bandwidth, "
          "eta and Adam roofline estimates",
  };
}

// Uppercase, with ' ', '_' and '-' made equal: "NVIDIA GeForce RTX 3090" (nvidia-smi),
// "nvidia_geforce_rtx_3090" and "NVIDIA-GeForce-RTX-3090" (GPU Feature Discovery) compare equal.
std::string normalise(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == ' ' || c == '_') c = '-';
    out += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return out;
}

bool matches(const HardwareProfile& p, const std::string& key) {
  if (normalise(p.name) == key) return true;
  for (const auto& alias : p.aliases)
    if (normalise(alias) == key) return true;
  return false;
}

std::string trimmed(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// A finite number filling the whole (trimmed) value, or nothing.
bool parse_number(const std::string& value, double& out) {
  const std::string text = trimmed(value);
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size() && errno != ERANGE && std::isfinite(out);
}

}  // namespace

std::string_view to_string(LinkKind k) {
  switch (k) {
    case LinkKind::kNvlink:
      return "nvlink";
    case LinkKind::kPcie:
      return "pcie";
    case LinkKind::kLoopback:
      return "loopback";
  }
  return "?";
}

const std::vector<HardwareProfile>& builtin_profiles() {
  static const std::vector<HardwareProfile> kProfiles = make_gpu_profiles();
  return kProfiles;
}

const HardwareProfile& cpu_profile() {
  static const HardwareProfile kCpu = make_cpu_profile();
  return kCpu;
}

const HardwareProfile* find_profile(std::string_view product) {
  const std::string key = normalise(product);
  if (key.empty()) return nullptr;
  for (const auto& p : builtin_profiles())
    if (matches(p, key)) return &p;
  if (matches(cpu_profile(), key)) return &cpu_profile();
  return nullptr;
}

HardwareProfile apply_cpu_features(HardwareProfile profile,
                                   const std::map<std::string, std::string>& labels) {
  auto has = [&](const char* key) {
    const auto it = labels.find(key);
    return it != labels.end() && it->second == "true";
  };
  if (!profile.is_cpu) return profile;
  if (has(kNfdAmxBf16)) {
    // Measured (docs/PERFORMANCE.md, "bf16 on the CPU", 2 vCPUs of a Xeon with AMX, oneDNN 2.6
    // brgemm, random inputs): bf16 matmul 1024^3 1.3-1.7 TFLOP/s on 2 threads, ~0.75 TFLOP/s per
    // core; the GPT-2 124M B 4 T 64 step keeps ~28 % of that (AdamW and the row kernels stay
    // memory-bound).
    profile.has_bf16 = true;
    profile.peak_bf16_flops = 0.75e12;
    profile.achieved_fraction_bf16 = 0.28;
  } else if (has(kNfdAvx512Bf16)) {
    // Measured (docs/PERFORMANCE.md, "bf16 on the CPU", 2026-12-05: 2 vCPUs of a Xeon with
    // AVX512-BF16 and no AMX, oneDNN): bf16 matmul 1024^3 166-172 GFLOP/s against sgemm 313-316
    // on the same 2 threads (0.53x; vdpbf16ps' twice the FMAs per instruction do not show in
    // oneDNN's kernels there), the GPT-2 124M B 4 T 64 bf16 step at 83 % of that and 0.63x the
    // fp32 step. So such a CPU is planned in fp32 unless a measured profile shows bf16 paying
    // (`kubetrain-worker profile` measures both).
    profile.has_bf16 = true;
    profile.peak_bf16_flops = 0.53 * profile.peak_fp32_flops;
    profile.achieved_fraction_bf16 = 0.8;
  }
  return profile;
}

HardwareProfile apply_overrides(HardwareProfile profile,
                                const std::map<std::string, std::string>& annotations,
                                const std::string& path) {
  constexpr std::string_view kPrefix = "kubetrain.dev/";
  for (const auto& annotation : annotations) {
    // Not a structured binding: clang 14 (the fuzz build) cannot capture one in a lambda.
    const std::string& key = annotation.first;
    const std::string& value = annotation.second;
    if (key.compare(0, kPrefix.size(), kPrefix) != 0) continue;
    const std::string_view name = std::string_view(key).substr(kPrefix.size());
    const std::string field = path + ".annotations." + key;
    // A positive number in `unit`, scaled to the profile's SI unit.
    auto positive = [&](const char* unit, double scale) {
      double v = 0;
      if (!parse_number(value, v) || !(v > 0))
        throw FieldError(
            field, std::string("must be a positive number (") + unit + "), got \"" + value + "\"");
      return v * scale;
    };
    if (name == "pcie-gbps") {
      profile.host_link_bandwidth = positive("GB/s", kGB);
    } else if (name == "intra-busbw-gbps") {
      profile.intra_allreduce_busbw = positive("GB/s", kGB);
    } else if (name == "inter-node-gbps") {
      profile.inter_node_bandwidth = positive("GB/s", kGB);
    } else if (name == "gpu-link") {
      const std::string link = normalise(trimmed(value));
      if (link == "NVLINK") {
        if (!profile.is_cpu) profile.intra_link = LinkKind::kNvlink;
      } else if (link == "PCIE") {
        if (!profile.is_cpu) profile.intra_link = LinkKind::kPcie;
      } else {
        throw FieldError(field, "must be nvlink or pcie, got \"" + value + "\"");
      }
      // A CPU-only node has no GPU link: the key is accepted (cluster-wide annotations may reach
      // CPU nodes) and left without effect.
    } else if (name == "peak-tflops") {
      const double flops = positive("TFLOP/s", kTflops);
      if (profile.is_cpu) {
        // CPU nodes are planned with the fp32 peak; keep bf16 at the same ratio to it.
        profile.peak_bf16_flops *= flops / profile.peak_fp32_flops;
        profile.peak_fp32_flops = flops;
      } else {
        profile.peak_bf16_flops = flops;
      }
    } else if (name == "achieved-fraction") {
      double v = 0;
      if (!parse_number(value, v) || !(v > 0) || v > 1)
        throw FieldError(field, "must be a number in (0, 1], got \"" + value + "\"");
      profile.achieved_fraction = v;
    } else if (name == "cpu-adam-mparams") {
      profile.cpu_adam_params_per_core = positive("million params/s per core", 1e6);
    } else if (name == "allreduce-latency-us") {
      profile.allreduce_latency = positive("microseconds", kUs);
    }
    // Other annotations belong to other tools.
  }
  return profile;
}

}  // namespace kt::api

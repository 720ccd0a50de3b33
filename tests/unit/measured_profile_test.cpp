// Measured hardware profiles (api/measured_profile.h): the document round-trips, every bad field
// is an error naming it, the nodes of the profile's kind (and only they) take its figures, and
// the planner then predicts with them and says so.
#include "api/measured_profile.h"

#include <gtest/gtest.h>

#include <string>

#include "api/error.h"
#include "planner/planner.h"
#include "test_util.h"

namespace kt {
namespace {

api::Json measured_cpu() {
  return api::yaml_to_json(
      "apiVersion: kubetrain.dev/v1alpha1\n"
      "kind: HardwareProfile\n"
      "metadata: {name: cpu}\n"
      "provenance: {host: box, date: '2026-12-03T15:00:00Z', cpu: 'Some CPU'}\n"
      "spec:\n"
      "  peakFp32Flops: 5.0e10\n"
      "  achievedFraction: 0.6\n"
      "  allreduceLatency: 2.0e-4\n"
      "  overlapInterference: 0.7\n"
      "measurements: {gemmFlopsPerSecond: 1.0e11}\n");
}

std::string field_error(const api::Json& doc) {
  try {
    api::decode_measured_profile(doc);
  } catch (const FieldError& e) {
    return e.what();
  }
  return "";
}

TEST(MeasuredProfile, DecodesOverTheBuiltInOfItsKindAndRoundTrips) {
  const api::MeasuredProfile m = api::decode_measured_profile(measured_cpu());
  EXPECT_TRUE(m.profile.is_cpu);
  EXPECT_DOUBLE_EQ(m.profile.peak_fp32_flops, 5.0e10);
  EXPECT_DOUBLE_EQ(m.profile.achieved_fraction, 0.6);
  EXPECT_DOUBLE_EQ(m.profile.overlap_interference, 0.7);
  // What it leaves out is the built-in's.
  EXPECT_DOUBLE_EQ(m.profile.cpu_adam_params_per_core, api::cpu_profile().cpu_adam_params_per_core);
  EXPECT_EQ(m.profile.source, "measured on box 2026-12-03T15:00:00Z");
  EXPECT_EQ(m.provenance.at("cpu"), "Some CPU");
  EXPECT_DOUBLE_EQ(m.measurements.at("gemmFlopsPerSecond"), 1.0e11);
  const api::MeasuredProfile again = api::decode_measured_profile(api::to_json(m));
  EXPECT_EQ(api::to_json(again), api::to_json(m));
}

TEST(MeasuredProfile, EveryBadFieldIsAnErrorNamingIt) {
  auto doc = measured_cpu();
  doc["spec"]["peakFlops"] = 1;
  EXPECT_NE(field_error(doc).find("spec.peakFlops"), std::string::npos) << field_error(doc);
  doc = measured_cpu();
  doc["spec"]["achievedFraction"] = 1.5;
  EXPECT_EQ(field_error(doc), "spec.achievedFraction: 1.5 must be above 0 and at most 1.0");
  doc = measured_cpu();
  doc["spec"]["peakFp32Flops"] = -3;
  EXPECT_NE(field_error(doc).find("spec.peakFp32Flops: -3"), std::string::npos);
  doc = measured_cpu();
  doc["spec"]["allreduceLatency"] = "fast";
  EXPECT_NE(field_error(doc).find("spec.allreduceLatency"), std::string::npos);
  doc = measured_cpu();
  doc["kind"] = "Inventory";
  EXPECT_NE(field_error(doc).find("kind: must be HardwareProfile"), std::string::npos);
  doc = measured_cpu();
  doc["metadata"]["name"] = "TPU-v9";
  EXPECT_NE(field_error(doc).find("metadata.name: \"TPU-v9\" is no node kind"),
            std::string::npos);
  doc = measured_cpu();
  doc["spec"]["tpCommScale"] = 0.001;  // a fold-back 1000x faster than predicted: broken
  EXPECT_EQ(field_error(doc), "spec.tpCommScale: 0.001 must be between 0.01 and 100.0");
  doc = measured_cpu();
  doc["spec"]["recomputeRateRatio"] = 0.2;  // recompute 5x slower than the step: not a CPU
  EXPECT_EQ(field_error(doc), "spec.recomputeRateRatio: 0.2 must be between 0.5 and 3.0");
  // The bounds themselves are what the profiler's clamps write: valid (a busy machine measured
  // recomputeRateRatio 0.5, and plan --profile refused it).
  doc = measured_cpu();
  doc["spec"]["recomputeRateRatio"] = 0.5;
  doc["spec"]["tpCommScale"] = 100.0;
  EXPECT_DOUBLE_EQ(api::decode_measured_profile(doc).profile.recompute_rate_ratio, 0.5);
  doc = measured_cpu();
  doc["measurements"]["x"] = "1";
  EXPECT_NE(field_error(doc).find("measurements.x: must be a finite number"), std::string::npos);
}

TEST(MeasuredProfile, OnlyTheNodesOfItsKindTakeItsFigures) {
  api::Inventory gpus = test::cluster("h200-single");
  auto doc = measured_cpu();
  const api::MeasuredProfile cpu = api::decode_measured_profile(doc);
  EXPECT_EQ(api::apply_measured_profiles(gpus, {cpu}), 0);
  doc["metadata"]["name"] = "NVIDIA H200";  // an alias, as GPU Feature Discovery names it
  doc["spec"] = {{"peakBf16Flops", 7.0e14}};
  const api::MeasuredProfile h200 = api::decode_measured_profile(doc);
  const double memory = gpus.nodes[0].hardware.memory_bytes;
  EXPECT_EQ(api::apply_measured_profiles(gpus, {cpu, h200}), 1);
  EXPECT_DOUBLE_EQ(gpus.nodes[0].hardware.peak_bf16_flops, 7.0e14);
  EXPECT_DOUBLE_EQ(gpus.nodes[0].hardware.memory_bytes, memory) << "the node's own GPU memory";

  api::Inventory local = test::cluster("cpu-local");
  EXPECT_EQ(api::apply_measured_profiles(local, {h200, cpu}), 1);
  EXPECT_DOUBLE_EQ(local.nodes[0].hardware.peak_fp32_flops, 5.0e10);
}

// The planner plans with the measured figures, and the plan says which figures its MFU is against.
TEST(MeasuredProfile, ThePlannerPredictsWithItAndSaysSo) {
  const auto job = test::job_from_yaml(
      "apiVersion: kubetrain.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: p}\nspec:\n"
      "  model: {preset: tiny}\n  training: {steps: 10, globalBatchSize: 8}\n");
  const api::Inventory builtin = test::cluster("cpu-local");
  api::Inventory measured = builtin;
  api::apply_measured_profiles(measured, {api::decode_measured_profile(measured_cpu())});
  const api::Plan a = planner::best_plan(job, builtin), b = planner::best_plan(job, measured);
  EXPECT_EQ(a.peak_source, "built-in cpu profile");
  EXPECT_EQ(b.peak_source, "measured on box 2026-12-03T15:00:00Z");
  EXPECT_DOUBLE_EQ(b.peak_flops, 5.0e10 * static_cast<double>(b.cpu_threads));
  // Half the peak at a lower fraction: every compute phase takes longer.
  EXPECT_GT(b.predicted.time.compute, 1.5 * a.predicted.time.compute);
  EXPECT_EQ(api::decode_plan(api::to_json(b)).peak_source, b.peak_source);
}

// bf16 on CPU nodes (docs/PLANNER.md §12): a measured profile says whether the CPU has bf16 matmuls
// and at what rate; with no precision asked for, the planner then plans both precisions and takes
// the faster prediction — fp32 where the measured bf16 step is slower (a small model), bf16 where
// it is faster — and says which and why; a profile without bf16 keeps the job in fp32.
TEST(MeasuredProfile, CpuBf16FiguresDecideThePrecisionWhenTheJobLeavesItOpen) {
  auto doc = measured_cpu();
  EXPECT_FALSE(api::decode_measured_profile(doc).profile.has_bf16) << "the built-in: unknown";
  doc["spec"]["bf16"] = true;
  doc["spec"]["peakBf16Flops"] = 4.0e11;
  doc["spec"]["achievedFractionBf16"] = 0.05;  // 20 GFLOP/s per core: slower than fp32's 30
  const api::MeasuredProfile slow = api::decode_measured_profile(doc);
  EXPECT_TRUE(slow.profile.has_bf16);
  EXPECT_DOUBLE_EQ(slow.profile.achieved_fraction_bf16, 0.05);
  EXPECT_EQ(api::to_json(api::decode_measured_profile(api::to_json(slow))), api::to_json(slow));
  doc["spec"]["achievedFractionBf16"] = 0.5;  // 200 GFLOP/s per core
  const api::MeasuredProfile fast = api::decode_measured_profile(doc);

  const std::string head =
      "apiVersion: kubetrain.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: p}\nspec:\n"
      "  model: {preset: tiny}\n  training: {steps: 10, globalBatchSize: 8";
  const auto open = test::job_from_yaml(head + "}\n");
  const auto fp32 = test::job_from_yaml(head + ", precision: fp32}\n");
  api::Inventory inv = test::cluster("cpu-local");
  api::apply_measured_profiles(inv, {slow});
  const api::Plan a = planner::best_plan(open, inv);
  EXPECT_EQ(a.precision, api::Precision::kFp32);
  EXPECT_TRUE(a.precision_auto);
  bool said = false;
  for (const auto& line : a.explanation)
    said = said || line.rfind("fp32 on the CPU: predicted", 0) == 0;
  EXPECT_TRUE(said) << "the plan says why fp32";
  inv = test::cluster("cpu-local");
  api::apply_measured_profiles(inv, {fast});
  const api::Plan b = planner::best_plan(open, inv);
  EXPECT_EQ(b.precision, api::Precision::kBf16);
  EXPECT_DOUBLE_EQ(b.peak_flops, 4.0e11 * static_cast<double>(b.cpu_threads));
  EXPECT_GT(b.predicted.tokens_per_second, a.predicted.tokens_per_second);
  EXPECT_TRUE(api::decode_plan(api::to_json(b)).precision_auto);
  const api::Plan c = planner::best_plan(fp32, inv);
  EXPECT_EQ(c.precision, api::Precision::kFp32) << "the job's precision decides";
  EXPECT_FALSE(c.precision_auto);
  doc["spec"]["bf16"] = false;
  inv = test::cluster("cpu-local");
  api::apply_measured_profiles(inv, {api::decode_measured_profile(doc)});
  EXPECT_EQ(planner::best_plan(open, inv).precision, api::Precision::kFp32);
  doc["spec"]["achievedFractionBf16"] = 2;
  EXPECT_EQ(field_error(doc), "spec.achievedFractionBf16: 2.0 must be between 0 and 1.0");
  doc["spec"]["achievedFractionBf16"] = 0.5;
  doc["spec"]["bf16"] = "yes";
  EXPECT_NE(field_error(doc).find("spec.bf16"), std::string::npos) << field_error(doc);
}

// Without a measured profile, Node Feature Discovery's labels say what a CPU node has.
TEST(MeasuredProfile, NfdLabelsGiveCpuNodesTheirBf16) {
  const auto inv = test::inventory_from_yaml(
      "kind: Inventory\nnodes:\n"
      "- name: plain\n  cpu: {cores: 4}\n  memory: 16Gi\n"
      "- name: amx\n  cpu: {cores: 4}\n  memory: 16Gi\n"
      "  labels: {feature.node.kubernetes.io/cpu-cpuid.AMXBF16: 'true'}\n"
      "- name: zen4\n  cpu: {cores: 4}\n  memory: 16Gi\n"
      "  labels: {feature.node.kubernetes.io/cpu-cpuid.AVX512BF16: 'true'}\n");
  ASSERT_EQ(inv.nodes.size(), 3u);
  EXPECT_FALSE(inv.nodes[0].hardware.has_bf16);
  EXPECT_TRUE(inv.nodes[1].hardware.has_bf16);
  EXPECT_DOUBLE_EQ(inv.nodes[1].hardware.peak_bf16_flops, 0.75e12);
  EXPECT_DOUBLE_EQ(inv.nodes[1].hardware.achieved_fraction_bf16, 0.28);
  EXPECT_TRUE(inv.nodes[2].hardware.has_bf16);
  // (measured on this project's Xeon without AMX: oneDNN's bf16 matmuls at 0.53x its sgemm)
  EXPECT_DOUBLE_EQ(inv.nodes[2].hardware.peak_bf16_flops,
                   0.53 * inv.nodes[2].hardware.peak_fp32_flops);
  EXPECT_DOUBLE_EQ(inv.nodes[2].hardware.achieved_fraction_bf16, 0.8);
}

}  // namespace
}  // namespace kt

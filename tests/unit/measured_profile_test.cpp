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
  EXPECT_EQ(field_error(doc), "spec.tpCommScale: 0.001 must be above 0.01 and at most 100.0");
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

}  // namespace
}  // namespace kt

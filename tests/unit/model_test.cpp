#include "api/model.h"

#include <gtest/gtest.h>

#include "planner/cost_model.h"

namespace kt {
namespace {

using api::ModelDims;

TEST(Model, Gpt2_124m_HasTheParameterCountLlmcPrints) {
  const auto* preset = api::find_model_preset("gpt2-124m");
  ASSERT_NE(preset, nullptr);
  EXPECT_EQ(preset->dims.padded_vocab(), 50304);
  EXPECT_EQ(api::parameter_count(preset->dims), 124'475'904);
}

TEST(Model, ParameterCountMatchesTheLayerByLayerSum) {
  // Independently: sum the tensors of llm.c's layout for gpt2-350m.
  const ModelDims m = api::find_model_preset("gpt2-350m")->dims;
  const int64_t h = m.hidden, f = m.ffn_hidden, L = m.layers, V = m.padded_vocab(), s = m.seq_len;
  const int64_t tensors = V * h + s * h +                               // wte, wpe
                          L * (2 * h + 3 * h * h + 3 * h + h * h + h +  // ln1, qkv, proj
                               2 * h + h * f + f + f * h + h) +         // ln2, fc, fcproj
                          2 * h;                                        // lnf
  EXPECT_EQ(api::parameter_count(m), tensors);
}

TEST(Model, PresetsAreConsistent) {
  for (const auto& p : api::model_presets()) {
    EXPECT_EQ(p.dims.hidden % p.dims.heads, 0) << p.name;
    EXPECT_GT(api::parameter_count(p.dims), 0) << p.name;
  }
  // gpt-7b is GPT-3 6.7B's shape: 6.66 B parameters with the GPT-2 vocabulary.
  const double p7 =
      static_cast<double>(api::parameter_count(api::find_model_preset("gpt-7b")->dims));
  EXPECT_NEAR(p7 / 1e9, 6.66, 0.01);
  EXPECT_EQ(api::find_model_preset("gpt-9b"), nullptr);
}

TEST(Formulas, LayerForwardFlopsIs24bsh2Plus4bs2hOverT) {
  const ModelDims m{1, 1024, 16, 4096, 50257, 2048};
  const double b = 4, s = 2048, h = 1024;
  for (int64_t t : {1, 2, 4}) {
    EXPECT_DOUBLE_EQ(planner::layer_forward_flops(m, b, t),
                     (24 * b * s * h * h + 4 * b * s * s * h) / t);
    EXPECT_DOUBLE_EQ(planner::logits_forward_flops(m, b, t), 2 * b * s * h * 50304 / t);
  }
  // commAware skips the projection (2bsh²) and fc2 (2bshf) GEMMs of the recomputed forward.
  EXPECT_DOUBLE_EQ(
      planner::layer_recompute_flops(m, b, 2, api::Recompute::kCommAware),
      (24 * b * s * h * h + 4 * b * s * s * h - 2 * b * s * h * h - 2 * b * s * h * 4096) / 2);
  EXPECT_DOUBLE_EQ(planner::layer_recompute_flops(m, b, 2, api::Recompute::kFull),
                   planner::layer_forward_flops(m, b, 2));
  EXPECT_EQ(planner::layer_recompute_flops(m, b, 2, api::Recompute::kNone), 0);
}

TEST(Formulas, ActivationBytesFollowKorthikanti) {
  // GPT-3 175B's layer (h = 12288, a = 96, s = 2048, b = 1, t = 8): Korthikanti et al. 2022
  // eq. 2 gives sbh(10 + 24/t + 5as/(ht)) bytes.
  const ModelDims m{96, 12288, 96, 49152, 50257, 2048};
  const double sbh = 2048.0 * 1 * 12288;
  EXPECT_DOUBLE_EQ(planner::layer_activation_bytes(m, 1, 8, api::Recompute::kNone),
                   sbh * (10 + 3 + 5.0 * 96 * 2048 / (12288 * 8)));
  EXPECT_DOUBLE_EQ(planner::layer_activation_bytes(m, 1, 8, api::Recompute::kFull), 2 * sbh);
  EXPECT_DOUBLE_EQ(planner::layer_activation_bytes(m, 1, 8, api::Recompute::kCommAware), 6 * sbh);
}

TEST(Formulas, RingAllReduceCost) {
  EXPECT_EQ(planner::allreduce_seconds(1e9, 1, 1e9, 1e-5), 0);
  // t = 4: 2·3·α + 2·3/4 · M / B
  EXPECT_DOUBLE_EQ(planner::allreduce_seconds(8e6, 4, 10e9, 10e-6), 6 * 10e-6 + 1.5 * 8e6 / 10e9);
}

TEST(Formulas, ShardedParametersSumToTheModel) {
  const ModelDims m = api::find_model_preset("gpt2-774m")->dims;
  const double whole =
      planner::embedding_unit_params(m, 1) + m.layers * planner::layer_unit_params(m, 1);
  EXPECT_DOUBLE_EQ(whole, static_cast<double>(api::parameter_count(m)));
  // With t = 4 each rank holds a quarter of the sharded tensors plus the replicated ones.
  const double h = m.hidden;
  EXPECT_DOUBLE_EQ(planner::layer_unit_params(m, 4),
                   (4 * h * h + 2 * h * m.ffn_hidden + 3 * h + m.ffn_hidden) / 4 + 6 * h);
}

TEST(Formulas, GpuUpdateFractionGrid) {
  const ModelDims m = api::find_model_preset("gpt2-124m")->dims;
  EXPECT_EQ(planner::gpu_update_fraction(m, 1, 0), 0);
  EXPECT_DOUBLE_EQ(planner::gpu_update_fraction(m, 1, m.layers + 1), 1.0);
  EXPECT_EQ(planner::gpu_units_for_fraction(m, 1, 0.0), 0);
  EXPECT_EQ(planner::gpu_units_for_fraction(m, 1, 1.0), m.layers + 1);
  // The embeddings (wte + wpe + lnf) are 31.7% of gpt2-124m: f = 0.3 takes exactly that unit.
  EXPECT_EQ(planner::gpu_units_for_fraction(m, 1, 0.3), 1);
  for (double f = 0; f <= 1.0; f += 0.05)
    EXPECT_GE(planner::gpu_update_fraction(m, 1, planner::gpu_units_for_fraction(m, 1, f)),
              f - 1e-9);
}

}  // namespace
}  // namespace kt

// The parameter table (worker/gpt_layout.h kParams) against llm.c's own statement of GPT-2's
// parameters (train_gpt2.c, fill_in_parameter_sizes, restated here from its formulas), and the one
// FLOPs count (api/flops.h) against the planner's.
#include "worker/gpt_layout.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "api/flops.h"
#include "api/model.h"
#include "planner/cost_model.h"

namespace kt {
namespace {

using worker::GptConfig;
using worker::kNumParamTensors;
using worker::kParams;

GptConfig gpt2_small() {
  GptConfig c;
  c.max_seq_len = 1024;
  c.vocab = 50257;
  c.padded_vocab = 50304;
  c.layers = 12;
  c.heads = 12;
  c.channels = 768;
  c.ffn = 3072;
  return c;
}

TEST(GptLayout, TheTableGivesLlmcsNamesShapesAndSizes) {
  const GptConfig c = gpt2_small();
  const int64_t Vp = c.padded_vocab, C = c.channels, L = c.layers, maxT = c.max_seq_len;
  // llm.c: wte Vp·C, wpe maxT·C, ln1w/b L·C, qkvw L·3C·C, qkvb L·3C, attprojw L·C·C, attprojb L·C,
  // ln2w/b L·C, fcw L·4C·C, fcb L·4C, fcprojw L·C·4C, fcprojb L·C, lnfw/b C.
  const std::vector<std::pair<std::string, std::vector<int64_t>>> llmc = {
      {"wte", {Vp, C}},          {"wpe", {maxT, C}},      {"ln1w", {L, C}},
      {"ln1b", {L, C}},          {"qkvw", {L, 3 * C, C}}, {"qkvb", {L, 3 * C}},
      {"attprojw", {L, C, C}},   {"attprojb", {L, C}},    {"ln2w", {L, C}},
      {"ln2b", {L, C}},          {"fcw", {L, 4 * C, C}},  {"fcb", {L, 4 * C}},
      {"fcprojw", {L, C, 4 * C}}, {"fcprojb", {L, C}},    {"lnfw", {C}},
      {"lnfb", {C}}};
  const auto sizes = worker::gpt_param_sizes(c);
  std::vector<float> buffer(static_cast<size_t>(std::accumulate(sizes.begin(), sizes.end(), 0LL)));
  const auto views = worker::gpt_whole_views(c, buffer.data());
  ASSERT_EQ(views.size(), llmc.size());
  int64_t total = 0;
  for (int i = 0; i < kNumParamTensors; ++i) {
    EXPECT_EQ(kParams[i].name, llmc[i].first);
    EXPECT_EQ(views[i].name, llmc[i].first);
    EXPECT_EQ(views[i].shape, llmc[i].second) << llmc[i].first;
    EXPECT_EQ(worker::gpt_llmc_shape(c, i), llmc[i].second) << llmc[i].first;
    EXPECT_EQ(views[i].numel(), sizes[i]) << llmc[i].first;
    total += sizes[i];
  }
  EXPECT_EQ(total, 124475904);  // GPT-2 124M with the padded vocabulary, as llm.c prints
  // The per-layer tensors are the stacked ones: exactly those whose first dimension is L.
  for (int i = 0; i < kNumParamTensors; ++i)
    EXPECT_EQ(kParams[i].per_layer, kParams[i].dims[0] == worker::Dim::kL) << kParams[i].name;
}

TEST(GptLayout, TpRanksSplitTheMatricesAndTheirBiases_TogetherTheyHoldTheWholeModelOnce) {
  const GptConfig c = gpt2_small();
  const auto whole = worker::gpt_param_sizes(c);
  for (int64_t t : {2, 4}) {
    const auto part = worker::gpt_param_sizes(c, t);
    for (int i = 0; i < kNumParamTensors; ++i) {
      const bool split = worker::gpt_tp_sharded(i, t);
      EXPECT_EQ(part[i] * (split ? t : 1), whole[i]) << kParams[i].name << " t " << t;
    }
    // Megatron's split: wte's rows, q/k/v of a rank's heads, attproj's columns, fc's units.
    for (const char* name : {"wte", "qkvw", "qkvb", "attprojw", "fcw", "fcb", "fcprojw"}) {
      int i = 0;
      while (std::string(kParams[i].name) != name) ++i;
      EXPECT_TRUE(worker::gpt_tp_sharded(i, t)) << name;
    }
    EXPECT_FALSE(worker::gpt_tp_sharded(worker::kAttprojb, t)) << "added once, by rank 0";
  }
  for (int i = 0; i < kNumParamTensors; ++i) EXPECT_FALSE(worker::gpt_tp_sharded(i, 1));
}

TEST(GptLayout, DecayAndOverwriteMasksAreTheMatrices) {
  std::vector<std::string> decayed, overwritten;
  for (const auto& p : kParams) {
    if (p.decay) decayed.push_back(p.name);
    if (p.matmul_weight) overwritten.push_back(p.name);
  }
  EXPECT_EQ(decayed, (std::vector<std::string>{"wte", "wpe", "qkvw", "attprojw", "fcw",
                                               "fcprojw"}));
  // wpe is decayed but its gradient is a sum over positions, accumulated like a bias.
  EXPECT_EQ(overwritten,
            (std::vector<std::string>{"wte", "qkvw", "attprojw", "fcw", "fcprojw"}));
}

TEST(GptLayout, OneFlopsCount_ThePlannersAndARanksShare) {
  api::ModelDims m;
  m.layers = 12;
  m.hidden = 768;
  m.heads = 12;
  m.ffn_hidden = 3072;
  m.vocab = 50257;
  m.seq_len = 1024;
  const double whole = planner::model_flops_per_token(m);
  EXPECT_DOUBLE_EQ(whole, 6.0 * static_cast<double>(api::parameter_count(m)) +
                              12.0 * 12 * 768 * 1024);
  // Two TP ranks: each counts its own parameters and half the attention channels, so together
  // they count the model once plus the replicated tensors they both hold.
  const GptConfig c = gpt2_small();
  const auto half = worker::gpt_param_sizes(c, 2);
  double replicated = 0, rank_params = 0;
  for (int i = 0; i < kNumParamTensors; ++i) {
    rank_params += static_cast<double>(half[i]);
    if (!worker::gpt_tp_sharded(i, 2)) replicated += static_cast<double>(half[i]);
  }
  const double rank = api::gpt_flops_per_token(rank_params, 12, 768 / 2, 1024);
  const double model_padded =
      api::gpt_flops_per_token(rank_params * 2 - replicated, 12, 768, 1024);
  EXPECT_DOUBLE_EQ(2 * rank, model_padded + 6.0 * replicated);
}

}  // namespace
}  // namespace kt

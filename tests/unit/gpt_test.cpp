// The whole model: gradients against finite differences, and the parameter layout llm.c uses.
#include "worker/gpt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "api/model.h"
#include "tests/support/random.h"

namespace kt {
namespace {

using test::random_tokens;
using worker::Gpt;
using worker::GptConfig;

GptConfig tiny_config() {
  // Small enough for finite differences in float32, with every part present: 2 layers, 2
  // heads, an ffn that is not 4C, a padded vocabulary.
  return {8, 11, 16, 2, 2, 8, 12};
}

TEST(Gpt, ParameterLayoutIsLlmcs) {
  const api::ModelDims dims = api::find_model_preset("gpt2-124m")->dims;
  Gpt model(GptConfig::from(dims), 1, 8, worker::Device::cpu());
  EXPECT_EQ(model.num_parameters(), api::parameter_count(dims));
  const auto views = model.parameter_views();
  ASSERT_EQ(views.size(), 16u);
  EXPECT_EQ(views[0].name, "wte");
  EXPECT_EQ(views[0].shape, (std::vector<int64_t>{50304, 768}));
  EXPECT_EQ(views[4].name, "qkvw");
  EXPECT_EQ(views[4].shape, (std::vector<int64_t>{12, 2304, 768}));
  EXPECT_EQ(views[15].name, "lnfb");
  EXPECT_EQ(views[15].data + 768, model.params() + model.num_parameters());
}

TEST(Gpt, GradientsMatchFiniteDifferences) {
  const unsigned seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const GptConfig config = tiny_config();
  const int64_t B = 2, T = 5;
  Gpt model(config, B, T, worker::Device::cpu());
  model.init_weights(seed);
  // Larger weights than GPT-2's 0.02 so that every path carries a measurable gradient.
  std::normal_distribution<float> normal(0.0f, 0.3f);
  const int64_t P = model.num_parameters();
  for (int64_t i = 0; i < P; ++i) model.params()[i] += normal(rng);
  for (int64_t i = config.vocab * config.channels; i < config.padded_vocab * config.channels; ++i)
    model.params()[i] = 0;  // padded rows: never used, gradient 0
  const auto inputs = random_tokens(rng, B * T, static_cast<int32_t>(config.vocab));
  const auto targets = random_tokens(rng, B * T, static_cast<int32_t>(config.vocab));

  model.zero_grad();
  model.train_micro_step(inputs.data(), targets.data(), 1.0f);
  const std::vector<float> grad(model.grads(), model.grads() + P);

  // Directional derivative along a random direction over all parameters: a large, robust signal.
  std::vector<float> direction(P);
  double predicted = 0, norm = 0;
  for (int64_t i = 0; i < P; ++i) {
    direction[i] = normal(rng);
    predicted += static_cast<double>(grad[i]) * direction[i];
    norm += static_cast<double>(direction[i]) * direction[i];
  }
  const float eps = 1e-3f / static_cast<float>(std::sqrt(norm / P));
  std::vector<float> base(model.params(), model.params() + P);
  auto loss_at = [&](float scale) {
    for (int64_t i = 0; i < P; ++i) model.params()[i] = base[i] + scale * direction[i];
    return static_cast<double>(model.evaluate(inputs.data(), targets.data()));
  };
  // Central differences err by h²·f‴/6, and with these weights the loss can curve enough for that
  // to matter (seed 177981049: 0.0313 against 0.0361 at h = eps, the gap falling 4× with each
  // halving of h). Richardson's extrapolation from h and h/2 cancels the h² term, leaving h⁴ and
  // the float32 floor.
  const auto derivative = [&](float h) {
    const auto central = [&](float s) { return (loss_at(s) - loss_at(-s)) / (2 * s); };
    return (4 * central(h / 2) - central(h)) / 3;
  };
  const double measured = derivative(eps);
  // 1 % of the derivative, plus the float32 finite-difference floor for small derivatives.
  EXPECT_NEAR(measured, predicted, 1e-2 * std::fabs(predicted) + 1e-3) << "directional derivative";

  // Per tensor: a few coordinates each, where the gradient is not negligible.
  const auto views = model.gradient_views();
  int64_t offset = 0, checked = 0;
  for (const auto& v : views) {
    std::uniform_int_distribution<int64_t> pick(0, v.numel() - 1);
    for (int k = 0; k < 8; ++k) {
      const int64_t i = offset + pick(rng);
      if (std::fabs(grad[i]) < 1e-3) continue;
      std::fill(direction.begin(), direction.end(), 0.0f);
      direction[i] = 1.0f;
      const double fd = derivative(4e-3f);  // (from 4e-3 and 2e-3: the float32 floor of 2e-3)
      EXPECT_NEAR(fd, grad[i], 3e-2 * std::fabs(grad[i]) + 2e-4)
          << v.name << "[" << i - offset << "]";
      ++checked;
    }
    offset += v.numel();
  }
  EXPECT_GT(checked, 40);
}

TEST(Gpt, AccumulatedGradientsEqualTheBigBatch) {
  // Two micro-batches of 2 with loss scale 1/2 give the gradient of one batch of 4.
  const GptConfig config = tiny_config();
  std::mt19937 rng(7);
  const auto inputs = random_tokens(rng, 4 * 5, static_cast<int32_t>(config.vocab));
  const auto targets = random_tokens(rng, 4 * 5, static_cast<int32_t>(config.vocab));
  Gpt big(config, 4, 5, worker::Device::cpu());
  Gpt small(config, 2, 5, worker::Device::cpu());
  big.init_weights(3);
  small.init_weights(3);
  big.zero_grad();
  const float loss_big = big.train_micro_step(inputs.data(), targets.data(), 1.0f);
  small.zero_grad();
  const float l0 = small.train_micro_step(inputs.data(), targets.data(), 0.5f);
  const float l1 = small.train_micro_step(inputs.data() + 10, targets.data() + 10, 0.5f);
  EXPECT_NEAR((l0 + l1) / 2, loss_big, 1e-6);
  double num = 0, den = 0;
  for (int64_t i = 0; i < big.num_parameters(); ++i) {
    num += std::pow(big.grads()[i] - small.grads()[i], 2);
    den += std::pow(big.grads()[i], 2);
  }
  EXPECT_LT(std::sqrt(num / den), 1e-5);
}

TEST(Gpt, InitialLossIsLogVocab) {
  // GPT-2's small initialisation predicts nearly uniformly: loss ≈ ln V.
  const GptConfig config{64, 256, 256, 2, 4, 64, 256};
  Gpt model(config, 4, 64, worker::Device::cpu());
  model.init_weights(1);
  std::mt19937 rng(2);
  const auto x = random_tokens(rng, 4 * 64, 256);
  const auto y = random_tokens(rng, 4 * 64, 256);  // not x: tied embeddings favour the input
  EXPECT_NEAR(model.evaluate(x.data(), y.data()), std::log(256.0), 0.05);
}

}  // namespace
}  // namespace kt

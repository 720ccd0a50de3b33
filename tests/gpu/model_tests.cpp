// The CUDA model (worker/cuda_gpt.h) on one rank: bf16 steps against a float64 GPT-2 built from
// kernels/reference.h, offload (optimizer and window) against everything on the device, a small
// model memorising one batch, and recompute against keeping every activation.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "tests/gpu/gpu_tests.h"
#include "tests/gpu/test_support.h"

namespace kt::gpu_test {
namespace {

// One GPT-2 forward and backward in float64 through kernels/reference.h, in the CUDA model's
// parameter layout: the specification the model is checked against. grads (P) are overwritten;
// returns the mean loss over the B·T targets.
double reference_gpt_step(const GptConfig& c, const std::array<int64_t, 16>& sizes, const D& p,
                          D& grads, const std::vector<int32_t>& tok,
                          const std::vector<int32_t>& tgt, int64_t B, int64_t T) {
  const int64_t L = c.layers, C = c.channels, NH = c.heads, F = c.ffn, V = c.vocab,
                Vp = c.padded_vocab, BT = B * T, A = B * NH * T * T;
  std::array<int64_t, 16> o{};
  for (int i = 1; i < 16; ++i) o[i] = o[i - 1] + sizes[i - 1];
  auto w = [&](int i, int64_t l) { return p.data() + o[i] + l * (sizes[i] / L); };
  auto g = [&](int i, int64_t l) { return grads.data() + o[i] + l * (sizes[i] / L); };
  auto layers = [&](int64_t n) { return std::vector<D>(L, D(n)); };
  std::vector<D> res(L + 1, D(BT * C));
  auto ln1 = layers(BT * C), ln1m = layers(BT), ln1r = layers(BT), qkv = layers(BT * 3 * C),
       atty = layers(BT * C), pre = layers(A), att = layers(A), res2 = layers(BT * C),
       ln2 = layers(BT * C), ln2m = layers(BT), ln2r = layers(BT), fch = layers(BT * F),
       fchg = layers(BT * F);
  D proj(BT * C), lnf(BT * C), lnfm(BT), lnfr(BT), logits(BT * Vp), dlogits(BT * Vp), losses(BT);
  ref::embedding_forward<double>(res[0].data(), tok.data(), w(0, 0), w(1, 0), B, T, C);
  for (int64_t l = 0; l < L; ++l) {
    ref::layernorm_forward<double>(ln1[l].data(), ln1m[l].data(), ln1r[l].data(), res[l].data(),
                                   w(2, l), w(3, l), BT, C);
    ref::matmul_forward<double>(qkv[l].data(), ln1[l].data(), w(4, l), w(5, l), BT, C, 3 * C);
    ref::attention_forward<double>(atty[l].data(), pre[l].data(), att[l].data(), qkv[l].data(), B,
                                   T, C, NH);
    ref::matmul_forward<double>(proj.data(), atty[l].data(), w(6, l), w(7, l), BT, C, C);
    ref::residual_forward<double>(res2[l].data(), res[l].data(), proj.data(), BT * C);
    ref::layernorm_forward<double>(ln2[l].data(), ln2m[l].data(), ln2r[l].data(), res2[l].data(),
                                   w(8, l), w(9, l), BT, C);
    ref::matmul_forward<double>(fch[l].data(), ln2[l].data(), w(10, l), w(11, l), BT, C, F);
    ref::gelu_forward<double>(fchg[l].data(), fch[l].data(), BT * F);
    ref::matmul_forward<double>(proj.data(), fchg[l].data(), w(12, l), w(13, l), BT, F, C);
    ref::residual_forward<double>(res[l + 1].data(), res2[l].data(), proj.data(), BT * C);
  }
  ref::layernorm_forward<double>(lnf.data(), lnfm.data(), lnfr.data(), res[L].data(), w(14, 0),
                                 w(15, 0), BT, C);
  ref::matmul_forward<double>(logits.data(), lnf.data(), w(0, 0), nullptr, BT, C, Vp);
  ref::softmax_cross_entropy<double>(losses.data(), dlogits.data(), logits.data(), tgt.data(), BT,
                                     V, Vp, 1.0 / static_cast<double>(BT));
  std::fill(grads.begin(), grads.end(), 0.0);
  D dlnf(BT * C, 0.0), dres(BT * C, 0.0);
  ref::matmul_backward<double>(dlnf.data(), g(0, 0), nullptr, dlogits.data(), lnf.data(), w(0, 0),
                               BT, C, Vp);
  ref::layernorm_backward<double>(dres.data(), g(14, 0), g(15, 0), dlnf.data(), res[L].data(),
                                  w(14, 0), lnfm.data(), lnfr.data(), BT, C);
  for (int64_t l = L - 1; l >= 0; --l) {
    D dfchg(BT * F, 0.0), dfch(BT * F, 0.0), dln2(BT * C, 0.0), datty(BT * C, 0.0),
        dqkv(BT * 3 * C, 0.0), dpre(A, 0.0), datt(A, 0.0), dln1(BT * C, 0.0);
    ref::matmul_backward<double>(dfchg.data(), g(12, l), g(13, l), dres.data(), fchg[l].data(),
                                 w(12, l), BT, F, C);
    ref::gelu_backward<double>(dfch.data(), fch[l].data(), dfchg.data(), BT * F);
    ref::matmul_backward<double>(dln2.data(), g(10, l), g(11, l), dfch.data(), ln2[l].data(),
                                 w(10, l), BT, C, F);
    ref::layernorm_backward<double>(dres.data(), g(8, l), g(9, l), dln2.data(), res2[l].data(),
                                    w(8, l), ln2m[l].data(), ln2r[l].data(), BT, C);
    ref::matmul_backward<double>(datty.data(), g(6, l), g(7, l), dres.data(), atty[l].data(),
                                 w(6, l), BT, C, C);
    ref::attention_backward<double>(dqkv.data(), dpre.data(), datt.data(), datty.data(),
                                    qkv[l].data(), att[l].data(), B, T, C, NH);
    ref::matmul_backward<double>(dln1.data(), g(4, l), g(5, l), dqkv.data(), ln1[l].data(),
                                 w(4, l), BT, C, 3 * C);
    ref::layernorm_backward<double>(dres.data(), g(2, l), g(3, l), dln1.data(), res[l].data(),
                                    w(2, l), ln1m[l].data(), ln1r[l].data(), BT, C);
  }
  ref::embedding_backward<double>(g(0, 0), g(1, 0), dres.data(), tok.data(), B, T, C);
  double sum = 0;
  for (double x : losses) sum += x;
  return sum / static_cast<double>(BT);
}

// AdamW over the whole layout in float64, decay by tensor as the model does.
void reference_adamw(const std::array<int64_t, 16>& sizes, D& p, const D& grads, D& m, D& v,
                     AdamWStep step, float weight_decay) {
  int64_t o = 0;
  for (int i = 0; i < 16; ++i) {
    step.weight_decay = worker::gpt_decays(i) ? weight_decay : 0.0f;
    ref::adamw_update<double>(p.data() + o, grads.data() + o, m.data() + o, v.data() + o, sizes[i],
                              step);
    o += sizes[i];
  }
}

// Steps of the CUDA model (bf16) against the float64 reference from the same initial weights:
// the first step's gradients within bf16 tolerance, and the loss of every step.
void test_cuda_gpt_vs_reference() {
  const GptConfig c = kSmallGpt;
  const int64_t B = 3, T = 29, steps = 4;
  CudaGpt gpt(*g_device, c, B, T);
  gpt.init_weights(g_seed);
  const int64_t P = gpt.num_parameters();
  F host(P);
  gpt.get_parameters(host.data());
  D p = widen(host), grads(P), m(P, 0.0), v(P, 0.0);
  AdamWStep adam;
  adam.learning_rate = 3e-3f;
  bool losses_ok = true;
  std::string detail;
  for (int64_t s = 0; s < steps; ++s) {
    const auto [tok, tgt] = random_batch(B * T, c.vocab);
    gpt.zero_grad();
    gpt.train_micro_step(tok.data(), tgt.data(), 1.0f, true);
    const double loss = gpt.mean_loss();
    const double ref_loss = reference_gpt_step(c, gpt.param_sizes(), p, grads, tok, tgt, B, T);
    if (s == 0) {
      F got(P);
      gpt.get_gradients(got.data());
      expect_close(got, grads, 3e-2, "cuda gpt step 1 gradients vs float64 (bf16)");
    }
    const double err = std::abs(loss - ref_loss) / ref_loss;
    losses_ok = losses_ok && err < 1e-2;  // NaN fails
    char pair[64];
    std::snprintf(pair, sizeof pair, " %.4f/%.4f", loss, ref_loss);
    detail += pair;
    adam.t = s + 1;
    gpt.update(adam, 0.1f);
    reference_adamw(gpt.param_sizes(), p, grads, m, v, adam, 0.1f);
  }
  check(losses_ok, "cuda gpt losses (got/float64) differ by ≥ 1%:" + detail);
  if (losses_ok)
    std::printf("ok    %-44s got/float64%s\n", "cuda gpt 4 AdamW steps: losses within 1%",
                detail.c_str());
}

// The offload tests' run: 5 AdamW steps (clipped at norm 1) of 2 micro-batches each on fixed
// batches, with the weights after the first and the last step, every loss, the bytes copied
// between host and device, and the device memory the weights and gradients take.
struct OffloadRun {
  F first, last;
  std::vector<double> losses;
  int64_t copied = 0;
  double param_bytes = 0;
};
constexpr int64_t kOffloadB = 2, kOffloadT = 32, kOffloadSteps = 5, kOffloadAccum = 2;
OffloadRun offload_run(const GptConfig& c, const std::vector<std::vector<int32_t>>& batches,
                       CudaGptOptions options) {
  OffloadRun r;
  options.cpu_threads = 2;
  const auto param_bytes = [] {
    auto in_use = g_device->device_memory_stats().in_use_bytes;
    return static_cast<double>(in_use[MemoryKind::kParams] + in_use[MemoryKind::kGrads]);
  };
  const double before = param_bytes();
  CudaGpt gpt(*g_device, c, kOffloadB, kOffloadT, options);
  r.param_bytes = param_bytes() - before;
  gpt.init_weights(g_seed);
  const int64_t accum = kOffloadAccum;
  for (int64_t s = 0; s < kOffloadSteps; ++s) {
    gpt.zero_grad();
    for (int64_t k = 0; k < accum; ++k)
      gpt.train_micro_step(batches[2 * (s * accum + k)].data(),
                           batches[2 * (s * accum + k) + 1].data(), 1.0f / accum,
                           k == accum - 1);
    r.losses.push_back(gpt.mean_loss());
    const double norm = std::sqrt(gpt.grad_sum_of_squares());
    AdamWStep adam;
    adam.learning_rate = 2e-3f;
    adam.t = s + 1;
    adam.grad_scale = norm > 1.0 ? static_cast<float>(1.0 / norm) : 1.0f;  // clip at 1
    gpt.update(adam, 0.1f);
    if (s == 0 || s == kOffloadSteps - 1) {
      F& out = s == 0 ? r.first : r.last;
      out.resize(gpt.num_parameters());
      gpt.get_parameters(out.data());
    }
  }
  r.copied = gpt.h2d_bytes() + gpt.d2h_bytes();
  return r;
}
std::vector<std::vector<int32_t>> offload_batches(const GptConfig& c) {
  std::vector<std::vector<int32_t>> batches;
  for (int64_t i = 0; i < kOffloadSteps * kOffloadAccum; ++i) {
    auto [tok, tgt] = random_batch(kOffloadB * kOffloadT, c.vocab);
    batches.push_back(tok);
    batches.push_back(tgt);
  }
  return batches;
}
// An offloaded run against the same model all on the device: step-1 weights to 1e-6, every loss
// to 1e-4, the final weights to 1e-2, and some bytes copied.
void expect_same_training(const OffloadRun& r, const OffloadRun& base, const std::string& what) {
  expect_close(r.first, widen(base.first), 1e-6, what + " step-1 weights");
  double worst = 0;
  for (size_t i = 0; i < r.losses.size(); ++i)
    worst = std::max(worst, std::abs(r.losses[i] - base.losses[i]) / base.losses[i]);
  check(worst < 1e-4, what + " losses differ by " + std::to_string(worst));
  if (worst < 1e-4)
    std::printf("ok    %-44s worst rel diff %.1e (tol 1e-04)\n", (what + " 5 losses").c_str(),
                worst);
  expect_close(r.last, widen(base.last), 1e-2, what + " step-5 weights");
  check(r.copied > 0, what + " moved no bytes");
}

// offload: optimizer moves AdamW of some units to the CPU; the model must train the same as with
// everything on the device, up to the fp32 rounding of the two AdamW implementations: after one
// step the weights agree to 1e-6; over 5 steps (2 micro-batches each, clipping) every loss to
// 1e-4 (a forward that read a unit's weights before their copy landed would use the previous
// step's and miss by far more). The final weights are compared loosely only: AdamW turns
// rounding-level differences in noise-only gradients (the key biases' is 0 in exact arithmetic)
// into full-size steps of either sign. And the copies must have happened.
void test_cuda_gpt_offload() {
  const GptConfig c = kSmallGpt;
  const auto batches = offload_batches(c);
  const OffloadRun base = offload_run(c, batches, CudaGptOptions{});
  check(base.copied == 0, "cuda gpt without offload copied " + std::to_string(base.copied) +
                              " bytes between host and device");
  for (int64_t device_units : {int64_t{1}, int64_t{0}, c.layers}) {
    CudaGptOptions options;
    options.device_units = device_units;
    expect_same_training(offload_run(c, batches, options), base,
                         "offload: optimizer (gpuUnits " + std::to_string(device_units) + ")");
  }
}

// offload: window streams the CPU-updated layers through `window` slots (weights loaded before
// each use, gradients copied out and summed in host memory after each micro-batch, activation
// checkpoints out and back through a ring of two): it must train as keeping everything on the
// device with the same recompute, as offload: optimizer must (the 2 micro-batches check the
// host-side sum) — with less weight and gradient memory on the device.
void test_cuda_gpt_window() {
  struct Variant {
    int64_t device_units, window;
    api::Recompute recompute;
    int64_t layers = 2;  // 4: more streamed layers than slots and checkpoint buffers (reuse)
  };
  for (const Variant v : {Variant{1, 1, api::Recompute::kFull},
                          Variant{1, 2, api::Recompute::kFull},
                          Variant{2, 1, api::Recompute::kFull},
                          Variant{1, 1, api::Recompute::kCommAware},
                          Variant{2, 2, api::Recompute::kCommAware, 4},
                          Variant{1, 1, api::Recompute::kFull, 4}}) {
    GptConfig c = kSmallGpt;
    c.layers = v.layers;
    const auto batches = offload_batches(c);
    CudaGptOptions options;
    options.recompute = v.recompute;
    const OffloadRun base = offload_run(c, batches, options);
    options.device_units = v.device_units;
    options.window = v.window;
    const OffloadRun r = offload_run(c, batches, options);
    const std::string what =
        "offload: window (L " + std::to_string(v.layers) + ", gpuUnits " +
        std::to_string(v.device_units) + ", window " + std::to_string(v.window) +
        (v.recompute == api::Recompute::kFull ? ", full)" : ", commAware)");
    expect_same_training(r, base, what);
    check(r.param_bytes < base.param_bytes,
          what + " kept " + std::to_string(r.param_bytes) +
              " bytes of weights and gradients on the device, all-on-device " +
              std::to_string(base.param_bytes));
  }
}

// A small model memorises one batch: a wrong gradient anywhere in the composed step would stop
// the loss from falling far below ln V. Head size 16: the materialised fp32 attention.
void test_cuda_gpt_memorises() {
  const GptConfig c{32, 256, 256, 2, 4, 64, 256};
  const int64_t B = 4, T = 32;
  CudaGpt gpt(*g_device, c, B, T);
  gpt.init_weights(g_seed);
  const auto [tok, tgt] = random_batch(B * T, c.vocab);
  const double ln_v = std::log(static_cast<double>(c.vocab));
  std::vector<double> losses;
  for (int i = 0; i < 100; ++i) {
    gpt.zero_grad();
    gpt.train_micro_step(tok.data(), tgt.data(), 1.0f, true);
    losses.push_back(gpt.mean_loss());
    AdamWStep adam;
    adam.learning_rate = 5e-3f;
    adam.t = i + 1;
    gpt.update(adam, 0.0f);
  }
  bool finite = true;
  for (double l : losses) finite = finite && std::isfinite(l);
  check(finite, "cuda gpt training: a loss is not finite");
  check(std::abs(losses.front() - ln_v) < 0.15, "cuda gpt training: first loss " +
                                                     std::to_string(losses.front()) +
                                                     " is not ln V = " + std::to_string(ln_v));
  check(losses.back() < 0.6 * ln_v, "cuda gpt training: loss after 100 steps " +
                                        std::to_string(losses.back()) + " ≥ 0.6·ln V");
  std::printf("info  %-44s loss %.3f → %.3f (ln V %.3f)\n", "cuda gpt memorises (L2 C64, 100 steps)",
              losses.front(), losses.back(), ln_v);
}

// Recompute re-runs each layer's forward from its kept input before its backward; the forward
// kernels are deterministic, so training must match keeping every activation: step-1 gradients
// within 1e-6 (only wte's atomic adds differ in order), 3 losses within 1e-5, the weights loosely
// (AdamW magnifies rounding-level differences in noise-only gradients) — with less activation
// memory. Both attention paths: head size 32 (flash) and 16 (materialised fp32).
void test_cuda_gpt_recompute() {
  for (const GptConfig& c : {kSmallGpt, GptConfig{32, 256, 256, 2, 4, 64, 256}}) {
    const int64_t B = 2, T = 32, steps = 3;
    const std::string shape = " (hs " + std::to_string(c.channels / c.heads) + ")";
    std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> batches;
    for (int64_t s = 0; s < steps; ++s) batches.push_back(random_batch(B * T, c.vocab));
    auto run = [&](api::Recompute mode, double* activation_bytes) {
      CudaGptOptions options;
      options.recompute = mode;
      const auto before = g_device->device_memory_stats().in_use_bytes[MemoryKind::kActivations];
      {
        CudaGpt probe(*g_device, c, B, T, options);
        *activation_bytes = static_cast<double>(
            g_device->device_memory_stats().in_use_bytes[MemoryKind::kActivations] - before);
      }
      return train_steps(*g_device, c, B, T, options, 1.0f, steps,
                         [&](int64_t s) { return batches[s]; });
    };
    double none_bytes = 0, full_bytes = 0, comm_bytes = 0;
    const DpRun none = run(api::Recompute::kNone, &none_bytes);
    for (auto mode : {api::Recompute::kFull, api::Recompute::kCommAware}) {
      const bool full = mode == api::Recompute::kFull;
      const std::string tag = std::string(full ? "full" : "commAware") + shape;
      const DpRun r = run(mode, full ? &full_bytes : &comm_bytes);
      expect_close(r.grads1, widen(none.grads1), 1e-6, "recompute " + tag + ": step-1 gradients");
      double worst = 0;
      for (int64_t s = 0; s < steps; ++s)
        worst = std::max(worst, std::abs(r.losses[s] - none.losses[s]) / none.losses[s]);
      check(worst < 1e-5, "recompute " + tag + ": losses differ by " + std::to_string(worst));
      expect_close(r.weights, widen(none.weights), 1e-2, "recompute " + tag + ": step-3 weights");
    }
    check(full_bytes < comm_bytes && comm_bytes < none_bytes,
          "recompute" + shape + ": activation bytes none " + std::to_string(none_bytes) +
              ", commAware " + std::to_string(comm_bytes) + ", full " + std::to_string(full_bytes) +
              " (expected full < commAware < none)");
  }
}

}  // namespace

std::vector<NamedTest> model_tests() {
  return {{"gpt vs reference", test_cuda_gpt_vs_reference},
          {"gpt offload", test_cuda_gpt_offload},
          {"gpt window", test_cuda_gpt_window},
          {"gpt memorises", test_cuda_gpt_memorises},
          {"gpt recompute", test_cuda_gpt_recompute}};
}

}  // namespace kt::gpu_test

// Every CPU kernel against the float64 run of the reference loops, on fresh random inputs
// (the seed is printed on failure). Error measure: ‖fast − ref64‖ / ‖ref64‖ < 1e-5.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/fast_math.h"
#include "kernels/bf16.h"
#include "kernels/ops.h"
#include "kernels/reference.h"
#include "tests/support/random.h"
#include "tests/support/rel_error.h"

namespace kt {
namespace {

namespace ref = kernels::reference;
namespace cpu = kernels::cpu;

using F = std::vector<float>;
using D = std::vector<double>;

class Kernels : public ::testing::Test {
 protected:
  Kernels() : seed_(test::fresh_seed()), rng_(seed_) {}
  void SetUp() override { RecordProperty("seed", std::to_string(seed_)); }

  F random(size_t n, float scale = 1.0f) { return test::random_normal(rng_, n, scale); }
  std::vector<int32_t> tokens(size_t n, int32_t vocab) {
    return test::random_tokens(rng_, n, vocab);
  }
  static D widen(const F& x) { return D(x.begin(), x.end()); }
  void expect_close(const F& got, const D& want, const char* what, double tol = 1e-5) {
    EXPECT_LT(test::rel_error(got, want), tol) << what << " (seed " << seed_ << ")";
  }
  unsigned seed_;
  std::mt19937 rng_;
};

TEST_F(Kernels, Matmul) {
  const int64_t BT = 37, C = 96, OC = 130;  // odd sizes on purpose
  F inp = random(BT * C), w = random(OC * C, 0.1f), bias = random(OC), dout = random(BT * OC);
  F out(BT * OC), dinp = random(BT * C), dw = random(OC * C), db = random(OC);
  D out64(BT * OC), dinp64 = widen(dinp), dw64 = widen(dw), db64 = widen(db);
  const D inp64 = widen(inp), w64 = widen(w), bias64 = widen(bias), dout64 = widen(dout);
  cpu::matmul_forward(out.data(), inp.data(), w.data(), bias.data(), BT, C, OC);
  ref::matmul_forward(out64.data(), inp64.data(), w64.data(), bias64.data(), BT, C, OC);
  expect_close(out, out64, "forward");
  cpu::matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), BT, C,
                       OC);
  ref::matmul_backward(dinp64.data(), dw64.data(), db64.data(), dout64.data(), inp64.data(),
                       w64.data(), BT, C, OC);
  expect_close(dinp, dinp64, "dinp");
  expect_close(dw, dw64, "dweight");
  expect_close(db, db64, "dbias");
  // Overwriting the weight gradient instead of accumulating (the first micro-batch of a step).
  F dw2 = random(OC * C), dinp2 = dinp;
  D dw2_64 = widen(dw2), dinp2_64 = dinp64;
  cpu::matmul_backward(dinp2.data(), dw2.data(), nullptr, dout.data(), inp.data(), w.data(), BT, C,
                       OC, false);
  ref::matmul_backward(dinp2_64.data(), dw2_64.data(), static_cast<double*>(nullptr), dout64.data(),
                       inp64.data(), w64.data(), BT, C, OC, false);
  expect_close(dw2, dw2_64, "dweight overwritten");
  // Without a bias.
  cpu::matmul_forward(out.data(), inp.data(), w.data(), nullptr, BT, C, OC);
  ref::matmul_forward(out64.data(), inp64.data(), w64.data(), static_cast<const double*>(nullptr),
                      BT, C, OC);
  expect_close(out, out64, "forward without bias");
}

// The bf16 matmuls: against float64 on the same inputs rounded to bf16 (what the kernel promises:
// exact bf16 inputs, fp32 sums — tight), and against float64 on the unrounded inputs (what
// training sees: within bf16's rounding, 2⁻⁸ relative per input).
TEST_F(Kernels, MatmulBf16) {
  const int64_t BT = 45, C = 80, OC = 136;  // odd BT on purpose
  auto round = [](const F& x) {
    F r(x.size());
    for (size_t i = 0; i < x.size(); ++i)
      r[i] = kernels::bf16_to_float(kernels::float_to_bf16(x[i]));
    return r;
  };
  F inp = random(BT * C), w = random(OC * C, 0.1f), bias = random(OC), dout = random(BT * OC);
  std::vector<uint16_t> w16(w.size());
  cpu::to_bf16(w16.data(), w.data(), static_cast<int64_t>(w.size()));
  EXPECT_EQ(round(w), [&] {
    F back(w16.size());
    for (size_t i = 0; i < w16.size(); ++i) back[i] = kernels::bf16_to_float(w16[i]);
    return back;
  }()) << "to_bf16 rounds like float_to_bf16";
  const D inp_r = widen(round(inp)), w_r = widen(round(w)), dout_r = widen(round(dout));
  const D inp64 = widen(inp), w64 = widen(w), dout64 = widen(dout), bias64 = widen(bias);

  F out(BT * OC);
  D want_r(BT * OC), want(BT * OC);
  cpu::matmul_forward_bf16(out.data(), inp.data(), w16.data(), bias.data(), BT, C, OC);
  ref::matmul_forward(want_r.data(), inp_r.data(), w_r.data(), bias64.data(), BT, C, OC);
  ref::matmul_forward(want.data(), inp64.data(), w64.data(), bias64.data(), BT, C, OC);
  expect_close(out, want_r, "bf16 forward vs rounded inputs");
  expect_close(out, want, "bf16 forward vs fp64", 1e-2);
  cpu::matmul_forward_bf16(out.data(), inp.data(), w16.data(), nullptr, BT, C, OC);
  ref::matmul_forward(want_r.data(), inp_r.data(), w_r.data(), static_cast<const double*>(nullptr),
                      BT, C, OC);
  expect_close(out, want_r, "bf16 forward without bias");

  for (bool accumulate : {true, false}) {
    F dinp = random(BT * C), dw = random(OC * C), db = random(OC);
    D dinp_r = widen(dinp), dw_r = widen(dw), dinp64 = widen(dinp), dw64 = widen(dw);
    D db64 = widen(db);
    cpu::matmul_backward_bf16(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(),
                              w16.data(), BT, C, OC, accumulate);
    ref::matmul_backward(dinp_r.data(), dw_r.data(), static_cast<double*>(nullptr), dout_r.data(),
                         inp_r.data(), w_r.data(), BT, C, OC, accumulate);
    ref::matmul_backward(dinp64.data(), dw64.data(), db64.data(), dout64.data(), inp64.data(),
                         w64.data(), BT, C, OC, accumulate);
    const char* mode = accumulate ? " (accumulated)" : " (overwritten)";
    expect_close(dinp, dinp_r, (std::string("bf16 dinp") + mode).c_str());
    expect_close(dw, dw_r, (std::string("bf16 dweight") + mode).c_str());
    expect_close(dinp, dinp64, "bf16 dinp vs fp64", 1e-2);
    expect_close(dw, dw64, "bf16 dweight vs fp64", 1e-2);
    // The bias gradient sums the fp32 dout: no rounding.
    expect_close(db, db64, "dbias from fp32 dout");
  }
}

TEST_F(Kernels, LayerNorm) {
  const int64_t BT = 29, C = 72;
  F inp = random(BT * C, 2.0f), w = random(C), b = random(C), dout = random(BT * C);
  for (auto& x : inp) x += 0.5f;  // a non-zero mean
  F out(BT * C), mean(BT), rstd(BT), dinp = random(BT * C), dw = random(C), db = random(C);
  D out64(BT * C), mean64(BT), rstd64(BT), dinp64 = widen(dinp), dw64 = widen(dw), db64 = widen(db);
  const D inp64 = widen(inp), w64 = widen(w), b64 = widen(b), dout64 = widen(dout);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), BT,
                         C);
  ref::layernorm_forward(out64.data(), mean64.data(), rstd64.data(), inp64.data(), w64.data(),
                         b64.data(), BT, C);
  expect_close(out, out64, "out");
  expect_close(mean, mean64, "mean");
  expect_close(rstd, rstd64, "rstd");
  cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                          mean.data(), rstd.data(), BT, C);
  ref::layernorm_backward(dinp64.data(), dw64.data(), db64.data(), dout64.data(), inp64.data(),
                          w64.data(), mean64.data(), rstd64.data(), BT, C);
  expect_close(dinp, dinp64, "dinp");
  expect_close(dw, dw64, "dweight");
  expect_close(db, db64, "dbias");
}

TEST_F(Kernels, GeluAndResidual) {
  const int64_t N = 1000;
  F x = random(N, 2.0f), y = random(N), dout = random(N);
  F out(N), dinp = random(N), da = random(N), db = random(N);
  D out64(N), dinp64 = widen(dinp), da64 = widen(da), db64 = widen(db);
  const D x64 = widen(x), y64 = widen(y), dout64 = widen(dout);
  cpu::gelu_forward(out.data(), x.data(), N);
  ref::gelu_forward(out64.data(), x64.data(), N);
  expect_close(out, out64, "gelu forward");
  cpu::gelu_backward(dinp.data(), x.data(), dout.data(), N);
  ref::gelu_backward(dinp64.data(), x64.data(), dout64.data(), N);
  expect_close(dinp, dinp64, "gelu backward");
  cpu::residual_forward(out.data(), x.data(), y.data(), N);
  ref::residual_forward(out64.data(), x64.data(), y64.data(), N);
  expect_close(out, out64, "residual forward");
  cpu::residual_backward(da.data(), db.data(), dout.data(), N);
  ref::residual_backward(da64.data(), db64.data(), dout64.data(), N);
  expect_close(da, da64, "residual da");
  expect_close(db, db64, "residual db");
}

TEST_F(Kernels, Embedding) {
  const int64_t B = 3, T = 11, C = 40, V = 17;  // few tokens: repeats exercise the accumulation
  const auto tok = tokens(B * T, V);
  F wte = random(V * C), wpe = random(T * C), dout = random(B * T * C);
  F out(B * T * C), dwte = random(V * C), dwpe = random(T * C);
  D out64(B * T * C), dwte64 = widen(dwte), dwpe64 = widen(dwpe);
  const D wte64 = widen(wte), wpe64 = widen(wpe), dout64 = widen(dout);
  cpu::embedding_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  ref::embedding_forward(out64.data(), tok.data(), wte64.data(), wpe64.data(), B, T, C);
  expect_close(out, out64, "forward");
  cpu::embedding_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C);
  ref::embedding_backward(dwte64.data(), dwpe64.data(), dout64.data(), tok.data(), B, T, C);
  expect_close(dwte, dwte64, "dwte");
  expect_close(dwpe, dwpe64, "dwpe");
}

TEST_F(Kernels, CausalAttention) {
  const int64_t B = 2, T = 13, C = 48, NH = 4;
  F inp = random(B * T * 3 * C), dout = random(B * T * C);
  F out(B * T * C), pre(B * NH * T * T), att(B * NH * T * T);
  F dinp = random(B * T * 3 * C), dpre(B * NH * T * T, 0.0f), datt(B * NH * T * T, 0.0f);
  D out64(B * T * C), pre64(B * NH * T * T), att64(B * NH * T * T);
  D dinp64 = widen(dinp), dpre64(B * NH * T * T, 0.0), datt64(B * NH * T * T, 0.0);
  const D inp64 = widen(inp), dout64 = widen(dout);
  cpu::attention_forward(out.data(), pre.data(), att.data(), inp.data(), B, T, C, NH);
  ref::attention_forward(out64.data(), pre64.data(), att64.data(), inp64.data(), B, T, C, NH);
  expect_close(out, out64, "out");
  expect_close(att, att64, "att");
  cpu::attention_backward(dinp.data(), dpre.data(), datt.data(), dout.data(), inp.data(),
                          att.data(), B, T, C, NH);
  ref::attention_backward(dinp64.data(), dpre64.data(), datt64.data(), dout64.data(), inp64.data(),
                          att64.data(), B, T, C, NH);
  expect_close(dinp, dinp64, "dinp");
  // Causality: the output at t must not depend on inputs after t.
  F inp2 = inp;
  for (int64_t c = 0; c < 3 * C; ++c) inp2[(T - 1) * 3 * C + c] += 1.0f;  // change token T-1, b 0
  F out2(B * T * C);
  cpu::attention_forward(out2.data(), pre.data(), att.data(), inp2.data(), B, T, C, NH);
  for (int64_t i = 0; i < (T - 1) * C; ++i) ASSERT_EQ(out[i], out2[i]) << i;
}

TEST_F(Kernels, SoftmaxCrossEntropy) {
  const int64_t BT = 19, V = 90, Vp = 128;
  F logits = random(BT * Vp, 3.0f);
  const auto tgt = tokens(BT, static_cast<int32_t>(V));
  const float dloss = 1.0f / BT;
  F losses(BT), dlogits(BT * Vp);
  D losses64(BT), dlogits64(BT * Vp);
  const D logits64 = widen(logits);
  cpu::softmax_cross_entropy(losses.data(), dlogits.data(), logits.data(), tgt.data(), BT, V, Vp,
                             dloss);
  ref::softmax_cross_entropy(losses64.data(), dlogits64.data(), logits64.data(), tgt.data(), BT, V,
                             Vp, static_cast<double>(dloss));
  expect_close(losses, losses64, "losses");
  expect_close(dlogits, dlogits64, "dlogits");
  for (int64_t i = 0; i < BT; ++i)
    for (int64_t v = V; v < Vp; ++v) ASSERT_EQ(dlogits[i * Vp + v], 0.0f);
  // In place (dlogits aliasing logits), and loss only.
  F inplace = logits, loss_only(BT);
  cpu::softmax_cross_entropy(losses.data(), inplace.data(), inplace.data(), tgt.data(), BT, V, Vp,
                             dloss);
  expect_close(inplace, dlogits64, "in-place dlogits");
  cpu::softmax_cross_entropy(loss_only.data(), nullptr, logits.data(), tgt.data(), BT, V, Vp,
                             dloss);
  expect_close(loss_only, losses64, "loss only");
}

TEST_F(Kernels, AdamW) {
  const int64_t N = 1031;
  F p = random(N), g = random(N), m = random(N, 0.01f), v = random(N, 0.01f);
  for (auto& x : v) x = std::fabs(x);
  D p64 = widen(p), m64 = widen(m), v64 = widen(v);
  const D g64 = widen(g);
  kernels::AdamWStep step;
  step.learning_rate = 1e-3f;
  step.weight_decay = 0.1f;
  step.grad_scale = 0.5f;
  for (int64_t t = 1; t <= 3; ++t) {
    step.t = t;
    cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), N, step);
    ref::adamw_update(p64.data(), g64.data(), m64.data(), v64.data(), N, step);
  }
  expect_close(p, p64, "params");
  expect_close(m, m64, "m");
  expect_close(v, v64, "v");
  const F x = random(N);
  const double want = ref::sum_of_squares(widen(x).data(), N);
  EXPECT_NEAR(cpu::sum_of_squares(x.data(), N), want, 1e-9 * want);
}

// bf16 gradients in, fp32 master and bf16 weights out: the float64 reference on the gradients'
// exact bf16 values, and every output weight the correctly rounded bf16 of its master.
TEST_F(Kernels, MixedPrecisionAdamW) {
  const int64_t N = 1031;
  F master = random(N), m = random(N, 0.01f), v = random(N, 0.01f);
  for (auto& x : v) x = std::fabs(x);
  std::vector<uint16_t> g16(N), out16(N);
  F g_exact(N);
  const F g = random(N);
  for (int64_t i = 0; i < N; ++i) {
    g16[i] = kernels::float_to_bf16(g[i]);
    g_exact[i] = kernels::bf16_to_float(g16[i]);
  }
  D p64 = widen(master), m64 = widen(m), v64 = widen(v);
  const D g64 = widen(g_exact);
  F p32 = master, m32 = m, v32 = v;  // the fp32-gradient path on the same values
  kernels::AdamWStep step;
  step.learning_rate = 1e-3f;
  step.weight_decay = 0.1f;
  step.grad_scale = 0.5f;
  for (int64_t t = 1; t <= 3; ++t) {
    step.t = t;
    cpu::adamw_update_mixed(master.data(), nullptr, g16.data(), m.data(), v.data(), out16.data(),
                            N, step);
    cpu::adamw_update_mixed(p32.data(), g_exact.data(), nullptr, m32.data(), v32.data(), nullptr,
                            N, step);
    ref::adamw_update(p64.data(), g64.data(), m64.data(), v64.data(), N, step);
  }
  expect_close(master, p64, "master");
  expect_close(m, m64, "m");
  expect_close(v, v64, "v");
  expect_close(p32, p64, "master from fp32 gradients");
  for (int64_t i = 0; i < N; ++i) {
    // Correct rounding, checked independently: out16 is one of the two bf16 neighbours of the
    // master value, and the nearer one.
    const float x = master[i];
    const float got = kernels::bf16_to_float(out16[i]);
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    bits &= 0xffff0000u;
    float below, above;
    std::memcpy(&below, &bits, 4);
    bits += 0x10000u;
    std::memcpy(&above, &bits, 4);
    if (x < 0) std::swap(below, above);
    ASSERT_TRUE(got == below || got == above) << i << ": " << x << " → " << got;
    EXPECT_LE(std::fabs(got - x), std::fabs((got == below ? above : below) - x)) << i;
  }
  EXPECT_TRUE(std::isnan(kernels::bf16_to_float(kernels::float_to_bf16(NAN))));
  EXPECT_EQ(kernels::bf16_to_float(kernels::float_to_bf16(1.0f)), 1.0f);
}

TEST_F(Kernels, FastExpAndTanhAreAccurate) {
  std::uniform_real_distribution<float> wide(-80.0f, 80.0f), narrow(-6.0f, 6.0f);
  double worst_exp = 0, worst_tanh = 0;
  for (int i = 0; i < 200000; ++i) {
    const float x = i % 2 ? wide(rng_) : narrow(rng_);
    const double e = std::exp(static_cast<double>(x));
    worst_exp = std::max(worst_exp, std::fabs(cpu::fast_exp(x) - e) / e);
    worst_tanh =
        std::max(worst_tanh, std::fabs(cpu::fast_tanh(x) - std::tanh(static_cast<double>(x))));
  }
  EXPECT_LT(worst_exp, 5e-7) << "seed " << seed_;
  EXPECT_LT(worst_tanh, 1e-6) << "seed " << seed_;
  EXPECT_EQ(cpu::fast_tanh(50.0f), 1.0f);
  EXPECT_EQ(cpu::fast_tanh(-50.0f), -1.0f);
  EXPECT_LT(cpu::fast_exp(-200.0f), 1e-37f);
}

TEST_F(Kernels, ReferenceFloat32AgreesWithFloat64) {
  // The reference loops themselves, in float32, against their float64 run.
  const int64_t BT = 16, C = 64, OC = 80;
  F inp = random(BT * C), w = random(OC * C, 0.1f);
  F out(BT * OC);
  D out64(BT * OC);
  ref::matmul_forward(out.data(), inp.data(), w.data(), static_cast<const float*>(nullptr), BT, C,
                      OC);
  ref::matmul_forward(out64.data(), widen(inp).data(), widen(w).data(),
                      static_cast<const double*>(nullptr), BT, C, OC);
  expect_close(out, out64, "reference matmul in float32");
}

}  // namespace
}  // namespace kt

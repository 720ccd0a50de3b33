// The CUDA kernels against the float64 run of kernels/reference.h on fresh random inputs (outputs
// poisoned with NaN first, so an unwritten element fails), and the CUDA device's allocators and
// streams. Error measure and tolerances: test_support.h.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tests/gpu/gpu_tests.h"
#include "tests/gpu/test_support.h"

namespace kt::gpu_test {
namespace {

void test_matmul(const gpu::Context& ctx) {
  const int64_t BT = 77, C = 96, OC = 130;
  for (bool with_bias : {true, false}) {
    F inp = random(BT * C), w = random(OC * C, 0.1f), bias = random(OC), dout = random(BT * OC);
    F dinp0 = random(BT * C), dw0 = random(OC * C), db0 = random(OC);
    DeviceArray<float> d_inp(inp), d_w(w), d_bias(bias), d_dout(dout), d_out(BT * OC);
    DeviceArray<float> d_dinp(dinp0), d_dw(dw0), d_db(db0);
    gpu::matmul_forward(ctx, d_out, d_inp, d_w, with_bias ? d_bias.get() : nullptr, BT, C, OC);
    gpu::matmul_backward(ctx, d_dinp, d_dw, with_bias ? d_db.get() : nullptr, d_dout, d_inp, d_w,
                         BT, C, OC, /*accumulate_dweight=*/with_bias);
    D out(BT * OC), dinp = widen(dinp0), dw = widen(dw0), db = widen(db0), b64 = widen(bias);
    ref::matmul_forward<double>(out.data(), widen(inp).data(), widen(w).data(),
                                with_bias ? b64.data() : nullptr, BT, C, OC);
    ref::matmul_backward<double>(dinp.data(), dw.data(), with_bias ? db.data() : nullptr,
                                 widen(dout).data(), widen(inp).data(), widen(w).data(), BT, C, OC,
                                 with_bias);
    const std::string tag = with_bias ? " (bias, accumulate)" : " (no bias, overwrite dW)";
    expect_close(d_out.floats(), out, 2e-5, "matmul_forward fp32" + tag);
    expect_close(d_dinp.floats(), dinp, 2e-5, "matmul_backward fp32 dinp" + tag);
    expect_close(d_dw.floats(), dw, 2e-5, "matmul_backward fp32 dweight" + tag);
    if (with_bias) expect_close(d_db.floats(), db, 2e-5, "matmul_backward fp32 dbias");
  }
  // bf16: operands rounded to bf16 on the host so the reference sees the same inputs.
  const int64_t BT2 = 256, C2 = 192, OC2 = 136;  // multiples of 8 (bf16 GEMM alignment)
  F inp = round_bf16(random(BT2 * C2)), w = round_bf16(random(OC2 * C2, 0.1f));
  F bias = round_bf16(random(OC2)), dout = round_bf16(random(BT2 * OC2));
  F dinp0 = round_bf16(random(BT2 * C2)), dw0 = random(OC2 * C2), db0 = random(OC2);
  DeviceArray<bf16> d_inp(inp), d_w(w), d_bias(bias), d_dout(dout), d_out(BT2 * OC2), d_dinp(dinp0);
  DeviceArray<float> d_dw(dw0), d_db(db0);
  gpu::matmul_forward_bf16(ctx, d_out, d_inp, d_w, d_bias, BT2, C2, OC2);
  gpu::matmul_backward_bf16(ctx, d_dinp, d_dw, d_db, d_dout, d_inp, d_w, BT2, C2, OC2, true);
  D out(BT2 * OC2), dinp = widen(dinp0), dw = widen(dw0), db = widen(db0);
  ref::matmul_forward<double>(out.data(), widen(inp).data(), widen(w).data(), widen(bias).data(),
                              BT2, C2, OC2);
  ref::matmul_backward<double>(dinp.data(), dw.data(), db.data(), widen(dout).data(),
                               widen(inp).data(), widen(w).data(), BT2, C2, OC2, true);
  expect_close(d_out.floats(), out, 1e-2, "matmul_forward bf16 (fused bias)");
  expect_close(d_dinp.floats(), dinp, 1e-2, "matmul_backward bf16 dinp");
  expect_close(d_dw.floats(), dw, 1e-4, "matmul_backward bf16 dweight (fp32)");
  expect_close(d_db.floats(), db, 1e-4, "matmul_backward bf16 dbias (fp32)");

  // Overwriting dinp and dweight: their old contents are NaN (poisoned) and must not be read.
  DeviceArray<bf16> o_dinp(BT2 * C2);
  DeviceArray<float> o_dw(OC2 * C2);
  gpu::matmul_backward_bf16(ctx, o_dinp, o_dw, nullptr, d_dout, d_inp, d_w, BT2, C2, OC2,
                            /*accumulate_dweight=*/false, /*accumulate_dinp=*/false);
  D odinp(BT2 * C2, 0.0), odw(OC2 * C2, 0.0);
  ref::matmul_backward<double>(odinp.data(), odw.data(), nullptr, widen(dout).data(),
                               widen(inp).data(), widen(w).data(), BT2, C2, OC2, false);
  expect_close(o_dinp.floats(), odinp, 1e-2, "matmul_backward bf16 dinp overwritten");
  expect_close(o_dw.floats(), odw, 1e-4, "matmul_backward bf16 dweight overwritten");
}

void test_layernorm(const gpu::Context& ctx) {
  for (int64_t C : {int64_t{96}, int64_t{769}}) {
    const int64_t BT = 53;
    F inp = random(BT * C, 2.0f), w = random(C), b = random(C), dout = random(BT * C);
    for (auto& x : inp) x += 3.0f;  // a non-zero mean
    F dinp0 = random(BT * C), dw0 = random(C), db0 = random(C);
    DeviceArray<float> d_inp(inp), d_w(w), d_b(b), d_out(BT * C), d_mean(BT), d_rstd(BT),
        d_dout(dout), d_dinp(dinp0), d_dw(dw0), d_db(db0);
    gpu::layernorm_forward(ctx, d_out, d_mean, d_rstd, d_inp, d_w, d_b, BT, C);
    gpu::layernorm_backward(ctx, d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_mean, d_rstd, BT, C);
    D out(BT * C), mean(BT), rstd(BT), dinp = widen(dinp0), dw = widen(dw0), db = widen(db0);
    ref::layernorm_forward<double>(out.data(), mean.data(), rstd.data(), widen(inp).data(),
                                   widen(w).data(), widen(b).data(), BT, C);
    ref::layernorm_backward<double>(dinp.data(), dw.data(), db.data(), widen(dout).data(),
                                    widen(inp).data(), widen(w).data(), mean.data(), rstd.data(),
                                    BT, C);
    const std::string tag = " C=" + std::to_string(C);
    expect_close(d_out.floats(), out, 2e-5, "layernorm_forward out" + tag);
    expect_close(d_mean.floats(), mean, 2e-5, "layernorm_forward mean" + tag);
    expect_close(d_rstd.floats(), rstd, 2e-5, "layernorm_forward rstd" + tag);
    expect_close(d_dinp.floats(), dinp, 2e-5, "layernorm_backward dinp" + tag);
    expect_close(d_dw.floats(), dw, 2e-5, "layernorm_backward dweight" + tag);
    expect_close(d_db.floats(), db, 2e-5, "layernorm_backward dbias" + tag);
  }
}

void test_elementwise(const gpu::Context& ctx) {
  const int64_t N = 100003;
  F x = random(N, 2.0f), y = random(N), dout = random(N), d0 = random(N), d1 = random(N);
  DeviceArray<float> d_x(x), d_y(y), d_out(N), d_dout(dout), d_da(d0), d_db(d1);
  gpu::gelu_forward(ctx, d_out, d_x, N);
  D out(N), dinp = widen(d0);
  ref::gelu_forward<double>(out.data(), widen(x).data(), N);
  expect_close(d_out.floats(), out, 2e-5, "gelu_forward");
  gpu::gelu_backward(ctx, d_da, d_x, d_dout, N);
  ref::gelu_backward<double>(dinp.data(), widen(x).data(), widen(dout).data(), N);
  expect_close(d_da.floats(), dinp, 2e-5, "gelu_backward");

  d_da.upload(d0);
  gpu::residual_forward(ctx, d_out, d_x, d_y, N);
  gpu::residual_backward(ctx, d_da, d_db, d_dout, N);
  D r(N), ra = widen(d0), rb = widen(d1);
  ref::residual_forward<double>(r.data(), widen(x).data(), widen(y).data(), N);
  ref::residual_backward<double>(ra.data(), rb.data(), widen(dout).data(), N);
  expect_close(d_out.floats(), r, 1e-7, "residual_forward");
  expect_close(d_da.floats(), ra, 1e-7, "residual_backward da");
  expect_close(d_db.floats(), rb, 1e-7, "residual_backward db");

  // sum of squares: double accumulation, so near-exact
  DeviceArray<double> d_sum(1);
  d_sum.zero();
  gpu::sum_of_squares(ctx, d_sum, d_x, N);
  const double want = ref::sum_of_squares(x.data(), N);
  const double got = d_sum.raw()[0];
  check(std::abs(got - want) <= 1e-12 * want,
        "sum_of_squares " + std::to_string(got) + " vs " + std::to_string(want));

  // casts: round-to-nearest-even bit for bit, and back exactly
  F c = random(N, 100.0f);
  c[0] = 1.00390625f;  // exactly halfway between two bf16 values: ties to even (1.0)
  c[1] = 1.01171875f;  // halfway, rounds up to the even 1.015625
  DeviceArray<float> d_c(c), d_back(N);
  DeviceArray<bf16> d_c16(N);
  gpu::cast_to_bf16(ctx, d_c16, d_c, N);
  gpu::cast_to_float(ctx, d_back, d_c16, N);
  const auto bits = d_c16.raw();
  const F back = d_back.floats();
  int64_t mismatched = 0;
  for (int64_t i = 0; i < N; ++i)
    mismatched += bits[i].bits != to_bf16_bits(c[i]) || back[i] != from_bf16_bits(bits[i].bits);
  check(mismatched == 0, "cast_to_bf16/cast_to_float: " + std::to_string(mismatched) +
                             " elements differ from round-to-nearest-even");
  if (mismatched == 0) std::printf("ok    %-44s bit-exact\n", "cast_to_bf16 / cast_to_float");
}

void test_embedding(const gpu::Context& ctx) {
  const int64_t B = 3, T = 29, C = 80, V = 13;  // few tokens: rows of dwte repeat
  auto tokens = random_tokens(B * T, V);
  F wte = random(V * C), wpe = random(T * C), dout = random(B * T * C);
  F dwte0 = random(V * C), dwpe0 = random(T * C);
  DeviceArray<int32_t> d_tokens(tokens);
  DeviceArray<float> d_wte(wte), d_wpe(wpe), d_out(B * T * C), d_dout(dout), d_dwte(dwte0),
      d_dwpe(dwpe0);
  gpu::embedding_forward(ctx, d_out, d_tokens, d_wte, d_wpe, B, T, C);
  gpu::embedding_backward(ctx, d_dwte, d_dwpe, d_dout, d_tokens, B, T, C);
  D out(B * T * C), dwte = widen(dwte0), dwpe = widen(dwpe0);
  ref::embedding_forward<double>(out.data(), tokens.data(), widen(wte).data(), widen(wpe).data(), B,
                                 T, C);
  ref::embedding_backward<double>(dwte.data(), dwpe.data(), widen(dout).data(), tokens.data(), B, T,
                                  C);
  expect_close(d_out.floats(), out, 1e-7, "embedding_forward");
  expect_close(d_dwte.floats(), dwte, 2e-6, "embedding_backward dwte (repeated tokens)");
  expect_close(d_dwpe.floats(), dwpe, 2e-6, "embedding_backward dwpe");

  // bf16 tables, output and output gradient; fp32 parameter gradients.
  const F wte16 = round_bf16(wte), wpe16 = round_bf16(wpe), dout16 = round_bf16(dout);
  DeviceArray<bf16> b_wte(wte16), b_wpe(wpe16), b_out(B * T * C), b_dout(dout16);
  DeviceArray<float> b_dwte(dwte0), b_dwpe(dwpe0);
  gpu::embedding_forward(ctx, b_out, d_tokens, b_wte, b_wpe, B, T, C);
  gpu::embedding_backward(ctx, b_dwte, b_dwpe, b_dout, d_tokens, B, T, C);
  D out16(B * T * C), dwte16 = widen(dwte0), dwpe16 = widen(dwpe0);
  ref::embedding_forward<double>(out16.data(), tokens.data(), widen(wte16).data(),
                                 widen(wpe16).data(), B, T, C);
  ref::embedding_backward<double>(dwte16.data(), dwpe16.data(), widen(dout16).data(),
                                  tokens.data(), B, T, C);
  expect_close(b_out.floats(), out16, 1e-2, "embedding_forward bf16");
  expect_close(b_dwte.floats(), dwte16, 2e-6, "embedding_backward dwte from bf16 dout");
  expect_close(b_dwpe.floats(), dwpe16, 2e-6, "embedding_backward dwpe from bf16 dout");
}

void test_attention(const gpu::Context& ctx) {
  struct Case {
    int64_t B, T, C, NH;
  };
  for (Case k : {Case{2, 67, 96, 3}, Case{1, 300, 128, 2}}) {
    const int64_t B = k.B, T = k.T, C = k.C, NH = k.NH;
    F inp = random(B * T * 3 * C), dout = random(B * T * C), dinp0 = random(B * T * 3 * C);
    DeviceArray<float> d_inp(inp), d_out(B * T * C), d_pre(B * NH * T * T), d_att(B * NH * T * T),
        d_dout(dout), d_dinp(dinp0), d_dpre(B * NH * T * T), d_datt(B * NH * T * T);
    gpu::attention_forward(ctx, d_out, d_pre, d_att, d_inp, B, T, C, NH);
    gpu::attention_backward(ctx, d_dinp, d_dpre, d_datt, d_dout, d_inp, d_att, B, T, C, NH);
    D out(B * T * C), pre(B * NH * T * T), att(B * NH * T * T), dinp = widen(dinp0);
    D dpre(B * NH * T * T, 0.0), datt(B * NH * T * T, 0.0);
    ref::attention_forward<double>(out.data(), pre.data(), att.data(), widen(inp).data(), B, T, C,
                                   NH);
    ref::attention_backward<double>(dinp.data(), dpre.data(), datt.data(), widen(dout).data(),
                                    widen(inp).data(), att.data(), B, T, C, NH);
    const std::string tag = " T=" + std::to_string(T) + " hs=" + std::to_string(C / NH);
    expect_close(d_out.floats(), out, 2e-5, "attention_forward out" + tag);
    expect_close(d_pre.floats(), pre, 2e-5, "attention_forward preatt" + tag);
    expect_close(d_att.floats(), att, 2e-5, "attention_forward att" + tag);
    expect_close(d_dinp.floats(), dinp, 2e-5, "attention_backward dinp" + tag);
    expect_close(d_datt.floats(), datt, 2e-5, "attention_backward datt" + tag);
    expect_close(d_dpre.floats(), dpre, 2e-5, "attention_backward dpreatt" + tag);
  }
}

// The flash-style bf16 attention against the float64 reference on the same bf16-rounded inputs:
// out (bf16), lse (fp32, from the reference's scores), dqkv (bf16, overwritten: its poison must
// go), at head sizes 32/64/128 and T not a multiple of the 64-row tile (and T = 1). A second
// backward must give bit-identical dqkv (no atomics). An unsupported head size must throw.
void test_flash_attention(const gpu::Context& ctx) {
  struct Case {
    int64_t B, T, C, NH;
  };
  for (Case k : {Case{2, 67, 128, 2}, Case{1, 300, 192, 3}, Case{2, 1, 128, 2}, Case{1, 128, 64, 1},
                 Case{2, 100, 96, 3}, Case{1, 130, 256, 2}}) {
    const int64_t B = k.B, T = k.T, C = k.C, NH = k.NH, hs = C / NH;
    const std::string tag = " B=" + std::to_string(B) + " NH=" + std::to_string(NH) +
                            " T=" + std::to_string(T) + " hs=" + std::to_string(hs);
    check(gpu::flash_attention_supported(hs),
          "flash_attention_supported(" + std::to_string(hs) + ")");
    const F qkv = round_bf16(random(B * T * 3 * C)), dout = round_bf16(random(B * T * C));
    DeviceArray<bf16> d_qkv(qkv), d_out(B * T * C), d_dout(dout), d_dqkv(B * T * 3 * C);
    DeviceArray<float> d_lse(B * NH * T);
    DeviceArray<unsigned char> d_scratch(gpu::attention_backward_bf16_scratch_bytes(B, T, C, NH));
    gpu::attention_forward_bf16(ctx, d_out, d_lse, d_qkv, B, T, C, NH);
    gpu::attention_backward_bf16(ctx, d_dqkv, d_scratch, d_dout, d_qkv, d_out, d_lse, B, T, C, NH);
    const auto first = d_dqkv.raw();
    d_dqkv.poison();
    gpu::attention_backward_bf16(ctx, d_dqkv, d_scratch, d_dout, d_qkv, d_out, d_lse, B, T, C, NH);
    const auto second = d_dqkv.raw();
    check(std::memcmp(first.data(), second.data(), first.size() * sizeof(bf16)) == 0,
          "attention_backward_bf16 bit-identical on a second run" + tag);

    D out(B * T * C), pre(B * NH * T * T), att(B * NH * T * T), dinp(B * T * 3 * C, 0.0);
    D dpre(B * NH * T * T, 0.0), datt(B * NH * T * T, 0.0), lse(B * NH * T);
    ref::attention_forward<double>(out.data(), pre.data(), att.data(), widen(qkv).data(), B, T, C,
                                   NH);
    ref::attention_backward<double>(dinp.data(), dpre.data(), datt.data(), widen(dout).data(),
                                    widen(qkv).data(), att.data(), B, T, C, NH);
    for (int64_t row = 0; row < B * NH * T; ++row) {  // lse = log Σ_{t2 ≤ t} exp(preatt)
      const int64_t t = row % T;
      const double* scores = pre.data() + row * T;
      const double max = *std::max_element(scores, scores + t + 1);
      double sum = 0;
      for (int64_t t2 = 0; t2 <= t; ++t2) sum += std::exp(scores[t2] - max);
      lse[row] = max + std::log(sum);
    }
    expect_close(d_out.floats(), out, 1e-2, "attention_forward_bf16 out" + tag);
    expect_close(d_lse.floats(), lse, 1e-4, "attention_forward_bf16 lse (fp32)" + tag);
    expect_close(d_dqkv.floats(), dinp, 2e-2, "attention_backward_bf16 dqkv" + tag);
  }
  bool threw = false;
  try {
    DeviceArray<bf16> qkv(3 * 48), out(48);
    DeviceArray<float> lse(1);
    gpu::attention_forward_bf16(ctx, out, lse, qkv, 1, 1, 48, 1);  // hs 48
  } catch (const Error&) {
    threw = true;
  }
  check(threw && !gpu::flash_attention_supported(48), "attention_forward_bf16 rejects hs 48");
}

void test_cross_entropy(const gpu::Context& ctx) {
  const int64_t BT = 37, V = 1000, Vp = 1024;
  const float dloss = 1.0f / BT;
  F logits = random(BT * Vp, 3.0f);
  auto targets = random_tokens(BT, static_cast<int32_t>(V));
  DeviceArray<float> d_logits(logits), d_losses(BT), d_dlogits(BT * Vp);
  DeviceArray<int32_t> d_targets(targets);
  gpu::softmax_cross_entropy(ctx, d_losses, d_dlogits, d_logits, d_targets, BT, V, Vp, dloss);
  D losses(BT), dlogits(BT * Vp);
  ref::softmax_cross_entropy<double>(losses.data(), dlogits.data(), widen(logits).data(),
                                     targets.data(), BT, V, Vp, dloss);
  expect_close(d_losses.floats(), losses, 2e-5, "softmax_cross_entropy losses");
  expect_close(d_dlogits.floats(), dlogits, 2e-5, "softmax_cross_entropy dlogits");
  // In place: dlogits aliasing logits gives the same result.
  gpu::softmax_cross_entropy(ctx, d_losses, d_logits, d_logits, d_targets, BT, V, Vp, dloss);
  expect_close(d_logits.floats(), dlogits, 2e-5, "softmax_cross_entropy dlogits in place");
  expect_close(d_losses.floats(), losses, 2e-5, "softmax_cross_entropy losses in place");
}

// Tensor parallelism's vocabulary split, emulated here with t = 2 "ranks" on one device and the
// all-reduces done on the host: the embedding's rows summed over the ranks must be the whole
// table's embedding, each rank's dwte its rows of the whole dwte; the three cross-entropy steps
// must give softmax_cross_entropy's losses and dlogits (the float64 reference) — with a
// vocabulary whose padding falls on the last rank (V < Vp) and targets on both ranks.
void test_vocab_parallel(const gpu::Context& ctx) {
  const int64_t t = 2;
  {
    const int64_t B = 3, T = 29, C = 80, Vp = 16, Vl = Vp / t;
    auto tokens = random_tokens(B * T, static_cast<int32_t>(Vp));
    const F wte = round_bf16(random(Vp * C)), wpe = round_bf16(random(T * C)),
            dout = round_bf16(random(B * T * C));
    D out(B * T * C), dwte(Vp * C, 0.0), dwpe(T * C, 0.0);
    ref::embedding_forward<double>(out.data(), tokens.data(), widen(wte).data(), widen(wpe).data(),
                                   B, T, C);
    ref::embedding_backward<double>(dwte.data(), dwpe.data(), widen(dout).data(), tokens.data(),
                                    B, T, C);
    DeviceArray<int32_t> d_tokens(tokens);
    DeviceArray<bf16> d_wpe(wpe), d_dout(dout);
    F summed(B * T * C, 0.0f), dwte_got;
    bool dwpe_ok = true;
    for (int64_t r = 0; r < t; ++r) {
      DeviceArray<bf16> d_wte(F(wte.begin() + r * Vl * C, wte.begin() + (r + 1) * Vl * C));
      DeviceArray<bf16> d_out(B * T * C);
      DeviceArray<float> d_dwte(Vl * C), d_dwpe(T * C);
      d_dwte.zero();
      d_dwpe.zero();
      gpu::embedding_forward_rows(ctx, d_out, d_tokens, d_wte, r == 0 ? d_wpe.get() : nullptr, B,
                                  T, C, r * Vl, Vl);
      gpu::embedding_backward_rows(ctx, d_dwte, d_dwpe, d_dout, d_tokens, B, T, C, r * Vl, Vl);
      const F part = d_out.floats(), rows = d_dwte.floats();
      for (size_t i = 0; i < part.size(); ++i) summed[i] += part[i];
      dwte_got.insert(dwte_got.end(), rows.begin(), rows.end());
      const F pos = d_dwpe.floats();
      double err = 0, ref_norm = 0;
      for (size_t i = 0; i < pos.size(); ++i) {
        err += (pos[i] - dwpe[i]) * (pos[i] - dwpe[i]);
        ref_norm += dwpe[i] * dwpe[i];
      }
      dwpe_ok = dwpe_ok && std::sqrt(err / ref_norm) < 2e-6;
    }
    expect_close(summed, out, 1e-2, "embedding_forward_rows summed over 2 ranks (bf16)");
    expect_close(dwte_got, dwte, 2e-6, "embedding_backward_rows dwte rows of 2 ranks");
    check(dwpe_ok, "embedding_backward_rows dwpe on every rank");
  }
  {
    const int64_t BT = 37, V = 1000, Vp = 1024, Vl = Vp / t;
    const float dloss = 1.0f / BT;
    const F logits = round_bf16(random(BT * Vp, 3.0f));
    auto targets = random_tokens(BT, static_cast<int32_t>(V));
    D losses(BT), dlogits(BT * Vp);
    ref::softmax_cross_entropy<double>(losses.data(), dlogits.data(), widen(logits).data(),
                                       targets.data(), BT, V, Vp, dloss);
    DeviceArray<int32_t> d_targets(targets);
    std::vector<std::unique_ptr<DeviceArray<bf16>>> parts;
    std::vector<std::unique_ptr<DeviceArray<float>>> maxes, sums, rank_losses;
    for (int64_t r = 0; r < t; ++r) {
      F slice(BT * Vl);
      for (int64_t i = 0; i < BT; ++i)
        std::copy(logits.begin() + i * Vp + r * Vl, logits.begin() + i * Vp + (r + 1) * Vl,
                  slice.begin() + i * Vl);
      parts.push_back(std::make_unique<DeviceArray<bf16>>(slice));
      maxes.push_back(std::make_unique<DeviceArray<float>>(BT));
      sums.push_back(std::make_unique<DeviceArray<float>>(2 * BT));
      rank_losses.push_back(std::make_unique<DeviceArray<float>>(BT));
    }
    auto valid = [&](int64_t r) { return std::max<int64_t>(0, std::min(Vl, V - r * Vl)); };
    F all_max(BT, -3.4e38f), all_sums(2 * BT, 0.0f);
    for (int64_t r = 0; r < t; ++r) {
      gpu::vocab_parallel_ce_max(ctx, *maxes[r], *parts[r], BT, valid(r), Vl);
      const F m = maxes[r]->floats();
      for (int64_t i = 0; i < BT; ++i) all_max[i] = std::max(all_max[i], m[i]);
    }
    for (int64_t r = 0; r < t; ++r) {
      maxes[r]->upload(all_max);
      gpu::vocab_parallel_ce_sums(ctx, *sums[r], *parts[r], *maxes[r], d_targets, BT, r * Vl,
                                  valid(r), Vl);
      const F part = sums[r]->floats();
      for (int64_t i = 0; i < 2 * BT; ++i) all_sums[i] += part[i];
    }
    F got_dlogits(BT * Vp);
    bool losses_agree = true;
    F first_losses;
    for (int64_t r = 0; r < t; ++r) {
      sums[r]->upload(all_sums);
      gpu::vocab_parallel_ce_finish(ctx, *rank_losses[r], *parts[r], *parts[r], *maxes[r],
                                    *sums[r], d_targets, BT, r * Vl, valid(r), Vl, dloss);
      const F l = rank_losses[r]->floats(), d = parts[r]->floats();
      if (r == 0) first_losses = l;
      losses_agree = losses_agree && l == first_losses;
      for (int64_t i = 0; i < BT; ++i)
        std::copy(d.begin() + i * Vl, d.begin() + (i + 1) * Vl, got_dlogits.begin() + i * Vp + r * Vl);
    }
    expect_close(first_losses, losses, 1e-5, "vocab-parallel cross-entropy losses (2 ranks)");
    expect_close(got_dlogits, dlogits, 1e-2, "vocab-parallel cross-entropy dlogits (bf16, in place)");
    check(losses_agree, "vocab-parallel cross-entropy: the ranks' losses differ");
  }
}

// bf16 storage versions: inputs rounded to bf16 on the host, so the float64 reference sees the
// same values; bf16 results within 1e-2, fp32 results (statistics, parameter gradients, losses)
// within 1e-4.
void test_bf16_storage(const gpu::Context& ctx) {
  {
    const int64_t BT = 45, C = 320;
    F inp = random(BT * C, 2.0f);
    for (auto& x : inp) x += 1.5f;
    inp = round_bf16(inp);
    F w = round_bf16(random(C)), b = round_bf16(random(C)), dout = round_bf16(random(BT * C));
    F dinp0 = round_bf16(random(BT * C)), dw0 = random(C), db0 = random(C);
    DeviceArray<bf16> d_inp(inp), d_w(w), d_b(b), d_out(BT * C), d_dout(dout), d_dinp(dinp0);
    DeviceArray<float> d_mean(BT), d_rstd(BT), d_dw(dw0), d_db(db0);
    gpu::layernorm_forward(ctx, d_out, d_mean, d_rstd, d_inp, d_w, d_b, BT, C);
    gpu::layernorm_backward(ctx, d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_mean, d_rstd, BT, C);
    D out(BT * C), mean(BT), rstd(BT), dinp = widen(dinp0), dw = widen(dw0), db = widen(db0);
    ref::layernorm_forward<double>(out.data(), mean.data(), rstd.data(), widen(inp).data(),
                                   widen(w).data(), widen(b).data(), BT, C);
    ref::layernorm_backward<double>(dinp.data(), dw.data(), db.data(), widen(dout).data(),
                                    widen(inp).data(), widen(w).data(), mean.data(), rstd.data(),
                                    BT, C);
    expect_close(d_out.floats(), out, 1e-2, "layernorm_forward bf16 out");
    expect_close(d_mean.floats(), mean, 1e-4, "layernorm_forward bf16 mean (fp32)");
    expect_close(d_rstd.floats(), rstd, 1e-4, "layernorm_forward bf16 rstd (fp32)");
    expect_close(d_dinp.floats(), dinp, 1e-2, "layernorm_backward bf16 dinp");
    expect_close(d_dw.floats(), dw, 1e-4, "layernorm_backward bf16 dweight (fp32)");
    expect_close(d_db.floats(), db, 1e-4, "layernorm_backward bf16 dbias (fp32)");
  }
  {
    const int64_t N = 70001;
    F x = round_bf16(random(N, 2.0f)), y = round_bf16(random(N)), dout = round_bf16(random(N));
    F d0 = round_bf16(random(N)), d1 = round_bf16(random(N));
    DeviceArray<bf16> d_x(x), d_y(y), d_out(N), d_dout(dout), d_da(d0), d_db(d1);
    gpu::gelu_forward(ctx, d_out, d_x, N);
    D out(N), dinp = widen(d0);
    ref::gelu_forward<double>(out.data(), widen(x).data(), N);
    expect_close(d_out.floats(), out, 1e-2, "gelu_forward bf16");
    gpu::gelu_backward(ctx, d_da, d_x, d_dout, N);
    ref::gelu_backward<double>(dinp.data(), widen(x).data(), widen(dout).data(), N);
    expect_close(d_da.floats(), dinp, 1e-2, "gelu_backward bf16");
    // Overwrite, in place: dout's buffer becomes dinp.
    DeviceArray<bf16> d_inplace(dout);
    gpu::gelu_backward(ctx, d_inplace, d_x, d_inplace, N, /*accumulate=*/false);
    D fresh(N, 0.0);
    ref::gelu_backward<double>(fresh.data(), widen(x).data(), widen(dout).data(), N);
    expect_close(d_inplace.floats(), fresh, 1e-2, "gelu_backward bf16 in place, overwriting");
    d_da.upload(d0);
    gpu::residual_forward(ctx, d_out, d_x, d_y, N);
    gpu::residual_backward(ctx, d_da, d_db, d_dout, N);
    D r(N), ra = widen(d0), rb = widen(d1);
    ref::residual_forward<double>(r.data(), widen(x).data(), widen(y).data(), N);
    ref::residual_backward<double>(ra.data(), rb.data(), widen(dout).data(), N);
    expect_close(d_out.floats(), r, 1e-2, "residual_forward bf16");
    expect_close(d_da.floats(), ra, 1e-2, "residual_backward bf16 da");
    expect_close(d_db.floats(), rb, 1e-2, "residual_backward bf16 db");
  }
  {
    const int64_t BT = 29, V = 777, Vp = 784;
    const float dloss = 1.0f / BT;
    F logits = round_bf16(random(BT * Vp, 3.0f));
    auto targets = random_tokens(BT, static_cast<int32_t>(V));
    DeviceArray<bf16> d_logits(logits), d_dlogits(BT * Vp);
    DeviceArray<float> d_losses(BT);
    DeviceArray<int32_t> d_targets(targets);
    gpu::softmax_cross_entropy(ctx, d_losses, d_dlogits, d_logits, d_targets, BT, V, Vp, dloss);
    D losses(BT), dlogits(BT * Vp);
    ref::softmax_cross_entropy<double>(losses.data(), dlogits.data(), widen(logits).data(),
                                       targets.data(), BT, V, Vp, dloss);
    expect_close(d_losses.floats(), losses, 1e-4, "softmax_cross_entropy bf16 losses (fp32)");
    expect_close(d_dlogits.floats(), dlogits, 1e-2, "softmax_cross_entropy bf16 dlogits");
  }
}

void test_adamw(const gpu::Context& ctx) {
  AdamWStep step;
  step.learning_rate = 1e-3f;
  step.weight_decay = 0.1f;
  step.t = 7;
  step.grad_scale = 0.5f;
  // 30 tensors (more than one launch group), sizes across the chunk boundary.
  std::vector<int64_t> sizes;
  for (int i = 0; i < 30; ++i) sizes.push_back(1 + (i * 7919) % 3000 + (i % 5 == 0 ? 70000 : 0));
  std::vector<F> p, g, m, v;
  std::vector<std::unique_ptr<DeviceArray<float>>> dp, dg, dm, dv;
  std::vector<std::unique_ptr<DeviceArray<bf16>>> d16;
  std::vector<gpu::AdamWTensor> list;
  for (int64_t n : sizes) {
    p.push_back(random(n));
    g.push_back(random(n));
    m.push_back(random(n, 0.1f));
    F vv = random(n, 0.1f);
    for (auto& x : vv) x = x * x;
    v.push_back(vv);
    dp.push_back(std::make_unique<DeviceArray<float>>(p.back()));
    dg.push_back(std::make_unique<DeviceArray<float>>(g.back()));
    dm.push_back(std::make_unique<DeviceArray<float>>(m.back()));
    dv.push_back(std::make_unique<DeviceArray<float>>(v.back()));
    d16.push_back(std::make_unique<DeviceArray<bf16>>(n));
    list.push_back({*dp.back(), *dg.back(), *dm.back(), *dv.back(),
                    list.size() % 2 == 0 ? d16.back()->get() : nullptr, n});
  }
  gpu::adamw_update_multi(ctx, list.data(), static_cast<int>(list.size()), step);
  double worst = 0;
  int64_t bf16_mismatch = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    D pp = widen(p[i]), mm = widen(m[i]), vv = widen(v[i]);
    ref::adamw_update<double>(pp.data(), widen(g[i]).data(), mm.data(), vv.data(), sizes[i], step);
    const F got = dp[i]->floats();
    worst = std::max({worst, rel_error(got, pp), rel_error(dm[i]->floats(), mm),
                      rel_error(dv[i]->floats(), vv)});
    if (i % 2 == 0) {
      const auto b = d16[i]->raw();
      for (int64_t j = 0; j < sizes[i]; ++j) bf16_mismatch += b[j].bits != to_bf16_bits(got[j]);
    }
  }
  check(worst < 2e-6, "adamw_update_multi: rel err " + std::to_string(worst));
  if (worst < 2e-6)
    std::printf("ok    %-44s rel err %.2e (tol 2e-06)\n", "adamw_update_multi (30 tensors)", worst);
  check(bf16_mismatch == 0, "adamw_update_multi: bf16 copies differ from the fp32 params in " +
                                std::to_string(bf16_mismatch) + " elements");
  // single-tensor entry point
  const int64_t N = 5000;
  F p1 = random(N), g1 = random(N), m1(N, 0.0f), v1(N, 0.0f);
  DeviceArray<float> a(p1), b(g1), c(m1), d(v1);
  gpu::adamw_update(ctx, a, b, c, d, N, step);
  D pp = widen(p1), mm(N, 0.0), vv(N, 0.0);
  ref::adamw_update<double>(pp.data(), widen(g1).data(), mm.data(), vv.data(), N, step);
  expect_close(a.floats(), pp, 2e-6, "adamw_update");
}

// The caching allocator on the real device: after a warm-up, a repeated allocation pattern makes
// no cudaMalloc; pinned memory round-trips through the h2d/d2h streams ordered by events.
void test_device() {
  const auto before = g_device->device_memory_stats();
  auto step = [] {
    std::vector<void*> held;
    for (size_t bytes : {size_t{3} << 20, size_t{4096}, size_t{12} << 20, size_t{7} << 20})
      held.push_back(g_device->allocate(bytes, MemoryKind::kActivations));
    for (void* p : held) g_device->deallocate(p);
  };
  step();
  const size_t warm = g_device->device_memory_stats().raw_allocations;
  for (int i = 0; i < 10; ++i) step();
  const auto after = g_device->device_memory_stats();
  check(after.raw_allocations == warm, "allocator: cudaMalloc after warm-up");
  check(after.raw_allocations > before.raw_allocations, "allocator: the pattern allocated at all");
  check(after.in_use_total == before.in_use_total, "allocator: bytes in use returned");

  const size_t n = size_t{1} << 22;
  float* host_in = static_cast<float*>(g_device->allocate_pinned(n * 4, MemoryKind::kParams));
  float* host_out = static_cast<float*>(g_device->allocate_pinned(n * 4, MemoryKind::kParams));
  for (size_t i = 0; i < n; ++i) host_in[i] = static_cast<float>(i) * 0.5f;
  std::memset(host_out, 0xff, n * 4);
  void* dev = g_device->allocate(n * 4, MemoryKind::kParams);
  auto& h2d = g_device->stream(worker::StreamRole::kHostToDevice);
  auto& d2h = g_device->stream(worker::StreamRole::kDeviceToHost);
  worker::CudaEvent landed;
  g_device->copy(dev, host_in, n * 4, h2d);
  h2d.record(landed);
  d2h.wait(landed);
  g_device->copy(host_out, dev, n * 4, d2h);
  d2h.synchronize();
  check(std::memcmp(host_in, host_out, n * 4) == 0, "pinned H2D → D2H round trip on two streams");
  check(g_device->pinned_memory_stats().in_use_bytes[MemoryKind::kParams] >= 2 * n * 4,
        "pinned memory stats by kind");
  g_device->deallocate(dev);
  g_device->deallocate_pinned(host_in);
  g_device->deallocate_pinned(host_out);
  std::printf("ok    %-44s\n", "CUDA device: allocator reuse, pinned copies");
}

}  // namespace

void run_kernel_tests(const gpu::Context& ctx) {
  test_device();  // first: its raw-allocation counts assume an empty large pool
  test_matmul(ctx);
  test_layernorm(ctx);
  test_elementwise(ctx);
  test_embedding(ctx);
  test_attention(ctx);
  test_flash_attention(ctx);
  test_cross_entropy(ctx);
  test_vocab_parallel(ctx);
  test_bf16_storage(ctx);
  test_adamw(ctx);
}

}  // namespace kt::gpu_test

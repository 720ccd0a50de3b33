// GPU tests and the device-check timing table. Without arguments: every CUDA kernel against the
// float64 run of kernels/reference.h on fresh random inputs (outputs poisoned with NaN first, so
// an unwritten element fails), and the CUDA device's allocators and streams. `--bench`: kernel
// times at GPT-2 124M shapes against measured ceilings (bf16 GEMM, copies). Exit status 0 only if
// every check passed; with no usable GPU it says so and exits 2 (never counted as a pass).
//
// Error measure (METHOD.md): ‖got − ref64‖ / ‖ref64‖. Tolerances: fp32 kernels 2e-5; bf16
// results 1e-2 (one bf16 rounding is 2^-9 relative); fp32 results of bf16 operands 1e-4.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/ops.h"
#include "kernels/reference.h"
#include "worker/cuda_device.h"
#include "worker/cuda_gpt.h"
#include "worker/gradient_reducer.h"
#ifdef KUBETRAIN_WITH_NCCL
#include "worker/comm_nccl.h"
#endif
#ifdef KT_CUDA_EMULATED
#include "tests/emulation/stream_order.h"
#endif

namespace kt {
namespace {

namespace ref = kernels::reference;
namespace gpu = kernels::cuda;
using gpu::bf16;
using kernels::AdamWStep;
using worker::CudaDevice;
using worker::MemoryKind;
using F = std::vector<float>;
using D = std::vector<double>;

int g_checks = 0, g_failures = 0;
unsigned g_seed = 0;

void check(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok) {
    ++g_failures;
    std::printf("FAIL  %s (seed %u)\n", what.c_str(), g_seed);
  }
}

template <class T>
double rel_error(const std::vector<T>& got, const D& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]);
    num += (g - want[i]) * (g - want[i]);
    den += want[i] * want[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

void expect_close(const F& got, const D& want, double tol, const std::string& what) {
  const double err = rel_error(got, want);
  const bool ok = err < tol;  // NaN fails
  if (ok) std::printf("ok    %-44s rel err %.2e (tol %.0e)\n", what.c_str(), err, tol);
  check(ok, what + ": rel err " + std::to_string(err) + " ≥ " + std::to_string(tol));
}

// ---- host-side bf16 (round to nearest even), independent of CUDA's conversion ---------------
uint16_t to_bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16_bits(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
F round_bf16(const F& x) {
  F out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = from_bf16_bits(to_bf16_bits(x[i]));
  return out;
}

// ---- device arrays from the CUDA device's caching allocator ---------------------------------
CudaDevice* g_device = nullptr;

template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    ptr_ = static_cast<T*>(
        g_device->allocate(std::max<size_t>(1, n) * sizeof(T), MemoryKind::kWorkspace));
    poison();
  }
  template <class U>
  explicit DeviceArray(const std::vector<U>& host) : DeviceArray(host.size()) {
    upload(host);
  }
  ~DeviceArray() { g_device->deallocate(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return ptr_; }
  operator T*() const { return ptr_; }
  // The kernels run on the device's non-blocking compute stream, which does not wait for the
  // legacy default stream that cudaMemset/cudaMemcpy use: every fill ends with a device sync.
  void poison() {  // 0xff bytes: NaN in fp32 and bf16
    KT_CUDA_CHECK(cudaMemset(ptr_, 0xff, n_ * sizeof(T)));
    KT_CUDA_CHECK(cudaDeviceSynchronize());
  }
  void zero() {
    KT_CUDA_CHECK(cudaMemset(ptr_, 0, n_ * sizeof(T)));
    KT_CUDA_CHECK(cudaDeviceSynchronize());
  }
  void upload(const std::vector<T>& host) {
    KT_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
    KT_CUDA_CHECK(cudaDeviceSynchronize());
  }
  void upload(const F& host) requires std::is_same_v<T, bf16> {
    std::vector<bf16> b(host.size());
    for (size_t i = 0; i < host.size(); ++i) b[i].bits = to_bf16_bits(host[i]);
    upload(b);
  }
  std::vector<T> raw() const {
    std::vector<T> host(n_);
    KT_CUDA_CHECK(cudaDeviceSynchronize());
    KT_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  F floats() const {
    if constexpr (std::is_same_v<T, bf16>) {
      F out(n_);
      const auto b = raw();
      for (size_t i = 0; i < n_; ++i) out[i] = from_bf16_bits(b[i].bits);
      return out;
    } else {
      return raw();
    }
  }

 private:
  T* ptr_;
  size_t n_;
};

std::mt19937 g_rng;
F random(size_t n, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  F out(n);
  for (auto& x : out) x = dist(g_rng);
  return out;
}
std::vector<int32_t> random_tokens(size_t n, int32_t vocab) {
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  std::vector<int32_t> out(n);
  for (auto& x : out) x = dist(g_rng);
  return out;
}
D widen(const F& x) {
  return D(x.begin(), x.end());
}

// ---- kernel tests ------------------------------------------------------------------------------
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

// A tiny GPT trained in bf16 on one fixed batch (next-token targets of a random sequence): the
// first loss must be ln V (weights N(0, 0.02) give near-uniform logits) and 100 AdamW steps (lr
// 5e-3) must memorise the batch (loss below 0.6·ln V). A wrong gradient anywhere in the composed
// step (sign, layout, a missing accumulation) stops the loss from falling that far.

// ---- benchmark ---------------------------------------------------------------------------------
// Median milliseconds of `fn` over `reps` runs after 2 warm-up runs, timed with CUDA events.
double time_ms(cudaStream_t stream, int reps, const std::function<void()>& fn) {
  cudaEvent_t start, stop;
  KT_CUDA_CHECK(cudaEventCreate(&start));
  KT_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 2; ++i) fn();
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    KT_CUDA_CHECK(cudaEventRecord(start, stream));
    fn();
    KT_CUDA_CHECK(cudaEventRecord(stop, stream));
    KT_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    KT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

struct Row {
  std::string name;
  double ms, amount;  // amount: bytes or FLOPs
  bool flops;
};

void bench(const gpu::Context& ctx) {
  cudaStream_t s = ctx.stream();
  std::vector<Row> rows;
  // Random device data (never zeros) without drawing billions of host samples: a pool of 2^24
  // normal floats, scaled and tiled.
  const F pool = random(size_t{1} << 24);
  auto fill = [&](DeviceArray<float>& arr, size_t n, float scale) {
    F chunk(pool.size());
    for (size_t i = 0; i < pool.size(); ++i) chunk[i] = pool[i] * scale;
    for (size_t at = 0; at < n; at += chunk.size())
      KT_CUDA_CHECK(cudaMemcpy(arr.get() + at, chunk.data(),
                               std::min(chunk.size(), n - at) * sizeof(float),
                               cudaMemcpyHostToDevice));
    KT_CUDA_CHECK(cudaDeviceSynchronize());
  };
  auto fill16 = [&](DeviceArray<bf16>& arr, size_t n, float scale) {
    std::vector<bf16> chunk(pool.size());
    for (size_t i = 0; i < pool.size(); ++i) chunk[i].bits = to_bf16_bits(pool[i] * scale);
    for (size_t at = 0; at < n; at += chunk.size())
      KT_CUDA_CHECK(cudaMemcpy(arr.get() + at, chunk.data(),
                               std::min(chunk.size(), n - at) * sizeof(bf16),
                               cudaMemcpyHostToDevice));
    KT_CUDA_CHECK(cudaDeviceSynchronize());
  };
  // Ceilings: D2D copy, pinned H2D/D2H, bf16 and fp32 GEMM.
  const size_t copy_bytes = size_t{1} << 30;
  void* a = g_device->allocate(copy_bytes, MemoryKind::kWorkspace);
  void* b = g_device->allocate(copy_bytes, MemoryKind::kWorkspace);
  KT_CUDA_CHECK(cudaMemset(a, 1, copy_bytes));
  KT_CUDA_CHECK(cudaDeviceSynchronize());
  rows.push_back(
      {"ceiling: D2D copy 1 GiB",
       time_ms(
           s, 10,
           [&] { KT_CUDA_CHECK(cudaMemcpyAsync(b, a, copy_bytes, cudaMemcpyDeviceToDevice, s)); }),
       2.0 * copy_bytes, false});
  const size_t pin_bytes = size_t{256} << 20;
  void* host = g_device->allocate_pinned(pin_bytes, MemoryKind::kWorkspace);
  std::memset(host, 1, pin_bytes);
  rows.push_back(
      {"ceiling: H2D pinned 256 MiB",
       time_ms(
           s, 10,
           [&] { KT_CUDA_CHECK(cudaMemcpyAsync(a, host, pin_bytes, cudaMemcpyHostToDevice, s)); }),
       1.0 * pin_bytes, false});
  rows.push_back(
      {"ceiling: D2H pinned 256 MiB",
       time_ms(
           s, 10,
           [&] { KT_CUDA_CHECK(cudaMemcpyAsync(host, a, pin_bytes, cudaMemcpyDeviceToHost, s)); }),
       1.0 * pin_bytes, false});
  g_device->deallocate_pinned(host);
  g_device->deallocate(a);
  g_device->deallocate(b);
  {
    const int64_t M = 8192;
    DeviceArray<bf16> x(M * M), w(M * M), y(M * M);
    fill16(x, M * M, 1.0f);
    fill16(w, M * M, 0.01f);
    rows.push_back(
        {"ceiling: bf16 GEMM 8192³ (cuBLASLt)",
         time_ms(s, 10, [&] { gpu::matmul_forward_bf16(ctx, y, x, w, nullptr, M, M, M); }),
         2.0 * M * M * M, true});
    const int64_t M2 = 4096;
    DeviceArray<float> xf(M2 * M2), wf(M2 * M2), yf(M2 * M2);
    fill(xf, M2 * M2, 1.0f);
    fill(wf, M2 * M2, 0.01f);
    rows.push_back(
        {"fp32 GEMM 4096³ (no TF32)",
         time_ms(s, 5, [&] { gpu::matmul_forward(ctx, yf, xf, wf, nullptr, M2, M2, M2); }),
         2.0 * M2 * M2 * M2, true});
  }
  // GPT-2 124M shapes, micro-batch 16 × 1024.
  const int64_t B = 16, T = 1024, C = 768, NH = 12, Vp = 50304, V = 50257, BT = B * T;
  {
    DeviceArray<bf16> x(BT * C), w(3 * C * C), bias(3 * C), y(BT * 3 * C), dy(BT * 3 * C),
        dx(BT * C);
    DeviceArray<float> dw(3 * C * C), db(3 * C);
    fill16(x, BT * C, 1.0f);
    fill16(w, 3 * C * C, 0.02f);
    fill16(bias, 3 * C, 1.0f);
    fill16(dy, BT * 3 * C, 1.0f);
    fill16(dx, BT * C, 1.0f);
    rows.push_back(
        {"matmul_forward_bf16 QKV 16384×768→2304 +bias",
         time_ms(s, 20, [&] { gpu::matmul_forward_bf16(ctx, y, x, w, bias, BT, C, 3 * C); }),
         2.0 * BT * C * 3 * C, true});
    rows.push_back(
        {"matmul_backward_bf16 QKV",
         time_ms(s, 20,
                 [&] { gpu::matmul_backward_bf16(ctx, dx, dw, db, dy, x, w, BT, C, 3 * C, true); }),
         4.0 * BT * C * 3 * C, true});
  }
  {
    DeviceArray<float> x(BT * C), y(BT * C), w(C), bb(C), mean(BT), rstd(BT), dy(BT * C),
        dx(BT * C), dw(C), db(C);
    fill(x, BT * C, 1.0f);
    fill(w, C, 1.0f);
    fill(bb, C, 1.0f);
    fill(dy, BT * C, 1.0f);
    fill(dx, BT * C, 1.0f);
    fill(dw, C, 1.0f);
    fill(db, C, 1.0f);
    rows.push_back(
        {"layernorm_forward 16384×768",
         time_ms(s, 20, [&] { gpu::layernorm_forward(ctx, y, mean, rstd, x, w, bb, BT, C); }),
         2.0 * BT * C * 4, false});
    rows.push_back(
        {"layernorm_backward",
         time_ms(s, 20,
                 [&] { gpu::layernorm_backward(ctx, dx, dw, db, dy, x, w, mean, rstd, BT, C); }),
         4.0 * BT * C * 4, false});
    rows.push_back({"residual_forward",
                    time_ms(s, 20, [&] { gpu::residual_forward(ctx, y, x, dy, BT * C); }),
                    3.0 * BT * C * 4, false});
  }
  {
    const int64_t N = BT * 4 * C;
    DeviceArray<float> x(N), y(N), dy(N);
    fill(x, N, 1.0f);
    fill(dy, N, 1.0f);
    rows.push_back({"gelu_forward 16384×3072",
                    time_ms(s, 20, [&] { gpu::gelu_forward(ctx, y, x, N); }), 2.0 * N * 4, false});
    y.zero();
    rows.push_back({"gelu_backward", time_ms(s, 20, [&] { gpu::gelu_backward(ctx, y, x, dy, N); }),
                    4.0 * N * 4, false});
  }
  {
    const int64_t att = B * NH * T * T;
    DeviceArray<float> qkv(BT * 3 * C), out(BT * C), pre(att), a(att), dout(BT * C),
        dqkv(BT * 3 * C), dpre(att), datt(att);
    fill(qkv, BT * 3 * C, 1.0f);
    fill(dout, BT * C, 1.0f);
    fill(dqkv, BT * 3 * C, 1.0f);
    const double flops = 4.0 * B * NH * T * T / 2 * (C / NH);  // causal: half the T² pairs
    rows.push_back(
        {"attention_forward B16 NH12 T1024 (fp32)",
         time_ms(s, 3, [&] { gpu::attention_forward(ctx, out, pre, a, qkv, B, T, C, NH); }), flops,
         true});
    rows.push_back(
        {"attention_backward",
         time_ms(
             s, 3,
             [&] { gpu::attention_backward(ctx, dqkv, dpre, datt, dout, qkv, a, B, T, C, NH); }),
         2.0 * flops, true});
  }
  {
    // The same shape and FLOP convention in bf16 (flash: no T×T matrix): forward counts the two
    // causal products QKᵀ and PV, backward twice that (recomputed products not counted).
    const int64_t hs = C / NH;
    DeviceArray<bf16> qkv(BT * 3 * C), out(BT * C), dout(BT * C), dqkv(BT * 3 * C);
    DeviceArray<float> lse(B * NH * T);
    DeviceArray<unsigned char> scratch(gpu::attention_backward_bf16_scratch_bytes(B, T, C, NH));
    fill16(qkv, BT * 3 * C, 1.0f);
    fill16(dout, BT * C, 1.0f);
    const double flops = 4.0 * B * NH * T * T / 2 * hs;  // causal: half the T² pairs
    rows.push_back(
        {"attention_forward_bf16 flash B16 NH12 T1024",
         time_ms(s, 20, [&] { gpu::attention_forward_bf16(ctx, out, lse, qkv, B, T, C, NH); }),
         flops, true});
    rows.push_back({"attention_backward_bf16 flash",
                    time_ms(s, 20,
                            [&] {
                              gpu::attention_backward_bf16(ctx, dqkv, scratch, dout, qkv, out, lse,
                                                           B, T, C, NH);
                            }),
                    2.0 * flops, true});
  }
  {
    DeviceArray<float> logits(BT * Vp), losses(BT);
    fill(logits, BT * Vp, 2.0f);
    DeviceArray<int32_t> targets(random_tokens(BT, static_cast<int32_t>(V)));
    DeviceArray<float> dlogits(BT * Vp);
    rows.push_back({"softmax_cross_entropy 16384×50304",
                    time_ms(s, 10,
                            [&] {
                              gpu::softmax_cross_entropy(ctx, losses, dlogits, logits, targets, BT,
                                                         V, Vp, 1.0f / BT);
                            }),
                    2.0 * BT * Vp * 4, false});
  }
  {
    const int64_t P = 124475904;  // GPT-2 124M (DESIGN.md §6)
    DeviceArray<float> p(P), g(P), m(P), v(P);
    DeviceArray<bf16> p16(P);
    fill(p, P, 1.0f);
    fill(g, P, 1.0f);
    fill(m, P, 0.1f);
    fill(v, P, 0.1f);
    const gpu::AdamWTensor t{p, g, m, v, p16, P};
    AdamWStep step;
    rows.push_back({"adamw_update_multi 124M params (+bf16 copy)",
                    time_ms(s, 10, [&] { gpu::adamw_update_multi(ctx, &t, 1, step); }), P * 30.0,
                    false});  // read p g m v, write p m v (28 B) + bf16 p (2 B)
  }
  double copy_gbs = 0, gemm_tflops = 0;
  for (const Row& r : rows) {
    if (r.name.rfind("ceiling: D2D", 0) == 0) copy_gbs = r.amount / r.ms / 1e6;
    if (r.name.rfind("ceiling: bf16 GEMM", 0) == 0) gemm_tflops = r.amount / r.ms / 1e9;
  }
  std::printf("\n%-46s %10s %14s %10s\n", "kernel / ceiling", "ms", "achieved", "of ceiling");
  for (const Row& r : rows) {
    const double rate = r.flops ? r.amount / r.ms / 1e9 : r.amount / r.ms / 1e6;
    const double ceiling = r.flops ? gemm_tflops : copy_gbs;
    const bool is_ceiling = r.name.rfind("ceiling:", 0) == 0;
    char pct[32] = "";
    if (!is_ceiling && ceiling > 0) std::snprintf(pct, sizeof pct, "%.1f%%", 100 * rate / ceiling);
    std::printf("%-46s %10.3f %9.1f %-4s %10s\n", r.name.c_str(), r.ms, rate,
                r.flops ? "TF/s" : "GB/s", pct);
  }
  std::printf(
      "(rates: bytes moved = each input read once + each output written once; GEMM and "
      "attention in FLOP. Percentages against the D2D copy and the bf16 GEMM ceilings.)\n");
  std::printf(
      "GPT-2 124M training: `gpu_tests --gpt-bench` (the CUDA model the worker runs).\n");
}

// GPT-2 124M (seq 1024, bf16 activations, fp32 master/AdamW) training step time on the harness,
// for the largest micro-batch of 64, 32, 16, 8 that fits. MFU counts model FLOPs
// 6·N·tokens + 12·L·C·T·tokens (the PERFORMANCE.md convention) against 989.4 TFLOP/s, the
// H100/H200 SXM dense bf16 datasheet peak.
// ---- the CUDA model (worker/cuda_gpt.h) ---------------------------------------------------------
using worker::CudaGpt;
using worker::CudaGptOptions;
using worker::GptConfig;

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

// maxT V Vp L NH C F; head size 32: the flash attention path (test_cuda_gpt_memorises covers
// the materialised one, head size 16).
const GptConfig kSmallGpt{32, 91, 96, 2, 2, 64, 256};

// A sequence and its next-token targets (B·T each) drawn from a vocabulary of V.
std::pair<std::vector<int32_t>, std::vector<int32_t>> random_batch(int64_t BT, int64_t V) {
  const auto sequence = random_tokens(BT + 1, static_cast<int32_t>(V));
  return {std::vector<int32_t>(sequence.begin(), sequence.end() - 1),
          std::vector<int32_t>(sequence.begin() + 1, sequence.end())};
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
    worker::ActivationRecompute recompute;
    int64_t layers = 2;  // 4: more streamed layers than slots and checkpoint buffers (reuse)
  };
  for (const Variant v : {Variant{1, 1, worker::ActivationRecompute::kFull},
                          Variant{1, 2, worker::ActivationRecompute::kFull},
                          Variant{2, 1, worker::ActivationRecompute::kFull},
                          Variant{1, 1, worker::ActivationRecompute::kCommAware},
                          Variant{2, 2, worker::ActivationRecompute::kCommAware, 4},
                          Variant{1, 1, worker::ActivationRecompute::kFull, 4}}) {
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
        (v.recompute == worker::ActivationRecompute::kFull ? ", full)" : ", commAware)");
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

// ---- data parallelism (worker/gradient_reducer.h) -------------------------------------------------

// A group of ranks that are threads of this process: each collective meets at a barrier, then
// every rank reads the others' buffers (sums in rank order, so every rank gets the same bits).
// Stands in for Gloo, which the GPU-only build does not have; the host reducer sees only the
// Communicator interface.
class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), buffers_(static_cast<size_t>(size)) {}
  int size() const { return size_; }

  class Rank : public worker::Communicator {
   public:
    Rank(ThreadGroup& group, int rank) : group_(group), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return group_.size_; }
    const std::string& name() const override { return name_; }
    std::shared_ptr<worker::CommWork> allreduce_async(float* data, size_t count,
                                                      worker::ReduceOp op) override {
      group_.publish(rank_, data);
      std::vector<float> out(count);
      for (size_t i = 0; i < count; ++i) {
        float acc = group_.buffers_[0][i];
        for (int r = 1; r < group_.size_; ++r) {
          const float x = group_.buffers_[static_cast<size_t>(r)][i];
          acc = op == worker::ReduceOp::kSum ? acc + x : std::max(acc, x);
        }
        out[i] = acc;
      }
      group_.arrive();  // everyone has read every buffer
      std::copy(out.begin(), out.end(), data);
      ++stats_.allreduces;
      stats_.bytes += static_cast<int64_t>(count * 4);
      return std::make_shared<Done>();
    }
    void allgather(const float* in, float* out, size_t count) override {
      group_.publish(rank_, const_cast<float*>(in));
      for (int r = 0; r < group_.size_; ++r)
        std::copy(group_.buffers_[static_cast<size_t>(r)],
                  group_.buffers_[static_cast<size_t>(r)] + count, out + r * count);
      group_.arrive();
    }
    void reduce_scatter(const float*, float*, size_t) override {
      throw Error("ThreadGroup: reduce_scatter is not used by these tests");
    }
    void broadcast(float* data, size_t count, int root) override {
      group_.publish(rank_, data);
      std::vector<float> value(group_.buffers_[static_cast<size_t>(root)],
                               group_.buffers_[static_cast<size_t>(root)] + count);
      group_.arrive();
      std::copy(value.begin(), value.end(), data);
    }
    void barrier() override { group_.arrive(); }
    worker::CommStats stats() const override { return stats_; }

   private:
    struct Done : worker::CommWork {
      void wait() override {}
    };
    ThreadGroup& group_;
    int rank_;
    std::string name_ = "dp";
    worker::CommStats stats_;
  };

 private:
  void publish(int rank, float* data) {
    buffers_[static_cast<size_t>(rank)] = data;
    arrive();
  }
  void arrive() {  // a reusable barrier; throws once a rank has failed (no one waits forever)
    std::unique_lock lock(mutex_);
    if (aborted_) throw Error("ThreadGroup: another rank failed");
    const int64_t generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      changed_.notify_all();
    } else {
      changed_.wait(lock, [&] { return generation_ != generation || aborted_; });
      if (aborted_) throw Error("ThreadGroup: another rank failed");
    }
  }

 public:
  void abort() {
    std::lock_guard lock(mutex_);
    aborted_ = true;
    changed_.notify_all();
  }

 private:
  bool aborted_ = false;
  int size_;
  std::vector<float*> buffers_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int arrived_ = 0;
  int64_t generation_ = 0;
};

// One run of `steps` AdamW steps (clipped at norm 1) on the given batches (token pairs of B·T),
// returning every loss, the gradients of step 1 and the weights after the last step.
struct DpRun {
  std::vector<double> losses;
  F grads1, weights;
};
// `tp_group`: with tensor parallelism, the group over which the sharded tensors' squares are
// summed for the global norm (as the trainer does).
DpRun train_steps(CudaDevice& device, const GptConfig& c, int64_t B, int64_t T,
                  const CudaGptOptions& options, float loss_scale, int64_t steps,
                  const std::function<std::pair<std::vector<int32_t>, std::vector<int32_t>>(
                      int64_t step)>& batch_of,
                  worker::Communicator* tp_group = nullptr) {
  DpRun r;
  CudaGpt gpt(device, c, B, T, options);
  gpt.init_weights(g_seed);
  for (int64_t s = 0; s < steps; ++s) {
    const auto [tok, tgt] = batch_of(s);
    gpt.zero_grad();
    gpt.train_micro_step(tok.data(), tgt.data(), loss_scale, true);
    r.losses.push_back(gpt.mean_loss());
    double sharded = 0, replicated = 0;
    gpt.grad_sums_of_squares(&sharded, &replicated);
    float sharded32 = static_cast<float>(sharded);
    if (tp_group) tp_group->allreduce(&sharded32, 1);
    const double norm = std::sqrt(static_cast<double>(sharded32) + replicated);
    if (s == 0) {
      r.grads1.resize(gpt.num_parameters());
      gpt.get_gradients(r.grads1.data());
    }
    AdamWStep adam;
    adam.learning_rate = 2e-3f;
    adam.t = s + 1;
    adam.grad_scale = norm > 1.0 ? static_cast<float>(1.0 / norm) : 1.0f;
    gpt.update(adam, 0.1f);
  }
  r.weights.resize(gpt.num_parameters());
  gpt.get_parameters(r.weights.data());
  return r;
}

// Runs `n` ranks of an in-process group on threads, each with its own CudaDevice on the test's
// GPU: rank_run(r, device, comm) trains rank r. The first exception of any rank lands in `error`.
std::vector<DpRun> run_ranks(
    int n, const std::function<DpRun(int, CudaDevice&, worker::Communicator&)>& rank_run,
    std::string* error) {
  ThreadGroup group(n);
  std::vector<DpRun> ranks(static_cast<size_t>(n));
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        CudaDevice device((g_device->ordinal() + r) % CudaDevice::device_count());
        ThreadGroup::Rank comm(group, r);
        ranks[r] = rank_run(r, device, comm);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        group.abort();  // the other ranks' next collective fails instead of waiting forever
      }
    });
  for (auto& thread : threads) thread.join();
  for (const std::string& e : errors)  // the failure itself, not the others' aborts
    if (!e.empty() && (error->empty() || error->find("another rank failed") != std::string::npos))
      *error = e;
  return ranks;
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
    auto run = [&](worker::ActivationRecompute mode, double* activation_bytes) {
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
    const DpRun none = run(worker::ActivationRecompute::kNone, &none_bytes);
    for (auto mode : {worker::ActivationRecompute::kFull, worker::ActivationRecompute::kCommAware}) {
      const bool full = mode == worker::ActivationRecompute::kFull;
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

// Two data-parallel ranks on one GPU (threads, each with its own CudaDevice and model), summing
// through the host reducer, each on half of every batch with loss scale 1/2, against one rank on
// the whole batch: step-1 gradients within 2e-2 (bf16 activations: cuBLASLt may pick other
// kernels for the other shape, so roundings differ as between two bf16 runs; a missing sum is off
// by 1/2, a missing 1/dp by 2×), the 3 losses within 5e-3 — and the two replicas bit-identical (a
// replica that drifted would train a different model). With gpuUnits 1 too (the offloaded units'
// copies must take the sums).
// The collectives the multi-rank tests run over: the host (Gloo's role, here an in-process group)
// always; NCCL where two ranks can use it — under emulation (tests/emulation/fake_nccl.cpp), or
// on a machine with 2+ GPUs and libnccl (NCCL refuses two ranks on one GPU).
std::vector<std::string> rank_backends() {
  std::vector<std::string> backends{"host"};
#ifdef KUBETRAIN_WITH_NCCL
  std::string why;
  const bool loads = worker::nccl_available(&why);
#ifdef KT_CUDA_EMULATED
  const bool two_gpus = true;  // the emulated NCCL joins ranks that share the emulated GPU
#else
  const bool two_gpus = CudaDevice::device_count() >= 2;
  if (loads && !two_gpus) why = "needs 2 GPUs, this machine has 1";
#endif
  if (loads && two_gpus) backends.emplace_back("nccl");
  static bool said = false;  // once per run, not once per test
  if (!said && !why.empty())
    std::printf("NOT RUN  the NCCL variants of the 2-rank tests: %s\n", why.c_str());
  said = true;
#endif
  return backends;
}

// `serialize_on`: NCCL's sums on that stream (as the trainer does when TP is on NCCL too).
std::unique_ptr<worker::GradientReducer> make_reducer(
    const std::string& backend, worker::Communicator& comm, CudaDevice& device,
    [[maybe_unused]] worker::CudaStream* serialize_on = nullptr) {
#ifdef KUBETRAIN_WITH_NCCL
  if (backend == "nccl")
    return worker::make_nccl_gradient_reducer(comm, device.ordinal(), serialize_on);
#endif
  return worker::make_host_gradient_reducer(comm, device);
}

std::unique_ptr<worker::StreamCollectives> make_stream_collectives(const std::string& backend,
                                                                   worker::Communicator& comm,
                                                                   CudaDevice& device) {
#ifdef KUBETRAIN_WITH_NCCL
  if (backend == "nccl") return worker::make_nccl_stream_collectives(comm, device.ordinal());
#endif
  return worker::make_host_stream_collectives(comm, device);
}

void test_cuda_gpt_data_parallel() {
  const GptConfig c = kSmallGpt;
  const int64_t B = 2, T = 32, steps = 3, dp = 2;
  std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> batches;
  for (int64_t s = 0; s < steps; ++s) batches.push_back(random_batch(dp * B * T, c.vocab));
  const DpRun whole = train_steps(*g_device, c, dp * B, T, CudaGptOptions{}, 1.0f, steps,
                                  [&](int64_t s) { return batches[s]; });
  CudaGptOptions recompute_options;
  recompute_options.recompute = worker::ActivationRecompute::kFull;
  const DpRun whole_recompute = train_steps(*g_device, c, dp * B, T, recompute_options, 1.0f,
                                            steps, [&](int64_t s) { return batches[s]; });
  // Everything on the device; offload: optimizer at gpuUnits 1; window offload (gpuUnits 1, one
  // slot, recompute full: the sums taken in the slot).
  for (const std::string& backend : rank_backends()) {
    for (int64_t device_units : {int64_t{-1}, int64_t{1}, int64_t{0}}) {
      const bool window = device_units == 0;
      const std::string tag = " [" + backend + "]" +
                              (device_units < 0 ? ""
                               : window         ? " (window 1)"
                                                : " (gpuUnits 1)");
      const DpRun& one = window ? whole_recompute : whole;
      std::string error;
      const auto ranks = run_ranks(
          static_cast<int>(dp),
          [&](int r, CudaDevice& device, worker::Communicator& comm) {
            auto reducer = make_reducer(backend, comm, device);
            CudaGptOptions options;
            options.reducer = reducer.get();
            options.device_units = window ? 1 : device_units;
            options.window = window ? 1 : 0;
            if (window) options.recompute = worker::ActivationRecompute::kFull;
            options.cpu_threads = 1;
            return train_steps(device, c, B, T, options, 1.0f / dp, steps, [&](int64_t s) {
              const auto& [tok, tgt] = batches[s];
              const int64_t n = B * T;
              return std::make_pair(
                  std::vector<int32_t>(tok.begin() + r * n, tok.begin() + (r + 1) * n),
                  std::vector<int32_t>(tgt.begin() + r * n, tgt.begin() + (r + 1) * n));
            });
          },
          &error);
      if (!error.empty()) {
        check(false, "data parallel" + tag + ": " + error);
        continue;
      }
      expect_close(ranks[0].grads1, widen(one.grads1), 2e-2,
                   "data parallel 2 ranks: step-1 summed gradients vs one rank" + tag);
      double worst = 0;
      for (int64_t s = 0; s < steps; ++s) {
        const double mean = (ranks[0].losses[s] + ranks[1].losses[s]) / 2;
        worst = std::max(worst, std::abs(mean - one.losses[s]) / one.losses[s]);
      }
      const bool identical =
          ranks[0].weights == ranks[1].weights && ranks[0].grads1 == ranks[1].grads1;
      check(worst < 5e-3, "data parallel" + tag + ": mean loss differs from one rank's by " +
                              std::to_string(worst));
      check(identical, "data parallel" + tag + ": the two replicas' gradients or weights differ");
      if (worst < 5e-3 && identical)
        std::printf("ok    %-44s losses worst rel diff %.1e (tol 5e-03), replicas bit-identical\n",
                    ("data parallel, 2 ranks" + tag).c_str(), worst);
    }
  }
}

// Two TP ranks' runs against `whole`, TP 1 on the same batches: their step-1 gradients, put
// together in the whole model's layout, within 3e-2 of it; the replicated tensors' gradients and
// final weights bit-identical on both ranks. True when both identities hold.
bool check_tp_ranks(const GptConfig& c, const DpRun& rank0, const DpRun& rank1, const DpRun& whole,
                    const std::string& tag) {
  const int tp = 2;
  F assembled(whole.grads1.size(), std::nanf(""));
  F grads[2] = {rank0.grads1, rank1.grads1};  // (views are over mutable data)
  bool replicated_same = true;
  for (int r = 0; r < tp; ++r) {
    const auto views = worker::gpt_rank_views(c, tp, r, grads[r].data());
    const auto other = worker::gpt_rank_views(c, tp, 1 - r, grads[1 - r].data());
    const auto whole_views = worker::gpt_whole_views(c, assembled.data());
    for (int i = 0; i < worker::kNumParamTensors; ++i) {
      if (views[i].logical_shape.empty()) {
        std::copy(views[i].data, views[i].data + views[i].numel(), whole_views[i].data);
        replicated_same = replicated_same && std::equal(views[i].data,
                                                        views[i].data + views[i].numel(),
                                                        other[i].data);
      } else {
        worker::gpt_paste_slice(views[i], whole_views[i].data);
      }
    }
  }
  expect_close(assembled, widen(whole.grads1), 3e-2, tag + ": step-1 gradients vs TP 1");
  check(replicated_same, tag + ": replicated tensors' gradients differ between the ranks");
  F weights[2] = {rank0.weights, rank1.weights};
  bool weights_same = true;
  const auto w0 = worker::gpt_rank_views(c, tp, 0, weights[0].data());
  const auto w1 = worker::gpt_rank_views(c, tp, 1, weights[1].data());
  for (int i = 0; i < worker::kNumParamTensors; ++i)
    if (w0[i].logical_shape.empty())
      weights_same =
          weights_same && std::equal(w0[i].data, w0[i].data + w0[i].numel(), w1[i].data);
  check(weights_same, tag + ": replicated weights differ between the ranks after 3 steps");
  return replicated_same && weights_same;
}

// Tensor parallelism on one GPU: 2 TP ranks (threads, each its own CudaDevice and model, the
// all-reduces through the host collectives over an in-process group) against TP 1 on the same
// batches: losses within 5e-3 and step-1 gradients (the ranks' slices put together) within 3e-2
// (partial products are rounded to bf16 before their sum, so activations round differently than
// at TP 1); the replicated tensors' gradients and final weights bit-identical on both ranks (they
// are computed from the same summed activations). Also with recompute full and offload gpuUnits 1,
// and with the Oases schedule (2 sub-batches: each lane's all-reduces behind events on the TP
// stream while the other lane computes), alone and with commAware recompute.
void test_cuda_gpt_tensor_parallel() {
  const GptConfig c = kSmallGpt;  // NH 2: one head per rank; Vp 96: 48 rows each, V 91
  const int64_t B = 2, T = 32, steps = 3, tp = 2;
  std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> batches;
  for (int64_t s = 0; s < steps; ++s) batches.push_back(random_batch(B * T, c.vocab));
  auto batch_of = [&](int64_t s) { return batches[s]; };
  const DpRun whole = train_steps(*g_device, c, B, T, CudaGptOptions{}, 1.0f, steps, batch_of);
  struct Variant {
    const char* tag;
    int64_t device_units;
    worker::ActivationRecompute recompute;
    int sub_batches;
    int64_t window = 0;
  };
  for (const std::string& backend : rank_backends()) {
    for (const Variant v :
         {Variant{"", -1, worker::ActivationRecompute::kNone, 1},
          Variant{" (recompute full, gpuUnits 1)", 1, worker::ActivationRecompute::kFull, 1},
          Variant{" (Oases: 2 sub-batches)", -1, worker::ActivationRecompute::kNone, 2},
          Variant{" (2 sub-batches, commAware)", -1, worker::ActivationRecompute::kCommAware, 2},
          Variant{" (2 sub-batches, full, window 1)", 1, worker::ActivationRecompute::kFull, 2,
                  1}}) {
      const std::string tag = "tensor parallel, 2 ranks [" + backend + "]" + v.tag;
      std::string error;
      auto ranks = run_ranks(
          static_cast<int>(tp),
          [&](int, CudaDevice& device, worker::Communicator& comm) {
            auto collectives = make_stream_collectives(backend, comm, device);
            CudaGptOptions options;
            options.tp = collectives.get();
            options.device_units = v.device_units;
            options.recompute = v.recompute;
            options.sub_batches = v.sub_batches;
            options.window = v.window;
            options.cpu_threads = 1;
            return train_steps(device, c, B, T, options, 1.0f, steps, batch_of, &comm);
          },
          &error);
      if (!error.empty()) {
        check(false, tag + ": " + error);
        continue;
      }
      double worst = 0;
      for (int64_t s = 0; s < steps; ++s)
        worst = std::max(worst, std::abs(ranks[0].losses[s] - whole.losses[s]) / whole.losses[s]);
      check(worst < 5e-3, tag + ": losses differ from TP 1 by " + std::to_string(worst));
      check(ranks[0].losses == ranks[1].losses, tag + ": the ranks' losses differ");
      const bool same = check_tp_ranks(c, ranks[0], ranks[1], whole, tag);
      if (worst < 5e-3 && same)
        std::printf("ok    %-44s losses worst rel diff %.1e (tol 5e-03)\n", tag.c_str(), worst);
    }
  }
}

// Data and tensor parallelism together, as the trainer runs a DP 2 × TP 2 plan: 4 ranks, TP groups
// {0,1} {2,3} and DP groups {0,2} {1,3}, each DP replica on half of the batch, against DP 1 × TP 1
// on the whole batch. With NCCL, the gradient sums go on the TP communication stream as the
// trainer issues them (serialize_on), behind the TP all-reduces in issue order. Mean losses within
// 5e-3; each TP pair as in the TP test; the two DP replicas of each TP rank bit-identical.
void test_cuda_gpt_data_and_tensor_parallel() {
  const GptConfig c = kSmallGpt;
  const int64_t B = 2, T = 32, steps = 3, dp = 2, tp = 2;
  std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> batches;
  for (int64_t s = 0; s < steps; ++s) batches.push_back(random_batch(dp * B * T, c.vocab));
  const DpRun whole = train_steps(*g_device, c, dp * B, T, CudaGptOptions{}, 1.0f, steps,
                                  [&](int64_t s) { return batches[s]; });
  for (const std::string& backend : rank_backends()) {
    for (const int sub_batches : {1, 2}) {
      const std::string tag = "DP 2 x TP 2 [" + backend + "]" +
                              (sub_batches == 2 ? " (Oases: 2 sub-batches, gpuUnits 1)" : "");
      std::vector<std::unique_ptr<ThreadGroup>> tp_groups, dp_groups;
      for (int g = 0; g < 2; ++g) {
        tp_groups.push_back(std::make_unique<ThreadGroup>(tp));
        dp_groups.push_back(std::make_unique<ThreadGroup>(dp));
      }
      std::string error;
      const auto ranks = run_ranks(
          static_cast<int>(dp * tp),
          [&](int r, CudaDevice& device, worker::Communicator&) {
            const int tp_rank = r % 2, dp_rank = r / 2;
            try {
              ThreadGroup::Rank tp_comm(*tp_groups[dp_rank], tp_rank);
              ThreadGroup::Rank dp_comm(*dp_groups[tp_rank], dp_rank);
              auto collectives = make_stream_collectives(backend, tp_comm, device);
              auto reducer =
                  make_reducer(backend, dp_comm, device,
                               &device.stream(worker::StreamRole::kTensorParallelComm));
              CudaGptOptions options;
              options.tp = collectives.get();
              options.reducer = reducer.get();
              options.sub_batches = sub_batches;
              options.device_units = sub_batches == 2 ? 1 : -1;
              options.cpu_threads = 1;
              return train_steps(
                  device, c, B, T, options, 1.0f / dp, steps,
                  [&](int64_t s) {
                    const auto& [tok, tgt] = batches[s];
                    const int64_t n = B * T;
                    return std::make_pair(
                        std::vector<int32_t>(tok.begin() + dp_rank * n,
                                             tok.begin() + (dp_rank + 1) * n),
                        std::vector<int32_t>(tgt.begin() + dp_rank * n,
                                             tgt.begin() + (dp_rank + 1) * n));
                  },
                  &tp_comm);
            } catch (...) {  // the subgroups' other members must not wait forever either
              for (auto& g : tp_groups) g->abort();
              for (auto& g : dp_groups) g->abort();
              throw;
            }
          },
          &error);
      if (!error.empty()) {
        check(false, tag + ": " + error);
        continue;
      }
      double worst = 0;
      for (int64_t s = 0; s < steps; ++s) {
        const double mean = (ranks[0].losses[s] + ranks[2].losses[s]) / 2;
        worst = std::max(worst, std::abs(mean - whole.losses[s]) / whole.losses[s]);
      }
      check(worst < 5e-3, tag + ": mean loss differs from DP 1 x TP 1 by " + std::to_string(worst));
      const bool same = check_tp_ranks(c, ranks[0], ranks[1], whole, tag);
      const bool replicas = ranks[0].weights == ranks[2].weights &&
                            ranks[1].weights == ranks[3].weights &&
                            ranks[0].grads1 == ranks[2].grads1 && ranks[1].grads1 == ranks[3].grads1;
      check(replicas, tag + ": the DP replicas' gradients or weights differ");
      if (worst < 5e-3 && same && replicas)
        std::printf("ok    %-44s losses worst rel diff %.1e (tol 5e-03), replicas bit-identical\n",
                    tag.c_str(), worst);
    }
  }
}

// The NCCL reducer's plumbing on one GPU (NCCL refuses two ranks on one device, so the sum itself
// and its ordering need 2+ GPUs): libnccl loads, the id travels over the bootstrap group, the
// grouped all-reduces and the stream joins run, and a group of one — whose all-reduce is the
// identity, so this cannot see an ordering bug — trains as without a reducer.
void test_nccl_reducer_single_rank() {
#ifdef KUBETRAIN_WITH_NCCL
  std::string why;
  if (!worker::nccl_available(&why)) {
    check(false, "NCCL reducer: " + why);
    return;
  }
  const GptConfig c = kSmallGpt;
  const int64_t B = 2, T = 32, steps = 3;
  std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> batches;
  for (int64_t s = 0; s < steps; ++s) batches.push_back(random_batch(B * T, c.vocab));
  for (int64_t device_units : {int64_t{-1}, int64_t{1}}) {
    const std::string tag = device_units < 0 ? "" : " (gpuUnits 1)";
    CudaGptOptions options;
    options.device_units = device_units;
    const DpRun plain = train_steps(*g_device, c, B, T, options, 1.0f, steps,
                                    [&](int64_t s) { return batches[s]; });
    ThreadGroup group(1);
    ThreadGroup::Rank bootstrap(group, 0);
    auto reducer = worker::make_nccl_gradient_reducer(bootstrap, g_device->ordinal());
    options.reducer = reducer.get();
    const DpRun nccl = train_steps(*g_device, c, B, T, options, 1.0f, steps,
                                   [&](int64_t s) { return batches[s]; });
    // Not bitwise: wte's backward adds with atomics (order not fixed) in both runs.
    expect_close(nccl.grads1, widen(plain.grads1), 1e-5,
                 "NCCL reducer, one rank: step-1 gradients vs no reducer" + tag);
    double worst = 0;
    for (int64_t s = 0; s < steps; ++s)
      worst = std::max(worst, std::abs(nccl.losses[s] - plain.losses[s]) / plain.losses[s]);
    check(worst < 1e-5, "NCCL reducer, one rank" + tag + ": losses differ from no reducer by " +
                            std::to_string(worst));
    expect_close(nccl.weights, widen(plain.weights), 1e-3,
                 "NCCL reducer, one rank: step-3 weights vs no reducer" + tag);
    check(reducer->stats().allreduces > 0, "NCCL reducer" + tag + ": issued no all-reduce");
  }
#else
  check(false, "NCCL reducer: gpu_tests was built without nccl.h");
#endif
}

// GPT-2 124M (T 1024, bf16) on the CUDA model: tokens/s and MFU for the largest micro-batch that
// fits, with every unit's AdamW on the device and with offload: optimizer. One step is
// zero_grad, one micro-batch, the global norm and AdamW, as the worker runs it; the time is the
// median of per-step wall times with the work of each step finished (CPU AdamW included).
void gpt_bench() {
  const GptConfig c{1024, 50257, 50304, 12, 12, 768, 3072};
  const double peak = 989.4e12;  // H100/H200 SXM dense bf16, datasheet
  std::printf("\nGPT-2 124M bf16 training on the CUDA model (worker/cuda_gpt), T 1024:\n");
  std::printf("%-44s %6s %9s %10s %9s %6s %7s\n", "configuration", "micro", "step ms", "tokens/s",
              "TFLOP/s", "MFU", "loss");
  int64_t fits = 0;
  for (int64_t B : {256, 128, 64, 32, 16, 8}) {
    try {
      CudaGpt probe(*g_device, c, B, 1024);
      fits = B;
      break;
    } catch (const Error& e) {
      std::printf("micro-batch %ld does not fit: %s\n", static_cast<long>(B), e.what());
      g_device->release_cached();
    }
  }
  if (fits == 0) {
    std::printf("GPT-2 124M: no micro-batch fits\n");
    return;
  }
  g_device->release_cached();
  struct Variant {
    const char* name;
    int64_t device_units;
    worker::ActivationRecompute recompute = worker::ActivationRecompute::kNone;
  };
  const int threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  for (Variant variant :
       {Variant{"offload none (AdamW on the GPU)", -1},
        Variant{"offload optimizer, gpuUnits 7 (6 layers on CPU)", 7},
        Variant{"offload optimizer, gpuUnits 1 (all layers on CPU)", 1},
        Variant{"offload none, recompute full", -1, worker::ActivationRecompute::kFull},
        Variant{"offload none, recompute commAware", -1, worker::ActivationRecompute::kCommAware}}) {
    CudaGptOptions options;
    options.device_units = variant.device_units;
    options.recompute = variant.recompute;
    options.cpu_threads = threads;
    CudaGpt gpt(*g_device, c, fits, 1024, options);
    gpt.init_weights(1234);
    const auto [tok, tgt] = random_batch(fits * 1024, c.vocab);
    std::vector<double> times;
    double loss = 0;
    for (int i = 0; i < 8; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      gpt.zero_grad();
      gpt.train_micro_step(tok.data(), tgt.data(), 1.0f, true);
      const double norm = std::sqrt(gpt.grad_sum_of_squares());
      AdamWStep adam;
      adam.learning_rate = 6e-4f;
      adam.t = i + 1;
      adam.grad_scale = norm > 1.0 ? static_cast<float>(1.0 / norm) : 1.0f;
      gpt.update(adam, 0.1f);
      gpt.synchronize();
      loss = gpt.mean_loss();
      if (i >= 2) times.push_back(std::chrono::duration<double>(
                                      std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    const double sec = times[times.size() / 2];
    const double flops = gpt.flops_per_micro_step();
    std::printf("%-44s %6ld %9.1f %10.0f %9.1f %5.1f%% %7.3f  activations %.1f GiB\n",
                variant.name, static_cast<long>(fits), sec * 1e3, fits * 1024.0 / sec,
                flops / sec / 1e12, 100.0 * flops / sec / peak, loss,
                g_device->device_memory_stats().in_use_bytes[MemoryKind::kActivations] /
                    1073741824.0);
    g_device->release_cached();
  }
  std::printf("(median of 6 steps after 2 warm-up; each step waits for its CPU AdamW, so the "
              "offload rows do not count the overlap with the next forward; MFU of %.1f TFLOP/s)\n",
              peak / 1e12);
}

// The CUDA model's tests (also what the emulated build runs, --model-only).
// Under emulation each is also checked for stream-order races (tests/emulation/stream_order.h).
void model_tests() {
  const std::pair<const char*, void (*)()> tests[] = {
      {"gpt vs reference", test_cuda_gpt_vs_reference},
      {"gpt offload", test_cuda_gpt_offload},
      {"gpt window", test_cuda_gpt_window},
      {"gpt memorises", test_cuda_gpt_memorises},
      {"gpt recompute", test_cuda_gpt_recompute},
      {"gpt data parallel", test_cuda_gpt_data_parallel},
      {"gpt tensor parallel", test_cuda_gpt_tensor_parallel},
      {"gpt data and tensor parallel", test_cuda_gpt_data_and_tensor_parallel}};
  for (const auto& [name, test] : tests) {
#ifdef KT_CUDA_EMULATED
    const size_t before = emulation::stream_order_races();
    test();
    const size_t races = emulation::stream_order_races() - before;
    check(races == 0, std::string(name) + ": " + std::to_string(races) +
                          " stream-order races (printed above as STREAM-ORDER RACE)");
#else
    (void)name;
    test();
#endif
  }
}

}  // namespace
}  // namespace kt

int main(int argc, char** argv) {
  using namespace kt;
  const bool bench_mode = argc > 1 && std::strcmp(argv[1], "--bench") == 0;
  const bool gpt_bench_mode = argc > 1 && std::strcmp(argv[1], "--gpt-bench") == 0;
  // The CUDA model's tests only (what the emulated build runs: tests/emulation/README.md).
  const bool model_mode = argc > 1 && std::strcmp(argv[1], "--model-only") == 0;
  if (CudaDevice::device_count() == 0) {
    std::printf(
        "gpu_tests: NOT RUN — no usable CUDA device (%s). These tests need a GPU: run "
        "scripts/device-check.sh on a GPU machine.\n",
        CudaDevice::unavailable_reason().c_str());
    return 2;
  }
#if defined(KT_CUDA_EMULATED) && defined(KT_EMULATED_NCCL)
  setenv("KUBETRAIN_NCCL_LIBRARY", KT_EMULATED_NCCL, 0);  // the emulated libnccl, unless named
#endif
  g_seed = argc > 2 ? static_cast<unsigned>(std::stoul(argv[2])) : std::random_device{}();
  if (!bench_mode && !gpt_bench_mode && !model_mode && argc > 1)
    g_seed = static_cast<unsigned>(std::stoul(argv[1]));
  g_rng.seed(g_seed);
  try {
    CudaDevice device(0);
    g_device = &device;
    std::printf("gpu_tests on %s (%s, %.1f GiB), seed %u\n", device.name().c_str(),
                device.product().c_str(), device.total_memory_bytes() / 1073741824.0, g_seed);
    gpu::Context ctx(device.stream(worker::StreamRole::kCompute).handle());
    if (bench_mode) {
      bench(ctx);
    } else if (gpt_bench_mode) {
      gpt_bench();
    } else if (model_mode) {
      model_tests();
    } else {
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
      model_tests();
      test_nccl_reducer_single_rank();
    }
    KT_CUDA_CHECK(cudaDeviceSynchronize());
  } catch (const std::exception& e) {
    std::printf("FAIL  exception: %s\n", e.what());
    return 1;
  }
  if (bench_mode || gpt_bench_mode) return 0;
  std::printf("%d checks, %d failed\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}

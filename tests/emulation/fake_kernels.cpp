// kernels/cuda/ops.h on the host, for gpu_tests' model tests under emulation
// (tests/emulation/README.md): every op is kernels/reference.h in float over the same pointers
// (host memory stands in for the device), with bf16 storage rounded as on the GPU (round to
// nearest even), fp32 arithmetic inside. Linked instead of kt_kernels_cuda; the kernels
// themselves are checked on a GPU by gpu_tests' kernel tests.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/cuda/ops.h"
#include "kernels/reference.h"
#include "tests/emulation/stream_order.h"

namespace kt::kernels::cuda {
namespace ref = kernels::reference;
namespace em = emulation;
namespace {

// What each op reads and writes, for the stream-order checker (stream_order.h): the kernel's
// contract from ops.h, not what this stand-in happens to touch.
template <class T>
em::Access rd(const T* p, int64_t n) {
  return em::reads(p, static_cast<size_t>(n) * sizeof(T));
}
template <class T>
em::Access wr(T* p, int64_t n) {
  return em::writes(p, static_cast<size_t>(n) * sizeof(T));
}
// The rows of a (rows, C) table the tokens index, within [lo, lo + rows): as one span.
template <class T>
em::Access token_rows(bool write, T* table, const int32_t* tokens, int64_t BT, int64_t C,
                      int64_t lo, int64_t rows) {
  int64_t first = INT64_MAX, last = -1;
  for (int64_t i = 0; i < BT; ++i) {
    const int64_t row = tokens[i] - lo;
    if (row < 0 || row >= rows) continue;
    first = std::min(first, row);
    last = std::max(last, row);
  }
  if (last < 0) return em::reads(nullptr, 0);
  const size_t at = static_cast<size_t>(first * C), n = static_cast<size_t>((last - first + 1) * C);
  return write ? em::writes(table + at, n * sizeof(T)) : em::reads(table + at, n * sizeof(T));
}

using F = std::vector<float>;

F up(const bf16* p, int64_t n) {
  F out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(p[i].bits);
  return out;
}
void down(bf16* p, const F& v) {
  for (size_t i = 0; i < v.size(); ++i) p[i].bits = float_to_bf16(v[i]);
}
F up_or_empty(const bf16* p, int64_t n) {
  return p ? up(p, n) : F();
}

// The flash kernels' contract through the materialised reference: lse (B,NH,T) from preatt.
void attention_with_lse(F& out, float* lse, const F& qkv, int64_t B, int64_t T, int64_t C,
                        int64_t NH, F* att_out = nullptr) {
  F preatt(static_cast<size_t>(B * NH * T * T)), att(preatt.size());
  out.assign(static_cast<size_t>(B * T * C), 0.0f);
  ref::attention_forward<float>(out.data(), preatt.data(), att.data(), qkv.data(), B, T, C, NH);
  if (lse)
    for (int64_t r = 0; r < B * NH * T; ++r) {
      const int64_t t = r % T;
      const float* pre = preatt.data() + r * T;
      float m = -INFINITY;
      for (int64_t j = 0; j <= t; ++j) m = std::max(m, pre[j]);
      double sum = 0;
      for (int64_t j = 0; j <= t; ++j) sum += std::exp(static_cast<double>(pre[j] - m));
      lse[r] = m + static_cast<float>(std::log(sum));
    }
  if (att_out) *att_out = std::move(att);
}

}  // namespace

Context::Context(StreamHandle stream) : stream_(stream) {}
Context::~Context() = default;

// ---- float32
void matmul_forward(const Context& ctx, float* out, const float* inp, const float* weight,
                    const float* bias, int64_t BT, int64_t C, int64_t OC) {
  em::device_op(ctx.stream(), __func__,
                {rd(inp, BT * C), rd(weight, OC * C), rd(bias, bias ? OC : 0), wr(out, BT * OC)});
  ref::matmul_forward<float>(out, inp, weight, bias, BT, C, OC);
}
void matmul_backward(const Context& ctx, float* dinp, float* dweight, float* dbias,
                     const float* dout, const float* inp, const float* weight, int64_t BT,
                     int64_t C, int64_t OC, bool accumulate_dweight) {
  em::device_op(ctx.stream(), __func__,
                {rd(dout, BT * OC), rd(inp, BT * C), rd(weight, OC * C), wr(dinp, BT * C),
                 wr(dweight, OC * C), wr(dbias, dbias ? OC : 0)});
  ref::matmul_backward<float>(dinp, dweight, dbias, dout, inp, weight, BT, C, OC,
                              accumulate_dweight);
}
void layernorm_forward(const Context& ctx, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int64_t BT, int64_t C) {
  em::device_op(
      ctx.stream(), __func__,
      {rd(inp, BT * C), rd(weight, C), rd(bias, C), wr(out, BT * C), wr(mean, BT), wr(rstd, BT)});
  ref::layernorm_forward<float>(out, mean, rstd, inp, weight, bias, BT, C);
}
void layernorm_backward(const Context& ctx, float* dinp, float* dweight, float* dbias,
                        const float* dout, const float* inp, const float* weight, const float* mean,
                        const float* rstd, int64_t BT, int64_t C) {
  em::device_op(ctx.stream(), __func__,
                {rd(dout, BT * C), rd(inp, BT * C), rd(weight, C), rd(mean, BT), rd(rstd, BT),
                 wr(dinp, BT * C), wr(dweight, C), wr(dbias, C)});
  ref::layernorm_backward<float>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, BT, C);
}
void gelu_forward(const Context& ctx, float* out, const float* inp, int64_t N) {
  em::device_op(ctx.stream(), __func__, {rd(inp, N), wr(out, N)});
  ref::gelu_forward<float>(out, inp, N);
}
void gelu_backward(const Context& ctx, float* dinp, const float* inp, const float* dout,
                   int64_t N) {
  em::device_op(ctx.stream(), __func__, {rd(inp, N), rd(dout, N), wr(dinp, N)});
  ref::gelu_backward<float>(dinp, inp, dout, N);
}
void residual_forward(const Context& ctx, float* out, const float* a, const float* b, int64_t N) {
  em::device_op(ctx.stream(), __func__, {rd(a, N), rd(b, N), wr(out, N)});
  ref::residual_forward<float>(out, a, b, N);
}
void residual_backward(const Context& ctx, float* da, float* db, const float* dout, int64_t N) {
  em::device_op(ctx.stream(), __func__, {rd(dout, N), wr(da, N), wr(db, N)});
  ref::residual_backward<float>(da, db, dout, N);
}
void embedding_forward(const Context& ctx, float* out, const int32_t* tokens, const float* wte,
                       const float* wpe, int64_t B, int64_t T, int64_t C) {
  em::device_op(ctx.stream(), __func__,
                {rd(tokens, B * T), token_rows(false, wte, tokens, B * T, C, 0, INT64_MAX),
                 rd(wpe, T * C), wr(out, B * T * C)});
  ref::embedding_forward<float>(out, tokens, wte, wpe, B, T, C);
}
void embedding_backward(const Context& ctx, float* dwte, float* dwpe, const float* dout,
                        const int32_t* tokens, int64_t B, int64_t T, int64_t C) {
  em::device_op(ctx.stream(), __func__,
                {rd(tokens, B * T), rd(dout, B * T * C),
                 token_rows(true, dwte, tokens, B * T, C, 0, INT64_MAX), wr(dwpe, T * C)});
  ref::embedding_backward<float>(dwte, dwpe, dout, tokens, B, T, C);
}
void attention_forward(const Context& ctx, float* out, float* preatt, float* att, const float* inp,
                       int64_t B, int64_t T, int64_t C, int64_t NH) {
  em::device_op(ctx.stream(), __func__,
                {rd(inp, B * T * 3 * C), wr(out, B * T * C), wr(preatt, B * NH * T * T),
                 wr(att, B * NH * T * T)});
  ref::attention_forward<float>(out, preatt, att, inp, B, T, C, NH);
}
void attention_backward(const Context& ctx, float* dinp, float* dpreatt, float* datt,
                        const float* dout, const float* inp, const float* att, int64_t B, int64_t T,
                        int64_t C, int64_t NH) {
  em::device_op(ctx.stream(), __func__,
                {rd(dout, B * T * C), rd(inp, B * T * 3 * C), rd(att, B * NH * T * T),
                 wr(dinp, B * T * 3 * C), wr(dpreatt, B * NH * T * T), wr(datt, B * NH * T * T)});
  std::fill(dpreatt, dpreatt + B * NH * T * T, 0.0f);
  std::fill(datt, datt + B * NH * T * T, 0.0f);
  ref::attention_backward<float>(dinp, dpreatt, datt, dout, inp, att, B, T, C, NH);
}
void softmax_cross_entropy(const Context& ctx, float* losses, float* dlogits, const float* logits,
                           const int32_t* targets, int64_t BT, int64_t V, int64_t Vp, float dloss) {
  em::device_op(
      ctx.stream(), __func__,
      {rd(logits, BT * Vp), rd(targets, BT), wr(losses, BT), wr(dlogits, dlogits ? BT * Vp : 0)});
  const F x(logits, logits + BT * Vp);
  ref::softmax_cross_entropy<float>(losses, dlogits, x.data(), targets, BT, V, Vp, dloss);
}
void adamw_update(const Context& ctx, float* params, const float* grads, float* m, float* v,
                  int64_t N, const AdamWStep& step) {
  em::device_op(ctx.stream(), __func__, {rd(grads, N), wr(params, N), wr(m, N), wr(v, N)});
  ref::adamw_update<float>(params, grads, m, v, N, step);
}
void sum_of_squares(const Context& ctx, double* result, const float* x, int64_t N) {
  em::device_op(ctx.stream(), __func__, {rd(x, N), wr(result, 1)});
  for (int64_t i = 0; i < N; ++i) *result += static_cast<double>(x[i]) * x[i];
}

// ---- bf16 storage, fp32 arithmetic
void cast_to_bf16(const Context& ctx, bf16* out, const float* inp, int64_t N) {
  em::device_op(ctx.stream(), __func__, {rd(inp, N), wr(out, N)});
  for (int64_t i = 0; i < N; ++i) out[i].bits = float_to_bf16(inp[i]);
}
void cast_to_float(const Context& ctx, float* out, const bf16* inp, int64_t N) {
  em::device_op(ctx.stream(), __func__, {rd(inp, N), wr(out, N)});
  for (int64_t i = 0; i < N; ++i) out[i] = bf16_to_float(inp[i].bits);
}
void matmul_forward_bf16(const Context& ctx, bf16* out, const bf16* inp, const bf16* weight,
                         const bf16* bias, int64_t BT, int64_t C, int64_t OC) {
  em::device_op(ctx.stream(), __func__,
                {rd(inp, BT * C), rd(weight, OC * C), rd(bias, bias ? OC : 0), wr(out, BT * OC)});
  const F x = up(inp, BT * C), w = up(weight, OC * C), b = up_or_empty(bias, OC);
  F y(static_cast<size_t>(BT * OC));
  ref::matmul_forward<float>(y.data(), x.data(), w.data(), bias ? b.data() : nullptr, BT, C, OC);
  down(out, y);
}
void matmul_backward_bf16(const Context& ctx, bf16* dinp, float* dweight, float* dbias,
                          const bf16* dout, const bf16* inp, const bf16* weight, int64_t BT,
                          int64_t C, int64_t OC, bool accumulate_dweight, bool accumulate_dinp) {
  em::device_op(ctx.stream(), __func__,
                {rd(dout, BT * OC), rd(inp, BT * C), rd(weight, OC * C), wr(dinp, BT * C),
                 wr(dweight, OC * C), wr(dbias, dbias ? OC : 0)});
  const F d = up(dout, BT * OC), x = up(inp, BT * C), w = up(weight, OC * C);
  F dx = accumulate_dinp ? up(dinp, BT * C) : F(static_cast<size_t>(BT * C), 0.0f);
  ref::matmul_backward<float>(dx.data(), dweight, dbias, d.data(), x.data(), w.data(), BT, C, OC,
                              accumulate_dweight);
  down(dinp, dx);
}
void layernorm_forward(const Context& ctx, bf16* out, float* mean, float* rstd, const bf16* inp,
                       const bf16* weight, const bf16* bias, int64_t BT, int64_t C) {
  em::device_op(
      ctx.stream(), __func__,
      {rd(inp, BT * C), rd(weight, C), rd(bias, C), wr(out, BT * C), wr(mean, BT), wr(rstd, BT)});
  const F x = up(inp, BT * C), w = up(weight, C), b = up(bias, C);
  F y(static_cast<size_t>(BT * C));
  ref::layernorm_forward<float>(y.data(), mean, rstd, x.data(), w.data(), b.data(), BT, C);
  down(out, y);
}
void layernorm_backward(const Context& ctx, bf16* dinp, float* dweight, float* dbias,
                        const bf16* dout, const bf16* inp, const bf16* weight, const float* mean,
                        const float* rstd, int64_t BT, int64_t C) {
  em::device_op(ctx.stream(), __func__,
                {rd(dout, BT * C), rd(inp, BT * C), rd(weight, C), rd(mean, BT), rd(rstd, BT),
                 wr(dinp, BT * C), wr(dweight, C), wr(dbias, C)});
  const F d = up(dout, BT * C), x = up(inp, BT * C), w = up(weight, C);
  F dx = up(dinp, BT * C);
  ref::layernorm_backward<float>(dx.data(), dweight, dbias, d.data(), x.data(), w.data(), mean,
                                 rstd, BT, C);
  down(dinp, dx);
}
void gelu_forward(const Context& ctx, bf16* out, const bf16* inp, int64_t N) {
  em::device_op(ctx.stream(), __func__, {rd(inp, N), wr(out, N)});
  const F x = up(inp, N);
  F y(static_cast<size_t>(N));
  ref::gelu_forward<float>(y.data(), x.data(), N);
  down(out, y);
}
void gelu_backward(const Context& ctx, bf16* dinp, const bf16* inp, const bf16* dout, int64_t N,
                   bool accumulate) {
  em::device_op(ctx.stream(), __func__, {rd(inp, N), rd(dout, N), wr(dinp, N)});
  const F x = up(inp, N), d = up(dout, N);  // read first: dinp may be dout
  F dx = accumulate ? up(dinp, N) : F(static_cast<size_t>(N), 0.0f);
  ref::gelu_backward<float>(dx.data(), x.data(), d.data(), N);
  down(dinp, dx);
}
void residual_forward(const Context& ctx, bf16* out, const bf16* a, const bf16* b, int64_t N) {
  em::device_op(ctx.stream(), __func__, {rd(a, N), rd(b, N), wr(out, N)});
  const F x = up(a, N), y = up(b, N);
  F z(static_cast<size_t>(N));
  ref::residual_forward<float>(z.data(), x.data(), y.data(), N);
  down(out, z);
}
void residual_backward(const Context& ctx, bf16* da, bf16* db, const bf16* dout, int64_t N) {
  em::device_op(ctx.stream(), __func__, {rd(dout, N), wr(da, N), wr(db, N)});
  const F d = up(dout, N);
  F a = up(da, N), b = up(db, N);
  ref::residual_backward<float>(a.data(), b.data(), d.data(), N);
  down(da, a);
  down(db, b);
}
void embedding_forward(const Context& ctx, bf16* out, const int32_t* tokens, const bf16* wte,
                       const bf16* wpe, int64_t B, int64_t T, int64_t C) {
  embedding_forward_rows(ctx, out, tokens, wte, wpe, B, T, C, 0, INT64_MAX);
}
void embedding_backward(const Context& ctx, float* dwte, float* dwpe, const bf16* dout,
                        const int32_t* tokens, int64_t B, int64_t T, int64_t C) {
  embedding_backward_rows(ctx, dwte, dwpe, dout, tokens, B, T, C, 0, INT64_MAX);
}
void embedding_forward_rows(const Context& ctx, bf16* out, const int32_t* tokens, const bf16* wte,
                            const bf16* wpe, int64_t B, int64_t T, int64_t C, int64_t vocab_lo,
                            int64_t vocab_rows) {
  em::device_op(ctx.stream(), __func__,
                {rd(tokens, B * T), token_rows(false, wte, tokens, B * T, C, vocab_lo, vocab_rows),
                 rd(wpe, wpe ? T * C : 0), wr(out, B * T * C)});
  for (int64_t i = 0; i < B * T; ++i) {
    const int64_t row = tokens[i] - vocab_lo;
    for (int64_t c = 0; c < C; ++c) {
      const float token = row >= 0 && row < vocab_rows ? bf16_to_float(wte[row * C + c].bits) : 0;
      const float pos = wpe ? bf16_to_float(wpe[(i % T) * C + c].bits) : 0.0f;
      out[i * C + c].bits = float_to_bf16(token + pos);
    }
  }
}
void embedding_backward_rows(const Context& ctx, float* dwte, float* dwpe, const bf16* dout,
                             const int32_t* tokens, int64_t B, int64_t T, int64_t C,
                             int64_t vocab_lo, int64_t vocab_rows) {
  em::device_op(ctx.stream(), __func__,
                {rd(tokens, B * T), rd(dout, B * T * C),
                 token_rows(true, dwte, tokens, B * T, C, vocab_lo, vocab_rows), wr(dwpe, T * C)});
  for (int64_t i = 0; i < B * T; ++i) {
    const int64_t row = tokens[i] - vocab_lo;
    for (int64_t c = 0; c < C; ++c) {
      const float d = bf16_to_float(dout[i * C + c].bits);
      dwpe[(i % T) * C + c] += d;
      if (row >= 0 && row < vocab_rows) dwte[row * C + c] += d;
    }
  }
}
void softmax_cross_entropy(const Context& ctx, float* losses, bf16* dlogits, const bf16* logits,
                           const int32_t* targets, int64_t BT, int64_t V, int64_t Vp, float dloss) {
  em::device_op(
      ctx.stream(), __func__,
      {rd(logits, BT * Vp), rd(targets, BT), wr(losses, BT), wr(dlogits, dlogits ? BT * Vp : 0)});
  const F x = up(logits, BT * Vp);
  F d(static_cast<size_t>(BT * Vp));
  ref::softmax_cross_entropy<float>(losses, d.data(), x.data(), targets, BT, V, Vp, dloss);
  if (dlogits) down(dlogits, d);
}
void vocab_parallel_ce_max(const Context& ctx, float* row_max, const bf16* logits, int64_t BT,
                           int64_t valid, int64_t Vl) {
  em::device_op(ctx.stream(), __func__, {rd(logits, BT * Vl), wr(row_max, BT)});
  for (int64_t i = 0; i < BT; ++i) {
    float m = -3.4028235e38f;
    for (int64_t v = 0; v < valid; ++v) m = std::max(m, bf16_to_float(logits[i * Vl + v].bits));
    row_max[i] = m;
  }
}
void vocab_parallel_ce_sums(const Context& ctx, float* sums, const bf16* logits,
                            const float* row_max, const int32_t* targets, int64_t BT,
                            int64_t vocab_lo, int64_t valid, int64_t Vl) {
  em::device_op(ctx.stream(), __func__,
                {rd(logits, BT * Vl), rd(row_max, BT), rd(targets, BT), wr(sums, 2 * BT)});
  for (int64_t i = 0; i < BT; ++i) {
    float sum = 0;
    for (int64_t v = 0; v < valid; ++v)
      sum += std::exp(bf16_to_float(logits[i * Vl + v].bits) - row_max[i]);
    const int64_t t = targets[i] - vocab_lo;
    sums[i] = sum;
    sums[BT + i] = t >= 0 && t < valid ? bf16_to_float(logits[i * Vl + t].bits) : 0.0f;
  }
}
void vocab_parallel_ce_finish(const Context& ctx, float* losses, bf16* dlogits, const bf16* logits,
                              const float* row_max, const float* sums, const int32_t* targets,
                              int64_t BT, int64_t vocab_lo, int64_t valid, int64_t Vl,
                              float dloss) {
  em::device_op(ctx.stream(), __func__,
                {rd(logits, BT * Vl), rd(row_max, BT), rd(sums, 2 * BT), rd(targets, BT),
                 wr(losses, BT), wr(dlogits, dlogits ? BT * Vl : 0)});
  for (int64_t i = 0; i < BT; ++i) {
    losses[i] = std::log(sums[i]) - (sums[BT + i] - row_max[i]);
    if (!dlogits) continue;
    const int64_t t = targets[i] - vocab_lo;
    for (int64_t v = 0; v < Vl; ++v) {
      float d = 0;
      if (v < valid) {
        const float p = std::exp(bf16_to_float(logits[i * Vl + v].bits) - row_max[i]) / sums[i];
        d = (p - (v == t ? 1.0f : 0.0f)) * dloss;
      }
      dlogits[i * Vl + v].bits = float_to_bf16(d);
    }
  }
}
bool flash_attention_supported(int64_t head_size) {
  return head_size == 32 || head_size == 64 || head_size == 128;
}
void attention_forward_bf16(const Context& ctx, bf16* out, float* lse, const bf16* qkv, int64_t B,
                            int64_t T, int64_t C, int64_t NH) {
  em::device_op(ctx.stream(), __func__,
                {rd(qkv, B * T * 3 * C), wr(out, B * T * C), wr(lse, B * NH * T)});
  F y;
  attention_with_lse(y, lse, up(qkv, B * T * 3 * C), B, T, C, NH);
  down(out, y);
}
size_t attention_backward_bf16_scratch_bytes(int64_t B, int64_t T, int64_t, int64_t NH) {
  return static_cast<size_t>(B * NH * T) * sizeof(float);
}
void attention_backward_bf16(const Context& ctx, bf16* dqkv, void* scratch, const bf16* dout,
                             const bf16* qkv, const bf16* o, const float* lse, int64_t B, int64_t T,
                             int64_t C, int64_t NH) {
  em::device_op(ctx.stream(), __func__,
                {rd(dout, B * T * C), rd(qkv, B * T * 3 * C), rd(o, B * T * C), rd(lse, B * NH * T),
                 wr(dqkv, B * T * 3 * C),
                 em::writes(scratch, attention_backward_bf16_scratch_bytes(B, T, C, NH))});
  const F x = up(qkv, B * T * 3 * C), d = up(dout, B * T * C);
  F y, att;
  attention_with_lse(y, nullptr, x, B, T, C, NH, &att);
  F dx(static_cast<size_t>(B * T * 3 * C), 0.0f), dpre(att.size(), 0.0f), datt(att.size(), 0.0f);
  ref::attention_backward<float>(dx.data(), dpre.data(), datt.data(), d.data(), x.data(),
                                 att.data(), B, T, C, NH);
  down(dqkv, dx);
}
void adamw_update_multi(const Context& ctx, const AdamWTensor* tensors, int count,
                        const AdamWStep& step) {
  std::vector<em::Access> accesses;
  for (int i = 0; i < count; ++i) {
    const AdamWTensor& t = tensors[i];
    for (const em::Access& a : {rd(t.grads, t.N), wr(t.params, t.N), wr(t.m, t.N), wr(t.v, t.N),
                                wr(t.params_bf16, t.params_bf16 ? t.N : 0)})
      accesses.push_back(a);
  }
  em::device_op(ctx.stream(), __func__, accesses);
  for (int i = 0; i < count; ++i) {
    const AdamWTensor& t = tensors[i];
    ref::adamw_update<float>(t.params, t.grads, t.m, t.v, t.N, step);
    if (t.params_bf16)
      for (int64_t j = 0; j < t.N; ++j) t.params_bf16[j].bits = float_to_bf16(t.params[j]);
  }
}

}  // namespace kt::kernels::cuda

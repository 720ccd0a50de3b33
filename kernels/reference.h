// Plain loops: the specification the fast kernels are tested against. Straight from the math
// (llm.c's train_gpt2.c follows the same formulas); no threads, no vector tricks. Templates, so
// that tests run the very same code in float64 to get the reference values.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/ops.h"

namespace kt::kernels::reference {

template <class Real>
void matmul_forward(Real* out, const Real* inp, const Real* weight, const Real* bias, int64_t BT,
                    int64_t C, int64_t OC) {
  for (int64_t i = 0; i < BT; ++i)
    for (int64_t o = 0; o < OC; ++o) {
      Real acc = bias ? bias[o] : Real(0.0);
      for (int64_t c = 0; c < C; ++c) acc += inp[i * C + c] * weight[o * C + c];
      out[i * OC + o] = acc;
    }
}

template <class Real>
void matmul_backward(Real* dinp, Real* dweight, Real* dbias, const Real* dout, const Real* inp,
                     const Real* weight, int64_t BT, int64_t C, int64_t OC,
                     bool accumulate_dweight = true) {
  if (!accumulate_dweight)
    for (int64_t j = 0; j < OC * C; ++j) dweight[j] = Real(0);
  for (int64_t i = 0; i < BT; ++i)
    for (int64_t o = 0; o < OC; ++o) {
      const Real d = dout[i * OC + o];
      for (int64_t c = 0; c < C; ++c) {
        dinp[i * C + c] += weight[o * C + c] * d;
        dweight[o * C + c] += inp[i * C + c] * d;
      }
      if (dbias) dbias[o] += d;
    }
}

template <class Real>
void layernorm_forward(Real* out, Real* mean, Real* rstd, const Real* inp, const Real* weight,
                       const Real* bias, int64_t BT, int64_t C) {
  const Real eps = Real(1e-5);
  for (int64_t i = 0; i < BT; ++i) {
    const Real* x = inp + i * C;
    Real m = 0;
    for (int64_t c = 0; c < C; ++c) m += x[c];
    m /= C;
    Real var = 0;
    for (int64_t c = 0; c < C; ++c) var += (x[c] - m) * (x[c] - m);
    var /= C;
    const Real s = Real(1.0) / std::sqrt(var + eps);
    for (int64_t c = 0; c < C; ++c) out[i * C + c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[i] = m;
    rstd[i] = s;
  }
}

template <class Real>
void layernorm_backward(Real* dinp, Real* dweight, Real* dbias, const Real* dout, const Real* inp,
                        const Real* weight, const Real* mean, const Real* rstd, int64_t BT,
                        int64_t C) {
  for (int64_t i = 0; i < BT; ++i) {
    const Real* x = inp + i * C;
    const Real* dy = dout + i * C;
    Real dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int64_t c = 0; c < C; ++c) {
      const Real norm = (x[c] - mean[i]) * rstd[i];
      const Real dnorm = weight[c] * dy[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    for (int64_t c = 0; c < C; ++c) {
      const Real norm = (x[c] - mean[i]) * rstd[i];
      const Real dnorm = weight[c] * dy[c];
      dbias[c] += dy[c];
      dweight[c] += norm * dy[c];
      dinp[i * C + c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd[i];
    }
  }
}

template <class Real>
void gelu_forward(Real* out, const Real* inp, int64_t N) {
  for (int64_t i = 0; i < N; ++i) {
    const Real x = inp[i];
    out[i] = Real(0.5) * x *
             (Real(1.0) + std::tanh(std::sqrt(Real(2) / static_cast<Real>(M_PI)) *
                                    (x + Real(0.044715) * x * x * x)));
  }
}

template <class Real>
void gelu_backward(Real* dinp, const Real* inp, const Real* dout, int64_t N) {
  for (int64_t i = 0; i < N; ++i) {
    const Real x = inp[i];
    const Real u = std::sqrt(Real(2) / static_cast<Real>(M_PI)) * (x + Real(0.044715) * x * x * x);
    const Real th = std::tanh(u);
    const Real sech2 = Real(1.0) - th * th;
    const Real grad = Real(0.5) * (Real(1.0) + th) +
                      Real(0.5) * x * sech2 * std::sqrt(Real(2) / static_cast<Real>(M_PI)) *
                          (Real(1.0) + Real(3.0) * Real(0.044715) * x * x);
    dinp[i] += grad * dout[i];
  }
}

template <class Real>
void residual_forward(Real* out, const Real* a, const Real* b, int64_t N) {
  for (int64_t i = 0; i < N; ++i) out[i] = a[i] + b[i];
}

template <class Real>
void residual_backward(Real* da, Real* db, const Real* dout, int64_t N) {
  for (int64_t i = 0; i < N; ++i) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

template <class Real>
void embedding_forward(Real* out, const int32_t* tokens, const Real* wte, const Real* wpe,
                       int64_t B, int64_t T, int64_t C) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const Real* e = wte + static_cast<int64_t>(tokens[b * T + t]) * C;
      for (int64_t c = 0; c < C; ++c) out[(b * T + t) * C + c] = e[c] + wpe[t * C + c];
    }
}

template <class Real>
void embedding_backward(Real* dwte, Real* dwpe, const Real* dout, const int32_t* tokens, int64_t B,
                        int64_t T, int64_t C) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      Real* de = dwte + static_cast<int64_t>(tokens[b * T + t]) * C;
      for (int64_t c = 0; c < C; ++c) {
        de[c] += dout[(b * T + t) * C + c];
        dwpe[t * C + c] += dout[(b * T + t) * C + c];
      }
    }
}

template <class Real>
void attention_forward(Real* out, Real* preatt, Real* att, const Real* inp, int64_t B, int64_t T,
                       int64_t C, int64_t NH) {
  const int64_t hs = C / NH;
  const Real scale = Real(1.0) / std::sqrt(static_cast<Real>(hs));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const Real* q = inp + (b * T + t) * 3 * C + h * hs;
        Real* pre = preatt + ((b * NH + h) * T + t) * T;
        Real* a = att + ((b * NH + h) * T + t) * T;
        Real maxval = -INFINITY;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const Real* k = inp + (b * T + t2) * 3 * C + C + h * hs;
          Real dot = 0;
          for (int64_t i = 0; i < hs; ++i) dot += q[i] * k[i];
          pre[t2] = dot * scale;
          maxval = std::max(maxval, pre[t2]);
        }
        Real sum = 0;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          a[t2] = std::exp(pre[t2] - maxval);
          sum += a[t2];
        }
        for (int64_t t2 = 0; t2 < T; ++t2) {
          if (t2 <= t) {
            a[t2] /= sum;
          } else {
            a[t2] = 0;
            pre[t2] = 0;
          }
        }
        Real* o = out + (b * T + t) * C + h * hs;
        for (int64_t i = 0; i < hs; ++i) o[i] = 0;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const Real* v = inp + (b * T + t2) * 3 * C + 2 * C + h * hs;
          for (int64_t i = 0; i < hs; ++i) o[i] += a[t2] * v[i];
        }
      }
}

template <class Real>
void attention_backward(Real* dinp, Real* dpreatt, Real* datt, const Real* dout, const Real* inp,
                        const Real* att, int64_t B, int64_t T, int64_t C, int64_t NH) {
  const int64_t hs = C / NH;
  const Real scale = Real(1.0) / std::sqrt(static_cast<Real>(hs));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const Real* a = att + ((b * NH + h) * T + t) * T;
        Real* da = datt + ((b * NH + h) * T + t) * T;
        Real* dpre = dpreatt + ((b * NH + h) * T + t) * T;
        const Real* q = inp + (b * T + t) * 3 * C + h * hs;
        Real* dq = dinp + (b * T + t) * 3 * C + h * hs;
        const Real* d = dout + (b * T + t) * C + h * hs;
        for (int64_t t2 = 0; t2 <= t; ++t2) {  // through the weighted sum of values
          const Real* v = inp + (b * T + t2) * 3 * C + 2 * C + h * hs;
          Real* dv = dinp + (b * T + t2) * 3 * C + 2 * C + h * hs;
          for (int64_t i = 0; i < hs; ++i) {
            da[t2] += v[i] * d[i];
            dv[i] += a[t2] * d[i];
          }
        }
        for (int64_t t2 = 0; t2 <= t; ++t2)  // through the softmax
          for (int64_t t3 = 0; t3 <= t; ++t3) {
            const Real indicator = t2 == t3 ? Real(1.0) : Real(0.0);
            dpre[t3] += a[t2] * (indicator - a[t3]) * da[t2];
          }
        for (int64_t t2 = 0; t2 <= t; ++t2) {  // through q·k
          const Real* k = inp + (b * T + t2) * 3 * C + C + h * hs;
          Real* dk = dinp + (b * T + t2) * 3 * C + C + h * hs;
          for (int64_t i = 0; i < hs; ++i) {
            dq[i] += k[i] * dpre[t2] * scale;
            dk[i] += q[i] * dpre[t2] * scale;
          }
        }
      }
}

template <class Real>
void softmax_cross_entropy(Real* losses, Real* dlogits, const Real* logits, const int32_t* targets,
                           int64_t BT, int64_t V, int64_t Vp, Real dloss) {
  for (int64_t i = 0; i < BT; ++i) {
    const Real* x = logits + i * Vp;
    Real maxval = -INFINITY;
    for (int64_t v = 0; v < V; ++v) maxval = std::max(maxval, x[v]);
    Real sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(x[v] - maxval);
    const int32_t target = targets[i];
    losses[i] = std::log(sum) - (x[target] - maxval);
    if (dlogits) {
      Real* d = dlogits + i * Vp;
      for (int64_t v = 0; v < V; ++v) {
        const Real p = std::exp(x[v] - maxval) / sum;
        d[v] = (p - (v == target ? Real(1.0) : Real(0.0))) * dloss;
      }
      for (int64_t v = V; v < Vp; ++v) d[v] = 0;
    }
  }
}

template <class Real>
void adamw_update(Real* params, const Real* grads, Real* m, Real* v, int64_t N,
                  const AdamWStep& s) {
  const Real bc1 = Real(1.0) - std::pow(s.beta1, static_cast<Real>(s.t));
  const Real bc2 = Real(1.0) - std::pow(s.beta2, static_cast<Real>(s.t));
  for (int64_t i = 0; i < N; ++i) {
    const Real g = grads[i] * s.grad_scale;
    m[i] = s.beta1 * m[i] + (1 - s.beta1) * g;
    v[i] = s.beta2 * v[i] + (1 - s.beta2) * g * g;
    const Real mhat = m[i] / bc1;
    const Real vhat = v[i] / bc2;
    params[i] -= s.learning_rate * (mhat / (std::sqrt(vhat) + s.eps) + s.weight_decay * params[i]);
  }
}

template <class Real>
double sum_of_squares(const Real* x, int64_t N) {
  double acc = 0;
  for (int64_t i = 0; i < N; ++i) acc += static_cast<double>(x[i]) * x[i];
  return acc;
}

}  // namespace kt::kernels::reference

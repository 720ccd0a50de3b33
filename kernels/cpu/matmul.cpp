// Matmul through oneDNN's sgemm (row-major, like cblas; it runs on oneDNN's OpenMP pool).
#include <dnnl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "kernels/cpu/matmul_internal.h"
#include "kernels/cpu/simd.h"
#include "kernels/ops.h"

namespace kt::kernels::cpu {
namespace {

void sgemm(char transa, char transb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* Cm, int64_t ldc) {
  const dnnl_status_t status =
      dnnl_sgemm(transa, transb, M, N, K, 1.0f, A, lda, B, ldb, beta, Cm, ldc);
  if (status != dnnl_success) {  // bad arguments: a bug in the caller
    std::fprintf(stderr, "kubetrain: internal error: dnnl_sgemm failed with status %d\n",
                 static_cast<int>(status));
    std::abort();
  }
}

KT_SIMD_CLONES void add_bias(float* out, const float* bias, int64_t BT, int64_t OC) {
#pragma omp parallel for
  for (int64_t i = 0; i < BT; ++i) {
    float* row = out + i * OC;
#pragma omp simd
    for (int64_t o = 0; o < OC; ++o) row[o] += bias[o];
  }
}

}  // namespace

KT_SIMD_CLONES void column_sums(float* dbias, const float* dout, int64_t BT, int64_t OC) {
#pragma omp parallel for
  for (int64_t o0 = 0; o0 < OC; o0 += 64) {
    const int64_t o1 = std::min(OC, o0 + 64);
    for (int64_t i = 0; i < BT; ++i) {
      const float* row = dout + i * OC;
#pragma omp simd
      for (int64_t o = o0; o < o1; ++o) dbias[o] += row[o];
    }
  }
}

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                    int64_t BT, int64_t C, int64_t OC) {
  // out (BT,OC) = inp (BT,C) · weight (OC,C)ᵀ
  sgemm('N', 'T', BT, OC, C, inp, C, weight, C, 0.0f, out, OC);
  if (bias) add_bias(out, bias, BT, OC);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int64_t BT, int64_t C, int64_t OC,
                     bool accumulate_dweight) {
  // dinp (BT,C) += dout (BT,OC) · weight (OC,C)
  sgemm('N', 'N', BT, C, OC, dout, OC, weight, C, 1.0f, dinp, C);
  // dweight (OC,C) += dout (BT,OC)ᵀ · inp (BT,C)
  sgemm('T', 'N', OC, C, BT, dout, OC, inp, C, accumulate_dweight ? 1.0f : 0.0f, dweight, C);
  if (dbias) column_sums(dbias, dout, BT, OC);
}

}  // namespace kt::kernels::cpu

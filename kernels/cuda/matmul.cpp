// Matmuls through cuBLASLt, and the Context that owns the handle and workspace. Row-major
// tensors are column-major transposes, so out (BT,OC) = inp · weightᵀ is computed as the
// column-major outᵀ (OC,BT) = weightᵀ(as stored, C×OC, transposed) · inpᵀ (C×BT): m = OC,
// n = BT, k = C, and a bias of length m is exactly cuBLASLt's per-row epilogue bias.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/check.h"
#include "kernels/cuda/internal.h"
#include "kernels/cuda/ops.h"

namespace kt::kernels::cuda {

namespace {
constexpr size_t kWorkspaceBytes = 32u << 20;  // cuBLAS recommends ≥ 32 MiB on Hopper
constexpr size_t kScratchBytes = 8u << 20;

cublasLtHandle_t handle_of(const Context& ctx) {
  return static_cast<cublasLtHandle_t>(ctx.blas_handle());
}

// D (m,n) = alpha · op(A) · op(B) + beta · D [+ bias (m)], column-major, leading dims given.
struct Gemm {
  bool transa, transb;
  int64_t m, n, k;
  const void* A;
  int64_t lda;
  const void* B;
  int64_t ldb;
  void* D;
  int64_t ldd;
  cudaDataType_t ab_type, d_type;
  cublasComputeType_t compute;
  float alpha, beta;
  const void* bias = nullptr;  // of d_type, length m
};

void run(const Context& ctx, const Gemm& g) {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  // Destroy the descriptors on every path (a failed check throws).
  struct Cleanup {
    cublasLtMatmulDesc_t& desc;
    cublasLtMatrixLayout_t &a, &b, &d;
    cublasLtMatmulPreference_t& pref;
    ~Cleanup() {
      if (pref) cublasLtMatmulPreferenceDestroy(pref);
      if (d) cublasLtMatrixLayoutDestroy(d);
      if (b) cublasLtMatrixLayoutDestroy(b);
      if (a) cublasLtMatrixLayoutDestroy(a);
      if (desc) cublasLtMatmulDescDestroy(desc);
    }
  } cleanup{desc, a, b, d, pref};

  KT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, g.compute, CUDA_R_32F));
  const cublasOperation_t opa = g.transa ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = g.transb ? CUBLAS_OP_T : CUBLAS_OP_N;
  KT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  KT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  if (g.bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    KT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                   sizeof(epilogue)));
    KT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias,
                                                   sizeof(g.bias)));
    const cudaDataType_t bias_type = g.d_type;
    KT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                   &bias_type, sizeof(bias_type)));
  }
  // Stored shapes: op(A) is m×k, so A is k×m when transposed.
  KT_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&a, g.ab_type, g.transa ? g.k : g.m, g.transa ? g.m : g.k, g.lda));
  KT_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&b, g.ab_type, g.transb ? g.n : g.k, g.transb ? g.k : g.n, g.ldb));
  KT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d, g.d_type, g.m, g.n, g.ldd));

  KT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t workspace = ctx.workspace_bytes();
  KT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  KT_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_of(ctx), desc, a, b, d, d, pref, 1,
                                                 &heuristic, &found));
  if (found == 0)
    throw Error("cuBLASLt has no algorithm for a " + std::to_string(g.m) + "×" +
                std::to_string(g.n) + "×" + std::to_string(g.k) + " matmul of this type/layout");
  KT_CUBLAS_CHECK(cublasLtMatmul(handle_of(ctx), desc, &g.alpha, g.A, a, g.B, b, &g.beta, g.D, d,
                                 g.D, d, &heuristic.algo, ctx.workspace(), workspace,
                                 ctx.stream()));
}

// The three products of a linear layer, for either precision.
// forward: outᵀ (OC,BT) = weightᵀ-view · inpᵀ
Gemm forward_gemm(void* out, const void* inp, const void* weight, const void* bias, int64_t BT,
                  int64_t C, int64_t OC) {
  Gemm g{true, false, OC,  BT, C,          weight,     C,
         inp,  C,     out, OC, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F,
         1.0f, 0.0f};
  g.bias = bias;
  return g;
}
// dinpᵀ (C,BT) += weight-view (C,OC) · doutᵀ (OC,BT)
Gemm dinp_gemm(void* dinp, const void* dout, const void* weight, int64_t BT, int64_t C,
               int64_t OC) {
  return Gemm{false, false, C,    BT, OC,         weight,     C,
              dout,  OC,    dinp, C,  CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F,
              1.0f,  1.0f};
}
// dweightᵀ (C,OC) (+)= inpᵀ (C,BT) · dout (BT,OC)
Gemm dweight_gemm(void* dweight, const void* dout, const void* inp, int64_t BT, int64_t C,
                  int64_t OC, bool accumulate) {
  return Gemm{false,      true,
              C,          OC,
              BT,         inp,
              C,          dout,
              OC,         dweight,
              C,          CUDA_R_32F,
              CUDA_R_32F, CUBLAS_COMPUTE_32F,
              1.0f,       accumulate ? 1.0f : 0.0f};
}

}  // namespace

Context::Context(StreamHandle stream)
    : stream_(stream), workspace_bytes_(kWorkspaceBytes), scratch_bytes_(kScratchBytes) {
  cublasLtHandle_t handle = nullptr;
  KT_CUBLAS_CHECK(cublasLtCreate(&handle));
  blas_handle_ = handle;
  cudaError_t status = cudaMalloc(&workspace_, workspace_bytes_);
  if (status == cudaSuccess) status = cudaMalloc(&scratch_, scratch_bytes_);
  if (status != cudaSuccess) {
    cudaFree(workspace_);
    cublasLtDestroy(handle);
    KT_CUDA_CHECK(status);
  }
}

Context::~Context() {
  cudaFree(scratch_);  // errors at teardown have no one to report to
  cudaFree(workspace_);
  cublasLtDestroy(static_cast<cublasLtHandle_t>(blas_handle_));
}

void matmul_forward(const Context& ctx, float* out, const float* inp, const float* weight,
                    const float* bias, int64_t BT, int64_t C, int64_t OC) {
  run(ctx, forward_gemm(out, inp, weight, bias, BT, C, OC));
}

void matmul_backward(const Context& ctx, float* dinp, float* dweight, float* dbias,
                     const float* dout, const float* inp, const float* weight, int64_t BT,
                     int64_t C, int64_t OC, bool accumulate_dweight) {
  run(ctx, dinp_gemm(dinp, dout, weight, BT, C, OC));
  run(ctx, dweight_gemm(dweight, dout, inp, BT, C, OC, accumulate_dweight));
  if (dbias) detail::column_sum_accumulate(ctx, dbias, dout, BT, OC);
}

void matmul_forward_bf16(const Context& ctx, bf16* out, const bf16* inp, const bf16* weight,
                         const bf16* bias, int64_t BT, int64_t C, int64_t OC) {
  Gemm g = forward_gemm(out, inp, weight, bias, BT, C, OC);
  g.ab_type = g.d_type = CUDA_R_16BF;
  run(ctx, g);
}

void matmul_backward_bf16(const Context& ctx, bf16* dinp, float* dweight, float* dbias,
                          const bf16* dout, const bf16* inp, const bf16* weight, int64_t BT,
                          int64_t C, int64_t OC, bool accumulate_dweight,
                          bool accumulate_dinp) {
  Gemm gi = dinp_gemm(dinp, dout, weight, BT, C, OC);
  gi.ab_type = gi.d_type = CUDA_R_16BF;
  gi.beta = accumulate_dinp ? 1.0f : 0.0f;  // beta 0: cuBLASLt does not read the old dinp
  run(ctx, gi);
  Gemm gw = dweight_gemm(dweight, dout, inp, BT, C, OC, accumulate_dweight);
  gw.ab_type = CUDA_R_16BF;  // bf16 operands, fp32 gradient accumulated in place
  run(ctx, gw);
  if (dbias) detail::column_sum_accumulate(ctx, dbias, dout, BT, OC);
}

}  // namespace kt::kernels::cuda

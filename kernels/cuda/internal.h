// Helpers the host-side sources of kernels/cuda share (matmul.cpp uses the column sums that
// elementwise.cu implements). Not part of the public family; no CUDA header here.
#pragma once

#include <cstdint>

#include "kernels/cuda/ops.h"

namespace kt::kernels::cuda::detail {

// out (cols) += Σ_rows in (rows, cols)
void column_sum_accumulate(const Context& ctx, float* out, const float* in, int64_t rows,
                           int64_t cols);
void column_sum_accumulate(const Context& ctx, float* out, const bf16* in, int64_t rows,
                           int64_t cols);

}  // namespace kt::kernels::cuda::detail

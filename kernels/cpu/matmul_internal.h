// What the fp32 and the bf16 matmuls share (kernels/cpu/matmul.cpp defines it).
#pragma once

#include <cstdint>

namespace kt::kernels::cpu {

// dbias (OC) += Σ over the BT rows of dout (BT,OC)
void column_sums(float* dbias, const float* dout, int64_t BT, int64_t OC);

}  // namespace kt::kernels::cpu

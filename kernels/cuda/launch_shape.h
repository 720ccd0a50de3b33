// Grid and block sizes of the CUDA kernels, as pure functions so that they are unit-tested on a
// machine without a GPU (tests/unit/cuda_launch_shape_test.cpp) and so that one place states each
// kernel's decomposition. No CUDA header here.
#pragma once

#include <algorithm>
#include <cstdint>

namespace kt::kernels::cuda {

struct LaunchShape {
  int64_t grid = 0;          // blocks (x dimension)
  int block = 0;             // threads per block
  int64_t shared_bytes = 0;  // dynamic shared memory per block
};

// CUDA limits that every shape respects (all architectures ≥ sm_80).
constexpr int64_t kMaxGridX = 2147483647;  // 2^31 − 1
constexpr int kMaxBlock = 1024;
constexpr int64_t kDefaultSharedBytes = 48 * 1024;  // without the opt-in attribute

// Element-wise kernels: 256 threads, one element per thread per grid-stride iteration, the grid
// capped so a launch never exceeds 64 blocks per SM of a large GPU (132 SMs on H100/H200) and the
// loop strides over the rest.
constexpr int kElementwiseBlock = 256;
constexpr int64_t kElementwiseMaxGrid = 132 * 64;
inline LaunchShape elementwise_shape(int64_t N) {
  const int64_t blocks = (N + kElementwiseBlock - 1) / kElementwiseBlock;
  return {std::clamp<int64_t>(blocks, 1, kElementwiseMaxGrid), kElementwiseBlock, 0};
}

// Row kernels (layernorm, softmax-cross-entropy): one block per row, threads striding over the
// row's C columns: a warp multiple, at most 1024, no more threads than columns (rounded up to
// a warp) so that short rows do not idle 1024 threads. Block reductions use one float per warp.
inline LaunchShape row_shape(int64_t rows, int64_t C) {
  const int64_t warps = std::clamp<int64_t>((C + 31) / 32, 1, kMaxBlock / 32);
  const int block = static_cast<int>(std::min<int64_t>(warps * 32, 512));
  return {rows, block, 0};
}

// Column reductions (layernorm dweight/dbias, matmul dbias): sums over the rows of each column,
// deterministic (no atomics) in two stages. Stage 1: blocks of 32 columns × 8 threads over rows,
// one block per (column tile, row chunk), each writing its partial sums to the Context's
// scratch; stage 2 (column_shape): one thread per column adds the chunks' partials in order.
// Chunks: ≥ 64 rows each, at most 256, and `terms` arrays of chunks × cols floats must fit in
// `scratch_floats`.
constexpr int kColumnTile = 32;
constexpr int kColumnRowsPerBlock = 8;
struct ColumnReduction {
  int64_t chunks = 1;
  int64_t rows_per_chunk = 0;
};
inline ColumnReduction column_reduction(int64_t rows, int64_t cols, int64_t scratch_floats,
                                        int terms) {
  int64_t chunks = std::clamp<int64_t>((rows + 63) / 64, 1, 256);
  chunks = std::max<int64_t>(1, std::min(chunks, scratch_floats / (cols * terms)));
  const int64_t rows_per_chunk = std::max<int64_t>(1, (rows + chunks - 1) / chunks);
  return {std::max<int64_t>(1, (rows + rows_per_chunk - 1) / rows_per_chunk), rows_per_chunk};
}
inline LaunchShape column_shape(int64_t C) {
  constexpr int kBlock = 128;
  return {std::max<int64_t>(1, (C + kBlock - 1) / kBlock), kBlock, 0};
}

// Causal attention, forward and the q-side of backward: one block per (b, h, t) query row; the
// block's threads split the T keys (dot products, softmax) then the hs output channels. Shared
// memory holds the query row (hs floats) and the T attention weights.
inline LaunchShape attention_row_shape(int64_t B, int64_t NH, int64_t T, int64_t hs) {
  const int block =
      static_cast<int>(std::clamp<int64_t>(((std::max(T, hs) + 31) / 32) * 32, 32, 256));
  return {B * NH * T, block, (hs + T) * static_cast<int64_t>(sizeof(float))};
}

// Attention backward, key/value side: one block per (b, h, t2) key row, threads over the hs
// channels, each summing the queries t ≥ t2 (no atomics: deterministic).
inline LaunchShape attention_key_shape(int64_t B, int64_t NH, int64_t T, int64_t hs) {
  const int block = static_cast<int>(std::clamp<int64_t>(((hs + 31) / 32) * 32, 32, 1024));
  return {B * NH * T, block, 0};
}

// Multi-tensor AdamW: a fixed number of blocks per tensor chunk of kAdamWChunk elements.
constexpr int64_t kAdamWChunk = 65536;
inline int64_t adamw_chunks(int64_t N) {
  return (N + kAdamWChunk - 1) / kAdamWChunk;
}

// True when a shape is launchable under the limits above (used by KT_CHECKs before launches).
inline bool launchable(const LaunchShape& s) {
  return s.grid >= 1 && s.grid <= kMaxGridX && s.block >= 1 && s.block <= kMaxBlock &&
         s.block % 32 == 0 && s.shared_bytes >= 0 && s.shared_bytes <= 227 * 1024;
}

}  // namespace kt::kernels::cuda

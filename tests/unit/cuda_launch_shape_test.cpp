// Launch shapes of the CUDA kernels (kernels/cuda/launch_shape.h), checked without a GPU: every
// shape is launchable, covers its work exactly once, and stays inside the hardware limits for
// the sizes the worker uses (GPT-2 124M at T = 1024 up to gpt-7b).
#include <gtest/gtest.h>

#include "kernels/cuda/launch_shape.h"

namespace kt::kernels::cuda {
namespace {

TEST(CudaLaunchShape, ElementwiseCoversEveryElementWithACappedGrid) {
  for (int64_t N : {int64_t{1}, int64_t{255}, int64_t{256}, int64_t{257}, int64_t{1} << 20,
                    int64_t{16} * 1024 * 3072, int64_t{124475904}}) {
    const LaunchShape s = elementwise_shape(N);
    EXPECT_TRUE(launchable(s)) << N;
    EXPECT_EQ(s.block, 256);
    EXPECT_LE(s.grid, kElementwiseMaxGrid);
    // grid-stride: one pass covers min(N, grid·block) elements, the loop the rest
    EXPECT_GE(s.grid * s.block, std::min<int64_t>(N, kElementwiseMaxGrid * 256)) << N;
    if (N <= kElementwiseMaxGrid * 256) {
      EXPECT_LT((s.grid - 1) * s.block, N) << "an idle block";
    }
  }
}

TEST(CudaLaunchShape, RowShapeIsOneBlockPerRowWithAWarpMultipleNoWiderThanTheRow) {
  EXPECT_EQ(row_shape(16384, 768).grid, 16384);
  EXPECT_EQ(row_shape(16384, 768).block, 512);  // capped at 512
  EXPECT_EQ(row_shape(10, 64).block, 64);       // short rows: 2 warps, not 512 idle threads
  EXPECT_EQ(row_shape(10, 1).block, 32);
  EXPECT_EQ(row_shape(10, 33).block, 64);
  EXPECT_EQ(row_shape(8192, 50304).block, 512);
  for (int64_t C : {1, 31, 32, 100, 768, 50304}) EXPECT_TRUE(launchable(row_shape(7, C))) << C;
}

TEST(CudaLaunchShape, ColumnShapeHasOneThreadPerColumn) {
  const LaunchShape s = column_shape(768);
  EXPECT_EQ(s.grid * s.block, 768);
  EXPECT_GE(column_shape(769).grid * column_shape(769).block, 769);
  EXPECT_EQ(column_shape(1).grid, 1);
}

TEST(CudaLaunchShape, ColumnReductionChunksCoverEveryRowOnceAndFitTheScratch) {
  const int64_t scratch = (8 << 20) / 4;  // the Context's 8 MiB
  for (int64_t rows : {1, 63, 64, 65, 1000, 16384, 1 << 20})
    for (int64_t cols : {1, 768, 3072, 50304})
      for (int terms : {1, 2}) {
        const ColumnReduction r = column_reduction(rows, cols, scratch, terms);
        EXPECT_GE(r.chunks, 1);
        EXPECT_LE(r.chunks, 256);
        EXPECT_GE(r.chunks * r.rows_per_chunk, rows) << "a row left out";
        EXPECT_LT((r.chunks - 1) * r.rows_per_chunk, rows) << "an empty chunk";
        EXPECT_LE(r.chunks * cols * terms, std::max<int64_t>(scratch, cols * terms));
      }
  EXPECT_EQ(column_reduction(16384, 768, scratch, 2).chunks, 256);  // GPT-2 124M, B·T = 16384
  EXPECT_EQ(column_reduction(16384, 768, scratch, 2).rows_per_chunk, 64);
  EXPECT_EQ(column_reduction(100, 768, scratch, 1).chunks, 2);
}

TEST(CudaLaunchShape, AttentionRowsFitSharedMemoryForGpt2AndLongerContexts) {
  // GPT-2 124M: B 16, NH 12, T 1024, hs 64
  const LaunchShape s = attention_row_shape(16, 12, 1024, 64);
  EXPECT_EQ(s.grid, 16 * 12 * 1024);
  EXPECT_EQ(s.block, 256);
  EXPECT_EQ(s.shared_bytes, (64 + 1024) * 4);
  EXPECT_TRUE(launchable(s));
  EXPECT_TRUE(launchable(attention_row_shape(1, 32, 8192, 128)));  // gpt-7b-like, 8k context
  EXPECT_EQ(attention_row_shape(2, 4, 5, 16).block, 32);           // tiny: one warp
  const LaunchShape k = attention_key_shape(16, 12, 1024, 64);
  EXPECT_EQ(k.grid, 16 * 12 * 1024);
  EXPECT_EQ(k.block, 64);
  EXPECT_EQ(attention_key_shape(1, 1, 3, 80).block, 96);
}

TEST(CudaLaunchShape, RejectsShapesBeyondTheHardwareLimits) {
  EXPECT_FALSE(launchable({0, 256, 0}));
  EXPECT_FALSE(launchable({1, 2048, 0}));
  EXPECT_FALSE(launchable({1, 100, 0}));  // not a warp multiple
  EXPECT_FALSE(launchable({1, 256, 300 * 1024}));
  EXPECT_FALSE(launchable(attention_row_shape(1, 1, 100000, 64)));  // T too long for shared memory
}

TEST(CudaLaunchShape, AdamWChunksCoverEveryParameter) {
  EXPECT_EQ(adamw_chunks(1), 1);
  EXPECT_EQ(adamw_chunks(kAdamWChunk), 1);
  EXPECT_EQ(adamw_chunks(kAdamWChunk + 1), 2);
  EXPECT_EQ(adamw_chunks(124475904), (124475904 + kAdamWChunk - 1) / kAdamWChunk);
}

}  // namespace
}  // namespace kt::kernels::cuda

// Causal self-attention in bf16 without the T×T matrix, FlashAttention-2 style (Dao, "Flash-
// Attention-2", 2023, §3: tiles of queries against tiles of keys, the softmax computed online
// with a running max and sum, the backward recomputing P from the saved log-sum-exp).
//
// Letters: B batch, T time, C channels, NH heads, hs head size; q0/k0 the first query/key of a
// tile. qkv (B,T,3C) rows are [q | k | v], head h at columns h·hs.. of each part.
//
// Tensor cores through `mma.sync.m16n8k16` (bf16 operands, fp32 accumulate; sm_80 and later) fed
// by `ldmatrix` from shared memory, tiles copied global → shared by `cp.async` (16 bytes, rows
// past T zero-filled), two stages deep. Every block has 4 warps and each warp owns 16 rows of
// its tile, so the softmax statistics of a row live in the 4 lanes of one quad.
//
//   forward:      block = 64 queries of one (b, h); loops over key tiles 0..diagonal.
//   backward dot: D[row] = Σ_d dO·O (one warp per row and head), into the caller's scratch.
//   backward dQ:  block = 64 queries; loops over key tiles 0..diagonal (recomputes S and dP).
//   backward dKV: block = 64 keys; loops over 32-query tiles diagonal..end (recomputes S, dP).
// dQ and dK/dV come from separate kernels, each the only writer of its rows, so no atomics: the
// result is bit-for-bit reproducible. The price is recomputing QKᵀ and dO·Vᵀ once more than
// FA2's atomic dQ (7 tile products instead of 5).
//
// Register fragments of mma.m16n8k16 (PTX ISA, "Matrix fragments for mma.m16n8k16"), with
// g = lane/4 and c = lane%4: A (16×16) a0 = (g, 2c..2c+1), a1 = (g+8, 2c..), a2 = (g, 2c+8..),
// a3 = (g+8, 2c+8..); B (16×8, k×n) b0 = (k 2c..2c+1, n g), b1 = (k 2c+8.., n g); C (16×8)
// c0,c1 = (g, 2c..2c+1), c2,c3 = (g+8, 2c..). So the accumulators of two adjacent 8-column
// tiles are, packed to bf16 pairs, the A fragment of the next product (P·V, dS·K): no shuffle.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/ops.h"

namespace kt::kernels::cuda {
namespace {

using bf16_t = __nv_bfloat16;

constexpr int kThreads = 128;  // 4 warps, 16 tile rows each
constexpr int kTile = 64;      // queries per block (forward, dQ), keys per block (dK/dV)
constexpr int kPad = 8;        // bf16 elements of padding per shared row: ldmatrix without bank
                               // conflicts (row stride ≡ 16 bytes mod 128)
constexpr float kLog2e = 1.4426950408889634f;

// ---- PTX wrappers ----------------------------------------------------------------------------
__device__ inline uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16-byte global → shared copy; when !valid the 16 shared bytes are zero-filled and nothing is
// read (src must still be a mapped address).
__device__ inline void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)),
               "l"(src), "r"(valid ? 16 : 0));
}
__device__ inline void cp_async_4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(dst)),
               "l"(src), "r"(valid ? 4 : 0));
}
__device__ inline void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int kPending>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}
// Four 8×8 bf16 matrices; lanes 8i..8i+7 give the row addresses of matrix i.
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const bf16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
}
// d (16×8 fp32) += a (16×16 bf16) · b (16×8 bf16)
__device__ inline void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ inline uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ---- tiles in shared memory ------------------------------------------------------------------
// Copies kRows rows × kHs columns (row r at src + r·ld) into dst (row stride kHs + kPad); rows ≥
// valid_rows are zero-filled. valid_rows ≥ 1, so row 0 is always a mapped source address.
template <int kRows, int kHs>
__device__ inline void load_tile(bf16_t* dst, const bf16_t* src, int64_t ld, int valid_rows) {
  constexpr int kChunks = kHs / 8;  // 16-byte chunks per row
  static_assert(kRows * kChunks % kThreads == 0, "tile copy must split evenly over the block");
#pragma unroll
  for (int i = 0; i < kRows * kChunks / kThreads; ++i) {
    const int chunk = i * kThreads + static_cast<int>(threadIdx.x);
    const int r = chunk / kChunks, col = (chunk % kChunks) * 8;
    const bool valid = r < valid_rows;
    cp_async_16(dst + r * (kHs + kPad) + col, src + (valid ? r : 0) * ld + col, valid);
  }
}

// A fragments of the warp's 16 rows (from `rows`, its first row) for each 16-column chunk.
template <int kHs>
__device__ inline void load_a_fragments(uint32_t (&a)[kHs / 16][4], const bf16_t* rows) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < kHs / 16; ++kk)
    ldmatrix_x4(a[kk], rows + (lane % 16) * (kHs + kPad) + kk * 16 + (lane / 16) * 8);
}

// acc (16 × 8·kN) += a (16 × kHs) · Bᵀ where B (8·kN rows × kHs) is row-major in shared memory
// (`b`, stride kHs + kPad): QKᵀ with B = K, dO·Vᵀ with B = V.
template <int kHs, int kN>
__device__ inline void mma_abt(float (&acc)[kN][4], const uint32_t (&a)[kHs / 16][4],
                               const bf16_t* b) {
  const int lane = threadIdx.x % 32;
  // Lane l addresses matrix l/8: rows (l/16)·8 + l%8 of the 16-row pair, columns ((l/8)%2)·8.
  const bf16_t* base = b + ((lane / 16) * 8 + lane % 8) * (kHs + kPad) + ((lane / 8) % 2) * 8;
#pragma unroll
  for (int kk = 0; kk < kHs / 16; ++kk)
#pragma unroll
    for (int np = 0; np < kN / 2; ++np) {
      uint32_t f[4];
      ldmatrix_x4(f, base + np * 16 * (kHs + kPad) + kk * 16);
      mma(acc[2 * np], a[kk], f[0], f[1]);
      mma(acc[2 * np + 1], a[kk], f[2], f[3]);
    }
}

// As mma_abt with the warp's A rows (16 × kHs) read from shared memory (`a_rows`, stride
// kHs + kPad) one 16-column chunk at a time, for when registers cannot hold all of A.
template <int kHs, int kN>
__device__ inline void mma_abt_shared_a(float (&acc)[kN][4], const bf16_t* a_rows,
                                        const bf16_t* b) {
  const int lane = threadIdx.x % 32;
  const bf16_t* a_base = a_rows + (lane % 16) * (kHs + kPad) + (lane / 16) * 8;
  const bf16_t* base = b + ((lane / 16) * 8 + lane % 8) * (kHs + kPad) + ((lane / 8) % 2) * 8;
#pragma unroll
  for (int kk = 0; kk < kHs / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4(a, a_base + kk * 16);
#pragma unroll
    for (int np = 0; np < kN / 2; ++np) {
      uint32_t f[4];
      ldmatrix_x4(f, base + np * 16 * (kHs + kPad) + kk * 16);
      mma(acc[2 * np], a, f[0], f[1]);
      mma(acc[2 * np + 1], a, f[2], f[3]);
    }
  }
}

// acc (16 × kHs) += p (16 × 8·kN, the accumulators of a previous product, rounded to bf16) · B
// where B (8·kN rows × kHs) is row-major in shared memory: P·V, dS·K, Pᵀ·dO, dSᵀ·Q.
template <int kHs, int kN>
__device__ inline void mma_pb(float (&acc)[kHs / 8][4], const float (&p)[kN][4], const bf16_t* b) {
  const int lane = threadIdx.x % 32;
  // ldmatrix.trans: matrix l/8 covers rows ((l/8)%2)·8 + l%8 of the 16-row chunk, columns
  // (l/16)·8 of the 16-column pair; the transpose makes them B fragments (k = row, n = column).
  const bf16_t* base = b + (((lane / 8) % 2) * 8 + lane % 8) * (kHs + kPad) + (lane / 16) * 8;
#pragma unroll
  for (int kk = 0; kk < kN / 2; ++kk) {
    const uint32_t a[4] = {pack_bf16(p[2 * kk][0], p[2 * kk][1]),
                           pack_bf16(p[2 * kk][2], p[2 * kk][3]),
                           pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                           pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int dp = 0; dp < kHs / 16; ++dp) {
      uint32_t f[4];
      ldmatrix_x4_trans(f, base + kk * 16 * (kHs + kPad) + dp * 16);
      mma(acc[2 * dp], a, f[0], f[1]);
      mma(acc[2 * dp + 1], a, f[2], f[3]);
    }
  }
}

// Writes the warp's 16 × kHs accumulators times `scale` as bf16 to rows row0.. (row r at
// dst + r·ld), rows ≥ T skipped.
template <int kHs>
__device__ inline void store_rows(bf16_t* dst, int64_t ld, const float (&acc)[kHs / 8][4], int row0,
                                  int T, float scale_row_a, float scale_row_b) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + lane / 4 + 8 * half;
    if (row >= T) continue;
    const float scale = half == 0 ? scale_row_a : scale_row_b;
#pragma unroll
    for (int dt = 0; dt < kHs / 8; ++dt) {
      const __nv_bfloat162 v =
          __floats2bfloat162_rn(acc[dt][2 * half] * scale, acc[dt][2 * half + 1] * scale);
      *reinterpret_cast<__nv_bfloat162*>(dst + row * ld + dt * 8 + (lane % 4) * 2) = v;
    }
  }
}

// bf16 elements of one kTile-row tile in shared memory (padded rows).
template <int kHs>
__host__ __device__ constexpr int tile_elements() {
  return kTile * (kHs + kPad);
}

// ---- forward ---------------------------------------------------------------------------------
// Grid (B·NH, query tiles), the last query tile (the most key tiles) scheduled first. Shared:
// Q, then K and V in two stages each.
template <int kHs>
__global__ void __launch_bounds__(kThreads, kHs <= 64 ? 4 : 2)
    flash_forward_kernel(bf16_t* out, float* lse, const bf16_t* qkv, int T, int C, int NH,
                         float scale) {
  extern __shared__ __align__(16) unsigned char shared_raw[];
  constexpr int kElems = tile_elements<kHs>();
  bf16_t* sQ = reinterpret_cast<bf16_t*>(shared_raw);
  bf16_t* sK = sQ + kElems;      // [2][kElems]
  bf16_t* sV = sK + 2 * kElems;  // [2][kElems]
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t ld = 3 * static_cast<int64_t>(C);
  const bf16_t* q_base = qkv + static_cast<int64_t>(b) * T * ld + h * kHs;
  const bf16_t* k_base = q_base + C;
  const bf16_t* v_base = q_base + 2 * C;
  const float scale_log2 = scale * kLog2e;

  load_tile<kTile, kHs>(sQ, q_base + q0 * ld, ld, T - q0);
  load_tile<kTile, kHs>(sK, k_base, ld, T);
  load_tile<kTile, kHs>(sV, v_base, ld, T);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  uint32_t qf[kHs / 16][4];
  load_a_fragments<kHs>(qf, sQ + warp * 16 * (kHs + kPad));

  float o[kHs / 8][4] = {};
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};  // rows g, g + 8
  const int row_a = q0 + warp * 16 + lane / 4;
  const int key_tiles = q0 / kTile + 1;  // 0..diagonal; tile k0 ≤ q0 < T, so never empty
  for (int j = 0; j < key_tiles; ++j) {
    const int stage = j % 2, k0 = j * kTile;
    if (j + 1 < key_tiles) {  // prefetch the next K, V into the other stage
      load_tile<kTile, kHs>(sK + (1 - stage) * kElems, k_base + (k0 + kTile) * ld, ld,
                            T - k0 - kTile);
      load_tile<kTile, kHs>(sV + (1 - stage) * kElems, v_base + (k0 + kTile) * ld, ld,
                            T - k0 - kTile);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    float s[kTile / 8][4] = {};
    mma_abt<kHs, kTile / 8>(s, qf, sK + stage * kElems);
    if (j == key_tiles - 1) {  // the diagonal tile: keys past the query (and past T) masked
#pragma unroll
      for (int nt = 0; nt < kTile / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (k0 + nt * 8 + (lane % 4) * 2 + e % 2 > row_a + 8 * (e / 2)) s[nt][e] = -INFINITY;
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float m = row_max[half];
#pragma unroll
      for (int nt = 0; nt < kTile / 8; ++nt)
        m = fmaxf(m, fmaxf(s[nt][2 * half], s[nt][2 * half + 1]));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      // A row with every key so far masked keeps max −inf; subtract 0 then (all p are 0).
      const float m_scaled = m == -INFINITY ? 0.0f : m * scale_log2;
      const float rescale = exp2f(row_max[half] * scale_log2 - m_scaled);  // 0 on the first tile
      row_max[half] = m;
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < kTile / 8; ++nt)
#pragma unroll
        for (int e = 2 * half; e < 2 * half + 2; ++e) {
          s[nt][e] = exp2f(fmaf(s[nt][e], scale_log2, -m_scaled));
          sum += s[nt][e];
        }
      row_sum[half] = row_sum[half] * rescale + sum;  // this lane's part; the quad adds at the end
#pragma unroll
      for (int dt = 0; dt < kHs / 8; ++dt) {
        o[dt][2 * half] *= rescale;
        o[dt][2 * half + 1] *= rescale;
      }
    }
    mma_pb<kHs, kTile / 8>(o, s, sV + stage * kElems);
    __syncthreads();  // everyone is done with this stage before the next prefetch overwrites it
  }

  float inv_sum[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float sum = row_sum[half];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    inv_sum[half] = 1.0f / sum;
    const int row = row_a + 8 * half;
    if (lane % 4 == 0 && row < T)
      lse[static_cast<int64_t>(bh) * T + row] = row_max[half] * scale + logf(sum);
  }
  store_rows<kHs>(out + static_cast<int64_t>(b) * T * C + h * kHs, C, o, q0 + warp * 16, T,
                  inv_sum[0], inv_sum[1]);
}

// ---- backward --------------------------------------------------------------------------------
// D (B,NH,T) = Σ_d dO·O per row and head: one warp each, consecutive warps over the heads of one
// row (coalesced).
__global__ void flash_backward_dot_kernel(float* D, const bf16_t* dout, const bf16_t* out,
                                          int64_t rows, int T, int NH, int hs) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= rows) return;
  const int64_t bt = warp / NH;
  const int h = static_cast<int>(warp % NH);
  const int64_t at = bt * NH * hs + static_cast<int64_t>(h) * hs;  // (B,T,C) offset
  float dot = 0.0f;
  for (int i = lane; i < hs; i += 32)
    dot += __bfloat162float(dout[at + i]) * __bfloat162float(out[at + i]);
  for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
  const int64_t b = bt / T, t = bt % T;
  if (lane == 0) D[(b * NH + h) * T + t] = dot;
}

// dQ for one tile of 64 queries: dQ = scale · Σ_keys dS·K with P = exp(S·scale − lse),
// dS = P ∘ (dO·Vᵀ − D). Grid and shared memory as the forward, plus the dO tile.
template <int kHs>
__global__ void __launch_bounds__(kThreads)
    flash_backward_dq_kernel(bf16_t* dqkv, const bf16_t* dout, const bf16_t* qkv, const float* lse,
                             const float* D, int T, int C, int NH, float scale) {
  extern __shared__ __align__(16) unsigned char shared_raw[];
  constexpr int kElems = tile_elements<kHs>();
  bf16_t* sQ = reinterpret_cast<bf16_t*>(shared_raw);
  bf16_t* sdO = sQ + kElems;
  bf16_t* sK = sdO + kElems;     // [2][kElems]
  bf16_t* sV = sK + 2 * kElems;  // [2][kElems]
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t ld = 3 * static_cast<int64_t>(C);
  const bf16_t* q_base = qkv + static_cast<int64_t>(b) * T * ld + h * kHs;
  const bf16_t* k_base = q_base + C;
  const bf16_t* v_base = q_base + 2 * C;
  const bf16_t* do_base = dout + static_cast<int64_t>(b) * T * C + h * kHs;
  const float scale_log2 = scale * kLog2e;

  load_tile<kTile, kHs>(sQ, q_base + q0 * ld, ld, T - q0);
  load_tile<kTile, kHs>(sdO, do_base + q0 * static_cast<int64_t>(C), C, T - q0);
  load_tile<kTile, kHs>(sK, k_base, ld, T);
  load_tile<kTile, kHs>(sV, v_base, ld, T);
  cp_async_commit();
  const int row_a = q0 + warp * 16 + lane / 4;
  float lse_log2[2], row_dot[2];  // rows g, g + 8; rows past T are never stored
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row_a + 8 * half;
    lse_log2[half] = row < T ? lse[static_cast<int64_t>(bh) * T + row] * kLog2e : 0.0f;
    row_dot[half] = row < T ? D[static_cast<int64_t>(bh) * T + row] : 0.0f;
  }
  cp_async_wait<0>();
  __syncthreads();
  uint32_t qf[kHs / 16][4], dof[kHs / 16][4];
  load_a_fragments<kHs>(qf, sQ + warp * 16 * (kHs + kPad));
  load_a_fragments<kHs>(dof, sdO + warp * 16 * (kHs + kPad));

  float dq[kHs / 8][4] = {};
  const int key_tiles = q0 / kTile + 1;
  for (int j = 0; j < key_tiles; ++j) {
    const int stage = j % 2, k0 = j * kTile;
    if (j + 1 < key_tiles) {
      load_tile<kTile, kHs>(sK + (1 - stage) * kElems, k_base + (k0 + kTile) * ld, ld,
                            T - k0 - kTile);
      load_tile<kTile, kHs>(sV + (1 - stage) * kElems, v_base + (k0 + kTile) * ld, ld,
                            T - k0 - kTile);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    float s[kTile / 8][4] = {}, dp[kTile / 8][4] = {};
    mma_abt<kHs, kTile / 8>(s, qf, sK + stage * kElems);
    mma_abt<kHs, kTile / 8>(dp, dof, sV + stage * kElems);
    const bool diagonal = j == key_tiles - 1;
#pragma unroll
    for (int nt = 0; nt < kTile / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int half = e / 2;
        float p = exp2f(fmaf(s[nt][e], scale_log2, -lse_log2[half]));
        if (diagonal && k0 + nt * 8 + (lane % 4) * 2 + e % 2 > row_a + 8 * half) p = 0.0f;
        s[nt][e] = p * (dp[nt][e] - row_dot[half]);  // dS (without the scale)
      }
    mma_pb<kHs, kTile / 8>(dq, s, sK + stage * kElems);
    __syncthreads();
  }
  store_rows<kHs>(dqkv + static_cast<int64_t>(b) * T * ld + h * kHs, ld, dq, q0 + warp * 16, T,
                  scale, scale);
}

// dK, dV for one tile of 64 keys, looping over the query tiles (kQueryTile rows each) from the
// diagonal to T: with Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (each warp owns 16 keys), Pᵀ = exp(Sᵀ·scale −
// lse[query]), dV = Σ Pᵀ·dO, dSᵀ = Pᵀ ∘ (dPᵀ − D[query]), dK = scale · Σ dSᵀ·Q. Grid (B·NH, key
// tiles), key tile 0 (the most query tiles) first. Shared: K, V, then Q and dO in two stages,
// then lse and D of the query tile in two stages. The warp's K and V rows stay in registers as
// A fragments up to hs 64; at hs 128 they are re-read from shared memory (registers are full
// with the dK and dV accumulators).
template <int kHs>
__host__ __device__ constexpr int dkv_query_tile() {
  return 32;  // Sᵀ and dPᵀ in 2·16 registers each; 64 pushes hs 64 to 255 registers
}
template <int kHs>
__global__ void __launch_bounds__(kThreads)
    flash_backward_dkv_kernel(bf16_t* dqkv, const bf16_t* dout, const bf16_t* qkv, const float* lse,
                              const float* D, int T, int C, int NH, float scale) {
  constexpr int kQ = dkv_query_tile<kHs>();
  constexpr bool kFragmentsInRegisters = kHs <= 64;
  constexpr int kStride = kHs + kPad;
  extern __shared__ __align__(16) unsigned char shared_raw[];
  bf16_t* sK = reinterpret_cast<bf16_t*>(shared_raw);
  bf16_t* sV = sK + kTile * kStride;
  bf16_t* sQ = sV + kTile * kStride;                                // [2][kQ·kStride]
  bf16_t* sdO = sQ + 2 * kQ * kStride;                              // [2][kQ·kStride]
  float* s_lse = reinterpret_cast<float*>(sdO + 2 * kQ * kStride);  // [2][kQ]
  float* s_dot = s_lse + 2 * kQ;                                    // [2][kQ]
  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int k0 = static_cast<int>(blockIdx.y) * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t ld = 3 * static_cast<int64_t>(C);
  const bf16_t* q_base = qkv + static_cast<int64_t>(b) * T * ld + h * kHs;
  const bf16_t* k_base = q_base + C;
  const bf16_t* v_base = q_base + 2 * C;
  const bf16_t* do_base = dout + static_cast<int64_t>(b) * T * C + h * kHs;
  const float* lse_base = lse + static_cast<int64_t>(bh) * T;
  const float* dot_base = D + static_cast<int64_t>(bh) * T;
  const float scale_log2 = scale * kLog2e;

  // Stages the query rows q0.. into shared memory (rows past T zeroed; q0 < T).
  auto load_query_tile = [&](int q0, int stage) {
    load_tile<kQ, kHs>(sQ + stage * kQ * kStride, q_base + q0 * ld, ld, T - q0);
    load_tile<kQ, kHs>(sdO + stage * kQ * kStride, do_base + q0 * static_cast<int64_t>(C), C,
                       T - q0);
    if (threadIdx.x < kQ) {
      const int row = q0 + threadIdx.x;
      const bool valid = row < T;
      cp_async_4(s_lse + stage * kQ + threadIdx.x, lse_base + (valid ? row : q0), valid);
      cp_async_4(s_dot + stage * kQ + threadIdx.x, dot_base + (valid ? row : q0), valid);
    }
  };
  const int first_tile = k0 / kQ;  // the first query tile with a query ≥ k0 (kTile % kQ == 0)
  const int query_tiles = (T + kQ - 1) / kQ;
  load_tile<kTile, kHs>(sK, k_base + k0 * ld, ld, T - k0);
  load_tile<kTile, kHs>(sV, v_base + k0 * ld, ld, T - k0);
  load_query_tile(first_tile * kQ, 0);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  const bf16_t* my_k = sK + warp * 16 * kStride;
  const bf16_t* my_v = sV + warp * 16 * kStride;
  uint32_t kf[kFragmentsInRegisters ? kHs / 16 : 1][4], vf[kFragmentsInRegisters ? kHs / 16 : 1][4];
  if constexpr (kFragmentsInRegisters) {
    load_a_fragments<kHs>(kf, my_k);
    load_a_fragments<kHs>(vf, my_v);
  }

  float dk[kHs / 8][4] = {}, dv[kHs / 8][4] = {};
  const int key_a = k0 + warp * 16 + lane / 4;  // this lane's keys: key_a, key_a + 8
  for (int i = first_tile; i < query_tiles; ++i) {
    const int stage = (i - first_tile) % 2, q0 = i * kQ;
    if (i + 1 < query_tiles) load_query_tile(q0 + kQ, 1 - stage);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    float st[kQ / 8][4] = {}, dpt[kQ / 8][4] = {};  // Sᵀ, dPᵀ: rows keys, columns queries
    if constexpr (kFragmentsInRegisters) {
      mma_abt<kHs, kQ / 8>(st, kf, sQ + stage * kQ * kStride);
      mma_abt<kHs, kQ / 8>(dpt, vf, sdO + stage * kQ * kStride);
    } else {
      mma_abt_shared_a<kHs, kQ / 8>(st, my_k, sQ + stage * kQ * kStride);
      mma_abt_shared_a<kHs, kQ / 8>(dpt, my_v, sdO + stage * kQ * kStride);
    }
    // Masked: queries before a key of the tile (near the diagonal) and past T (the last tile).
    const bool masked = q0 < k0 + kTile || q0 + kQ > T;
    const float* tile_lse = s_lse + stage * kQ;
    const float* tile_dot = s_dot + stage * kQ;
#pragma unroll
    for (int nt = 0; nt < kQ / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = nt * 8 + (lane % 4) * 2 + e % 2, query = q0 + col;
        float p = exp2f(fmaf(st[nt][e], scale_log2, -tile_lse[col] * kLog2e));
        if (masked && (query < key_a + 8 * (e / 2) || query >= T)) p = 0.0f;
        st[nt][e] = p;
        dpt[nt][e] = p * (dpt[nt][e] - tile_dot[col]);  // dSᵀ (without the scale)
      }
    mma_pb<kHs, kQ / 8>(dv, st, sdO + stage * kQ * kStride);
    mma_pb<kHs, kQ / 8>(dk, dpt, sQ + stage * kQ * kStride);
    __syncthreads();
  }
  bf16_t* d_base = dqkv + static_cast<int64_t>(b) * T * ld + h * kHs;
  store_rows<kHs>(d_base + C, ld, dk, k0 + warp * 16, T, scale, scale);
  store_rows<kHs>(d_base + 2 * C, ld, dv, k0 + warp * 16, T, 1.0f, 1.0f);
}

// ---- host side -------------------------------------------------------------------------------
struct Shape {
  int T, C, NH, hs, tiles;
  unsigned bh;
};

Shape checked_shape(const char* what, int64_t B, int64_t T, int64_t C, int64_t NH) {
  KT_CHECK(B >= 1 && T >= 1 && NH >= 1 && C >= NH && C % NH == 0,
           std::string(what) + ": bad shape B=" + std::to_string(B) + " T=" + std::to_string(T) +
               " C=" + std::to_string(C) + " NH=" + std::to_string(NH));
  const int64_t hs = C / NH;
  if (!flash_attention_supported(hs))
    throw Error(std::string(what) + ": head size " + std::to_string(hs) +
                " (C=" + std::to_string(C) + ", NH=" + std::to_string(NH) +
                ") is not supported; the kernels are built for head sizes 32, 64 and 128");
  const int64_t tiles = (T + kTile - 1) / kTile;
  KT_CHECK(B * NH <= 2147483647 && tiles <= 65535 && B * T * 3 * C < (int64_t{1} << 40) &&
               T <= 2147483647 / 4,
           std::string(what) + ": shape too large for the grid: B=" + std::to_string(B) +
               " T=" + std::to_string(T) + " NH=" + std::to_string(NH));
  return {static_cast<int>(T),  static_cast<int>(C),     static_cast<int>(NH),
          static_cast<int>(hs), static_cast<int>(tiles), static_cast<unsigned>(B * NH)};
}

void check_aligned(const void* p, const char* what) {
  KT_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0,
           std::string(what) + ": bf16 tensors must be 16-byte aligned (cp.async)");
}

// Launches kernel<<<grid, kThreads, shared_bytes>>>, raising the dynamic shared memory limit
// first when it is over the default 48 KiB, and asking for the largest shared-memory carveout
// (the blocks per SM that the register counts allow need up to 4 × 45 KiB; L1 caching matters
// little here, the tiles arrive by cp.async.cg, which bypasses L1).
template <class Kernel, class... Args>
void launch(const Context& ctx, Kernel kernel, dim3 grid, int shared_bytes, Args... args) {
  if (shared_bytes > 48 * 1024)
    KT_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
  KT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     cudaSharedmemCarveoutMaxShared));
  kernel<<<grid, kThreads, shared_bytes, ctx.stream()>>>(args...);
  KT_CUDA_CHECK_LAUNCH();
}

template <int kHs>
void forward(const Context& ctx, bf16_t* out, float* lse, const bf16_t* qkv, const Shape& s) {
  const float scale = 1.0f / sqrtf(static_cast<float>(kHs));
  launch(ctx, flash_forward_kernel<kHs>, dim3(s.bh, s.tiles),
         5 * tile_elements<kHs>() * static_cast<int>(sizeof(bf16_t)), out, lse, qkv, s.T, s.C, s.NH,
         scale);
}

template <int kHs>
void backward(const Context& ctx, bf16_t* dqkv, const float* D, const bf16_t* dout,
              const bf16_t* qkv, const float* lse, const Shape& s) {
  const float scale = 1.0f / sqrtf(static_cast<float>(kHs));
  constexpr int kTileBytes = tile_elements<kHs>() * static_cast<int>(sizeof(bf16_t));
  launch(ctx, flash_backward_dq_kernel<kHs>, dim3(s.bh, s.tiles), 6 * kTileBytes, dqkv, dout, qkv,
         lse, D, s.T, s.C, s.NH, scale);
  constexpr int kQ = dkv_query_tile<kHs>();
  launch(ctx, flash_backward_dkv_kernel<kHs>, dim3(s.bh, s.tiles),
         (2 * kTile + 4 * kQ) * (kHs + kPad) * static_cast<int>(sizeof(bf16_t)) +
             4 * kQ * static_cast<int>(sizeof(float)),
         dqkv, dout, qkv, lse, D, s.T, s.C, s.NH, scale);
}

}  // namespace

bool flash_attention_supported(int64_t head_size) {
  return head_size == 32 || head_size == 64 || head_size == 128;
}

void attention_forward_bf16(const Context& ctx, bf16* out, float* lse, const bf16* qkv, int64_t B,
                            int64_t T, int64_t C, int64_t NH) {
  const Shape s = checked_shape("attention_forward_bf16", B, T, C, NH);
  check_aligned(qkv, "attention_forward_bf16 qkv");
  check_aligned(out, "attention_forward_bf16 out");
  switch (s.hs) {
    case 32:
      return forward<32>(ctx, native(out), lse, native(qkv), s);
    case 64:
      return forward<64>(ctx, native(out), lse, native(qkv), s);
    default:
      return forward<128>(ctx, native(out), lse, native(qkv), s);
  }
}

size_t attention_backward_bf16_scratch_bytes(int64_t B, int64_t T, int64_t C, int64_t NH) {
  (void)C;
  return static_cast<size_t>(B * NH * T) * sizeof(float);  // D (B,NH,T)
}

void attention_backward_bf16(const Context& ctx, bf16* dqkv, void* scratch, const bf16* dout,
                             const bf16* qkv, const bf16* out, const float* lse, int64_t B,
                             int64_t T, int64_t C, int64_t NH) {
  const Shape s = checked_shape("attention_backward_bf16", B, T, C, NH);
  check_aligned(dqkv, "attention_backward_bf16 dqkv");
  check_aligned(dout, "attention_backward_bf16 dout");
  check_aligned(qkv, "attention_backward_bf16 qkv");
  KT_CHECK(scratch != nullptr, "attention_backward_bf16: no scratch");
  float* D = static_cast<float*>(scratch);
  const int64_t rows = B * T * NH;
  constexpr int kDotBlock = 256;  // 8 rows per block
  const int64_t blocks = (rows * 32 + kDotBlock - 1) / kDotBlock;
  KT_CHECK(blocks <= 2147483647, "attention_backward_bf16: B·T·NH too large");
  flash_backward_dot_kernel<<<static_cast<unsigned>(blocks), kDotBlock, 0, ctx.stream()>>>(
      D, native(dout), native(out), rows, s.T, s.NH, s.hs);
  KT_CUDA_CHECK_LAUNCH();
  switch (s.hs) {
    case 32:
      return backward<32>(ctx, native(dqkv), D, native(dout), native(qkv), lse, s);
    case 64:
      return backward<64>(ctx, native(dqkv), D, native(dout), native(qkv), lse, s);
    default:
      return backward<128>(ctx, native(dqkv), D, native(dout), native(qkv), lse, s);
  }
}

}  // namespace kt::kernels::cuda

// CPU emulation of the parts of CUDA that the flash-attention kernels use
// (scripts/flash_sim/run.sh): one OS thread per CUDA thread, warp collectives through per-warp
// barriers. For indexing checks.
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

struct uint3s {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3s {
  unsigned x = 1, y = 1, z = 1;
};
thread_local uint3s threadIdx, blockIdx;
thread_local dim3s blockDim, gridDim;
#define __global__
#define __device__
#define __host__
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

struct __nv_bfloat16 {
  uint16_t bits;
};
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
inline uint16_t f2bf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float bf2f(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float __bfloat162float(__nv_bfloat16 x) {
  return bf2f(x.bits);
}
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return {{f2bf(a)}, {f2bf(b)}};
}

namespace sim {
struct Block {
  std::unique_ptr<std::barrier<>> block_bar;
  std::vector<std::unique_ptr<std::barrier<>>> warp_bar;
  std::vector<unsigned char> shared = std::vector<unsigned char>(1 << 18);
  // per-lane exchange slots
  struct Slot {
    const void* ptr;
    float f[4];
    uint32_t a[4];
    uint32_t b[2];
    float v;
  };
  std::vector<Slot> slots;
};
inline Block* g_block;
inline unsigned char* block_shared() {
  return g_block->shared.data();
}
inline void warp_sync() {
  g_block->warp_bar[threadIdx.x / 32]->arrive_and_wait();
}
inline Block::Slot& my_slot() {
  return g_block->slots[threadIdx.x];
}
inline Block::Slot& lane_slot(int lane) {
  return g_block->slots[(threadIdx.x / 32) * 32 + lane];
}

template <class Fn>
void launch(dim3s grid, unsigned threads, Fn fn) {
  for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      Block blk;
      blk.block_bar = std::make_unique<std::barrier<>>(threads);
      for (unsigned w = 0; w < threads / 32; ++w)
        blk.warp_bar.push_back(std::make_unique<std::barrier<>>(32));
      blk.slots.resize(threads);
      std::memset(blk.shared.data(), 0xff, blk.shared.size());  // poison shared memory (NaN bf16)
      g_block = &blk;
      std::vector<std::thread> ts;
      for (unsigned t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
          threadIdx.x = t;
          blockIdx.x = bx;
          blockIdx.y = by;
          blockDim.x = threads;
          gridDim.x = grid.x;
          gridDim.y = grid.y;
          fn();
        });
      for (auto& th : ts) th.join();
    }
}
}  // namespace sim

inline void __syncthreads() {
  sim::g_block->block_bar->arrive_and_wait();
}
inline float __shfl_xor_sync(unsigned, float v, int m) {
  sim::my_slot().v = v;
  sim::warp_sync();
  const float r = sim::lane_slot((threadIdx.x % 32) ^ m).v;
  sim::warp_sync();
  return r;
}

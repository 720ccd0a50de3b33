// ---- emulated PTX wrappers ----
// cp.async: each copy is queued in the thread's open group and done only when a wait retires its
// group (as late as the hardware may), so a read that misses its wait or barrier sees stale data.
struct PendingCopy {
  void* dst;
  const void* src;
  int bytes;
  bool valid;
};
thread_local std::vector<PendingCopy> t_open_group;
thread_local std::vector<std::vector<PendingCopy>> t_committed;
__device__ inline void cp_async_16(void* dst, const void* src, bool valid) {
  t_open_group.push_back({dst, src, 16, valid});
}
__device__ inline void cp_async_4(void* dst, const void* src, bool valid) {
  t_open_group.push_back({dst, src, 4, valid});
}
__device__ inline void cp_async_commit() {
  t_committed.push_back(std::move(t_open_group));
  t_open_group.clear();
}
template <int kPending>
__device__ inline void cp_async_wait() {
  while (t_committed.size() > size_t(kPending)) {
    for (const PendingCopy& c : t_committed.front())
      if (c.valid)
        std::memcpy(c.dst, c.src, c.bytes);
      else
        std::memset(c.dst, 0, c.bytes);
    t_committed.erase(t_committed.begin());
  }
}
inline uint16_t elem(const void* row, int col) {
  return static_cast<const uint16_t*>(row)[col];
}
inline void ldmatrix_impl(uint32_t (&r)[4], const bf16_t* p, bool trans) {
  const int lane = threadIdx.x % 32;
  sim::my_slot().ptr = p;
  sim::warp_sync();
  for (int i = 0; i < 4; ++i) {
    uint16_t lo, hi;
    if (!trans) {
      const void* row = sim::lane_slot(8 * i + lane / 4).ptr;
      lo = elem(row, 2 * (lane % 4));
      hi = elem(row, 2 * (lane % 4) + 1);
    } else {
      lo = elem(sim::lane_slot(8 * i + 2 * (lane % 4)).ptr, lane / 4);
      hi = elem(sim::lane_slot(8 * i + 2 * (lane % 4) + 1).ptr, lane / 4);
    }
    r[i] = uint32_t(lo) | (uint32_t(hi) << 16);
  }
  sim::warp_sync();
}
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const bf16_t* p) {
  ldmatrix_impl(r, p, false);
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16_t* p) {
  ldmatrix_impl(r, p, true);
}
inline float half_of(uint32_t v, int which) {
  return bf2f(which ? uint16_t(v >> 16) : uint16_t(v & 0xffff));
}
__device__ inline void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  auto& s = sim::my_slot();
  for (int i = 0; i < 4; ++i) s.a[i] = a[i];
  s.b[0] = b0;
  s.b[1] = b1;
  sim::warp_sync();
  auto A = [&](int r, int k) {
    return half_of(sim::lane_slot((r % 8) * 4 + (k % 8) / 2).a[(k >= 8) * 2 + (r >= 8)], k % 2);
  };
  auto B = [&](int k, int n) {
    return half_of(sim::lane_slot(n * 4 + (k % 8) / 2).b[k / 8], k % 2);
  };
  float out[4];
  for (int e = 0; e < 4; ++e) {
    const int r = g + 8 * (e / 2), n = 2 * c + e % 2;
    double acc = d[e];
    for (int k = 0; k < 16; ++k) acc += double(A(r, k)) * double(B(k, n));
    out[e] = float(acc);
  }
  sim::warp_sync();
  for (int e = 0; e < 4; ++e) d[e] = out[e];
}
__device__ inline uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return uint32_t(v.x.bits) | (uint32_t(v.y.bits) << 16);
}

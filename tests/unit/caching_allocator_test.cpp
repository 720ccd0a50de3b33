// The caching allocator's bookkeeping with a fake raw allocator (no GPU): rounding, reuse,
// splitting and merging, the steady state of a training step, statistics by kind, and the
// out-of-memory path.
#include "worker/caching_allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <vector>

#include "api/error.h"

namespace kt::worker {
namespace {

// Hands out real (aligned) host memory up to a capacity and records every call.
class FakeRaw {
 public:
  explicit FakeRaw(size_t capacity = SIZE_MAX) : capacity_(capacity) {}
  ~FakeRaw() { EXPECT_TRUE(live_.empty()) << "the allocator leaked raw segments"; }
  RawMemory memory() {
    return {[this](size_t bytes) -> void* {
              ++allocations;
              if (held_ + bytes > capacity_) return nullptr;
              void* p = std::aligned_alloc(4096, bytes);
              live_[p] = bytes;
              held_ += bytes;
              return p;
            },
            [this](void* p) {
              ++releases;
              held_ -= live_.at(p);
              live_.erase(p);
              std::free(p);
            }};
  }
  size_t held() const { return held_; }
  int allocations = 0, releases = 0;

 private:
  size_t capacity_;
  size_t held_ = 0;
  std::map<void*, size_t> live_;
};

constexpr size_t MiB = size_t{1} << 20;

TEST(CachingAllocator, RoundsTo512BytesAndSegmentsTo2MiB) {
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(512), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::segment_size(512), 2 * MiB);      // small pool
  EXPECT_EQ(CachingAllocator::segment_size(1 * MiB), 2 * MiB);  // still small
  EXPECT_EQ(CachingAllocator::segment_size(1 * MiB + 512), 2 * MiB);
  EXPECT_EQ(CachingAllocator::segment_size(5 * MiB), 6 * MiB);
  EXPECT_EQ(CachingAllocator::segment_size(6 * MiB), 6 * MiB);
}

TEST(CachingAllocator, SmallRequestsShareOneSegmentWithoutOverlap) {
  FakeRaw raw;
  {
    CachingAllocator alloc("test", raw.memory());
    std::vector<char*> blocks;
    for (size_t bytes : {100, 1000, 600, 4096}) {
      char* p = static_cast<char*>(alloc.allocate(bytes, MemoryKind::kActivations));
      std::fill(p, p + bytes, 0x5a);  // the memory is really usable
      blocks.push_back(p);
    }
    EXPECT_EQ(raw.allocations, 1);
    // Consecutive carving: 512 + 1024 + 1024 + 4096 bytes, each 512-aligned.
    EXPECT_EQ(blocks[1] - blocks[0], 512);
    EXPECT_EQ(blocks[2] - blocks[1], 1024);
    EXPECT_EQ(blocks[3] - blocks[2], 1024);
    for (char* p : blocks) EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 512, 0u);
    for (char* p : blocks) alloc.deallocate(p);
  }
  EXPECT_EQ(raw.releases, 1);
}

TEST(CachingAllocator, FreedBlockIsReusedWithoutRawAllocation) {
  FakeRaw raw;
  CachingAllocator alloc("test", raw.memory());
  void* a = alloc.allocate(10 * MiB, MemoryKind::kParams);
  alloc.deallocate(a);
  void* b = alloc.allocate(10 * MiB - 100, MemoryKind::kGrads);
  EXPECT_EQ(a, b);
  EXPECT_EQ(raw.allocations, 1);
  const AllocatorStats s = alloc.stats();
  EXPECT_EQ(s.requests, 2u);
  EXPECT_EQ(s.cache_hits, 1u);
  alloc.deallocate(b);
}

TEST(CachingAllocator, LargeBlockSplitsAndTheTailServesTheNextRequest) {
  FakeRaw raw;
  CachingAllocator alloc("test", raw.memory());
  char* a = static_cast<char*>(alloc.allocate(10 * MiB, MemoryKind::kParams));
  alloc.deallocate(a);
  char* b = static_cast<char*>(alloc.allocate(6 * MiB, MemoryKind::kParams));  // split: 4 MiB left
  char* c = static_cast<char*>(alloc.allocate(3 * MiB, MemoryKind::kParams));  // from the tail
  EXPECT_EQ(b, a);
  EXPECT_EQ(c, a + 6 * MiB);
  EXPECT_EQ(raw.allocations, 1);
  // A remainder ≤ 1 MiB is not split off in the large pool: the block keeps it.
  char* d = static_cast<char*>(alloc.allocate(2 * MiB, MemoryKind::kParams));  // new segment
  EXPECT_EQ(raw.allocations, 2);
  EXPECT_EQ(alloc.stats().in_use_total, 6 * MiB + 4 * MiB + 2 * MiB);
  for (char* p : {b, c, d}) alloc.deallocate(p);
}

TEST(CachingAllocator, FreedNeighboursMergeSoTheSegmentCanBeReleased) {
  FakeRaw raw;
  CachingAllocator alloc("test", raw.memory());
  void* a = alloc.allocate(MiB / 2, MemoryKind::kWorkspace);
  void* b = alloc.allocate(MiB / 2, MemoryKind::kWorkspace);
  void* c = alloc.allocate(MiB / 2, MemoryKind::kWorkspace);
  EXPECT_EQ(raw.allocations, 1);
  alloc.deallocate(a);
  alloc.deallocate(c);  // c merges with the free tail
  alloc.release_cached();
  EXPECT_EQ(raw.releases, 0) << "segment still holds b";
  alloc.deallocate(b);  // merges with both sides: one free 2 MiB block
  // A request for the whole segment is served from the merged block.
  void* whole = alloc.allocate(MiB, MemoryKind::kWorkspace);
  EXPECT_EQ(whole, a);
  EXPECT_EQ(raw.allocations, 1);
  alloc.deallocate(whole);
  alloc.release_cached();
  EXPECT_EQ(raw.releases, 1);
  EXPECT_EQ(raw.held(), 0u);
  const AllocatorStats s = alloc.stats();
  EXPECT_EQ(s.reserved_bytes, 0u);
  EXPECT_EQ(s.cached_bytes, 0u);
}

TEST(CachingAllocator, TrainingStepsAfterWarmupMakeNoRawCalls) {
  FakeRaw raw;
  CachingAllocator alloc("test", raw.memory());
  // One "step": activations of several sizes allocated in order, freed in reverse, plus a
  // short-lived workspace in the middle (GPT-2-like proportions, scaled down).
  const std::vector<size_t> sizes = {3 * MiB, 768 * 4, 12 * MiB, 50 * 1024, 3 * MiB, 7 * MiB + 3};
  auto step = [&] {
    std::vector<void*> held;
    for (size_t s : sizes) {
      held.push_back(alloc.allocate(s, MemoryKind::kActivations));
      void* scratch = alloc.allocate(s / 2 + 1, MemoryKind::kWorkspace);
      alloc.deallocate(scratch);
    }
    for (auto it = held.rbegin(); it != held.rend(); ++it) alloc.deallocate(*it);
  };
  step();
  const int warm_allocations = raw.allocations;
  for (int i = 0; i < 5; ++i) step();
  EXPECT_EQ(raw.allocations, warm_allocations);
  EXPECT_EQ(raw.releases, 0);
  const AllocatorStats s = alloc.stats();
  EXPECT_EQ(s.requests, 6 * 2 * sizes.size());
  EXPECT_EQ(s.requests - s.cache_hits, static_cast<size_t>(warm_allocations));
}

TEST(CachingAllocator, StatsCountBytesInUseByKind) {
  FakeRaw raw;
  CachingAllocator alloc("test", raw.memory());
  void* p = alloc.allocate(4 * MiB, MemoryKind::kParams);
  void* g = alloc.allocate(4 * MiB, MemoryKind::kGrads);
  void* o = alloc.allocate(1000, MemoryKind::kOptimizer);
  AllocatorStats s = alloc.stats();
  EXPECT_EQ(s.in_use_bytes[MemoryKind::kParams], 4 * MiB);
  EXPECT_EQ(s.in_use_bytes[MemoryKind::kGrads], 4 * MiB);
  EXPECT_EQ(s.in_use_bytes[MemoryKind::kOptimizer], 1024u);
  EXPECT_EQ(s.in_use_total, 8 * MiB + 1024);
  EXPECT_EQ(s.reserved_bytes, 4 * MiB + 4 * MiB + 2 * MiB);
  EXPECT_EQ(s.cached_bytes, s.reserved_bytes - s.in_use_total);
  alloc.deallocate(g);
  s = alloc.stats();
  EXPECT_EQ(s.in_use_bytes[MemoryKind::kGrads], 0u);
  EXPECT_EQ(s.cached_bytes, s.reserved_bytes - s.in_use_total);
  alloc.deallocate(p);
  alloc.deallocate(o);
}

TEST(CachingAllocator, OutOfMemoryReleasesTheCacheAndRetriesThenThrows) {
  FakeRaw raw(10 * MiB);
  CachingAllocator alloc("cuda:0", raw.memory());
  void* a = alloc.allocate(6 * MiB, MemoryKind::kParams);
  alloc.deallocate(a);  // cached: 6 MiB held
  // 8 MiB does not fit the 6 MiB block nor beside it: the cache is released and the retry works.
  void* b = alloc.allocate(8 * MiB, MemoryKind::kParams);
  EXPECT_EQ(raw.releases, 1);
  EXPECT_EQ(alloc.stats().reserved_bytes, 8 * MiB);
  try {
    alloc.allocate(4 * MiB, MemoryKind::kActivations);
    ADD_FAILURE() << "expected out of memory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0: out of memory allocating 4194304 bytes"),
              std::string::npos)
        << e.what();
  }
  alloc.deallocate(b);
}

TEST(CachingAllocator, RejectsUnknownPointers) {
  FakeRaw raw;
  CachingAllocator alloc("test", raw.memory());
  int local = 0;
  EXPECT_THROW(alloc.deallocate(&local), Error);
  void* p = alloc.allocate(100, MemoryKind::kWorkspace);
  alloc.deallocate(p);
  EXPECT_THROW(alloc.deallocate(p), Error);  // double free
}

}  // namespace
}  // namespace kt::worker

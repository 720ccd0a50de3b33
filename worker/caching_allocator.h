// A caching allocator for device (and pinned host) memory, in the manner of PyTorch's CUDA
// caching allocator: memory comes from the raw allocator (cudaMalloc, cudaHostAlloc) in segments
// and goes back into size-ordered free lists instead of being freed, so a training step after the
// first one calls neither cudaMalloc nor cudaFree (both synchronise the device).
//
// Plain C++ with the raw allocate/release functions injected: tests/unit/caching_allocator_test
// checks the bookkeeping without a GPU. Rules:
//  * sizes round up to 512 bytes (every block is 512-byte aligned within its segment);
//  * requests ≤ 1 MiB come from a small pool carved from 2 MiB segments; larger requests from a
//    large pool of segments rounded up to 2 MiB;
//  * a free block is split when the remainder is worth keeping (≥ 512 bytes in the small pool,
//    > 1 MiB in the large pool), and freed neighbours in one segment merge again;
//  * when the raw allocator fails, whole free segments are released and the request retried once;
//    then it throws kt::Error with the allocator's numbers.
// Streams: blocks are reused in program order, which is safe for work on one stream (the compute
// stream). Memory handed to another stream must not be freed before that stream's work on it is
// done (the owner records an event and waits, as the offload engine does).
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

#include "worker/memory_kind.h"

namespace kt::worker {

struct RawMemory {
  std::function<void*(size_t bytes)> allocate;  // returns nullptr when out of memory
  std::function<void(void* ptr)> release;
};

struct AllocatorStats {
  std::map<MemoryKind, size_t> in_use_bytes;  // by kind, rounded sizes of live blocks
  size_t in_use_total = 0;
  size_t reserved_bytes = 0;  // held from the raw allocator (in use + cached)
  size_t cached_bytes = 0;    // reserved but free
  size_t raw_allocations = 0, raw_releases = 0;
  size_t requests = 0, cache_hits = 0;  // hits: served without a raw allocation
};

class CachingAllocator {
 public:
  static constexpr size_t kAlignment = 512;
  static constexpr size_t kSmallLimit = size_t{1} << 20;     // ≤ this: small pool
  static constexpr size_t kSmallSegment = size_t{2} << 20;   // small pool segment size
  static constexpr size_t kLargeRounding = size_t{2} << 20;  // large segments are multiples

  // `name` appears in error messages ("cuda:0", "pinned host").
  CachingAllocator(std::string name, RawMemory raw);
  ~CachingAllocator();  // releases every segment to the raw allocator
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  static size_t round_size(size_t bytes);
  // Bytes asked of the raw allocator for a request of `rounded` bytes that no free block fits.
  static size_t segment_size(size_t rounded);

  void* allocate(size_t bytes, MemoryKind kind);  // bytes > 0
  void deallocate(void* ptr);                     // throws kt::Error for an unknown pointer
  void release_cached();  // returns whole free segments to the raw allocator
  AllocatorStats stats() const;

 private:
  struct Block {
    char* ptr;
    size_t size;
    bool small;
    bool free = true;
    MemoryKind kind = MemoryKind::kWorkspace;
    Block* prev = nullptr;  // neighbours within the same segment
    Block* next = nullptr;
  };
  struct BySizeThenAddress {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
    }
  };
  using Pool = std::set<Block*, BySizeThenAddress>;

  Block* take_free_block(Pool& pool, size_t rounded);
  void release_cached_locked();

  std::string name_;
  RawMemory raw_;
  mutable std::mutex mutex_;
  Pool small_pool_, large_pool_;
  std::unordered_map<void*, Block*> live_;  // allocated blocks by pointer
  std::set<Block*> segments_;               // the first block of every segment
  AllocatorStats stats_;
};

}  // namespace kt::worker

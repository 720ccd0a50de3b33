#include "worker/caching_allocator.h"

#include <exception>
#include <utility>

#include "api/error.h"

namespace kt::worker {

CachingAllocator::CachingAllocator(std::string name, RawMemory raw)
    : name_(std::move(name)), raw_(std::move(raw)) {}

CachingAllocator::~CachingAllocator() {
  for (Block* head : segments_) {
    try {
      raw_.release(head->ptr);
    } catch (const std::exception&) {  // at teardown (a dead device) there is no one to tell
    }
    for (Block* b = head; b;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
  }
}

size_t CachingAllocator::round_size(size_t bytes) {
  if (bytes == 0) bytes = 1;
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

size_t CachingAllocator::segment_size(size_t rounded) {
  if (rounded <= kSmallLimit) return kSmallSegment;
  return (rounded + kLargeRounding - 1) / kLargeRounding * kLargeRounding;
}

CachingAllocator::Block* CachingAllocator::take_free_block(Pool& pool, size_t rounded) {
  Block key{nullptr, rounded, false};
  auto it = pool.lower_bound(&key);  // smallest block that fits (best fit)
  if (it == pool.end()) return nullptr;
  Block* block = *it;
  pool.erase(it);
  return block;
}

void* CachingAllocator::allocate(size_t bytes, MemoryKind kind) {
  std::lock_guard lock(mutex_);
  const size_t rounded = round_size(bytes);
  const bool small = rounded <= kSmallLimit;
  Pool& pool = small ? small_pool_ : large_pool_;
  ++stats_.requests;

  Block* block = take_free_block(pool, rounded);
  if (block) {
    ++stats_.cache_hits;
  } else {
    const size_t segment = segment_size(rounded);
    void* ptr = raw_.allocate(segment);
    if (!ptr) {  // give back what is cached, then try once more
      release_cached_locked();
      ptr = raw_.allocate(segment);
    }
    if (!ptr)
      throw Error(name_ + ": out of memory allocating " + std::to_string(bytes) + " bytes (" +
                  std::to_string(segment) + " byte segment); in use " +
                  std::to_string(stats_.in_use_total) + " bytes, reserved " +
                  std::to_string(stats_.reserved_bytes) + " bytes");
    ++stats_.raw_allocations;
    stats_.reserved_bytes += segment;
    stats_.cached_bytes += segment;
    block = new Block{static_cast<char*>(ptr), segment, small};
    segments_.insert(block);
  }

  // Split off the tail when it is worth keeping.
  const size_t remainder = block->size - rounded;
  if (small ? remainder >= kAlignment : remainder > kSmallLimit) {
    Block* tail = new Block{block->ptr + rounded, remainder, small};
    tail->prev = block;
    tail->next = block->next;
    if (block->next) block->next->prev = tail;
    block->next = tail;
    block->size = rounded;
    pool.insert(tail);
  }

  block->free = false;
  block->kind = kind;
  live_[block->ptr] = block;
  stats_.in_use_bytes[kind] += block->size;
  stats_.in_use_total += block->size;
  stats_.cached_bytes -= block->size;
  return block->ptr;
}

void CachingAllocator::deallocate(void* ptr) {
  if (!ptr) return;
  std::lock_guard lock(mutex_);
  auto it = live_.find(ptr);
  if (it == live_.end())
    throw Error(name_ + ": deallocate of a pointer this allocator did not hand out");
  Block* block = it->second;
  live_.erase(it);
  stats_.in_use_bytes[block->kind] -= block->size;
  stats_.in_use_total -= block->size;
  stats_.cached_bytes += block->size;
  block->free = true;

  Pool& pool = block->small ? small_pool_ : large_pool_;
  // Merge with free neighbours of the same segment.
  if (Block* next = block->next; next && next->free) {
    pool.erase(next);
    block->size += next->size;
    block->next = next->next;
    if (next->next) next->next->prev = block;
    delete next;
  }
  if (Block* prev = block->prev; prev && prev->free) {
    pool.erase(prev);
    prev->size += block->size;
    prev->next = block->next;
    if (block->next) block->next->prev = prev;
    delete block;
    block = prev;
  }
  pool.insert(block);
}

void CachingAllocator::release_cached() {
  std::lock_guard lock(mutex_);
  release_cached_locked();
}

void CachingAllocator::release_cached_locked() {
  for (auto it = segments_.begin(); it != segments_.end();) {
    Block* head = *it;
    if (head->free && !head->next) {  // the whole segment is one free block
      (head->small ? small_pool_ : large_pool_).erase(head);
      raw_.release(head->ptr);
      ++stats_.raw_releases;
      stats_.reserved_bytes -= head->size;
      stats_.cached_bytes -= head->size;
      delete head;
      it = segments_.erase(it);
    } else {
      ++it;
    }
  }
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace kt::worker

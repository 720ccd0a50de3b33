// The CUDA runtime calls the CUDA model makes, emulated on the host for gpu_tests' model tests
// (tests/emulation/README.md): "device" memory is host memory, every copy and memset happens at
// once, and every operation is complete when enqueued. Declared by the toolkit's own
// cuda_runtime_api.h, so the signatures are the real ones; linked instead of libcudart.
//
// Alongside, the stream-order checker of stream_order.h: vector clocks for streams, events and
// the host, and a shadow of every allocation (intervals of bytes with their last write and the
// reads since), so an access that only happens to be right because everything here runs in issue
// order is reported.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "tests/emulation/stream_order.h"
#include "worker/host_access.h"

namespace kt::emulation {
namespace {

using Clock = std::vector<uint64_t>;  // one counter per agent (stream or the host)

void join(Clock& into, const Clock& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (size_t i = 0; i < from.size(); ++i) into[i] = std::max(into[i], from[i]);
}

// An access: who made it, at which of its own ticks, and what it was.
struct Epoch {
  int agent = -1;  // -1: nobody yet
  uint64_t tick = 0;
  const char* what = nullptr;
  bool operator==(const Epoch& o) const {
    return agent == o.agent && tick == o.tick && what == o.what;
  }
};

// True when the access `e` is ordered before an operation that has seen `clock`.
bool ordered_before(const Epoch& e, const Clock& clock) {
  return e.agent < 0 || (static_cast<size_t>(e.agent) < clock.size() && e.tick <= clock[e.agent]);
}

struct Agent {
  int id;
  Clock clock;
  bool blocking = false;  // a stream that synchronises with the legacy default stream
};

// Bytes [start, end) with one history: keyed by start in State::shadow.
struct Segment {
  uintptr_t end;
  Epoch write;
  std::vector<Epoch> reads;  // since the write, one per agent
  bool operator==(const Segment& o) const { return write == o.write && reads == o.reads; }
};

struct State {
  std::mutex mutex;
  int next_agent = 2;
  Agent host{0, {}};
  Agent legacy{1, {}, true};  // the legacy default stream (stream 0)
  std::map<cudaStream_t, Agent> streams;
  std::map<cudaEvent_t, Clock> events;
  std::map<uintptr_t, size_t> allocations;  // start → bytes
  std::map<uintptr_t, Segment> shadow;
  std::set<std::tuple<std::string, std::string, bool, bool>> reported;
  size_t races = 0;
};

State& state() {
  static State s;
  return s;
}

std::string agent_name(int id) {
  if (id == 0) return "the host";
  if (id == 1) return "the legacy default stream";
  return "stream " + std::to_string(id);
}

Agent& agent_of(State& s, cudaStream_t stream) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread)
    return s.legacy;
  const auto it = s.streams.find(stream);
  if (it == s.streams.end()) {
    std::fprintf(stderr, "emulated CUDA: operation on an unknown stream %p\n",
                 static_cast<void*>(stream));
    std::abort();
  }
  return it->second;
}

void tick(Agent& a) {
  if (a.clock.size() <= static_cast<size_t>(a.id)) a.clock.resize(a.id + 1, 0);
  ++a.clock[a.id];
}

// Work enqueued on `a` now: after what the host has synchronised with, and (legacy semantics)
// after the other side of the legacy default stream.
void enqueue(State& s, Agent& a) {
  join(a.clock, s.host.clock);
  if (&a == &s.legacy) {
    for (auto& [handle, other] : s.streams)
      if (other.blocking) join(a.clock, other.clock);
  } else if (a.blocking) {
    join(a.clock, s.legacy.clock);
  }
  tick(a);
}

void report(State& s, const Epoch& earlier, bool earlier_write, const Epoch& now, bool now_write,
            uintptr_t at, uintptr_t end) {
  ++s.races;
  if (!s.reported.emplace(earlier.what, now.what, earlier_write, now_write).second) return;
  const auto alloc = std::prev(s.allocations.upper_bound(at));
  std::fflush(stdout);  // after the test lines printed so far
  std::fprintf(stderr,
               "STREAM-ORDER RACE: %s on %s %s bytes [%zu, %zu) of a %zu-byte allocation that %s "
               "on %s %s, with nothing ordering the two (an event wait or a synchronize)\n",
               now.what, agent_name(now.agent).c_str(), now_write ? "writes" : "reads",
               static_cast<size_t>(at - alloc->first), static_cast<size_t>(end - alloc->first),
               alloc->second, earlier.what, agent_name(earlier.agent).c_str(),
               earlier_write ? "wrote" : "read");
}

// Segment boundaries at `at` (when a segment spans it).
void split(State& s, uintptr_t at) {
  auto it = s.shadow.upper_bound(at);
  if (it == s.shadow.begin()) return;
  --it;
  if (it->first < at && at < it->second.end) {
    Segment tail = it->second;
    it->second.end = at;
    s.shadow.emplace(at, std::move(tail));
  }
}

void merge_equal_neighbours(State& s, uintptr_t from, uintptr_t to) {
  auto it = s.shadow.upper_bound(from);
  if (it != s.shadow.begin()) --it;
  while (it != s.shadow.end() && it->first <= to) {
    auto next = std::next(it);
    if (next != s.shadow.end() && it->second.end == next->first && it->second == next->second) {
      it->second.end = next->second.end;
      s.shadow.erase(next);
    } else {
      it = next;
    }
  }
}

void access(State& s, const Access& a, const Epoch& now, const Clock& clock) {
  if (a.ptr == nullptr || a.bytes == 0) return;
  const auto start = reinterpret_cast<uintptr_t>(a.ptr);
  auto alloc = s.allocations.upper_bound(start);
  if (alloc == s.allocations.begin()) return;  // not memory the runtime handed out
  --alloc;
  const uintptr_t alloc_end = alloc->first + alloc->second;
  if (start >= alloc_end) return;
  const uintptr_t end = std::min(start + a.bytes, alloc_end);
  split(s, start);
  split(s, end);
  // Cover gaps (bytes nobody touched yet) with fresh segments.
  auto it = s.shadow.lower_bound(start);
  for (uintptr_t pos = start; pos < end;) {
    if (it == s.shadow.end() || it->first > pos) {
      const uintptr_t gap_end = it == s.shadow.end() ? end : std::min(end, it->first);
      it = s.shadow.emplace_hint(it, pos, Segment{gap_end, {}, {}});
    }
    pos = it->second.end;
    ++it;
  }
  for (it = s.shadow.lower_bound(start); it != s.shadow.end() && it->first < end; ++it) {
    Segment& seg = it->second;
    if (!ordered_before(seg.write, clock))
      report(s, seg.write, true, now, a.write, it->first, seg.end);
    if (a.write) {
      for (const Epoch& r : seg.reads)
        if (!ordered_before(r, clock)) report(s, r, false, now, true, it->first, seg.end);
      seg.write = now;
      seg.reads.clear();
    } else {
      auto mine = std::find_if(seg.reads.begin(), seg.reads.end(),
                               [&](const Epoch& r) { return r.agent == now.agent; });
      if (mine == seg.reads.end())
        seg.reads.push_back(now);
      else
        *mine = now;
    }
  }
  merge_equal_neighbours(s, start, end);
}

void operation(cudaStream_t stream, const char* what, const Access* first, const Access* last) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  Agent& a = agent_of(s, stream);
  enqueue(s, a);
  const Epoch now{a.id, a.clock[a.id], what};
  for (const Access* p = first; p != last; ++p) access(s, *p, now, a.clock);
}

void host_waits_for_everything(State& s) {
  join(s.host.clock, s.legacy.clock);
  for (auto& [handle, a] : s.streams) join(s.host.clock, a.clock);
}

void track(void* ptr, size_t bytes) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  s.allocations[reinterpret_cast<uintptr_t>(ptr)] = bytes;
}

// cudaFree and cudaFreeHost synchronise the device first, then the bytes have no history.
void untrack(void* ptr) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  host_waits_for_everything(s);
  const auto alloc = s.allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (alloc == s.allocations.end()) return;
  const uintptr_t start = alloc->first, end = start + alloc->second;
  split(s, start);
  split(s, end);
  s.shadow.erase(s.shadow.lower_bound(start), s.shadow.lower_bound(end));
  s.allocations.erase(alloc);
}

}  // namespace

void device_op(CUstream_st* stream, const char* what, std::initializer_list<Access> accesses) {
  operation(stream, what, accesses.begin(), accesses.end());
}
void device_op(CUstream_st* stream, const char* what, const std::vector<Access>& accesses) {
  operation(stream, what, accesses.data(), accesses.data() + accesses.size());
}
void host_access(const char* what, Access a) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  tick(s.host);
  access(s, a, Epoch{s.host.id, s.host.clock[s.host.id], what}, s.host.clock);
}
size_t stream_order_races() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return s.races;
}

}  // namespace kt::emulation

// The worker's hook for its host accesses (worker/host_access.h), which it declares and the
// emulation supplies, so no worker header depends on tests/.
void kt::worker::emulated_host_access(const char* what, const void* ptr, size_t bytes, bool write) {
  kt::emulation::host_access(what, {ptr, bytes, write});
}

namespace {
namespace em = kt::emulation;
thread_local cudaError_t g_last = cudaSuccess;

cudaError_t ok() {
  return cudaSuccess;
}

// A stream or event handle (a token from `new char`) and its entry in the checker's state.
template <class Map, class Handle>
cudaError_t destroy(Map em::State::*entries, Handle handle) {
  {
    auto& s = em::state();
    std::lock_guard lock(s.mutex);
    (s.*entries).erase(handle);
  }
  delete reinterpret_cast<char*>(handle);
  return ok();
}

const char* copy_name(cudaMemcpyKind kind, bool async) {
  switch (kind) {
    case cudaMemcpyHostToDevice:
      return async ? "cudaMemcpyAsync host→device" : "cudaMemcpy host→device";
    case cudaMemcpyDeviceToHost:
      return async ? "cudaMemcpyAsync device→host" : "cudaMemcpy device→host";
    case cudaMemcpyDeviceToDevice:
      return async ? "cudaMemcpyAsync device→device" : "cudaMemcpy device→device";
    default:
      return async ? "cudaMemcpyAsync" : "cudaMemcpy";
  }
}
}  // namespace

extern "C" {

// KT_EMULATED_GPUS: how many devices to report (default 1; all are the same host memory).
cudaError_t CUDARTAPI cudaGetDeviceCount(int* count) {
  const char* env = std::getenv("KT_EMULATED_GPUS");
  *count = env && *env ? std::max(1, std::atoi(env)) : 1;
  return ok();
}
cudaError_t CUDARTAPI cudaDriverGetVersion(int* version) {
  *version = 13000;
  return ok();
}
cudaError_t CUDARTAPI cudaRuntimeGetVersion(int* version) {
  *version = CUDART_VERSION;
  return ok();
}
cudaError_t CUDARTAPI cudaSetDevice(int) {
  return ok();
}
cudaError_t CUDARTAPI cudaGetDeviceProperties(cudaDeviceProp* prop, int) {
  std::memset(prop, 0, sizeof *prop);
  std::strncpy(prop->name, "emulated on the host", sizeof prop->name - 1);
  prop->major = 9;
  prop->minor = 0;
  prop->totalGlobalMem = size_t{8} << 30;
  return ok();
}
cudaError_t CUDARTAPI cudaDeviceGetPCIBusId(char* id, int len, int) {
  std::strncpy(id, "0000:00:00.0", static_cast<size_t>(len));
  return ok();
}
cudaError_t CUDARTAPI cudaDeviceSynchronize() {
  auto& s = em::state();
  std::lock_guard lock(s.mutex);
  em::host_waits_for_everything(s);
  return ok();
}
cudaError_t CUDARTAPI cudaGetLastError() {
  const cudaError_t last = g_last;
  g_last = cudaSuccess;
  return last;
}
const char* CUDARTAPI cudaGetErrorString(cudaError_t error) {
  return error == cudaSuccess ? "no error" : "emulated CUDA error";
}
const char* CUDARTAPI cudaGetErrorName(cudaError_t error) {
  return error == cudaSuccess ? "cudaSuccess" : "cudaErrorEmulated";
}

cudaError_t CUDARTAPI cudaMalloc(void** ptr, size_t bytes) {
  const size_t rounded = (bytes + 255) / 256 * 256;
  *ptr = std::aligned_alloc(256, rounded);
  if (!*ptr) return cudaErrorMemoryAllocation;
  em::track(*ptr, rounded);
  return ok();
}
cudaError_t CUDARTAPI cudaFree(void* ptr) {
  if (ptr) em::untrack(ptr);
  std::free(ptr);
  return ok();
}
cudaError_t CUDARTAPI cudaHostAlloc(void** ptr, size_t bytes, unsigned int) {
  return cudaMalloc(ptr, bytes);
}
cudaError_t CUDARTAPI cudaFreeHost(void* ptr) {
  return cudaFree(ptr);
}

// The synchronous forms run on the legacy default stream; cudaMemcpy returns when it is done,
// cudaMemset may return before (and does not wait for non-blocking streams either way).
cudaError_t CUDARTAPI cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  em::device_op(nullptr, copy_name(kind, false), {em::reads(src, bytes), em::writes(dst, bytes)});
  {
    auto& s = em::state();
    std::lock_guard lock(s.mutex);
    em::join(s.host.clock, s.legacy.clock);  // returns when the copy is done
  }
  std::memmove(dst, src, bytes);
  return ok();
}
cudaError_t CUDARTAPI cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                                      cudaStream_t stream) {
  em::device_op(stream, copy_name(kind, true), {em::reads(src, bytes), em::writes(dst, bytes)});
  std::memmove(dst, src, bytes);
  return ok();
}
cudaError_t CUDARTAPI cudaMemset(void* ptr, int value, size_t bytes) {
  em::device_op(nullptr, "cudaMemset", {em::writes(ptr, bytes)});
  std::memset(ptr, value, bytes);
  return ok();
}
cudaError_t CUDARTAPI cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
  em::device_op(stream, "cudaMemsetAsync", {em::writes(ptr, bytes)});
  std::memset(ptr, value, bytes);
  return ok();
}

cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  *stream = reinterpret_cast<cudaStream_t>(new char);
  auto& s = em::state();
  std::lock_guard lock(s.mutex);
  s.streams[*stream] = em::Agent{s.next_agent++, {}, (flags & cudaStreamNonBlocking) == 0};
  return ok();
}
cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t stream) {
  return destroy(&em::State::streams, stream);
}
cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t stream) {
  auto& s = em::state();
  std::lock_guard lock(s.mutex);
  em::join(s.host.clock, em::agent_of(s, stream).clock);
  return ok();
}
cudaError_t CUDARTAPI cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  auto& s = em::state();
  std::lock_guard lock(s.mutex);
  em::Agent& a = em::agent_of(s, stream);
  em::enqueue(s, a);
  const auto it = s.events.find(event);
  if (it != s.events.end()) em::join(a.clock, it->second);  // (never recorded: no wait)
  return ok();
}

cudaError_t CUDARTAPI cudaEventCreate(cudaEvent_t* event) {
  *event = reinterpret_cast<cudaEvent_t>(new char);
  return ok();
}
cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  return cudaEventCreate(event);
}
cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t event) {
  return destroy(&em::State::events, event);
}
cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  auto& s = em::state();
  std::lock_guard lock(s.mutex);
  em::Agent& a = em::agent_of(s, stream);
  em::enqueue(s, a);
  s.events[event] = a.clock;
  return ok();
}
// Complete (everything is, here): the host has seen the event's work either way.
cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t event) {
  auto& s = em::state();
  std::lock_guard lock(s.mutex);
  const auto it = s.events.find(event);
  if (it != s.events.end()) em::join(s.host.clock, it->second);
  return ok();
}
cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t event) {
  return cudaEventSynchronize(event);
}
cudaError_t CUDARTAPI cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 0.0f;
  return ok();
}

}  // extern "C"

// bf16 matmuls through oneDNN's matmul primitive (AMX or AVX512-BF16, chosen by oneDNN at run
// time): the weights come as a bf16 copy, the fp32 activations and gradients are rounded to bf16
// on the way in, every product is accumulated in fp32, and the output is fp32. Primitives are
// built once per shape and kept (building one costs far more than running a small one); every
// thread runs them with its own stream and scratchpad.
#include <dnnl.hpp>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <new>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>

#include "kernels/bf16.h"
#include "kernels/cpu/matmul_internal.h"
#include "kernels/cpu/simd.h"
#include "kernels/ops.h"

namespace kt::kernels::cpu {
namespace {

using dnnl::memory;
using Dims = memory::dims;

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// C (M,N) [+]= A (M,K) · B (K,N), A and B bf16 with the given strides, C fp32 row-major,
// optional fp32 bias (N) added.
struct GemmKey {
  int64_t M, N, K, a_rs, a_cs, b_rs, b_cs;
  bool bias, accumulate;
  auto tie() const { return std::tie(M, N, K, a_rs, a_cs, b_rs, b_cs, bias, accumulate); }
  bool operator<(const GemmKey& o) const { return tie() < o.tie(); }
};

struct Gemm {
  memory::desc a, b, c, bias, scratchpad;
  dnnl::matmul primitive;
};

const Gemm& gemm_for(const GemmKey& key) {
  static std::mutex mutex;
  static std::map<GemmKey, std::unique_ptr<Gemm>> cache;
  std::lock_guard lock(mutex);
  auto& slot = cache[key];
  if (slot) return *slot;
  auto g = std::make_unique<Gemm>();
  const auto bf16 = memory::data_type::bf16, f32 = memory::data_type::f32;
  g->a = memory::desc(Dims{key.M, key.K}, bf16, Dims{key.a_rs, key.a_cs});
  g->b = memory::desc(Dims{key.K, key.N}, bf16, Dims{key.b_rs, key.b_cs});
  g->c = memory::desc(Dims{key.M, key.N}, f32, Dims{key.N, 1});
  if (key.bias) g->bias = memory::desc(Dims{1, key.N}, f32, Dims{key.N, 1});
  // The scratchpad is the caller's (one per thread): oneDNN's own is shared by every primitive
  // and unsafe once a primitive runs on another thread than the one that built it (TP ranks,
  // the offload engine's lanes), which gave wrong sums here.
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (key.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::desc desc = key.bias ? dnnl::matmul::desc(g->a, g->b, g->bias, g->c)
                                           : dnnl::matmul::desc(g->a, g->b, g->c);
  const dnnl::matmul::primitive_desc pd(desc, attr, engine());
  g->scratchpad = pd.scratchpad_desc();
  g->primitive = dnnl::matmul(pd);
  slot = std::move(g);
  return *slot;
}

// A growable, page-aligned byte buffer (one per thread and use) for the scratchpad and the
// rounded inputs, as oneDNN allocates its own (std::vector guarantees 16 bytes; the AMX tile
// loads and the packed blocks are cache-line sized). Measured: no difference here either way.
class AlignedBuffer {
 public:
  void* get(size_t bytes) {
    if (bytes > size_) {
      data_.reset(static_cast<unsigned char*>(std::aligned_alloc(kAlign, round_up(bytes))));
      if (!data_) throw std::bad_alloc();
      size_ = round_up(bytes);
    }
    return data_.get();
  }

 private:
  static constexpr size_t kAlign = 4096;
  static size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
  struct Free {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  std::unique_ptr<unsigned char, Free> data_;
  size_t size_ = 0;
};

void gemm(const GemmKey& key, const uint16_t* A, const uint16_t* B, float* Cm, const float* bias) {
  const Gemm& g = gemm_for(key);
  // One stream per thread: oneDNN streams are not to be shared between threads that execute
  // at the same time (the Oases lanes' compute and the offload engine's pool may).
  thread_local dnnl::stream stream(engine());
  std::unordered_map<int, memory> args = {
      {DNNL_ARG_SRC, memory(g.a, engine(), const_cast<uint16_t*>(A))},
      {DNNL_ARG_WEIGHTS, memory(g.b, engine(), const_cast<uint16_t*>(B))},
      {DNNL_ARG_DST, memory(g.c, engine(), Cm)}};
  if (bias) args.emplace(DNNL_ARG_BIAS, memory(g.bias, engine(), const_cast<float*>(bias)));
  thread_local AlignedBuffer pad;
  args.emplace(DNNL_ARG_SCRATCHPAD,
               memory(g.scratchpad, engine(),
                      pad.get(std::max<size_t>(1, g.scratchpad.get_size()))));
  g.primitive.execute(stream, args);
  stream.wait();
}

// Per-thread scratch for the rounded inputs (two at most per call).
uint16_t* scratch(int which, size_t count) {
  thread_local AlignedBuffer buffers[2];
  return static_cast<uint16_t*>(buffers[which].get(count * sizeof(uint16_t)));
}

}  // namespace

KT_SIMD_CLONES void to_bf16(uint16_t* out, const float* in, int64_t N) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < N; ++i) out[i] = float_to_bf16(in[i]);
}

std::string bf16_matmul_isa() {
  // What oneDNN will run bf16 matmuls on; below AVX512-BF16 it would emulate them with fp32
  // instructions (slower than the fp32 path), which we do not offer.
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  switch (isa) {
    case dnnl::cpu_isa::avx512_core_amx:
      return "AMX-BF16";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "AVX512-BF16";
    default:
      return "";
  }
}

void matmul_forward_bf16(float* out, const float* inp, const uint16_t* weight, const float* bias,
                         int64_t BT, int64_t C, int64_t OC) {
  // out (BT,OC) = bf16(inp) (BT,C) · weight (OC,C)ᵀ + bias
  uint16_t* a = scratch(0, static_cast<size_t>(BT * C));
  to_bf16(a, inp, BT * C);
  gemm({BT, OC, C, C, 1, 1, C, bias != nullptr, false}, a, weight, out, bias);
}

void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const uint16_t* weight, int64_t BT, int64_t C,
                          int64_t OC, bool accumulate_dweight) {
  uint16_t* d = scratch(0, static_cast<size_t>(BT * OC));
  uint16_t* x = scratch(1, static_cast<size_t>(BT * C));
  // dinp (BT,C) += bf16(dout) (BT,OC) · weight (OC,C)
  to_bf16(d, dout, BT * OC);
  gemm({BT, C, OC, OC, 1, C, 1, false, true}, d, weight, dinp, nullptr);
  // dweight (OC,C) (+)= bf16(dout)ᵀ (OC,BT) · bf16(inp) (BT,C): the same bf16 dout, read
  // transposed through its strides (oneDNN's copy of it into its blocks beat a transposing
  // conversion of ours by ~20 ms per GPT-2 124M step, docs/PERFORMANCE.md).
  to_bf16(x, inp, BT * C);
  gemm({OC, C, BT, 1, OC, C, 1, false, accumulate_dweight}, d, x, dweight, nullptr);
  if (dbias) column_sums(dbias, dout, BT, OC);
}

}  // namespace kt::kernels::cpu

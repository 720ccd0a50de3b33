#include "worker/cuda_offload.h"

#include <cuda_runtime.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "api/error.h"
#include "kernels/bf16.h"
#include "kernels/cuda/check.h"
#include "worker/host_access.h"

namespace kt::worker {

namespace cu = kernels::cuda;
using cu::bf16;

// ---- memory ---------------------------------------------------------------------------------

CudaAllocations::~CudaAllocations() {
  cudaDeviceSynchronize();  // no check: a destructor must not throw; the memory goes back anyway
  for (void* p : device_blocks_) device_.deallocate(p);
  for (void* p : pinned_blocks_) device_.deallocate_pinned(p);
}

void* CudaAllocations::device_bytes(size_t n, MemoryKind kind) {
  void* p = device_.allocate(std::max<size_t>(n, 1), kind);
  device_blocks_.push_back(p);
  return p;
}

void* CudaAllocations::pinned_bytes(size_t n, MemoryKind kind) {
  void* p = device_.allocate_pinned(std::max<size_t>(n, 1), kind);
  pinned_blocks_.push_back(p);
  return p;
}

CudaParamLayout cuda_param_layout(const GptConfig& config, int64_t tp, int64_t resident_layers) {
  CudaParamLayout out;
  out.layers = config.layers;
  out.resident_layers = resident_layers;
  out.tp = tp;
  out.sizes = gpt_param_sizes(config, tp);
  for (int i = 0; i < kNumParamTensors; ++i) {
    out.offsets[i] = out.params;
    out.params += out.sizes[i];
  }
  for (int i = 0; i < kNumParamTensors; ++i) {
    const bool per_layer = kParams[static_cast<size_t>(i)].per_layer;
    const int64_t layer = per_layer ? out.sizes[i] / out.layers : 0;
    out.dsizes[i] = per_layer ? layer * resident_layers : out.sizes[i];
    out.doffsets[i] = out.dparams;
    out.dparams += out.dsizes[i];
    if (per_layer) {
      out.slot_offsets[i] = out.slot_params;
      out.slot_params += layer;
    }
  }
  return out;
}

// ---- construction ---------------------------------------------------------------------------

CudaOffloadEngine::CudaOffloadEngine(CudaDevice& device, const GptConfig& config, int64_t tp,
                                     const cu::Context& context, const CudaOffloadOptions& options)
    : device_(device),
      c_(config),
      ctx_(context),
      cpu_threads_(std::max(1, options.cpu_threads)),
      reducer_(options.reducer),
      embedding_(options.embedding),
      counts_unit0_(options.counts_unit0),
      updates_unit0_(options.updates_unit0),
      unit0_elsewhere_(options.unit0_elsewhere),
      embedding_ready_(std::make_unique<CudaEvent>()),
      memory_(device) {
  in_flight_ = options.in_flight;
  KT_CHECK(in_flight_ >= 1, "a model holds at least one micro-batch's activations");
  const int64_t units = c_.layers + 1;
  device_units_ = options.device_units < 0 ? units : std::min(options.device_units, units);
  if (options.window > 0 && device_units_ <= c_.layers) {
    KT_CHECK(device_units_ >= 1, "window offload keeps the embeddings on the device (gpuUnits >= 1)");
    KT_CHECK(options.recompute != api::Recompute::kNone,
             "window offload streams the layers' weights twice, so it needs recompute");
    window_ = std::min(options.window, c_.layers - (device_units_ - 1));
  }
  layout_ = cuda_param_layout(c_, tp, window_ > 0 ? device_units_ - 1 : c_.layers);
  zero_ = options.distributed_optimizer && reducer_ && reducer_->size() > 1;
  KT_CHECK(!unit0_elsewhere_ || (device_units_ >= 1 && !embedding_),
           "a cutpoint's segments keep the embeddings on the device, without stages");
  allocate();
  if (device_units_ < units) cpu_thread_ = std::thread([this] { run_cpu_tasks(); });
}

CudaOffloadEngine::~CudaOffloadEngine() {
  try {
    wait_cpu_idle();
  } catch (...) {  // already reported by the call that failed
  }
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (cpu_thread_.joinable()) cpu_thread_.join();
  cudaDeviceSynchronize();  // no check (a destructor): the events go only after their work
}

void CudaOffloadEngine::allocate() {
  const int64_t L = c_.layers;
  params16_ = memory_.device<bf16>(layout_.dparams, MemoryKind::kParams);
  grads_ = memory_.device<float>(layout_.dparams, MemoryKind::kGrads);
  slots_.resize(static_cast<size_t>(window_));
  for (Slot& slot : slots_) {
    slot.weights = memory_.device<bf16>(layout_.slot_params, MemoryKind::kParams);
    slot.grads = memory_.device<float>(layout_.slot_params, MemoryKind::kGrads);
    slot.loaded = std::make_unique<CudaEvent>();
    slot.weights_free = std::make_unique<CudaEvent>();
    slot.grads_free = std::make_unique<CudaEvent>();
  }

  // The device units' slices, merged where consecutive layers of one tensor touch, packed.
  const auto& sizes = layout_.sizes;
  units_.resize(static_cast<size_t>(L + 1));
  std::vector<ParamSlice> slices;
  for (int64_t u = 0; u < device_units_ && !zero_; ++u)  // (the shards are packed by unit)
    for (const ParamSlice& s : gpt_unit_slices(sizes, L, u)) slices.push_back(s);
  std::sort(slices.begin(), slices.end(),
            [](const ParamSlice& a, const ParamSlice& b) { return a.offset < b.offset; });
  for (const ParamSlice& s : slices) {
    if (!device_slices_.empty() && device_slices_.back().tensor == s.tensor &&
        device_slices_.back().offset + device_slices_.back().count == s.offset)
      device_slices_.back().count += s.count;
    else
      device_slices_.push_back(s);
  }
  int64_t device_packed = 0;
  for (const ParamSlice& s : device_slices_) device_packed += s.count;
  if (device_packed > 0) {
    dmaster_ = memory_.device<float>(device_packed, MemoryKind::kParams);
    dm_ = memory_.device<float>(device_packed, MemoryKind::kOptimizer);
    dv_ = memory_.device<float>(device_packed, MemoryKind::kOptimizer);
  }
  int64_t packed = 0;
  for (const ParamSlice& s : device_slices_) {
    const int64_t at = layout_.device_offset(s.tensor, s.offset);
    if (updates_unit0_ || kParams[static_cast<size_t>(s.tensor)].per_layer)
      device_tensors_[gpt_decays(s.tensor) ? 1 : 0].push_back(
          {dmaster_ + packed, grads_ + at, dm_ + packed, dv_ + packed, params16_ + at, s.count});
    packed += s.count;
  }
  for (int64_t u = 0; u <= L; ++u) {
    Unit& unit = units_[static_cast<size_t>(u)];
    if (!unit_streamed(u))  // a streamed layer's gradients are in its slot
      for (const ParamSlice& s : gpt_unit_slices(sizes, L, u))
        unit.grad_ranges.emplace_back(grads_ + layout_.device_offset(s.tensor, s.offset),
                                      static_cast<size_t>(s.count));
    unit.grads_final = std::make_unique<CudaEvent>();
    if (zero_) unit.weights_copied = std::make_unique<CudaEvent>();  // unpacked from the gather
  }
  if (zero_) allocate_shards();
  for (int64_t u = device_units_; u <= L; ++u) {
    Unit& unit = units_[static_cast<size_t>(u)];
    unit.on_device = false;
    for (const ParamSlice& s : gpt_unit_slices(sizes, L, u)) {
      // Sharded, it keeps its shard only (allocate_shards), and a streamed layer its whole copy
      // and accumulator beside it.
      if (zero_ && !unit_streamed(u)) break;
      int64_t& packed = zero_ ? stream_packed_ : host_packed_;
      unit.host_slices.push_back({s.tensor, s.offset, packed, s.count});
      packed += s.count;
    }
    unit.grads_copied = std::make_unique<CudaEvent>();
    unit.weights_copied = std::make_unique<CudaEvent>();
  }
  if (host_packed_ > 0) {
    hmaster_ = memory_.pinned<float>(host_packed_, MemoryKind::kParams);
    hm_ = memory_.pinned<float>(host_packed_, MemoryKind::kOptimizer);
    hv_ = memory_.pinned<float>(host_packed_, MemoryKind::kOptimizer);
    hgrads_ = memory_.pinned<float>(host_packed_, MemoryKind::kGrads);
    hparams16_ = memory_.pinned<uint16_t>(host_packed_, MemoryKind::kParams);
  }
  if (stream_packed_ > 0) {
    hstream16_ = memory_.pinned<uint16_t>(stream_packed_, MemoryKind::kParams);
    hstream_grads_ = memory_.pinned<float>(stream_packed_, MemoryKind::kGrads);
  }
}

void CudaOffloadEngine::allocate_shards() {
  const int64_t L = c_.layers, d = reducer_->size(), r = reducer_->rank();
  shards_.resize(static_cast<size_t>(L + 1));
  int64_t total = 0, widest = 0;
  for (int64_t u = 0; u <= L; ++u) {
    Shard& shard = shards_[static_cast<size_t>(u)];
    shard.slices = gpt_unit_slices(layout_.sizes, L, u);
    int64_t floats = 0;
    for (const ParamSlice& s : shard.slices) floats += s.count;
    shard.size = (floats + d - 1) / d;
    shard.offset = total;
    total += shard.size;
    widest = std::max(widest, shard.size);
    // The rank's part [begin, end) of the packed slices, cut into runs of one tensor.
    const int64_t begin = std::min(r * shard.size, floats);
    const int64_t end = std::min((r + 1) * shard.size, floats);
    int64_t packed = 0;
    for (const ParamSlice& s : shard.slices) {
      const int64_t lo = std::max(packed, begin), hi = std::min(packed + s.count, end);
      if (lo < hi) shard.pieces.push_back({s.tensor, s.offset + lo - packed, lo - begin, hi - lo});
      packed += s.count;
    }
  }
  // The device units come first (units [0, device_units)), so their shards are a prefix.
  shard_host_base_ =
      device_units_ <= L ? shards_[static_cast<size_t>(device_units_)].offset : total;
  if (shard_host_base_ > 0) {
    dmaster_ = memory_.device<float>(shard_host_base_, MemoryKind::kParams);
    dm_ = memory_.device<float>(shard_host_base_, MemoryKind::kOptimizer);
    dv_ = memory_.device<float>(shard_host_base_, MemoryKind::kOptimizer);
  }
  shard_grads_ = memory_.device<float>(total, MemoryKind::kGrads);
  shard_grads_ready_ = std::make_unique<CudaEvent>();
  if (const int64_t host = total - shard_host_base_; host > 0) {  // offload optimizer
    hmaster_ = memory_.pinned<float>(host, MemoryKind::kParams);
    hm_ = memory_.pinned<float>(host, MemoryKind::kOptimizer);
    hv_ = memory_.pinned<float>(host, MemoryKind::kOptimizer);
    hgrads_ = memory_.pinned<float>(host, MemoryKind::kGrads);
    hparams16_ = memory_.pinned<uint16_t>(host, MemoryKind::kParams);
    std::memset(hparams16_, 0, bytes<uint16_t>(host));  // the padding all-gathers as zeros
  }
  auto events = [](auto& bucket) {
    bucket.ready = std::make_unique<CudaEvent>();
    bucket.done = std::make_unique<CudaEvent>();
    bucket.free = std::make_unique<CudaEvent>();
  };
  for (int k = 0; k < 2; ++k) {
    grad_buckets_[k].data = memory_.device<float>(d * widest, MemoryKind::kWorkspace);
    weight_buckets_[k].data = memory_.device<bf16>(d * widest, MemoryKind::kWorkspace);
    events(grad_buckets_[k]);
    events(weight_buckets_[k]);
  }
}

const bf16* CudaOffloadEngine::layer_weight(int tensor, int64_t l) {
  if (streamed(l)) return slot_of(l).weights + layout_.slot_offsets[tensor];
  return params16_ + layout_.layer_offset(tensor, l);
}

float* CudaOffloadEngine::layer_grad(int tensor, int64_t l) {
  if (streamed(l)) return slot_of(l).grads + layout_.slot_offsets[tensor];
  return grads_ + layout_.layer_offset(tensor, l);
}

// ---- host access: initialisation and checkpoints -------------------------------------------

namespace {
// Synchronous copies between a whole-model host array (llm.c layout) and packed device state.
void upload_packed(float* packed_device, const std::vector<ParamSlice>& slices,
                   const float* host) {
  int64_t packed = 0;
  for (const ParamSlice& s : slices) {
    KT_CUDA_CHECK(cudaMemcpy(packed_device + packed, host + s.offset, bytes<float>(s.count),
                             cudaMemcpyHostToDevice));
    packed += s.count;
  }
}
void download_packed(const float* packed_device, const std::vector<ParamSlice>& slices,
                     float* host) {
  int64_t packed = 0;
  for (const ParamSlice& s : slices) {
    KT_CUDA_CHECK(cudaMemcpy(host + s.offset, packed_device + packed, bytes<float>(s.count),
                             cudaMemcpyDeviceToHost));
    packed += s.count;
  }
}
}  // namespace

void CudaOffloadEngine::set_parameters(const float* host) {
  synchronize();
  if (zero_) {  // the rank's shard of the masters; every rank's bf16 copy from the whole array
    scatter_shards(host, dmaster_, hmaster_);
    std::vector<uint16_t> rounded(static_cast<size_t>(layout_.params));
    for (int64_t i = 0; i < layout_.params; ++i) rounded[i] = kernels::float_to_bf16(host[i]);
    for (int i = 0; i < kNumParamTensors; ++i)
      KT_CUDA_CHECK(cudaMemcpy(params16_ + layout_.doffsets[i], rounded.data() + layout_.offsets[i],
                               bytes<bf16>(layout_.dsizes[i]), cudaMemcpyHostToDevice));
    for (const Unit& u : units_)  // (the streamed layers' whole copies)
      for (const HostSlice& sl : u.host_slices)
        std::memcpy(hstream16_ + sl.packed, rounded.data() + sl.offset, bytes<uint16_t>(sl.count));
    for (Slot& slot : slots_) slot.layer = -1;
    return;
  }
  if (dmaster_) upload_packed(dmaster_, device_slices_, host);
  for (const Unit& u : units_)
    for (const HostSlice& s : u.host_slices)
      std::memcpy(hmaster_ + s.packed, host + s.offset, bytes<float>(s.count));
  refresh_bf16();
}

void CudaOffloadEngine::get_parameters(float* host) {
  synchronize();
  if (zero_) return gather_shards(dmaster_, hmaster_, host);
  if (dmaster_) download_packed(dmaster_, device_slices_, host);
  for (const Unit& u : units_)
    for (const HostSlice& s : u.host_slices)
      std::memcpy(host + s.offset, hmaster_ + s.packed, bytes<float>(s.count));
}

void CudaOffloadEngine::set_moments(const float* m, const float* v) {
  synchronize();
  if (zero_) {
    scatter_shards(m, dm_, hm_);
    scatter_shards(v, dv_, hv_);
    return;
  }
  if (dm_) {
    upload_packed(dm_, device_slices_, m);
    upload_packed(dv_, device_slices_, v);
  }
  for (const Unit& u : units_)
    for (const HostSlice& s : u.host_slices) {
      std::memcpy(hm_ + s.packed, m + s.offset, bytes<float>(s.count));
      std::memcpy(hv_ + s.packed, v + s.offset, bytes<float>(s.count));
    }
}

void CudaOffloadEngine::get_moments(float* m, float* v) {
  synchronize();
  if (zero_) {
    gather_shards(dm_, hm_, m);
    gather_shards(dv_, hv_, v);
    return;
  }
  if (dm_) {
    download_packed(dm_, device_slices_, m);
    download_packed(dv_, device_slices_, v);
  }
  for (const Unit& u : units_)
    for (const HostSlice& s : u.host_slices) {
      std::memcpy(m + s.offset, hm_ + s.packed, bytes<float>(s.count));
      std::memcpy(v + s.offset, hv_ + s.packed, bytes<float>(s.count));
    }
}

void CudaOffloadEngine::get_gradients(float* host) {
  synchronize();
  if (window_ == 0) {
    KT_CUDA_CHECK(cudaMemcpy(host, grads_, bytes<float>(layout_.params), cudaMemcpyDeviceToHost));
    return;
  }
  // The resident part of each tensor from the device, the streamed layers' from host memory.
  for (int i = 0; i < kNumParamTensors; ++i)
    KT_CUDA_CHECK(cudaMemcpy(host + layout_.offsets[i], grads_ + layout_.doffsets[i],
                             bytes<float>(layout_.dsizes[i]), cudaMemcpyDeviceToHost));
  for (int64_t l = layout_.resident_layers; l < c_.layers; ++l)
    for (const HostSlice& sl : units_[static_cast<size_t>(l + 1)].host_slices) {
      host_reads("get_gradients", stream_grads() + sl.packed, bytes<float>(sl.count));
      std::memcpy(host + sl.offset, stream_grads() + sl.packed, bytes<float>(sl.count));
    }
}

void CudaOffloadEngine::scatter_shards(const float* whole, float* device, float* host) {
  for (const Shard& shard : shards_)
    for (const ShardPiece& p : shard.pieces) {
      const int64_t at = shard.offset + p.in_shard;
      if (at >= shard_host_base_) {
        host_writes("scatter_shards", host + at - shard_host_base_, bytes<float>(p.count));
        std::memcpy(host + at - shard_host_base_, whole + p.offset, bytes<float>(p.count));
      } else {
        KT_CUDA_CHECK(cudaMemcpy(device + at, whole + p.offset, bytes<float>(p.count),
                                 cudaMemcpyHostToDevice));
      }
    }
}

// Unit by unit through the first gradient bucket (the step's collectives are done: the caller
// synchronised); a host unit's shard goes to the device first, into the second bucket.
void CudaOffloadEngine::gather_shards(const float* device, const float* host, float* whole) {
  CudaStream& compute = device_.stream(StreamRole::kCompute);
  Bucket<float>& bucket = grad_buckets_[0];
  for (const Shard& shard : shards_) {
    const bool on_host = shard.offset >= shard_host_base_;
    if (on_host) {
      host_reads("gather_shards", host + shard.offset - shard_host_base_, bytes<float>(shard.size));
      KT_CUDA_CHECK(cudaMemcpy(grad_buckets_[1].data, host + shard.offset - shard_host_base_,
                               bytes<float>(shard.size), cudaMemcpyHostToDevice));
    }
    const float* mine = on_host ? grad_buckets_[1].data : device + shard.offset;
    compute.record(*bucket.ready);
    reducer_->all_gather(mine, bucket.data, static_cast<size_t>(shard.size), DeviceDtype::kFloat32,
                         *bucket.ready, *bucket.done);
    bucket.done->synchronize();
    int64_t packed = 0;
    for (const ParamSlice& s : shard.slices) {
      KT_CUDA_CHECK(cudaMemcpy(whole + s.offset, bucket.data + packed, bytes<float>(s.count),
                               cudaMemcpyDeviceToHost));
      packed += s.count;
    }
  }
}

void CudaOffloadEngine::refresh_bf16() {
  int64_t packed = 0;
  for (const ParamSlice& s : device_slices_) {
    cu::cast_to_bf16(ctx_, params16_ + layout_.device_offset(s.tensor, s.offset),
                     dmaster_ + packed, s.count);
    packed += s.count;
  }
  for (int64_t unit = 0; unit <= c_.layers; ++unit)
    for (const HostSlice& s : units_[static_cast<size_t>(unit)].host_slices) {
      host_writes("refresh_bf16", hparams16_ + s.packed, bytes<bf16>(s.count));
      for (int64_t i = 0; i < s.count; ++i)
        hparams16_[s.packed + i] = kernels::float_to_bf16(hmaster_[s.packed + i]);
      if (!unit_streamed(unit))  // streamed layers load from hparams16_ when used
        KT_CUDA_CHECK(cudaMemcpy(params16_ + layout_.device_offset(s.tensor, s.offset),
                                 hparams16_ + s.packed, bytes<bf16>(s.count),
                                 cudaMemcpyHostToDevice));
    }
  for (Slot& slot : slots_) slot.layer = -1;  // reload: the weights may have changed
  device_.stream(StreamRole::kCompute).synchronize();
}

// ---- the step -------------------------------------------------------------------------------

void CudaOffloadEngine::begin_step() {
  CudaStream& compute = device_.stream(StreamRole::kCompute);
  join_reductions(compute);
  // The last step's gradient copies read the gradients the model is about to zero.
  for (const Unit& u : units_)
    if (!u.on_device) compute.wait(*u.grads_copied);
  for (Slot& slot : slots_) slot.layer = -1;  // a new step: the streamed weights were updated
}

void CudaOffloadEngine::before_forward(int64_t unit) {
  if (unit == 1) {  // the window's first layers, ahead of the first layer's forward
    // The distributed optimizer: every streamed layer's new weights all-gathered into its host
    // copy first (the slots load from it, ahead of the layers' forwards).
    for (int64_t l = layout_.resident_layers; zero_ && window_ > 0 && l < c_.layers; ++l)
      if (units_[static_cast<size_t>(l + 1)].gather_due) gather_host_shard(l + 1);
    for (int64_t j = 0; j < window_; ++j) load_layer(layout_.resident_layers + j);
  }
  Unit& u = units_[static_cast<size_t>(unit)];
  if (unit_streamed(unit)) {  // its weights come into a slot instead
    use_layer(unit - 1);
    return;
  }
  if (zero_) {  // its weights, all-gathered after the last update (a CPU unit's now)
    if (u.gather_due) gather_host_shard(unit);
    device_.stream(StreamRole::kCompute).wait(*u.weights_copied);
    return;
  }
  if (u.on_device) return;
  wait_cpu_update(u);
  device_.stream(StreamRole::kCompute).wait(*u.weights_copied);
}

void CudaOffloadEngine::forward_done(int64_t l) {
  if (!streamed(l)) return;
  device_.stream(StreamRole::kCompute).record(*slot_of(l).weights_free);
  load_layer(l + window_);  // its slot goes to the layer W further on
}

void CudaOffloadEngine::load_layer(int64_t l) {
  if (!streamed(l) || l >= c_.layers) return;
  Slot& slot = slot_of(l);
  if (slot.layer == l) return;  // still there
  const Unit& u = units_[static_cast<size_t>(l + 1)];
  wait_cpu_update(u);  // its host copy holds the updated weights
  CudaStream& h2d = device_.stream(StreamRole::kHostToDevice);
  h2d.wait(*slot.weights_free);  // the slot's previous layer is done with its weights
  if (zero_) h2d.wait(*u.weights_copied);  // the all-gather's unpack into the host copy
  for (const HostSlice& sl : u.host_slices) {
    KT_CUDA_CHECK(cudaMemcpyAsync(slot.weights + layout_.slot_offsets[sl.tensor],
                                  stream16() + sl.packed, bytes<bf16>(sl.count),
                                  cudaMemcpyHostToDevice, h2d.handle()));
    h2d_bytes_ += bytes<bf16>(sl.count);
  }
  h2d.record(*slot.loaded);
  slot.layer = l;
}

void CudaOffloadEngine::use_layer(int64_t l) {
  if (!streamed(l)) return;
  load_layer(l);
  device_.stream(StreamRole::kCompute).wait(*slot_of(l).loaded);
}

// A streamed layer's gradients start its backward at zero (the step's first micro-batch) or at
// the sum of the earlier micro-batches (copied back from host memory).
void CudaOffloadEngine::before_backward(int64_t l, bool first_micro_batch) {
  if (!streamed(l)) return;
  // The sweep's first layers: where a forward came before, still in their slots; where a
  // backward did (a pipeline stage's drain), loaded now, ahead of their use.
  if (l == c_.layers - 1)
    for (int64_t j = 0; j < window_; ++j) load_layer(l - j);
  use_layer(l);
  Slot& slot = slot_of(l);
  CudaStream& compute = device_.stream(StreamRole::kCompute);
  compute.wait(*slot.grads_free);  // the last copy out of the slot's gradients
  if (first_micro_batch) {
    KT_CUDA_CHECK(cudaMemsetAsync(slot.grads, 0, bytes<float>(layout_.slot_params),
                                  compute.handle()));
    return;
  }
  const Unit& u = units_[static_cast<size_t>(l + 1)];
  compute.wait(*u.grads_copied);
  for (const HostSlice& sl : u.host_slices) {
    KT_CUDA_CHECK(cudaMemcpyAsync(slot.grads + layout_.slot_offsets[sl.tensor],
                                  stream_grads() + sl.packed, bytes<float>(sl.count),
                                  cudaMemcpyHostToDevice, compute.handle()));
    h2d_bytes_ += bytes<float>(sl.count);
  }
}

// The DP sum on the last micro-batch, then the host units' copy (a streamed layer's after every
// micro-batch: its gradients are summed in host memory), and a streamed layer's slot goes to the
// layer W below.
void CudaOffloadEngine::grads_final(int64_t unit, bool last_micro_batch) {
  Unit& u = units_[static_cast<size_t>(unit)];
  const bool in_slot = unit_streamed(unit);
  if (unit == 0 && !updates_unit0_) return;  // a stage between: its copy is never used
  if (unit == 0 && unit0_elsewhere_) return;  // a cutpoint's: the caller sums it (unit0_summed)
  const bool embeddings = unit == 0 && embedding_ && last_micro_batch;
  if (!in_slot && (!last_micro_batch || (u.on_device && !reducer_ && !embeddings))) return;
  CudaStream& compute = device_.stream(StreamRole::kCompute);
  compute.record(*u.grads_final);
  if (embeddings) {  // the DP sum (or the shard's) now, the stages' sum after the schedule
    if (zero_)
      embedding_after_ = &reduce_scatter(0);
    else if (reducer_)
      reducer_->reduce(u.grad_ranges, *u.grads_final);
    embedding_pending_ = true;
    return;
  }
  GradientReducer::Ranges slot_ranges;
  if (in_slot) {
    Slot& slot = slot_of(unit - 1);
    compute.record(*slot.weights_free);  // the backward is done with the slot's weights
    for (const HostSlice& sl : u.host_slices)
      slot_ranges.emplace_back(slot.grads + layout_.slot_offsets[sl.tensor],
                               static_cast<size_t>(sl.count));
  }
  if (reducer_ && last_micro_batch && zero_) {
    // (a streamed layer's from its slot, which holds the sum of every micro-batch's)
    const CudaEvent& scattered = reduce_scatter(unit);
    if (!u.on_device) copy_shard_home(unit, scattered);  // beside the backward, as it lands
    if (in_slot)
      device_.stream(StreamRole::kDataParallelComm).record(*slot_of(unit - 1).grads_free);
  } else if (reducer_ && last_micro_batch) {
    reducer_->reduce(in_slot ? slot_ranges : u.grad_ranges, *u.grads_final);
  }
  // The host units' gradients home (with the shards: the shard's, above — but a streamed layer's
  // sum so far after each micro-batch before the last, as without them).
  if (!u.on_device && (!zero_ || (in_slot && !last_micro_batch))) {
    copy_grads_home(u, *u.grads_final, last_micro_batch, in_slot ? &slot_ranges : nullptr);
    if (in_slot) device_.stream(StreamRole::kDeviceToHost).record(*slot_of(unit - 1).grads_free);
  }
  const int64_t below = unit - 1 - window_;
  if (in_slot && below >= layout_.resident_layers) load_layer(below);
}

// A CPU-updated unit's gradients to host memory on the D2H stream, after `ready` (and, with
// `sums`, the reductions issued so far: the copy takes the sums); from its window slot where
// `slot_ranges` (the slot's pieces, in host-slice order).
void CudaOffloadEngine::copy_grads_home(Unit& u, const CudaEvent& ready, bool sums,
                                        const GradientReducer::Ranges* slot_ranges) {
  CudaStream& d2h = device_.stream(StreamRole::kDeviceToHost);
  d2h.wait(ready);
  if (sums) join_reductions(d2h);
  for (size_t k = 0; k < u.host_slices.size(); ++k) {
    const HostSlice& sl = u.host_slices[k];
    const float* from = slot_ranges ? (*slot_ranges)[k].first
                                    : grads_ + layout_.device_offset(sl.tensor, sl.offset);
    float* to = (slot_ranges ? stream_grads() : hgrads_) + sl.packed;
    KT_CUDA_CHECK(
        cudaMemcpyAsync(to, from, bytes<float>(sl.count), cudaMemcpyDeviceToHost, d2h.handle()));
    d2h_bytes_ += bytes<float>(sl.count);
  }
  d2h.record(*u.grads_copied);
}

// The distributed optimizer: the unit's gradients packed into the next bucket on the DP stream
// (once the bucket's last reduce-scatter has read it), then reduce-scattered into its shard.
const CudaEvent& CudaOffloadEngine::reduce_scatter(int64_t unit) {
  const Shard& shard = shards_[static_cast<size_t>(unit)];
  Bucket<float>& bucket = grad_buckets_[static_cast<size_t>(next_grad_bucket_)];
  next_grad_bucket_ ^= 1;
  CudaStream& dp = device_.stream(StreamRole::kDataParallelComm);
  dp.wait(*units_[static_cast<size_t>(unit)].grads_final);
  dp.wait(*bucket.done);
  const bool in_slot = unit_streamed(unit);  // (its gradients in its window slot)
  int64_t packed = 0;
  for (const ParamSlice& s : shard.slices) {
    const float* from = in_slot ? slot_of(unit - 1).grads + layout_.slot_offsets[s.tensor]
                                : grads_ + layout_.device_offset(s.tensor, s.offset);
    device_.copy(bucket.data + packed, from, bytes<float>(s.count), dp);
    packed += s.count;
  }
  dp.record(*bucket.ready);
  reducer_->reduce_scatter(bucket.data, shard_grads_ + shard.offset,
                           static_cast<size_t>(shard.size), *bucket.ready, *bucket.done);
  return *bucket.done;
}

// After the pipeline's schedule (not inside its last backward: there the first stage still
// waits for the last stage's final gradients, which a collective between the two would hold
// up; Megatron sums them after the schedule too), over the DP-summed gradients or the shard.
void CudaOffloadEngine::sum_embeddings() {
  if (!embedding_pending_) return;
  embedding_pending_ = false;
  if (zero_) {
    const Shard& shard = shards_[0];
    embedding_->reduce({{shard_grads_ + shard.offset, static_cast<size_t>(shard.size)}},
                       *embedding_after_);
    return;
  }
  Unit& u = units_[0];
  CudaStream& dp = device_.stream(StreamRole::kDataParallelComm);
  if (reducer_) reducer_->join(dp);
  dp.wait(*u.grads_final);
  dp.record(*embedding_ready_);
  embedding_->reduce(u.grad_ranges, *embedding_ready_);
  // Offload optimizer with the embeddings on the CPU: the sums go home now (grads_final left
  // them to this).
  if (!u.on_device) copy_grads_home(u, *embedding_ready_, true, nullptr);
}

void CudaOffloadEngine::unit0_summed() {
  KT_CHECK(unit0_elsewhere_, "unit0_summed follows CudaOffloadOptions::unit0_elsewhere");
  if (!zero_) return;
  const Shard& shard = shards_[0];
  CudaStream& compute = device_.stream(StreamRole::kCompute);
  for (const ShardPiece& p : shard.pieces)
    device_.copy(shard_grads_ + shard.offset + p.in_shard,
                 grads_ + layout_.device_offset(p.tensor, p.offset), bytes<float>(p.count),
                 compute);
}

void CudaOffloadEngine::add_shard_sums_of_squares(double* sums) {
  for (const Shard& shard : shards_)
    for (const ShardPiece& p : shard.pieces)
      if (counts_unit0_ || kParams[static_cast<size_t>(p.tensor)].per_layer)
        cu::sum_of_squares(ctx_, sums + (gpt_tp_sharded(p.tensor, layout_.tp) ? 0 : 1),
                           shard_grads_ + shard.offset + p.in_shard, p.count);
}

void CudaOffloadEngine::join_reductions(CudaStream& stream) {
  if (reducer_) reducer_->join(stream);
  if (embedding_) embedding_->join(stream);
}

void CudaOffloadEngine::add_host_sums_of_squares(double* sharded, double* replicated) {
  if (zero_) return;  // every unit's shard is summed on the device (add_shard_sums_of_squares)
  for (int64_t l = layout_.resident_layers; l < c_.layers && window_ > 0; ++l) {
    const Unit& u = units_[static_cast<size_t>(l + 1)];
    u.grads_copied->synchronize();
    for (const HostSlice& sl : u.host_slices) {
      host_reads("grad_sums_of_squares", hgrads_ + sl.packed, bytes<float>(sl.count));
      double sum = 0;
      for (int64_t i = 0; i < sl.count; ++i)
        sum += static_cast<double>(hgrads_[sl.packed + i]) * hgrads_[sl.packed + i];
      *(gpt_tp_sharded(sl.tensor, layout_.tp) ? sharded : replicated) += sum;
    }
  }
}

// ---- the optimizer --------------------------------------------------------------------------

void CudaOffloadEngine::update(const kernels::AdamWStep& step, float weight_decay) {
  sum_embeddings();
  join_reductions(device_.stream(StreamRole::kCompute));
  if (zero_) return update_shards(step, weight_decay);
  for (int decays = 0; decays < 2; ++decays) {
    if (device_tensors_[decays].empty()) continue;
    kernels::AdamWStep s = step;
    s.weight_decay = decays ? weight_decay : 0.0f;
    cu::adamw_update_multi(ctx_, device_tensors_[decays].data(),
                           static_cast<int>(device_tensors_[decays].size()), s);
  }
  // The host units, in the order the next forward reads them (not a stage between's unit 0,
  // which it never reads).
  for (int64_t u = std::max<int64_t>(device_units_, updates_unit0_ ? 0 : 1); u <= c_.layers; ++u) {
    std::lock_guard lock(mutex_);
    units_[static_cast<size_t>(u)].pending = true;
    cpu_tasks_.push_back([this, u, step, weight_decay] { cpu_update(u, step, weight_decay); });
  }
  changed_.notify_all();
}

// The distributed optimizer, unit by unit in forward order: AdamW on the rank's shard (on the
// compute stream) writes its bf16 weights into its place in the next weight bucket; the bucket is
// all-gathered, then unpacked into the bf16 parameters on the DP stream, where the next forward
// of the unit waits for it (before_forward).
void CudaOffloadEngine::update_shards(const kernels::AdamWStep& step, float weight_decay) {
  CudaStream& compute = device_.stream(StreamRole::kCompute);
  CudaStream& dp = device_.stream(StreamRole::kDataParallelComm);
  const int64_t r = reducer_->rank();
  const size_t first = updates_unit0_ ? 0 : 1, device_units = static_cast<size_t>(device_units_);
  // Offload optimizer: the host units' shard gradients went home as their reduce-scatters
  // landed, except the embeddings' with pipeline stages (summed between the stages since):
  // theirs now. The CPU updates them in the order the next forward reads them; each one's
  // gather waits for its first use (gather_host_shard).
  if (device_units < shards_.size()) {
    compute.record(*shard_grads_ready_);  // after every reduction (update joined them)
    for (size_t u = std::max(first, device_units); u < shards_.size(); ++u) {
      if (!units_[u].shard_home) copy_shard_home(static_cast<int64_t>(u), *shard_grads_ready_);
      units_[u].shard_home = false;
      std::lock_guard lock(mutex_);
      units_[u].pending = units_[u].gather_due = true;
      cpu_tasks_.push_back([this, u, step, weight_decay] {
        cpu_update_shard(static_cast<int64_t>(u), step, weight_decay);
      });
    }
    changed_.notify_all();
  }
  for (size_t u = first; u < std::min(device_units, shards_.size()); ++u) {
    const Shard& shard = shards_[u];
    Bucket<bf16>& bucket = weight_buckets_[static_cast<size_t>(next_weight_bucket_)];
    next_weight_bucket_ ^= 1;
    compute.wait(*bucket.free);  // the last unpack from this bucket has read it
    bf16* mine = bucket.data + r * shard.size;
    std::vector<cu::AdamWTensor> tensors[2];  // [decays]
    for (const ShardPiece& p : shard.pieces) {
      const int64_t at = shard.offset + p.in_shard;
      tensors[gpt_decays(p.tensor) ? 1 : 0].push_back(
          {dmaster_ + at, shard_grads_ + at, dm_ + at, dv_ + at, mine + p.in_shard, p.count});
    }
    for (int decays = 0; decays < 2; ++decays) {
      if (tensors[decays].empty()) continue;
      kernels::AdamWStep s = step;
      s.weight_decay = decays ? weight_decay : 0.0f;
      cu::adamw_update_multi(ctx_, tensors[decays].data(), static_cast<int>(tensors[decays].size()),
                             s);
    }
    compute.record(*bucket.ready);
    reducer_->all_gather(mine, bucket.data, static_cast<size_t>(shard.size), DeviceDtype::kBfloat16,
                         *bucket.ready, *bucket.done);
    dp.wait(*bucket.done);
    int64_t packed = 0;
    for (const ParamSlice& s : shard.slices) {
      device_.copy(params16_ + layout_.device_offset(s.tensor, s.offset), bucket.data + packed,
                   bytes<bf16>(s.count), dp);
      packed += s.count;
    }
    dp.record(*bucket.free);
    dp.record(*units_[u].weights_copied);
  }
}

void CudaOffloadEngine::cpu_update_shard(int64_t unit, kernels::AdamWStep step,
                                         float weight_decay) {
  Unit& u = units_[static_cast<size_t>(unit)];
  const Shard& shard = shards_[static_cast<size_t>(unit)];
  u.grads_copied->synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (const ShardPiece& p : shard.pieces) {
    const int64_t at = shard.offset + p.in_shard - shard_host_base_;
    kernels::AdamWStep k = step;
    k.weight_decay = gpt_decays(p.tensor) ? weight_decay : 0.0f;
    host_reads("cpu_update_shard", hgrads_ + at, bytes<float>(p.count));
    host_writes("cpu_update_shard", hparams16_ + at, bytes<bf16>(p.count));
    kernels::cpu::adamw_update_mixed(hmaster_ + at, hgrads_ + at, nullptr, hm_ + at, hv_ + at,
                                     hparams16_ + at, p.count, k);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard lock(mutex_);
  cpu_seconds_ += seconds;
  u.pending = false;
}

// A host unit's shard gradients to host memory on the D2H stream, after `ready`.
void CudaOffloadEngine::copy_shard_home(int64_t unit, const CudaEvent& ready) {
  Unit& u = units_[static_cast<size_t>(unit)];
  const Shard& shard = shards_[static_cast<size_t>(unit)];
  CudaStream& d2h = device_.stream(StreamRole::kDeviceToHost);
  d2h.wait(ready);
  KT_CUDA_CHECK(cudaMemcpyAsync(hgrads_ + shard.offset - shard_host_base_,
                                shard_grads_ + shard.offset, bytes<float>(shard.size),
                                cudaMemcpyDeviceToHost, d2h.handle()));
  d2h_bytes_ += bytes<float>(shard.size);
  d2h.record(*u.grads_copied);
  u.shard_home = true;
}

// Once the CPU has updated it: the rank's bf16 shard into its place in the next weight bucket
// (h2d on the data-parallel stream), all-gathered, unpacked into every rank's weights. Called
// from the unit's first forward after the update, which every rank reaches in the same order.
void CudaOffloadEngine::gather_host_shard(int64_t unit) {
  Unit& u = units_[static_cast<size_t>(unit)];
  const Shard& shard = shards_[static_cast<size_t>(unit)];
  wait_cpu_update(u);
  CudaStream& dp = device_.stream(StreamRole::kDataParallelComm);
  Bucket<bf16>& bucket = weight_buckets_[static_cast<size_t>(next_weight_bucket_)];
  next_weight_bucket_ ^= 1;
  dp.wait(*bucket.free);  // the last unpack from this bucket has read it
  bf16* mine = bucket.data + reducer_->rank() * shard.size;
  KT_CUDA_CHECK(cudaMemcpyAsync(mine, hparams16_ + shard.offset - shard_host_base_,
                                bytes<bf16>(shard.size), cudaMemcpyHostToDevice, dp.handle()));
  h2d_bytes_ += bytes<bf16>(shard.size);
  dp.record(*bucket.ready);
  reducer_->all_gather(mine, bucket.data, static_cast<size_t>(shard.size), DeviceDtype::kBfloat16,
                       *bucket.ready, *bucket.done);
  dp.wait(*bucket.done);
  if (unit_streamed(unit)) {  // into its whole host copy, which its slot loads (d2h)
    int64_t floats = 0;
    for (const HostSlice& sl : u.host_slices) floats += sl.count;
    device_.copy(hstream16_ + u.host_slices.front().packed, bucket.data, bytes<bf16>(floats), dp);
    d2h_bytes_ += bytes<bf16>(floats);
  } else {
    int64_t packed = 0;
    for (const ParamSlice& s : shard.slices) {
      device_.copy(params16_ + layout_.device_offset(s.tensor, s.offset), bucket.data + packed,
                   bytes<bf16>(s.count), dp);
      packed += s.count;
    }
  }
  dp.record(*bucket.free);
  dp.record(*u.weights_copied);
  u.gather_due = false;
}

void CudaOffloadEngine::wait_cpu_update(const Unit& u) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !u.pending || static_cast<bool>(cpu_error_); });
  if (cpu_error_) std::rethrow_exception(cpu_error_);
}

void CudaOffloadEngine::cpu_update(int64_t unit, kernels::AdamWStep step, float weight_decay) {
  Unit& u = units_[static_cast<size_t>(unit)];
  u.grads_copied->synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (const HostSlice& s : u.host_slices) {
    kernels::AdamWStep k = step;
    k.weight_decay = gpt_decays(s.tensor) ? weight_decay : 0.0f;
    host_reads("cpu_update", hgrads_ + s.packed, bytes<float>(s.count));
    host_writes("cpu_update", hparams16_ + s.packed, bytes<bf16>(s.count));
    kernels::cpu::adamw_update_mixed(hmaster_ + s.packed, hgrads_ + s.packed, nullptr,
                                     hm_ + s.packed, hv_ + s.packed, hparams16_ + s.packed,
                                     s.count, k);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CudaStream& h2d = device_.stream(StreamRole::kHostToDevice);
  if (!unit_streamed(unit)) {  // (a streamed layer is loaded when next used)
    for (const HostSlice& s : u.host_slices) {
      KT_CUDA_CHECK(cudaMemcpyAsync(params16_ + layout_.device_offset(s.tensor, s.offset),
                                    hparams16_ + s.packed, bytes<bf16>(s.count),
                                    cudaMemcpyHostToDevice, h2d.handle()));
      h2d_bytes_ += bytes<bf16>(s.count);
    }
    h2d.record(*u.weights_copied);
  }
  std::lock_guard lock(mutex_);
  cpu_seconds_ += seconds;
  u.pending = false;
}

void CudaOffloadEngine::run_cpu_tasks() {
  // The current device and OpenMP's thread count are per thread.
  omp_set_num_threads(cpu_threads_);
  std::unique_lock lock(mutex_);
  try {
    KT_CUDA_CHECK(cudaSetDevice(device_.ordinal()));
  } catch (...) {  // every task will be skipped; the trainer sees the error at its next wait
    cpu_error_ = std::current_exception();
  }
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !cpu_tasks_.empty(); });
    if (cpu_tasks_.empty()) return;  // stopping, nothing left
    auto task = std::move(cpu_tasks_.front());
    cpu_tasks_.pop_front();
    cpu_busy_ = true;
    const bool failed_before = static_cast<bool>(cpu_error_);  // skip the rest after an error
    lock.unlock();
    std::exception_ptr error;
    try {
      if (!failed_before) task();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error && !cpu_error_) cpu_error_ = error;
    cpu_busy_ = false;
    changed_.notify_all();
  }
}

void CudaOffloadEngine::wait_cpu_idle() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock,
                [&] { return (cpu_tasks_.empty() && !cpu_busy_) || !cpu_thread_.joinable(); });
  if (cpu_error_) std::rethrow_exception(cpu_error_);
}

void CudaOffloadEngine::synchronize() {
  wait_cpu_idle();
  device_.synchronize();
}

double CudaOffloadEngine::cpu_optimizer_seconds() const {
  std::lock_guard lock(mutex_);
  return cpu_seconds_;
}

// ---- activation checkpoints of the streamed layers ------------------------------------------

void CudaOffloadEngine::add_checkpoint_lane(int parts, int64_t n) {
  Ring& ring = rings_.emplace_back();
  ring.parts = parts;
  ring.n = n;
  const int64_t streamed_layers = window_ > 0 ? c_.layers - layout_.resident_layers : 0;
  if (streamed_layers == 0 || parts == 0) return;
  for (int k = 0; k < 2; ++k) {
    for (int part = 0; part < parts; ++part)
      ring.buffers[k][part] = memory_.device<bf16>(n, MemoryKind::kActivations);
    ring.written[k] = std::make_unique<CudaEvent>();
    ring.out[k] = std::make_unique<CudaEvent>();
    ring.in[k] = std::make_unique<CudaEvent>();
    ring.used[k] = std::make_unique<CudaEvent>();
  }
  ring.host =
      memory_.pinned<bf16>(in_flight_ * streamed_layers * parts * n, MemoryKind::kActivations);
}

bf16* CudaOffloadEngine::checkpoint_buffer(int lane, int64_t l, int part) {
  const Ring& ring = rings_[static_cast<size_t>(lane)];
  if (!checkpoint_streamed(l) || part >= ring.parts) return nullptr;
  return ring.buffers[ring_of(l)][part];
}

void CudaOffloadEngine::checkpoint_before_write(int lane, int64_t l) {
  if (!checkpoint_streamed(l)) return;
  Ring& ring = rings_[static_cast<size_t>(lane)];
  const int k = ring_of(l);
  device_.stream(StreamRole::kCompute).wait(*ring.out[k]);
  ring.holds[k] = -1;
}

void CudaOffloadEngine::checkpoint_out(int lane, int64_t l) {
  if (!checkpoint_streamed(l)) return;
  Ring& ring = rings_[static_cast<size_t>(lane)];
  const int k = ring_of(l);
  bf16* host = ring_host(ring, l);
  CudaStream& d2h = device_.stream(StreamRole::kDeviceToHost);
  device_.stream(StreamRole::kCompute).record(*ring.written[k]);
  d2h.wait(*ring.written[k]);
  for (int part = 0; part < ring.parts; ++part)
    device_.copy(host + part * ring.n, ring.buffers[k][part], bytes<bf16>(ring.n), d2h);
  d2h_bytes_ += bytes<bf16>(ring.parts * ring.n);
  d2h.record(*ring.out[k]);
}

void CudaOffloadEngine::checkpoint_in(int lane, int64_t l, bool wait) {
  if (!checkpoint_streamed(l)) return;
  Ring& ring = rings_[static_cast<size_t>(lane)];
  const int k = ring_of(l);
  if (ring.holds[k] != checkpoint_key(l)) {
    const bf16* host = ring_host(ring, l);
    CudaStream& h2d = device_.stream(StreamRole::kHostToDevice);
    h2d.wait(*ring.out[k]);   // the forward's copy out of the slot has finished
    h2d.wait(*ring.used[k]);  // and the backward of the layer two up is done with it
    for (int part = 0; part < ring.parts; ++part)
      device_.copy(ring.buffers[k][part], host + part * ring.n, bytes<bf16>(ring.n), h2d);
    h2d_bytes_ += bytes<bf16>(ring.parts * ring.n);
    h2d.record(*ring.in[k]);
    ring.holds[k] = checkpoint_key(l);
  }
  if (wait) device_.stream(StreamRole::kCompute).wait(*ring.in[k]);
}

void CudaOffloadEngine::checkpoint_done(int lane, int64_t l) {
  if (!checkpoint_streamed(l)) return;
  device_.stream(StreamRole::kCompute).record(*rings_[static_cast<size_t>(lane)].used[ring_of(l)]);
}

}  // namespace kt::worker

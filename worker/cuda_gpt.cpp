#include "worker/cuda_gpt.h"

#include <cuda_runtime.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "api/error.h"
#include "api/flops.h"
#include "kernels/bf16.h"
#include "kernels/cuda/check.h"
#include "worker/host_access.h"

namespace kt::worker {

namespace cu = kernels::cuda;
using cu::bf16;

namespace {
// The bytes of `n` elements of T: copies and memsets are sized in elements, as the buffers are.
template <typename T>
size_t bytes(int64_t n) {
  return static_cast<size_t>(n) * sizeof(T);
}
}  // namespace

CudaGpt::CudaGpt(CudaDevice& device, const GptConfig& config, int64_t B, int64_t T,
                 const CudaGptOptions& options)
    : device_(device),
      c_(config),
      B_(B),
      T_(T),
      cpu_threads_(std::max(1, options.cpu_threads)),
      recompute_(options.recompute),
      reducer_(options.reducer),
      tp_(options.tp) {
  KT_CHECK(B > 0 && T > 0 && T <= c_.max_seq_len, "micro-batch shape out of range");
  KT_CHECK(c_.channels % c_.heads == 0, "heads must divide channels");
  if (tp_) {
    t_ = tp_->size();
    tr_ = tp_->rank();
  }
  KT_CHECK(c_.heads % t_ == 0 && c_.ffn % t_ == 0 && c_.padded_vocab % t_ == 0,
           "the TP degree must divide heads, ffn and the padded vocabulary");
  Cl_ = c_.channels / t_;
  NHl_ = c_.heads / t_;
  Fl_ = c_.ffn / t_;
  Vl_ = c_.padded_vocab / t_;
  vocab_lo_ = tr_ * Vl_;
  vocab_valid_ = std::max<int64_t>(0, std::min(Vl_, c_.vocab - vocab_lo_));
  const int lanes = t_ > 1 && options.sub_batches == 2 ? 2 : 1;
  KT_CHECK(B % lanes == 0, "two sub-batches need an even micro-batch");
  lanes_.resize(lanes);
  for (int j = 0; j < lanes; ++j) {
    lanes_[j].B = B / lanes;
    lanes_[j].row0 = j * (B / lanes);
  }
  const int64_t units = c_.layers + 1;
  device_units_ = options.device_units < 0 ? units : std::min(options.device_units, units);
  if (options.window > 0 && device_units_ <= c_.layers) {
    KT_CHECK(device_units_ >= 1, "window offload keeps the embeddings on the device (gpuUnits >= 1)");
    KT_CHECK(recompute_ != api::Recompute::kNone,
             "window offload streams the layers' weights twice, so it needs recompute");
    window_ = options.window;
  }
  dev_layers_ = window_ > 0 ? device_units_ - 1 : c_.layers;
  try {
    allocate();
  } catch (...) {  // e.g. out of memory: give back what was taken, then report
    for (void* p : allocations_) device_.deallocate(p);
    for (void* p : pinned_allocations_) device_.deallocate_pinned(p);
    throw;
  }
  if (device_units_ < units) cpu_thread_ = std::thread([this] { run_cpu_tasks(); });
}

CudaGpt::~CudaGpt() {
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
  cudaDeviceSynchronize();  // no check: a destructor must not throw; the memory goes back anyway
  ctx_.reset();
  for (void* p : allocations_) device_.deallocate(p);
  for (void* p : pinned_allocations_) device_.deallocate_pinned(p);
}

void* CudaGpt::take_bytes(size_t bytes, MemoryKind kind) {
  void* p = device_.allocate(std::max<size_t>(bytes, 1), kind);
  allocations_.push_back(p);
  return p;
}

void* CudaGpt::take_pinned_bytes(size_t bytes, MemoryKind kind) {
  void* p = device_.allocate_pinned(std::max<size_t>(bytes, 1), kind);
  pinned_allocations_.push_back(p);
  return p;
}

void CudaGpt::allocate() {
  const int64_t L = c_.layers, C = c_.channels, BT = B_ * T_;
  ctx_ = std::make_unique<cu::Context>(device_.stream(StreamRole::kCompute).handle());
  sizes_ = gpt_param_sizes(c_, t_);
  for (int i = 0; i < kNumParamTensors; ++i) {
    offsets_[i] = num_params_;
    num_params_ += sizes_[i];
  }
  for (int i = 0; i < kNumParamTensors; ++i) {
    const bool layer_tensor = kParams[static_cast<size_t>(i)].per_layer;
    dsizes_[i] = layer_tensor ? sizes_[i] / L * dev_layers_ : sizes_[i];
    doffsets_[i] = dev_params_;
    dev_params_ += dsizes_[i];
    if (layer_tensor) {
      slot_offsets_[i] = slot_params_;
      slot_params_ += sizes_[i] / L;
    }
  }
  const size_t P = static_cast<size_t>(dev_params_);
  params16_ = take<bf16>(P, MemoryKind::kParams);
  grads_ = take<float>(P, MemoryKind::kGrads);
  slots_.resize(static_cast<size_t>(std::min(window_, L - dev_layers_)));
  for (Slot& slot : slots_) {
    slot.weights = take<bf16>(slot_params_, MemoryKind::kParams);
    slot.grads = take<float>(slot_params_, MemoryKind::kGrads);
    slot.loaded = std::make_unique<CudaEvent>();
    slot.weights_free = std::make_unique<CudaEvent>();
    slot.grads_free = std::make_unique<CudaEvent>();
  }
  if (!slots_.empty()) window_ = static_cast<int64_t>(slots_.size());

  // The device units' slices, merged where consecutive layers of one tensor touch, packed.
  units_.resize(L + 1);
  for (int64_t u = 0; u < device_units_; ++u)
    for (const ParamSlice& s : gpt_unit_slices(sizes_, L, u)) device_slices_.push_back(s);
  std::sort(device_slices_.begin(), device_slices_.end(),
            [](const ParamSlice& a, const ParamSlice& b) { return a.offset < b.offset; });
  std::vector<ParamSlice> merged;
  for (const ParamSlice& s : device_slices_) {
    if (!merged.empty() && merged.back().tensor == s.tensor &&
        merged.back().offset + merged.back().count == s.offset)
      merged.back().count += s.count;
    else
      merged.push_back(s);
  }
  device_slices_ = merged;
  for (const ParamSlice& s : device_slices_) device_packed_ += s.count;
  if (device_packed_ > 0) {
    dmaster_ = take<float>(device_packed_, MemoryKind::kParams);
    dm_ = take<float>(device_packed_, MemoryKind::kOptimizer);
    dv_ = take<float>(device_packed_, MemoryKind::kOptimizer);
  }
  int64_t packed = 0;
  for (const ParamSlice& s : device_slices_) {
    const int64_t at = dev_offset(s.tensor, s.offset);
    device_tensors_[gpt_decays(s.tensor) ? 1 : 0].push_back(
        {dmaster_ + packed, grads_ + at, dm_ + packed, dv_ + packed, params16_ + at, s.count});
    packed += s.count;
  }
  for (int64_t u = 0; u <= L; ++u) {
    Unit& unit = units_[u];
    if (!unit_streamed(u))  // a streamed layer's gradients are in its slot
      for (const ParamSlice& s : gpt_unit_slices(sizes_, L, u))
        unit.grad_ranges.emplace_back(grads_ + dev_offset(s.tensor, s.offset),
                                      static_cast<size_t>(s.count));
    unit.grads_final = std::make_unique<CudaEvent>();
  }
  // The host units: pinned master, moments, gradients and bf16 staging, packed unit by unit.
  for (int64_t u = device_units_; u <= L; ++u) {
    Unit& unit = units_[u];
    unit.on_device = false;
    for (const ParamSlice& s : gpt_unit_slices(sizes_, L, u)) {
      unit.host_slices.push_back({s.tensor, s.offset, host_packed_, s.count});
      host_packed_ += s.count;
    }
    unit.grads_copied = std::make_unique<CudaEvent>();
    unit.weights_copied = std::make_unique<CudaEvent>();
  }
  if (host_packed_ > 0) {
    const size_t H = static_cast<size_t>(host_packed_);
    hmaster_ = take_pinned<float>(H, MemoryKind::kParams);
    hm_ = take_pinned<float>(H, MemoryKind::kOptimizer);
    hv_ = take_pinned<float>(H, MemoryKind::kOptimizer);
    hgrads_ = take_pinned<float>(H, MemoryKind::kGrads);
    hparams16_ = take_pinned<uint16_t>(H, MemoryKind::kParams);
  }

  auto act16 = [&](int64_t n) { return take<bf16>(n, MemoryKind::kActivations); };
  auto act32 = [&](int64_t n) { return take<float>(n, MemoryKind::kActivations); };
  const int64_t Cl = Cl_, NHl = NHl_, Fl = Fl_, T = T_;
  flash_ = cu::flash_attention_supported(C / c_.heads);
  const int parts = checkpoint_tensors(recompute_);
  for (Lane& lane : lanes_) {
    const int64_t Bl = lane.B, BTl = Bl * T;
    // Every layer's input; with commAware every layer's summed attention projection and fc2
    // output too (the checkpoint, worker/recompute.h). With window offload the streamed layers'
    // checkpoints are in pinned memory, and a ring of two on the device.
    std::array<std::array<bf16*, 3>, 2> ring{};
    const int64_t streamed_layers = window_ > 0 ? L - dev_layers_ : 0;
    if (streamed_layers > 0) {
      for (int k = 0; k < 2; ++k) {
        for (int part = 0; part < parts; ++part) ring[k][part] = act16(BTl * C);
        lane.ring_written[k] = std::make_unique<CudaEvent>();
        lane.ring_out[k] = std::make_unique<CudaEvent>();
        lane.ring_in[k] = std::make_unique<CudaEvent>();
        lane.ring_used[k] = std::make_unique<CudaEvent>();
      }
      lane.host_checkpoints =
          take_pinned<bf16>(streamed_layers * parts * BTl * C, MemoryKind::kActivations);
    }
    auto kept = [&](int64_t l, CheckpointTensor part) {
      return checkpoint_streamed(l) ? ring[ring_of(l)][static_cast<int>(part)] : act16(BTl * C);
    };
    for (int64_t l = 0; l <= L; ++l) lane.res.push_back(kept(l, CheckpointTensor::kInput));
    if (recompute_ == api::Recompute::kCommAware) {
      for (int64_t l = 0; l < L; ++l) {
        lane.attproj.push_back(kept(l, CheckpointTensor::kAttentionProjection));
        lane.fcproj.push_back(kept(l, CheckpointTensor::kFc2));
      }
    } else {
      lane.attproj.push_back(act16(BTl * C));
      lane.fcproj.push_back(lane.attproj.back());
    }
    for (int64_t l = 0; l < L; ++l) {
      if (work_index(l) != l) break;
      lane.res2.push_back(act16(BTl * C));
      lane.ln1.push_back(act16(BTl * C));
      lane.qkv.push_back(act16(BTl * 3 * Cl));
      lane.atty.push_back(act16(BTl * Cl));
      lane.ln2.push_back(act16(BTl * C));
      lane.fch.push_back(act16(BTl * Fl));
      lane.fchg.push_back(act16(BTl * Fl));
      lane.ln1_mean.push_back(act32(BTl));
      lane.ln1_rstd.push_back(act32(BTl));
      lane.ln2_mean.push_back(act32(BTl));
      lane.ln2_rstd.push_back(act32(BTl));
      if (flash_)
        lane.lse.push_back(act32(Bl * NHl * T));
      else
        lane.att.push_back(act32(Bl * NHl * T * T));
    }
    lane.lnf = act16(BTl * C);
    lane.logits = act16(BTl * Vl_);
    lane.dres = act16(BTl * C);
    lane.dtmp_c = act16(BTl * C);
    lane.dtmp_3c = act16(BTl * 3 * Cl);
    lane.dtmp_f = act16(BTl * Fl);
    lane.lnf_mean = act32(BTl);
    lane.lnf_rstd = act32(BTl);
    if (t_ > 1) {
      lane.ce_max = act32(BTl);
      lane.ce_sums = act32(2 * BTl);
      lane.partial = std::make_unique<CudaEvent>();
      lane.summed = std::make_unique<CudaEvent>();
    }
  }
  losses_ = act32(BT);
  const int64_t Bl = lanes_.front().B, BTl = Bl * T;  // the lanes are equal
  if (flash_) {
    attention_scratch_ = take_bytes(cu::attention_backward_bf16_scratch_bytes(Bl, T, Cl, NHl),
                                    MemoryKind::kWorkspace);
  } else {  // the fp32 kernels' materialised attention and its fp32 operands
    const int64_t att = Bl * NHl * T * T;
    qkv32_ = act32(BTl * 3 * Cl);
    atty32_ = act32(BTl * Cl);
    preatt_ = act32(att);
    datt_ = act32(att);
    dpreatt_ = act32(att);
    dqkv32_ = act32(BTl * 3 * Cl);
    dc32_ = act32(BTl * Cl);
  }
  norm_ = take<double>(2, MemoryKind::kWorkspace);
  tokens_ = take<int32_t>(2 * BT, MemoryKind::kWorkspace);
  for (int i = 0; i < 2; ++i) {
    token_staging_[i] = take_pinned<int32_t>(2 * BT, MemoryKind::kWorkspace);
    staging_free_[i] = std::make_unique<CudaEvent>();
  }
  norm_host_ = take_pinned<double>(2, MemoryKind::kWorkspace);
}

double CudaGpt::flops_per_micro_step() const {
  // This rank's share: its parameters and its Cl channels of attention (api/flops.h).
  return api::gpt_flops_per_token(static_cast<double>(num_params_), c_.layers, Cl_, T_) *
         static_cast<double>(B_ * T_);
}

bool CudaGpt::sharded(int tensor_index) const {
  return gpt_tp_sharded(tensor_index, t_);
}

// ---- host access: initialisation and checkpoints -------------------------------------------

void CudaGpt::init_weights(uint64_t seed) {
  std::vector<float> host(num_params_);
  gpt_init_rank(c_, t_, tr_, seed, host.data());
  set_parameters(host.data());
  std::vector<float> zeros(num_params_, 0.0f);
  set_moments(zeros.data(), zeros.data());
}

namespace {
// Synchronous copies between a full host array (llm.c layout) and packed device state.
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

void CudaGpt::set_parameters(const float* host) {
  synchronize();
  if (dmaster_) upload_packed(dmaster_, device_slices_, host);
  for (const Unit& u : units_)
    for (const HostSlice& s : u.host_slices)
      std::memcpy(hmaster_ + s.packed, host + s.offset, bytes<float>(s.count));
  refresh_bf16();
}

void CudaGpt::get_parameters(float* host) {
  synchronize();
  if (dmaster_) download_packed(dmaster_, device_slices_, host);
  for (const Unit& u : units_)
    for (const HostSlice& s : u.host_slices)
      std::memcpy(host + s.offset, hmaster_ + s.packed, bytes<float>(s.count));
}

void CudaGpt::set_moments(const float* m, const float* v) {
  synchronize();
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

void CudaGpt::get_moments(float* m, float* v) {
  synchronize();
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

void CudaGpt::get_gradients(float* host) {
  synchronize();
  if (window_ == 0) {
    KT_CUDA_CHECK(cudaMemcpy(host, grads_, bytes<float>(num_params_),
                             cudaMemcpyDeviceToHost));
    return;
  }
  // The resident part of each tensor from the device, the streamed layers' from host memory.
  for (int i = 0; i < kNumParamTensors; ++i)
    KT_CUDA_CHECK(cudaMemcpy(host + offsets_[i], grads_ + doffsets_[i], bytes<float>(dsizes_[i]),
                             cudaMemcpyDeviceToHost));
  for (int64_t l = dev_layers_; l < c_.layers; ++l)
    for (const HostSlice& sl : units_[l + 1].host_slices) {
      host_reads("get_gradients", hgrads_ + sl.packed, bytes<float>(sl.count));
      std::memcpy(host + sl.offset, hgrads_ + sl.packed, bytes<float>(sl.count));
    }
}

void CudaGpt::refresh_bf16() {
  int64_t packed = 0;
  for (const ParamSlice& s : device_slices_) {
    cu::cast_to_bf16(*ctx_, params16_ + dev_offset(s.tensor, s.offset), dmaster_ + packed,
                     s.count);
    packed += s.count;
  }
  for (int64_t unit = 0; unit <= c_.layers; ++unit)
    for (const HostSlice& s : units_[unit].host_slices) {
      host_writes("refresh_bf16", hparams16_ + s.packed, bytes<bf16>(s.count));
      for (int64_t i = 0; i < s.count; ++i)
        hparams16_[s.packed + i] = kernels::float_to_bf16(hmaster_[s.packed + i]);
      if (!unit_streamed(unit))  // streamed layers load from hparams16_ when used
        KT_CUDA_CHECK(cudaMemcpy(params16_ + dev_offset(s.tensor, s.offset), hparams16_ + s.packed,
                                 bytes<bf16>(s.count), cudaMemcpyHostToDevice));
    }
  for (Slot& slot : slots_) slot.layer = -1;  // reload: the weights may have changed
  device_.stream(StreamRole::kCompute).synchronize();
}

// ---- the step --------------------------------------------------------------------------------

void CudaGpt::zero_grad() {
  CudaStream& compute = device_.stream(StreamRole::kCompute);
  join_reductions(compute);
  // The last step's gradient copies read grads_: zeroing waits for them.
  for (const Unit& u : units_)
    if (!u.on_device) compute.wait(*u.grads_copied);
  KT_CUDA_CHECK(cudaMemsetAsync(grads_, 0, bytes<float>(dev_params_), compute.handle()));
  micro_ = 0;
  for (Slot& slot : slots_) slot.layer = -1;  // a new step: the streamed weights were updated
}

// ---- window offload: the streamed layers' slots -------------------------------------------------

void CudaGpt::load_layer(int64_t l) {
  if (!streamed(l) || l >= c_.layers) return;
  Slot& slot = slot_of(l);
  if (slot.layer == l) return;  // still there
  const Unit& u = units_[l + 1];
  wait_cpu_update(u);  // hparams16_ holds the updated weights
  CudaStream& h2d = device_.stream(StreamRole::kHostToDevice);
  h2d.wait(*slot.weights_free);  // the slot's previous layer is done with its weights
  for (const HostSlice& sl : u.host_slices) {
    KT_CUDA_CHECK(cudaMemcpyAsync(slot.weights + slot_offsets_[sl.tensor], hparams16_ + sl.packed,
                                  bytes<bf16>(sl.count), cudaMemcpyHostToDevice, h2d.handle()));
    h2d_bytes_ += bytes<bf16>(sl.count);
  }
  h2d.record(*slot.loaded);
  slot.layer = l;
}

void CudaGpt::use_layer(int64_t l) {
  if (!streamed(l)) return;
  load_layer(l);
  device_.stream(StreamRole::kCompute).wait(*slot_of(l).loaded);
}

void CudaGpt::checkpoint_before_write(Lane& lane, int64_t l) {
  if (!checkpoint_streamed(l)) return;
  const int k = ring_of(l);
  device_.stream(StreamRole::kCompute).wait(*lane.ring_out[k]);
  lane.ring_holds[k] = -1;
}

void CudaGpt::checkpoint_out(Lane& lane, int64_t l) {
  if (!checkpoint_streamed(l)) return;
  const int k = ring_of(l), parts = checkpoint_tensors(recompute_);
  const int64_t n = lane.B * T_ * c_.channels;
  bf16* host = lane.host_checkpoints + (l - dev_layers_) * parts * n;
  CudaStream& d2h = device_.stream(StreamRole::kDeviceToHost);
  device_.stream(StreamRole::kCompute).record(*lane.ring_written[k]);
  d2h.wait(*lane.ring_written[k]);
  const auto tensors = checkpoint_of(lane, l);
  for (int part = 0; part < parts; ++part)
    device_.copy(host + part * n, tensors[part], bytes<bf16>(n), d2h);
  d2h_bytes_ += bytes<bf16>(parts * n);
  d2h.record(*lane.ring_out[k]);
}

void CudaGpt::checkpoint_in(Lane& lane, int64_t l, bool wait) {
  if (!checkpoint_streamed(l)) return;
  const int k = ring_of(l);
  if (lane.ring_holds[k] != l) {
    const int parts = checkpoint_tensors(recompute_);
    const int64_t n = lane.B * T_ * c_.channels;
    const bf16* host = lane.host_checkpoints + (l - dev_layers_) * parts * n;
    CudaStream& h2d = device_.stream(StreamRole::kHostToDevice);
    h2d.wait(*lane.ring_out[k]);   // the forward's copy out of the slot has finished
    h2d.wait(*lane.ring_used[k]);  // and the backward of the layer two up is done with it
    const auto tensors = checkpoint_of(lane, l);
    for (int part = 0; part < parts; ++part)
      device_.copy(tensors[part], host + part * n, bytes<bf16>(n), h2d);
    h2d_bytes_ += bytes<bf16>(parts * n);
    h2d.record(*lane.ring_in[k]);
    lane.ring_holds[k] = l;
  }
  if (wait) device_.stream(StreamRole::kCompute).wait(*lane.ring_in[k]);
}

std::array<bf16*, 3> CudaGpt::checkpoint_of(const Lane& lane, int64_t l) const {
  const int64_t p = proj_index(l);
  return {lane.res[l], lane.attproj[p], lane.fcproj[p]};
}

void CudaGpt::checkpoint_done(Lane& lane, int64_t l) {
  if (!checkpoint_streamed(l)) return;
  device_.stream(StreamRole::kCompute).record(*lane.ring_used[ring_of(l)]);
}

// The slot's gradients start the layer's backward at zero (first micro-batch) or at the sum of
// the earlier micro-batches (copied back from host memory).
void CudaGpt::start_layer_grads(int64_t l) {
  if (!streamed(l)) return;
  Slot& slot = slot_of(l);
  CudaStream& compute = device_.stream(StreamRole::kCompute);
  compute.wait(*slot.grads_free);  // the last copy out of the slot's gradients
  if (micro_ == 1) {  // this backward belongs to the first micro-batch of the step
    KT_CUDA_CHECK(cudaMemsetAsync(slot.grads, 0, bytes<float>(slot_params_), compute.handle()));
    return;
  }
  const Unit& u = units_[l + 1];
  compute.wait(*u.grads_copied);
  for (const HostSlice& sl : u.host_slices) {
    KT_CUDA_CHECK(cudaMemcpyAsync(slot.grads + slot_offsets_[sl.tensor], hgrads_ + sl.packed,
                                  bytes<float>(sl.count), cudaMemcpyHostToDevice,
                                  compute.handle()));
    h2d_bytes_ += bytes<float>(sl.count);
  }
}

const bf16* CudaGpt::layer_weight(int tensor, int64_t l) {
  if (streamed(l)) return slot_of(l).weights + slot_offsets_[tensor];
  return params16_ + doffsets_[tensor] + l * (sizes_[tensor] / c_.layers);
}

float* CudaGpt::layer_grad(int tensor, int64_t l) {
  if (streamed(l)) return slot_of(l).grads + slot_offsets_[tensor];
  return grads_ + doffsets_[tensor] + l * (sizes_[tensor] / c_.layers);
}

void CudaGpt::before_unit(int64_t unit) {
  Unit& u = units_[unit];
  if (u.on_device) return;
  if (unit_streamed(unit)) {  // its weights come into a slot instead
    use_layer(unit - 1);
    return;
  }
  wait_cpu_update(u);
  device_.stream(StreamRole::kCompute).wait(*u.weights_copied);
}

void CudaGpt::wait_cpu_update(const Unit& u) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !u.pending || static_cast<bool>(cpu_error_); });
  if (cpu_error_) std::rethrow_exception(cpu_error_);
}

void CudaGpt::join_reductions(CudaStream& stream) {
  if (reducer_) reducer_->join(stream);
}

// `last`: the step's last micro-batch (the DP sum, and the host units' copy). A streamed layer's
// gradients leave its slot after every micro-batch (they are summed in host memory).
void CudaGpt::unit_grads_final(int64_t unit, bool last) {
  Unit& u = units_[unit];
  const bool in_slot = unit_streamed(unit);
  if (!in_slot && (!last || (u.on_device && !reducer_))) return;
  CudaStream& compute = device_.stream(StreamRole::kCompute);
  compute.record(*u.grads_final);
  GradientReducer::Ranges slot_ranges;
  if (in_slot) {
    Slot& slot = slot_of(unit - 1);
    compute.record(*slot.weights_free);  // the backward is done with the slot's weights
    for (const HostSlice& sl : u.host_slices)
      slot_ranges.emplace_back(slot.grads + slot_offsets_[sl.tensor],
                               static_cast<size_t>(sl.count));
  }
  if (reducer_ && last) reducer_->reduce(in_slot ? slot_ranges : u.grad_ranges, *u.grads_final);
  if (u.on_device) return;
  CudaStream& d2h = device_.stream(StreamRole::kDeviceToHost);
  d2h.wait(*u.grads_final);
  if (last) join_reductions(d2h);  // the copy takes the sums
  for (size_t k = 0; k < u.host_slices.size(); ++k) {
    const HostSlice& sl = u.host_slices[k];
    const float* from = in_slot ? slot_ranges[k].first : grads_ + dev_offset(sl.tensor, sl.offset);
    KT_CUDA_CHECK(cudaMemcpyAsync(hgrads_ + sl.packed, from, bytes<float>(sl.count),
                                  cudaMemcpyDeviceToHost, d2h.handle()));
    d2h_bytes_ += bytes<float>(sl.count);
  }
  d2h.record(*u.grads_copied);
  if (in_slot) d2h.record(*slot_of(unit - 1).grads_free);
}

void CudaGpt::lane_allreduce(Lane& lane, void* data, int64_t count, DeviceDtype type, ReduceOp op,
                             bool now) {
  if (t_ == 1) return;
  device_.stream(StreamRole::kCompute).record(*lane.partial);
  tp_->allreduce_after(data, static_cast<size_t>(count), type, op, *lane.partial, *lane.summed,
                       device_.stream(StreamRole::kTensorParallelComm));
  lane.in_flight = true;
  if (now) finish_allreduce(lane);
}

void CudaGpt::finish_allreduce(Lane& lane) {
  if (!lane.in_flight) return;
  device_.stream(StreamRole::kCompute).wait(*lane.summed);
  lane.in_flight = false;
}

// Layer l's attention half for a lane, from its input res[l] into the working set
// (work_index(l)) and the row-parallel projection, whose all-reduce is left in flight. In the
// forward it first completes the layer below (res[l] = res2 + its summed fc2 output). `rerun`
// (recompute, before the backward): res[l] is kept; the projection is summed at once, or skipped
// with commAware (its summed output is kept).
void CudaGpt::attention_forward(Lane& lane, int64_t l, bool rerun) {
  const int64_t C = c_.channels, Cl = Cl_, NHl = NHl_, B = lane.B, T = T_, BT = B * T;
  const cu::Context& x = *ctx_;
  const int64_t a = work_index(l), p = proj_index(l);
  auto w = [&](int i) { return layer_weight(i, l); };
  finish_allreduce(lane);
  if (!rerun && l > 0) {
    checkpoint_before_write(lane, l);
    cu::residual_forward(x, lane.res[l], lane.res2[work_index(l - 1)],
                         lane.fcproj[proj_index(l - 1)], BT * C);
  }
  cu::layernorm_forward(x, lane.ln1[a], lane.ln1_mean[a], lane.ln1_rstd[a], lane.res[l], w(kLn1w),
                        w(kLn1b), BT, C);
  cu::matmul_forward_bf16(x, lane.qkv[a], lane.ln1[a], w(kQkvw), w(kQkvb), BT, C, 3 * Cl);
  if (flash_) {
    cu::attention_forward_bf16(x, lane.atty[a], lane.lse[a], lane.qkv[a], B, T, Cl, NHl);
  } else {
    cu::cast_to_float(x, qkv32_, lane.qkv[a], BT * 3 * Cl);
    cu::attention_forward(x, atty32_, preatt_, lane.att[a], qkv32_, B, T, Cl, NHl);
    cu::cast_to_bf16(x, lane.atty[a], atty32_, BT * Cl);
  }
  if (rerun && recompute_ == api::Recompute::kCommAware) return;
  // Row-parallel: each rank's partial product (the bias on rank 0 only), summed over TP.
  cu::matmul_forward_bf16(x, lane.attproj[p], lane.atty[a], w(kAttprojw),
                          tr_ == 0 ? w(kAttprojb) : nullptr, BT, Cl, C);
  lane_allreduce(lane, lane.attproj[p], BT * C, DeviceDtype::kBfloat16, ReduceOp::kSum, rerun);
}

// Layer l's MLP half for a lane: res2 = res[l] + the summed projection, LayerNorm, fc, GELU, and
// (forward) the row-parallel fc2 with its all-reduce left in flight. `rerun`: up to GELU only
// (the backward never reads fc2's output; res[l + 1] is kept).
void CudaGpt::mlp_forward(Lane& lane, int64_t l, bool rerun) {
  const int64_t C = c_.channels, Fl = Fl_, BT = lane.B * T_;
  const cu::Context& x = *ctx_;
  const int64_t a = work_index(l), p = proj_index(l);
  auto w = [&](int i) { return layer_weight(i, l); };
  finish_allreduce(lane);
  cu::residual_forward(x, lane.res2[a], lane.res[l], lane.attproj[p], BT * C);
  cu::layernorm_forward(x, lane.ln2[a], lane.ln2_mean[a], lane.ln2_rstd[a], lane.res2[a],
                        w(kLn2w), w(kLn2b), BT, C);
  cu::matmul_forward_bf16(x, lane.fch[a], lane.ln2[a], w(kFcw), w(kFcb), BT, C, Fl);
  cu::gelu_forward(x, lane.fchg[a], lane.fch[a], BT * Fl);
  if (rerun) return;
  cu::matmul_forward_bf16(x, lane.fcproj[p], lane.fchg[a], w(kFcprojw),
                          tr_ == 0 ? w(kFcprojb) : nullptr, BT, Fl, C);
  lane_allreduce(lane, lane.fcproj[p], BT * C, DeviceDtype::kBfloat16, ReduceOp::kSum, false);
}

void CudaGpt::rerun_layer(Lane& lane, int64_t l) {
  attention_forward(lane, l, true);
  mlp_forward(lane, l, true);
}

// The step of one micro-batch, op by op over the lanes: each lane's op starts by waiting for
// the all-reduce its previous op left in flight, so with two lanes (Oases) one lane's all-reduce
// runs on the TP stream while the other lane computes.
//   forward:  embedding | per layer: attention half, MLP half | final LayerNorm, LM head, loss
//   backward: LM head | final LayerNorm | per layer (from the last): [recompute,] MLP half,
//             attention half, ln1 | embedding
void CudaGpt::train_micro_step(const int32_t* inputs, const int32_t* targets, float loss_scale,
                               bool last) {
  const int64_t L = c_.layers, C = c_.channels, Cl = Cl_, NHl = NHl_, Fl = Fl_, Vl = Vl_;
  const int64_t T = T_, BT = B_ * T;
  const cu::Context& x = *ctx_;
  CudaStream& compute = device_.stream(StreamRole::kCompute);
  cudaStream_t s = compute.handle();

  // Tokens through pinned staging (the buffer's previous copy must have left it).
  const int k = staging_next_;
  staging_next_ ^= 1;
  staging_free_[k]->synchronize();
  host_writes("token staging", token_staging_[k], bytes<int32_t>(2 * BT));
  std::memcpy(token_staging_[k], inputs, bytes<int32_t>(BT));
  std::memcpy(token_staging_[k] + BT, targets, bytes<int32_t>(BT));
  KT_CUDA_CHECK(cudaMemcpyAsync(tokens_, token_staging_[k], bytes<int32_t>(2 * BT),
                                cudaMemcpyHostToDevice, s));
  compute.record(*staging_free_[k]);
  auto tokens_of = [&](const Lane& lane) { return tokens_ + lane.row0 * T; };
  auto targets_of = [&](const Lane& lane) { return tokens_ + BT + lane.row0 * T; };

  auto zero = [&](void* p, size_t n_bytes) { KT_CUDA_CHECK(cudaMemsetAsync(p, 0, n_bytes, s)); };
  const bf16* p16 = params16_;
  auto w = [&](int i, int64_t l) { return layer_weight(i, l); };
  auto g = [&](int i, int64_t l) { return layer_grad(i, l); };

  // ---- forward
  before_unit(0);
  for (Lane& lane : lanes_) {
    const int64_t B = lane.B;
    checkpoint_before_write(lane, 0);
    if (t_ == 1) {
      cu::embedding_forward(x, lane.res[0], tokens_of(lane), p16 + doffsets_[kWte],
                            p16 + doffsets_[kWpe], B, T, C);
    } else {  // vocab-parallel: this rank's rows (and the positions on rank 0), summed
      cu::embedding_forward_rows(x, lane.res[0], tokens_of(lane), p16 + doffsets_[kWte],
                                 tr_ == 0 ? p16 + doffsets_[kWpe] : nullptr, B, T, C, vocab_lo_,
                                 Vl);
      lane_allreduce(lane, lane.res[0], B * T * C, DeviceDtype::kBfloat16, ReduceOp::kSum, false);
    }
  }
  for (int64_t j = 0; j < window_; ++j) load_layer(dev_layers_ + j);  // the window's first
  for (int64_t l = 0; l < L; ++l) {
    before_unit(l + 1);  // (a streamed layer: its slot's load)
    for (Lane& lane : lanes_) attention_forward(lane, l, false);
    if (l > 0)  // the layer below is no longer read: its checkpoint can leave
      for (Lane& lane : lanes_) checkpoint_out(lane, l - 1);
    for (Lane& lane : lanes_) mlp_forward(lane, l, false);
    if (streamed(l)) {  // its slot goes to the layer W further on
      compute.record(*slot_of(l).weights_free);
      load_layer(l + window_);
    }
  }
  // d(scaled mean loss)/d(token loss) = scale/BT over the whole micro-batch.
  const float dloss = loss_scale / static_cast<float>(BT);
  for (Lane& lane : lanes_) {
    const int64_t BTl = lane.B * T;
    finish_allreduce(lane);
    cu::residual_forward(x, lane.res[L], lane.res2[work_index(L - 1)],
                         lane.fcproj[proj_index(L - 1)], BTl * C);
    checkpoint_out(lane, L - 1);
    cu::layernorm_forward(x, lane.lnf, lane.lnf_mean, lane.lnf_rstd, lane.res[L],
                          p16 + doffsets_[kLnfw], p16 + doffsets_[kLnfb], BTl, C);
    cu::matmul_forward_bf16(x, lane.logits, lane.lnf, p16 + doffsets_[kWte], nullptr, BTl, C, Vl);
    // Losses, and dlogits in place of the logits.
    float* losses = losses_ + lane.row0 * T;
    if (t_ == 1) {
      cu::softmax_cross_entropy(x, losses, lane.logits, lane.logits, targets_of(lane), BTl,
                                c_.vocab, Vl, dloss);
    } else {  // over the vocabulary split: the row maxima, then the sums, over the TP group
      cu::vocab_parallel_ce_max(x, lane.ce_max, lane.logits, BTl, vocab_valid_, Vl);
      lane_allreduce(lane, lane.ce_max, BTl, DeviceDtype::kFloat32, ReduceOp::kMax, true);
      cu::vocab_parallel_ce_sums(x, lane.ce_sums, lane.logits, lane.ce_max, targets_of(lane), BTl,
                                 vocab_lo_, vocab_valid_, Vl);
      lane_allreduce(lane, lane.ce_sums, 2 * BTl, DeviceDtype::kFloat32, ReduceOp::kSum, true);
      cu::vocab_parallel_ce_finish(x, losses, lane.logits, lane.logits, lane.ce_max,
                                   lane.ce_sums, targets_of(lane), BTl, vocab_lo_, vocab_valid_,
                                   Vl, dloss);
    }
  }
  if (static_cast<int64_t>(loss_host_.size()) <= micro_)  // first step only: no later allocation
    loss_host_.push_back(take_pinned<float>(BT, MemoryKind::kWorkspace));
  KT_CUDA_CHECK(
      cudaMemcpyAsync(loss_host_[micro_], losses_, bytes<float>(BT), cudaMemcpyDeviceToHost, s));
  ++micro_;

  // ---- backward: parameter gradients fp32 (accumulated), activation gradients bf16
  // Overwriting backward products (no memset first): dinp written, not accumulated. The
  // column-parallel products' input gradients (LM head, fc, qkv) are partial sums: all-reduced.
  const bool acc_dw = true, overwrite = false;
  for (Lane& lane : lanes_) {
    cu::matmul_backward_bf16(x, lane.dtmp_c, grads_ + doffsets_[kWte], nullptr, lane.logits,
                             lane.lnf, p16 + doffsets_[kWte], lane.B * T, C, Vl, acc_dw, overwrite);
    lane_allreduce(lane, lane.dtmp_c, lane.B * T * C, DeviceDtype::kBfloat16, ReduceOp::kSum,
                   false);
  }
  for (Lane& lane : lanes_) {
    const int64_t BTl = lane.B * T;
    finish_allreduce(lane);
    zero(lane.dres, bytes<bf16>(BTl * C));
    cu::layernorm_backward(x, lane.dres, grads_ + doffsets_[kLnfw], grads_ + doffsets_[kLnfb],
                           lane.dtmp_c, lane.res[L], p16 + doffsets_[kLnfw], lane.lnf_mean,
                           lane.lnf_rstd, BTl, C);
  }
  for (int64_t l = L - 1; l >= 0; --l) {
    const int64_t a = work_index(l);
    use_layer(l);  // a streamed layer: back in its slot (prefetched), gradients started there
    start_layer_grads(l);
    for (Lane& lane : lanes_) {  // this layer's checkpoint, and the next one's on its way
      checkpoint_in(lane, l, true);
      if (l > 0) checkpoint_in(lane, l - 1, false);
    }
    // With recompute, the working set holds the last layer's forward; the others re-run theirs.
    if (recompute_ != api::Recompute::kNone && l != L - 1)
      for (Lane& lane : lanes_) rerun_layer(lane, l);
    for (Lane& lane : lanes_) {  // MLP half: res[l+1] = res2 + fcproj, dres the gradient of both
      const int64_t BTl = lane.B * T;
      cu::matmul_backward_bf16(x, lane.dtmp_f, g(kFcprojw, l), g(kFcprojb, l), lane.dres,
                               lane.fchg[a], w(kFcprojw, l), BTl, Fl, C, acc_dw, overwrite);
      cu::gelu_backward(x, lane.dtmp_f, lane.fch[a], lane.dtmp_f, BTl * Fl, overwrite);
      cu::matmul_backward_bf16(x, lane.dtmp_c, g(kFcw, l), g(kFcb, l), lane.dtmp_f, lane.ln2[a],
                               w(kFcw, l), BTl, C, Fl, acc_dw, overwrite);
      lane_allreduce(lane, lane.dtmp_c, BTl * C, DeviceDtype::kBfloat16, ReduceOp::kSum, false);
    }
    for (Lane& lane : lanes_) {  // attention half: res2 = res[l] + attproj
      const int64_t B = lane.B, BTl = B * T;
      finish_allreduce(lane);
      cu::layernorm_backward(x, lane.dres, g(kLn2w, l), g(kLn2b, l), lane.dtmp_c, lane.res2[a],
                             w(kLn2w, l), lane.ln2_mean[a], lane.ln2_rstd[a], BTl, C);
      cu::matmul_backward_bf16(x, lane.dtmp_c, g(kAttprojw, l), g(kAttprojb, l), lane.dres,
                               lane.atty[a], w(kAttprojw, l), BTl, Cl, C, acc_dw, overwrite);
      if (flash_) {  // dqkv overwritten
        cu::attention_backward_bf16(x, lane.dtmp_3c, attention_scratch_, lane.dtmp_c,
                                    lane.qkv[a], lane.atty[a], lane.lse[a], B, T, Cl, NHl);
      } else {
        cu::cast_to_float(x, dc32_, lane.dtmp_c, BTl * Cl);
        cu::cast_to_float(x, qkv32_, lane.qkv[a], BTl * 3 * Cl);  // one fp32 qkv for all layers
        zero(dqkv32_, bytes<float>(BTl * 3 * Cl));
        cu::attention_backward(x, dqkv32_, dpreatt_, datt_, dc32_, qkv32_, lane.att[a], B, T, Cl,
                               NHl);
        cu::cast_to_bf16(x, lane.dtmp_3c, dqkv32_, BTl * 3 * Cl);
      }
      cu::matmul_backward_bf16(x, lane.dtmp_c, g(kQkvw, l), g(kQkvb, l), lane.dtmp_3c,
                               lane.ln1[a], w(kQkvw, l), BTl, C, 3 * Cl, acc_dw, overwrite);
      lane_allreduce(lane, lane.dtmp_c, BTl * C, DeviceDtype::kBfloat16, ReduceOp::kSum, false);
    }
    for (Lane& lane : lanes_) {
      finish_allreduce(lane);
      cu::layernorm_backward(x, lane.dres, g(kLn1w, l), g(kLn1b, l), lane.dtmp_c, lane.res[l],
                             w(kLn1w, l), lane.ln1_mean[a], lane.ln1_rstd[a], lane.B * T, C);
      checkpoint_done(lane, l);
    }
    // Layer l's gradients are final: sum (DP), copy (host units; a streamed layer's every time),
    // and its slot goes to the layer W below.
    unit_grads_final(l + 1, last);
    if (streamed(l) && l - window_ >= dev_layers_) load_layer(l - window_);
  }
  for (Lane& lane : lanes_) {
    if (t_ == 1)
      cu::embedding_backward(x, grads_ + doffsets_[kWte], grads_ + doffsets_[kWpe], lane.dres,
                             tokens_of(lane), lane.B, T, C);
    else  // the rows held here; wpe (replicated) from the same summed dres on every rank
      cu::embedding_backward_rows(x, grads_ + doffsets_[kWte], grads_ + doffsets_[kWpe], lane.dres,
                                  tokens_of(lane), lane.B, T, C, vocab_lo_, Vl);
  }
  unit_grads_final(0, last);
}

double CudaGpt::mean_loss() {
  device_.stream(StreamRole::kCompute).synchronize();
  const int64_t BT = B_ * T_;
  double sum = 0;
  for (int64_t m = 0; m < micro_; ++m) {
    host_reads("mean_loss", loss_host_[m], bytes<float>(BT));
    double micro = 0;
    for (int64_t i = 0; i < BT; ++i) micro += loss_host_[m][i];
    sum += micro / static_cast<double>(BT);
  }
  return micro_ > 0 ? sum / static_cast<double>(micro_) : 0.0;
}

double CudaGpt::grad_sum_of_squares() {
  double sharded_sum = 0, replicated_sum = 0;
  grad_sums_of_squares(&sharded_sum, &replicated_sum);
  return sharded_sum + replicated_sum;
}

void CudaGpt::grad_sums_of_squares(double* sharded_sum, double* replicated_sum) {
  CudaStream& compute = device_.stream(StreamRole::kCompute);
  join_reductions(compute);
  KT_CUDA_CHECK(cudaMemsetAsync(norm_, 0, bytes<double>(2), compute.handle()));
  if (t_ == 1) {
    cu::sum_of_squares(*ctx_, norm_ + 1, grads_, dev_params_);
  } else {
    for (int i = 0; i < kNumParamTensors; ++i)
      cu::sum_of_squares(*ctx_, norm_ + (sharded(i) ? 0 : 1), grads_ + doffsets_[i], dsizes_[i]);
  }
  KT_CUDA_CHECK(cudaMemcpyAsync(norm_host_, norm_, bytes<double>(2), cudaMemcpyDeviceToHost,
                                compute.handle()));
  compute.synchronize();
  host_reads("grad_sums_of_squares", norm_host_, bytes<double>(2));
  *sharded_sum = norm_host_[0];
  *replicated_sum = norm_host_[1];
  // The streamed layers' gradients are only in host memory.
  for (int64_t l = dev_layers_; l < c_.layers && window_ > 0; ++l) {
    const Unit& u = units_[l + 1];
    u.grads_copied->synchronize();
    for (const HostSlice& sl : u.host_slices) {
      host_reads("grad_sums_of_squares", hgrads_ + sl.packed, bytes<float>(sl.count));
      double sum = 0;
      for (int64_t i = 0; i < sl.count; ++i)
        sum += static_cast<double>(hgrads_[sl.packed + i]) * hgrads_[sl.packed + i];
      *(sharded(sl.tensor) ? sharded_sum : replicated_sum) += sum;
    }
  }
}

void CudaGpt::update(const kernels::AdamWStep& step, float weight_decay) {
  join_reductions(device_.stream(StreamRole::kCompute));
  for (int decays = 0; decays < 2; ++decays) {
    if (device_tensors_[decays].empty()) continue;
    kernels::AdamWStep s = step;
    s.weight_decay = decays ? weight_decay : 0.0f;
    cu::adamw_update_multi(*ctx_, device_tensors_[decays].data(),
                           static_cast<int>(device_tensors_[decays].size()), s);
  }
  // The host units, in the order the next forward reads them.
  for (int64_t u = device_units_; u <= c_.layers; ++u) {
    std::lock_guard lock(mutex_);
    units_[u].pending = true;
    cpu_tasks_.push_back([this, u, step, weight_decay] { cpu_update(u, step, weight_decay); });
  }
  changed_.notify_all();
}

void CudaGpt::cpu_update(int64_t unit, kernels::AdamWStep step, float weight_decay) {
  Unit& u = units_[unit];
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
      KT_CUDA_CHECK(cudaMemcpyAsync(params16_ + dev_offset(s.tensor, s.offset),
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

void CudaGpt::run_cpu_tasks() {
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

void CudaGpt::wait_cpu_idle() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return (cpu_tasks_.empty() && !cpu_busy_) || !cpu_thread_.joinable(); });
  if (cpu_error_) std::rethrow_exception(cpu_error_);
}

void CudaGpt::synchronize() {
  wait_cpu_idle();
  device_.synchronize();
}

double CudaGpt::cpu_optimizer_seconds() const {
  std::lock_guard lock(mutex_);
  return cpu_seconds_;
}

}  // namespace kt::worker

#include "worker/offload.h"

#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>

#include "api/error.h"
#include "api/quantity.h"
#include "worker/pipeline_order.h"

namespace kt::worker {

namespace k = kernels::cpu;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A unit's slices of a model buffer (llm.c layout) to and from one contiguous host block.
void gather(float* block, const float* base, const std::vector<Gpt::Slice>& slices) {
  for (const auto& s : slices) {
    std::memcpy(block, base + s.offset, s.count * sizeof(float));
    block += s.count;
  }
}
void scatter(float* base, const float* block, const std::vector<Gpt::Slice>& slices) {
  for (const auto& s : slices) {
    std::memcpy(base + s.offset, block, s.count * sizeof(float));
    block += s.count;
  }
}
// The same for pieces given by pointer (activation checkpoints).
using Pieces = std::vector<std::pair<float*, int64_t>>;
void gather(float* block, const Pieces& pieces) {
  for (const auto& [data, count] : pieces) {
    std::memcpy(block, data, count * sizeof(float));
    block += count;
  }
}
void scatter(const Pieces& pieces, const float* block) {
  for (const auto& [data, count] : pieces) {
    std::memcpy(data, block, count * sizeof(float));
    block += count;
  }
}

// Units updated on the device: all of the model's without offload (a pipeline stage or a
// cutpoint's segment holds some of the layers and the embeddings' unit), else the plan's first
// gpuUnits (of each stage: its copy of the embeddings' unit, then its layers).
int64_t device_units(const api::Plan& plan, const Gpt& model) {
  return plan.config.offload == api::OffloadMode::kNone ? model.config().layers + 1
                                                        : plan.config.gpu_units;
}

}  // namespace

int64_t available_host_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

int64_t offload_host_bytes(const api::Plan& plan) {
  // Per rank: master + gradient copy of every CPU-updated unit, and the activation checkpoints of
  // the streamed layers (per the model's layout: Gpt::layer_checkpoint_slices); the AdamW
  // moments of every unit when anything is offloaded.
  if (plan.config.offload == api::OffloadMode::kNone) return 0;
  const auto& m = plan.model;
  const int64_t t = plan.config.tp, C = m.hidden, F = m.ffn_hidden;
  const int64_t layer = (4 * C * C + 2 * C * F + 3 * C + F) / t + 6 * C;
  const int64_t embedding = m.padded_vocab() / t * C + m.seq_len * C + 2 * C;
  // (per pipeline stage: its layers and its copy of the embeddings' unit, gpuUnits of them on the
  // device)
  const int64_t L = m.layers / std::max<int64_t>(1, plan.config.pp),
                gpu_units = plan.config.gpu_units;
  const int64_t cpu_layers = std::min(L, L + 1 - gpu_units);
  const int64_t cpu_floats = cpu_layers * layer + (gpu_units == 0 ? embedding : 0);
  const int64_t all_floats = L * layer + embedding;
  int64_t floats = 2 * cpu_floats + 2 * all_floats;
  if (plan.config.offload == api::OffloadMode::kWindow) {
    const int64_t BTC = plan.config.micro_batch * m.seq_len * C;
    // (worker/recompute.h; window offload is refused without recompute)
    const int64_t per_layer = std::max(1, checkpoint_tensors(plan.config.recompute)) * BTC;
    // One per micro-batch in flight: a pipeline stage's first (of the first stage: the most).
    int64_t in_flight = 1;
    if (plan.config.pp > 1 && pipeline_order_refusal(static_cast<int>(plan.config.pp),
                                                     static_cast<int>(plan.config.virtual_stages),
                                                     plan.config.grad_accum)
                                  .empty())
      for (int n : pipeline_order(static_cast<int>(plan.config.pp), 0,
                                  static_cast<int>(plan.config.virtual_stages),
                                  plan.config.grad_accum)
                       .in_flight)
        in_flight = std::max<int64_t>(in_flight, n);
    floats += cpu_layers * per_layer * in_flight;
  }
  return floats * static_cast<int64_t>(sizeof(float));
}

void check_host_memory(const api::Plan& plan, int64_t available_bytes) {
  if (plan.config.offload == api::OffloadMode::kNone) return;
  if (available_bytes <= 0) available_bytes = available_host_bytes();
  if (available_bytes <= 0) return;  // cannot tell: let the allocation decide
  int64_t per_rank = offload_host_bytes(plan);
  if (plan.config.pp > 1 && plan.config.cut_layer > 0)  // per-stage TP: the larger layout's
    per_rank = std::max(per_rank, offload_host_bytes(api::after_cut_layout(plan)));
  // On the CPU backend the "device" memory is host memory as well.
  const double device = plan.device == api::DeviceKind::kCpu ? plan.predicted.memory.total() : 0;
  const double needed =
      static_cast<double>(plan.config.procs_per_node) * (static_cast<double>(per_rank) + device);
  if (needed > static_cast<double>(available_bytes))
    throw Error("cannot execute this plan: offload " +
                std::string(api::to_string(plan.config.offload)) + " needs " +
                api::format_bytes(needed) + " of host memory on this node (" +
                std::to_string(plan.config.procs_per_node) + " rank(s) × " +
                api::format_bytes(static_cast<double>(per_rank)) +
                " of master weights, AdamW moments, gradient copies and activation checkpoints" +
                (device > 0 ? " + " + api::format_bytes(device) + " of CPU-device memory" : "") +
                "), but only " + api::format_bytes(static_cast<double>(available_bytes)) +
                " is available (MemAvailable); lower spec.parallelism.gpuUpdateFraction's "
                "complement or use more nodes");
}

OffloadEngine::OffloadEngine(const api::Plan& plan, Gpt& model, Communicator* dp,
                             OffloadOptions options)
    : model_(model),
      dp_(dp && dp->size() > 1 ? dp : nullptr),
      options_(options),
      host_(Device::host()),
      epoch_(Clock::now()) {
  const int64_t L = model.config().layers;
  const auto mode = plan.config.offload;
  // (A pipeline stage, which runs without offload, holds fewer layers than the plan's model.)
  const int64_t gpu_units = options.device_units >= 0 && mode != api::OffloadMode::kNone
                                ? options.device_units
                                : device_units(plan, model);
  KT_CHECK(gpu_units >= 0 && gpu_units <= L + 1, "gpuUnits out of range");
  const bool window = mode == api::OffloadMode::kWindow;
  KT_CHECK(!window || gpu_units >= 1, "window offload keeps the embeddings on the device");
  units_.resize(L + 1);
  dp_buckets_.resize(L + 1);
  first_streamed_ = window ? gpu_units : L + 1;
  num_streamed_ = L + 1 - first_streamed_;
  slots_ = window ? std::min<int64_t>(plan.config.window, num_streamed_) : 0;
  // (A virtual stage's chunk may have every layer on the device: nothing to stream there.)
  KT_CHECK(!window || num_streamed_ == 0 || slots_ >= 1, "a window needs at least one slot");
  for (int64_t u = 0; u <= L; ++u) {
    Unit& unit = units_[u];
    unit.slices = model.unit_slices(u);
    for (const auto& s : unit.slices) unit.floats += s.count;
    unit.cpu = u >= gpu_units;
    unit.streamed = window && u >= first_streamed_;
  }
  zero_ = plan.config.distributed_optimizer && dp_;
  Device& device = *model.device();
  // Where the moments live: on the device without offload, in host memory with it.
  Device& moments = mode == api::OffloadMode::kNone ? device : *host_;
  if (zero_) {
    const int64_t d = dp_->size(), r = dp_->rank();
    int64_t total = 0;
    shards_.resize(L + 1);
    for (int64_t u = 0; u <= L; ++u) {
      Shard& shard = shards_[u];
      shard.size = (units_[u].floats + d - 1) / d;
      shard.begin = std::min(r * shard.size, units_[u].floats);
      shard.end = std::min((r + 1) * shard.size, units_[u].floats);
      shard.offset = total;
      total += shard.size;
    }
    shard_m_ = moments.allocate_floats(total, MemoryKind::kOptimizer);
    shard_v_ = moments.allocate_floats(total, MemoryKind::kOptimizer);
    shard_grads_ = device.allocate_floats(total, MemoryKind::kGrads);
    shard_send_ = device.allocate_floats(total, MemoryKind::kWorkspace);
    gathers_.resize(L + 1);
  }
  for (int64_t u = 0; u <= L; ++u) {
    Unit& unit = units_[u];
    // With the distributed optimizer, the rank's shard only — but a streamed layer keeps its
    // whole master (what its slot is loaded from) and gradient accumulator (every micro-batch's
    // gradients summed before the reduce-scatter), and updates its shard of the master in place.
    if (unit.cpu) {
      const int64_t floats = zero_ && !unit.streamed ? shards_[u].size : unit.floats;
      unit.master = host_->allocate_floats(floats, MemoryKind::kParams);
      unit.grads = host_->allocate_floats(floats, MemoryKind::kGrads);
    }
    if (unit.streamed) {
      unit.stream_index = u - first_streamed_;
      int64_t floats = 0;
      for (const auto& [data, count] : model.layer_checkpoint_slices(u - 1)) floats += count;
      KT_CHECK(floats > 0, "window offload streams activation checkpoints: it needs recompute");
      unit.checkpoints.resize(static_cast<size_t>(model.stage().in_flight));
      for (Checkpoint& checkpoint : unit.checkpoints)
        checkpoint.host = host_->allocate_floats(floats, MemoryKind::kActivations);
    }
  }
  m_ = moments.allocate_floats(model.num_parameters(), MemoryKind::kOptimizer);
  v_ = moments.allocate_floats(model.num_parameters(), MemoryKind::kOptimizer);
  // The lanes' kernels (CPU AdamW, bf16 rounding) run on their lane's thread alone. OpenMP would
  // give each lane a team of every core, beside the compute's team on the same cores: spinning
  // teams that oversubscribe the rank (measured, 2 cores, window 2 + commAware: step 150 → 134 ms
  // single-threaded, the device AdamW 5.1 → 1.3 ms).
  for (Stream* lane : {&h2d_, &d2h_, &cpu_}) lane->enqueue([] { omp_set_num_threads(1); });
}

OffloadEngine::~OffloadEngine() {
  try {
    synchronize();
  } catch (...) {  // a failed lane has already been reported by whoever synchronized first
  }
}

void OffloadEngine::start() {
  synchronize();
  for (int64_t u = 0; u < static_cast<int64_t>(units_.size()); ++u) {
    Unit& unit = units_[u];
    if (!unit.cpu) continue;
    if (zero_ && !unit.streamed)  // the master weights of the rank's shard
      for_each_shard_piece(u, [&](int, int64_t at, int64_t in_shard, int64_t n) {
        std::memcpy(unit.master.data() + in_shard, model_.params() + at, n * sizeof(float));
      });
    else
      gather(unit.master.data(), model_.params(), unit.slices);
    unit.residency = Residency::kResident;
  }
  for (int64_t i = slots_; i < num_streamed_; ++i) evict(streamed_unit(i));
  if (zero_ && m_.data()) {  // keep this rank's shard of the (restored or zero) moments
    for (int64_t u = 0; u < static_cast<int64_t>(units_.size()); ++u)
      for_each_shard_piece(u, [&](int, int64_t at, int64_t in_shard, int64_t n) {
        const int64_t to = shards_[u].offset + in_shard;
        std::memcpy(shard_m_.data() + to, m_.data() + at, n * sizeof(float));
        std::memcpy(shard_v_.data() + to, v_.data() + at, n * sizeof(float));
      });
    m_ = DeviceBuffer();
    v_ = DeviceBuffer();
  }
}

void OffloadEngine::for_each_shard_piece(
    int64_t u, const std::function<void(int, int64_t, int64_t, int64_t)>& fn) const {
  const Shard& shard = shards_[u];
  int64_t position = 0;  // in the unit's packed parameters
  for (const auto& s : units_[u].slices) {
    const int64_t lo = std::max(position, shard.begin);
    const int64_t hi = std::min(position + s.count, shard.end);
    if (lo < hi) fn(s.tensor, s.offset + (lo - position), lo - shard.begin, hi - lo);
    position += s.count;
  }
}

std::shared_ptr<CommWork> OffloadEngine::reduce_scatter_unit(int64_t u) {
  const Shard& shard = shards_[u];
  std::vector<float>& bucket = dp_buckets_[u];
  bucket.assign(static_cast<size_t>(shard.size * dp_->size()), 0.0f);  // the padding sums zeros
  gather(bucket.data(), model_.grads(), units_[u].slices);
  return dp_->reduce_scatter_async(bucket.data(), shard_grads_.data() + shard.offset,
                                   static_cast<size_t>(shard.size));
}

void OffloadEngine::all_gather_shards(const float* shards, float* full) {
  const int64_t d = dp_->size();
  for (int64_t u = 0; u < static_cast<int64_t>(units_.size()); ++u) {
    const Shard& shard = shards_[u];
    std::vector<float>& bucket = dp_buckets_[u];
    bucket.resize(static_cast<size_t>(shard.size * d));
    dp_->allgather(shards + shard.offset, bucket.data(), static_cast<size_t>(shard.size));
    scatter(full, bucket.data(), units_[u].slices);
  }
}

void OffloadEngine::update_shards(const kernels::AdamWStep& step, float weight_decay) {
  float* params = model_.params();
  for (int64_t u = unit0_used_ ? 0 : 1; u < static_cast<int64_t>(units_.size()); ++u) {
    const int64_t at = shards_[u].offset;
    float* send = shard_send_.data() + at;  // the shard's new values, padding zero
    std::fill(send, send + shards_[u].size, 0.0f);
    Unit& unit = units_[u];
    if (unit.cpu) wait_on_compute(unit.grads_home);
    const auto t0 = Clock::now();
    for_each_shard_piece(u, [&](int tensor, int64_t model_at, int64_t in_shard, int64_t n) {
      kernels::AdamWStep ts = step;
      ts.weight_decay = Gpt::decays(tensor) ? weight_decay : 0.0f;
      const int64_t i = at + in_shard;
      if (unit.streamed) {
        // Streamed: the shard of its whole master in place, from the reduce-scattered sums.
        float* master = unit.master.data() + shards_[u].begin + in_shard;
        k::adamw_update(master, shard_grads_.data() + i, shard_m_.data() + i, shard_v_.data() + i,
                        n, ts);
        std::memcpy(send + in_shard, master, n * sizeof(float));
        return;
      }
      if (unit.cpu) {
        // Offloaded: the shard's master weights, gradients and moments in host memory (the
        // SynergyScale split per shard); its new values go to the device by the all-gather.
        float* master = unit.master.data() + in_shard;
        k::adamw_update(master, unit.grads.data() + in_shard, shard_m_.data() + i,
                        shard_v_.data() + i, n, ts);
        std::memcpy(send + in_shard, master, n * sizeof(float));
        return;
      }
      k::adamw_update(params + model_at, shard_grads_.data() + i, shard_m_.data() + i,
                      shard_v_.data() + i, n, ts);
      std::memcpy(send + in_shard, params + model_at, n * sizeof(float));
    });
    if (unit.cpu) cpu_seconds_.fetch_add(seconds_between(t0, Clock::now()));
    if (unit.cpu && !unit.streamed)
      h2d_bytes_ += shards_[u].size * static_cast<int64_t>(sizeof(float));
    std::vector<float>& bucket = dp_buckets_[u];
    bucket.resize(static_cast<size_t>(shards_[u].size * dp_->size()));
    if (unit.streamed) {
      // Every rank's shard into the whole master now (host memory to host memory: the slots
      // load from it), and into the device where the layer is in a slot.
      dp_->allgather(send, bucket.data(), static_cast<size_t>(shards_[u].size));
      std::memcpy(unit.master.data(), bucket.data(), unit.floats * sizeof(float));
      if (unit.residency != Residency::kEvicted) {  // in its slot: the new values go there too
        scatter(model_.params(), unit.master.data(), unit.slices);
        h2d_bytes_ += unit.floats * static_cast<int64_t>(sizeof(float));
      }
      continue;
    }
    // Every rank's shard into the unit's bucket, beside the next forward until it reads the unit
    // (before_forward; Megatron's --overlap-param-gather). Units in the order the forward
    // reads them. The forward's refresh rounds the bf16 copy from the gathered values.
    gathers_[u] = dp_->allgather_async(send, bucket.data(), static_cast<size_t>(shards_[u].size));
  }
}

void OffloadEngine::finish_gather(int64_t u) {
  if (!gathers_[u]) return;
  gathers_[u]->wait();
  gathers_[u].reset();
  scatter(model_.params(), dp_buckets_[u].data(), units_[u].slices);
}

void OffloadEngine::span(const std::string& lane, const std::string& what, Clock::time_point start) {
  const Clock::time_point end = Clock::now();
  if (lane == "h2d" || lane == "d2h") transfer_seconds_.fetch_add(seconds_between(start, end));
  if (!options_.record_timeline) return;
  std::lock_guard lock(timeline_mutex_);
  timeline_.push_back({lane, what, seconds_between(epoch_, start), seconds_between(epoch_, end)});
}

void OffloadEngine::wait_on_compute(const Event& event) {
  const Clock::time_point start = Clock::now();
  event.synchronize();
  exposed_transfer_seconds_ += seconds_between(start, Clock::now());
}

std::vector<LaneSpan> OffloadEngine::timeline() const {
  std::lock_guard lock(timeline_mutex_);
  return timeline_;
}

void OffloadEngine::clear_timeline() {
  std::lock_guard lock(timeline_mutex_);
  timeline_.clear();
}

void OffloadEngine::evict(int64_t u) {
  Unit& unit = units_[u];
  KT_CHECK(unit.streamed && unit.residency == Residency::kResident,
           "only a resident streamed layer can leave its slot");
  unit.residency = Residency::kEvicted;
  if (!options_.poison_evicted) return;
  float* device = model_.params();
  for (const auto& s : unit.slices)
    std::fill(device + s.offset, device + s.offset + s.count,
              std::numeric_limits<float>::quiet_NaN());
}

void OffloadEngine::fetch(int64_t u) {
  Unit& unit = units_[u];
  KT_CHECK(unit.streamed && unit.residency == Residency::kEvicted,
           "fetching a layer that is not evicted");
  unit.residency = Residency::kFetching;
  h2d_.wait(unit.updated);  // last step's CPU AdamW of this layer
  h2d_.enqueue([this, u] {
    const auto t0 = Clock::now();
    const Unit& unit = units_[u];
    scatter(model_.params(), unit.master.data(), unit.slices);
    span("h2d", "params L" + std::to_string(u - 1), t0);
  });
  h2d_bytes_ += unit.floats * static_cast<int64_t>(sizeof(float));
  unit.landed = h2d_.record();
}

void OffloadEngine::wait_landed(int64_t u, const char* pass) {
  Unit& unit = units_[u];
  if (unit.residency == Residency::kEvicted)
    check_failed("residency", __FILE__, __LINE__,
                 "offload unit " + std::to_string(u) + " is read in the " + pass +
                     " while its parameters are not on the device");
  wait_on_compute(unit.landed);
  unit.residency = Residency::kResident;
}

void OffloadEngine::begin_micro_batch(int64_t micro, int64_t micro_batches) {
  micro_ = micro;
  micro_batches_ = micro_batches;
}

void OffloadEngine::before_forward(int64_t u) {
  if (zero_) finish_gather(u);
  if (u == first_streamed_ && units_[u].streamed) begin_sweep(/*forward=*/true);
  wait_landed(u, "forward");
  compute_start_ = Clock::now();
}

void OffloadEngine::forward_params_done(int64_t u) {
  span("compute", "fwd " + (u == 0 ? std::string("emb/head") : "L" + std::to_string(u - 1)),
       compute_start_);
  const Unit& unit = units_[u];
  // The last `slots` streamed layers stay for the backward; the others free their slot for the
  // layer `slots` further up.
  if (!unit.streamed || unit.stream_index >= num_streamed_ - slots_) return;
  evict(u);
  fetch(streamed_unit(unit.stream_index + slots_));
}

void OffloadEngine::forward_activations_done(int64_t u) {
  Unit& unit = units_[u];
  if (!unit.streamed) return;
  // (the model's active slot: the micro-batch this forward runs)
  Checkpoint& checkpoint = unit.checkpoints[static_cast<size_t>(model_.active_slot())];
  auto slices = model_.layer_checkpoint_slices(u - 1);
  d2h_bytes_ += checkpoint.host.size() * sizeof(float);
  d2h_.enqueue([this, u, slices, to = checkpoint.host.data()] {
    const auto t0 = Clock::now();
    gather(to, slices);
    span("d2h", "ckpt L" + std::to_string(u - 1), t0);
  });
  checkpoint.home = d2h_.record();
  checkpoint.has_back = false;
}

void OffloadEngine::copy_checkpoint_back(int64_t u) {
  Unit& unit = units_[u];
  if (!unit.streamed) return;
  Checkpoint& checkpoint = unit.checkpoints[static_cast<size_t>(model_.active_slot())];
  if (checkpoint.has_back) return;
  auto slices = model_.layer_checkpoint_slices(u - 1);
  h2d_.wait(checkpoint.home);
  h2d_bytes_ += checkpoint.host.size() * sizeof(float);
  h2d_.enqueue([this, u, slices, from = checkpoint.host.data()] {
    const auto t0 = Clock::now();
    scatter(slices, from);
    span("h2d", "ckpt L" + std::to_string(u - 1), t0);
  });
  checkpoint.back = h2d_.record();
  checkpoint.has_back = true;
}

void OffloadEngine::begin_sweep(bool forward) {
  auto wanted = [&](int64_t i) { return forward ? i < slots_ : i >= num_streamed_ - slots_; };
  for (int64_t i = 0; i < num_streamed_; ++i) {
    Unit& unit = units_[streamed_unit(i)];
    if (wanted(i) || unit.residency == Residency::kEvicted) continue;
    if (unit.residency == Residency::kFetching) wait_landed(streamed_unit(i), "sweep's start");
    evict(streamed_unit(i));
  }
  for (int64_t i = 0; i < num_streamed_; ++i)
    if (wanted(i) && units_[streamed_unit(i)].residency == Residency::kEvicted)
      fetch(streamed_unit(i));
}

void OffloadEngine::before_backward(int64_t u) {
  if (units_[u].streamed) {
    if (u + 1 == static_cast<int64_t>(units_.size())) begin_sweep(/*forward=*/false);
    copy_checkpoint_back(u);
    // The next layer down's checkpoint travels while this layer computes.
    if (u - 1 >= first_streamed_) copy_checkpoint_back(u - 1);
    wait_on_compute(
        units_[u].checkpoints[static_cast<size_t>(model_.active_slot())].back);
  }
  wait_landed(u, "backward");
  compute_start_ = Clock::now();
}

void OffloadEngine::copy_grads_home(int64_t u, std::vector<std::shared_ptr<CommWork>> dp_work) {
  Unit& unit = units_[u];
  // Streamed layers send every micro-batch's gradients and accumulate them in host memory; the
  // device copy is zeroed for the next micro-batch to accumulate into.
  const bool accumulate = unit.streamed && micro_ > 0;
  const bool zero_after = unit.streamed;
  // The distributed optimizer: the rank's shard of the sums, once the reduce-scatter is done.
  const bool shard = zero_ && !unit.streamed;
  d2h_.enqueue([this, u, dp_work = std::move(dp_work), accumulate, zero_after, shard] {
    for (const auto& work : dp_work) work->wait();
    const auto t0 = Clock::now();
    const Unit& unit = units_[u];
    float* host = unit.grads.data();
    if (shard) {
      std::memcpy(host, shard_grads_.data() + shards_[u].offset,
                  shards_[u].size * sizeof(float));
      span("d2h", "grad shard " + (u == 0 ? std::string("emb") : "L" + std::to_string(u - 1)), t0);
      return;
    }
    float* device = model_.grads();
    for (const auto& s : unit.slices) {
      float* src = device + s.offset;
      if (accumulate)
        for (int64_t i = 0; i < s.count; ++i) host[i] += src[i];
      else
        std::memcpy(host, src, s.count * sizeof(float));
      if (zero_after) std::memset(src, 0, s.count * sizeof(float));
      host += s.count;
    }
    span("d2h", "grads " + (u == 0 ? std::string("emb") : "L" + std::to_string(u - 1)), t0);
  });
  d2h_bytes_ += (shard ? shards_[u].size : unit.floats) * static_cast<int64_t>(sizeof(float));
  unit.grads_home = d2h_.record();
}

namespace {

// The DP sum of a unit's gradient tensors as one all-reduce of a packed bucket (PyTorch DDP's and
// Megatron's gradient buckets): a layer has 12 tensors, 8 of them biases or LayerNorm vectors,
// and an all-reduce of each costs a round trip between the ranks — between CPU ranks that share
// their cores with the backward, milliseconds each (2 ranks here: 52 all-reduces a step took
// 95 ms on the comm thread; packed, 5). wait() unpacks the sums, once, whoever waits first.
// `bucket` is the unit's, owned by the engine and untouched until this work is waited for.
class BucketWork : public CommWork {
 public:
  BucketWork(Communicator& group, Pieces pieces, std::vector<float>& bucket)
      : pieces_(std::move(pieces)), bucket_(bucket) {
    int64_t floats = 0;
    for (const auto& piece : pieces_) floats += piece.second;
    bucket_.resize(static_cast<size_t>(floats));
    gather(bucket_.data(), pieces_);
    inner_ = group.allreduce_async(bucket_.data(), bucket_.size(), ReduceOp::kSum);
  }
  void wait() override {
    std::call_once(unpacked_, [this] {
      inner_->wait();
      scatter(pieces_, bucket_.data());
    });
  }

 private:
  Pieces pieces_;
  std::vector<float>& bucket_;
  std::shared_ptr<CommWork> inner_;
  std::once_flag unpacked_;
};

}  // namespace

std::vector<std::shared_ptr<CommWork>> OffloadEngine::reduce(int64_t u, const Pieces& slices) {
  std::vector<std::shared_ptr<CommWork>> works;
  if (!dp_ || micro_ + 1 != micro_batches_ || slices.empty()) return works;
  if (zero_)  // the unit's whole bucket, its slices in the order the shards are cut
    works.push_back(reduce_scatter_unit(u));
  else if (slices.size() == 1)
    works.push_back(dp_->allreduce_async(slices[0].first, static_cast<size_t>(slices[0].second),
                                         ReduceOp::kSum));
  else
    works.push_back(std::make_shared<BucketWork>(*dp_, slices, dp_buckets_[u]));
  reductions_.insert(reductions_.end(), works.begin(), works.end());
  return works;
}

void OffloadEngine::grads_final(int64_t u) {
  if (u == 0) return embedding_grads_final();
  span("compute", "bwd L" + std::to_string(u - 1), compute_start_);
  Unit& unit = units_[u];
  const bool last = micro_ + 1 == micro_batches_;
  if (unit.streamed) {  // (its gradients are all-reduced in host memory, by finish_backward)
    copy_grads_home(u, {});
    // The first `slots` streamed layers stay for the next forward; the others give their slot
    // to the layer `slots` further down, once their gradients have left it.
    if (unit.stream_index >= slots_) {
      evict(u);
      h2d_.wait(unit.grads_home);
      fetch(streamed_unit(unit.stream_index - slots_));
    }
  } else if (last) {  // before the last micro-batch there is nothing to sum or copy yet
    auto dp_work = reduce(u, model_.layer_gradient_slices(u - 1));
    if (unit.cpu) copy_grads_home(u, std::move(dp_work));
  }
  compute_start_ = Clock::now();
}

void OffloadEngine::embedding_grads_final() {
  // The tensors that are not per layer: the embeddings (wte also takes the LM head's gradient)
  // and the final LayerNorm; summed and copied after the last micro-batch only.
  if (micro_ + 1 != micro_batches_ || !unit0_used_ || unit0_elsewhere_) return;
  // Pipeline stages: the sum over the embedding group waits for finish_backward, because the
  // first stage is still computing the backward this stage's last input gradient feeds.
  if (embedding_)
    unit0_deferred_ = true;
  else
    reduce_unit0();
}

void OffloadEngine::reduce_unit0() {
  std::vector<std::pair<float*, int64_t>> slices;
  const auto views = model_.gradient_views();
  for (int i = 0; i < kNumParamTensors; ++i)
    if (!kParams[static_cast<size_t>(i)].per_layer)
      slices.emplace_back(views[i].data, views[i].numel());
  // Pipeline stages: wte's gradient from the embedding (first stage) and from the LM head (last)
  // summed, with wpe's (first only) and the final LayerNorm's (last only), in one bucket.
  if (embedding_) {
    std::vector<float>& bucket = dp_buckets_[0];  // free: the DP sum below packs it anew
    bucket.resize(static_cast<size_t>(units_[0].floats));
    gather(bucket.data(), slices);
    embedding_->allreduce(bucket.data(), bucket.size());
    scatter(slices, bucket.data());
  }
  auto dp_work = reduce(0, slices);
  if (units_[0].cpu) copy_grads_home(0, std::move(dp_work));
}

void OffloadEngine::unit0_summed() {
  KT_CHECK(unit0_elsewhere_, "unit0_summed follows reduce_unit0_elsewhere");
  if (!zero_) return;
  // The unit packed as reduce_scatter_unit packs it; rank r's shard is block r. (The bucket is
  // free: the forward waited for its last all-gather before reading unit 0.)
  const Shard& shard = shards_[0];
  std::vector<float>& bucket = dp_buckets_[0];
  bucket.assign(static_cast<size_t>(shard.size * dp_->size()), 0.0f);
  gather(bucket.data(), model_.grads(), units_[0].slices);
  std::memcpy(shard_grads_.data() + shard.offset, bucket.data() + dp_->rank() * shard.size,
              static_cast<size_t>(shard.size) * sizeof(float));
}

void OffloadEngine::finish_backward() {
  if (unit0_deferred_) {
    unit0_deferred_ = false;
    reduce_unit0();
  }
  for (auto& work : reductions_) work->wait();
  reductions_.clear();
  const Clock::time_point start = Clock::now();
  d2h_.synchronize();
  exposed_transfer_seconds_ += seconds_between(start, Clock::now());
  if (!dp_) return;
  for (int64_t u = static_cast<int64_t>(units_.size()) - 1; u >= first_streamed_; --u) {
    Unit& unit = units_[u];
    if (!zero_) {
      dp_->allreduce(unit.grads.data(), static_cast<size_t>(unit.floats), ReduceOp::kSum);
      continue;
    }
    // The distributed optimizer: the rank's shard of the sums (the other units' reduce-scatters
    // were among the reductions), packed and padded as reduce_scatter_unit packs.
    const Shard& shard = shards_[u];
    std::vector<float>& bucket = dp_buckets_[u];
    bucket.assign(static_cast<size_t>(shard.size * dp_->size()), 0.0f);
    std::memcpy(bucket.data(), unit.grads.data(), unit.floats * sizeof(float));
    dp_->reduce_scatter_async(bucket.data(), shard_grads_.data() + shard.offset,
                              static_cast<size_t>(shard.size))
        ->wait();
  }
}

void OffloadEngine::sum_of_squares(double out[2]) const {
  out[0] = out[1] = 0;
  if (zero_) {  // over this rank's shards, then summed over the DP group
    for (int64_t u = norm_counts_unit0_ ? 0 : 1; u < static_cast<int64_t>(units_.size()); ++u)
      for_each_shard_piece(u, [&](int tensor, int64_t, int64_t in_shard, int64_t n) {
        out[model_.sharded(tensor) ? 0 : 1] +=
            k::sum_of_squares(shard_grads_.data() + shards_[u].offset + in_shard, n);
      });
    allreduce_doubles(*dp_, out, 2);
    return;
  }
  const float* device = model_.grads();
  for (const auto& unit : units_) {
    if (&unit == &units_[0] && !norm_counts_unit0_) continue;
    const float* host = unit.cpu ? unit.grads.data() : nullptr;
    for (const auto& s : unit.slices) {
      const float* g = host ? host : device + s.offset;
      out[model_.sharded(s.tensor) ? 0 : 1] += k::sum_of_squares(g, s.count);
      if (host) host += s.count;
    }
  }
}

void update_on_device(Gpt& model, int64_t unit, float* m, float* v, kernels::AdamWStep step,
                      float weight_decay) {
  float* params = model.params();
  const float* grads = model.grads();
  uint16_t* bf16 = model.bf16_weights();
  for (const auto& s : model.unit_slices(unit)) {
    kernels::AdamWStep ts = step;
    ts.weight_decay = Gpt::decays(s.tensor) ? weight_decay : 0.0f;
    if (bf16 && kParams[static_cast<size_t>(s.tensor)].matmul_weight)
      k::adamw_update_mixed(params + s.offset, grads + s.offset, nullptr, m + s.offset,
                            v + s.offset, bf16 + s.offset, s.count, ts);
    else
      k::adamw_update(params + s.offset, grads + s.offset, m + s.offset, v + s.offset, s.count,
                      ts);
  }
  model.bf16_written(unit);
}

void OffloadEngine::update(kernels::AdamWStep step, float weight_decay) {
  auto for_tensor = [&](int tensor) {
    kernels::AdamWStep s = step;
    s.weight_decay = Gpt::decays(tensor) ? weight_decay : 0.0f;
    return s;
  };
  // Device units, on the compute lane.
  const auto t0 = Clock::now();
  if (zero_) {
    update_shards(step, weight_decay);
    device_seconds_ += seconds_between(t0, Clock::now());
    span("compute", "adam shards", t0);
    return;
  }
  for (int64_t u = 0; u < static_cast<int64_t>(units_.size()); ++u)
    if (!units_[u].cpu && (u > 0 || unit0_used_))
      update_on_device(model_, u, m_.data(), v_.data(), step, weight_decay);
  device_seconds_ += seconds_between(t0, Clock::now());
  span("compute", "adam device", t0);

  // CPU units in the order the next forward needs them; each tile's new parameters go back to
  // the device while the pool computes the next tile. (A pipeline stage between the first and
  // the last neither sums nor updates its copy of unit 0.)
  for (int64_t u = 0; u < static_cast<int64_t>(units_.size()); ++u) {
    Unit& unit = units_[u];
    if (!unit.cpu || (u == 0 && !unit0_used_)) continue;
    // A streamed layer outside the slots is fetched by the next forward's prefetch.
    const bool on_device = !unit.streamed || unit.residency != Residency::kEvicted;
    int64_t position = 0;  // in the unit's host blocks
    for (const auto& s : unit.slices) {
      for (int64_t begin = 0; begin < s.count; begin += options_.tile_floats) {
        const int64_t n = std::min(options_.tile_floats, s.count - begin);
        const int64_t host_at = position + begin, model_at = s.offset + begin;
        const kernels::AdamWStep tile_step = for_tensor(s.tensor);
        cpu_.enqueue([this, u, host_at, model_at, n, tile_step] {
          const auto t1 = Clock::now();
          Unit& unit = units_[u];
          // fp32 here; a bf16 plan passes bf16 gradients and takes bf16 weights for the device.
          k::adamw_update_mixed(unit.master.data() + host_at, unit.grads.data() + host_at,
                                nullptr, m_.data() + model_at, v_.data() + model_at, nullptr, n,
                                tile_step);
          const double seconds = seconds_between(t1, Clock::now());
          cpu_seconds_.fetch_add(seconds);
          span("cpu-optimizer", "adam L" + std::to_string(u - 1), t1);
        });
        if (!on_device) continue;
        h2d_.wait(cpu_.record());
        h2d_bytes_ += n * static_cast<int64_t>(sizeof(float));
        // bf16 plans: the tile's bf16 copy too (tiles lie within one tensor).
        const bool round = model_.bf16_weights() && kParams[static_cast<size_t>(s.tensor)].matmul_weight;
        h2d_.enqueue([this, u, host_at, model_at, n, round] {
          const auto t1 = Clock::now();
          const float* master = units_[u].master.data() + host_at;
          std::memcpy(model_.params() + model_at, master, n * sizeof(float));
          if (round) k::to_bf16(model_.bf16_weights() + model_at, master, n);
          span("h2d", "params L" + std::to_string(u - 1), t1);
        });
      }
      position += s.count;
    }
    unit.updated = cpu_.record();
    if (on_device) {
      unit.landed = h2d_.record();
      unit.residency = Residency::kFetching;
      model_.bf16_written(u);  // by the copies above, before `landed`
    }
  }
}

void OffloadEngine::synchronize() {
  if (zero_)
    for (int64_t u = 0; u < static_cast<int64_t>(units_.size()); ++u) finish_gather(u);
  cpu_.synchronize();
  d2h_.synchronize();
  h2d_.synchronize();
  for (auto& unit : units_)
    if (unit.residency == Residency::kFetching) unit.residency = Residency::kResident;
}

void OffloadEngine::with_all_parameters(const std::function<void()>& fn) {
  synchronize();
  std::vector<int64_t> evicted;
  for (int64_t u = 0; u < static_cast<int64_t>(units_.size()); ++u) {
    Unit& unit = units_[u];
    if (unit.residency != Residency::kEvicted) continue;
    scatter(model_.params(), unit.master.data(), unit.slices);
    unit.residency = Residency::kResident;
    evicted.push_back(u);
  }
  struct Restore {
    OffloadEngine* engine;
    std::vector<int64_t>& units;
    ~Restore() {
      for (int64_t u : units) engine->evict(u);
    }
  } restore{this, evicted};
  if (zero_) {  // the full moments, for the call
    m_ = model_.device()->allocate_floats(model_.num_parameters(), MemoryKind::kOptimizer);
    v_ = model_.device()->allocate_floats(model_.num_parameters(), MemoryKind::kOptimizer);
    all_gather_shards(shard_m_.data(), m_.data());
    all_gather_shards(shard_v_.data(), v_.data());
    struct Free {
      DeviceBuffer &m, &v;
      ~Free() { m = DeviceBuffer(), v = DeviceBuffer(); }
    } free_moments{m_, v_};
    return fn();
  }
  fn();
}

}  // namespace kt::worker

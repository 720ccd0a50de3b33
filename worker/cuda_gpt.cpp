#include "worker/cuda_gpt.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "api/error.h"
#include "api/flops.h"
#include "kernels/cuda/check.h"
#include "worker/host_access.h"

namespace kt::worker {

namespace cu = kernels::cuda;
using cu::bf16;

namespace {
// Backward products: parameter gradients accumulated over micro-batches; input gradients
// written (overwrite), not added (no memset first).
constexpr bool kAccumulate = true, kOverwrite = false;

}  // namespace

CudaGpt::CudaGpt(CudaDevice& device, const GptConfig& config, int64_t B, int64_t T,
                 const CudaGptOptions& options)
    : device_(device),
      c_(config),
      stage_(options.stage),
      B_(B),
      T_(T),
      recompute_(options.recompute),
      tp_(options.tp),
      memory_(device) {
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
  if (stage_.model_layers == 0) stage_.model_layers = c_.layers;
  const bool staged = stage_.model_layers != c_.layers;
  KT_CHECK(stage_.in_flight >= 1 && (staged || stage_.in_flight == 1) &&
               stage_.first_layer + c_.layers <= stage_.model_layers,
           "pipeline stage out of range");
  const int lanes = t_ > 1 && options.sub_batches == 2 ? 2 : 1;
  KT_CHECK(B % lanes == 0, "two sub-batches need an even micro-batch");
  slots_.resize(static_cast<size_t>(stage_.in_flight));
  for (auto& slot : slots_) {
    slot.resize(lanes);
    for (int j = 0; j < lanes; ++j) {
      slot[j].B = B / lanes;
      slot[j].row0 = j * (B / lanes);
      slot[j].index = j;
    }
  }
  ctx_ = std::make_unique<cu::Context>(device_.stream(StreamRole::kCompute).handle());
  CudaOffloadOptions offload;
  offload.device_units = options.device_units;
  offload.window = options.window;
  offload.recompute = recompute_;
  offload.cpu_threads = options.cpu_threads;
  offload.reducer = options.reducer;
  offload.distributed_optimizer = options.distributed_optimizer;
  offload.embedding = options.embedding;
  // Unit 0's gradients: the first stage counts them in the norm; the first and the last train
  // their copies (summed between them); the stages between leave theirs alone.
  offload.counts_unit0 = stage_.first;
  offload.updates_unit0 = stage_.first || stage_.last;
  offload.unit0_elsewhere = options.unit0_elsewhere;
  offload.in_flight = stage_.in_flight;
  engine_ = std::make_unique<CudaOffloadEngine>(device_, c_, t_, *ctx_, offload);
  allocate();  // (what was taken goes back with the members if this throws)
}

CudaGpt::~CudaGpt() {
  engine_.reset();          // the CPU optimizer stops; the device finishes
  cudaDeviceSynchronize();  // no check: a destructor must not throw
  ctx_.reset();
}

// The activations (the parameters are the engine's).
void CudaGpt::allocate() {
  const int64_t L = c_.layers, C = c_.channels, BT = B_ * T_;
  auto act16 = [&](int64_t n) { return memory_.device<bf16>(n, MemoryKind::kActivations); };
  auto act32 = [&](int64_t n) { return memory_.device<float>(n, MemoryKind::kActivations); };
  const int64_t Cl = Cl_, NHl = NHl_, Fl = Fl_, T = T_;
  flash_ = cu::flash_attention_supported(C / c_.heads);
  const int parts = checkpoint_tensors(recompute_);
  for (size_t k = 0; k < slots_.size(); ++k)
    for (Lane& lane : slots_[k]) {
      const int64_t Bl = lane.B, BTl = Bl * T;
      // Every layer's input; with commAware every layer's summed attention projection and fc2
      // output too (the checkpoint, worker/recompute.h). With window offload the streamed layers'
      // checkpoints are the engine's ring buffers.
      if (k == 0) engine_->add_checkpoint_lane(parts, BTl * C);
      auto kept = [&](int64_t l, CheckpointTensor part) {
        bf16* ring = engine_->checkpoint_buffer(lane.index, l, static_cast<int>(part));
        return ring ? ring : act16(BTl * C);
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
      if (t_ > 1) {
        lane.partial = std::make_unique<CudaEvent>();
        lane.summed = std::make_unique<CudaEvent>();
      }
      if (k > 0) {  // the first slot's scratch (the last stage, which has the head, has one slot)
        const Lane& first = slots_[0][static_cast<size_t>(lane.index)];
        lane.dres = first.dres;
        lane.dtmp_c = first.dtmp_c;
        lane.dtmp_3c = first.dtmp_3c;
        lane.dtmp_f = first.dtmp_f;
        continue;
      }
      if (stage_.last) {  // the final LayerNorm, the LM head and the loss
        lane.lnf = act16(BTl * C);
        lane.logits = act16(BTl * Vl_);
        lane.lnf_mean = act32(BTl);
        lane.lnf_rstd = act32(BTl);
        if (t_ > 1) {
          lane.ce_max = act32(BTl);
          lane.ce_sums = act32(2 * BTl);
        }
      }
      lane.dres = act16(BTl * C);
      lane.dtmp_c = act16(BTl * C);
      lane.dtmp_3c = act16(BTl * 3 * Cl);
      lane.dtmp_f = act16(BTl * Fl);
    }
  losses_ = act32(BT);
  const int64_t Bl = slots_[0].front().B, BTl = Bl * T;  // the lanes are equal
  if (flash_) {
    attention_scratch_ = memory_.device_bytes(cu::attention_backward_bf16_scratch_bytes(Bl, T, Cl, NHl),
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
  norm_ = memory_.device<double>(2, MemoryKind::kWorkspace);
  for (size_t k = 0; k < slots_.size(); ++k)
    slot_tokens_.push_back(memory_.device<int32_t>(2 * BT, MemoryKind::kWorkspace));
  tokens_ = slot_tokens_[0];
  for (int i = 0; i < 2; ++i) {
    token_staging_[i] = memory_.pinned<int32_t>(2 * BT, MemoryKind::kWorkspace);
    staging_free_[i] = std::make_unique<CudaEvent>();
  }
  norm_host_ = memory_.pinned<double>(2, MemoryKind::kWorkspace);
}

double CudaGpt::flops_per_micro_step() const {
  // This rank's share: its parameters and its Cl channels of attention (api/flops.h).
  return api::gpt_flops_per_token(static_cast<double>(num_parameters()), c_.layers, Cl_, T_) *
         static_cast<double>(B_ * T_);
}

bool CudaGpt::sharded(int tensor_index) const {
  return gpt_tp_sharded(tensor_index, t_);
}

// ---- host access: initialisation and checkpoints (the engine's state) ------------------------

void CudaGpt::init_weights(uint64_t seed) {
  std::vector<float> host(num_parameters());
  GptConfig whole = c_;  // a stage draws the whole model's values and keeps its layers'
  whole.layers = stage_.model_layers;
  gpt_init_views(whole, seed,
                 gpt_rank_views(whole, t_, tr_, host.data(), stage_.first_layer, c_.layers));
  set_parameters(host.data());
  std::vector<float> zeros(num_parameters(), 0.0f);
  set_moments(zeros.data(), zeros.data());
}

void CudaGpt::set_parameters(const float* host) { engine_->set_parameters(host); }
void CudaGpt::get_parameters(float* host) { engine_->get_parameters(host); }
void CudaGpt::set_moments(const float* m, const float* v) { engine_->set_moments(m, v); }
void CudaGpt::get_moments(float* m, float* v) { engine_->get_moments(m, v); }
void CudaGpt::get_gradients(float* host) { engine_->get_gradients(host); }

// ---- the step --------------------------------------------------------------------------------

void CudaGpt::zero_grad() {
  CudaStream& compute = device_.stream(StreamRole::kCompute);
  engine_->begin_step();
  KT_CUDA_CHECK(cudaMemsetAsync(engine_->grads(), 0, bytes<float>(engine_->layout().dparams),
                                compute.handle()));
  micro_ = 0;
  backwards_ = 0;
}

void CudaGpt::use_slot(int slot) {
  KT_CHECK(slot >= 0 && slot < static_cast<int>(slots_.size()), "pipeline slot out of range");
  active_slot_ = slot;
  tokens_ = slot_tokens_[static_cast<size_t>(slot)];
  engine_->use_slot(slot);  // (the streamed layers' checkpoints of this micro-batch)
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
  auto w = [&](int i) { return CudaGpt::w(i, l); };
  finish_allreduce(lane);
  if (!rerun && l > 0) {
    engine_->checkpoint_before_write(lane.index, l);
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
  auto w = [&](int i) { return CudaGpt::w(i, l); };
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

// Layer l's MLP half backward for a lane: res[l + 1] = res2 + fcproj, so dres is the gradient
// of both; fc2, GELU, fc, and fc's input gradient (a partial sum over TP) left in flight.
void CudaGpt::mlp_backward(Lane& lane, int64_t l) {
  const int64_t C = c_.channels, Fl = Fl_, BT = lane.B * T_;
  const cu::Context& x = *ctx_;
  const int64_t a = work_index(l);
  cu::matmul_backward_bf16(x, lane.dtmp_f, g(kFcprojw, l), g(kFcprojb, l), lane.dres,
                           lane.fchg[a], w(kFcprojw, l), BT, Fl, C, kAccumulate, kOverwrite);
  cu::gelu_backward(x, lane.dtmp_f, lane.fch[a], lane.dtmp_f, BT * Fl, kOverwrite);
  cu::matmul_backward_bf16(x, lane.dtmp_c, g(kFcw, l), g(kFcb, l), lane.dtmp_f, lane.ln2[a],
                           w(kFcw, l), BT, C, Fl, kAccumulate, kOverwrite);
  lane_allreduce(lane, lane.dtmp_c, BT * C, DeviceDtype::kBfloat16, ReduceOp::kSum, false);
}

// Layer l's attention half backward for a lane: res2 = res[l] + attproj, so ln2's backward adds
// into dres; the projection, attention, qkv, and qkv's input gradient left in flight.
void CudaGpt::attention_backward(Lane& lane, int64_t l) {
  const int64_t C = c_.channels, Cl = Cl_, NHl = NHl_, B = lane.B, T = T_, BT = B * T;
  const cu::Context& x = *ctx_;
  const int64_t a = work_index(l);
  finish_allreduce(lane);
  cu::layernorm_backward(x, lane.dres, g(kLn2w, l), g(kLn2b, l), lane.dtmp_c, lane.res2[a],
                         w(kLn2w, l), lane.ln2_mean[a], lane.ln2_rstd[a], BT, C);
  cu::matmul_backward_bf16(x, lane.dtmp_c, g(kAttprojw, l), g(kAttprojb, l), lane.dres,
                           lane.atty[a], w(kAttprojw, l), BT, Cl, C, kAccumulate, kOverwrite);
  if (flash_) {  // dqkv overwritten
    cu::attention_backward_bf16(x, lane.dtmp_3c, attention_scratch_, lane.dtmp_c, lane.qkv[a],
                                lane.atty[a], lane.lse[a], B, T, Cl, NHl);
  } else {
    cu::cast_to_float(x, dc32_, lane.dtmp_c, BT * Cl);
    cu::cast_to_float(x, qkv32_, lane.qkv[a], BT * 3 * Cl);  // one fp32 qkv for all layers
    KT_CUDA_CHECK(cudaMemsetAsync(dqkv32_, 0, bytes<float>(BT * 3 * Cl), x.stream()));
    cu::attention_backward(x, dqkv32_, dpreatt_, datt_, dc32_, qkv32_, lane.att[a], B, T, Cl,
                           NHl);
    cu::cast_to_bf16(x, lane.dtmp_3c, dqkv32_, BT * 3 * Cl);
  }
  cu::matmul_backward_bf16(x, lane.dtmp_c, g(kQkvw, l), g(kQkvb, l), lane.dtmp_3c, lane.ln1[a],
                           w(kQkvw, l), BT, C, 3 * Cl, kAccumulate, kOverwrite);
  lane_allreduce(lane, lane.dtmp_c, BT * C, DeviceDtype::kBfloat16, ReduceOp::kSum, false);
}

// The step of one micro-batch, op by op over the lanes: each lane's op starts by waiting for
// the all-reduce its previous op left in flight, so with two lanes (Oases) one lane's all-reduce
// runs on the TP stream while the other lane computes.
//   forward:  embedding | per layer: attention half, MLP half | final LayerNorm, LM head, loss
//   backward: LM head | final LayerNorm | per layer (from the last): [recompute,] MLP half,
//             attention half, ln1 | embedding
// A pipeline stage runs its layers of both, its input (or the embedding) and its output (or the
// head) at the ends.
// The engine's hooks (worker/cuda_offload.h) mark where a unit's weights are needed, where a
// layer's forward is done with them, and where a unit's gradients are final.
void CudaGpt::train_micro_step(const int32_t* inputs, const int32_t* targets, float loss_scale,
                               bool last) {
  forward_micro(0, inputs, targets, loss_scale);
  backward_micro(0, last);
}

void CudaGpt::forward_micro(int slot, const int32_t* inputs, const int32_t* targets,
                            float loss_scale, const bf16* input, bf16* output) {
  const int64_t L = c_.layers, C = c_.channels, Vl = Vl_;
  const int64_t T = T_, BT = B_ * T;
  KT_CHECK((stage_.first || input) && (stage_.last || output),
           "a pipeline stage needs its input and output activations");
  const cu::Context& x = *ctx_;
  CudaStream& compute = device_.stream(StreamRole::kCompute);
  cudaStream_t s = compute.handle();
  CudaOffloadEngine& engine = *engine_;
  use_slot(slot);

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

  // ---- forward
  if (stage_.first || stage_.last) engine.before_forward(0);
  for (Lane& lane : lanes()) {
    const int64_t B = lane.B;
    engine.checkpoint_before_write(lane.index, 0);
    if (!stage_.first) {  // the stage before's output: this lane's rows
      device_.copy(lane.res[0], input + lane.row0 * T * C, bytes<bf16>(B * T * C), compute);
    } else if (t_ == 1) {
      cu::embedding_forward(x, lane.res[0], tokens_of(lane), w(kWte), w(kWpe), B, T, C);
    } else {  // vocab-parallel: this rank's rows (and the positions on rank 0), summed
      cu::embedding_forward_rows(x, lane.res[0], tokens_of(lane), w(kWte),
                                 tr_ == 0 ? w(kWpe) : nullptr, B, T, C, vocab_lo_, Vl);
      lane_allreduce(lane, lane.res[0], B * T * C, DeviceDtype::kBfloat16, ReduceOp::kSum, false);
    }
  }
  for (int64_t l = 0; l < L; ++l) {
    engine.before_forward(l + 1);
    for (Lane& lane : lanes()) attention_forward(lane, l, false);
    if (l > 0)  // the layer below is no longer read: its checkpoint can leave
      for (Lane& lane : lanes()) engine.checkpoint_out(lane.index, l - 1);
    for (Lane& lane : lanes()) mlp_forward(lane, l, false);
    engine.forward_done(l);
  }
  for (Lane& lane : lanes()) {
    finish_allreduce(lane);
    cu::residual_forward(x, lane.res[L], lane.res2[work_index(L - 1)],
                         lane.fcproj[proj_index(L - 1)], lane.B * T * C);
    engine.checkpoint_out(lane.index, L - 1);
    if (!stage_.last)  // to the next stage
      device_.copy(output + lane.row0 * T * C, lane.res[L], bytes<bf16>(lane.B * T * C), compute);
  }
  if (!stage_.last) return;
  // d(scaled mean loss)/d(token loss) = scale/BT over the whole micro-batch.
  const float dloss = loss_scale / static_cast<float>(BT);
  for (Lane& lane : lanes()) {
    const int64_t BTl = lane.B * T;
    cu::layernorm_forward(x, lane.lnf, lane.lnf_mean, lane.lnf_rstd, lane.res[L], w(kLnfw),
                          w(kLnfb), BTl, C);
    cu::matmul_forward_bf16(x, lane.logits, lane.lnf, w(kWte), nullptr, BTl, C, Vl);
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
    loss_host_.push_back(memory_.pinned<float>(BT, MemoryKind::kWorkspace));
  KT_CUDA_CHECK(
      cudaMemcpyAsync(loss_host_[micro_], losses_, bytes<float>(BT), cudaMemcpyDeviceToHost, s));
  ++micro_;
}

void CudaGpt::backward_micro(int slot, bool last, const bf16* output_grad, bf16* input_grad) {
  const int64_t L = c_.layers, C = c_.channels, Vl = Vl_, T = T_;
  KT_CHECK((stage_.last || output_grad) && (stage_.first || input_grad),
           "a pipeline stage needs its output's and its input's gradients");
  const cu::Context& x = *ctx_;
  CudaStream& compute = device_.stream(StreamRole::kCompute);
  cudaStream_t s = compute.handle();
  CudaOffloadEngine& engine = *engine_;
  use_slot(slot);
  ++backwards_;
  auto tokens_of = [&](const Lane& lane) { return tokens_ + lane.row0 * T; };

  // ---- backward: parameter gradients fp32 (accumulated), activation gradients bf16. The
  // column-parallel products' input gradients (LM head, fc, qkv) are partial sums: all-reduced.
  if (stage_.last) {
    for (Lane& lane : lanes()) {
      cu::matmul_backward_bf16(x, lane.dtmp_c, g(kWte), nullptr, lane.logits, lane.lnf, w(kWte),
                               lane.B * T, C, Vl, kAccumulate, kOverwrite);
      lane_allreduce(lane, lane.dtmp_c, lane.B * T * C, DeviceDtype::kBfloat16, ReduceOp::kSum,
                     false);
    }
    for (Lane& lane : lanes()) {
      const int64_t BTl = lane.B * T;
      finish_allreduce(lane);
      KT_CUDA_CHECK(cudaMemsetAsync(lane.dres, 0, bytes<bf16>(BTl * C), s));
      cu::layernorm_backward(x, lane.dres, g(kLnfw), g(kLnfb), lane.dtmp_c, lane.res[L], w(kLnfw),
                             lane.lnf_mean, lane.lnf_rstd, BTl, C);
    }
  } else {  // the next stage's gradient of this stage's output: this lane's rows
    for (Lane& lane : lanes())
      device_.copy(lane.dres, output_grad + lane.row0 * T * C, bytes<bf16>(lane.B * T * C),
                   compute);
  }
  for (int64_t l = L - 1; l >= 0; --l) {
    engine.before_backward(l, backwards_ == 1);
    for (Lane& lane : lanes()) {  // this layer's checkpoint, and the next one's on its way
      engine.checkpoint_in(lane.index, l, true);
      if (l > 0) engine.checkpoint_in(lane.index, l - 1, false);
    }
    // With recompute, the (slot's) working set holds the last layer's forward; the others
    // re-run theirs.
    if (recompute_ != api::Recompute::kNone && l != L - 1)
      for (Lane& lane : lanes()) rerun_layer(lane, l);
    for (Lane& lane : lanes()) mlp_backward(lane, l);
    for (Lane& lane : lanes()) attention_backward(lane, l);
    for (Lane& lane : lanes()) {
      const int64_t a = work_index(l);
      finish_allreduce(lane);
      cu::layernorm_backward(x, lane.dres, g(kLn1w, l), g(kLn1b, l), lane.dtmp_c, lane.res[l],
                             w(kLn1w, l), lane.ln1_mean[a], lane.ln1_rstd[a], lane.B * T, C);
      engine.checkpoint_done(lane.index, l);
    }
    engine.grads_final(l + 1, last);
  }
  for (Lane& lane : lanes()) {
    if (!stage_.first)  // to the stage before
      device_.copy(input_grad + lane.row0 * T * C, lane.dres, bytes<bf16>(lane.B * T * C), compute);
    else if (t_ == 1)
      cu::embedding_backward(x, g(kWte), g(kWpe), lane.dres, tokens_of(lane), lane.B, T, C);
    else  // the rows held here; wpe (replicated) from the same summed dres on every rank
      cu::embedding_backward_rows(x, g(kWte), g(kWpe), lane.dres, tokens_of(lane), lane.B, T, C,
                                  vocab_lo_, Vl);
  }
  engine.grads_final(0, last);
}

// Unit 0's tensors in the logical layout: each one's place there and the rank's slice of it (wte
// is split by rows over TP: rank r holds block r).
namespace {
template <class Fn>
void for_unit0_slices(const GptConfig& c, int64_t t, int64_t r,
                      const std::array<int64_t, kNumParamTensors>& local, Fn&& fn) {
  const auto logical = gpt_param_sizes(c, 1);
  int64_t base = 0;
  for (int i = 0; i < kNumParamTensors; ++i) {
    const ParamSpec& p = kParams[static_cast<size_t>(i)];
    if (p.per_layer) continue;
    const bool split = t > 1 && p.tp_dim >= 0;
    KT_CHECK(!split || (p.tp_dim == 0 && local[i] * t == logical[i]),
             "a tensor that is not per layer is split by rows only");
    fn(i, base + (split ? r * local[i] : 0), local[i], split);
    base += logical[i];
  }
}
}  // namespace

int64_t CudaGpt::unit0_floats() const {
  int64_t n = 0;
  for_unit0_slices(c_, 1, 0, gpt_param_sizes(c_, 1),
                   [&](int, int64_t, int64_t count, bool) { n += count; });
  return n;
}

void CudaGpt::add_unit0_gradients(float* logical) {
  for_unit0_slices(c_, t_, tr_, engine_->layout().dsizes,
                   [&](int i, int64_t at, int64_t count, bool split) {
                     if (split || tr_ == 0)
                       cu::residual_forward(*ctx_, logical + at, logical + at, g(i), count);
                   });
}

void CudaGpt::take_unit0_gradients(const float* logical) {
  CudaStream& compute = device_.stream(StreamRole::kCompute);
  for_unit0_slices(c_, t_, tr_, engine_->layout().dsizes,
                   [&](int i, int64_t at, int64_t count, bool) {
                     device_.copy(g(i), logical + at, bytes<float>(count), compute);
                   });
  engine_->unit0_summed();
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
  engine_->sum_embeddings();
  engine_->join_reductions(compute);
  const CudaParamLayout& layout = engine_->layout();
  KT_CUDA_CHECK(cudaMemsetAsync(norm_, 0, bytes<double>(2), compute.handle()));
  if (engine_->distributed_optimizer()) {
    engine_->add_shard_sums_of_squares(norm_);
  } else if (t_ == 1 && stage_.first) {
    cu::sum_of_squares(*ctx_, norm_ + 1, engine_->grads(), layout.dparams);
  } else {  // a stage after the first leaves unit 0 to the first
    for (int i = 0; i < kNumParamTensors; ++i)
      if (stage_.first || kParams[static_cast<size_t>(i)].per_layer)
        cu::sum_of_squares(*ctx_, norm_ + (sharded(i) ? 0 : 1), g(i), layout.dsizes[i]);
  }
  KT_CUDA_CHECK(cudaMemcpyAsync(norm_host_, norm_, bytes<double>(2), cudaMemcpyDeviceToHost,
                                compute.handle()));
  compute.synchronize();
  host_reads("grad_sums_of_squares", norm_host_, bytes<double>(2));
  *sharded_sum = norm_host_[0];
  *replicated_sum = norm_host_[1];
  engine_->add_host_sums_of_squares(sharded_sum, replicated_sum);  // the streamed layers'
}

void CudaGpt::update(const kernels::AdamWStep& step, float weight_decay) {
  engine_->update(step, weight_decay);
}

void CudaGpt::synchronize() {
  engine_->synchronize();
}

}  // namespace kt::worker

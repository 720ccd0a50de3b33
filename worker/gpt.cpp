#include "worker/gpt.h"

#include <cmath>
#include <cstring>
#include <random>

#include "api/cpu_activations.h"
#include "api/error.h"
#include "api/flops.h"
#include "kernels/ops.h"

namespace kt::worker {

namespace k = kernels::cpu;

GptConfig GptConfig::from(const api::ModelDims& m) {
  return {m.seq_len, m.vocab, m.padded_vocab(), m.layers, m.heads, m.hidden, m.ffn_hidden};
}

struct Gpt::Params {
  float *wte, *wpe, *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb,
      *fcprojw, *fcprojb, *lnfw, *lnfb;
};

// Activations of a B×T batch; per-layer tensors are stacked along a leading L.
struct Gpt::Acts {
  float* encoded;    // (B,T,C)
  float* ln1;        // (L,B,T,C)
  float* ln1_mean;   // (L,B,T)
  float* ln1_rstd;   // (L,B,T)
  float* qkv;        // (L,B,T,3C)
  float* atty;       // (L,B,T,C)
  float* preatt;     // (L,B,NH,T,T)
  float* att;        // (L,B,NH,T,T)
  float* attproj;    // (L,B,T,C)
  float* residual2;  // (L,B,T,C)
  float* ln2;        // (L,B,T,C)
  float* ln2_mean;   // (L,B,T)
  float* ln2_rstd;   // (L,B,T)
  float* fch;        // (L,B,T,F)
  float* fch_gelu;   // (L,B,T,F)
  float* fcproj;     // (L,B,T,C)
  float* residual3;  // (L,B,T,C)
  float* lnf;        // (B,T,C)
  float* lnf_mean;   // (B,T)
  float* lnf_rstd;   // (B,T)
  float* logits;     // (B,T,Vp)
  float* losses;     // (B,T)
};

namespace {

// Per-rank activation sizes (api/cpu_activations.h, which the planner charges too).
std::array<int64_t, 22> activation_sizes(const GptConfig& c, int64_t B, int64_t T, int64_t Cl,
                                         int64_t NHl, int64_t Fl, int64_t Vl, int64_t Lw,
                                         int64_t Lp) {
  return api::cpu_activation_sizes(c.layers, c.channels, B, T, Cl, NHl, Fl, Vl, Lw, Lp);
}

int64_t total(const std::array<int64_t, 22>& sizes) {
  int64_t n = 0;
  for (int64_t s : sizes) n += s;
  return n;
}

}  // namespace

Gpt::Gpt(const GptConfig& config, int64_t B, int64_t T, std::shared_ptr<Device> device,
         TensorParallel tp, int sub_batches, api::Recompute recompute, api::Precision precision,
         PipelineStage stage)
    : config_(config), B_(B), T_(T), device_(std::move(device)), tp_(tp), recompute_(recompute) {
  const auto& c = config_;
  KT_CHECK(T <= c.max_seq_len, "sequence length exceeds the model's positions");
  KT_CHECK(c.channels % c.heads == 0, "heads must divide channels");
  const int64_t t = tp_.size;
  KT_CHECK(t >= 1 && tp_.rank >= 0 && tp_.rank < t, "bad tensor-parallel rank");
  KT_CHECK(t == 1 || tp_.group != nullptr, "tensor parallelism needs a TP communicator");
  KT_CHECK(c.heads % t == 0 && c.ffn % t == 0 && c.padded_vocab % t == 0,
           "the TP degree must divide heads, ffn and the padded vocabulary");
  KT_CHECK(sub_batches == 1 || (sub_batches == 2 && B % 2 == 0),
           "two sub-batches need an even micro-batch");
  stage_ = stage;
  if (stage_.model_layers == 0) stage_.model_layers = c.layers;
  KT_CHECK(stage_.first_layer >= 0 && stage_.first_layer + c.layers <= stage_.model_layers &&
               stage_.in_flight >= 1,
           "bad pipeline stage");
  Cl_ = c.channels / t;
  NHl_ = c.heads / t;
  Fl_ = c.ffn / t;
  Vl_ = c.padded_vocab / t;
  vocab_offset_ = tp_.rank * Vl_;
  param_sizes_ = gpt_param_sizes(c, t);
  for (int64_t s : param_sizes_) num_params_ += s;
  params_ = device_->allocate_floats(num_params_, MemoryKind::kParams);
  grads_ = device_->allocate_floats(num_params_, MemoryKind::kGrads);
  if (precision == api::Precision::kBf16) {
    bf16_buffer_ = device_->allocate_floats((num_params_ + 1) / 2, MemoryKind::kParams);
    bf16_weights_ = reinterpret_cast<uint16_t*>(bf16_buffer_.data());
    bf16_epoch_.assign(config_.layers + 1, -1);
  }
  lanes_.resize(sub_batches);
  for (auto& lane : lanes_) {
    lane.B = B / sub_batches;
    const int64_t acts = total(lane_activation_sizes(lane));
    lane.acts = device_->allocate_floats(acts, MemoryKind::kActivations);
    lane.grad_acts = device_->allocate_floats(acts, MemoryKind::kActivations);
    if (t > 1) lane.ce_scratch.resize(3 * lane.B * T);
  }
  slot_acts_.resize(stage_.in_flight);
  slot_tokens_.resize(stage_.in_flight);
  for (int slot = 0; slot < stage_.in_flight; ++slot)
    for (const Lane& lane : lanes_)
      slot_acts_[slot].push_back(slot == active_slot_
                                     ? DeviceBuffer()
                                     : device_->allocate_floats(total(lane_activation_sizes(lane)),
                                                                MemoryKind::kActivations));
}

void Gpt::use_slot(int slot) {
  KT_CHECK(slot >= 0 && slot < stage_.in_flight, "activation slot out of range");
  if (slot == active_slot_) return;
  for (size_t i = 0; i < lanes_.size(); ++i) {
    std::swap(lanes_[i].acts, slot_acts_[active_slot_][i]);
    std::swap(lanes_[i].acts, slot_acts_[slot][i]);
  }
  slot_tokens_[active_slot_] = {lanes_[0].inputs, lanes_[0].targets};
  active_slot_ = slot;
  const auto [inputs, targets] = slot_tokens_[slot];
  for (size_t i = 0; i < lanes_.size() && inputs; ++i) {
    lanes_[i].inputs = inputs + i * lanes_[0].B * T_;
    lanes_[i].targets = targets + i * lanes_[0].B * T_;
  }
}

Gpt::Params Gpt::params_at(float* base) const {
  float* p[kNumParamTensors];
  for (int i = 0; i < kNumParamTensors; ++i) {
    p[i] = base;
    base += param_sizes_[i];
  }
  return {p[0], p[1], p[2],  p[3],  p[4],  p[5],  p[6],  p[7],
          p[8], p[9], p[10], p[11], p[12], p[13], p[14], p[15]};
}

// One lane's activation layout: L layers of working set without recompute (else 1), L layers of
// attproj/fcproj unless full recompute (else 1).
std::array<int64_t, 22> Gpt::lane_activation_sizes(const Lane& lane) const {
  const int64_t last = config_.layers - 1;
  // (A stage before the last has no logits.)
  return activation_sizes(config_, lane.B, T_, Cl_, NHl_, Fl_, stage_.last ? Vl_ : 0,
                          slot(last) + 1, proj_slot(last) + 1);
}

Gpt::Acts Gpt::acts_at(const Lane& lane, float* base) const {
  const auto sizes = lane_activation_sizes(lane);
  float* a[22];
  for (int i = 0; i < 22; ++i) {
    a[i] = base;
    base += sizes[i];
  }
  return {a[0],  a[1],  a[2],  a[3],  a[4],  a[5],  a[6],  a[7],  a[8],  a[9],  a[10],
          a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21]};
}

std::vector<TensorView> Gpt::views(float* base) const {
  GptConfig whole = config_;
  whole.layers = stage_.model_layers;
  return gpt_rank_views(whole, tp_.size, tp_.rank, base, stage_.first_layer, config_.layers);
}

bool Gpt::sharded(int tensor_index) const {
  return gpt_tp_sharded(tensor_index, tp_.size);
}

std::vector<Gpt::Slice> Gpt::unit_slices(int64_t unit) const {
  KT_CHECK(unit >= 0 && unit <= config_.layers, "offload unit out of range");
  return gpt_unit_slices(param_sizes_, config_.layers, unit);
}

std::vector<std::pair<float*, int64_t>> Gpt::layer_gradient_slices(int64_t l) const {
  std::vector<std::pair<float*, int64_t>> out;
  for (const Slice& s : unit_slices(l + 1)) out.emplace_back(grads_.data() + s.offset, s.count);
  return out;
}

std::vector<std::pair<float*, int64_t>> Gpt::layer_checkpoint_slices(int64_t l) const {
  std::vector<std::pair<float*, int64_t>> out;
  if (recompute_ == api::Recompute::kNone) return out;
  for (const Lane& lane : lanes_) {
    const int64_t BTC = lane.B * T_ * config_.channels;
    const Acts a = acts_at(lane, lane.acts.data());
    out.emplace_back(l == 0 ? a.encoded : a.residual3 + (l - 1) * BTC, BTC);
    if (recompute_ == api::Recompute::kCommAware) {
      out.emplace_back(a.attproj + proj_slot(l) * BTC, BTC);
      out.emplace_back(a.fcproj + proj_slot(l) * BTC, BTC);
    }
  }
  return out;
}

bool Gpt::decays(int tensor_index) {
  return gpt_decays(tensor_index);
}

double Gpt::flops_per_micro_step() const {
  // This rank's share: its parameters and its Cl channels of attention (api/flops.h); on a
  // pipeline stage its layers, and the LM head's (wte and the final LayerNorm's) on the last.
  double params = 0;
  for (int i = 0; i < kNumParamTensors; ++i)
    if (kParams[i].per_layer || stage_.last) params += static_cast<double>(param_sizes_[i]);
  if (stage_.first && stage_.last) params = static_cast<double>(num_params_);
  return api::gpt_flops_per_token(params, config_.layers, Cl_, T_) * static_cast<double>(B_ * T_);
}

void Gpt::init_weights(uint64_t seed) {
  GptConfig whole = config_;
  whole.layers = stage_.model_layers;
  gpt_init_views(whole, seed, views(params_.data()));
  ++epoch_;
}

void Gpt::refresh_bf16(int64_t unit) {
  if (!bf16_weights_ || bf16_epoch_[unit] == epoch_) return;
  for (const Slice& s : unit_slices(unit))
    if (kParams[s.tensor].matmul_weight)
      k::to_bf16(bf16_weights_ + s.offset, params_.data() + s.offset, s.count);
  bf16_epoch_[unit] = epoch_;
}

void Gpt::gemm_forward(float* out, const float* inp, const float* weight, const float* bias,
                       int64_t BT, int64_t C, int64_t OC) const {
  if (bf16_weights_)
    k::matmul_forward_bf16(out, inp, bf16_weights_ + (weight - params_.data()), bias, BT, C, OC);
  else
    k::matmul_forward(out, inp, weight, bias, BT, C, OC);
}

void Gpt::gemm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, int64_t BT, int64_t C, int64_t OC,
                        bool accumulate) const {
  if (bf16_weights_)
    k::matmul_backward_bf16(dinp, dweight, dbias, dout, inp,
                            bf16_weights_ + (weight - params_.data()), BT, C, OC, accumulate);
  else
    k::matmul_backward(dinp, dweight, dbias, dout, inp, weight, BT, C, OC, accumulate);
}

void Gpt::zero_grad() {
  // The matmul weights (wte written first by the LM head's dW) are overwritten by their
  // matmul's first backward; everything else is accumulated into and must start at zero.
  auto grads = gradient_views();
  for (int i = 0; i < kNumParamTensors; ++i)
    if (!kParams[i].matmul_weight || (i == kWte && !stage_.last))  // no LM head writes wte's
      std::memset(grads[i].data, 0, grads[i].numel() * sizeof(float));
  overwrite_weight_grads_ = true;
  // A step begins: the parameters may have changed since the last forward (the optimizer, a
  // checkpoint load); the units whose copy the optimizer wrote stay current.
  ++epoch_;
}

float Gpt::evaluate(const int32_t* inputs, const int32_t* targets) {
  KT_CHECK(stage_.first && stage_.last, "evaluate runs the whole model, not a pipeline stage");
  use_slot(0);
  ++epoch_;
  start(inputs, targets, 0.0f);
  run(false);
  return finish_loss();
}

float Gpt::train_micro_step(const int32_t* inputs, const int32_t* targets, float loss_scale) {
  KT_CHECK(stage_.first && stage_.last, "a pipeline stage runs forward_micro, backward_micro");
  const float loss = forward_micro(0, inputs, targets, loss_scale);
  backward_micro(0);
  return loss;
}

float Gpt::forward_micro(int slot, const int32_t* inputs, const int32_t* targets, float loss_scale,
                         const float* input, float* output) {
  KT_CHECK(stage_.first || input, "a stage after the first needs its input activations");
  KT_CHECK(stage_.last || output, "a stage before the last needs a place for its output");
  use_slot(slot);
  // d(mean loss · loss_scale)/d(loss of one token) = loss_scale / (B·T)
  start(inputs, targets, loss_scale / static_cast<float>(B_ * T_));
  const int64_t C = config_.channels;
  for (Lane& lane : lanes_) {
    const int64_t rows = (lane.inputs - inputs) * C;  // this lane's first row, in floats
    lane.stage_input = input ? input + rows : nullptr;
    lane.stage_output = output ? output + rows : nullptr;
  }
  run(false);
  return stage_.last ? finish_loss() : 0.0f;
}

void Gpt::backward_micro(int slot, const float* output_grad, float* input_grad) {
  KT_CHECK(stage_.last || output_grad, "a stage before the last needs its output's gradient");
  KT_CHECK(stage_.first || input_grad,
           "a stage after the first needs a place for its input's "
           "gradient");
  use_slot(slot);
  const int64_t C = config_.channels;
  for (size_t i = 0; i < lanes_.size(); ++i) {
    Lane& lane = lanes_[i];
    // Backward kernels accumulate into the activation gradients, so they start at zero — all
    // but dlogits, which the cross-entropy wrote in full in the forward, and dlosses, which
    // nothing reads.
    const Acts grad = acts_at(lane, lane.grad_acts.data());
    std::memset(lane.grad_acts.data(), 0, (grad.logits - lane.grad_acts.data()) * sizeof(float));
    lane.accumulate = !(overwrite_weight_grads_ && i == 0);
    const int64_t rows = (lane.inputs - lanes_[0].inputs) * C;
    lane.stage_output_grad = output_grad ? output_grad + rows : nullptr;
    lane.stage_input_grad = input_grad ? input_grad + rows : nullptr;
  }
  overwrite_weight_grads_ = false;
  run(true);
  if (unit_observer) unit_observer->grads_final(0);
}

void Gpt::start(const int32_t* inputs, const int32_t* targets, float dloss) {
  const int64_t V = config_.vocab, BT = B_ * T_;
  for (int64_t i = 0; i < BT; ++i) {
    if (inputs[i] < 0 || inputs[i] >= V || targets[i] < 0 || targets[i] >= V)
      throw Error("token out of range [0, " + std::to_string(V) + ") at position " +
                  std::to_string(i));
  }
  for (size_t i = 0; i < lanes_.size(); ++i) {
    Lane& lane = lanes_[i];
    lane.inputs = inputs + i * lane.B * T_;
    lane.targets = targets + i * lane.B * T_;
    lane.dloss = dloss;
  }
}

float Gpt::finish_loss() {
  double sum = 0;
  for (const auto& lane : lanes_) sum += static_cast<double>(lane.mean_loss) * lane.B;
  return static_cast<float>(sum / B_);
}

int64_t Gpt::op_unit(bool backward, int64_t k) const {
  const int64_t L = config_.layers;
  if (!backward) return k == 0 || k == 2 * L + 1 ? 0 : (k - 1) / 2 + 1;
  const int64_t per_layer = recompute_ == api::Recompute::kNone ? 3 : 5;
  if (k < 2 || k == backward_ops() - 1) return 0;
  return L - (k - 2) / per_layer;
}

void Gpt::run(bool backward) {
  const int64_t ops = backward ? backward_ops() : forward_ops();
  auto op = backward ? &Gpt::backward_op : &Gpt::forward_op;
  // With two lanes and TP, the Oases schedule: A's op k, B's op k, A's op k+1 (once A's
  // all-reduce is done), ... Otherwise every all-reduce completes before the next op.
  const bool overlap = tp_.size > 1 && lanes_.size() > 1;
  auto finish = [](Lane& lane) {
    if (lane.pending) {
      lane.pending->wait();
      lane.pending.reset();
    }
  };
  UnitObserver* observer = unit_observer;
  int64_t previous = -1;
  for (int64_t k = 0; k < ops; ++k) {
    const int64_t unit = op_unit(backward, k);
    const bool changes = unit != previous;
    for (size_t i = 0; i < lanes_.size(); ++i) {
      Lane& lane = lanes_[i];
      finish(lane);
      if (observer && changes) {
        if (i == 0) {
          if (!backward && previous >= 0) observer->forward_params_done(previous);
          if (backward)
            observer->before_backward(unit);
          else
            observer->before_forward(unit);
        }
        // Every lane's all-reduces of the previous unit are done once the last lane got here.
        if (!backward && previous >= 0 && i + 1 == lanes_.size())
          observer->forward_activations_done(previous);
      }
      // Unit u's parameters are on the device now (the observer waited for them).
      if (changes && i == 0 && !backward) refresh_bf16(unit);
      const auto [buffer, count] = (this->*op)(lane, k);
      if (!buffer) continue;
      if (overlap)
        lane.pending = tp_.group->allreduce_async(buffer, count, ReduceOp::kSum);
      else
        tp_allreduce(buffer, count);
    }
    previous = unit;
  }
  for (auto& lane : lanes_) finish(lane);
  if (observer && !backward) {
    observer->forward_params_done(previous);
    observer->forward_activations_done(previous);
  }
}

void Gpt::tp_allreduce(float* data, int64_t count, ReduceOp op) {
  if (tp_.size > 1) tp_.group->allreduce(data, static_cast<size_t>(count), op);
}

void Gpt::vocab_parallel_cross_entropy(Lane& lane, float* losses, float* dlogits,
                                       const float* logits) {
  // Each rank holds logits for vocabulary rows [offset, offset + Vl). The softmax needs the
  // row's global max and sum: one all-reduce (max) of B·T floats, one (sum) of 2·B·T floats
  // carrying the sums of exponentials and the target's logit (0 on the ranks that lack it).
  const int64_t BT = lane.B * T_, V = config_.vocab, lo = vocab_offset_, Vl = Vl_;
  const int64_t valid = std::max<int64_t>(0, std::min(Vl, V - lo));  // real vocabulary here
  const int32_t* targets = lane.targets;
  const float dloss = lane.dloss;
  float* row_max = lane.ce_scratch.data();
  float* sums = row_max + BT;  // [sum of exp (BT) | target logit (BT)]
#pragma omp parallel for
  for (int64_t i = 0; i < BT; ++i) {
    float m = -INFINITY;
    for (int64_t v = 0; v < valid; ++v) m = std::max(m, logits[i * Vl + v]);
    row_max[i] = m;
  }
  tp_allreduce(row_max, BT, ReduceOp::kMax);
#pragma omp parallel for
  for (int64_t i = 0; i < BT; ++i) {
    const float* x = logits + i * Vl;
    float sum = 0;
    for (int64_t v = 0; v < valid; ++v) sum += std::exp(x[v] - row_max[i]);
    sums[i] = sum;
    const int64_t target = targets[i] - lo;
    sums[BT + i] = target >= 0 && target < Vl ? x[target] : 0.0f;
  }
  tp_allreduce(sums, 2 * BT);
#pragma omp parallel for
  for (int64_t i = 0; i < BT; ++i) {
    losses[i] = std::log(sums[i]) - (sums[BT + i] - row_max[i]);
    if (!dlogits) continue;
    const float* x = logits + i * Vl;
    float* d = dlogits + i * Vl;
    const float norm = dloss / sums[i];
    for (int64_t v = 0; v < valid; ++v) d[v] = std::exp(x[v] - row_max[i]) * norm;
    for (int64_t v = valid; v < Vl; ++v) d[v] = 0;
    const int64_t target = targets[i] - lo;
    if (target >= 0 && target < Vl) d[target] -= dloss;
  }
}

// Forward ops: 0 embedding | 1+2l attention block of layer l | 2+2l MLP block | 2L+1 head.
// Each op first finishes what the previous op's all-reduce completed.
std::pair<float*, int64_t> Gpt::forward_op(Lane& lane, int64_t k) {
  const auto& c = config_;
  const int64_t B = lane.B, T = T_, BT = B * T, C = c.channels;
  const int64_t L = c.layers, Vl = Vl_;
  const Params p = params_at(params_.data());
  const Acts a = acts_at(lane, lane.acts.data());
  const int32_t* inputs = lane.inputs;
  if (k == 0) {
    if (!stage_.first) {  // the previous stage's output
      std::memcpy(a.encoded, lane.stage_input, BT * C * sizeof(float));
      return {nullptr, 0};
    }
    if (tp_.size == 1) {
      k::embedding_forward(a.encoded, inputs, p.wte, p.wpe, B, T, C);
      return {nullptr, 0};
    }
    // Vocab-parallel lookup: rows this rank holds, zeros elsewhere, summed over the TP group;
    // the (replicated) positions are added after the sum.
#pragma omp parallel for
    for (int64_t i = 0; i < BT; ++i) {
      const int64_t row = inputs[i] - vocab_offset_;
      float* out = a.encoded + i * C;
      if (row >= 0 && row < Vl)
        std::memcpy(out, p.wte + row * C, C * sizeof(float));
      else
        std::memset(out, 0, C * sizeof(float));
    }
    return {a.encoded, BT * C};
  }
  if (k == 2 * L + 1) {  // final LayerNorm, LM head, cross-entropy
    float* last = a.residual3 + (L - 1) * BT * C;
    k::residual_forward(last, a.residual2 + slot(L - 1) * BT * C,
                        a.fcproj + proj_slot(L - 1) * BT * C, BT * C);
    if (!stage_.last) {  // the next stage's input
      std::memcpy(lane.stage_output, last, BT * C * sizeof(float));
      return {nullptr, 0};
    }
    k::layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, last, p.lnfw, p.lnfb, BT, C);
    gemm_forward(a.logits, a.lnf, p.wte, nullptr, BT, C, Vl);
    const Acts d = acts_at(lane, lane.grad_acts.data());
    float* dlogits = lane.dloss != 0 ? d.logits : nullptr;
    if (tp_.size == 1)
      k::softmax_cross_entropy(a.losses, dlogits, a.logits, lane.targets, BT, c.vocab, Vl,
                               lane.dloss);
    else
      vocab_parallel_cross_entropy(lane, a.losses, dlogits, a.logits);
    double sum = 0;
    for (int64_t i = 0; i < BT; ++i) sum += a.losses[i];
    lane.mean_loss = static_cast<float>(sum / BT);
    return {nullptr, 0};
  }
  const int64_t l = (k - 1) / 2;
  if (k % 2 == 1) {  // attention block of layer l
    if (l == 0 && tp_.size > 1 && stage_.first) {
#pragma omp parallel for
      for (int64_t i = 0; i < BT; ++i)
        for (int64_t ch = 0; ch < C; ++ch) a.encoded[i * C + ch] += p.wpe[(i % T) * C + ch];
    }
    if (l > 0)  // the previous layer's MLP output has been summed
      k::residual_forward(a.residual3 + (l - 1) * BT * C, a.residual2 + slot(l - 1) * BT * C,
                          a.fcproj + proj_slot(l - 1) * BT * C, BT * C);
    return attention_forward_block(lane, l, true);
  }
  return mlp_forward_block(lane, l, true);
}

// Layer l's attention block from its input to the (partial) projection; `project` = false skips
// the projection GEMM (commAware recompute: its summed output was kept).
std::pair<float*, int64_t> Gpt::attention_forward_block(Lane& lane, int64_t l, bool project) {
  const auto& c = config_;
  const int64_t B = lane.B, T = T_, BT = B * T, C = c.channels, Cl = Cl_, NHl = NHl_;
  const Params p = params_at(params_.data());
  const Acts a = acts_at(lane, lane.acts.data());
  const int64_t s = slot(l);
  const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * BT * C;
  float* ln1 = a.ln1 + s * BT * C;
  float* qkv = a.qkv + s * BT * 3 * Cl;
  float* atty = a.atty + s * BT * Cl;
  const int64_t sh = s * B * NHl * T * T;
  k::layernorm_forward(ln1, a.ln1_mean + s * BT, a.ln1_rstd + s * BT, residual, p.ln1w + l * C,
                       p.ln1b + l * C, BT, C);
  gemm_forward(qkv, ln1, p.qkvw + l * 3 * Cl * C, p.qkvb + l * 3 * Cl, BT, C, 3 * Cl);
  k::attention_forward(atty, a.preatt + sh, a.att + sh, qkv, B, T, Cl, NHl);
  if (!project) return {nullptr, 0};
  float* attproj = a.attproj + proj_slot(l) * BT * C;
  gemm_forward(attproj, atty, p.attprojw + l * C * Cl,
               tp_.rank == 0 ? p.attprojb + l * C : nullptr, BT, Cl, C);
  return {tp_.size > 1 ? attproj : nullptr, BT * C};  // row-parallel projection
}

// Layer l's MLP block from the summed projection to the (partial) fc2 output; `project` = false
// skips fc2 (commAware recompute).
std::pair<float*, int64_t> Gpt::mlp_forward_block(Lane& lane, int64_t l, bool project) {
  const auto& c = config_;
  const int64_t B = lane.B, T = T_, BT = B * T, C = c.channels, Fl = Fl_;
  const Params p = params_at(params_.data());
  const Acts a = acts_at(lane, lane.acts.data());
  const int64_t s = slot(l);
  const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * BT * C;
  float* residual2 = a.residual2 + s * BT * C;
  float* ln2 = a.ln2 + s * BT * C;
  float* fch = a.fch + s * BT * Fl;
  float* fch_gelu = a.fch_gelu + s * BT * Fl;
  k::residual_forward(residual2, residual, a.attproj + proj_slot(l) * BT * C, BT * C);
  k::layernorm_forward(ln2, a.ln2_mean + s * BT, a.ln2_rstd + s * BT, residual2, p.ln2w + l * C,
                       p.ln2b + l * C, BT, C);
  gemm_forward(fch, ln2, p.fcw + l * Fl * C, p.fcb + l * Fl, BT, C, Fl);
  k::gelu_forward(fch_gelu, fch, BT * Fl);
  if (!project) return {nullptr, 0};
  float* fcproj = a.fcproj + proj_slot(l) * BT * C;
  gemm_forward(fcproj, fch_gelu, p.fcprojw + l * C * Fl,
               tp_.rank == 0 ? p.fcprojb + l * C : nullptr, BT, Fl, C);
  return {tp_.size > 1 ? fcproj : nullptr, BT * C};  // row-parallel fc2
}

// Backward ops: 0 LM head | 1 final LayerNorm | per layer l = L-1 … 0: [recompute its attention
// half, recompute its MLP half,] MLP backward, attention backward, ln1 backward | embedding. Each
// layer's ops read only that layer's parameters (the offload engine relies on it); the ln1
// backward is an op of its own because it needs the qkv input gradient summed over the TP group.
std::pair<float*, int64_t> Gpt::backward_op(Lane& lane, int64_t k) {
  const auto& c = config_;
  const int64_t B = lane.B, T = T_, BT = B * T, C = c.channels, Vl = Vl_, L = c.layers;
  const Params p = params_at(params_.data());
  const Params g = params_at(grads_.data());
  const Acts a = acts_at(lane, lane.acts.data());
  const Acts d = acts_at(lane, lane.grad_acts.data());  // d.logits holds dloss/dlogits
  const int32_t* inputs = lane.inputs;
  if (k == 0) {
    if (!stage_.last) {  // the next stage's gradient of this stage's output
      std::memcpy(d.residual3 + (L - 1) * BT * C, lane.stage_output_grad, BT * C * sizeof(float));
      return {nullptr, 0};
    }
    gemm_backward(d.lnf, g.wte, nullptr, d.logits, a.lnf, p.wte, BT, C, Vl, lane.accumulate);
    return {tp_.size > 1 ? d.lnf : nullptr, BT * C};  // vocab-parallel LM head
  }
  if (k == 1) {
    if (!stage_.last) return {nullptr, 0};
    const int64_t last = (L - 1) * BT * C;
    k::layernorm_backward(d.residual3 + last, g.lnfw, g.lnfb, d.lnf, a.residual3 + last, p.lnfw,
                          a.lnf_mean, a.lnf_rstd, BT, C);
    return {nullptr, 0};
  }
  if (k == backward_ops() - 1) {
    if (!stage_.first) {  // for the previous stage
      std::memcpy(lane.stage_input_grad, d.encoded, BT * C * sizeof(float));
      return {nullptr, 0};
    }
    if (tp_.size == 1) {
      k::embedding_backward(g.wte, g.wpe, d.encoded, inputs, B, T, C);
      return {nullptr, 0};
    }
    for (int64_t i = 0; i < BT; ++i) {  // vocab-parallel: only the rows this rank holds
      const int64_t row = inputs[i] - vocab_offset_;
      const float* dout = d.encoded + i * C;
      float* dpos = g.wpe + (i % T) * C;
      for (int64_t ch = 0; ch < C; ++ch) dpos[ch] += dout[ch];
      if (row < 0 || row >= Vl) continue;
      float* drow = g.wte + row * C;
      for (int64_t ch = 0; ch < C; ++ch) drow[ch] += dout[ch];
    }
    return {nullptr, 0};
  }
  const bool recomputes = recompute_ != api::Recompute::kNone;
  const int64_t per_layer = recomputes ? 5 : 3;
  const int64_t l = L - 1 - (k - 2) / per_layer;
  int64_t phase = (k - 2) % per_layer;
  if (recomputes) {
    const bool full = recompute_ == api::Recompute::kFull;
    if (phase == 0) {
      zero_working_set_grads(lane);
      return attention_forward_block(lane, l, full);
    }
    if (phase == 1) return mlp_forward_block(lane, l, full);
    phase -= 2;
  }
  if (phase == 0) return layer_backward_op(lane, l, true);
  if (phase == 1) return layer_backward_op(lane, l, false);
  ln1_backward(lane, l);
  return {nullptr, 0};
}

// Layer l's ln1 backward, from the summed gradient of its output into the gradient of its input
// (the layer below's output, or the embedding). Layer l's gradients are then complete.
void Gpt::ln1_backward(Lane& lane, int64_t l) {
  const int64_t BT = lane.B * T_, C = config_.channels;
  const Params p = params_at(params_.data());
  const Params g = params_at(grads_.data());
  const Acts a = acts_at(lane, lane.acts.data());
  const Acts d = acts_at(lane, lane.grad_acts.data());
  const int64_t s = slot(l);
  const float* input = l == 0 ? a.encoded : a.residual3 + (l - 1) * BT * C;
  float* dinput = l == 0 ? d.encoded : d.residual3 + (l - 1) * BT * C;
  k::layernorm_backward(dinput, g.ln1w + l * C, g.ln1b + l * C, d.ln1 + s * BT * C, input,
                        p.ln1w + l * C, a.ln1_mean + s * BT, a.ln1_rstd + s * BT, BT, C);
  if (&lane == &lanes_.back() && unit_observer) unit_observer->grads_final(l + 1);
}

// With recompute, one layer's working set is shared by all layers: its gradients start again
// from zero for every layer.
void Gpt::zero_working_set_grads(Lane& lane) {
  const auto sizes = lane_activation_sizes(lane);
  float* base = lane.grad_acts.data();
  for (int i = 0; i < 22; ++i) {
    const bool working = (i >= 1 && i <= 7) || (i >= 9 && i <= 14) ||
                         ((i == 8 || i == 15) && recompute_ == api::Recompute::kFull);
    if (working) std::memset(base, 0, sizes[i] * sizeof(float));
    base += sizes[i];
  }
}

// The MLP half (`mlp_half`) or the attention half of layer l's backward (without its ln1).
std::pair<float*, int64_t> Gpt::layer_backward_op(Lane& lane, int64_t l, bool mlp_half) {
  const auto& c = config_;
  const int64_t B = lane.B, T = T_, BT = B * T, C = c.channels, Cl = Cl_, Fl = Fl_, NHl = NHl_;
  const bool acc = lane.accumulate;
  const Params p = params_at(params_.data());
  const Params g = params_at(grads_.data());
  const Acts a = acts_at(lane, lane.acts.data());
  const Acts d = acts_at(lane, lane.grad_acts.data());
  const int64_t s = slot(l), ps = proj_slot(l);
  const int64_t lc = l * BT * C, sc = s * BT * C, pc = ps * BT * C, sf = s * BT * Fl;
  const int64_t sq = s * BT * 3 * Cl, sa = s * BT * Cl, sh = s * B * NHl * T * T;
  if (mlp_half) {
    k::residual_backward(d.residual2 + sc, d.fcproj + pc, d.residual3 + lc, BT * C);
    gemm_backward(d.fch_gelu + sf, g.fcprojw + l * C * Fl, g.fcprojb + l * C, d.fcproj + pc,
                  a.fch_gelu + sf, p.fcprojw + l * C * Fl, BT, Fl, C, acc);
    k::gelu_backward(d.fch + sf, a.fch + sf, d.fch_gelu + sf, BT * Fl);
    gemm_backward(d.ln2 + sc, g.fcw + l * Fl * C, g.fcb + l * Fl, d.fch + sf, a.ln2 + sc,
                  p.fcw + l * Fl * C, BT, C, Fl, acc);
    return {tp_.size > 1 ? d.ln2 + sc : nullptr, BT * C};  // column-parallel fc1
  }
  float* dresidual = l == 0 ? d.encoded : d.residual3 + (l - 1) * BT * C;
  k::layernorm_backward(d.residual2 + sc, g.ln2w + l * C, g.ln2b + l * C, d.ln2 + sc,
                        a.residual2 + sc, p.ln2w + l * C, a.ln2_mean + s * BT, a.ln2_rstd + s * BT,
                        BT, C);
  k::residual_backward(dresidual, d.attproj + pc, d.residual2 + sc, BT * C);
  gemm_backward(d.atty + sa, g.attprojw + l * C * Cl, g.attprojb + l * C, d.attproj + pc,
                a.atty + sa, p.attprojw + l * C * Cl, BT, Cl, C, acc);
  k::attention_backward(d.qkv + sq, d.preatt + sh, d.att + sh, d.atty + sa, a.qkv + sq, a.att + sh,
                        B, T, Cl, NHl);
  gemm_backward(d.ln1 + sc, g.qkvw + l * 3 * Cl * C, g.qkvb + l * 3 * Cl, d.qkv + sq,
                a.ln1 + sc, p.qkvw + l * 3 * Cl * C, BT, C, 3 * Cl, acc);
  return {tp_.size > 1 ? d.ln1 + sc : nullptr, BT * C};  // column-parallel qkv
}

}  // namespace kt::worker

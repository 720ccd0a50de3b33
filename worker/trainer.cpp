#include "worker/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <functional>
#include <mutex>
#include <thread>

#include "api/error.h"
#include "api/hardware.h"
#include "api/quantity.h"
#include "api/training_job.h"
#include "kernels/ops.h"
#include "worker/checkpoint.h"
#include "worker/cutpoint.h"
#include "worker/data.h"
#include "worker/device.h"
#include "worker/gpt.h"
#include "worker/llmc_file.h"
#include "worker/offload.h"
#include "worker/pipeline_order.h"
#ifdef KUBETRAIN_WITH_CUDA
#include "worker/cuda_cutpoint.h"
#include "worker/cuda_gpt.h"
#include "worker/cuda_pipeline.h"
#endif
#ifdef KUBETRAIN_WITH_NCCL
#include "worker/comm_nccl.h"
#endif

namespace kt::worker {
namespace {

std::atomic<bool> g_stop{false};

extern "C" void on_stop_signal(int) {
  g_stop.store(true);
}

// The synthetic generator of every job: an order-1 chain with 8 successors per token
// (docs/DATA.md gives its entropy rate).
constexpr int kMarkovOrder = 1;
constexpr int kMarkovBranching = 8;

std::unique_ptr<DataSource> make_data(const api::Plan& plan, int dp_rank, int dp) {
  const auto& d = plan.data;
  const int vocab = static_cast<int>(plan.model.vocab);
  const uint64_t seed = static_cast<uint64_t>(plan.training.seed);
  if (d.source == api::DataSource::kTokens)
    return std::make_unique<TokenShards>(d.path, vocab, seed, dp_rank, dp);
  return std::make_unique<SyntheticMarkov>(vocab, kMarkovOrder, kMarkovBranching, seed, dp_rank,
                                           dp);
}

std::string format_step(const StepReport& r) {
  char line[256];
  std::snprintf(line, sizeof line,
                "step %6lld/%lld | loss %.4f | lr %.2e | norm %.3f | %.1f ms | %.0f tok/s | "
                "MFU %.1f%%",
                static_cast<long long>(r.step), static_cast<long long>(r.total_steps), r.loss,
                r.learning_rate, r.grad_norm, r.seconds * 1e3, r.tokens_per_second, 100 * r.mfu);
  return line;
}

// Data for the next micro-batch is produced on its own stream while the model computes; the
// cursor recorded with it is the position after every batch already consumed.
class BatchFeeder {
 public:
  BatchFeeder(DataSource& data, int64_t B, int64_t T) : data_(data), B_(B), T_(T), loader_("data") {
    prefetch();
  }
  // The next micro-batch as inputs and next-token targets (B·T each).
  void take(std::vector<int32_t>& inputs, std::vector<int32_t>& targets) {
    loader_.synchronize();
    batch_.swap(next_);
    prefetch();
    inputs.resize(B_ * T_);
    targets.resize(B_ * T_);
    for (int64_t b = 0; b < B_; ++b)
      for (int64_t i = 0; i < T_; ++i) {
        inputs[b * T_ + i] = batch_[b * (T_ + 1) + i];
        targets[b * T_ + i] = batch_[b * (T_ + 1) + i + 1];
      }
  }
  // The cursor after every batch taken so far (waits for the prefetch).
  nlohmann::json cursor() {
    loader_.synchronize();
    return next_cursor_;
  }
  void synchronize() { loader_.synchronize(); }

 private:
  void prefetch() {
    loader_.enqueue([this] {
      next_cursor_ = data_.cursor();
      data_.next_batch(static_cast<int>(B_), static_cast<int>(T_), next_);
    });
  }
  DataSource& data_;
  int64_t B_, T_;
  Stream loader_;
  std::vector<int32_t> batch_, next_;
  nlohmann::json next_cursor_;
};

// The steps already done, and the loss of the last of them (0 for none): what a run that has
// nothing left to do reports.
struct Restored {
  int64_t step = 0;
  double loss = 0;
};

// Where training starts: the latest checkpoint in options.checkpoint_dir (loaded into `tensors`,
// and `more` where given, then `loaded()`), else an llm.c file (into tensors.params, then
// `loaded()`), else `init()`.
Restored restore_or_init_weights(const api::Plan& plan, const TrainOptions& options,
                                 const CheckpointTensors& tensors, DataSource& data,
                                 const std::function<void(const std::string&)>& log,
                                 const std::function<void()>& loaded,
                                 const std::function<void()>& init,
                                 const std::vector<CheckpointTensors>& more) {
  std::optional<CheckpointMeta> resumed;
  if (!options.checkpoint_dir.empty())
    resumed = load_latest_checkpoint(options.checkpoint_dir, tensors);
  // A cutpoint's second segment, or the further chunks of virtual stages, from the same
  // checkpoint.
  for (const CheckpointTensors& also_tensors : more) {
    if (!resumed) break;
    const auto also = load_latest_checkpoint(options.checkpoint_dir, also_tensors);
    if (!also || also->step != resumed->step)
      throw Error("checkpoint directory " + options.checkpoint_dir + " changed while resuming " +
                  "from step " + std::to_string(resumed->step));
    resumed->resharded += also->resharded;
  }
  if (resumed) {
    if (!resumed->plan_hash.empty() && resumed->plan_hash != plan.plan_hash)
      log("note: the checkpoint was written under plan " + resumed->plan_hash + ", this is " +
          plan.plan_hash);
    loaded();
    data.restore(resumed->data_cursor);
    log("resumed from step " + std::to_string(resumed->step) + " (loss " +
        std::to_string(resumed->loss) + ") in " + options.checkpoint_dir +
        (resumed->resharded > 0 ? "; " + std::to_string(resumed->resharded) +
                                      " tensors resharded from the checkpoint's TP layout"
                                : ""));
    return {resumed->step, resumed->loss};
  }
  if (!options.init_from_llmc.empty()) {
    const LlmcDims dims{
        static_cast<int>(plan.model.seq_len), static_cast<int>(plan.model.vocab),
        static_cast<int>(plan.model.layers),  static_cast<int>(plan.model.heads),
        static_cast<int>(plan.model.hidden),  static_cast<int>(plan.model.padded_vocab())};
    import_llmc(options.init_from_llmc, dims, tensors.params);
    for (const CheckpointTensors& also : more)
      import_llmc(options.init_from_llmc, dims, also.params);
    loaded();
    log("initialised from llm.c model " + options.init_from_llmc);
    return {};
  }
  init();
  return {};
}

// The same, then options.on_start. `more`: the second segment of a cutpoint, loaded from the
// same checkpoint.
Restored restore_or_init(const api::Plan& plan, const TrainOptions& options,
                         const CheckpointTensors& tensors, DataSource& data,
                         const std::function<void(const std::string&)>& log,
                         const std::function<void()>& loaded, const std::function<void()>& init,
                         const std::vector<CheckpointTensors>& more = {}) {
  const Restored start =
      restore_or_init_weights(plan, options, tensors, data, log, loaded, init, more);
  if (options.on_start) options.on_start({start.step, data.loss_floor()});
  return start;
}

CheckpointMeta checkpoint_meta(const api::Plan& plan, int64_t steps_done, nlohmann::json cursor,
                               double loss) {
  CheckpointMeta meta;
  meta.step = steps_done;
  meta.data_cursor = std::move(cursor);
  meta.rng = {{"seed", plan.training.seed}};
  meta.plan_hash = plan.plan_hash;
  meta.loss = loss;
  meta.extra = {{"model", {{"layers", plan.model.layers}, {"hidden", plan.model.hidden}}},
                {"device", std::string(api::to_string(plan.device))}};
  return meta;
}

// AdamW's settings for 0-based `step` with the global gradient norm (clipping at gradClip).
kernels::AdamWStep adamw_step(const api::TrainingSpec& t, int64_t step, double norm) {
  kernels::AdamWStep adam;
  adam.learning_rate = static_cast<float>(learning_rate_at(t, step));
  adam.t = step + 1;
  adam.grad_scale =
      t.grad_clip > 0 && norm > t.grad_clip ? static_cast<float>(t.grad_clip / norm) : 1.0f;
  return adam;
}

void check_finite(double loss, int64_t step) {
  if (!std::isfinite(loss))
    throw Error("loss is " + std::to_string(loss) + " at step " + std::to_string(step + 1) +
                " (diverged; lower spec.training.learningRate)");
}

// The step's report from its times and counters; `flops` = the model's FLOPs of the step.
StepReport step_report(const api::Plan& plan, int64_t step, double loss, double lr, double norm,
                       std::chrono::steady_clock::time_point t0,
                       std::chrono::steady_clock::time_point t_opt,
                       std::chrono::steady_clock::time_point t1, double flops, double peak) {
  StepReport r;
  r.step = step + 1;
  r.total_steps = plan.training.steps;
  r.loss = loss;
  r.learning_rate = lr;
  r.grad_norm = norm;
  r.seconds = std::chrono::duration<double>(t1 - t0).count();
  r.optimizer_seconds = std::chrono::duration<double>(t1 - t_opt).count();
  r.tokens = plan.config.micro_batch * plan.model.seq_len * plan.config.grad_accum;
  r.tokens_per_second = r.tokens / r.seconds;
  r.mfu = peak > 0 ? flops / r.seconds / peak : 0.0;
  return r;
}

void report_step(const StepReport& r, const TrainOptions& options, TrainResult& result,
                 const std::function<void(const std::string&)>& log) {
  result.losses.push_back(r.loss);
  result.last_loss = r.loss;
  result.steps_done = r.step;
  if (options.on_step) options.on_step(r);
  if (options.log_every > 0 &&
      (r.step % options.log_every == 0 || r.step == r.total_steps || r.step == 1))
    log(format_step(r));
}

// The rank's process groups: the launcher's, or groups of one for a single-rank plan (kept in
// `single`).
ProcessGroups& groups_of(const api::Plan& plan, const TrainOptions& options,
                         ProcessGroups& single) {
  if (plan.world > 1 && !options.groups)
    throw Error("a plan of " + std::to_string(plan.world) + " ranks needs its process groups");
  if (!options.groups) {
    single.world = make_single_rank_communicator("world");
    single.tp = make_single_rank_communicator("tp");
    single.dp = make_single_rank_communicator("dp");
  }
  ProcessGroups& groups = options.groups ? *options.groups : single;
  if (!groups.pp) groups.pp = make_single_rank_communicator("pp");
  // (Per-stage TP: the stages after the cut have TP and DP groups of their degree.)
  const bool after_cut = groups.pp->rank() >= api::cut_stage(plan.config, plan.model.layers) &&
                         plan.config.pp > 1 && plan.config.cut_layer > 0;
  KT_CHECK(groups.tp->size() == (after_cut ? plan.config.cut_tp : plan.config.tp) &&
               groups.tp->size() * groups.dp->size() == plan.config.tp * plan.config.dp &&
               groups.pp->size() == plan.config.pp,
           "process groups do not match the plan");
  KT_CHECK(
      plan.config.cut_layer == 0 || plan.config.pp > 1 ||
          (groups.tp2 && groups.dp2 && groups.cut && groups.tp2->size() == plan.config.cut_tp &&
           groups.dp2->size() * plan.config.cut_tp == plan.world),
      "a cutpoint needs its process groups (tp2, dp2, cut)");
  KT_CHECK(plan.config.pp == 1 ||
               (groups.pp->rank() > 0 && groups.pp->rank() + 1 < plan.config.pp) ||
               groups.embedding,
           "the first and the last pipeline stage need their embedding group");
  return groups;
}

// Per-stage TP (a cutpoint between stages, api::cut_stage): the stages from the cut on run at
// its TP degree, with their DP degree and micro-batch (B·cut_tp/tp sequences); every stage reads
// the data in the first layout (DP rank place / tp of dp), so the data cursor is the same
// everywhere. Without a stage cut: the plan's.
struct StageLayout {
  bool stage_cut = false;
  int64_t first_after_cut = 0;
  int tp = 1, dp = 1;  // the rank's stage's
  int64_t micro_batch = 1;
  int data_rank = 0;
};
StageLayout stage_layout(const api::Plan& plan, ProcessGroups& groups) {
  const auto& c = plan.config;
  StageLayout s;
  s.stage_cut = c.pp > 1 && c.cut_layer > 0;
  s.first_after_cut = api::cut_stage(c, plan.model.layers);
  s.tp = groups.tp->size(), s.dp = groups.dp->size();
  s.micro_batch = c.micro_batch * s.tp / c.tp;
  s.data_rank = s.stage_cut ? static_cast<int>(groups.world->rank() % (c.tp * c.dp) / c.tp)
                            : groups.dp->rank();
  return s;
}

// Rank `stage`'s part of the plan's pipeline (docs/WORKER.md, "Pipeline stages"): layers
// [s·L/pp, (s+1)·L/pp), or with v virtual stages chunk c's [(c·pp + s)·L/(pp·v), …), and the
// micro-batches the schedule keeps in flight there (worker/pipeline_order.h).
PipelineStage pipeline_stage(const api::Plan& plan, int stage, int chunk = 0) {
  const int64_t L = plan.model.layers, pp = plan.config.pp, v = plan.config.virtual_stages;
  const int64_t place = virtual_stage(static_cast<int>(pp), stage, chunk);
  PipelineStage s;
  s.first_layer = place * L / (pp * v);
  s.model_layers = L;
  s.first = place == 0;
  s.last = place + 1 == pp * v;
  s.in_flight =
      pipeline_order(static_cast<int>(pp), stage, static_cast<int>(v), plan.config.grad_accum)
          .in_flight[static_cast<size_t>(chunk)];
  return s;
}

// The tensors of `views` a stage owns: its layers' and, where `with_unit0`, those that are not
// per layer (the first stage writes them to checkpoints; the first and the last hold them).
std::vector<TensorView> stage_views(const std::vector<TensorView>& views, bool with_unit0) {
  std::vector<TensorView> out;
  for (int i = 0; i < kNumParamTensors; ++i)
    if (with_unit0 || kParams[static_cast<size_t>(i)].per_layer)
      out.push_back(views[static_cast<size_t>(i)]);
  return out;
}
// The same of the parameters and both moments.
CheckpointTensors stage_views(const CheckpointTensors& tensors, bool with_unit0) {
  return {stage_views(tensors.params, with_unit0), stage_views(tensors.adam_m, with_unit0),
          stage_views(tensors.adam_v, with_unit0)};
}

// The offload engines' counters of a rank, summed (a virtual stage's chunks, a cutpoint's
// segments each have their own engine).
struct EngineTotals {
  int64_t h2d_bytes = 0, d2h_bytes = 0;
  double cpu_optimizer_seconds = 0, transfer_seconds = 0, exposed_transfer_seconds = 0;
};
EngineTotals engine_totals(const std::vector<OffloadEngine*>& engines) {
  EngineTotals sum;
  for (const OffloadEngine* e : engines) {
    sum.h2d_bytes += e->h2d_bytes();
    sum.d2h_bytes += e->d2h_bytes();
    sum.cpu_optimizer_seconds += e->cpu_optimizer_seconds();
    sum.transfer_seconds += e->transfer_seconds();
    sum.exposed_transfer_seconds += e->exposed_transfer_seconds();
  }
  return sum;
}

// One optimizer step's micro-batches on a pipeline stage, in the order of
// worker/pipeline_order.h: 1F1B (Narayanan et al. SC21; Megatron's
// forward_backward_pipelining_without_interleaving), or with virtual stages the interleaved
// schedule, whose model chunks are `chunks` (chunk c: virtual stage c·p + s). Sends are posted
// at their group (they return at once); receives a group earlier, before the op ahead of the
// one that needs them, because a Gloo send moves its data only once the matching receive is
// posted: the transfer then runs while this stage computes, and a stage waits only for what has
// not arrived. (A receive's buffer is free a group early too: the op between does not read it —
// a chunk's consecutive ops of one kind use different slots, which the order's in_flight
// guarantees — and the KT_CHECK below would say otherwise.) Every rank posts its sends, and its
// receives, in the groups' order, which is the order Gloo matches them in per direction.
//
// Per-stage TP (a cutpoint between stages, api::cut_stage): the first stage after the cut
// receives the activations of the stage before in its layout (B₁ sequences) and re-shards them
// to its own (B₂) before its forward, and its input gradient back after its backward
// (`cut_activations`, worker/cutpoint.h); the last stage re-shards each micro-batch's tokens
// (`cut_tokens`), whose targets its loss needs. Both null elsewhere.
class PipelineSchedule {
 public:
  PipelineSchedule(std::vector<Gpt*> chunks, std::vector<OffloadEngine*> engines, Communicator& pp,
                   int64_t B, int64_t T, CutpointReshard* cut_activations = nullptr,
                   CutpointReshard* cut_tokens = nullptr)
      : chunks_(std::move(chunks)),
        engines_(std::move(engines)),
        pp_(pp),
        cut_activations_(cut_activations),
        cut_tokens_(cut_tokens) {
    const int64_t C = chunks_[0]->config().channels;
    // What goes to the next stage, and what comes from the one before (B₁ sequences at the cut).
    floats_out_ = static_cast<size_t>(B * T * C);
    floats_in_ = cut_activations_ ? static_cast<size_t>(cut_activations_->batch_before() * T * C)
                                  : floats_out_;
    for (Gpt* chunk : chunks_) {
      Buffers& b = buffers_.emplace_back();
      const int slots = chunk->stage().in_flight;
      for (auto* buffers : {&b.act_in, &b.grad_out})
        buffers->assign(slots, std::vector<float>(floats_in_));
      for (auto* buffers : {&b.act_out, &b.grad_in})
        buffers->assign(slots, std::vector<float>(floats_out_));
      for (auto* works : {&b.act_sent, &b.grad_sent, &b.act_received, &b.grad_received})
        works->resize(slots);
    }
    if (cut_activations_) {  // the model copies its input in its forward: one buffer serves
      resharded_input_.resize(floats_out_);
      resharded_grad_.resize(floats_out_);
    }
  }

  // Returns the step's loss on the last stage (0 elsewhere); every send has completed.
  double step(BatchFeeder& feeder, int64_t m, float loss_scale) {
    const PipelineOrder order =
        pipeline_order(pp_.size(), pp_.rank(), static_cast<int>(chunks_.size()), m);
    // The tokens of every micro-batch of the step (the first and the last virtual stage read
    // them; every stage takes them, so that the data cursor stays the same everywhere).
    inputs_.resize(static_cast<size_t>(m));
    targets_.resize(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) {
      auto& inputs = inputs_[static_cast<size_t>(i)];
      auto& targets = targets_[static_cast<size_t>(i)];
      feeder.take(inputs, targets);
      if (cut_tokens_) cut_tokens_->tokens(inputs, targets);  // into the last stage's layout
    }
    double loss = 0;
    post(order.groups[0], /*sends=*/false);
    for (size_t j = 0; j < order.ops.size(); ++j) {
      post(order.groups[j], /*sends=*/true);
      post(order.groups[j + 1], /*sends=*/false);  // the next op's receives, ahead
      const PipelineOp& op = order.ops[j];
      if (op.forward)
        loss += forward(op, loss_scale);
      else
        backward(op, m);
    }
    post(order.groups.back(), /*sends=*/true);
    for (Buffers& b : buffers_)
      for (auto* works : {&b.act_sent, &b.grad_sent, &b.act_received, &b.grad_received})
        for (auto& work : *works) finish(work);
    return loss / static_cast<double>(m);
  }

 private:
  struct Buffers {  // per chunk, by slot
    std::vector<std::vector<float>> act_in, act_out, grad_in, grad_out;
    std::vector<std::shared_ptr<CommWork>> act_sent, grad_sent, act_received, grad_received;
  };
  static void finish(std::shared_ptr<CommWork>& work) {
    if (work) work->wait();
    work.reset();
  }
  int slot(int chunk, int64_t micro) const {
    return static_cast<int>(micro % chunks_[static_cast<size_t>(chunk)]->stage().in_flight);
  }

  // A group's sends, or its receives. A send waits, before its slot is written again, in the op
  // that writes it.
  void post(const std::vector<PipelineTransfer>& group, bool sends) {
    for (const PipelineTransfer& t : group) {
      if (t.send != sends) continue;
      Buffers& b = buffers_[static_cast<size_t>(t.chunk)];
      const int s = slot(t.chunk, t.micro);
      if (t.send) {
        auto& data = t.activations ? b.act_out[s] : b.grad_out[s];
        (t.activations ? b.act_sent : b.grad_sent)[s] =
            pp_.send_async(data.data(), t.activations ? floats_out_ : floats_in_, t.peer);
      } else {
        auto& data = t.activations ? b.act_in[s] : b.grad_in[s];
        auto& work = (t.activations ? b.act_received : b.grad_received)[s];
        KT_CHECK(!work, "a pipeline receive into a slot still in use");
        work = pp_.recv_async(data.data(), t.activations ? floats_in_ : floats_out_, t.peer);
      }
    }
  }

  double forward(const PipelineOp& op, float loss_scale) {
    Gpt& model = *chunks_[static_cast<size_t>(op.chunk)];
    Buffers& b = buffers_[static_cast<size_t>(op.chunk)];
    const int s = slot(op.chunk, op.micro);
    const PipelineStage& stage = model.stage();
    finish(b.act_received[s]);
    finish(b.act_sent[s]);  // the slot's previous output has left
    const auto i = static_cast<size_t>(op.micro);
    const float* input = stage.first ? nullptr : b.act_in[s].data();
    if (cut_activations_) {
      cut_activations_->activations(input, resharded_input_.data());
      input = resharded_input_.data();
    }
    return model.forward_micro(s, inputs_[i].data(), targets_[i].data(), loss_scale, input,
                               stage.last ? nullptr : b.act_out[s].data());
  }

  void backward(const PipelineOp& op, int64_t m) {
    Gpt& model = *chunks_[static_cast<size_t>(op.chunk)];
    Buffers& b = buffers_[static_cast<size_t>(op.chunk)];
    const int s = slot(op.chunk, op.micro);
    const PipelineStage& stage = model.stage();
    // In the last micro-batch the engine sums each unit's gradients over DP once final.
    engines_[static_cast<size_t>(op.chunk)]->begin_micro_batch(op.micro, m);
    finish(b.grad_received[s]);
    finish(b.grad_sent[s]);
    float* input_grad = stage.first ? nullptr : b.grad_out[s].data();
    model.backward_micro(s, stage.last ? nullptr : b.grad_in[s].data(),
                         cut_activations_ ? resharded_grad_.data() : input_grad);
    if (cut_activations_) cut_activations_->gradients(resharded_grad_.data(), input_grad);
  }

  std::vector<Gpt*> chunks_;
  std::vector<OffloadEngine*> engines_;
  Communicator& pp_;
  CutpointReshard* cut_activations_;
  CutpointReshard* cut_tokens_;
  size_t floats_in_ = 0, floats_out_ = 0;
  std::vector<float> resharded_input_, resharded_grad_;
  std::vector<Buffers> buffers_;
  std::vector<std::vector<int32_t>> inputs_, targets_;
};

// Who writes what of a checkpoint: TP shards by TP rank, written by DP rank 0 (the replicas hold
// the same values), world rank 0 publishing it after a barrier.
ShardedSave sharded_save(const api::Plan& plan, ProcessGroups& groups) {
  ShardedSave sharding;
  // Stage s's TP ranks write shards s·tp .. s·tp + tp − 1.
  sharding.shard_index = groups.pp->rank() * static_cast<int>(plan.config.tp) + groups.tp->rank();
  // With virtual stages, chunk c writes virtual stage c·pp + s's: shard (c·pp + s)·tp + TP rank.
  sharding.shard_count =
      static_cast<int>(plan.config.tp * plan.config.pp * plan.config.virtual_stages);
  sharding.writes = groups.dp->rank() == 0;
  if (plan.config.cut_layer > 0 && plan.config.pp == 1)  // after the TP ranks before the cut,
    sharding.shard_count = static_cast<int>(plan.config.tp + plan.config.cut_tp);  // those after
  if (plan.config.cut_layer > 0 && plan.config.pp > 1) {  // per-stage TP: each stage its degree's
    const int first = static_cast<int>(api::cut_stage(plan.config, plan.model.layers));
    const int stage = groups.pp->rank(), tp = static_cast<int>(plan.config.tp),
              cut_tp = static_cast<int>(plan.config.cut_tp);
    sharding.shard_index =
        (stage < first ? stage * tp : first * tp + (stage - first) * cut_tp) + groups.tp->rank();
    sharding.shard_count = first * tp + (static_cast<int>(plan.config.pp) - first) * cut_tp;
  }
  sharding.leader = groups.world->rank() == 0;
  if (plan.world > 1) {
    sharding.barrier = [&groups] { groups.world->barrier(); };
    sharding.all_ok = [&groups](bool ok) {
      float failed = ok ? 0.0f : 1.0f;
      groups.world->allreduce(&failed, 1, ReduceOp::kMax);
      return failed == 0;
    };
  }
  return sharding;
}

// The checkpoint directory's lock, taken by the job's writer (rank 0) for the whole run. Held by
// another writer: refused (kt::Error). A directory where the lock file cannot be created because
// nothing can be written there (a read-only file system, a full disk or quota) cannot be written
// by another writer either: training goes on, and each save reports its failure. Any other
// failure (the lock is a directory, no permission on it alone) is refused: another writer might
// be writing the same directory unseen, and two writers remove each other's temporaries.
std::optional<CheckpointLock> lock_checkpoint_dir(
    const TrainOptions& options, ProcessGroups& groups,
    const std::function<void(const std::string&)>& log) {
  if (options.checkpoint_dir.empty() || groups.world->rank() != 0) return std::nullopt;
  try {
    return CheckpointLock::acquire(options.checkpoint_dir, options.checkpoint_lock_wait);
  } catch (const CheckpointIoError& e) {
    if (e.err() != EROFS && e.err() != ENOSPC && e.err() != EDQUOT)
      throw Error(std::string("cannot lock the checkpoint directory: ") + e.what() +
                  " (fix or remove " + options.checkpoint_dir +
                  "/.lock; without the lock a second writer could use the directory unseen)");
    log(std::string("warning: going on without the checkpoint directory's lock: ") + e.what());
    return std::nullopt;
  }
}

// A checkpoint save through `write` (which returns the checkpoint's directory). A failure — disk
// full, read-only, no permission — is logged, counted and passed to on_checkpoint_failure, not
// thrown: training goes on, and the next interval writes again (the previous checkpoints and
// `latest` are untouched). Every rank of a sharded save agrees whether it failed.
void save_or_report(int64_t steps_done, const TrainOptions& options, TrainResult& result,
                    const std::function<void(const std::string&)>& log,
                    const std::function<std::string()>& write) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string reason = "other", error;
  try {
    const std::string dir = write();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    result.checkpoint_error.clear();
    if (options.on_checkpoint) options.on_checkpoint(steps_done, seconds);
    log("checkpoint " + dir + " (" + std::to_string(static_cast<int>(seconds * 1000)) + " ms)");
    return;
  } catch (const CheckpointIoError& e) {
    if (const char* name = strerrorname_np(e.err())) reason = name;
    error = e.what();
  } catch (const std::exception& e) {
    error = e.what();
  }
  ++result.checkpoint_failures;
  result.checkpoint_error = error;
  if (options.on_checkpoint_failure) options.on_checkpoint_failure(steps_done, reason, error);
  log("checkpoint at step " + std::to_string(steps_done) + " failed (" + reason + ", " +
      std::to_string(result.checkpoint_failures) + " so far; training goes on and saves again at " +
      "the next interval): " + error);
}

// Every rank must stop after the same step (a signal reaches them at different moments, and a
// rank that ran one step further would wait forever in its collectives).
bool stop_requested(const api::Plan& plan, ProcessGroups& groups) {
  float stop = g_stop.load() ? 1.0f : 0.0f;
  if (plan.world > 1) groups.world->allreduce(&stop, 1, ReduceOp::kMax);
  return stop > 0;
}

// After step `step` (0-based): when any rank was asked to stop, checkpoint (`save`) and say so;
// true when the run stops here. Every rank agrees (stop_requested).
bool stop_after_step(const api::Plan& plan, ProcessGroups& groups, int64_t step,
                     TrainResult& result, const std::function<void(const std::string&)>& log,
                     const std::function<void()>& save) {
  if (!stop_requested(plan, groups)) return false;
  save();
  result.interrupted = true;
  log("stopped by signal after step " + std::to_string(step + 1) +
      (result.checkpoint_error.empty()
           ? ""
           : " (its checkpoint failed: a restart resumes from the previous one)"));
  return true;
}

// The step's loss: this rank's mean, averaged over the DP group (with a cutpoint: of the layers
// after it, which compute the loss).
double dp_mean_loss(double loss, Communicator& dp_group) {
  const int dp = dp_group.size();
  if (dp == 1) return loss;
  float step_loss = static_cast<float>(loss);
  dp_group.allreduce(&step_loss, 1);
  return step_loss / dp;
}

// The global gradient norm from this rank's Σ g²: the TP-sharded tensors' summed over the TP
// group, the replicated ones once; then over the pipeline stages (each counts its layers, the
// first stage the tensors that are not per layer). `after_cut`: a cutpoint's second segment's
// sums (sharded, replicated; its layers only).
double global_norm(double sharded_sum, double replicated_sum, ProcessGroups& groups,
                   const double* after_cut = nullptr) {
  float sharded[2] = {static_cast<float>(sharded_sum), 0.0f};
  if (groups.tp->size() > 1) groups.tp->allreduce(sharded, 1);
  double total = static_cast<double>(sharded[0]) + replicated_sum;
  if (after_cut) {  // the second segment's sums, over its own TP group
    sharded[1] = static_cast<float>(after_cut[0]);
    if (groups.tp2->size() > 1) groups.tp2->allreduce(sharded + 1, 1);
    total += static_cast<double>(sharded[1]) + after_cut[1];
  }
  if (groups.pp && groups.pp->size() > 1) allreduce_doubles(*groups.pp, &total, 1);
  return std::sqrt(total);
}

// The communication totals of the rank's groups of more than one rank, by phase group.
std::map<std::string, CommStats> comm_totals(ProcessGroups& groups) {
  std::map<std::string, CommStats> totals;
  for (Communicator* group : {groups.tp.get(), groups.dp.get(), groups.pp.get()})
    if (group && group->size() > 1) totals[group->name()] = group->stats();
  // A cutpoint's groups count where the planner predicts them (its phases): the TP group after
  // the cut as TP; the DP group after it and the re-shard at the cut as DP.
  for (auto [group, phase] :
       {std::pair{groups.tp2.get(), "tp"}, {groups.dp2.get(), "dp"}, {groups.cut.get(), "dp"}})
    if (group && group->size() > 1) totals[phase] += group->stats();
  return totals;
}

#ifdef KUBETRAIN_WITH_CUDA
// The rank's GPU: LOCAL_RANK modulo the visible devices (a pod sees its one GPU as device 0;
// `kubetrain-worker launch` on a machine with several GPUs spreads its ranks over them).
int local_device_ordinal() {
  const char* local = std::getenv("LOCAL_RANK");
  int rank = 0;
  if (local && *local) {
    try {
      rank = std::stoi(local);
    } catch (const std::exception&) {
      throw Error(std::string("LOCAL_RANK='") + local + "' is not a rank number");
    }
  }
  return std::max(0, rank) % std::max(1, CudaDevice::device_count());
}

// The CUDA model's collectives (worker/gradient_reducer.h): the DP group's gradient sums and the
// TP group's activation all-reduces. NCCL when every rank has a GPU of its own and libnccl loads
// on every rank, else through the host (Gloo); KUBETRAIN_CUDA_COMM=nccl|host forces one. Every
// rank reaches the same choice: the facts are gathered over the world group first.
struct CudaCollectives {
  std::unique_ptr<GradientReducer> dp;    // null at DP 1
  std::unique_ptr<StreamCollectives> tp;  // null at TP 1
  // Pipeline stages (null without): the transfers between stages, and the first and the last
  // stage's sum of the embeddings.
  std::unique_ptr<StreamPointToPoint> pp;
  std::unique_ptr<GradientReducer> embedding;
  // A cutpoint (null without): the layers after it's TP (null at TP 1) and DP (null at DP 1)
  // collectives, the re-shard at the cut, and unit 0's sum over the world.
  std::unique_ptr<StreamCollectives> tp2;
  std::unique_ptr<GradientReducer> dp2, cut, world;
};
CudaCollectives make_cuda_collectives(ProcessGroups& groups, CudaDevice& device,
                                      const std::function<void(const std::string&)>& log) {
  CudaCollectives out;
  Communicator& world = *groups.world;
  if (world.size() == 1) return out;
  const char* env = std::getenv("KUBETRAIN_CUDA_COMM");
  const std::string mode = env && *env ? env : "auto";
  // This rank's GPU as two exactly representable floats of a 48-bit hash of host and PCI bus
  // id, gathered from every rank.
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const uint64_t key = std::hash<std::string>{}(std::string(host) + "/" + device.pci_bus_id());
  const float mine[2] = {static_cast<float>(key & 0xFFFFFF),
                         static_cast<float>((key >> 24) & 0xFFFFFF)};
  std::vector<float> gathered(2 * static_cast<size_t>(world.size()));
  world.allgather(mine, gathered.data(), 2);
  std::vector<std::vector<float>> keys;
  for (size_t r = 0; r < static_cast<size_t>(world.size()); ++r)
    keys.push_back({gathered[2 * r], gathered[2 * r + 1]});
  std::string no_nccl = "this worker was built without nccl.h";
#ifdef KUBETRAIN_WITH_NCCL
  nccl_available(&no_nccl);
#endif
  float missing = no_nccl.empty() ? 0.0f : 1.0f;  // on any rank
  world.allreduce(&missing, 1, ReduceOp::kMax);
  if (missing > 0 && no_nccl.empty()) no_nccl = "another rank cannot load libnccl";
  const ReducerChoice choice = choose_reducer(mode, keys, no_nccl);
  // A cutpoint without stages has tp2 and dp2 beside its cut group; with stages (per-stage TP)
  // the first stage after the cut and the last have the cut group alone.
  const bool dp = groups.dp->size() > 1, tp = groups.tp->size() > 1,
             pp = groups.pp && groups.pp->size() > 1, cut = groups.tp2 != nullptr;
  const bool dp2 = cut && groups.dp2->size() > 1, tp2 = cut && groups.tp2->size() > 1;
  const bool stage_cut = groups.cut && !cut;
  std::vector<std::string> parts;
  if (dp) parts.push_back("DP gradient sums over " + std::to_string(groups.dp->size()) + " ranks");
  if (tp) parts.push_back("TP all-reduces over " + std::to_string(groups.tp->size()) + " ranks");
  if (pp) parts.push_back("transfers between " + std::to_string(groups.pp->size()) + " stages");
  if (stage_cut)
    parts.push_back("the re-shard over " + std::to_string(groups.cut->size()) +
                    " ranks between stages of two TP degrees");
  if (cut)
    parts.push_back("after the cutpoint TP " + std::to_string(groups.tp2->size()) + " × DP " +
                    std::to_string(groups.dp2->size()) + ", the re-shard over " +
                    std::to_string(groups.cut->size()) + " ranks and the embeddings' sum over " +
                    std::to_string(world.size()));
  std::string what;
  for (const std::string& part : parts) what += (what.empty() ? "" : ", ") + part;
#ifdef KUBETRAIN_WITH_NCCL
  if (choice.backend == "nccl") {
    log(what + ": NCCL on " + device.name() + " (" + choice.reason + ")");
    // With TP or stages on NCCL too, the DP sums (and the stages' transfers and embedding sums)
    // go on the TP communication stream, in issue order: two communicators' operations must not
    // run concurrently (comm_nccl.h).
    CudaStream* serial =
        tp || pp || cut || stage_cut ? &device.stream(StreamRole::kTensorParallelComm) : nullptr;
    if (dp) out.dp = make_nccl_gradient_reducer(*groups.dp, device.ordinal(), serial);
    if (tp) out.tp = make_nccl_stream_collectives(*groups.tp, device.ordinal());
    if (pp) out.pp = make_nccl_point_to_point(*groups.pp, device.ordinal());
    if (pp && groups.embedding)
      out.embedding = make_nccl_gradient_reducer(*groups.embedding, device.ordinal(), serial);
    if (dp2) out.dp2 = make_nccl_gradient_reducer(*groups.dp2, device.ordinal(), serial);
    if (tp2) out.tp2 = make_nccl_stream_collectives(*groups.tp2, device.ordinal());
    if (cut || stage_cut)
      out.cut = make_nccl_gradient_reducer(*groups.cut, device.ordinal(), serial);
    if (cut) out.world = make_nccl_gradient_reducer(world, device.ordinal(), serial);
    return out;
  }
#endif
  log(what + ": through the host (Gloo): " + choice.reason);
  if (dp) out.dp = make_host_gradient_reducer(*groups.dp, device);
  if (tp) out.tp = make_host_stream_collectives(*groups.tp, device);
  if (pp) out.pp = make_host_point_to_point(*groups.pp, device);
  if (pp && groups.embedding) out.embedding = make_host_gradient_reducer(*groups.embedding, device);
  if (dp2) out.dp2 = make_host_gradient_reducer(*groups.dp2, device);
  if (tp2) out.tp2 = make_host_stream_collectives(*groups.tp2, device);
  if (cut || stage_cut) out.cut = make_host_gradient_reducer(*groups.cut, device);
  if (cut) out.world = make_host_gradient_reducer(world, device);
  return out;
}

// The plan on one CUDA GPU (worker/cuda_gpt.h): the CPU loop's data, schedule, clipping,
// checkpoints and signals; the model and its optimizer split on the device.
TrainResult train_cuda(const api::Plan& plan, const TrainOptions& options,
                       const std::function<void(const std::string&)>& log) {
  if (CudaDevice::device_count() == 0)
    throw Error("this plan runs on CUDA (device: cuda) and this machine has no usable CUDA "
                "device: " + CudaDevice::unavailable_reason());
  omp_set_num_threads(static_cast<int>(std::max<int64_t>(1, plan.cpu_threads)));
  const auto& t = plan.training;
  const int64_t B = plan.config.micro_batch, T = plan.model.seq_len;
  const int64_t accum = plan.config.grad_accum;
  const int dp = static_cast<int>(plan.config.dp);
  ProcessGroups single;
  ProcessGroups& groups = groups_of(plan, options, single);
  const int pp = static_cast<int>(plan.config.pp);
  const StageLayout layout = stage_layout(plan, groups);  // per-stage TP
  const bool stage_cut = layout.stage_cut;
  const int64_t first_after_cut = layout.first_after_cut, stage_B = layout.micro_batch;
  const int stage_tp = layout.tp, stage_dp = layout.dp, data_rank = layout.data_rank;
  check_host_memory(plan, options.host_memory_bytes);
  CudaDevice device(local_device_ordinal());
  // The kernels are built for sm_80 and sm_90 (bf16 tensor cores, cp.async): Ampere and newer.
  if (device.compute_capability() < 80)
    throw Error("this plan runs on CUDA in bf16, and " + device.name() + " (" + device.product() +
                ", compute capability " + std::to_string(device.compute_capability() / 10) + "." +
                std::to_string(device.compute_capability() % 10) +
                ") is older than the CUDA runtime supports (8.0: A100, RTX 30xx and newer)");
  const CudaCollectives collectives = make_cuda_collectives(groups, device, log);
  CudaGptOptions model_options;
  model_options.reducer = collectives.dp.get();
  model_options.distributed_optimizer = plan.config.distributed_optimizer;
  model_options.tp = collectives.tp.get();
  model_options.sub_batches = static_cast<int>(plan.config.sub_batches);
  model_options.recompute = plan.config.recompute;
  // (With virtual stages, chunk 0's part of its stage's units: api::chunk_device_units.)
  if (plan.config.offload != api::OffloadMode::kNone)
    model_options.device_units = plan.config.virtual_stages > 1
                                     ? api::chunk_device_units(plan.config, plan.model.layers, 0)
                                     : plan.config.gpu_units;
  if (plan.config.offload == api::OffloadMode::kWindow) model_options.window = plan.config.window;
  model_options.cpu_threads = static_cast<int>(std::max<int64_t>(1, plan.cpu_threads));
  // Pipeline stages (worker/cuda_pipeline.h): this rank's layers.
  model_options.stage = pipeline_stage(plan, groups.pp->rank());
  // The tied embeddings' sum: the first and the last (virtual) stage's — with per-stage TP as
  // logical tensors over both stages' ranks after the backward (sum_unit0_on_device).
  const bool holds_unit0 = model_options.stage.first || model_options.stage.last;
  model_options.embedding = holds_unit0 && !stage_cut ? collectives.embedding.get() : nullptr;
  model_options.unit0_elsewhere = stage_cut && holds_unit0;
  GptConfig config = GptConfig::from(plan.model);
  const int virtual_stages = static_cast<int>(plan.config.virtual_stages);
  config.layers /= pp * virtual_stages;
  // Oases' cutpoint (worker/cuda_cutpoint.h) without stages: layers [0, cut) here, the rest in
  // `after` (its own TP and DP collectives), built as the two stages of a pipeline on this rank.
  const int64_t cut = stage_cut ? 0 : plan.config.cut_layer, L = plan.model.layers;
  if (cut > 0) {
    config.layers = cut;
    model_options.stage.last = false;
    model_options.unit0_elsewhere = true;
    // With offload optimizer, the model's first gpuUnits units (the embeddings', then layers in
    // order) on the device: each segment its part.
    if (plan.config.offload != api::OffloadMode::kNone)
      model_options.device_units = api::part_device_units(plan.config.gpu_units, 0, cut);
  }
  CudaGpt model(device, config, stage_B, T, model_options);
  std::unique_ptr<CudaGpt> after;
  std::optional<CudaCutpoint> cutpoint;
  if (cut > 0) {
    CudaGptOptions after_options = model_options;
    after_options.reducer = collectives.dp2.get();
    after_options.tp = collectives.tp2.get();
    after_options.stage = PipelineStage{cut, L, /*first=*/false, /*last=*/true, /*in_flight=*/1};
    if (plan.config.offload != api::OffloadMode::kNone)
      after_options.device_units = api::part_device_units(plan.config.gpu_units, cut, L - cut);
    GptConfig after_config = config;
    after_config.layers = L - cut;
    after = std::make_unique<CudaGpt>(device, after_config, B * plan.config.cut_tp / plan.config.tp,
                                      T, after_options);
    cutpoint.emplace(model, *after, device, *groups.cut, *collectives.cut, *collectives.world);
  }
  // Virtual stages (worker/pipeline_order.h): chunks 1..v−1 of this stage, each a model of its
  // layers over the same collectives; the embedding group's only in the last virtual stage.
  std::vector<std::unique_ptr<CudaGpt>> chunks;
  for (int c = 1; c < virtual_stages; ++c) {
    CudaGptOptions chunk_options = model_options;
    chunk_options.stage = pipeline_stage(plan, groups.pp->rank(), c);
    if (plan.config.offload != api::OffloadMode::kNone)  // the chunk's part of its stage's units
      chunk_options.device_units = api::chunk_device_units(plan.config, L, c);
    chunk_options.embedding = chunk_options.stage.last ? collectives.embedding.get() : nullptr;
    chunks.push_back(std::make_unique<CudaGpt>(device, config, B, T, chunk_options));
  }
  std::vector<CudaGpt*> all_chunks{&model};
  for (auto& chunk : chunks) all_chunks.push_back(chunk.get());
  log("training on " + device.name() + " (" + device.product() + "), bf16, recompute " +
      std::string(api::to_string(plan.config.recompute)) + "; AdamW of " +
      std::to_string(model.device_units() + (after ? after->device_units() : 0) +
                     [&] {
                       int64_t more = 0;  // the further chunks'
                       for (auto& chunk : chunks) more += chunk->device_units();
                       return more;
                     }()) +
      " of " +
      std::to_string((config.layers + 1) * virtual_stages + (after ? after->num_layers() + 1 : 0)) +
      " offload units on the GPU" +
      (model.distributed_optimizer()
           ? " (masters and moments sharded over " + std::to_string(dp) + " DP ranks)"
           : std::string()) +
      (model_options.window > 0 ? "; the other layers streamed through " +
                                      std::to_string(model_options.window) + " slot(s)"
                                : std::string()) +
      (cut > 0 ? "; layers " + std::to_string(cut) + "-" + std::to_string(L - 1) + " at TP " +
                     std::to_string(plan.config.cut_tp) + " (cutpoint)"
               : std::string()));
  // Host copies for checkpoints and initialisation (llm.c layout).
  const int64_t P = model.num_parameters();
  std::vector<float> host_params(P), host_m(P), host_v(P);
  const int64_t tp = stage_tp, tp_rank = groups.tp->rank();
  const PipelineStage& stage = model.stage();
  GptConfig whole = config;
  whole.layers = plan.model.layers;
  auto views = [&](std::vector<float>& host) {  // the rank's TP slice of its stage's layers
    return gpt_rank_views(whole, tp, tp_rank, host.data(), stage.first_layer, config.layers);
  };
  const CheckpointTensors ckpt_tensors{views(host_params), views(host_m), views(host_v)};
  // A cutpoint's second segment: its layers and its copy of unit 0, in its own TP layout (it
  // loads both; it writes its layers only, as further shards).
  const int64_t P2 = after ? after->num_parameters() : 0;
  std::vector<float> after_params(P2), after_m(P2), after_v(P2);
  auto after_views = [&](std::vector<float>& host) {
    return gpt_rank_views(whole, plan.config.cut_tp, groups.tp2->rank(), host.data(), cut, L - cut);
  };
  std::optional<CheckpointTensors> after_tensors;
  if (after)
    after_tensors =
        CheckpointTensors{after_views(after_params), after_views(after_m), after_views(after_v)};
  // The further chunks' host copies, each with its copy of unit 0 (loaded; written by none:
  // virtual stage 0 writes unit 0), as further shards.
  struct ChunkHost {
    std::vector<float> params, m, v;
  };
  std::vector<ChunkHost> chunk_hosts(chunks.size());
  std::vector<CheckpointTensors> more_tensors;
  if (after_tensors) more_tensors.push_back(*after_tensors);
  for (size_t c = 0; c < chunks.size(); ++c) {
    ChunkHost& h = chunk_hosts[c];
    const auto n = static_cast<size_t>(chunks[c]->num_parameters());
    h.params.resize(n), h.m.resize(n), h.v.resize(n);
    auto chunk_views = [&](std::vector<float>& host) {
      return gpt_rank_views(whole, tp, tp_rank, host.data(), chunks[c]->stage().first_layer,
                            config.layers);
    };
    more_tensors.push_back({chunk_views(h.params), chunk_views(h.m), chunk_views(h.v)});
  }
  std::unique_ptr<DataSource> data = make_data(plan, data_rank, dp);
  const auto checkpoint_lock = lock_checkpoint_dir(options, groups, log);
  const Restored restored = restore_or_init(
      plan, options, ckpt_tensors, *data, log,
      [&] {  // a checkpoint's or llm.c's weights (and moments: zeros from llm.c)
        model.set_parameters(host_params.data());
        model.set_moments(host_m.data(), host_v.data());
        if (after) {
          after->set_parameters(after_params.data());
          after->set_moments(after_m.data(), after_v.data());
        }
        for (size_t c = 0; c < chunks.size(); ++c) {
          chunks[c]->set_parameters(chunk_hosts[c].params.data());
          chunks[c]->set_moments(chunk_hosts[c].m.data(), chunk_hosts[c].v.data());
        }
      },
      [&] {
        model.init_weights(static_cast<uint64_t>(t.seed));
        if (after) after->init_weights(static_cast<uint64_t>(t.seed));
        for (auto& chunk : chunks) chunk->init_weights(static_cast<uint64_t>(t.seed));
      },
      more_tensors);
  const int64_t start_step = restored.step;
  if (options.on_memory) {
    std::map<std::string, double> bytes;
    for (const auto& [kind, n] : device.device_memory_stats().in_use_bytes)
      bytes[to_string(kind)] = static_cast<double>(n);
    options.on_memory(device.name(), bytes);
    bytes.clear();
    for (const auto& [kind, n] : device.pinned_memory_stats().in_use_bytes)
      bytes[to_string(kind)] = static_cast<double>(n);
    options.on_memory("host", bytes);
  }

  BatchFeeder feeder(*data, B, T);
  std::vector<int32_t> inputs, targets;
  std::optional<CudaPipeline> pipeline;
  CudaStageCut stage_cut_place;  // per-stage TP: this stage's re-shards
  if (stage_cut) {
    stage_cut_place.widens = plan.config.cut_tp > plan.config.tp;
    if (groups.pp->rank() == first_after_cut) {
      stage_cut_place.activations = collectives.cut.get();
      stage_cut_place.batch_before = B;
    }
    if (groups.pp->rank() == pp - 1) stage_cut_place.tokens = groups.cut.get();
  }
  if (pp > 1)
    pipeline.emplace(all_chunks, device, *collectives.pp,
                     device.stream(StreamRole::kTensorParallelComm), stage_cut_place);
  // Per-stage TP: the first and the last stage's unit 0 summed over both (logical tensors).
  CudaAllocations unit0_memory(device);
  float* unit0_sums = stage_cut && holds_unit0
                          ? unit0_memory.device<float>(model.unit0_floats(), MemoryKind::kWorkspace)
                          : nullptr;
  CudaEvent unit0_ready;
  const api::HardwareProfile* profile = api::find_profile(plan.hardware);
  const double peak = plan.peak_flops > 0 ? plan.peak_flops
                                          : profile ? profile->peak_bf16_flops : 0.0;

  TrainResult result;
  result.steps_done = start_step;
  result.last_loss = restored.loss;
  auto save = [&](int64_t steps_done, double loss) {
    if (options.checkpoint_dir.empty()) return;
    save_or_report(steps_done, options, result, log, [&] {
      const CheckpointMeta meta = checkpoint_meta(plan, steps_done, feeder.cursor(), loss);
      model.get_parameters(host_params.data());
      model.get_moments(host_m.data(), host_v.data());
      // A stage after the first writes its layers only (the first writes the embeddings'); so
      // does a cutpoint's second segment, as shards of its own.
      ShardedSave sharding = sharded_save(plan, groups);
      if (after) {
        after->get_parameters(after_params.data());
        after->get_moments(after_m.data(), after_v.data());
        if (groups.dp2->rank() == 0)
          sharding.more.emplace_back(static_cast<int>(plan.config.tp) + groups.tp2->rank(),
                                     stage_views(*after_tensors, false));
      }
      // Virtual stages: chunk c writes the shards of virtual stage c·pp + s.
      for (size_t c = 0; c < chunks.size(); ++c) {
        chunks[c]->get_parameters(chunk_hosts[c].params.data());
        chunks[c]->get_moments(chunk_hosts[c].m.data(), chunk_hosts[c].v.data());
        if (sharding.writes)
          sharding.more.emplace_back(
              static_cast<int>(virtual_stage(pp, groups.pp->rank(), static_cast<int>(c) + 1) * tp +
                               tp_rank),
              stage_views(more_tensors[c + (after ? 1 : 0)], false));
      }
      return save_checkpoint(options.checkpoint_dir, meta, stage_views(ckpt_tensors, stage.first),
                             static_cast<int>(plan.checkpoint.keep), std::move(sharding));
    });
  };

  // Every chunk's offload traffic (and the second segment's).
  std::vector<CudaGpt*> engine_models = all_chunks;
  if (after) engine_models.push_back(after.get());
  auto offload_totals = [&] {
    EngineTotals sum;
    for (CudaGpt* m : engine_models) {
      sum.h2d_bytes += m->h2d_bytes(), sum.d2h_bytes += m->d2h_bytes();
      sum.cpu_optimizer_seconds += m->cpu_optimizer_seconds();
    }
    return sum;
  };
  for (int64_t step = start_step; step < t.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const EngineTotals before = offload_totals();
    for (CudaGpt* chunk : all_chunks) chunk->zero_grad();
    if (after) after->zero_grad();
    // The mean over the global batch: 1/accum here, 1/dp by the reducer's sum (with a cutpoint,
    // the DP degree after it, where the loss is).
    const float loss_scale =
        1.0f / static_cast<float>(accum * (after ? groups.dp2->size() : stage_dp));
    if (pipeline)
      pipeline->step(accum, loss_scale, [&](std::vector<int32_t>& in, std::vector<int32_t>& out) {
        feeder.take(in, out);
      });
    for (int64_t micro = 0; micro < accum && !pipeline; ++micro) {
      feeder.take(inputs, targets);
      if (cutpoint)
        cutpoint->micro_step(inputs.data(), targets.data(), loss_scale, micro == accum - 1);
      else
        model.train_micro_step(inputs.data(), targets.data(), loss_scale, micro == accum - 1);
    }
    if (cutpoint) cutpoint->sum_unit0();
    if (unit0_sums)
      sum_unit0_on_device({&model}, device, *collectives.embedding, unit0_sums, unit0_ready);
    double stage_loss = after ? after->mean_loss() : all_chunks.back()->mean_loss();
    double loss = 0;
    if (pipeline) {  // the last stage's mean over its DP group, for every stage
      if (groups.pp->rank() == pp - 1) stage_loss = dp_mean_loss(stage_loss, *groups.dp);
      float last_loss = static_cast<float>(stage_loss);
      groups.pp->broadcast(&last_loss, 1, pp - 1);
      loss = last_loss;
    } else {
      loss = dp_mean_loss(stage_loss, after ? *groups.dp2 : *groups.dp);
    }
    const auto t_opt = std::chrono::steady_clock::now();
    double sums[2], after_sums[2];
    sums[0] = sums[1] = 0;
    for (CudaGpt* chunk : all_chunks) {  // every chunk: the same TP and DP groups
      double more[2];
      chunk->grad_sums_of_squares(&more[0], &more[1]);
      sums[0] += more[0];
      sums[1] += more[1];
    }
    if (model.distributed_optimizer()) allreduce_doubles(*groups.dp, sums, 2);  // the shards'
    if (after) {
      after->grad_sums_of_squares(&after_sums[0], &after_sums[1]);
      if (after->distributed_optimizer()) allreduce_doubles(*groups.dp2, after_sums, 2);
    }
    const double norm = global_norm(sums[0], sums[1], groups, after ? after_sums : nullptr);
    const kernels::AdamWStep adam = adamw_step(t, step, norm);
    for (CudaGpt* chunk : all_chunks) chunk->update(adam, static_cast<float>(t.weight_decay));
    if (after) after->update(adam, static_cast<float>(t.weight_decay));
    const auto t1 = std::chrono::steady_clock::now();
    check_finite(loss, step);
    double flops_per_micro = after ? after->flops_per_micro_step() : 0.0;
    for (CudaGpt* chunk : all_chunks) flops_per_micro += chunk->flops_per_micro_step();
    const double flops = flops_per_micro * accum;
    StepReport r =
        step_report(plan, step, loss, adam.learning_rate, norm, t0, t_opt, t1, flops, peak);
    r.device = device.name();
    const EngineTotals now = offload_totals();
    r.cpu_optimizer_seconds = now.cpu_optimizer_seconds - before.cpu_optimizer_seconds;
    r.h2d_bytes = now.h2d_bytes - before.h2d_bytes;
    r.d2h_bytes = now.d2h_bytes - before.d2h_bytes;
    r.comm = comm_totals(groups);
    // The device collectives, beside the groups' own (the loss, the norm)
    if (collectives.dp) r.comm["dp"] += collectives.dp->stats();
    if (collectives.tp) r.comm["tp"] += collectives.tp->stats();
    // A cutpoint's where the planner predicts them (comm_totals)
    if (collectives.tp2) r.comm["tp"] += collectives.tp2->stats();
    for (const auto* reducer :
         {collectives.dp2.get(), collectives.cut.get(), collectives.world.get()})
      if (reducer) r.comm["dp"] += reducer->stats();
    report_step(r, options, result, log);
    const int64_t interval = plan.checkpoint.interval_steps;
    if (stop_after_step(plan, groups, step, result, log, [&] { save(step + 1, loss); })) break;
    if (step + 1 == t.steps || (interval > 0 && (step + 1) % interval == 0)) save(step + 1, loss);
  }
  feeder.synchronize();
  if (options.on_finish) {
    model.get_parameters(host_params.data());
    // The stages between never train their copy of unit 0.
    std::vector<TensorView> views = stage_views(ckpt_tensors.params, stage.first || stage.last);
    if (after) {  // and the layers after the cut (each view names its slice)
      after->get_parameters(after_params.data());
      const auto more = stage_views(after_tensors->params, false);
      views.insert(views.end(), more.begin(), more.end());
    }
    for (size_t c = 0; c < chunks.size(); ++c) {  // and the further chunks' layers
      chunks[c]->get_parameters(chunk_hosts[c].params.data());
      const auto more =
          stage_views(more_tensors[c + (after ? 1 : 0)].params, chunks[c]->stage().last);
      views.insert(views.end(), more.begin(), more.end());
    }
    options.on_finish(views);
  }
  return result;
}
#endif

}  // namespace

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  // The loop polls the flag between steps; no thread's blocking call (ours or a library's)
  // should fail with EINTR because the stop signal happened to land on it.
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  // No thread that may run a kernel takes the signal: oneDNN's JIT f32 GEMM kernels (AVX-512
  // and AVX2, before oneDNN 3.11.2; Debian has 2.6.3) point rsp into a heap buffer, so a signal
  // handled on a thread inside one writes its frame over the heap (oneDNN issue #4845, fixed by
  // PR #4855) — the worker's rare abort after SIGTERM (docs/RELIABILITY.md "HTTP servers"). The
  // signals are blocked in the calling thread, so in every thread it starts afterwards (OpenMP's
  // pool, streams, the HTTP server), and one thread of their own waits for them. Threads started
  // before still run the handler.
  static std::once_flag once;
  std::call_once(once, [] {
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
    std::thread([stop_signals] {
      for (int signal = 0;;) {
        if (sigwait(&stop_signals, &signal) == 0) g_stop.store(true);
      }
    }).detach();
  });
}

void request_stop() {
  g_stop.store(true);
}

namespace {

// What one rank allocates (worker/gpt.cpp: parameters, gradients and the AdamW moments in fp32;
// activations and their gradients per layer, the attention matrices B·(NH/t)·T² among them),
// in floating point so that no product can overflow before it is compared; and the sizes that
// make it, for messages.
struct RankFootprint {
  double bytes = 0;
  std::string sizes;
};
RankFootprint rank_footprint(const api::Plan& plan);

// The larger of the two layouts' footprints with per-stage TP.
RankFootprint largest_rank_footprint(const api::Plan& plan) {
  RankFootprint footprint = rank_footprint(plan);
  if (plan.config.pp > 1 && plan.config.cut_layer > 0) {
    RankFootprint after = rank_footprint(api::after_cut_layout(plan));
    if (after.bytes > footprint.bytes) footprint = after;
  }
  return footprint;
}

RankFootprint rank_footprint(const api::Plan& plan) {
  const auto& m = plan.model;
  const auto& c = plan.config;
  const double L = static_cast<double>(m.layers), C = static_cast<double>(m.hidden);
  const double F = static_cast<double>(m.ffn_hidden), NH = static_cast<double>(m.heads);
  const double T = static_cast<double>(m.seq_len), V = static_cast<double>(m.padded_vocab());
  const double B = static_cast<double>(c.micro_batch), tp = static_cast<double>(c.tp);
  // A pipeline stage holds L/pp layers, and the first stage the activations of min(pp, m)
  // micro-batches (1F1B); every stage keeps the tensors that are not per layer.
  const double pp = static_cast<double>(std::max<int64_t>(1, c.pp));
  const double Ls = L / pp, in_flight = std::min(pp, static_cast<double>(c.grad_accum));
  const double params = Ls * (4 * C * C + 2 * C * F + 9 * C + F) + V * C + T * C + 2 * C;
  const double working_layers = c.recompute == api::Recompute::kNone ? Ls : 1;
  const double activations =
      in_flight * (working_layers * B * T * (9 * C + 4 * C / tp + 2 * F / tp + 2 * NH / tp * T) +
                   Ls * B * T * C + B * T * (V / tp + 2 * C));
  // fp32 parameters, gradients and both moments, + a bf16 weight copy on a bf16 CPU plan.
  const double param_bytes = plan.device == api::DeviceKind::kCpu &&
                                     plan.precision == api::Precision::kBf16
                                 ? 18
                                 : 16;
  return {param_bytes * params / tp + 8 * activations,
          "layers " + std::to_string(m.layers) + ", hidden " + std::to_string(m.hidden) +
              ", heads " + std::to_string(m.heads) + ", ffnHidden " + std::to_string(m.ffn_hidden) +
              ", seqLen " + std::to_string(m.seq_len) + " and batch.micro " +
              std::to_string(c.micro_batch)};
}

}  // namespace

void check_plan_values(const api::Plan& plan) {
  // The model's dims as the planner checked them (api::resolve_model: positive, within
  // ModelLimits, heads dividing hidden), reported at the plan's field paths.
  api::ModelSpec spec;
  const auto& m = plan.model;
  spec.layers = m.layers, spec.hidden = m.hidden, spec.heads = m.heads;
  spec.ffn_hidden = m.ffn_hidden, spec.vocab = m.vocab, spec.seq_len = m.seq_len;
  try {
    api::resolve_model(spec);
  } catch (const FieldError& e) {
    const std::string prefix = "spec.model";
    const std::string path =
        e.path().rfind(prefix, 0) == 0 ? "plan.model" + e.path().substr(prefix.size()) : e.path();
    throw FieldError(path, e.problem());
  }
  const auto& c = plan.config;
  auto at_least = [](const char* path, int64_t value, int64_t min) {
    if (value < min)
      throw FieldError(path, std::to_string(value) + " must be >= " + std::to_string(min));
  };
  // Counts the planner forms from bounded specs (2^16 nodes, 2^24 sequences per step): the
  // products of these stay far inside int64.
  auto in_range = [](const char* path, int64_t value, int64_t max) {
    if (value < 1 || value > max)
      throw FieldError(path, std::to_string(value) + " is not in [1, " + std::to_string(max) + "]");
  };
  in_range("plan.nodes", c.nodes, int64_t{1} << 16);
  in_range("plan.procsPerNode", c.procs_per_node, int64_t{1} << 16);
  in_range("plan.tp", c.tp, int64_t{1} << 16);
  in_range("plan.dp", c.dp, int64_t{1} << 20);
  in_range("plan.pp", c.pp, int64_t{1} << 16);
  in_range("plan.batch.micro", c.micro_batch, int64_t{1} << 24);
  in_range("plan.batch.gradAccum", c.grad_accum, int64_t{1} << 24);
  if (c.cut_layer != 0) {
    in_range("plan.cutpoint.layer", c.cut_layer, m.layers - 1);
    in_range("plan.cutpoint.tp", c.cut_tp, int64_t{1} << 16);
  }
  at_least("plan.training.steps", plan.training.steps, 1);
  at_least("plan.checkpoint.intervalSteps", plan.checkpoint.interval_steps, 0);
  at_least("plan.checkpoint.keep", plan.checkpoint.keep, 1);
  at_least("plan.offload.window", c.window, 0);
  // The planner gives each rank its share of the node's cores; no node has this many.
  constexpr int64_t kMaxCpuThreads = 4096;
  if (plan.cpu_threads < 1 || plan.cpu_threads > kMaxCpuThreads)
    throw FieldError("plan.offload.cpuThreads", std::to_string(plan.cpu_threads) +
                                                    " is not in [1, " +
                                                    std::to_string(kMaxCpuThreads) + "]");
  if (!(plan.gpu_update_fraction >= 0 && plan.gpu_update_fraction <= 1))
    throw FieldError("plan.offload.gpuUpdateFraction",
                     std::to_string(plan.gpu_update_fraction) + " is not in [0, 1]");
  const auto& t = plan.training;
  if (!(std::isfinite(t.learning_rate) && t.learning_rate > 0))
    throw FieldError("plan.training.learningRate",
                     std::to_string(t.learning_rate) + " must be a finite number > 0");
  if (!(std::isfinite(t.weight_decay) && t.weight_decay >= 0))
    throw FieldError("plan.training.weightDecay",
                     std::to_string(t.weight_decay) + " must be a finite number >= 0");
  if (!(std::isfinite(t.grad_clip) && t.grad_clip >= 0))
    throw FieldError("plan.training.gradClip",
                     std::to_string(t.grad_clip) + " must be a finite number >= 0");
  // The TP layers split heads, ffn units and vocabulary rows (Megatron-LM, Shoeybi et al. 2019).
  for (const auto& [name, n] : {std::pair<const char*, int64_t>{"heads", m.heads},
                                {"ffnHidden", m.ffn_hidden},
                                {"paddedVocab", m.padded_vocab()}})
    for (auto [path, t] : {std::pair{"plan.tp", c.tp}, {"plan.cutpoint.tp", c.cut_tp}})
      if (t > 0 && n % t != 0)
        throw FieldError(path, std::to_string(t) + " does not divide the model's " + name + " " +
                                   std::to_string(n));
  const RankFootprint footprint = largest_rank_footprint(plan);
  if (!(footprint.bytes < 0x1p62))
    throw FieldError("plan.model", footprint.sizes + " need " + api::format_bytes(footprint.bytes) +
                                       " per rank: beyond what any machine addresses");
}

void check_executable(const api::Plan& plan) {
  check_plan_values(plan);
  auto refuse = [](const std::string& why) { throw Error("cannot execute this plan: " + why); };
  if (const std::string why = api::not_yet_executable(plan); !why.empty()) refuse(why);
  const auto& c = plan.config;
  if (c.tp * c.dp * c.pp != plan.world)
    refuse("tp × dp × pp = " + std::to_string(c.tp * c.dp * c.pp) + " ≠ world " +
           std::to_string(plan.world));
  if (plan.model.layers % c.pp != 0)
    refuse(std::to_string(c.pp) + " pipeline stages do not divide the model's " +
           std::to_string(plan.model.layers) + " layers");
  if (plan.config.micro_batch * plan.config.grad_accum * plan.config.dp != plan.global_batch)
    refuse("batch: micro " + std::to_string(plan.config.micro_batch) + " × accumulation " +
           std::to_string(plan.config.grad_accum) + " ≠ global " +
           std::to_string(plan.global_batch));
  const int64_t L = plan.model.layers;
  if (c.cut_layer > 0) {  // Oases' cutpoint (worker/cutpoint.h), or per-stage TP with stages
    const int64_t lo = std::min(c.tp, c.cut_tp), hi = std::max(c.tp, c.cut_tp);
    const int64_t ranks = plan.world / c.pp;  // that run both TP degrees: a stage's
    if (c.cut_layer >= L || (c.pp > 1 && c.cut_layer % (L / c.pp)) || c.cut_tp < 1 ||
        c.cut_tp == c.tp || hi % lo || ranks % c.cut_tp || plan.model.heads % c.cut_tp ||
        (c.cut_tp < c.tp && c.micro_batch % (c.tp / c.cut_tp)))
      refuse("cutpoint at layer " + std::to_string(c.cut_layer) + " to TP " +
             std::to_string(c.cut_tp) + " after TP " + std::to_string(c.tp) +
             ": it needs a layer inside the model's " + std::to_string(L) +
             (c.pp > 1 ? " at a boundary of its " + std::to_string(c.pp) + " stages" : "") +
             ", a TP degree other than tp that nests with it and divides the " +
             std::to_string(ranks) + " ranks " + (c.pp > 1 ? "of a stage" : "of the world") +
             " and the heads (" + std::to_string(plan.model.heads) +
             "), and a micro-batch that splits");
    // (check_plan_values bounded the micro-batch and the degrees: no overflow here)
    const int64_t after_batch = c.micro_batch * c.cut_tp / c.tp;
    if (c.sub_batches == 2 && after_batch % 2 != 0)
      refuse("overlap needs an even micro-batch after the cutpoint too (" +
             std::to_string(after_batch) + ")");
  }
  if (c.virtual_stages > 1) {
    const std::string why = pipeline_order_refusal(
        static_cast<int>(c.pp), static_cast<int>(c.virtual_stages), c.grad_accum);
    if (!why.empty()) refuse(std::to_string(c.virtual_stages) + " virtual stages: " + why);
    if (L % (c.pp * c.virtual_stages) != 0 || c.cut_layer > 0)
      refuse(std::to_string(c.pp) + " stages × " + std::to_string(c.virtual_stages) +
             " virtual stages must divide the model's " + std::to_string(L) +
             " layers, without a cutpoint");
  }
  if (plan.config.offload != api::OffloadMode::kNone &&
      (plan.config.gpu_units < 0 || plan.config.gpu_units > L / c.pp + 1))
    refuse("offload gpuUnits " + std::to_string(plan.config.gpu_units) + " is not in [0, " +
           std::to_string(L / c.pp + 1) + "]" + (c.pp > 1 ? " (a stage's units)" : ""));
  if (plan.config.sub_batches != 1 &&
      (plan.config.sub_batches != 2 || plan.config.micro_batch % 2 != 0))
    refuse("overlap needs 2 sub-batches of an even micro-batch (micro " +
           std::to_string(plan.config.micro_batch) + ", sub-batches " +
           std::to_string(plan.config.sub_batches) + ")");
  if (plan.config.offload == api::OffloadMode::kWindow) {
    if (plan.config.recompute == api::Recompute::kNone)
      refuse("window offload streams each layer's activation checkpoint, so it needs recompute "
             "full or commAware (recompute none keeps every activation on the device)");
    if (plan.config.gpu_units < 1 || plan.config.gpu_units > L / c.pp || plan.config.window < 1)
      refuse("window offload needs the embeddings on the device, at least one streamed layer "
             "and one slot (gpuUnits " + std::to_string(plan.config.gpu_units) + ", window " +
             std::to_string(plan.config.window) + ")");
  }
  if (plan.device == api::DeviceKind::kCuda) {
#ifndef KUBETRAIN_WITH_CUDA
    refuse("device is cuda, and this worker was built without the CUDA path (nvcc was not found "
           "when it was built; docs/WORKER.md, \"The CUDA runtime\")");
#endif
    // What the CUDA runtime executes today (docs/WORKER.md): one GPU per rank, data and tensor
    // parallel with the Oases sub-batches, bf16, any recompute, every offload mode.
    if (plan.precision != api::Precision::kBf16)
      refuse("precision " + std::string(api::to_string(plan.precision)) +
             " on CUDA: the CUDA runtime trains in bf16 mixed precision");
    return;
  }
  // bf16 on the CPU: bf16 matmuls on AMX or AVX512-BF16 (oneDNN would emulate them elsewhere,
  // slower than fp32).
  if (plan.precision == api::Precision::kBf16 && !plan.precision_auto &&
      kernels::cpu::bf16_matmul_isa().empty())
    refuse("precision bf16 on this CPU (" + cpu_model_name() +
           "), which has neither AMX-BF16 nor AVX512-BF16 (/proc/cpuinfo flags amx_bf16, "
           "avx512_bf16, as far as ONEDNN_MAX_CPU_ISA allows); set spec.training.precision: fp32");
  // The CPU device's memory is this machine's (an allocation beyond it would be an OOM kill).
  const RankFootprint footprint = largest_rank_footprint(plan);
  const double physical = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) *
                          static_cast<double>(::sysconf(_SC_PAGE_SIZE));
  const double needed = footprint.bytes * static_cast<double>(plan.config.procs_per_node);
  if (physical > 0 && needed > physical)
    throw FieldError("plan.model", footprint.sizes + " need " + api::format_bytes(needed) +
                                       " for " + std::to_string(plan.config.procs_per_node) +
                                       " rank(s), more than this machine's " +
                                       api::format_bytes(physical) + " of memory");
}

// What a CPU rank computes in: the plan's precision, except that a bf16 plan the planner chose
// (spec.training.precision unset) falls back to fp32, with a warning, on a CPU without bf16
// matmuls (check_executable refuses the same plan when the job asked for bf16).
api::Precision cpu_precision(const api::Plan& plan,
                             const std::function<void(const std::string&)>& log) {
  if (plan.precision != api::Precision::kBf16) return plan.precision;
  const std::string isa = kernels::cpu::bf16_matmul_isa();
  if (!isa.empty()) {
    log("bf16 matmuls on " + isa + " (" + cpu_model_name() + "), fp32 master weights and AdamW");
    return api::Precision::kBf16;
  }
  log("warning: the plan chose bf16, and this CPU (" + cpu_model_name() +
      ") has neither AMX-BF16 nor AVX512-BF16: training in fp32");
  return api::Precision::kFp32;
}

double learning_rate_at(const api::TrainingSpec& t, int64_t step) {
  const double lr = t.learning_rate;
  const int64_t warmup = t.warmup_steps.value_or(0);
  if (step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const double min_lr = 0.1 * lr;
  const int64_t decay_steps = std::max<int64_t>(1, t.steps - warmup - 1);
  const double progress =
      std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(decay_steps));
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

TrainResult train(const api::Plan& plan, const TrainOptions& options,
                  const std::function<void(const std::string&)>& log) {
  check_executable(plan);
  g_stop.store(false);  // a stop request belongs to one run
#ifdef KUBETRAIN_WITH_CUDA
  if (plan.device == api::DeviceKind::kCuda) return train_cuda(plan, options, log);
#endif
  // The rank's share of the node's cores (the planner's cpuThreads), not every core per rank.
  omp_set_num_threads(static_cast<int>(std::max<int64_t>(1, plan.cpu_threads)));
  const auto& t = plan.training;
  const int64_t B = plan.config.micro_batch, T = plan.model.seq_len;
  const int64_t accum = plan.config.grad_accum;
  const int tp = static_cast<int>(plan.config.tp), dp = static_cast<int>(plan.config.dp);
  ProcessGroups single;
  ProcessGroups& groups = groups_of(plan, options, single);
  const int pp = static_cast<int>(plan.config.pp);
  const StageLayout layout = stage_layout(plan, groups);  // per-stage TP
  const bool stage_cut = layout.stage_cut;
  const int64_t first_after_cut = layout.first_after_cut, stage_B = layout.micro_batch;
  const bool after_cut = stage_cut && groups.pp->rank() >= first_after_cut;
  const int stage_tp = layout.tp, stage_dp = layout.dp, dp_rank = layout.data_rank;
  check_host_memory(plan, options.host_memory_bytes);
  auto device = Device::cpu();
  const api::Precision precision = cpu_precision(plan, log);
  // Oases' cutpoint (worker/cutpoint.h) without stages: layers [0, cut) here, the rest in
  // `after` (its own TP and DP groups), built as the two stages of a pipeline on this rank.
  const int64_t cut = stage_cut ? 0 : plan.config.cut_layer, L = plan.model.layers;
  PipelineStage stage = pipeline_stage(plan, groups.pp->rank());
  GptConfig config = GptConfig::from(plan.model);
  const int virtual_stages = static_cast<int>(plan.config.virtual_stages);
  config.layers /= pp * virtual_stages;
  if (cut > 0) {
    config.layers = cut;
    stage.last = false;
  }
  const int sub_batches = static_cast<int>(plan.config.sub_batches);
  auto make_chunk = [&](const PipelineStage& place) {
    return std::make_unique<Gpt>(
        config, stage_B, T, device,
        TensorParallel{groups.tp->rank(), stage_tp, stage_tp > 1 ? groups.tp.get() : nullptr},
        sub_batches, plan.config.recompute, precision, place);
  };
  const std::unique_ptr<Gpt> first_chunk = make_chunk(stage);
  Gpt& model = *first_chunk;
  OffloadOptions offload_options;
  offload_options.record_timeline = static_cast<bool>(options.on_timeline);
  offload_options.poison_evicted = offload_options.poison_evicted || options.poison_evicted;
  // Pipeline stages: the first and the last sum the tied embedding's gradients; the first
  // counts the tensors that are not per layer in the gradient norm; the stages between leave
  // their copy alone. With virtual stages, per chunk.
  auto make_engine = [&](Gpt& chunk, int chunk_index) {
    OffloadOptions chunk_options = offload_options;
    if (virtual_stages > 1)  // the chunk's part of its stage's units
      chunk_options.device_units = api::chunk_device_units(plan.config, L, chunk_index);
    if (cut > 0)  // the first segment's part of the model's units
      chunk_options.device_units = api::part_device_units(plan.config.gpu_units, 0, cut);
    auto made = std::make_unique<OffloadEngine>(plan, chunk, groups.dp.get(), chunk_options);
    const PipelineStage& place = chunk.stage();
    // Per-stage TP: the first and the last stage hold the unit in different TP layouts, summed
    // as logical tensors over the embedding group of both stages' ranks after the backward.
    const bool unit0 = place.first || place.last;
    made->set_pipeline(unit0 && !stage_cut ? groups.embedding.get() : nullptr, place.first, unit0);
    if (stage_cut && unit0) made->reduce_unit0_elsewhere();
    return made;
  };
  const std::unique_ptr<OffloadEngine> first_engine = make_engine(model, 0);
  OffloadEngine& engine = *first_engine;
  // Virtual stages (worker/pipeline_order.h): chunks 1..v−1 of this stage, each a model of its
  // layers with its own engine over the same TP and DP groups.
  std::vector<std::unique_ptr<Gpt>> chunks;
  std::vector<std::unique_ptr<OffloadEngine>> chunk_engines;
  for (int c = 1; c < virtual_stages; ++c) {
    chunks.push_back(make_chunk(pipeline_stage(plan, groups.pp->rank(), c)));
    chunk_engines.push_back(make_engine(*chunks.back(), c));
  }
  std::optional<CutpointReshard> reshard;
  std::unique_ptr<Gpt> after;
  std::unique_ptr<OffloadEngine> after_engine;
  if (cut > 0) {
    const int cut_tp = static_cast<int>(plan.config.cut_tp);
    reshard.emplace(*groups.cut, tp, cut_tp, B, T, plan.model.hidden);
    GptConfig after_config = GptConfig::from(plan.model);
    after_config.layers = L - cut;
    after = std::make_unique<Gpt>(
        after_config, reshard->batch_after(), T, device,
        TensorParallel{groups.tp2->rank(), cut_tp, cut_tp > 1 ? groups.tp2.get() : nullptr},
        sub_batches, plan.config.recompute, precision,
        PipelineStage{cut, L, /*first=*/false, /*last=*/true, /*in_flight=*/1});
    OffloadOptions after_offload = offload_options;  // the rest of the model's units
    after_offload.device_units = api::part_device_units(plan.config.gpu_units, cut, L - cut);
    after_engine = std::make_unique<OffloadEngine>(plan, *after, groups.dp2.get(), after_offload);
    // Unit 0 is summed over the world in both layouts at once (sum_unit0), counted
    // in the norm by the first segment.
    engine.reduce_unit0_elsewhere();
    after_engine->reduce_unit0_elsewhere();
    after_engine->set_pipeline(nullptr, false, true);
  }
  // Per-stage TP: the re-shard of the first stage after the cut (its input activations), and of
  // the last stage (each micro-batch's tokens) — one where they are the same stage.
  std::optional<CutpointReshard> stage_reshard, last_stage_reshard;
  if (after_cut && (groups.pp->rank() == first_after_cut || stage.last)) {
    stage_reshard.emplace(*groups.cut, tp, stage_tp, B, T, plan.model.hidden);
    KT_CHECK(stage_reshard->batch_after() == stage_B, "the re-shard gives the stage's batch");
  }
  CutpointReshard* cut_activations =
      stage_reshard && groups.pp->rank() == first_after_cut ? &*stage_reshard : nullptr;
  CutpointReshard* cut_tokens = stage_reshard && stage.last ? &*stage_reshard : nullptr;
  const auto params = model.parameter_views();
  const CheckpointTensors ckpt_tensors{params, engine.adam_m_views(), engine.adam_v_views()};
  // The second segment's tensors: its layers, and to load, also its copy of unit 0 (in its TP
  // layout); the first segment writes unit 0.
  auto after_views = [&](bool with_unit0) {
    return stage_views(CheckpointTensors{after->parameter_views(), after_engine->adam_m_views(),
                                         after_engine->adam_v_views()},
                       with_unit0);
  };
  const std::optional<CheckpointTensors> after_tensors =
      after ? std::optional(after_views(true)) : std::nullopt;
  // The further chunks' tensors, each's layers (and to load, its copy of unit 0).
  auto chunk_views = [&](size_t c, bool with_unit0) {
    return stage_views(
        CheckpointTensors{chunks[c]->parameter_views(), chunk_engines[c]->adam_m_views(),
                          chunk_engines[c]->adam_v_views()},
        with_unit0);
  };
  std::vector<CheckpointTensors> more_tensors;
  if (after_tensors) more_tensors.push_back(*after_tensors);
  for (size_t c = 0; c < chunks.size(); ++c) more_tensors.push_back(chunk_views(c, true));
  std::unique_ptr<DataSource> data = make_data(plan, dp_rank, dp);
  const auto checkpoint_lock = lock_checkpoint_dir(options, groups, log);
  const Restored restored = restore_or_init(
      plan, options, ckpt_tensors, *data, log, [] {},
      [&] {
        model.init_weights(static_cast<uint64_t>(t.seed));
        if (after) after->init_weights(static_cast<uint64_t>(t.seed));
        for (auto& chunk : chunks) chunk->init_weights(static_cast<uint64_t>(t.seed));
      },
      more_tensors);
  const int64_t start_step = restored.step;
  engine.start();
  if (after_engine) after_engine->start();
  for (auto& e : chunk_engines) e->start();
  if (options.on_memory) {
    for (const auto& space : {device, Device::host()}) {
      std::map<std::string, double> bytes;
      for (const auto& [kind, n] : space->bytes_in_use()) bytes[to_string(kind)] = n;
      options.on_memory(space->name(), bytes);
    }
  }

  BatchFeeder feeder(*data, B, T);
  std::vector<int32_t> inputs, targets;

  // MFU against the plan's peak (a measured profile's when the planner had one), else the
  // built-in CPU profile's.
  const double peak = plan.peak_flops > 0 && precision == plan.precision
                          ? plan.peak_flops
                          : (precision == api::Precision::kBf16
                                 ? api::cpu_profile().peak_bf16_flops
                                 : api::cpu_profile().peak_fp32_flops) *
                                static_cast<double>(std::max<int64_t>(1, plan.cpu_threads));
  TrainResult result;
  result.steps_done = start_step;
  result.last_loss = restored.loss;
  // Every parameter in place (and, sharded, the full moments) for `fn`: both segments' with a
  // cutpoint (each finishes its own all-gathers).
  std::vector<OffloadEngine*> all_engines{&engine};
  if (after_engine) all_engines.push_back(after_engine.get());
  for (auto& e : chunk_engines) all_engines.push_back(e.get());
  auto with_all_parameters = [&](const std::function<void()>& fn) {
    std::function<void(size_t)> nest = [&](size_t i) {
      if (i == all_engines.size()) return fn();
      all_engines[i]->with_all_parameters([&] { nest(i + 1); });
    };
    nest(0);
  };
  auto save = [&](int64_t steps_done, double loss) {
    if (options.checkpoint_dir.empty()) return;
    save_or_report(steps_done, options, result, log, [&] {
      const CheckpointMeta meta = checkpoint_meta(plan, steps_done, feeder.cursor(), loss);
      std::string dir;
      with_all_parameters([&] {
        // The moments' views now: the distributed optimizer gathers them for the call. A stage
        // after the first writes its layers only; so does a cutpoint's second segment, as
        // shards of its own.
        ShardedSave sharding = sharded_save(plan, groups);
        if (after && groups.dp2->rank() == 0)
          sharding.more.emplace_back(static_cast<int>(plan.config.tp) + groups.tp2->rank(),
                                     after_views(false));
        // Virtual stages: chunk c writes the shards of virtual stage c·pp + s.
        for (size_t c = 0; c < chunks.size() && sharding.writes; ++c)
          sharding.more.emplace_back(
              static_cast<int>(virtual_stage(pp, groups.pp->rank(), static_cast<int>(c) + 1) *
                               plan.config.tp) +
                  groups.tp->rank(),
              chunk_views(c, false));
        const CheckpointTensors tensors = stage_views(
            CheckpointTensors{params, engine.adam_m_views(), engine.adam_v_views()}, stage.first);
        dir = save_checkpoint(options.checkpoint_dir, meta, tensors,
                              static_cast<int>(plan.checkpoint.keep), sharding);
      });
      return dir;
    });
  };

  model.unit_observer = &engine;
  if (after) after->unit_observer = after_engine.get();
  std::vector<Gpt*> all_chunks{&model};
  std::vector<OffloadEngine*> chunk_engine_list{&engine};
  for (size_t c = 0; c < chunks.size(); ++c) {
    chunks[c]->unit_observer = chunk_engines[c].get();
    all_chunks.push_back(chunks[c].get());
    chunk_engine_list.push_back(chunk_engines[c].get());
  }
  std::vector<float> unit0_sums;  // sum_unit0's buffer
  std::optional<PipelineSchedule> pipeline;
  if (pp > 1)
    pipeline.emplace(all_chunks, chunk_engine_list, *groups.pp, stage_B, T, cut_activations,
                     cut_tokens);
  for (int64_t step = start_step; step < t.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const EngineTotals before = engine_totals(all_engines);
    if (options.on_timeline) engine.clear_timeline();
    for (Gpt* chunk : all_chunks) chunk->zero_grad();
    if (after) after->zero_grad();
    double loss = 0;
    if (pipeline) {  // the last stage has the loss: its mean over its DP group, for every stage
      double stage_loss = pipeline->step(feeder, accum, 1.0f / (accum * stage_dp));
      if (groups.pp->rank() == pp - 1) stage_loss = dp_mean_loss(stage_loss, *groups.dp);
      float last_loss = static_cast<float>(stage_loss);
      groups.pp->broadcast(&last_loss, 1, pp - 1);
      loss = last_loss;
    }
    for (int64_t micro = 0; micro < accum && !pipeline; ++micro) {
      feeder.take(inputs, targets);
      // The step's loss is the mean over the global batch: 1/accum here, 1/dp by the DP sum.
      // The offload engine takes each unit's gradients once final (UnitObserver::grads_final):
      // in the last micro-batch it starts their DP all-reduce (bucket by bucket, hidden behind
      // the backward of the layers below) and copies the CPU-updated units' home; the streamed
      // layers' every micro-batch.
      engine.begin_micro_batch(micro, accum);
      if (after) {  // the loss is the second segment's, over its DP group
        after_engine->begin_micro_batch(micro, accum);
        loss += reshard->micro_step(model, *after, inputs.data(), targets.data(),
                                    1.0f / static_cast<float>(accum * groups.dp2->size())) /
                accum;
        continue;
      }
      loss += model.train_micro_step(inputs.data(), targets.data(), 1.0f / (accum * dp)) / accum;
    }
    if (after) after_engine->finish_backward();
    for (auto it = chunk_engine_list.rbegin(); it != chunk_engine_list.rend(); ++it)
      (*it)->finish_backward();
    if (after) {
      sum_unit0({&model, after.get()}, *groups.world, unit0_sums);
      engine.unit0_summed();
      after_engine->unit0_summed();
    }
    if (stage_cut && (stage.first || stage.last)) {  // both stages' layouts, over both stages
      sum_unit0({&model}, *groups.embedding, unit0_sums);
      engine.unit0_summed();
    }
    if (!pipeline) loss = dp_mean_loss(loss, after ? *groups.dp2 : *groups.dp);
    const auto t_opt = std::chrono::steady_clock::now();
    double sums[2], after_sums[2];
    engine.sum_of_squares(sums);
    for (size_t c = 0; c < chunks.size(); ++c) {  // the further chunks: the same TP and DP groups
      double more[2];
      chunk_engines[c]->sum_of_squares(more);
      sums[0] += more[0];
      sums[1] += more[1];
    }
    if (after) after_engine->sum_of_squares(after_sums);
    const double norm = global_norm(sums[0], sums[1], groups, after ? after_sums : nullptr);
    const kernels::AdamWStep adam = adamw_step(t, step, norm);
    for (OffloadEngine* e : all_engines) e->update(adam, static_cast<float>(t.weight_decay));
    const auto t1 = std::chrono::steady_clock::now();
    check_finite(loss, step);

    double flops_per_micro = after ? after->flops_per_micro_step() : 0.0;
    for (Gpt* chunk : all_chunks) flops_per_micro += chunk->flops_per_micro_step();
    const double flops = flops_per_micro * accum;
    StepReport r =
        step_report(plan, step, loss, adam.learning_rate, norm, t0, t_opt, t1, flops, peak);
    // Every engine's (the further chunks', the second segment's) since the step began.
    const EngineTotals now = engine_totals(all_engines);
    r.cpu_optimizer_seconds = now.cpu_optimizer_seconds - before.cpu_optimizer_seconds;
    r.h2d_bytes = now.h2d_bytes - before.h2d_bytes;
    r.d2h_bytes = now.d2h_bytes - before.d2h_bytes;
    r.transfer_seconds = now.transfer_seconds - before.transfer_seconds;
    r.exposed_transfer_seconds = now.exposed_transfer_seconds - before.exposed_transfer_seconds;
    r.comm = comm_totals(groups);
    report_step(r, options, result, log);

    const int64_t interval = plan.checkpoint.interval_steps;
    const bool last = step + 1 == t.steps;
    if (stop_after_step(plan, groups, step, result, log, [&] { save(step + 1, loss); })) break;
    // Without waiting: the CPU units' AdamW and copies of this step finish during the next
    // forward, and show in the next step's timeline.
    if (options.on_timeline) options.on_timeline(step + 1, engine.timeline());
    if (last || (interval > 0 && (step + 1) % interval == 0)) save(step + 1, loss);
  }
  feeder.synchronize();
  for (Gpt* chunk : all_chunks) chunk->unit_observer = nullptr;
  if (after) after->unit_observer = nullptr;
  if (options.on_finish) {
    with_all_parameters([&] {
      std::vector<TensorView> views = stage_views(params, stage.first || stage.last);
      // and the layers after the cut, or of the further chunks (each view names its slice)
      if (after) {
        const auto more = stage_views(after->parameter_views(), false);
        views.insert(views.end(), more.begin(), more.end());
      }
      for (auto& chunk : chunks) {
        const auto more = stage_views(chunk->parameter_views(), chunk->stage().last);
        views.insert(views.end(), more.begin(), more.end());
      }
      options.on_finish(views);
    });
  }
  return result;
}

}  // namespace kt::worker

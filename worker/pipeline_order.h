// The order of one optimizer step's work on a pipeline stage, shared by the CPU and the CUDA
// workers (docs/WORKER.md, "Pipeline stages"): which forward or backward runs next, and which
// activations and gradients each stage sends and receives around it.
//
// Without virtual stages (v = 1), Megatron-LM's 1F1B (forward_backward_pipelining_without_
// interleaving; Narayanan et al. SC21 §2.2): stage s of p runs min(p − s − 1, m) warm-up
// forwards, then alternates one forward and one backward, then the remaining backwards.
//
// With v > 1 virtual stages (the interleaved schedule, SC21 §2.2.2; Megatron's
// forward_backward_pipelining_with_interleaving): the model's L layers fall into p·v chunks of
// L/(p·v) consecutive layers, and rank s holds chunks s, p + s, 2p + s, …: its model chunk c is
// virtual stage c·p + s. Forwards run in groups of p micro-batches per chunk (chunk 0 of
// micro-batches 0..p−1, chunk 1 of the same, …, then the next p micro-batches), backwards the
// same with the chunks reversed; stage s warms up with min(m·v, 2(p − s − 1) + (v − 1)·p)
// forwards, then alternates. The bubble shrinks from (p − 1)/m to (p − 1)/(v·m) of the step;
// every micro-batch crosses v times as many stage boundaries. m must be a multiple of p.
//
// Transfers: a forward's output goes to the next virtual stage (rank s + 1, or from the last rank
// to rank 0's next chunk), a backward's input gradient to the previous one. Each transfer is
// exchanged in the group right after the op that makes it, and each receive in the group right
// before the op that needs it: group j holds op j − 1's sends and op j's receives (Megatron's
// send_forward_recv_backward and its siblings), and one more group after the last op. In the
// interleaved steady state a forward and the backward after it are one step, as in Megatron
// (send_forward_backward_recv_forward_backward): the group between them is empty. Under
// NCCL's blocking sends every rank's groups complete in order without a cycle, and on each
// directed pair of ranks the sends and the receives come in the same order
// (tests/unit/pipeline_order_test.cpp simulates both for every small p, v, m).
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace kt::worker {

struct PipelineOp {
  bool forward = true;
  int chunk = 0;      // the rank's model chunk (0 without virtual stages)
  int64_t micro = 0;  // the micro-batch
};

struct PipelineTransfer {
  bool send = true;         // else a receive
  bool activations = true;  // else gradients
  int peer = 0;             // PP group rank
  int chunk = 0;            // this rank's chunk that made it (send) or needs it (receive)
  int64_t micro = 0;
};

struct PipelineOrder {
  std::vector<PipelineOp> ops;
  // groups[j]: the transfers exchanged before ops[j] (j = ops.size(): after the last op).
  std::vector<std::vector<PipelineTransfer>> groups;
  // Per chunk, the most micro-batches whose activations it keeps at once (from a forward to its
  // backward): the slots its model needs.
  std::vector<int> in_flight;
};

// Stage s of p's place in the model: virtual stage c·p + s of p·v.
inline int64_t virtual_stage(int p, int s, int chunk) {
  return static_cast<int64_t>(chunk) * p + s;
}

// Why p stages, v virtual stages each and m micro-batches cannot run (empty: they can).
inline std::string pipeline_order_refusal(int p, int v, int64_t m) {
  if (p < 1 || v < 1 || m < 1) return "stages, virtual stages and micro-batches must be positive";
  if (v > 1 && p < 2) return "virtual stages need at least 2 pipeline stages";
  if (v > 1 && m % p != 0)
    return "the interleaved schedule runs micro-batches in groups of the " + std::to_string(p) +
           " stages: " + std::to_string(m) + " micro-batches is not a multiple";
  return "";
}

inline PipelineOrder pipeline_order(int p, int s, int v, int64_t m) {
  if (const std::string why = pipeline_order_refusal(p, v, m); !why.empty())
    throw std::invalid_argument(why);
  PipelineOrder order;
  const int64_t total = m * v;
  // The k-th forward (or backward) of the rank: chunk and micro-batch.
  auto op_of = [&](int64_t k, bool forward) {
    PipelineOp op;
    op.forward = forward;
    if (v == 1) {
      op.micro = k;
      return op;
    }
    const int64_t group = k / (static_cast<int64_t>(p) * v),
                  in_group = k % (static_cast<int64_t>(p) * v);
    op.chunk = static_cast<int>(in_group / p);
    if (!forward) op.chunk = v - 1 - op.chunk;
    op.micro = group * p + in_group % p;
    return op;
  };
  const int64_t warmup = std::min<int64_t>(
      total,
      v == 1 ? p - s - 1 : 2 * static_cast<int64_t>(p - s - 1) + static_cast<int64_t>(v - 1) * p);
  for (int64_t k = 0; k < warmup; ++k) order.ops.push_back(op_of(k, true));
  for (int64_t k = 0; k < total - warmup; ++k) {
    order.ops.push_back(op_of(warmup + k, true));
    order.ops.push_back(op_of(k, false));
  }
  for (int64_t k = total - warmup; k < total; ++k) order.ops.push_back(op_of(k, false));

  const int64_t last = static_cast<int64_t>(p) * v - 1;
  order.groups.assign(order.ops.size() + 1, {});
  order.in_flight.assign(static_cast<size_t>(v), 0);
  std::vector<int> held(static_cast<size_t>(v), 0);
  for (size_t j = 0; j < order.ops.size(); ++j) {
    const PipelineOp& op = order.ops[j];
    const int64_t vs = virtual_stage(p, s, op.chunk);
    // Where its input comes from and its output goes: the virtual stage before and after.
    const bool has_before = vs > 0, has_after = vs < last;
    const int before_rank = (s + p - 1) % p, after_rank = (s + 1) % p;
    // Interleaved, a steady-state forward and the backward after it exchange as one step:
    // the forward's sends wait for the group after the backward, the backward's receive joins
    // the group before the forward (the per-op groups of 1F1B would wait in a cycle there).
    const auto at = static_cast<int64_t>(j);
    const bool paired = v > 1 && at >= warmup && at < warmup + 2 * (total - warmup);
    const size_t send_group = j + (paired && op.forward ? 2 : 1);
    const size_t receive_group = j - (paired && !op.forward ? 1 : 0);
    if (op.forward) {
      if (has_before)
        order.groups[receive_group].push_back({false, true, before_rank, op.chunk, op.micro});
      if (has_after)
        order.groups[send_group].push_back({true, true, after_rank, op.chunk, op.micro});
      const auto c = static_cast<size_t>(op.chunk);
      order.in_flight[c] = std::max(order.in_flight[c], ++held[c]);
    } else {
      if (has_after)
        order.groups[receive_group].push_back({false, false, after_rank, op.chunk, op.micro});
      if (has_before)
        order.groups[send_group].push_back({true, false, before_rank, op.chunk, op.micro});
      --held[static_cast<size_t>(op.chunk)];
    }
  }
  return order;
}

// The chunk and rank a transfer's other end belongs to: where rank s's chunk c sends its output
// (activations: the next virtual stage) or its input gradient (the previous one), or where a
// receive comes from. Returns the peer's chunk.
inline int peer_chunk(int p, int s, const PipelineTransfer& t) {
  // Activations flow to the next virtual stage: sent forward, received from the one before;
  // gradients the other way.
  const bool towards_next = t.activations == t.send;
  if (towards_next) return s == p - 1 ? t.chunk + 1 : t.chunk;
  return s == 0 ? t.chunk - 1 : t.chunk;
}

}  // namespace kt::worker

// worker/pipeline_order.h: every stage's order of forwards, backwards and transfers, simulated
// over all stages at once — every op once, each transfer met by the right one at its peer, no
// cycle of waits under NCCL's blocking grouped sends, the activations kept as the papers count.
#include "worker/pipeline_order.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

namespace kt::worker {
namespace {

struct Shape {
  int p, v;
  int64_t m;
};

std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (int p = 1; p <= 6; ++p) {
    for (int64_t m = 1; m <= 9; ++m) out.push_back({p, 1, m});
    if (p >= 2)
      for (int v = 2; v <= 4; ++v)
        for (int64_t groups = 1; groups <= 3; ++groups) out.push_back({p, v, groups * p});
  }
  return out;
}

std::string name(const Shape& sh) {
  return "p " + std::to_string(sh.p) + " v " + std::to_string(sh.v) + " m " + std::to_string(sh.m);
}

TEST(PipelineOrder, EveryChunkRunsEveryMicroBatchForwardThenBackward) {
  for (const Shape& sh : shapes())
    for (int s = 0; s < sh.p; ++s) {
      SCOPED_TRACE(name(sh) + " stage " + std::to_string(s));
      const PipelineOrder order = pipeline_order(sh.p, s, sh.v, sh.m);
      ASSERT_EQ(order.ops.size(), static_cast<size_t>(2 * sh.m * sh.v));
      ASSERT_EQ(order.groups.size(), order.ops.size() + 1);
      std::set<std::pair<int, int64_t>> forwarded, backwarded;
      std::vector<int64_t> next_forward(static_cast<size_t>(sh.v), 0),
          next_backward(static_cast<size_t>(sh.v), 0);
      for (const PipelineOp& op : order.ops) {
        ASSERT_GE(op.chunk, 0);
        ASSERT_LT(op.chunk, sh.v);
        // Each chunk's forwards, and its backwards, in micro-batch order (so a chunk's
        // micro-batches in flight are consecutive: slot = micro % in_flight is free).
        auto& next = op.forward ? next_forward : next_backward;
        EXPECT_EQ(op.micro, next[static_cast<size_t>(op.chunk)]++);
        if (!op.forward) {
          EXPECT_TRUE(forwarded.count({op.chunk, op.micro}));
        }
        (op.forward ? forwarded : backwarded).insert({op.chunk, op.micro});
      }
      EXPECT_EQ(forwarded.size(), static_cast<size_t>(sh.m * sh.v));
      EXPECT_EQ(backwarded.size(), static_cast<size_t>(sh.m * sh.v));
    }
}

TEST(PipelineOrder, TheLastVirtualStageRunsEachBackwardRightAfterItsForward) {
  // The models keep the last stage's logits for one micro-batch (Gpt::forward_micro).
  for (const Shape& sh : shapes()) {
    SCOPED_TRACE(name(sh));
    const PipelineOrder order = pipeline_order(sh.p, sh.p - 1, sh.v, sh.m);
    for (size_t j = 0; j < order.ops.size(); ++j) {
      const PipelineOp& op = order.ops[j];
      if (op.forward && op.chunk == sh.v - 1) {
        ASSERT_LT(j + 1, order.ops.size());
        EXPECT_FALSE(order.ops[j + 1].forward);
        EXPECT_EQ(order.ops[j + 1].chunk, op.chunk);
        EXPECT_EQ(order.ops[j + 1].micro, op.micro);
      }
    }
    EXPECT_EQ(order.in_flight.back(), 1);
  }
}

TEST(PipelineOrder, TheFirstStageKeepsTheActivationsThePapersCount) {
  // 1F1B: p micro-batches on the first stage (SC21 §2.2); interleaved: p + (p − 1)/v stages'
  // worth, i.e. p·v + p − 1 chunks' (Korthikanti et al. 2022 §4.2.3), at most every chunk's.
  for (const Shape& sh : shapes()) {
    SCOPED_TRACE(name(sh));
    const PipelineOrder order = pipeline_order(sh.p, 0, sh.v, sh.m);
    int held = 0, most = 0;
    for (const PipelineOp& op : order.ops) most = std::max(most, held += op.forward ? 1 : -1);
    const int64_t expected =
        sh.v == 1 ? std::min<int64_t>(sh.p, sh.m)
                  : std::min<int64_t>(sh.m * sh.v, static_cast<int64_t>(sh.p) * sh.v + sh.p - 1);
    EXPECT_EQ(most, expected);
    int slots = 0;
    for (int n : order.in_flight) slots += n;
    EXPECT_GE(slots, most);
  }
}

// Every stage's groups in turn, as NCCL runs them: a group's operations are issued together; a
// send completes once the peer has issued the matching receive (the next one from this rank, in
// issue order — NCCL matches per pair of ranks, whatever the tensor), a receive once the peer
// has issued the matching send; a stage leaves a group when all of its operations completed.
TEST(PipelineOrder, TransfersMeetTheirPeersInOrderAndNeverWaitInACycle) {
  for (const Shape& sh : shapes()) {
    SCOPED_TRACE(name(sh));
    std::vector<PipelineOrder> orders;
    for (int s = 0; s < sh.p; ++s) orders.push_back(pipeline_order(sh.p, s, sh.v, sh.m));
    // Per directed pair, the sends (at the sender) and the receives (at the receiver) in issue
    // order, each as (group index, transfer).
    using Issued = std::vector<std::pair<size_t, PipelineTransfer>>;
    std::map<std::pair<int, int>, Issued> sends, receives;
    for (int s = 0; s < sh.p; ++s)
      for (size_t g = 0; g < orders[s].groups.size(); ++g)
        for (const PipelineTransfer& t : orders[s].groups[g])
          (t.send ? sends[{s, t.peer}] : receives[{t.peer, s}]).push_back({g, t});
    // Each group's matching groups at the peers.
    std::map<std::pair<int, size_t>, std::vector<std::pair<int, size_t>>> waits_on;
    for (const auto& [pair, sent] : sends) {
      const auto& received = receives[pair];
      ASSERT_EQ(sent.size(), received.size()) << pair.first << " → " << pair.second;
      for (size_t k = 0; k < sent.size(); ++k) {
        const auto& [g_send, ts] = sent[k];
        const auto& [g_recv, tr] = received[k];
        // The k-th message from a to b is what b's k-th receive from a expects.
        EXPECT_EQ(ts.activations, tr.activations)
            << pair.first << " → " << pair.second << " #" << k;
        EXPECT_EQ(ts.micro, tr.micro);
        EXPECT_EQ(peer_chunk(sh.p, pair.first, ts), tr.chunk);
        EXPECT_EQ(peer_chunk(sh.p, pair.second, tr), ts.chunk);
        waits_on[{pair.first, g_send}].push_back({pair.second, g_recv});
        waits_on[{pair.second, g_recv}].push_back({pair.first, g_send});
      }
    }
    for (const auto& [pair, received] : receives)
      ASSERT_EQ(sends[pair].size(), received.size()) << pair.first << " → " << pair.second;
    // Run: a stage leaves its group once every peer it waits on has reached (or passed) the
    // matching group.
    std::vector<size_t> at(static_cast<size_t>(sh.p), 0);
    bool progress = true;
    while (progress) {
      progress = false;
      for (int s = 0; s < sh.p; ++s) {
        while (at[s] < orders[s].groups.size()) {
          bool ready = true;
          for (const auto& [peer, g] : waits_on[{s, at[s]}]) ready = ready && at[peer] >= g;
          if (!ready) break;
          ++at[s];
          progress = true;
        }
      }
    }
    for (int s = 0; s < sh.p; ++s)
      EXPECT_EQ(at[s], orders[s].groups.size())
          << "stage " << s << " waits forever at group " << at[s];
  }
}

// The CPU workers post each group's receives a group early (before the op ahead of the one that
// needs them: worker/trainer.cpp's PipelineSchedule), into the slot micro % in_flight of their
// chunk: that slot must not still hold a receive whose op has not run.
TEST(PipelineOrder, ReceivesPostedAGroupEarlyFindTheirSlotFree) {
  for (const Shape& sh : shapes())
    for (int s = 0; s < sh.p; ++s) {
      SCOPED_TRACE(name(sh) + " stage " + std::to_string(s));
      const PipelineOrder order = pipeline_order(sh.p, s, sh.v, sh.m);
      // (chunk, slot, activations) → the micro-batch whose receive holds it
      std::map<std::tuple<int, int, bool>, int64_t> held;
      auto post_receives = [&](size_t g) {
        for (const PipelineTransfer& t : order.groups[g]) {
          if (t.send) continue;
          const int slot =
              static_cast<int>(t.micro % order.in_flight[static_cast<size_t>(t.chunk)]);
          const auto key = std::make_tuple(t.chunk, slot, t.activations);
          ASSERT_FALSE(held.count(key))
              << "group " << g << ": chunk " << t.chunk << " slot " << slot << " still holds micro "
              << held[key] << "'s " << (t.activations ? "activations" : "gradients");
          held[key] = t.micro;
        }
      };
      post_receives(0);
      for (size_t j = 0; j < order.ops.size(); ++j) {
        post_receives(j + 1);
        const PipelineOp& op = order.ops[j];
        const int slot =
            static_cast<int>(op.micro % order.in_flight[static_cast<size_t>(op.chunk)]);
        held.erase(std::make_tuple(op.chunk, slot, op.forward));  // the op takes its input
      }
      EXPECT_TRUE(held.empty());
    }
}

TEST(PipelineOrder, RefusesWhatTheScheduleCannotRun) {
  EXPECT_NE(pipeline_order_refusal(1, 2, 4), "");
  EXPECT_NE(pipeline_order_refusal(4, 2, 6), "");
  EXPECT_EQ(pipeline_order_refusal(4, 2, 8), "");
  EXPECT_EQ(pipeline_order_refusal(4, 1, 3), "");
  EXPECT_THROW(pipeline_order(4, 0, 2, 6), std::invalid_argument);
}

}  // namespace
}  // namespace kt::worker

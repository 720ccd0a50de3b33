// Resharding resume at the loader (worker/checkpoint.h): a checkpoint written by the TP ranks of
// one layout loads into the ranks of another, each rank's slices assembled from the stored ones
// they intersect — GPT-2's real slicing (worker/gpt_layout.h: wte's rows, qkv's heads inside
// [L, 3, C, C], fc's rows, the projections' columns; llm.c's merged [L, 3C, C] at TP 1). Every
// element must land where its logical index says, for parameters and both AdamW moments.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "api/error.h"
#include "api/yaml_json.h"
#include "tests/support/barrier.h"
#include "tests/support/random.h"
#include "worker/checkpoint.h"
#include "worker/gpt_layout.h"

namespace kt::worker {
namespace {

// Heads, ffn units and the padded vocabulary divide by 4: TP 1, 2 and 4 all hold this model.
GptConfig config() {
  GptConfig c;
  c.max_seq_len = 8;
  c.vocab = 30;
  c.padded_vocab = 32;
  c.layers = 2;
  c.heads = 4;
  c.channels = 8;
  c.ffn = 16;
  return c;
}

// The value every layout must agree on: a function of the tensor, the group (params, m, v) and
// the element's index in the logical tensor, different for every element and run.
float value_at(uint32_t seed, int group, int tensor, int64_t logical_index) {
  std::seed_seq seq{seed, static_cast<uint32_t>(group), static_cast<uint32_t>(tensor),
                    static_cast<uint32_t>(logical_index)};
  uint32_t out[1];
  seq.generate(out, out + 1);
  return static_cast<float>(out[0] % 2000003) / 1000.0f - 1000.0f;
}

// One TP rank's checkpoint tensors over its own storage.
struct Rank {
  std::vector<float> storage[3];
  CheckpointTensors tensors;
  Rank(const GptConfig& c, int64_t t, int64_t r) {
    const auto sizes = gpt_param_sizes(c, t);
    int64_t n = 0;
    for (int64_t s : sizes) n += s;
    std::vector<TensorView>* groups[3] = {&tensors.params, &tensors.adam_m, &tensors.adam_v};
    for (int g = 0; g < 3; ++g) {
      storage[g].assign(static_cast<size_t>(n), -7.0f);  // nothing a load leaves behind
      *groups[g] = gpt_rank_views(c, t, r, storage[g].data());
    }
  }
  // view := value_at over the logical indices it holds (check: compare instead), per group.
  void fill(uint32_t seed) { visit(seed, true); }
  void expect_filled(uint32_t seed, const std::string& where) { visit(seed, false, where); }

 private:
  void visit(uint32_t seed, bool write, const std::string& where = "") {
    const std::vector<TensorView>* groups[3] = {&tensors.params, &tensors.adam_m, &tensors.adam_v};
    for (int g = 0; g < 3; ++g)
      for (int i = 0; i < kNumParamTensors; ++i) {
        const TensorView& v = (*groups[g])[static_cast<size_t>(i)];
        int64_t wrong = 0;
        gpt_for_each_slice_row(v, [&](int64_t logical, int64_t at, int64_t n) {
          for (int64_t k = 0; k < n; ++k) {
            const float want = value_at(seed, g, i, logical + k);
            if (write)
              v.data[at + k] = want;
            else if (v.data[at + k] != want)
              ++wrong;
          }
        });
        if (!write) {
          EXPECT_EQ(wrong, 0) << where << ": group " << g << " tensor " << v.name << " has "
                              << wrong << " of " << v.numel() << " elements wrong";
        }
      }
  }
};

class CheckpointReshardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = test::fresh_seed();
    root_ = ::testing::TempDir() + "kt-reshard-" + std::to_string(::getpid()) + "-" +
            std::to_string(seed_);
    std::filesystem::remove_all(root_);
  }
  void TearDown() override {
    if (HasFailure()) std::cerr << "seed " << seed_ << "\n";
    std::filesystem::remove_all(root_);
  }

  // The t ranks of a TP group save one checkpoint (as the trainer's DP group 0 does).
  void save(int64_t t) {
    std::vector<std::unique_ptr<Rank>> ranks;
    for (int64_t r = 0; r < t; ++r) {
      ranks.push_back(std::make_unique<Rank>(config(), t, r));
      ranks.back()->fill(seed_);
    }
    test::TimedBarrier barrier(static_cast<int>(t));
    CheckpointMeta meta;
    meta.step = 5;
    meta.data_cursor = {{"kind", "synthetic"}, {"sequence", 40}, {"world", 1}};
    meta.rng = nlohmann::json::object();
    meta.plan_hash = "tp" + std::to_string(t);
    meta.loss = 3.5;
    meta.extra = nlohmann::json::object();
    std::vector<std::thread> threads;
    for (int64_t r = 0; r < t; ++r)
      threads.emplace_back([&, r] {
        ShardedSave s;
        s.shard_index = static_cast<int>(r);
        s.shard_count = static_cast<int>(t);
        s.leader = r == 0;
        s.barrier = [&] { barrier.arrive_and_wait(); };
        save_checkpoint(root_, meta, ranks[static_cast<size_t>(r)]->tensors, 2, s);
      });
    for (auto& thread : threads) thread.join();
  }

  // Every rank of a TP group of t loads it; returns how many tensors rank 0 assembled.
  int64_t load_and_check(int64_t t) {
    int64_t resharded = -1;
    for (int64_t r = 0; r < t; ++r) {
      Rank rank(config(), t, r);
      const auto meta = load_latest_checkpoint(root_, rank.tensors);
      EXPECT_TRUE(meta.has_value());
      if (!meta) return -1;
      EXPECT_EQ(meta->step, 5);
      EXPECT_EQ(meta->data_cursor["sequence"], 40);
      rank.expect_filled(seed_, "TP " + std::to_string(t) + " rank " + std::to_string(r));
      if (r == 0) resharded = meta->resharded;
    }
    return resharded;
  }

  uint32_t seed_ = 0;
  std::string root_;
};

// Per group (params, m, v) the 7 tensors split over TP (wte, qkvw, qkvb, attprojw, fcw, fcb,
// fcprojw) are assembled; the 9 replicated ones load as they are.
constexpr int64_t kShardedTensors = 7;

TEST_F(CheckpointReshardTest, TwoRanksToOne) {
  save(2);
  EXPECT_EQ(load_and_check(1), 3 * kShardedTensors);
}

TEST_F(CheckpointReshardTest, OneRankToTwo) {
  save(1);
  EXPECT_EQ(load_and_check(2), 3 * kShardedTensors);
}

TEST_F(CheckpointReshardTest, FourRanksToTwoAndTwoToFour) {
  save(4);
  EXPECT_EQ(load_and_check(2), 3 * kShardedTensors);
  std::filesystem::remove_all(root_);
  save(2);
  EXPECT_EQ(load_and_check(4), 3 * kShardedTensors);
}

TEST_F(CheckpointReshardTest, TheSameLayoutReadsEachSliceAsItIs) {
  save(2);
  EXPECT_EQ(load_and_check(2), 0);
}

// One shard of a TP 2 checkpoint is not enough for a TP 1 rank: the error names the tensor.
TEST_F(CheckpointReshardTest, AMissingShard_IsAnErrorNamingWhatIsNotCovered) {
  save(2);
  Rank whole(config(), 1, 0);
  Rank half(config(), 2, 1);
  // A TP 1 model cannot take only rank 1's slices: drop rank 0's file from the listing.
  const std::string dir = root_ + "/step-00000005";
  auto doc = nlohmann::json::parse(api::read_file(dir + "/metadata.json"));
  doc["files"].erase("rank-00000.safetensors");
  {
    std::FILE* f = std::fopen((dir + "/metadata.json").c_str(), "w");
    ASSERT_NE(f, nullptr);
    const std::string text = doc.dump(2);
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
  std::string message;
  try {
    load_latest_checkpoint(root_, whole.tensors);
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("tensor param/wte: the stored slices (e.g. at [16,0] of [32,8]) do not "
                         "hold all of this rank's slice at [0,0] of [32,8]"),
            std::string::npos)
      << message;
  // Rank 1 of TP 2 still loads from its own shard alone.
  const auto meta = load_latest_checkpoint(root_, half.tensors);
  ASSERT_TRUE(meta.has_value());
  half.expect_filled(seed_, "TP 2 rank 1 from its shard alone");
}

}  // namespace
}  // namespace kt::worker

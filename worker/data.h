// Training data for one rank: batches of B sequences of T+1 tokens (inputs and next-token
// targets). DP ranks read disjoint samples. The cursor goes into checkpoints so that a resumed
// run reads exactly what the uninterrupted run would have read.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace kt::worker {

class DataSource {
 public:
  virtual ~DataSource() = default;
  // Fills `tokens` (resized to B*(T+1)) with B sequences of T+1 tokens: row b holds
  // tokens[b*(T+1) .. b*(T+1)+T]; inputs are the first T, targets the last T.
  virtual void next_batch(int B, int T, std::vector<int32_t>& tokens) = 0;
  // Everything needed to continue exactly from here (JSON, stored in checkpoint metadata).
  virtual nlohmann::json cursor() const = 0;
  virtual void restore(const nlohmann::json& cursor) = 0;
  virtual int vocab_size() const = 0;
  // The lowest mean loss a model can reach on this data, in nats per token, when it is known
  // (the synthetic chain's entropy rate); nullopt otherwise.
  virtual std::optional<double> loss_floor() const { return std::nullopt; }
};

// A seeded, stationary Markov chain of order `order` over `vocab` tokens whose entropy rate is
// known exactly. Each state (the last `order` tokens) has `branching` possible next tokens with
// seeded random probabilities. Rank r of `world` draws its sequences from its own stream.
class SyntheticMarkov : public DataSource {
 public:
  SyntheticMarkov(int vocab, int order, int branching, uint64_t seed, int rank, int world);
  void next_batch(int B, int T, std::vector<int32_t>& tokens) override;
  nlohmann::json cursor() const override;
  void restore(const nlohmann::json& cursor) override;
  int vocab_size() const override;
  // H = Σ_s π(s) · H(P(·|s)) in nats, π the stationary distribution of the chain.
  double entropy_rate() const;
  std::optional<double> loss_floor() const override { return entropy_rate(); }

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// Checks a token shard's header (its 256 words) against the size of the file `path` it came
// from; returns the token count. Throws kt::Error naming the file.
int64_t decode_token_shard_header(const std::array<int32_t, 256>& header, int64_t file_bytes,
                                  const std::string& path);

// llm.c token shards (256 × int32 header: magic 20240520, version 1, token count; then uint16
// tokens) matched by a glob, read in a seeded random order per epoch. Throws kt::Error naming
// the file for a missing glob match, a bad magic or version, a truncated file, or a shard with
// fewer than T+1 tokens.
class TokenShards : public DataSource {
 public:
  TokenShards(const std::string& glob_pattern, int vocab, uint64_t seed, int rank, int world);
  void next_batch(int B, int T, std::vector<int32_t>& tokens) override;
  nlohmann::json cursor() const override;
  void restore(const nlohmann::json& cursor) override;
  int vocab_size() const override;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace kt::worker

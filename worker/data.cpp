// Training data: a synthetic Markov chain with a known entropy rate, and llm.c token shards.
// docs/DATA.md describes the generator, the shard format, the DP split and the cursors.
//
// Letters: V vocabulary size, k chain order, K branching (successors per state), S = V^k states,
// B sequences per batch, T tokens per input sequence (each row holds T+1 tokens).
#include "worker/data.h"

#include <glob.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "api/error.h"

namespace kt::worker {
namespace {

// ---------------------------------------------------------------------------------------------
// Counter-based random numbers.
//
// splitmix64 (Steele, Lea, Flood, "Fast Splittable Pseudorandom Number Generators", OOPSLA 2014;
// constants from Vigna's reference splitmix64.c): output n of a stream is mix64(key + n·γ), so a
// stream is fully determined by its key and position and needs no saved state beyond a counter.

constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ULL;

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Key of a stream: the words are folded in one splitmix step each, so (seed, a, b) and
// (seed, b, a) give unrelated keys. The first word after the seed is a tag that keeps the
// streams of different purposes apart.
uint64_t stream_key(std::initializer_list<uint64_t> words) {
  uint64_t h = 0;
  for (uint64_t w : words) h = mix64((h ^ w) + kGamma);
  return h;
}

// Tags (ASCII) for stream_key.
constexpr uint64_t kTagTransitions = 0x5452414e53ULL;  // "TRANS": successors of a state
constexpr uint64_t kTagSequence = 0x534551ULL;         // "SEQ": one synthetic sequence
constexpr uint64_t kTagShardOrder = 0x4f52444552ULL;   // "ORDER": shard order of an epoch
constexpr uint64_t kTagWindows = 0x57494e44ULL;        // "WIND": window order of a shard

class CounterRng {
 public:
  explicit CounterRng(uint64_t key) : state_(key) {}
  uint64_t next() {
    state_ += kGamma;
    return mix64(state_);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Uniform in (0, 1): safe to take the logarithm of.
  double open_uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }
  // Uniform in [0, n) without modulo bias (rejects the top partial block of 2^64).
  uint64_t below(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
    for (;;) {
      const uint64_t x = next();
      if (x >= threshold) return x % n;
    }
  }

 private:
  uint64_t state_;
};

// The smallest number of steps of the new world that covers `done` steps of the old one: with
// lock-step ranks, `done` per-rank steps of `old_world` ranks consumed done·old_world samples.
int64_t rescale_position(int64_t done, int64_t old_world, int64_t new_world) {
  return (done * old_world + new_world - 1) / new_world;
}

// A cursor's integer field: a JSON integer in [0, max] (json's get<int64_t>() of 3.8e20, or of
// any number that is no integer, converts out of range: undefined behaviour, found by
// fuzz/checkpoint_fuzz.cpp). Absent: `fallback`, or an error when there is none.
int64_t cursor_integer(const nlohmann::json& cursor, const char* key,
                       std::optional<int64_t> fallback = std::nullopt,
                       int64_t max = std::numeric_limits<int64_t>::max()) {
  const auto it = cursor.find(key);
  if (it == cursor.end()) {
    if (fallback) return *fallback;
    throw Error("data cursor " + cursor.dump() + " has no " + key);
  }
  const bool fits = it->is_number_unsigned()
                        ? it->get<uint64_t>() <= static_cast<uint64_t>(max)
                        : it->is_number_integer() && it->get<int64_t>() >= 0 && it->get<int64_t>() <= max;
  if (!fits) {
    throw Error("data cursor " + cursor.dump() + ": " + key + " must be an integer in [0, " +
                std::to_string(max) + "], got " + it->dump());
  }
  return it->get<int64_t>();
}

void require_kind(const nlohmann::json& cursor, const char* kind) {
  // `kind` of another type is no match (json's value() would throw its own type_error).
  const auto it = cursor.is_object() ? cursor.find("kind") : cursor.end();
  if (!cursor.is_object() || it == cursor.end() || !it->is_string() ||
      it->get<std::string>() != kind) {
    throw Error(std::string("data cursor ") + cursor.dump() + " is not a cursor of " + kind +
                " data");
  }
}

void check_rank(int rank, int world, const char* what) {
  if (world < 1 || rank < 0 || rank >= world) {
    throw Error(std::string(what) + ": rank " + std::to_string(rank) + " is outside world " +
                std::to_string(world));
  }
}

}  // namespace

// =============================================================================================
// SyntheticMarkov

struct SyntheticMarkov::Impl {
  int vocab = 0, order = 0, branching = 0;
  uint64_t seed = 0;
  int rank = 0, world = 1;
  int64_t num_states = 0;  // S = V^k; state s = Σ_i x_i·V^(k-1-i), oldest token x_0 first

  std::vector<int32_t> next_token;     // (S, K): the successor tokens of each state
  std::vector<double> next_prob;       // (S, K): their probabilities, each row sums to 1
  std::vector<double> stationary_cdf;  // (S): Σ_{s' ≤ s} π(s'), to draw start states
  double entropy_rate = 0;

  int64_t sequences_drawn = 0;  // per rank; this rank's next sequence is sequences_drawn·W + r

  void build_transitions();
  void solve_stationary();
  int64_t successor(int64_t state, int32_t token) const {
    return (state * vocab + token) % num_states;
  }
  void sequence(int64_t global_index, int length, int32_t* out) const;
};

// Successors of state s: token (x+1) mod V, x the newest token of s, plus K−1 distinct
// pseudo-random tokens. Probabilities: p = (1 − u)·d + u/K with d a Dirichlet(1,…,1) draw
// (normalised Exp(1) variables, Devroye, "Non-Uniform Random Variate Generation", 1986, §XI.4),
// so entropies vary by state, and u = kUniformShare, so no successor is vanishingly rare (which
// would make the chain nearly reducible: slow to mix and slow to solve for π).
// The fixed successor makes every state reach the same cycle of states, so the chain has a single
// closed class and a unique π (DATA.md §1); the random ones make it mix fast.
constexpr double kUniformShare = 0.1;

void SyntheticMarkov::Impl::build_transitions() {
  const int K = branching;
  next_token.assign(num_states * K, 0);
  next_prob.assign(num_states * K, 0.0);
  std::vector<uint8_t> taken(vocab, 0);
  for (int64_t s = 0; s < num_states; ++s) {
    CounterRng rng(stream_key({seed, kTagTransitions, static_cast<uint64_t>(s)}));
    int32_t* tokens = &next_token[s * K];
    double* probs = &next_prob[s * K];
    const int32_t newest = static_cast<int32_t>(s % vocab);
    tokens[0] = (newest + 1) % vocab;
    taken[tokens[0]] = 1;
    for (int j = 1; j < K; ++j) {
      int32_t x;
      do {
        x = static_cast<int32_t>(rng.below(vocab));
      } while (taken[x]);
      taken[x] = 1;
      tokens[j] = x;
    }
    double total = 0;
    for (int j = 0; j < K; ++j) total += probs[j] = -std::log(rng.open_uniform());
    for (int j = 0; j < K; ++j) {
      probs[j] = (1 - kUniformShare) * probs[j] / total + kUniformShare / K;
      taken[tokens[j]] = 0;
    }
  }
}

// π by power iteration on the lazy chain (I + P)/2, which has the same stationary distributions
// as P but is aperiodic, so the iteration converges even if P were periodic (Levin, Peres, Wilmer,
// "Markov Chains and Mixing Times", 2nd ed., §1.3); from the uniform distribution until the
// residual ‖πP − π‖₁ < 1e-12. Then H = Σ_s π(s)·H(P(·|s)) with H(p) = −Σ_j p_j ln p_j (Cover &
// Thomas, "Elements of Information Theory", 2nd ed., Thm 4.2.4: the entropy rate of a
// stationary Markov chain).
void SyntheticMarkov::Impl::solve_stationary() {
  const int K = branching;
  std::vector<double> pi(num_states, 1.0 / static_cast<double>(num_states));
  std::vector<double> next(num_states);
  constexpr double kTolerance = 1e-12;
  constexpr int kMaxIterations = 100000;
  double residual = 1;
  for (int iteration = 0; iteration < kMaxIterations; ++iteration) {
    std::fill(next.begin(), next.end(), 0.0);
    for (int64_t s = 0; s < num_states; ++s) {
      if (pi[s] == 0) continue;
      for (int j = 0; j < K; ++j) {
        next[successor(s, next_token[s * K + j])] += pi[s] * next_prob[s * K + j];
      }
    }
    residual = 0;
    for (int64_t s = 0; s < num_states; ++s) residual += std::abs(next[s] - pi[s]);
    if (residual < kTolerance) {
      pi.swap(next);
      break;
    }
    for (int64_t s = 0; s < num_states; ++s) pi[s] = 0.5 * (pi[s] + next[s]);
  }
  if (residual >= kTolerance) {
    throw Error("synthetic data: the stationary distribution did not converge in " +
                std::to_string(kMaxIterations) + " iterations (L1 residual " +
                std::to_string(residual) + "); try a larger branching");
  }
  // Rounding in the sums leaves the mass off 1 by ~1e-16 per iteration; remove it.
  double mass = 0;
  for (double p : pi) mass += p;
  for (double& p : pi) p /= mass;
  stationary_cdf.resize(num_states);
  double cumulative = 0, rate = 0;
  for (int64_t s = 0; s < num_states; ++s) {
    cumulative += pi[s];
    stationary_cdf[s] = cumulative;
    double h = 0;
    for (int j = 0; j < K; ++j) {
      const double p = next_prob[s * K + j];
      if (p > 0) h -= p * std::log(p);
    }
    rate += pi[s] * h;
  }
  entropy_rate = rate;
}

// One sequence of `length` tokens from its own stream, keyed by (seed, global index): the first
// k tokens are a state drawn from π, so every position of the sequence is stationary.
void SyntheticMarkov::Impl::sequence(int64_t global_index, int length, int32_t* out) const {
  CounterRng rng(stream_key({seed, kTagSequence, static_cast<uint64_t>(global_index)}));
  const double u = rng.uniform() * stationary_cdf.back();
  int64_t state =
      std::upper_bound(stationary_cdf.begin(), stationary_cdf.end(), u) - stationary_cdf.begin();
  state = std::min(state, num_states - 1);
  int64_t digits = state;
  for (int i = order - 1; i >= 0; --i) {
    if (i < length) out[i] = static_cast<int32_t>(digits % vocab);
    digits /= vocab;
  }
  const int K = branching;
  for (int t = order; t < length; ++t) {
    const double v = rng.uniform();
    const double* probs = &next_prob[state * K];
    // Inverse-CDF sampling; the last successor also takes v beyond the rounded total.
    int j = 0;
    double cumulative = probs[0];
    while (j < K - 1 && v >= cumulative) cumulative += probs[++j];
    out[t] = next_token[state * K + j];
    state = successor(state, out[t]);
  }
}

SyntheticMarkov::SyntheticMarkov(int vocab, int order, int branching, uint64_t seed, int rank,
                                 int world)
    : impl_(std::make_shared<Impl>()) {
  check_rank(rank, world, "synthetic data");
  if (vocab < 2) throw Error("synthetic data: vocab " + std::to_string(vocab) + " is below 2");
  if (order < 1) throw Error("synthetic data: order " + std::to_string(order) + " is below 1");
  if (branching < 2 || branching > vocab) {
    throw Error("synthetic data: branching " + std::to_string(branching) +
                " is outside [2, vocab " + std::to_string(vocab) + "]");
  }
  // The tables hold S·K transitions (12 bytes each); 2^24 of them is 192 MiB.
  constexpr int64_t kMaxTransitions = int64_t{1} << 24;
  int64_t states = 1;
  for (int i = 0; i < order; ++i) {
    if (states > kMaxTransitions / vocab) {
      states = kMaxTransitions + 1;
      break;
    }
    states *= vocab;
  }
  if (states > kMaxTransitions / branching) {
    throw Error("synthetic data: vocab^order × branching = " + std::to_string(vocab) + "^" +
                std::to_string(order) + " × " + std::to_string(branching) +
                " transitions exceeds the limit of " + std::to_string(kMaxTransitions));
  }
  Impl& m = *impl_;
  m.vocab = vocab;
  m.order = order;
  m.branching = branching;
  m.seed = seed;
  m.rank = rank;
  m.world = world;
  m.num_states = states;
  m.build_transitions();
  m.solve_stationary();
}

void SyntheticMarkov::next_batch(int B, int T, std::vector<int32_t>& tokens) {
  KT_CHECK(B > 0 && T > 0, "batch " + std::to_string(B) + " × " + std::to_string(T));
  Impl& m = *impl_;
  tokens.resize(static_cast<size_t>(B) * (T + 1));
  for (int b = 0; b < B; ++b) {
    m.sequence(m.sequences_drawn * m.world + m.rank, T + 1,
               &tokens[static_cast<size_t>(b) * (T + 1)]);
    ++m.sequences_drawn;
  }
}

nlohmann::json SyntheticMarkov::cursor() const {
  return {{"kind", "synthetic"}, {"sequence", impl_->sequences_drawn}, {"world", impl_->world}};
}

void SyntheticMarkov::restore(const nlohmann::json& cursor) {
  require_kind(cursor, "synthetic");
  const int64_t drawn = cursor_integer(cursor, "sequence");
  const int64_t world = cursor_integer(cursor, "world", impl_->world);
  if (world < 1) throw Error("data cursor " + cursor.dump() + " is out of range");
  impl_->sequences_drawn = rescale_position(drawn, world, impl_->world);
}

int SyntheticMarkov::vocab_size() const {
  return impl_->vocab;
}

double SyntheticMarkov::entropy_rate() const {
  return impl_->entropy_rate;
}

// =============================================================================================
// TokenShards

namespace {

// llm.c's dev/data/data_common.py write_datafile: 256 int32 header words, then uint16 tokens.
constexpr int kHeaderWords = 256;
constexpr int64_t kHeaderBytes = kHeaderWords * sizeof(int32_t);
constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kShardVersion = 1;
static_assert(std::endian::native == std::endian::little,
              "llm.c shards are little-endian and are read without byte swapping");

struct Shard {
  std::string path;
  int64_t num_tokens = 0;
};

Shard read_shard_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open token shard: " + std::strerror(errno));
  std::array<int32_t, kHeaderWords> header{};
  in.read(reinterpret_cast<char*>(header.data()), kHeaderBytes);
  const int64_t got = in.gcount();
  if (got < kHeaderBytes) {
    throw Error(path + ": truncated header: " + std::to_string(got) + " bytes, expected " +
                std::to_string(kHeaderBytes));
  }
  const auto size = static_cast<int64_t>(std::filesystem::file_size(path));
  return {path, decode_token_shard_header(header, size, path)};
}

// Fisher–Yates (Knuth, TAOCP vol. 2, §3.4.2, Algorithm P) driven by a counter stream.
template <typename Int>
std::vector<Int> shuffled_range(Int n, uint64_t key) {
  std::vector<Int> v(n);
  for (Int i = 0; i < n; ++i) v[i] = i;
  CounterRng rng(key);
  for (Int i = n - 1; i > 0; --i) std::swap(v[i], v[rng.below(static_cast<uint64_t>(i) + 1)]);
  return v;
}

}  // namespace

int64_t decode_token_shard_header(const std::array<int32_t, 256>& header, int64_t file_bytes,
                                  const std::string& path) {
  if (header[0] != kShardMagic) {
    throw Error(path + ": bad magic " + std::to_string(header[0]) + ", expected " +
                std::to_string(kShardMagic) + " (llm.c token shard)");
  }
  if (header[1] != kShardVersion) {
    throw Error(path + ": bad version " + std::to_string(header[1]) + ", expected " +
                std::to_string(kShardVersion));
  }
  const int64_t declared = header[2];
  if (declared < 0) throw Error(path + ": bad token count " + std::to_string(declared));
  if (file_bytes != kHeaderBytes + 2 * declared) {
    const int64_t present = (file_bytes - kHeaderBytes) / 2;
    throw Error(path + ": " + (present < declared ? "truncated" : "size mismatch") +
                ": header says " + std::to_string(declared) + " tokens, file has " +
                std::to_string(present) +
                ((file_bytes - kHeaderBytes) % 2 != 0 ? " and a stray byte" : ""));
  }
  return declared;
}

struct TokenShards::Impl {
  std::string pattern;
  std::vector<Shard> shards;  // sorted by path, as glob(3) returns them
  int vocab = 0;
  uint64_t seed = 0;
  int rank = 0, world = 1;

  // Position, identical on all ranks (they move in lock-step): the next row is window
  // `window` (per rank) of the shard at `shard_pos` in epoch `epoch`'s shard order, for rows of
  // seq_len+1 tokens. seq_len = 0 until the first batch.
  int64_t epoch = 0, shard_pos = 0, window = 0;
  int seq_len = 0;
  int checked_seq_len = 0;  // the T for which every shard was checked to hold T+1 tokens

  // Caches derived from the position.
  int64_t order_epoch = -1;
  std::vector<int32_t> shard_order;
  int64_t perm_epoch = -1, perm_shard = -1;
  std::vector<int64_t> window_perm;  // shuffled window indices of shard perm_shard
  int64_t loaded_shard = -1;
  std::vector<uint16_t> loaded;

  // Windows of T+1 tokens at stride T (consecutive windows share a token, like llm.c):
  // window w covers tokens [w·T, w·T + T].
  int64_t windows_in(int64_t shard) const { return (shards[shard].num_tokens - 1) / seq_len; }
  int64_t windows_per_rank(int64_t shard) const { return windows_in(shard) / world; }
  void set_seq_len(int T);
  void load(int64_t shard);
};

void TokenShards::Impl::set_seq_len(int T) {
  if (T == checked_seq_len && T == seq_len) return;
  if (seq_len != 0 && seq_len != T && (window != 0 || shard_pos != 0)) {
    // The window grid depends on T, so a position inside an epoch means nothing for another T:
    // go on with the next epoch rather than guess.
    ++epoch;
    shard_pos = 0;
    window = 0;
  }
  int64_t usable = 0;
  for (const Shard& shard : shards) {
    if (shard.num_tokens < int64_t{T} + 1) {
      throw Error(shard.path + ": too short: " + std::to_string(shard.num_tokens) +
                  " tokens, fewer than T+1 = " + std::to_string(T + 1));
    }
    usable += (shard.num_tokens - 1) / T / world;
  }
  if (usable == 0) {
    throw Error("tokens data \"" + pattern + "\": no shard holds " + std::to_string(world) +
                " windows of T+1 = " + std::to_string(T + 1) +
                " tokens, one per data-parallel rank");
  }
  seq_len = checked_seq_len = T;
  perm_epoch = perm_shard = -1;
}

void TokenShards::Impl::load(int64_t shard) {
  if (shard == loaded_shard) return;
  const Shard& s = shards[shard];
  loaded_shard = -1;
  loaded.resize(s.num_tokens);
  std::ifstream in(s.path, std::ios::binary);
  in.seekg(kHeaderBytes);
  in.read(reinterpret_cast<char*>(loaded.data()), 2 * s.num_tokens);
  if (!in || in.gcount() != 2 * s.num_tokens) {
    throw Error(s.path + ": truncated: header says " + std::to_string(s.num_tokens) +
                " tokens, read " + std::to_string(in.gcount() / 2));
  }
  for (int64_t i = 0; i < s.num_tokens; ++i) {
    if (loaded[i] >= vocab) {
      throw Error(s.path + ": token " + std::to_string(loaded[i]) + " at position " +
                  std::to_string(i) + " exceeds vocab " + std::to_string(vocab));
    }
  }
  loaded_shard = shard;
}

TokenShards::TokenShards(const std::string& glob_pattern, int vocab, uint64_t seed, int rank,
                         int world)
    : impl_(std::make_shared<Impl>()) {
  check_rank(rank, world, "tokens data");
  if (vocab < 1 || vocab > 65536) {
    throw Error("tokens data: vocab " + std::to_string(vocab) +
                " is outside [1, 65536] (tokens are uint16)");
  }
  glob_t matches{};
  const int rc = ::glob(glob_pattern.c_str(), 0, nullptr, &matches);
  std::vector<std::string> paths;
  if (rc == 0) {
    for (size_t i = 0; i < matches.gl_pathc; ++i) {
      if (std::filesystem::is_regular_file(matches.gl_pathv[i]))
        paths.emplace_back(matches.gl_pathv[i]);
    }
  }
  globfree(&matches);
  if (rc != 0 && rc != GLOB_NOMATCH) {
    throw Error("tokens data \"" + glob_pattern + "\": glob failed (code " + std::to_string(rc) +
                ")");
  }
  if (paths.empty()) throw Error("tokens data \"" + glob_pattern + "\": no file matches");
  Impl& m = *impl_;
  m.pattern = glob_pattern;
  m.vocab = vocab;
  m.seed = seed;
  m.rank = rank;
  m.world = world;
  // Headers are checked up front so that a bad shard fails the run at start, not hours in.
  for (const std::string& path : paths) m.shards.push_back(read_shard_header(path));
}

void TokenShards::next_batch(int B, int T, std::vector<int32_t>& tokens) {
  KT_CHECK(B > 0 && T > 0, "batch " + std::to_string(B) + " × " + std::to_string(T));
  Impl& m = *impl_;
  m.set_seq_len(T);
  const int64_t num_shards = static_cast<int64_t>(m.shards.size());
  tokens.resize(static_cast<size_t>(B) * (T + 1));
  for (int b = 0; b < B; ++b) {
    // Advance past finished shards and epochs. set_seq_len guarantees that some shard has a
    // window for every rank, so this ends within one epoch.
    for (;;) {
      if (m.shard_pos >= num_shards) {
        ++m.epoch;
        m.shard_pos = 0;
        m.window = 0;
      }
      if (m.order_epoch != m.epoch) {
        m.shard_order = shuffled_range<int32_t>(
            static_cast<int32_t>(num_shards),
            stream_key({m.seed, kTagShardOrder, static_cast<uint64_t>(m.epoch)}));
        m.order_epoch = m.epoch;
      }
      if (m.window < m.windows_per_rank(m.shard_order[m.shard_pos])) break;
      ++m.shard_pos;
      m.window = 0;
    }
    const int64_t shard = m.shard_order[m.shard_pos];
    if (m.perm_epoch != m.epoch || m.perm_shard != shard) {
      m.window_perm = shuffled_range<int64_t>(
          m.windows_in(shard), stream_key({m.seed, kTagWindows, static_cast<uint64_t>(m.epoch),
                                           static_cast<uint64_t>(shard)}));
      m.perm_epoch = m.epoch;
      m.perm_shard = shard;
    }
    m.load(shard);
    // Rank r takes every world-th window of the shuffled order: r, r+W, r+2W, …
    const int64_t w = m.window_perm[m.rank + m.world * m.window];
    const uint16_t* src = &m.loaded[w * T];
    int32_t* dst = &tokens[static_cast<size_t>(b) * (T + 1)];
    for (int t = 0; t <= T; ++t) dst[t] = src[t];
    ++m.window;
  }
}

nlohmann::json TokenShards::cursor() const {
  const Impl& m = *impl_;
  return {{"kind", "tokens"},   {"epoch", m.epoch}, {"shard", m.shard_pos},
          {"window", m.window}, {"T", m.seq_len},   {"world", m.world}};
}

void TokenShards::restore(const nlohmann::json& cursor) {
  require_kind(cursor, "tokens");
  const int64_t epoch = cursor_integer(cursor, "epoch");
  const int64_t shard_pos = cursor_integer(cursor, "shard");
  const int64_t window = cursor_integer(cursor, "window");
  const int seq_len =
      static_cast<int>(cursor_integer(cursor, "T", std::nullopt, std::numeric_limits<int>::max()));
  const int64_t world = cursor_integer(cursor, "world", impl_->world);
  if (world < 1) throw Error("data cursor " + cursor.dump() + " is out of range");
  Impl& m = *impl_;
  m.epoch = epoch;
  m.shard_pos = shard_pos;
  m.seq_len = seq_len;
  m.window = rescale_position(window, world, m.world);
  m.perm_epoch = m.perm_shard = -1;  // the window grid depends on T
}

int TokenShards::vocab_size() const {
  return impl_->vocab;
}

}  // namespace kt::worker

#include "planner/search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <set>
#include <tuple>

namespace kt::planner {
namespace {

using api::OffloadMode;

bool contains(const std::vector<int64_t>& v, int64_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t i = 1; i * i <= n; ++i) {
    if (n % i) continue;
    out.push_back(i);
    if (i != n / i) out.push_back(n / i);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Deterministic preference among equally fast plans: fewer ranks, less offload, less TP,
// no overlap, less recompute, larger micro-batches.
auto simplicity(const ParallelConfig& c) {
  return std::make_tuple(c.nodes * c.procs_per_node, c.pp, c.virtual_stages, c.cut_layer > 0,
                         c.distributed_optimizer, static_cast<int>(c.offload), c.tp, c.sub_batches,
                         static_cast<int>(c.recompute), -c.micro_batch, -c.gpu_units, -c.window);
}

bool better(const Candidate& a, const Candidate& b) {
  const double ta = a.eval.predicted.step_seconds, tb = b.eval.predicted.step_seconds;
  if (ta < tb * (1 - 1e-9)) return true;
  if (tb < ta * (1 - 1e-9)) return false;
  return simplicity(a.config) < simplicity(b.config);
}

struct Searcher {
  const Problem& problem;
  const SearchSpace& space;
  SearchResult result;
  std::map<std::tuple<int64_t, int64_t, int64_t, int, int64_t, int64_t>, MicroBatchTiming> timings;

  // Memory first (O(1)); the timing simulation only for configurations that fit.
  void consider(const ParallelConfig& c) {
    if (!space.exclude_kind.empty() && kind_of(c) == space.exclude_kind) return;
    ++result.evaluated;
    const bool stage_cut = c.cut_layer > 0 && c.pp > 1;
    Evaluation memory = stage_cut         ? stage_cut_memory(c)
                        : c.cut_layer > 0 ? cutpoint_memory(c)
                                          : evaluate_memory(problem, c);
    if (!memory.fits) {
      note_miss(c, memory);
      return;
    }
    Candidate cand{c, stage_cut         ? evaluate_stage_cut(c)
                      : c.cut_layer > 0 ? evaluate_cutpoint(c)
                                        : evaluate(problem, c, timing(c))};
    if (!result.best || better(cand, *result.best)) result.best = cand;
  }

  // The configuration that came nearest to fitting, for when none does.
  void note_miss(const ParallelConfig& c, const Evaluation& memory) {
    const double miss = std::max(memory.device_ratio, memory.host_ratio);
    const auto& nm = result.nearest_miss;
    if (!nm || miss < std::max(nm->eval.device_ratio, nm->eval.host_ratio))
      result.nearest_miss = Candidate{c, memory};
  }

  // The virtual stage counts to try for `c` (its stages, micro-batches), ascending: 1, and with
  // stages, every count that divides a stage's layers where the micro-batches are a multiple of
  // the stages (worker/pipeline_order.h), unless the job fixed them. Without offload or with
  // offload optimizer (what the workers run).
  std::vector<int64_t> virtual_stage_counts(const ParallelConfig& c) {
    std::vector<int64_t> out;
    const int64_t stage_layers = problem.model.layers / c.pp;
    for (int64_t v : divisors(stage_layers)) {
      if (!space.virtual_stages.empty() && !contains(space.virtual_stages, v)) continue;
      if (v > 1 && (c.pp < 2 || c.grad_accum % c.pp != 0)) continue;
      out.push_back(v);
    }
    if (out.empty())
      note(Stage::kBatch, [&] {
        return "virtualStages " + list(space.virtual_stages) + " needs pipeline stages whose " +
               std::to_string(stage_layers) +
               " layers it divides and micro-batches in groups of "
               "the stages (" +
               std::to_string(c.pp) + " stages, " + std::to_string(c.grad_accum) +
               " micro-batches)";
      });
    return out;
  }

  // `c` with each count of `counts` (ascending, from 1) in turn. Virtual stages never need less
  // memory than 1F1B (p + (p − 1)/v micro-batches' activations in flight against p, v copies of
  // the embeddings' unit against one, the rest alike): where `c` does not fit without them, none
  // of its interleaved variants is evaluated (for the nearest miss, the plain one is).
  void with_virtual_stages(ParallelConfig c, const std::vector<int64_t>& counts) {
    for (int64_t v : counts) {
      c.virtual_stages = v;
      if (v > 1 && counts.front() == 1) {
        ParallelConfig plain = c;
        plain.virtual_stages = 1;
        if (!evaluate_memory(problem, plain).fits) return;
      }
      consider(c);
    }
  }

  // A micro-batch's timing depends on the model only through the layers of the stage it times
  // (time_micro_batch: a cutpoint's segments, and the stages after a cut between stages, are
  // models of some of the layers) — and on CPU ranks through the rank's share of the node's cores
  // (rank_flops_per_second), so there also through the ranks per node.
  const MicroBatchTiming& timing(const ParallelConfig& c, const Problem* of = nullptr) {
    const Problem& p = of ? *of : problem;
    const auto key =
        std::make_tuple(c.tp, c.micro_batch, c.sub_batches, static_cast<int>(c.recompute),
                        p.model.layers / c.pp, p.cpu_device ? c.procs_per_node : int64_t{0});
    auto it = timings.find(key);
    if (it == timings.end()) it = timings.emplace(key, time_micro_batch(p, c)).first;
    return it->second;
  }

  // The problem of a model of `layers` of the problem's layers (a cutpoint's segment), kept.
  std::map<int64_t, Problem> segment_problems;
  const Problem& segment(int64_t layers) {
    auto it = segment_problems.find(layers);
    if (it == segment_problems.end()) {
      it = segment_problems.emplace(layers, problem).first;
      it->second.model.layers = layers;
    }
    return it->second;
  }

  Evaluation evaluate_cutpoint(const ParallelConfig& c) {
    const auto [first, second] = cutpoint_configs(problem, c);
    const Problem& p1 = segment(c.cut_layer);
    const Problem& p2 = segment(problem.model.layers - c.cut_layer);
    return join_cutpoint(problem, c, evaluate(p1, first, timing(first, &p1)),
                         evaluate(p2, second, timing(second, &p2)));
  }
  // Per-stage TP (stage_cut_parts): the parts' problems are the whole model's and the stages
  // after the cut's (a segment).
  Evaluation evaluate_stage_cut(const ParallelConfig& c) {
    const auto [first, second] = stage_cut_configs(problem, c);
    const Problem& after = segment(problem.model.layers - c.cut_layer);
    return join_stage_cut(problem, c, before_part(first),
                          evaluate(after, second, timing(second, &after)));
  }
  // The stages before the cut are the same for every cut of one pipeline: evaluated once.
  const Evaluation& before_part(const ParallelConfig& first) {
    if (!(before_evaluated && before_config == first)) {
      before_config = first;
      before_evaluation = evaluate(problem, before_config, timing(before_config));
      before_evaluated = true;
    }
    return before_evaluation;
  }
  ParallelConfig before_config;
  Evaluation before_evaluation;
  bool before_evaluated = false;
  Evaluation stage_cut_memory(const ParallelConfig& c) {
    const auto [first, second] = stage_cut_configs(problem, c);
    return join_stage_cut(problem, c, evaluate_memory(problem, first),
                          evaluate_memory(segment(problem.model.layers - c.cut_layer), second));
  }

  // Per-stage TP in pipeline `c` (one chunk per stage; any offload mode, each stage its first
  // gpuUnits units on the device, with the window each cut its largest): the stages from s on at
  // another TP degree t₂ that nests with c's, divides a stage's ranks and splits the
  // micro-batch — every boundary s and every such t₂ (or the forced ones). Pruned without loss
  // (docs/PLANNER.md §17): the stages before the cut hold what c's do (its first stage bounds
  // them), so where c does not fit no cut of it does; and a cut whose 1F1B floor
  // (stage_cut_step_floor) is slower than the best plan is not evaluated.
  void stage_cut_variants(ParallelConfig c, const std::vector<int64_t>& tps) {
    c.virtual_stages = 1;
    const int64_t L = problem.model.layers, stage_layers = L / c.pp;
    if (space.cut_layer && (space.cut_layer % stage_layers || space.cut_layer >= L)) return;
    const bool prune = space.prune_cutpoints;
    const double best = result.best ? result.best->eval.predicted.step_seconds * (1 + 1e-9) : 0.0;
    int fits = -1;            // whether c fits (its first stage bounds the stages before any cut)
    double before_tail = -1;  // the stages before the cut's own tail
    for (const StageCutDegree& k : stage_cut_degrees(c, tps)) {
      c.cut_tp = k.t2;
      // The floor is linear in the boundary: at its least at the first or the last.
      if (result.best && prune && k.least_floor > best) continue;
      if (fits < 0) {
        c.cut_tp = 0;
        fits = problem.ignore_memory || !prune || evaluate_memory(problem, c).fits;
        c.cut_tp = k.t2;
      }
      if (!fits) return;
      const bool window = c.offload == OffloadMode::kWindow;
      for (int64_t s = 1; s < c.pp; ++s) {
        c.cut_layer = s * stage_layers;
        if (space.cut_layer && c.cut_layer != space.cut_layer) continue;
        if (result.best && prune) {
          const double floor = stage_cut_step_floor(c, s, *k.before, *k.after);
          if (floor > best) continue;
          // ... plus the tail of the stages before the cut (join_stage_cut), which the
          // pipeline without the cut has.
          if (before_tail < 0 && window) before_tail = 0;  // (its tail may shrink with more slots)
          if (before_tail < 0) {
            ParallelConfig first = c;
            first.cut_layer = first.cut_tp = 0;
            const Evaluation& before = before_part(first);
            before_tail = std::max(0.0, before.predicted.step_seconds - before.forward_backward -
                                            before.embedding_pair_seconds);
          }
          if (floor + before_tail > best) continue;
        }
        if (window && !space.window) {  // the largest window that fits this cut (time never grows)
          c.window = std::max<int64_t>(1, largest_window(c));
          consider(c);
          c.window = 1;
          continue;
        }
        consider(c);
      }
      c.cut_layer = 0;
    }
  }
  // The second TP degrees a pipeline of c's shape may take after a cut, with both parts'
  // micro-batch timings (each part's stages hold L/pp layers: the same at every boundary) and
  // the least 1F1B floor over the boundaries. Kept for the shape: the offload variants ask again
  // for every gpuUnits and optimizer sharding.
  struct StageCutDegree {
    int64_t t2 = 0;
    const MicroBatchTiming *before = nullptr, *after = nullptr;
    double least_floor = 0;
  };
  const std::vector<StageCutDegree>& stage_cut_degrees(const ParallelConfig& c,
                                                       const std::vector<int64_t>& tps) {
    const auto shape = std::make_tuple(c.tp, c.dp, c.pp, c.micro_batch, c.grad_accum, c.sub_batches,
                                       static_cast<int>(c.recompute));
    if (degrees_shape == shape) return degrees;
    degrees_shape = shape;
    degrees.clear();
    const int64_t L = problem.model.layers, stage_layers = L / c.pp, ranks = c.tp * c.dp;
    for (int64_t t2 : tps) {
      if (t2 == c.tp || (space.cut_tp && t2 != space.cut_tp)) continue;
      if (ranks % t2 || std::max(t2, c.tp) % std::min(t2, c.tp)) continue;
      if (t2 < c.tp && c.micro_batch % (c.tp / t2)) continue;
      if (c.sub_batches == 2 && (c.micro_batch * t2 / c.tp) % 2) continue;
      ParallelConfig at_last = c;
      at_last.virtual_stages = 1;
      at_last.cut_tp = t2;
      at_last.cut_layer = L - stage_layers;
      const auto [first, second] = stage_cut_configs(problem, at_last);
      StageCutDegree k;
      k.t2 = t2;
      k.before = &timing(first);
      k.after = &timing(second, &segment(stage_layers));
      k.least_floor = std::min(stage_cut_step_floor(at_last, 1, *k.before, *k.after),
                               stage_cut_step_floor(at_last, c.pp - 1, *k.before, *k.after));
      degrees.push_back(k);
    }
    return degrees;
  }
  std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int> degrees_shape{};
  std::vector<StageCutDegree> degrees;

  Evaluation cutpoint_memory(const ParallelConfig& c) {
    const auto [first, second] = cutpoint_configs(problem, c);
    return join_cutpoint(problem, c, evaluate_memory(segment(c.cut_layer), first),
                         evaluate_memory(segment(problem.model.layers - c.cut_layer), second));
  }

  // Whether no plan of cut `c` can beat the best so far, whatever its gpuUnits, window or
  // optimizer sharding (cutpoint_step_floor; strictly slower, so not even a tie).
  bool cut_floor_slower(const ParallelConfig& c) {
    if (!result.best) return false;
    const auto [first, second] = cutpoint_configs(problem, c);
    const double floor =
        cutpoint_step_floor(problem, c, timing(first, &segment(c.cut_layer)),
                            timing(second, &segment(problem.model.layers - c.cut_layer)));
    return floor > result.best->eval.predicted.step_seconds * (1 + 1e-9);
  }

  // A cut's device and host memory (as ratios to their capacities) at every cut layer, at its
  // gpuUnits and window, from the memory at its breaks alone: affine between two of them
  // (cutpoint_memory_breaks). The breaks count for the nearest miss.
  struct MemoryLine {
    std::vector<int64_t> breaks;
    std::vector<double> device, host;
    // Whether the cut at layer k provably overflows the device (or the host): by more than the
    // interpolation's rounding.
    bool over(int64_t k, bool on_host) const {
      const std::vector<double>& r = on_host ? host : device;
      const size_t i = static_cast<size_t>(std::upper_bound(breaks.begin(), breaks.end(), k) -
                                           breaks.begin());  // breaks[i-1] ≤ k
      double ratio = r[i - 1];
      if (breaks[i - 1] != k) {
        const double w =
            static_cast<double>(k - breaks[i - 1]) / static_cast<double>(breaks[i] - breaks[i - 1]);
        ratio += w * (r[i] - r[i - 1]);
      }
      return ratio > 1 + 1e-9;
    }
  };
  MemoryLine memory_line(ParallelConfig c) {
    MemoryLine line;
    line.breaks = cutpoint_memory_breaks(problem, c);
    for (int64_t k : line.breaks) {
      c.cut_layer = k;
      const Evaluation memory = cutpoint_memory(c);
      line.device.push_back(memory.device_ratio);
      line.host.push_back(memory.host_ratio);
      if (!memory.fits) note_miss(c, memory);
    }
    return line;
  }

  // The cutpoints of a plan without stages: every layer k in [1, L) and every other TP degree t₂
  // of `tps` that nests with c.tp, where the global batch splits over DP world/t₂ and the
  // micro-batch over the TP groups after the cut; with offload, at each of `units` (the
  // gpuUnits to try, ascending; c.gpu_units alone without offload). Still exhaustive, pruned
  // only where provably nothing is lost (docs/PLANNER.md §16, tested against the unpruned
  // search): memory is affine in k between a few breaks (MemoryLine), and more units on the
  // device never need less device memory nor more host memory (a unit moved to the device keeps
  // its weights and gradients there as before and adds its optimizer state; with the window a
  // resident layer replaces a streamed one and at most a slot), so each cut can fit only within
  // one run of gpuUnits, found by bisection on the lines; a cut whose step floor is slower than
  // the best plan is dropped at every gpuUnits. The window's memory is least with one slot and
  // its host memory does not depend on the slots: the lines take the fewest, and the plan then
  // the most that fit.
  void cutpoint_variants(ParallelConfig c, const std::vector<int64_t>& tps,
                         const std::vector<int64_t>& units) {
    const int64_t L = problem.model.layers, world = c.nodes * c.procs_per_node;
    const bool offload = c.offload != OffloadMode::kNone;
    const bool window = c.offload == OffloadMode::kWindow;
    const bool memory = !problem.ignore_memory && space.prune_cutpoints;
    const std::vector<int64_t> tried = offload ? units : std::vector<int64_t>{c.gpu_units};
    for (int64_t t2 : tps) {
      if (t2 == c.tp || (space.cut_tp && t2 != space.cut_tp)) continue;
      if (std::max(t2, c.tp) % std::min(t2, c.tp) || world % t2) continue;
      const int64_t b2 = c.micro_batch * t2 / c.tp;
      if (b2 * c.tp != c.micro_batch * t2 || (c.sub_batches == 2 && b2 % 2)) {
        note(Stage::kMicroBatch, [&] {
          return "a cutpoint to tensorParallel " + std::to_string(t2) + " needs a micro-batch (" +
                 std::to_string(c.micro_batch) + ") that splits over its TP groups";
        });
        continue;
      }
      c.cut_tp = t2;
      // Each gpuUnits' memory line, where a cut asks (the window's with the fewest slots).
      std::vector<std::optional<MemoryLine>> lines(tried.size());
      const auto over = [&](size_t i, int64_t k, bool on_host) {
        if (!lines[i]) {
          ParallelConfig x = c;
          x.gpu_units = tried[i];
          if (window) x.window = space.window ? *space.window : 1;
          lines[i] = memory_line(x);
        }
        return lines[i]->over(k, on_host);
      };
      for (int64_t k = 1; k < L; ++k) {
        if (space.cut_layer && k != space.cut_layer) continue;
        c.cut_layer = k;
        // The run of gpuUnits [lo, hi) where both memories may hold the cut.
        size_t lo = 0, hi = tried.size();
        if (memory) {
          hi = bisect(0, hi, [&](size_t i) { return over(i, k, false); });
          lo = bisect(0, hi, [&](size_t i) { return !over(i, k, true); });
        }
        if (lo < hi && space.prune_cutpoints && cut_floor_slower(c)) continue;
        for (size_t i = lo; i < hi; ++i) {
          c.gpu_units = tried[i];
          if (window && !space.window) c.window = std::max<int64_t>(1, largest_window(c));
          consider(c);
        }
      }
    }
  }

  // The first i in [lo, hi) where `pred` holds, `pred` false before it and true from it on
  // (hi where it never does).
  template <typename Pred>
  static size_t bisect(size_t lo, size_t hi, Pred&& pred) {
    while (lo < hi) {
      const size_t mid = lo + (hi - lo) / 2;
      if (pred(mid))
        hi = mid;
      else
        lo = mid + 1;
    }
    return lo;
  }

  // `fn` with the offload window unsharded, or sharded where the job asks for the distributed
  // optimizer (each DP rank keeps the shard of the streamed layers' moments — on GPU ranks of
  // their fp32 master weights too: worker/offload.h, worker/cuda_offload.h). Not both: the
  // sharded window's variants in the widened search took GPT-3 175B's planning from medians of
  // 86–91 to 91–99 ms on a noisy machine (docs/PERFORMANCE.md). Leaves c unsharded.
  template <typename Fn>
  void window_shardings(ParallelConfig& c, Fn&& fn) {
    const auto& zeros = space.distributed_optimizer;
    const bool zero_optional = std::find(zeros.begin(), zeros.end(), false) != zeros.end();
    for (bool zero : zeros) {
      if (zero && zero_optional) continue;  // (asked for: the space holds only `on`)
      c.distributed_optimizer = zero && c.dp > 1;
      fn();
    }
    c.distributed_optimizer = false;
  }

  // The largest window that fits `c` (memory grows with W; time never does), below its streamed
  // layers (W = streamed would keep every layer resident: that is optimizer offload, not a
  // window); 0 where not even one slot fits.
  int64_t largest_window(ParallelConfig c) {
    const int64_t streamed = problem.model.layers / c.pp - (c.gpu_units - 1);
    c.window = 1;
    if (!evaluate_memory(problem, c).fits) return 0;
    int64_t lo = 1, hi = streamed - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      c.window = mid;
      if (evaluate_memory(problem, c).fits)
        lo = mid;
      else
        hi = mid - 1;
    }
    return lo;
  }

  std::string fraction() const {
    if (!space.gpu_update_fraction) return "auto";
    char text[32];
    std::snprintf(text, sizeof text, "%g", *space.gpu_update_fraction);
    return text;
  }

  // The gpuUnits a fraction grid gives, of a stage's units (its copy of the embeddings', then
  // its L/pp layers; the whole model without stages). Kept per (tp, pp): every configuration of
  // those degrees asks again, for each offload mode (GPT-3 175B's planning spent 28 % here).
  const std::vector<int64_t>& gpu_unit_grid(int64_t tp, int64_t pp) {
    std::vector<int64_t>& units = unit_grids[{tp, pp}];
    if (!units.empty()) return units;
    api::ModelDims m = problem.model;
    m.layers /= pp;
    if (space.gpu_update_fraction) {
      units.push_back(gpu_units_for_fraction(m, tp, *space.gpu_update_fraction));
      return units;
    }
    for (int i = 0; i <= 20; ++i) {  // f in steps of 0.05
      const int64_t k = gpu_units_for_fraction(m, tp, i * 0.05);
      if (!contains(units, k)) units.push_back(k);
    }
    return units;
  }
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> unit_grids;

  // `cut_tps`: a cutpoint's second degrees (cutpoints with offload optimizer, where the space has
  // cutpoints); `plain`: whether the configurations without a cutpoint are wanted too.
  void offload_variants(ParallelConfig c, const std::vector<int64_t>& cut_tps, bool plain) {
    const int64_t L = problem.model.layers / c.pp;  // a stage's layers
    const bool cpu_auto = problem.cpu_device && space.offload.size() > 1;
    for (OffloadMode mode : space.offload) {
      if (mode == OffloadMode::kNone) continue;
      // On CPU ranks "offload" moves nothing anywhere useful (device memory is host memory),
      // so it is planned only when asked for, to test the engine. Elsewhere offload variants
      // are always evaluated, even when the plain configuration fits: skipping them would make
      // the choice depend on feasibility, and more memory could then predict a slower plan.
      if (cpu_auto) continue;
      c.offload = mode;
      // The window inside stages streams each stage's layers, 1F1B; with virtual stages each
      // chunk its own through its own slots — searched where the job asks for virtual stages
      // (the interleaved schedule runs a chunk's sweeps back to back, and each such sweep
      // refetches its first slots: it seldom pays, docs/PLANNER.md §15).
      const std::vector<int64_t> window_stages =
          mode == OffloadMode::kWindow && c.pp > 1 && !space.virtual_stages.empty()
              ? virtual_stage_counts(c)
              : std::vector<int64_t>{c.virtual_stages};
      const int64_t entry_stages = c.virtual_stages;
      for (int64_t v : window_stages) {
        c.virtual_stages = v;
        std::vector<int64_t> cut_units;  // the gpuUnits a cutpoint may take, ascending
        for (int64_t k : gpu_unit_grid(c.tp, c.pp)) {
          if (mode == OffloadMode::kOptimizer) {
            if (k > L) {  // that is no offload
              note(Stage::kOffload, [&] {
                return "offload: optimizer with gpuUpdateFraction " + fraction() +
                       " updates every unit on the GPU: that is no offload";
              });
              continue;
            }
            c.gpu_units = k;
            c.window = 0;
            // The distributed optimizer composes with it: each DP rank offloads its shard.
            const auto& zeros = space.distributed_optimizer;
            const bool zero_optional = std::find(zeros.begin(), zeros.end(), false) != zeros.end();
            for (bool zero : zeros) {
              if (zero && c.dp == 1 && zero_optional) continue;  // nothing to shard
              c.distributed_optimizer = zero && c.dp > 1;
              // (each chunk its part of the units)
              if (plain) with_virtual_stages(c, virtual_stage_counts(c));
            }
            // Cutpoints, each segment its part of the units; the embeddings' on the device (the
            // workers sum them over every rank there).
            if (space.cutpoints && c.pp == 1 && k >= 1) cut_units.push_back(k);
            // Per-stage TP, each stage its first k units on the device (the embeddings' among
            // them: the end stages sum them there).
            if (space.cutpoints && space.stage_cuts && c.pp > 1 && k >= 1)
              for (bool zero : zeros) {
                c.distributed_optimizer = zero;
                stage_cut_variants(c, cut_tps);
              }
            c.distributed_optimizer = false;
            continue;
          }
          // Window: resident embeddings, at least one streamed layer, and recompute: the window
          // streams each layer's activation checkpoint, and without recompute there is none (the
          // worker refuses such a plan).
          if (c.recompute == Recompute::kNone) {
            if (space.recompute.size() == 1)  // forced: say so (else other recompute modes follow)
              note(Stage::kOffload, [] {
                return std::string(
                    "offload: window needs recompute full or commAware (it streams each layer's "
                    "activation checkpoint, and without recompute there is none)");
              });
            continue;
          }
          if (k < 1 || k > L) {
            note(Stage::kOffload, [&] {
              return "offload: window keeps the embeddings and streams at least one of the " +
                     std::to_string(L) + " layers, but gpuUpdateFraction " + fraction() +
                     " keeps " + std::to_string(k) + " of the " + std::to_string(L + 1) +
                     " units on the GPU (window mode derives the fraction from the window: leave "
                     "gpuUpdateFraction out)";
            });
            continue;
          }
          c.gpu_units = k;
          const int64_t streamed = L - (k - 1);
          // Cutpoints with the window: each segment streams its part of the layers past the
          // model's first gpuUnits units through slots of its own.
          const bool cuts = space.cutpoints && c.pp == 1 && c.virtual_stages == 1;
          // Per-stage TP with the window: each stage streams its layers past its first gpuUnits
          // units, each cut with its own largest window (from one slot, the leanest, for the
          // memory bound) or the forced one.
          auto stage_cuts = [&] {
            if (space.cutpoints && space.stage_cuts && c.pp > 1 && c.virtual_stages == 1)
              window_shardings(c, [&] {
                c.window = space.window ? *space.window : 1;
                stage_cut_variants(c, cut_tps);
              });
          };
          if (space.window) {
            if (*space.window >= streamed) {
              note(Stage::kOffload, [&] {
                return "offloadWindow " + std::to_string(*space.window) + " must be below the " +
                       std::to_string(streamed) +
                       " streamed layer(s) (a window that holds them all is optimizer offload)";
              });
              continue;
            }
            c.window = *space.window;
            if (plain) window_shardings(c, [&] { consider(c); });
            if (cuts) cut_units.push_back(k);
            stage_cuts();
            continue;
          }
          // Largest window that fits (memory grows with W; time never does). W = streamed
          // would keep every layer resident: that is optimizer offload, not a window.
          if (streamed < 2) {
            note(Stage::kOffload, [&] {
              return "offload: window streams " + std::to_string(streamed) + " of the " +
                     std::to_string(L) + " layers here" +
                     (space.gpu_update_fraction ? " (gpuUpdateFraction " + fraction() + ")"
                                                : std::string()) +
                     "; a window needs at least 2 streamed layers (window mode derives the "
                     "fraction from the window: leave gpuUpdateFraction out)";
            });
            continue;
          }
          if (plain)
            window_shardings(c, [&] {
              c.window = std::max<int64_t>(1, largest_window(c));  // (1: for the nearest miss)
              consider(c);
            });
          if (cuts) cut_units.push_back(k);  // each cut with its own largest window
          stage_cuts();
        }
        // The cutpoints of every gpuUnits at once (so that what one rules out spares the rest),
        // with offload optimizer sharded or not, the window unsharded.
        for (bool zero : mode == OffloadMode::kOptimizer ? space.distributed_optimizer
                                                         : std::vector<bool>{false}) {
          c.distributed_optimizer = zero;
          if (!cut_units.empty()) cutpoint_variants(c, cut_tps, cut_units);
        }
        c.distributed_optimizer = false;
      }
      c.virtual_stages = entry_stages;
    }
  }

  void run(int64_t max_nodes, int64_t slots) {
    const auto& m = problem.model;
    std::vector<int64_t> nodes = space.nodes;
    if (nodes.empty())
      for (int64_t n = std::max<int64_t>(1, space.min_nodes); n <= max_nodes; ++n)
        nodes.push_back(n);
    std::sort(nodes.rbegin(), nodes.rend());
    std::vector<int64_t> procs = space.procs_per_node;
    if (procs.empty()) {
      if (problem.cpu_device) {
        for (int64_t g = 1; g <= slots; ++g)
          if (slots <= 16 || (g & (g - 1)) == 0 || g == slots) procs.push_back(g);
      } else {
        procs.push_back(slots);  // like torchrun --nproc-per-node=auto: every free GPU
      }
    }
    std::sort(procs.rbegin(), procs.rend());
    // The plain optimizer is among the choices (then a DP 1 plan is not also tried "sharded").
    const auto& zeros = space.distributed_optimizer;
    const bool zero_optional = std::find(zeros.begin(), zeros.end(), false) != zeros.end();
    // Total training FLOPs of one step (forward + backward, no recompute): a lower bound on
    // any configuration's compute, divided evenly among the ranks.
    const double step_flops =
        3.0 * problem.global_batch *
        (m.layers * layer_forward_flops(m, 1, 1) + logits_forward_flops(m, 1, 1));

    for (int64_t n : nodes) {
      if (n > max_nodes) continue;
      for (int64_t g : procs) {
        if (g > slots || g < 1) continue;
        const int64_t world = n * g;
        std::vector<int64_t> tps, cut_tps;  // (a cutpoint's second degree: any valid one)
        for (int64_t t : divisors(g)) {
          if (m.heads % t || m.ffn_hidden % t || m.padded_vocab() % t) continue;
          cut_tps.push_back(t);
          if (!space.tp.empty() && !contains(space.tp, t)) continue;
          tps.push_back(t);
        }
        if (space.megatron_tp && !tps.empty()) tps = {tps.back()};
        if (tps.empty()) {
          note(Stage::kTensorParallel, [&] {
            return "no tensor-parallel degree" +
                   (space.tp.empty() ? std::string() : " in {" + list(space.tp) + "}") +
                   " divides the " + std::to_string(g) + " ranks per node, the " +
                   std::to_string(m.heads) + " heads, ffnHidden " + std::to_string(m.ffn_hidden) +
                   " and the padded vocabulary " + std::to_string(m.padded_vocab());
          });
          continue;
        }
        for (int64_t t : tps)
          for (int64_t pp : divisors(m.layers)) {
            if ((world / t) % pp) continue;
            if (!space.pp.empty() && !contains(space.pp, pp)) continue;
            const int64_t d = world / t / pp;
            if (!space.dp.empty() && !contains(space.dp, d)) {
              note(Stage::kDataParallel,
                   [&] { return dp_mismatch(nodes, procs, max_nodes, slots); });
              continue;
            }
            if (problem.global_batch % d) {
              note(Stage::kBatch, [&] {
                return "globalBatchSize " + std::to_string(problem.global_batch) +
                       " is not divisible by the data-parallel degree " + std::to_string(d);
              });
              continue;
            }
            ParallelConfig c;
            c.nodes = n;
            c.procs_per_node = g;
            c.tp = t;
            c.pp = pp;
            c.dp = d;
            if (result.best) {
              const double lower_bound = step_flops / world / rank_flops_per_second(problem, c);
              if (lower_bound >= result.best->eval.predicted.step_seconds) continue;
            }
            const int64_t per_rank = problem.global_batch / d;
            if (!space.micro_batch.empty() && per_rank % space.micro_batch[0])
              note(Stage::kMicroBatch, [&] {
                return "microBatchSize " + list(space.micro_batch) + " does not divide the " +
                       std::to_string(per_rank) + " sequences per data-parallel rank";
              });
            for (int64_t b : divisors(per_rank)) {
              if (!space.micro_batch.empty() && !contains(space.micro_batch, b)) continue;
              c.micro_batch = b;
              c.grad_accum = per_rank / b;
              for (Recompute rc : space.recompute) {
                c.recompute = rc;
                for (int64_t sb : space.sub_batches) {
                  if (sb == 2 && b % 2) continue;
                  if (sb == 2 && t == 1 && space.sub_batches.size() > 1)
                    continue;  // nothing to hide
                  c.sub_batches = sb;
                  // Every offload mode's step is at least the schedule's micro-batches, each
                  // at least its forward and backward (evaluate: the step ends after them), so
                  // when that floor is no faster than the best plan, none of this shape's
                  // variants can be (a cutpoint's segments are timed apart: not bounded here).
                  // (With virtual stages the bubble shrinks to (pp − 1)/v_max of a micro-batch.)
                  const std::vector<int64_t> interleave = virtual_stage_counts(c);
                  const bool floor_slower = [&] {
                    if (!result.best || space.cutpoints_only) return false;
                    const MicroBatchTiming& mt = timing(c);
                    const double v_max =
                        interleave.empty() ? 1.0 : static_cast<double>(interleave.back());
                    return (static_cast<double>(c.grad_accum) +
                            static_cast<double>(pp - 1) / v_max) *
                               (mt.forward + mt.backward) >=
                           result.best->eval.predicted.step_seconds;
                  }();
                  if (floor_slower && !space.cutpoints) continue;
                  if (contains_mode(OffloadMode::kNone)) {
                    c.offload = OffloadMode::kNone;
                    c.gpu_units = m.layers / pp + 1;
                    c.window = 0;
                    for (bool zero : space.distributed_optimizer) {
                      if (zero && d == 1 && zero_optional) continue;  // nothing to shard
                      c.distributed_optimizer = zero && d > 1;
                      if (!space.cutpoints_only && !floor_slower)
                        with_virtual_stages(c, interleave);
                    }
                    c.distributed_optimizer = false;
                    // Cutpoints, sharded or not (a cutpoint's two degrees differ, so one of its
                    // segments always has data parallelism to shard over).
                    if (space.cutpoints && pp == 1)
                      for (bool zero : space.distributed_optimizer) {
                        c.distributed_optimizer = zero;
                        cutpoint_variants(c, cut_tps, {c.gpu_units});
                      }
                    // Per-stage TP (a cut between stages).
                    if (space.cutpoints && pp > 1 && space.stage_cuts)
                      for (bool zero : space.distributed_optimizer) {
                        c.distributed_optimizer = zero;
                        stage_cut_variants(c, cut_tps);
                      }
                    c.distributed_optimizer = false;
                  }
                  // Offload plans each stage's units alike (a stage keeps its first gpuUnits
                  // on the device); a cutpoint's segments each their part of the model's.
                  if (!floor_slower || space.cutpoints)
                    offload_variants(c, cut_tps, !space.cutpoints_only && !floor_slower);
                }
              }
            }
          }
      }
    }
  }

  // Why the space may be empty: the first reason met is kept. Lazy (`reason` is called only for
  // the first): most of 10,000 node counts are refused, and building every string dominated.
  // Why the forced dataParallel fits no shape the search may take, and the degrees that would:
  // a plan's ranks are the nodes it uses times the ranks per node (every free GPU of a node; on
  // CPU nodes the counts tried), so only some products of TP and DP exist.
  std::string dp_mismatch(const std::vector<int64_t>& nodes, const std::vector<int64_t>& procs,
                          int64_t max_nodes, int64_t slots) const {
    const auto& m = problem.model;
    const int64_t wanted = space.dp[0];
    std::set<int64_t> fitting;        // dataParallel degrees some shape gives
    std::set<int64_t> tp_for_wanted;  // tensorParallel degrees that give `wanted`
    std::set<int64_t> worlds;
    for (int64_t n : nodes) {
      if (n > max_nodes) continue;
      for (int64_t g : procs) {
        if (g > slots || g < 1) continue;
        worlds.insert(n * g);
        for (int64_t t : divisors(g)) {
          if (m.heads % t || m.ffn_hidden % t || m.padded_vocab() % t) continue;
          if (!space.tp.empty() && !contains(space.tp, t)) continue;
          fitting.insert(n * g / t);
          if (n * g / t == wanted) tp_for_wanted.insert(t);
        }
      }
    }
    const auto join = [](const std::set<int64_t>& v, std::size_t at_most) {
      std::string out;
      std::size_t k = 0;
      for (int64_t x : v) {
        if (k++ == at_most) return out + ", ...";
        out += (out.empty() ? "" : ", ") + std::to_string(x);
      }
      return out;
    };
    std::string why = "dataParallel " + list(space.dp) + " fits no shape: a plan's ranks are " +
                      "its nodes times " +
                      (problem.cpu_device ? std::string("the ranks per node tried")
                                          : std::string("every free GPU of a node")) +
                      " (" + join(worlds, 8) + " here), each divided by its tensorParallel";
    if (!space.tp.empty()) why += " {" + list(space.tp) + "}";
    if (!problem.cpu_device) why += " (resources.gpusPerNode sets the GPUs per node)";
    if (!tp_for_wanted.empty())
      return why + "; tensorParallel " + join(tp_for_wanted, 4) + " would give dataParallel " +
             std::to_string(wanted);
    if (fitting.empty()) return why;
    // The nearest degrees that fit, below and above.
    std::set<int64_t> nearest;
    const auto above = fitting.lower_bound(wanted);
    if (above != fitting.end()) nearest.insert(*above);
    if (above != fitting.begin()) nearest.insert(*std::prev(above));
    return why + "; the nearest dataParallel that fits: " + join(nearest, 2);
  }

  // Why a part of the space was empty, kept for when nothing at all is: the reason of the
  // candidate that got furthest (a shape that failed only at its offload says more than the first
  // node count tried, whose batch did not divide). Stages in search order.
  enum class Stage { kTensorParallel, kDataParallel, kBatch, kMicroBatch, kOffload };
  template <typename Reason>
  void note(Stage stage, const Reason& reason) {
    if (!result.empty_reason.empty() && stage <= noted_stage_) return;
    result.empty_reason = reason();
    noted_stage_ = stage;
  }
  Stage noted_stage_ = Stage::kTensorParallel;

  static std::string list(const std::vector<int64_t>& v) {
    std::string out;
    for (int64_t x : v) out += (out.empty() ? "" : ", ") + std::to_string(x);
    return out;
  }

  bool contains_mode(OffloadMode mode) const {
    return std::find(space.offload.begin(), space.offload.end(), mode) != space.offload.end();
  }
};

}  // namespace

std::string kind_of(const ParallelConfig& c) {
  return "tp" + std::to_string(c.tp) + (c.pp > 1 ? "pp" + std::to_string(c.pp) : "") +
         (c.virtual_stages > 1 ? "v" + std::to_string(c.virtual_stages) : "") +
         (c.cut_layer > 0 ? "cut" + std::to_string(c.cut_tp) : "") +
         (c.sub_batches == 2 ? "+overlap" : "") + "/" + std::string(api::to_string(c.recompute)) +
         (c.offload == api::OffloadMode::kNone ? "" : "/offload");
}

SearchResult search(const Problem& problem, int64_t max_nodes, int64_t slots_per_node,
                    const SearchSpace& space) {
  Searcher s{problem, space, {}, {}, {}, {}, {}, false, {}, {}, {}};
  s.run(max_nodes, slots_per_node);
  return std::move(s.result);
}

}  // namespace kt::planner

// Exhaustive search over parallel configurations (docs/PLANNER.md §9), pruned only where provably
// safe: (1) a configuration whose compute-only lower bound is already slower than the best
// feasible plan is skipped; (2) in window mode the largest window that fits is taken, because
// more slots never add time (they only relax the prefetch constraints) and memory grows with W.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "planner/cost_model.h"

namespace kt::planner {

// What the search may choose. Empty vectors mean "auto": every valid value.
struct SearchSpace {
  std::vector<int64_t> nodes;           // candidates for the number of nodes
  int64_t min_nodes = 1;                // fewest nodes (spec.resources.minNodes)
  std::vector<int64_t> procs_per_node;  // ranks per node
  std::vector<int64_t> tp, dp, micro_batch;
  // Pipeline stages and the distributed optimizer: by default none (the planner widens the
  // space to every stage count that divides the layers, and ZeRO-1, only when nothing without
  // them fits; planner.cpp). Empty pp: every valid count.
  std::vector<int64_t> pp{1};
  // Virtual stages per pipeline stage (the interleaved schedule), where stages are planned
  // without offload or with offload optimizer and the micro-batches are a multiple of the stages:
  // empty, every count that divides a stage's layers; else the ones listed (1: none).
  std::vector<int64_t> virtual_stages;
  std::vector<bool> distributed_optimizer{false};
  // Oases' cutpoints (the layers from cut_layer on at TP cut_tp): none by default (widened like
  // pipelines where nothing else fits; planner.cpp); with `cutpoints`, every layer and every TP
  // degree that nests with the plan's — or the forced cut_layer / cut_tp (0: any), and then
  // only plans with a cutpoint. Without stages with or without offload and the distributed
  // optimizer; with stages at a stage boundary (per-stage TP), likewise.
  bool cutpoints = false;
  bool cutpoints_only = false;
  int64_t cut_layer = 0, cut_tp = 0;
  // Prune cutpoints only where provably nothing is lost (search.cpp); false: evaluate every one
  // (tests compare the two).
  bool prune_cutpoints = true;
  // Per-stage TP (a cutpoint between pipeline stages): searched with the cutpoints; false: only
  // cuts without stages (tests compare).
  bool stage_cuts = true;
  std::vector<int64_t> sub_batches{1, 2};
  std::vector<Recompute> recompute{Recompute::kNone, Recompute::kCommAware, Recompute::kFull};
  std::vector<api::OffloadMode> offload{api::OffloadMode::kNone, api::OffloadMode::kOptimizer,
                                        api::OffloadMode::kWindow};
  std::optional<double> gpu_update_fraction;  // forced f (else 0, 0.05, ..., 1)
  std::optional<int64_t> window;              // forced W (else the largest that fits)
  bool megatron_tp = false;  // tp = the largest valid degree that divides procs_per_node
  std::string exclude_kind;  // skip plans of this kind (to find the runner-up)
};

struct Candidate {
  ParallelConfig config;
  Evaluation eval;
};

struct SearchResult {
  std::optional<Candidate> best;          // fastest that fits
  std::optional<Candidate> nearest_miss;  // smallest memory overshoot (memory figures only)
  int64_t evaluated = 0;
  std::string empty_reason;  // when nothing was evaluated: why the furthest candidate was not
};

// `max_nodes`: nodes of the group usable. `slots_per_node`: free GPUs (or cores) per node.
SearchResult search(const Problem& problem, int64_t max_nodes, int64_t slots_per_node,
                    const SearchSpace& space);

// The kind of a plan, for finding a runner-up that differs in substance: TP degree, overlap,
// recompute, and whether anything is offloaded.
std::string kind_of(const ParallelConfig& c);

}  // namespace kt::planner

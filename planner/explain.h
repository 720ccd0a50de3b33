// Human-readable descriptions of plans: a one-line configuration, and the explanation lines
// (what binds, why the winner beats the runner-up, how it compares with the baselines).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "api/plan.h"
#include "planner/search.h"

namespace kt::planner {

// "TP 4 × DP 8, micro-batch 2 × 8, overlap on, recompute commAware, offload none"
std::string describe_config(const ParallelConfig& c);
// "needs 93.1 GiB per GPU with the best plan (…); nodes have 80.0 GiB"
std::string describe_miss(const Candidate& miss, bool cpu_device);

std::vector<std::string> explain(const Candidate& chosen, const std::string& hardware,
                                 bool cpu_device,
                                 const std::optional<Candidate>& fastest_any_memory,
                                 const std::optional<Candidate>& runner_up,
                                 const std::vector<api::Alternative>& alternatives);

}  // namespace kt::planner

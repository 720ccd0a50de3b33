// The planner: from a TrainingJob and the cluster's inventory to the fastest feasible Plan,
// with the baselines evaluated by the same cost model and an explanation of the choice.
#pragma once

#include "api/inventory.h"
#include "api/plan.h"
#include "api/training_job.h"

namespace kt::planner {

// Throws kt::Error (or kt::FieldError for a hint that cannot be honoured) when no plan fits;
// the message names the nearest miss ("needs 93.1 GiB per GPU with the best plan; nodes have
// 80.0 GiB").
api::Plan best_plan(const api::TrainingJob& job, const api::Inventory& inventory);

}  // namespace kt::planner

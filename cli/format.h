// Text renderings of plans for `kubetrain plan -o table`.
#pragma once

#include <string>

#include "api/plan.h"

namespace kt::cli {

std::string format_plan_table(const api::Plan& plan, const std::string& cluster);

}  // namespace kt::cli

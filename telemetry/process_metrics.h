// The process collector every Prometheus client library ships (client_golang's, client_python's):
// process_cpu_seconds_total, process_resident_memory_bytes, process_virtual_memory_bytes,
// process_start_time_seconds, process_open_fds, process_max_fds, read from /proc when scraped;
// and kubetrain_build_info{component, version} = 1, so that a dashboard can say which version
// runs where.
#pragma once

#include <string>

#include "telemetry/metrics.h"

namespace kt::telemetry {

void add_process_metrics(Registry& registry, const std::string& component,
                         const std::string& version);

}  // namespace kt::telemetry

// Merging several Prometheus text expositions (format 0.0.4) into one, for a pod that serves
// one /metrics for all of its ranks (docs/WORKER.md, "Processes"): each rank's text already carries
// its own rank="N" label, so the merge only has to regroup the lines. Concatenating the texts would
// not do: a family may have only one HELP and one TYPE, and its samples must be contiguous.
#pragma once

#include <string>
#include <vector>

namespace kt::telemetry {

// One exposition with one HELP/TYPE per family (the first text that has one wins), all samples
// of a family together in the order of `texts`, families sorted by name. A histogram's or
// summary's _bucket/_sum/_count samples belong to its base family. A sample without a TYPE
// becomes an untyped family of its own; a series repeated verbatim (same name and labels) in a
// later text is dropped, as an exposition may not repeat one. Other comments are dropped.
std::string merge_expositions(const std::vector<std::string>& texts);

}  // namespace kt::telemetry

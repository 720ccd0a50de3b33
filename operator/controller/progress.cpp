#include "operator/controller/progress.h"

#include <cmath>
#include <cstdlib>
#include <optional>
#include <sstream>

namespace kt::controller {

namespace {

// The value of the label `key` (exactly: `rank`, not `node_rank`), if there is one.
std::optional<std::string> label_value(const std::string& labels, const std::string& key) {
  const std::string pattern = key + "=\"";
  for (size_t at = labels.find(pattern); at != std::string::npos;
       at = labels.find(pattern, at + 1)) {
    if (at != 0 && labels[at - 1] != ',') continue;
    const size_t start = at + pattern.size();
    const size_t end = labels.find('"', start);
    if (end == std::string::npos) return std::nullopt;
    return labels.substr(start, end - start);
  }
  return std::nullopt;
}

// map[label] += value, within the bounds of parse_worker_progress.
void add_labelled(std::map<std::string, double>& map, const std::string& label, double value) {
  if (label.size() > kMaxProgressLabelBytes) return;
  const auto it = map.find(label);
  if (it != map.end()) {
    if (std::isfinite(it->second + value)) it->second += value;
  } else if (map.size() < kMaxProgressLabels) {
    map.emplace(label, value);
  }
}

}  // namespace

WorkerProgress parse_worker_progress(const std::string& exposition) {
  WorkerProgress out;
  std::istringstream in(exposition);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    // name{labels} value [timestamp]
    const size_t brace = line.find('{');
    const size_t space = line.find(' ');
    std::string name, labels;
    size_t value_start;
    if (brace != std::string::npos && brace < space) {
      const size_t close = line.find('}', brace);
      if (close == std::string::npos) continue;
      name = line.substr(0, brace);
      labels = line.substr(brace + 1, close - brace - 1);
      value_start = close + 1;
    } else {
      if (space == std::string::npos) continue;
      name = line.substr(0, space);
      value_start = space;
    }
    // Rank 0 only: the pod's merged /metrics carries every local rank.
    if (const auto rank = label_value(labels, "rank"); rank && *rank != "0") continue;
    const char* text = line.c_str() + value_start;
    char* end = nullptr;
    const double value = std::strtod(text, &end);
    if (end == text || !std::isfinite(value)) continue;
    if (name == "kubetrain_worker_steps_total")
      out.steps = value;
    else if (name == "kubetrain_worker_step")
      out.step = value;
    else if (name == "kubetrain_worker_phase_seconds_total")
      add_labelled(out.phase_seconds, label_value(labels, "phase").value_or(""), value);
    else if (name == "kubetrain_worker_loss")
      out.loss = value;
    else if (name == "kubetrain_worker_tokens_per_second")
      out.tokens_per_second = value;
    else if (name == "kubetrain_worker_last_checkpoint_step")
      out.last_checkpoint_step = value;
    else if (name == "kubetrain_worker_checkpoint_consecutive_failures")
      out.checkpoint_consecutive_failures = value;
    else if (name == "kubetrain_worker_checkpoint_failures_total")
      add_labelled(out.checkpoint_failures, label_value(labels, "reason").value_or(""), value);
  }
  return out;
}

}  // namespace kt::controller

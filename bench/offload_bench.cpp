// One offloaded training step on a small model, lane by lane: the busy intervals of the compute
// lane (the caller's thread), host→device and device→host copies and the CPU optimizer pool, as
// a text timeline, with the fraction of copy and CPU-optimizer time that overlaps compute. Runs
// optimizer offload (half the parameters updated on the CPU) and a window of 2 over 6 streamed
// layers. Usage: bench_offload [steps]   (default 6; the last step is shown)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "api/inventory.h"
#include "api/training_job.h"
#include "api/yaml_json.h"
#include "planner/planner.h"
#include "worker/offload.h"
#include "worker/trainer.h"

namespace {

kt::api::Plan plan_for(const std::string& parallelism, int steps) {
  const std::string job =
      "apiVersion: kubetrain.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: bench}\nspec:\n"
      "  model: {layers: 8, hidden: 256, heads: 4, ffnHidden: 1024, vocab: 4096, seqLen: 128}\n"
      "  training: {steps: " + std::to_string(steps) + ", globalBatchSize: 8, microBatchSize: 4}\n"
      "  resources: {gpusPerNode: 1}\n"
      "  parallelism: {" + parallelism + "}\n";
  const auto inventory = kt::api::decode_inventory(kt::api::yaml_to_json(
      "kind: Inventory\nnodes:\n- name: box\n  cpu: {cores: 2}\n  memory: 16Gi\n", "inventory"));
  return kt::planner::best_plan(kt::api::decode_training_job(kt::api::yaml_to_json(job, "job")),
                                inventory);
}

// Union length of intervals, and of their intersection with `cover`.
double busy(std::vector<std::pair<double, double>> v) {
  std::sort(v.begin(), v.end());
  double total = 0, end = -1e30;
  for (auto [a, b] : v) {
    if (b <= end) continue;
    total += b - std::max(a, end);
    end = b;
  }
  return total;
}
double overlapped(const std::vector<std::pair<double, double>>& v,
                  const std::vector<std::pair<double, double>>& cover) {
  std::vector<std::pair<double, double>> both;
  for (auto [a, b] : v)
    for (auto [c, d] : cover)
      if (std::max(a, c) < std::min(b, d)) both.emplace_back(std::max(a, c), std::min(b, d));
  return busy(both);
}

void show(const std::string& title, const std::string& parallelism, int steps) {
  const kt::api::Plan plan = plan_for(parallelism, steps);
  std::vector<kt::worker::LaneSpan> last;
  kt::worker::TrainOptions options;
  options.log_every = 0;
  std::vector<double> step_seconds;
  options.on_step = [&](const kt::worker::StepReport& r) { step_seconds.push_back(r.seconds); };
  options.on_timeline = [&](int64_t, const std::vector<kt::worker::LaneSpan>& spans) {
    last = spans;
  };
  kt::worker::train(plan, options, [](const std::string&) {});
  std::map<std::string, std::vector<std::pair<double, double>>> lanes;
  double t0 = 1e30, t1 = 0;
  for (const auto& s : last) {
    lanes[s.lane].emplace_back(s.start, s.end);
    t0 = std::min(t0, s.start);
    t1 = std::max(t1, s.end);
  }
  std::printf("\n%s — plan %s: offload %s, gpuUnits %lld of %lld, window %lld, recompute %s\n",
              title.c_str(), plan.plan_hash.c_str(), std::string(kt::api::to_string(plan.config.offload)).c_str(),
              static_cast<long long>(plan.config.gpu_units),
              static_cast<long long>(plan.model.layers + 1),
              static_cast<long long>(plan.config.window),
              std::string(kt::api::to_string(plan.config.recompute)).c_str());
  std::printf("predicted PCIe bytes/step %.0f; step %.1f ms (last of %d)\n",
              plan.predicted.pcie_bytes_per_step, step_seconds.back() * 1e3, steps);
  const int width = 96;
  const double span = std::max(1e-9, t1 - t0);
  for (const char* lane : {"compute", "h2d", "d2h", "cpu-optimizer"}) {
    std::string row(width, '.');
    for (auto [a, b] : lanes[lane]) {
      const int from = static_cast<int>((a - t0) / span * width);
      const int to = std::max(from + 1, static_cast<int>((b - t0) / span * width));
      for (int i = from; i < std::min(to, width); ++i) row[i] = '#';
    }
    std::printf("  %-14s|%s| %7.2f ms busy\n", lane, row.c_str(), busy(lanes[lane]) * 1e3);
  }
  std::vector<std::pair<double, double>> offload;
  for (const char* lane : {"h2d", "d2h", "cpu-optimizer"})
    offload.insert(offload.end(), lanes[lane].begin(), lanes[lane].end());
  const double off = busy(offload);
  std::printf("  timeline %.2f ms; copies + CPU AdamW busy %.2f ms, of which %.2f ms (%.0f %%) "
              "overlap compute\n",
              span * 1e3, off * 1e3, overlapped(offload, lanes["compute"]) * 1e3,
              off > 0 ? 100 * overlapped(offload, lanes["compute"]) / off : 0.0);
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::max(2, std::atoi(argv[1])) : 6;
  std::printf("bench_offload: one step's lanes (# busy), 8 layers h=256, micro-batch 4 × 2\n");
  show("optimizer offload", "offload: optimizer, gpuUpdateFraction: 0.5", steps);
  show("window offload", "offload: window, offloadWindow: 2, gpuUpdateFraction: 0.2, recompute: full",
       steps);
  return 0;
}

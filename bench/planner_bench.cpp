// Planner benchmark: planning time (median of repeated runs) for three jobs of growing size.
// Usage: bench_planner [repetitions]   (default 21)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "api/error.h"
#include "api/inventory.h"
#include "api/training_job.h"
#include "api/yaml_json.h"
#include "planner/planner.h"

namespace {

kt::api::TrainingJob job(const std::string& model, int64_t global_batch) {
  return kt::api::decode_training_job(kt::api::yaml_to_json(
      "apiVersion: kubetrain.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: bench}\nspec:\n"
      "  model: " +
      model + "\n  training: {steps: 1000, globalBatchSize: " + std::to_string(global_batch) +
      "}\n"));
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 21;
  const std::string root = KT_SOURCE_DIR;
  struct Case {
    const char* name;
    kt::api::TrainingJob job;
    const char* cluster;
  };
  // GPT-3 175B (Brown et al. 2020): 96 layers, h 12288, 96 heads, s 2048; 1536 sequences/step.
  std::vector<Case> cases = {
      {"gpt2-124m on h200-single", job("{preset: gpt2-124m}", 512), "h200-single"},
      {"gpt-7b on 3090x32-pcie", job("{preset: gpt-7b}", 512), "3090x32-pcie"},
      {"175B on 128 x 8 H100",
       job("{layers: 96, hidden: 12288, heads: 96, vocab: 50257, seqLen: 2048}", 1536),
       "h100x1024"},
  };
  const auto run = [&](const Case& c, const kt::api::Inventory& inv) {
    std::vector<double> ms;
    std::string result;
    for (int i = 0; i < reps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        const auto plan = kt::planner::best_plan(c.job, inv);
        char buf[160];
        std::snprintf(buf, sizeof buf, "tp%lld pp%lld dp%lld%s mb%lld sb%lld %s/%s, %.0f tokens/s",
                      static_cast<long long>(plan.config.tp),
                      static_cast<long long>(plan.config.pp),
                      static_cast<long long>(plan.config.dp),
                      plan.config.distributed_optimizer ? " zero1" : "",
                      static_cast<long long>(plan.config.micro_batch),
                      static_cast<long long>(plan.config.sub_batches),
                      std::string(kt::api::to_string(plan.config.recompute)).c_str(),
                      std::string(kt::api::to_string(plan.config.offload)).c_str(),
                      plan.predicted.tokens_per_second);
        result = buf;
      } catch (const kt::Error& e) {
        result = std::string("infeasible: ") + e.what();
      }
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    std::printf("%-28s %12.2f %12.2f %12.2f  %s\n", c.name, ms[ms.size() / 2], ms.front(),
                ms.back(), result.substr(0, 160).c_str());
  };
  std::printf("%-28s %12s %12s %12s  %s\n", "case", "median ms", "min ms", "max ms", "result");
  // The same 1,024 H100s with 4 TiB of host memory per node, where window offload makes 175 B
  // fit without pipeline parallelism: the search then also runs the timing simulations.
  cases.push_back({"175B on 128 x 8 H100, 4Ti", cases.back().job, ""});
  // What the operator plans for each job of bench_operator's burst: one 8-GPU node of 10,000
  // (the planner walks every node to group them, then searches node counts up to maxNodes).
  cases.push_back(
      {"gpt2-124m, 1 of 10,000 nodes",
       kt::api::decode_training_job(kt::api::yaml_to_json(
           "apiVersion: kubetrain.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: bench}\n"
           "spec:\n  model: {preset: gpt2-124m}\n  training: {steps: 100, globalBatchSize: 32}\n"
           "  resources: {maxNodes: 1, gpusPerNode: 8}\n"
           "  parallelism: {tensorParallel: 1, dataParallel: 8}\n")),
       "10k"});
  for (auto& c : cases) {
    if (std::string(c.cluster) == "10k") {
      run(c, kt::api::inventory_from_document(
                 kt::api::yaml_to_json("kind: Inventory\nnodes:\n- name: sim\n  replicas: 10000\n"
                                       "  gpu: {product: NVIDIA-H100-80GB-HBM3, count: 8}\n"
                                       "  cpu: {cores: 112}\n  memory: 2Ti\n"),
                 "h100x10000"));
      continue;
    }
    const auto inv =
        *c.cluster
            ? kt::api::load_inventory(root + "/examples/clusters/" + c.cluster + ".yaml")
            : kt::api::inventory_from_document(
                  kt::api::yaml_to_json("kind: Inventory\nnodes:\n- name: dgx\n  replicas: 128\n"
                                        "  gpu: {product: NVIDIA-H100-80GB-HBM3, count: 8}\n"
                                        "  cpu: {cores: 112}\n  memory: 4Ti\n"),
                  "h100x1024-4Ti");
    run(c, inv);
  }
  return 0;
}

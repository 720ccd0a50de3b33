// The Oases overlap on this machine: 2 rank processes × 1 thread, TP = 2 over Gloo on loopback,
// one micro-batch forward + backward of a GPT whose compute and all-reduce times are comparable,
// overlap off (1 sub-batch) vs on (2 sub-batches). Beside each, the planner's prediction for the
// same Plan. Usage: bench_overlap [steps]   (default 10 timed steps after 3 warm-up steps)
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "api/inventory.h"
#include "api/training_job.h"
#include "api/yaml_json.h"
#include "planner/planner.h"
#include "worker/comm.h"
#include "worker/gpt.h"

namespace {

constexpr int64_t kLayers = 4, kHidden = 128, kHeads = 4, kFfn = 512, kVocab = 512, kSeq = 128;
constexpr int64_t kBatch = 8;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

kt::api::Plan predicted(bool overlap) {
  const std::string job =
      "apiVersion: kubetrain.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: bench}\nspec:\n"
      "  model: {layers: " + std::to_string(kLayers) + ", hidden: " + std::to_string(kHidden) +
      ", heads: " + std::to_string(kHeads) + ", ffnHidden: " + std::to_string(kFfn) +
      ", vocab: " + std::to_string(kVocab) + ", seqLen: " + std::to_string(kSeq) + "}\n" +
      "  training: {steps: 10, globalBatchSize: " + std::to_string(kBatch) +
      ", microBatchSize: " + std::to_string(kBatch) + "}\n" +
      "  parallelism: {tensorParallel: 2, recompute: none, offload: none, overlap: " +
      (overlap ? "on" : "off") + "}\n";
  const auto inventory = kt::api::inventory_from_document(
      kt::api::yaml_to_json("kind: Inventory\nnodes:\n- name: here\n  cpu: {cores: 2}\n"
                            "  memory: 24Gi\n"),
      "here");
  return kt::planner::best_plan(kt::api::decode_training_job(kt::api::yaml_to_json(job)),
                                inventory);
}

int run_rank(int rank, int port, int steps) {
  omp_set_num_threads(1);
  kt::worker::RendezvousConfig config;
  config.master_port = port;
  config.rank = rank;
  config.world_size = 2;
  config.job_id = "bench-overlap";
  auto groups = kt::worker::connect_process_groups(config, 2, 1);
  const kt::worker::GptConfig model{kSeq, kVocab, kVocab, kLayers, kHeads, kHidden, kFfn};
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> tok(0, kVocab - 1);
  std::vector<int32_t> x(kBatch * kSeq), y(kBatch * kSeq);
  for (auto& t : x) t = tok(rng);
  for (auto& t : y) t = tok(rng);
  if (rank == 0)
    std::printf("%-12s %10s %12s %12s %9s   %s\n", "overlap", "step ms", "TP comm ms",
                "exposed ms", "hidden", "planner: step ms, TP comm ms, exposed ms, hidden");
  for (int sub_batches : {1, 2}) {
    kt::worker::Gpt gpt(model, kBatch, kSeq, kt::worker::Device::cpu(),
                        {rank, 2, groups.tp.get()}, sub_batches);
    gpt.init_weights(3);
    std::vector<double> step, comm, exposed;
    for (int i = 0; i < steps + 3; ++i) {
      const auto before = groups.tp->stats();
      const auto t0 = std::chrono::steady_clock::now();
      gpt.zero_grad();
      gpt.train_micro_step(x.data(), y.data(), 1.0f);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const auto after = groups.tp->stats();
      if (i < 3) continue;
      step.push_back(seconds);
      comm.push_back(after.seconds - before.seconds);
      exposed.push_back(after.exposed_seconds - before.exposed_seconds);
    }
    if (rank == 0) {
      const auto plan = predicted(sub_batches == 2);
      const auto& p = plan.predicted.time;
      const double fb = p.compute + p.tp_comm_exposed;  // forward+backward of the one micro-batch
      std::printf("%-12s %10.2f %12.2f %12.2f %8.0f%%   %.2f, %.2f, %.2f, %.0f%%\n",
                  sub_batches == 2 ? "on (2 sub)" : "off", 1e3 * median(step),
                  1e3 * median(comm), 1e3 * median(exposed),
                  100 * (1 - median(exposed) / median(comm)), 1e3 * fb, 1e3 * p.tp_comm_total,
                  1e3 * p.tp_comm_exposed, 100 * (1 - p.tp_comm_exposed / p.tp_comm_total));
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::max(3, std::atoi(argv[1])) : 10;
  std::printf("TP=2 over Gloo/loopback, 2 processes x 1 thread; model L=%lld h=%lld heads=%lld "
              "ffn=%lld V=%lld T=%lld, micro-batch %lld; median of %d steps (fwd+bwd)\n",
              static_cast<long long>(kLayers), static_cast<long long>(kHidden),
              static_cast<long long>(kHeads), static_cast<long long>(kFfn),
              static_cast<long long>(kVocab), static_cast<long long>(kSeq),
              static_cast<long long>(kBatch), steps);
  std::fflush(stdout);
  const int port = 20000 + static_cast<int>(getpid() % 20000);
  pid_t children[2];
  for (int rank = 0; rank < 2; ++rank) {
    children[rank] = fork();
    if (children[rank] == 0) {
      try {
        std::exit(run_rank(rank, port, steps));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        std::exit(1);
      }
    }
  }
  int failed = 0;
  for (pid_t child : children) {
    int status = 0;
    waitpid(child, &status, 0);
    failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  }
  return failed;
}

// The training loop of one rank: executes a Plan on the rank's device (CPU or CUDA) — gradient
// accumulation to the global batch, global-norm clipping, linear warmup then cosine decay,
// AdamW — with checkpoints every intervalSteps and on SIGTERM, resume from the latest, and the
// worker metrics of docs/METRICS.md.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "api/plan.h"
#include "worker/comm.h"
#include "worker/tensor_view.h"

namespace kt::worker {

struct LaneSpan;  // worker/offload.h

// What one optimizer step did, for metrics and logs.
struct StepReport {
  int64_t step = 0;  // 1-based: steps completed
  int64_t total_steps = 0;
  double loss = 0;
  double learning_rate = 0;
  double grad_norm = 0;
  double seconds = 0;
  int64_t tokens = 0;
  double tokens_per_second = 0;
  double mfu = 0;  // model FLOPs / (seconds · peak of the rank's cores)
  std::string device = "cpu";        // where the model computes: "cpu", "cuda:1", …
  double optimizer_seconds = 0;      // AdamW on the device (the compute lane)
  double cpu_optimizer_seconds = 0;  // AdamW of CPU-updated units on the host pool
  int64_t h2d_bytes = 0;             // offload engine copies issued in this step
  int64_t d2h_bytes = 0;
  // The CPU offload engine's copy lanes in this step: busy seconds, and seconds the compute
  // waited for them (negative: not measured, as on CUDA so far).
  double transfer_seconds = -1;
  double exposed_transfer_seconds = -1;
  // Per group of more than one rank ("tp", "dp"): its communication since the run started (on
  // CUDA, "dp" includes the gradient reducer's), for the comm metrics.
  std::map<std::string, CommStats> comm;
};

// Where a run (one process's part of it) starts, for logs and metrics.
struct RunStart {
  int64_t resumed_from = 0;           // steps already done (0: a fresh start)
  std::optional<double> loss_floor;   // DataSource::loss_floor
};

struct TrainOptions {
  std::string checkpoint_dir;  // empty: no checkpoints
  std::string init_from_llmc;  // start from an llm.c model file (ignored when resuming)
  int log_every = 1;           // print a progress line every N steps
  std::function<void(const RunStart&)> on_start;                        // optional
  std::function<void(const StepReport&)> on_step;                       // optional
  std::function<void(int64_t step, double seconds)> on_checkpoint;      // optional
  // A save that failed (training goes on; the next interval saves again): `reason` names the
  // errno ("ENOSPC", "EROFS", "EACCES", …; "other" without one), `message` says what failed.
  std::function<void(int64_t step, const std::string& reason, const std::string& message)>
      on_checkpoint_failure;  // optional
  // How long rank 0 waits for the checkpoint directory's lock (CheckpointLock) before refusing.
  std::chrono::milliseconds checkpoint_lock_wait{10000};
  // Bytes in use by kind, per memory space ("cpu": the device; "host": the offload engine's).
  std::function<void(const std::string& device, const std::map<std::string, double>&)> on_memory;
  // This rank's process groups when the plan has more than one rank (kubetrain-worker connects
  // them from MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE; tests may pass in-process ones).
  ProcessGroups* groups = nullptr;
  // Called once at the end with this rank's parameters (for tests and exports).
  std::function<void(const std::vector<TensorView>& params)> on_finish;
  // The offload engine's per-lane busy intervals that ended during each step, including the tail
  // of the previous step's CPU AdamW and copies (for the benchmark); empty: none.
  std::function<void(int64_t step, const std::vector<LaneSpan>& spans)> on_timeline;
  // Host memory this node offers (0: MemAvailable); for tests of the refusal.
  int64_t host_memory_bytes = 0;
  // Fill evicted offloaded parameters with NaN, so that a read before they land shows in the
  // loss (always on in debug builds).
  bool poison_evicted = false;
};

// Throws kt::FieldError (path and value: "plan.offload.cpuThreads: 100000 is not in [1, 4096]")
// for a value the planner never emits: model dims outside api::resolve_model's checks, counts
// below 1, a TP degree that does not divide the heads, sizes whose per-rank memory overflows or
// (on the CPU) exceeds this machine's memory.
void check_plan_values(const api::Plan& plan);

// Throws kt::Error saying why this worker cannot execute the plan exactly as written (after
// check_plan_values). Ranks of a
// TP × DP plan, the Oases overlap, every recompute mode and every offload mode are supported on
// the CPU; window offload needs recompute (it streams activation checkpoints).
void check_executable(const api::Plan& plan);

// The learning rate at 0-based `step`: linear warmup over warmupSteps to learningRate, then a
// cosine decay to 10 % of it at the last step (GPT-3, Brown et al. 2020, Appendix B).
double learning_rate_at(const api::TrainingSpec& training, int64_t step);

struct TrainResult {
  int64_t steps_done = 0;
  double last_loss = 0;
  bool interrupted = false;    // stopped by SIGTERM/SIGINT after checkpointing
  int64_t checkpoint_failures = 0;  // saves that failed in this process
  std::string checkpoint_error;     // why the last save failed; empty when it succeeded
  std::vector<double> losses;  // per step run in this process
};

// Runs the plan to its last step (or until SIGTERM/SIGINT). Progress lines go to `log`.
TrainResult train(const api::Plan& plan, const TrainOptions& options,
                  const std::function<void(const std::string&)>& log);

// Install SIGTERM/SIGINT handlers that make train() checkpoint and return after the current step.
// Call it before starting any thread: it blocks the signals in the calling thread (so in the
// threads it starts later) and takes them on a thread of its own.
void install_stop_handlers();
// Ask a running train() to stop after the current step (what the handlers do; for tests).
void request_stop();

}  // namespace kt::worker

// What a run did, step by step, for the run report (`kubetrain report`, docs/OPERATIONS.md) and
// the measured phase metrics: PhaseMeter turns a StepReport into seconds per phase with the
// names of the plan's TimeBreakdown; StepLog appends one JSON object per line to
// `<checkpoint dir>/steps.jsonl` (rank 0), so the record lives as long as the checkpoints do and
// a restart appends to it.
//
//   {"kind":"start","time":…,"resumed_from":0,"total_steps":…,"plan_hash":…,"tp":…,"dp":…,
//    "recompute":…,"offload":…,"precision":…,"device":…,"predicted_step_seconds":…,
//    "predicted_tokens_per_second":…,"predicted_phase_seconds":{…},"loss_floor":… or null}
//   {"kind":"step","time":…,"step":…,"loss":…,"seconds":…,"tokens_per_second":…,"mfu":…,
//    "phase_seconds":{…}}
//   {"kind":"checkpoint","time":…,"step":…,"seconds":…}
//   {"kind":"checkpoint_failed","time":…,"step":…,"reason":"ENOSPC"}
//   {"kind":"end","time":…,"step":…,"how":"finished"|"signal"}
//
// time is Unix seconds. Each line is one write(2) with O_APPEND: a crash can tear only the last
// line, which readers skip. At most kMaxStepLines step lines per process (longer runs log every
// k-th step), so the file stays in the tens of MiB.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "api/plan.h"
#include "worker/comm.h"
#include "worker/trainer.h"

namespace kt::worker {

// The plan's predicted seconds per phase (TimeBreakdown), by the phase names below.
std::map<std::string, double> predicted_phase_seconds(const api::TimeBreakdown& time);

// Measured seconds per phase of each step: compute, tp_comm_total, tp_comm_exposed,
// dp_comm_total, dp_comm_exposed, optimizer_gpu (AdamW on the compute device), optimizer_cpu_total
// (the offload engine's host AdamW), and transfer_total, transfer_exposed where the offload
// engine measures its copies. compute is the rest of the step: its wall time less the exposed
// communication, the exposed transfers and the device optimizer.
class PhaseMeter {
 public:
  std::map<std::string, double> step(const StepReport& r);

 private:
  std::map<std::string, CommStats> last_;  // StepReport::comm is cumulative
};

class StepLog {
 public:
  static constexpr int64_t kMaxStepLines = 20000;

  // Appends to `path` (created if missing, with its directory). Throws kt::Error naming the file when it cannot be
  // opened; later write failures are reported once on stderr and the log goes quiet (training
  // never stops for it).
  explicit StepLog(const std::string& path);
  ~StepLog();
  StepLog(const StepLog&) = delete;
  StepLog& operator=(const StepLog&) = delete;

  void start(const api::Plan& plan, const RunStart& start);
  void step(const StepReport& r, const std::map<std::string, double>& phases);
  void checkpoint(int64_t step, double seconds);
  void checkpoint_failed(int64_t step, const std::string& reason);
  void end(int64_t step, bool finished);

 private:
  void write(const std::string& line);

  std::string path_;
  int fd_ = -1;
  bool failed_ = false;
  int64_t every_ = 1;  // log every k-th step
};

}  // namespace kt::worker

// The run report (`kubetrain report`, the end of `kubetrain run`; docs/OPERATIONS.md "The run
// report"): the rank-0 worker's step log, `<checkpoint dir>/steps.jsonl` (worker/step_log.h),
// read into records and drawn as one self-contained HTML page with inline SVG plots (loss per
// step, tokens/s against the plan's prediction, the step time by phase, checkpoints and restarts
// on the timeline) and a table of the job and its plan. No script, no network, no external file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kt::cli {

// The step log is outside data (a file on a volume that any process of the job can write), so
// reading it is bounded: a file over kMaxStepsFileBytes, a line over kMaxStepsLineBytes or more
// than kMaxStepsLines lines is refused. The worker writes at most 20000 step lines per process
// of a few hundred bytes each (worker/step_log.h), so these leave room for many restarts.
inline constexpr size_t kMaxStepsFileBytes = size_t{256} << 20;  // 256 MiB
inline constexpr size_t kMaxStepsLineBytes = size_t{16} << 10;   // 16 KiB
inline constexpr size_t kMaxStepsLines = 1'000'000;
// Also refused: strings over kMaxStepsTextBytes, more than kMaxPhases distinct phase names in the
// file, numbers beyond ±kMaxStepsNumber, steps beyond kMaxStepNumber.
inline constexpr size_t kMaxStepsTextBytes = 256;
inline constexpr size_t kMaxPhases = 32;
inline constexpr double kMaxStepsNumber = 1e15;
inline constexpr int64_t kMaxStepNumber = 1'000'000'000'000;

// Seconds per phase by index into RunRecords::phases; NaN where a record has no value (the
// writer writes a non-finite value as null).
using PhaseSeconds = std::vector<double>;

// {"kind":"start"}: a process of rank 0 began (the first one, or a restart).
struct StartRecord {
  size_t line = 0;
  double time = 0;  // Unix seconds
  int64_t resumed_from = 0;
  int64_t total_steps = 0;
  std::string plan_hash, recompute, offload, precision, device;
  int64_t tp = 1, dp = 1;
  int64_t pp = 1;                      // pipeline stages (absent in logs before them: 1)
  int64_t virtual_stages = 1;          // chunks per stage (absent before them: 1)
  bool distributed_optimizer = false;  // (absent before it: false)
  int64_t cut_layer = 0, cut_tp = 0;   // Oases' cutpoint (absent before it: none)
  std::optional<double> predicted_step_seconds, predicted_tokens_per_second;
  PhaseSeconds predicted_phase_seconds;
  std::optional<double> loss_floor;  // the synthetic data's entropy (nats), when known
};

// {"kind":"step"}: one optimizer step as rank 0 measured it.
struct StepRecord {
  size_t line = 0;
  size_t attempt = 0;  // index into RunRecords::starts of the process that wrote it
  double time = 0;
  int64_t step = 0;
  std::optional<double> loss, seconds, tokens_per_second, mfu;
  PhaseSeconds phase_seconds;
};

// {"kind":"checkpoint"} (saved: ok) and {"kind":"checkpoint_failed"} (reason: an errno name).
struct CheckpointRecord {
  size_t line = 0;
  size_t attempt = 0;
  double time = 0;
  int64_t step = 0;
  bool ok = true;
  std::optional<double> seconds;  // ok only
  std::string reason;             // failed only
};

// {"kind":"end"}: how: "finished" | "signal".
struct EndRecord {
  size_t line = 0;
  size_t attempt = 0;
  double time = 0;
  int64_t step = 0;
  std::string how;
};

struct RunRecords {
  std::string source;               // the file's path, for messages
  std::vector<std::string> phases;  // phase names, in the plan's TimeBreakdown order first
  std::vector<StartRecord> starts;  // starts[0] is the first process; every later one a restart
  std::vector<StepRecord> steps;    // in file order; a restart repeats earlier step numbers
  std::vector<CheckpointRecord> checkpoints;
  std::vector<EndRecord> ends;
  std::vector<std::string> warnings;  // a torn last line, records of an unknown kind
};

// Parses steps.jsonl text. Skips empty lines. Skips, with a warning: a last line that has no
// newline and is not JSON (its write was cut short: a crash, a full disk); the torn start of a
// line that a restarted worker's complete record follows; records of unknown kinds (a newer
// writer). Anything else malformed throws kt::Error "<source>:<line>: <what>", as do the bounds
// above and a record before the first start.
RunRecords parse_steps_log(std::string_view text, const std::string& source);

// Reads and parses the file (bounded before it is read). Throws kt::Error naming it.
RunRecords load_steps_log(const std::string& path);

// The latest record of each step number (a restart's steps replace the earlier ones), by step.
std::vector<const StepRecord*> latest_steps(const RunRecords& records);

// What a run says about its plan's phases (for `kubetrain plan --refit`): the last process's
// plan as predicted, and the median of each phase over its steps after the first quarter (the
// warm-up: allocation, first touches, caches).
struct RunPhases {
  std::string device;
  double predicted_step_seconds = 0;
  std::map<std::string, double> predicted, measured;  // seconds per step by phase name
  size_t steps = 0;                                   // the steps the medians are of
};
// Throws kt::Error naming the file when it holds no start record or no step after warm-up.
RunPhases run_phases(const RunRecords& records);

struct ReportOptions {
  std::string job;  // "namespace/name" or a name, for the title; empty: "(unknown job)"
};

// The whole HTML page: always four <svg> plots (with a "no data" note where there is nothing to
// draw), all text escaped. Requires at least one start record (kt::Error otherwise).
std::string render_report(const RunRecords& records, const ReportOptions& options);

// `kubetrain report <run-dir>`: the step log of a run directory. Accepts the work directory of
// `kubetrain run` (<dir>/checkpoints/steps.jsonl), a checkpoint directory (<dir>/steps.jsonl) or
// the file itself. Throws kt::Error saying where it looked.
std::string find_steps_log(const std::string& run_dir);

// Loads `steps_path`, renders it and writes `html_path` (through a temporary file and a rename,
// so a reader never sees half a report). Returns the loader's warnings. Throws kt::Error.
std::vector<std::string> write_report(const std::string& steps_path, const std::string& html_path,
                                      const ReportOptions& options);

// The end of `kubetrain run`: when `steps_path` exists, writes the report to `html_path` and
// prints "report: <path>" (warnings, or why there is none, go to stderr). Never throws: a run's
// outcome does not depend on its report.
void report_after_run(const std::string& steps_path, const std::string& html_path,
                      const std::string& job);

}  // namespace kt::cli

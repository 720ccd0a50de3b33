// `kubetrain run JOB.yaml` (docs/OPERATIONS.md §3): the job on this machine with no cluster. The
// same reconciler as in a cluster runs in-process against the local control plane (local:
// the Store, this machine as a Node, the pod runner as scheduler and kubelet). It prints the
// chosen plan, progress (a bar on a terminal, one line per update otherwise) and a summary.
#pragma once

#include <string>

namespace kt::cli {

struct RunOptions {
  std::string job_path;
  // Pod logs, volumes and checkpoints; default ./kubetrain-runs/<job>. Checkpoints go to
  // <workdir>/checkpoints (unless the job names a checkpoint volume), so running the same job
  // again with the same workdir resumes from its latest checkpoint.
  std::string workdir;
  std::string worker_binary;  // default: kubetrain-worker next to this binary, else on PATH
};

// Returns the exit code: 0 when the job succeeded, 1 when it failed (the reason is printed),
// 130 when interrupted (SIGINT/SIGTERM: the job's pods are stopped first). Throws kt::Error /
// FieldError / ValidationError for a manifest that cannot run at all.
int run_job(const RunOptions& options);

// The worker binary pods run: kubetrain-worker next to this binary, else the one on PATH.
std::string find_worker_binary();

}  // namespace kt::cli

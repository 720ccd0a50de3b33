// `kubetrain-worker launch` (docs/WORKER.md, "Processes"): the pod's entry process. It starts one
// rank process per GPU (per procsPerNode on CPU), prefixes their output with "[rank N] ", forwards
// SIGTERM and SIGINT to them, serves one /metrics that merges theirs, and when one rank fails,
// stops the others and exits with the failed rank's code.
#pragma once

#include <string>
#include <vector>

namespace kt::worker {

struct LaunchOptions {
  // The program each rank runs, and its arguments after the program name ("train", "--plan",
  // ...). Each rank prints "metrics on http://127.0.0.1:PORT/metrics" on stdout when it serves
  // its metrics; that is how the launcher finds them.
  std::string child_program;
  std::vector<std::string> child_args;
  int procs_per_node = 1;
  int world_size = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // Where the merged /metrics and /healthz are served; port < 0: not served.
  std::string metrics_address = "0.0.0.0";
  int metrics_port = -1;
  // After a rank failed, how long the others get after SIGTERM before SIGKILL.
  int kill_grace_seconds = 10;
};

// Runs the ranks of this node (global rank = node_rank · procs_per_node + local rank, each with
// RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, NODE_RANK in its environment) until
// all have exited. Returns 0 when all exited 0, else the first failed rank's exit code (128 +
// signal when killed by one). Throws kt::Error for a bad layout or an unusable metrics port.
int launch_ranks(const LaunchOptions& options);

}  // namespace kt::worker

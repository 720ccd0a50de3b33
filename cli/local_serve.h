// `kubetrain local serve`: the local control plane (an empty Store) over HTTP on 127.0.0.1,
// with a kubeconfig for kubectl and the operator (DESIGN.md §9).
#pragma once

#include <string>

namespace kt::cli {

// Serves until SIGINT or SIGTERM. `port` 0 picks a free port; `kubeconfig_out` "" writes none.
// Prints the URL (and the kubeconfig path) on stdout once serving. Returns the exit code.
int local_serve(int port, const std::string& kubeconfig_out);

}  // namespace kt::cli

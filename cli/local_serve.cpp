#include "cli/local_serve.h"

#include <signal.h>

#include <cstdio>

#include "operator/local/http_api.h"
#include "operator/local/store.h"

namespace kt::cli {

int local_serve(int port, const std::string& kubeconfig_out) {
  // Block the stop signals before any thread starts, so that only sigwait below sees them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  local::Store store;
  local::ApiServer server(store, "127.0.0.1", port);
  server.start();
  if (!kubeconfig_out.empty()) server.write_kubeconfig(kubeconfig_out);
  std::printf("kubetrain local control plane serving at %s\n", server.url().c_str());
  if (!kubeconfig_out.empty()) std::printf("kubeconfig written to %s\n", kubeconfig_out.c_str());
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  std::printf("kubetrain local control plane: stopping (signal %d)\n", signal_number);
  server.stop();
  return 0;
}

}  // namespace kt::cli

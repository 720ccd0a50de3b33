#include "telemetry/process_metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace kt::telemetry {
namespace {

// Fields of /proc/self/stat after the command name: utime and stime are the 12th and 13th,
// starttime the 20th (proc(5), counting from state as the first), in clock ticks.
bool read_stat(double& cpu_seconds, double& start_ticks) {
  std::ifstream in("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 1; fields >> field; ++i) {
    if (i == 12) utime = std::stod(field);
    if (i == 13) stime = std::stod(field);
    if (i == 20) {
      start_ticks = std::stod(field);
      cpu_seconds = (utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
      return true;
    }
  }
  return false;
}

double boot_time_seconds() {
  std::ifstream in("/proc/stat");
  std::string key;
  double value = 0;
  while (in >> key) {
    if (key == "btime" && in >> value) return value;
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

}  // namespace

void add_process_metrics(Registry& registry, const std::string& component,
                         const std::string& version) {
  registry.gauge("kubetrain_build_info", "The version of the running kubetrain program (1).",
                 {"component", "version"})
      .with({component, version})
      .set(1);
  Counter& cpu = registry.counter("process_cpu_seconds_total",
                                  "Total user and system CPU time spent in seconds.")
                     .with({});
  Gauge& resident = registry.gauge("process_resident_memory_bytes",
                                   "Resident memory size in bytes.").with({});
  Gauge& virtual_bytes = registry.gauge("process_virtual_memory_bytes",
                                        "Virtual memory size in bytes.").with({});
  Gauge& start = registry.gauge("process_start_time_seconds",
                                "Start time of the process since unix epoch in seconds.").with({});
  Gauge& open_fds = registry.gauge("process_open_fds", "Number of open file descriptors.").with({});
  Gauge& max_fds = registry.gauge("process_max_fds", "Maximum number of open file descriptors.")
                       .with({});
  const double boot = boot_time_seconds();
  registry.on_expose([&cpu, &resident, &virtual_bytes, &start, &open_fds, &max_fds, boot] {
    double cpu_seconds = 0, start_ticks = 0;
    if (read_stat(cpu_seconds, start_ticks)) {
      if (cpu_seconds > cpu.value()) cpu.inc(cpu_seconds - cpu.value());
      start.set(boot + start_ticks / static_cast<double>(::sysconf(_SC_CLK_TCK)));
    }
    std::ifstream statm("/proc/self/statm");
    double pages_virtual = 0, pages_resident = 0;
    if (statm >> pages_virtual >> pages_resident) {
      const double page = static_cast<double>(::sysconf(_SC_PAGESIZE));
      virtual_bytes.set(pages_virtual * page);
      resident.set(pages_resident * page);
    }
    std::error_code ec;
    double fds = 0;
    for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
         !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
      ++fds;
    open_fds.set(fds);
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) == 0) max_fds.set(static_cast<double>(limit.rlim_cur));
  });
}

}  // namespace kt::telemetry

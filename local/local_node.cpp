#include "local/local_node.h"

#include <unistd.h>

#include <array>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "api/hardware.h"

namespace kt::local {

using kube::Object;

namespace {

std::string node_name_from_hostname(std::string host) {
  std::string out;
  for (char c : host) {
    const char l = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    out += (std::isalnum(static_cast<unsigned char>(l)) || l == '-' || l == '.') ? l : '-';
  }
  while (!out.empty() && !std::isalnum(static_cast<unsigned char>(out.back()))) out.pop_back();
  while (!out.empty() && !std::isalnum(static_cast<unsigned char>(out.front()))) out.erase(0, 1);
  return out.empty() ? "localhost" : out;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// `nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits`: "NAME, MiB" lines.
std::vector<LocalGpu> gpus_from_nvidia_smi() {
  std::vector<LocalGpu> gpus;
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(
      ::popen("nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits "
              "2>/dev/null",
              "r"),
      ::pclose);
  if (!pipe) return gpus;
  std::array<char, 512> line{};
  while (std::fgets(line.data(), line.size(), pipe.get())) {
    const std::string text = line.data();
    const auto comma = text.rfind(',');
    if (comma == std::string::npos) continue;
    LocalGpu gpu;
    gpu.product = gfd_product_name(trim(text.substr(0, comma)));
    try {
      gpu.memory_mib = std::stoll(trim(text.substr(comma + 1)));
    } catch (const std::exception&) {
      continue;
    }
    if (!gpu.product.empty()) gpus.push_back(gpu);
  }
  return gpus;
}

// The driver's /proc files name the model but not the memory.
std::vector<LocalGpu> gpus_from_proc() {
  std::vector<LocalGpu> gpus;
  std::error_code ec;
  for (const auto& dir : std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    std::ifstream in(dir.path() / "information");
    std::string line;
    while (std::getline(in, line))
      if (line.rfind("Model:", 0) == 0) gpus.push_back({gfd_product_name(trim(line.substr(6))), 0});
  }
  return gpus;
}

bool on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  std::string dir;
  while (std::getline(dirs, dir, ':'))
    if (!dir.empty() && ::access((dir + "/" + program).c_str(), X_OK) == 0) return true;
  return false;
}

}  // namespace

std::string gfd_product_name(const std::string& name) {
  std::string out = trim(name);
  for (char& c : out)
    if (c == ' ') c = '-';
  return out;
}

// The "flags" line of /proc/cpuinfo (the first CPU's), as words.
std::vector<std::string> cpu_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) break;
    std::istringstream words(line.substr(colon + 1));
    std::vector<std::string> flags;
    for (std::string w; words >> w;) flags.push_back(w);
    return flags;
  }
  return {};
}

LocalMachine detect_local_machine() {
  LocalMachine m;
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  m.node_name = node_name_from_hostname(host);
  m.cpu_cores = std::max<long>(1, ::sysconf(_SC_NPROCESSORS_ONLN));
  m.memory_bytes = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGESIZE);
  m.gpus = on_path("nvidia-smi") ? gpus_from_nvidia_smi() : std::vector<LocalGpu>{};
  if (m.gpus.empty()) m.gpus = gpus_from_proc();
  for (const std::string& f : cpu_flags()) {
    m.amx_bf16 = m.amx_bf16 || f == "amx_bf16";
    m.avx512_bf16 = m.avx512_bf16 || f == "avx512_bf16";
  }
  return m;
}

Object local_node_object(const LocalMachine& machine) {
  Object labels = {{"kubernetes.io/hostname", machine.node_name},
                   {"kubernetes.io/os", "linux"},
                   {"kubetrain.dev/local", "true"}};
  Object resources = {{"cpu", std::to_string(machine.cpu_cores)},
                      {"memory", std::to_string(machine.memory_bytes / 1024) + "Ki"},
                      {"pods", "110"}};
  if (machine.amx_bf16) labels[api::kNfdAmxBf16] = "true";
  if (machine.avx512_bf16) labels[api::kNfdAvx512Bf16] = "true";
  if (!machine.gpus.empty()) {
    const LocalGpu& first = machine.gpus.front();
    labels["nvidia.com/gpu.product"] = first.product;
    labels["nvidia.com/gpu.count"] = std::to_string(machine.gpus.size());
    if (first.memory_mib > 0) labels["nvidia.com/gpu.memory"] = std::to_string(first.memory_mib);
    resources["nvidia.com/gpu"] = std::to_string(machine.gpus.size());
  }
  return {{"apiVersion", "v1"},
          {"kind", "Node"},
          {"metadata", {{"name", machine.node_name}, {"labels", labels}}},
          {"spec", Object::object()},
          {"status",
           {{"capacity", resources},
            {"allocatable", resources},
            {"addresses",
             {{{"type", "InternalIP"}, {"address", "127.0.0.1"}},
              {{"type", "Hostname"}, {"address", machine.node_name}}}},
            {"conditions",
             {{{"type", "Ready"},
               {"status", "True"},
               {"reason", "KubeletReady"},
               {"message", "kubetrain local node"}}}}}}};
}

void register_local_node(kube::Client& client, const LocalMachine& machine) {
  const Object want = local_node_object(machine);
  Object stored;
  try {
    stored = client.create(kube::kNodes, "", want);
  } catch (const kube::ApiError& e) {
    if (!e.already_exists()) throw;
    stored = client.get(kube::kNodes, "", machine.node_name);
    stored["metadata"]["labels"] = want["metadata"]["labels"];
    stored = client.update(kube::kNodes, "", stored);
  }
  // The status is a subresource: create() may have dropped it.
  stored["status"] = want["status"];
  client.update_status(kube::kNodes, "", stored);
}

}  // namespace kt::local

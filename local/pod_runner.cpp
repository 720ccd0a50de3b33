#include "local/pod_runner.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <vector>

#include "api/quantity.h"
#include "operator/kube/objects.h"

extern char** environ;

namespace kt::local {

namespace fs = std::filesystem;
using kube::ApiError;
using kube::Object;
using kube::now_rfc3339;

namespace {

// Writes `text` to `path` readable by its owner only (0600, as kubectl writes a kubeconfig): a
// pod's kubeconfig holds its ServiceAccount's bearer token.
void write_private_file(const fs::path& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw kt::Error("cannot write " + path.string() + ": " + std::strerror(errno));
  const bool ok = ::fchmod(fd, 0600) == 0 &&
                  ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int error = errno;
  ::close(fd);
  if (!ok) throw kt::Error("cannot write " + path.string() + ": " + std::strerror(error));
}

// The first port of the kernel's ephemeral range (ip_local_port_range; Linux's default 32768).
int ephemeral_port_low() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 32768;
  in >> low;
  return low;
}

// Whether nobody uses `port` on any address now (no listener, no connection, no TIME_WAIT).
bool port_is_free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw kt::Error("cannot create a socket: " + std::string(std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

// A port nobody uses now, for a pod to bind (its MASTER_PORT, metrics and -bind-address ports).
// Taken below the kernel's ephemeral range: the kernel's choice for port 0 comes from that range,
// where it also puts the local end of every outgoing connection, and under load (the chaos test:
// operators, kubectl, the ranks' rendezvous) such a port was taken before the pod bound it —
// "Address already in use", exit 1, the job failed. Below the range only an explicit bind can
// take it. A port handed out in the last minute is not handed out again (its pod may not have
// bound it yet).
int free_port() {
  static std::mutex mutex;
  static std::map<int, std::chrono::steady_clock::time_point> handed_out;
  static std::mt19937 random(std::random_device{}());
  std::lock_guard lock(mutex);
  const auto now = std::chrono::steady_clock::now();
  std::erase_if(handed_out, [&](const auto& p) { return now - p.second > std::chrono::minutes(1); });
  const int low = 10000, high = std::min(ephemeral_port_low(), 65536) - 1;
  if (high - low >= 1000) {
    for (int tries = 0; tries < 1000; ++tries) {
      const int port = std::uniform_int_distribution<int>(low, high)(random);
      if (handed_out.count(port) || !port_is_free(port)) continue;
      handed_out[port] = now;
      return port;
    }
  }
  // No room below the range (an unusual ip_local_port_range): the kernel's choice.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw kt::Error("cannot create a socket: " + std::string(std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw kt::Error("cannot find a free port: " + std::string(std::strerror(errno)));
  }
  ::close(fd);
  handed_out[ntohs(addr.sin_port)] = now;
  return ntohs(addr.sin_port);
}

bool is_ip_literal(const std::string& host) {
  in_addr v4{};
  in6_addr v6{};
  return ::inet_pton(AF_INET, host.c_str(), &v4) == 1 ||
         ::inet_pton(AF_INET6, host.c_str(), &v6) == 1;
}

std::string phase_of(const Object& pod) {
  return pod.contains("status") ? pod["status"].value("phase", "Pending") : "Pending";
}

// Every process below `root` (children of children...), from /proc.
std::vector<pid_t> descendants(pid_t root) {
  std::map<pid_t, std::vector<pid_t>> children;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    const auto close = line.rfind(')');  // the command may contain spaces and parentheses
    if (close == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(line.c_str() + close + 1, " %c %d", &state, &ppid) == 2)
      children[ppid].push_back(std::stoi(name));
  }
  std::vector<pid_t> out, stack = {root};
  while (!stack.empty()) {
    const pid_t p = stack.back();
    stack.pop_back();
    for (pid_t c : children[p]) {
      out.push_back(c);
      stack.push_back(c);
    }
  }
  return out;
}

// The processes whose environment holds `entry` ("NAME=value"): those of one pod, even when they
// left its process tree (setsid, double fork) before the runner looked at the tree.
std::vector<pid_t> processes_with_env(const std::string& entry) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& dir : fs::directory_iterator("/proc", ec)) {
    const std::string name = dir.path().filename();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    std::ifstream in(dir.path() / "environ", std::ios::binary);
    std::string variable;
    while (std::getline(in, variable, '\0'))
      if (variable == entry) {
        out.push_back(std::stoi(name));
        break;
      }
  }
  return out;
}

// Signals the pod's process group and every descendant (the worker's ranks have groups of
// their own).
void signal_pod(pid_t pid, int sig, const std::vector<pid_t>& known) {
  // The group first: a shell whose child dies first could run its next command in between.
  ::killpg(pid, sig);
  for (pid_t d : descendants(pid)) ::kill(d, sig);
  for (pid_t d : known) ::kill(d, sig);  // orphaned since the last look
}

// The memory the processes hold, as a memory cgroup charges it: each resident page once
// (the proportional set size, so that pages shared between a pod's processes are not counted
// twice), read from /proc/<pid>/smaps_rollup (RSS from statm where that is missing).
double memory_of(const std::vector<pid_t>& pids) {
  double bytes = 0;
  for (const pid_t pid : pids) {
    std::ifstream rollup("/proc/" + std::to_string(pid) + "/smaps_rollup");
    std::string line;
    bool found = false;
    while (std::getline(rollup, line)) {
      if (line.rfind("Pss:", 0) == 0) {
        bytes += std::strtod(line.c_str() + 4, nullptr) * 1024;
        found = true;
        break;
      }
    }
    if (found) continue;
    std::ifstream statm("/proc/" + std::to_string(pid) + "/statm");
    double pages_total = 0, pages_resident = 0;
    if (statm >> pages_total >> pages_resident)
      bytes += pages_resident * static_cast<double>(::sysconf(_SC_PAGESIZE));
  }
  return bytes;
}

Object condition(const std::string& type, bool value, const std::string& reason = "") {
  Object c = {
      {"type", type}, {"status", value ? "True" : "False"}, {"lastTransitionTime", now_rfc3339()}};
  if (!reason.empty()) c["reason"] = reason;
  return c;
}

}  // namespace

PodRunner::PodRunner(kube::Client& client, PodRunnerOptions options)
    : client_(client), options_(std::move(options)) {}

PodRunner::~PodRunner() {
  stop();
}

std::string PodRunner::termination_message_path(const std::string& ns,
                                                const std::string& name) const {
  return (fs::path(pod_dir(ns, name)) / "termination-log").string();
}

std::string PodRunner::pod_dir(const std::string& ns, const std::string& name) const {
  return (fs::path(options_.work_dir) / "pods" / (ns + "_" + name)).string();
}

std::string PodRunner::log_path(const std::string& ns, const std::string& name) const {
  return (fs::path(pod_dir(ns, name)) / "log").string();
}

size_t PodRunner::running() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return processes_.size();
}

void PodRunner::start() {
  stopping_ = false;
  thread_ = std::thread([this] {
    while (!stopping_) {
      try {
        sync();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "kubetrain: pod runner: %s\n", e.what());
      }
      std::this_thread::sleep_for(options_.poll_interval);
    }
  });
}

void PodRunner::stop() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> sync_lock(sync_mutex_);
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [uid, p] : processes_) signal_pod(p.pid, SIGTERM, p.descendants);
  const auto deadline = std::chrono::steady_clock::now() + options_.shutdown_grace;
  while (!processes_.empty()) {
    for (auto it = processes_.begin(); it != processes_.end();) {
      int wstatus = 0;
      if (::waitpid(it->second.pid, &wstatus, WNOHANG) == it->second.pid)
        it = processes_.erase(it);
      else
        ++it;
    }
    if (processes_.empty()) break;
    if (std::chrono::steady_clock::now() >= deadline)
      for (auto& [uid, p] : processes_) signal_pod(p.pid, SIGKILL, p.descendants);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void PodRunner::patch_status(const std::string& ns, const std::string& name, const Object& status) {
  try {
    client_.merge_patch(kube::kPods, ns, name, {{"status", status}}, true);
  } catch (const ApiError& e) {
    if (!e.not_found()) throw;  // deleted meanwhile: nothing to report to
  }
}

void PodRunner::sync() {
  std::lock_guard<std::mutex> sync_lock(sync_mutex_);
  const Object node = client_.get(kube::kNodes, "", options_.node_name);
  bind_claims();
  kube::ListOptions only_here;
  if (!options_.bind_pods) only_here.field_selector = "spec.nodeName=" + options_.node_name;
  const std::vector<Object> pods = client_.list(kube::kPods, "", only_here).items;
  std::set<std::string> live;
  for (const auto& pod : pods) {
    const std::string uid = pod["metadata"].value("uid", "");
    live.insert(uid);
    const std::string node_name = pod["spec"].value("nodeName", "");
    if (node_name.empty()) {
      if (options_.bind_pods) bind_if_fits(pod, node, pods);
      continue;
    }
    if (node_name != options_.node_name) continue;
    const std::string phase = phase_of(pod);
    bool started;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      started = started_.count(uid) > 0;
    }
    if (!started && phase != "Succeeded" && phase != "Failed") {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        started_.insert(uid);
      }
      try {
        launch(pod);
      } catch (const std::exception& e) {  // kt::Error, or a filesystem or JSON failure
        patch_status(pod["metadata"]["namespace"], pod["metadata"]["name"],
                     {{"phase", "Failed"},
                      {"reason", "CreateContainerError"},
                      {"message", e.what()},
                      {"containerStatuses",
                       {{{"name", pod["spec"]["containers"][0].value("name", "main")},
                         {"ready", false},
                         {"restartCount", 0},
                         {"state",
                          {{"terminated",
                            {{"exitCode", 128},
                             {"reason", "CreateContainerError"},
                             {"message", e.what()}}}}}}}}});
      }
    }
  }
  reap(live);
}

void PodRunner::bind_claims() {
  const fs::path volumes = fs::path(options_.work_dir) / "volumes";
  std::set<std::string> bound_dirs;
  for (Object claim : client_.list(kube::kPersistentVolumeClaims, "", {}).items) {
    const std::string ns = claim["metadata"]["namespace"], name = claim["metadata"]["name"];
    const std::string volume = "pvc-" + claim["metadata"].value("uid", "");
    bound_dirs.insert(volume);
    const Object status = claim.value("status", Object::object());
    if (status.value("phase", "") == "Bound") continue;
    try {
      fs::create_directories(volumes / volume);
      claim["spec"]["volumeName"] = volume;
      claim = client_.update(kube::kPersistentVolumeClaims, ns, claim);
      const Object spec = claim["spec"];
      Object capacity = Object::object();
      if (spec.contains("resources") && spec["resources"].contains("requests") &&
          spec["resources"]["requests"].contains("storage"))
        capacity["storage"] = spec["resources"]["requests"]["storage"];
      claim["status"] = {{"phase", "Bound"},
                         {"accessModes", spec.value("accessModes", Object::array())},
                         {"capacity", capacity}};
      client_.update_status(kube::kPersistentVolumeClaims, ns, claim);
    } catch (const ApiError& e) {
      if (!e.not_found() && !e.conflict()) throw;  // gone, or changed: the next pass binds it
    }
  }
  // Reclaim policy Delete: a deleted claim's data goes with it.
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(volumes, ec)) {
    const std::string dir = entry.path().filename().string();
    if (dir.rfind("pvc-", 0) == 0 && !bound_dirs.count(dir)) fs::remove_all(entry.path(), ec);
  }
}

std::string PodRunner::claim_dir(const std::string& ns, const std::string& claim,
                                 std::string* why) const {
  try {
    const Object pvc = client_.get(kube::kPersistentVolumeClaims, ns, claim);
    const std::string volume = pvc.value("spec", Object::object()).value("volumeName", "");
    if (pvc.value("status", Object::object()).value("phase", "") == "Bound" && !volume.empty())
      return (fs::path(options_.work_dir) / "volumes" / volume).string();
    *why = "pod has unbound immediate PersistentVolumeClaims (\"" + claim + "\")";
  } catch (const ApiError& e) {
    if (!e.not_found()) throw;
    *why = "persistentvolumeclaim \"" + claim + "\" not found";
  }
  return "";
}

void PodRunner::bind_if_fits(const Object& pod, const Object& node,
                             const std::vector<Object>& pods) {
  const std::string ns = pod["metadata"]["namespace"], name = pod["metadata"]["name"];
  const Object labels = node["metadata"].value("labels", Object::object());
  std::string why;
  // The scheduler's VolumeBinding: every claim the pod names must exist and be bound.
  for (const auto& v : pod["spec"].value("volumes", Object::array()))
    if (v.contains("persistentVolumeClaim") && why.empty())
      claim_dir(ns, v["persistentVolumeClaim"].value("claimName", ""), &why);
  const Object selector = pod["spec"].value("nodeSelector", Object::object());
  for (const auto& [k, v] : selector.items())
    if (labels.value(k, "") != v.get<std::string>())
      why = "node(s) didn't match Pod's node affinity/selector (" + k + "=" + v.get<std::string>() +
            ")";
  if (why.empty()) {
    const auto alloc = node.contains("status")
                           ? node["status"].value("allocatable", Object::object())
                           : Object::object();
    // The scheduler's NodeResourcesFit: requests of the pods bound here plus this one's must
    // fit the node's allocatable, per resource.
    for (const char* resource : {"nvidia.com/gpu", "cpu", "memory"}) {
      const double wanted = kube::pod_request(pod, resource);
      if (wanted <= 0) continue;
      double allocatable = 0;
      if (alloc.contains(resource) && alloc[resource].is_string())
        allocatable = api::parse_quantity(alloc[resource].get<std::string>()).value_or(0);
      double used = 0;
      for (const auto& other : pods) {
        const std::string phase = phase_of(other);
        if (other["spec"].value("nodeName", "") == options_.node_name && phase != "Succeeded" &&
            phase != "Failed")
          used += kube::pod_request(other, resource);
      }
      if (used + wanted > allocatable * (1 + 1e-9) + 1e-9) {
        char text[160];
        std::snprintf(text, sizeof text, "Insufficient %s (requested %g, free %g of %g)",
                      resource, wanted, std::max(0.0, allocatable - used), allocatable);
        why = text;
        break;
      }
    }
  }
  if (!why.empty()) {
    // Unschedulable: say so once; the pod stays Pending until something changes.
    const auto conditions = pod.contains("status")
                                ? pod["status"].value("conditions", Object::array())
                                : Object::array();
    for (const auto& c : conditions)
      if (c.value("type", "") == "PodScheduled" && c.value("message", "") == why) return;
    Object cond = condition("PodScheduled", false, "Unschedulable");
    cond["message"] = "0/1 nodes are available: " + why;
    patch_status(ns, name, {{"phase", "Pending"}, {"conditions", Object::array({cond})}});
    return;
  }
  // The binding: the scheduler's write of spec.nodeName.
  try {
    client_.merge_patch(kube::kPods, ns, name, {{"spec", {{"nodeName", options_.node_name}}}});
  } catch (const ApiError& e) {
    if (!e.not_found()) throw;
  }
}

void PodRunner::launch(const Object& pod) {
  const std::string ns = pod["metadata"]["namespace"], name = pod["metadata"]["name"];
  const std::string uid = pod["metadata"]["uid"];
  const auto containers = pod["spec"].value("containers", Object::array());
  if (containers.empty()) throw kt::Error("the pod has no containers");
  if (containers.size() > 1)
    throw kt::Error("the local node runs one container per pod; this pod has " +
                    std::to_string(containers.size()));
  const Object& container = containers[0];
  const fs::path dir = pod_dir(ns, name);
  fs::create_directories(dir);
  double memory_limit = 0;  // limits.memory (requests alone set no limit, as on a kubelet)
  if (const Object limit = container.value("resources", Object::object())
                               .value("limits", Object::object())
                               .value("memory", Object());
      limit.is_string())
    memory_limit = api::parse_quantity(limit.get<std::string>()).value_or(0);

  // ---- volumes: name -> local directory ----
  std::map<std::string, std::string> volume_dirs;
  for (const auto& v : pod["spec"].value("volumes", Object::array())) {
    const std::string vname = v.value("name", "");
    fs::path local = dir / "volumes" / vname;
    if (v.contains("configMap")) {
      fs::remove_all(local);
      fs::create_directories(local);
      const std::string cm_name = v["configMap"].value("name", "");
      Object cm;
      try {
        cm = client_.get(kube::kConfigMaps, ns, cm_name);
      } catch (const ApiError& e) {
        if (!e.not_found()) throw;
        throw kt::Error("configmap \"" + cm_name + "\" not found (volume " + vname + ")");
      }
      const Object data = cm.value("data", Object::object());
      std::map<std::string, std::string> files;  // key -> path
      if (v["configMap"].contains("items")) {
        for (const auto& item : v["configMap"]["items"])
          files[item.value("key", "")] = item.value("path", item.value("key", ""));
      } else {
        for (const auto& [key, _] : data.items()) files[key] = key;
      }
      for (const auto& [key, path] : files) {
        if (!data.contains(key))
          throw kt::Error("configmap \"" + cm_name + "\" has no key \"" + key + "\"");
        fs::create_directories((local / path).parent_path());
        std::ofstream(local / path) << data[key].get<std::string>();
      }
    } else if (v.contains("emptyDir")) {
      fs::remove_all(local);
      fs::create_directories(local);
    } else if (v.contains("hostPath")) {
      local = v["hostPath"].value("path", "");
      fs::create_directories(local);
    } else if (v.contains("persistentVolumeClaim")) {
      std::string why;
      local = claim_dir(ns, v["persistentVolumeClaim"].value("claimName", ""), &why);
      if (local.empty()) throw kt::Error("volume \"" + vname + "\": " + why);
      fs::create_directories(local);
    } else {
      throw kt::Error("volume \"" + vname +
                      "\": the local node supports configMap, emptyDir, hostPath and "
                      "persistentVolumeClaim volumes");
    }
    volume_dirs[vname] = local.string();
  }
  std::vector<std::pair<std::string, std::string>> mounts;  // mountPath -> local path
  for (const auto& m : container.value("volumeMounts", Object::array())) {
    const auto it = volume_dirs.find(m.value("name", ""));
    if (it == volume_dirs.end())
      throw kt::Error("volumeMount \"" + m.value("name", "") + "\" names no volume");
    std::string local = it->second;
    if (m.contains("subPath")) local += "/" + m["subPath"].get<std::string>();
    mounts.emplace_back(m.value("mountPath", ""), local);
  }
  // Longest mount path first, so /a/b wins over /a.
  std::sort(mounts.begin(), mounts.end(),
            [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  auto rewrite = [&](const std::string& s) {
    const auto eq = s.find('=');
    const size_t starts[] = {0, eq == std::string::npos ? std::string::npos : eq + 1};
    for (size_t start : starts) {
      if (start == std::string::npos) continue;
      for (const auto& [mount, local] : mounts) {
        if (mount.empty() || s.compare(start, mount.size(), mount) != 0) continue;
        const size_t after = start + mount.size();
        if (after == s.size() || s[after] == '/')
          return s.substr(0, start) + local + s.substr(after);
      }
    }
    return s;
  };

  // ---- the command line ----
  std::vector<std::string> argv;
  for (const auto& c : container.value("command", Object::array())) argv.push_back(c);
  for (const auto& a : container.value("args", Object::array())) argv.push_back(a);
  if (argv.empty())
    throw kt::Error("the container has no command (the local node does not read images)");
  // The image's programs are this build's binaries (they sit next to the worker).
  const std::string program = fs::path(argv[0]).filename().string();
  if (program == "kubetrain-worker") {
    argv[0] = options_.worker_binary;
  } else if (program == "kubetrain-operator" || program == "kubetrain") {
    const fs::path local = fs::path(options_.worker_binary).parent_path() / program;
    if (fs::exists(local)) argv[0] = local.string();
  }
  Object annotations = Object::object();
  // Every pod here shares 127.0.0.1: a port a container listens on becomes a free one, recorded
  // in kubetrain.dev/port-map as "containerPort=hostPort,..." (probes and scrapes read it).
  std::string port_map;
  auto remap_bind = [&](const std::string& value) {
    const auto colon = value.rfind(':');
    if (colon == std::string::npos || value.substr(colon + 1) == "0") return value;
    const std::string port = std::to_string(free_port());
    port_map += (port_map.empty() ? "" : ",") + value.substr(colon + 1) + "=" + port;
    return "127.0.0.1:" + port;
  };
  for (size_t i = 1; i < argv.size(); ++i) {
    argv[i] = rewrite(argv[i]);
    if (argv[i] == "--metrics-port" && i + 1 < argv.size() && argv[i + 1] != "0") {
      argv[i + 1] = std::to_string(free_port());
      annotations["kubetrain.dev/metrics-port"] = argv[i + 1];
      ++i;
      continue;
    }
    // controller-runtime's flags: --metrics-bind-address=:8080, --health-probe-bind-address :8081
    const auto eq = argv[i].find('=');
    const std::string flag = argv[i].substr(0, eq);
    if (flag.size() > 13 && flag.compare(flag.size() - 13, 13, "-bind-address") == 0) {
      if (eq != std::string::npos) {
        argv[i] = flag + "=" + remap_bind(argv[i].substr(eq + 1));
      } else if (i + 1 < argv.size()) {
        argv[i + 1] = remap_bind(argv[i + 1]);
        ++i;
      }
    }
  }
  if (!port_map.empty()) annotations[kPortMapAnnotation] = port_map;

  // ---- the environment: this process's, then the pod's ----
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  env["HOSTNAME"] = pod["spec"].value("hostname", name);
  for (const auto& e : container.value("env", Object::array())) {
    std::string value = e.value("value", "");
    if (e.contains("valueFrom") && e["valueFrom"].contains("fieldRef")) {
      const std::string field = e["valueFrom"]["fieldRef"].value("fieldPath", "");
      if (field == "metadata.name")
        value = name;
      else if (field == "metadata.namespace")
        value = ns;
      else if (field == "status.podIP" || field == "status.hostIP")
        value = "127.0.0.1";
      else if (field == "spec.nodeName")
        value = options_.node_name;
    }
    env[e.value("name", "")] = rewrite(value);
  }
  // The API server, as a pod reaches it: the local control plane with the pod's
  // ServiceAccount token (RBAC applies to it), as a kubeconfig, since it serves plain HTTP
  // rather than in-cluster HTTPS.
  env.erase("KUBERNETES_SERVICE_HOST");
  env.erase("KUBERNETES_SERVICE_PORT");
  if (options_.service_account_kubeconfig &&
      pod["spec"].value("automountServiceAccountToken", true)) {
    const std::string account = pod["spec"].value("serviceAccountName", "default");
    const fs::path kubeconfig = dir / "kubeconfig";
    write_private_file(kubeconfig, options_.service_account_kubeconfig(ns, account));
    env["KUBECONFIG"] = kubeconfig.string();
  }
  // Every pod here is on this machine's loopback: nothing it listens on needs another address.
  env["KUBETRAIN_LISTEN_ADDRESS"] = "127.0.0.1";
  // No cluster DNS: every pod of this node is 127.0.0.1, and ports must not collide.
  // The container's termination message file, as the kubelet provides it (read back on exit).
  env["KUBETRAIN_TERMINATION_MESSAGE_PATH"] = termination_message_path(ns, name);
  // Inherited by every process the pod starts: found by it when the pod dies. Store uids repeat
  // between control planes, so the node's work directory makes it unique on the machine.
  env[kPodUidEnv] = options_.work_dir + "#" + uid;
  if (env.count("MASTER_ADDR") && !is_ip_literal(env["MASTER_ADDR"]))
    env["MASTER_ADDR"] = "127.0.0.1";
  if (env.count("MASTER_PORT")) {
    env["MASTER_PORT"] = std::to_string(free_port());
    annotations["kubetrain.dev/master-port"] = env["MASTER_PORT"];
  }
  if (!annotations.empty())
    client_.merge_patch(kube::kPods, ns, name, {{"metadata", {{"annotations", annotations}}}});

  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);

  // ---- start it ----
  const std::string log = log_path(ns, name);
  const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) throw kt::Error("cannot open " + log + ": " + std::strerror(errno));
  std::string header =
      "=== pod " + ns + "/" + name + " (uid " + uid + ") started " + now_rfc3339() + ":";
  for (const auto& a : argv) header += " " + a;
  header += "\n";
  if (::write(log_fd, header.data(), header.size()) < 0) {
    // The log is best effort; the process still runs.
  }
  std::vector<char*> c_argv, c_env;
  for (auto& a : argv) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  for (auto& e : env_strings) c_env.push_back(e.data());
  c_env.push_back(nullptr);
  const std::string workdir = dir.string();

  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(log_fd);
    throw kt::Error("fork failed: " + std::string(std::strerror(errno)));
  }
  if (pid == 0) {
    // The child: only async-signal-safe calls until exec.
    ::setpgid(0, 0);
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, 0);
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    if (::chdir(workdir.c_str()) != 0) ::_exit(127);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execvpe(c_argv[0], c_argv.data(), c_env.data());
    const char msg[] = "kubetrain local node: exec failed\n";
    if (::write(2, msg, sizeof(msg) - 1) < 0) ::_exit(127);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also from the parent, so that killpg works at once
  ::close(log_fd);
  const std::string started_at = now_rfc3339();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Process& p = processes_[uid];
    p.pid = pid;
    p.ns = ns;
    p.name = name;
    p.started_at = started_at;
    p.grace_seconds = pod["spec"].value("terminationGracePeriodSeconds", int64_t{30});
    p.memory_limit_bytes = memory_limit;
  }
  Object ready = condition("Ready", true);
  patch_status(ns, name,
               {{"phase", "Running"},
                {"podIP", "127.0.0.1"},
                {"podIPs", {{{"ip", "127.0.0.1"}}}},
                {"hostIP", "127.0.0.1"},
                {"startTime", started_at},
                {"conditions",
                 {condition("PodScheduled", true), condition("Initialized", true),
                  condition("ContainersReady", true), ready}},
                {"containerStatuses",
                 {{{"name", container.value("name", "main")},
                   {"image", container.value("image", "")},
                   {"ready", true},
                   {"started", true},
                   {"restartCount", 0},
                   {"state", {{"running", {{"startedAt", started_at}}}}}}}}});
}

void PodRunner::reap(const std::set<std::string>& live_uids) {
  std::vector<std::pair<Process, int>> exited;  // with the raw wait status
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    for (auto it = processes_.begin(); it != processes_.end();) {
      Process& p = it->second;
      int wstatus = 0;
      if (::waitpid(p.pid, &wstatus, WNOHANG) == p.pid) {
        // Leftover ranks of a killed pod would keep its ports and CPU: those seen in its tree,
        // and those that left it too early to be seen (found by the pod's uid in their env).
        for (pid_t d : p.descendants) ::kill(d, SIGKILL);
        for (pid_t d :
             processes_with_env(std::string(kPodUidEnv) + "=" + options_.work_dir + "#" + it->first))
          ::kill(d, SIGKILL);
        if (live_uids.count(it->first)) exited.emplace_back(p, wstatus);
        it = processes_.erase(it);
        continue;
      }
      p.descendants = descendants(p.pid);
      // A kubelet's memory limit: the container is killed when its processes hold more than
      // limits.memory (the kernel's cgroup OOM kill), reported as OOMKilled with exit code 137.
      if (p.memory_limit_bytes > 0 && !p.oom_killed) {
        std::vector<pid_t> all = p.descendants;
        all.push_back(p.pid);
        const double held = memory_of(all);
        p.peak_memory_bytes = std::max(p.peak_memory_bytes, held);
        if (held > p.memory_limit_bytes) {
          p.oom_killed = true;
          signal_pod(p.pid, SIGKILL, p.descendants);
          // Said in the pod's log, as the kernel says it in its own.
          const std::string line = "=== OOMKilled: the pod's processes held " +
                                   api::format_bytes(held) + ", over its limits.memory of " +
                                   api::format_bytes(p.memory_limit_bytes) + "\n";
          std::ofstream(log_path(p.ns, p.name), std::ios::app) << line;
        }
      }
      if (!live_uids.count(it->first)) {
        // Deleted: SIGTERM now, SIGKILL after the grace period.
        if (!p.terminating) {
          p.terminating = true;
          p.kill_at = now + std::chrono::seconds(p.grace_seconds);
          signal_pod(p.pid, SIGTERM, p.descendants);
        } else if (now >= p.kill_at) {
          signal_pod(p.pid, SIGKILL, p.descendants);
        }
      }
      ++it;
    }
  }
  for (const auto& [p, wstatus] : exited) {
    const int code = p.oom_killed ? 128 + SIGKILL
                     : WIFEXITED(wstatus) ? WEXITSTATUS(wstatus)
                                          : 128 + WTERMSIG(wstatus);
    Object terminated = {{"exitCode", code},
                         {"reason", p.oom_killed ? "OOMKilled" : code == 0 ? "Completed" : "Error"},
                         {"startedAt", p.started_at},
                         {"finishedAt", now_rfc3339()}};
    if (WIFSIGNALED(wstatus)) terminated["signal"] = WTERMSIG(wstatus);
    // The kubelet's limit for a termination message is 4 KiB.
    if (std::ifstream in{termination_message_path(p.ns, p.name)}) {
      std::string message(4096, '\0');
      in.read(message.data(), static_cast<std::streamsize>(message.size()));
      message.resize(static_cast<size_t>(in.gcount()));
      if (!message.empty()) terminated["message"] = message;
    }
    Object pod;
    try {
      pod = client_.get(kube::kPods, p.ns, p.name);
    } catch (const ApiError& e) {
      if (e.not_found()) continue;
      throw;
    }
    Object statuses = pod["status"].value("containerStatuses", Object::array());
    if (statuses.empty()) statuses.push_back({{"name", "main"}});
    statuses[0]["ready"] = false;
    statuses[0]["started"] = false;
    statuses[0]["state"] = {{"terminated", terminated}};
    const std::string reason = code == 0 ? "PodCompleted" : "PodFailed";
    patch_status(
        p.ns, p.name,
        {{"phase", code == 0 ? "Succeeded" : "Failed"},
         {"conditions",
          {condition("PodScheduled", true), condition("Initialized", true),
           condition("ContainersReady", false, reason), condition("Ready", false, reason)}},
         {"containerStatuses", statuses}});
  }
}

}  // namespace kt::local

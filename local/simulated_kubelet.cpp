#include "local/simulated_kubelet.h"

#include <cstdio>

#include "operator/kube/objects.h"

namespace kt::local {

using kube::ApiError;
using kube::Object;
using kube::WatchEventType;

namespace {

Object condition(const std::string& type, bool value, const std::string& reason = "") {
  Object c = {{"type", type},
              {"status", value ? "True" : "False"},
              {"lastTransitionTime", kube::now_rfc3339()}};
  if (!reason.empty()) c["reason"] = reason;
  return c;
}

// The annotation's exit code; nullopt when absent or not an integer 0..255.
std::optional<int> exit_code_of(const Object& pod) {
  const Object annotations = pod["metadata"].value("annotations", Object::object());
  if (!annotations.is_object() || !annotations.contains(kSimulateExitCodeAnnotation) ||
      !annotations[kSimulateExitCodeAnnotation].is_string())
    return std::nullopt;
  try {
    size_t used = 0;
    const std::string text = annotations[kSimulateExitCodeAnnotation].get<std::string>();
    const int code = std::stoi(text, &used);
    if (used != text.size() || code < 0 || code > 255) return std::nullopt;
    return code;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

SimulatedKubelet::SimulatedKubelet(kube::Client& client, SimulatedKubeletOptions options)
    : client_(client), options_(std::move(options)) {
  pod_informer_ = std::make_unique<kube::Informer>(client_, kube::kPods, "", "");
  pod_informer_->add_handler([this](WatchEventType type, const Object& pod) { on_pod(type, pod); });
}

SimulatedKubelet::~SimulatedKubelet() {
  stop();
}

void SimulatedKubelet::start() {
  stopping_ = false;
  pod_informer_->start();
  thread_ = std::thread([this] {
    while (!stopping_) {
      try {
        sync();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "kubetrain: simulated kubelet: %s\n", e.what());
      }
      std::this_thread::sleep_for(options_.interval);
    }
  });
}

void SimulatedKubelet::stop() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  pod_informer_->stop();
}

bool SimulatedKubelet::has_synced() const {
  return pod_informer_->has_synced();
}

size_t SimulatedKubelet::pods() const {
  std::lock_guard lock(mutex_);
  size_t n = 0;
  for (const auto& [uid, p] : pods_) n += p.ended ? 0 : 1;
  return n;
}

void SimulatedKubelet::on_pod(WatchEventType type, const Object& pod) {
  const std::string uid = pod["metadata"].value("uid", "");
  std::lock_guard lock(mutex_);
  if (type == WatchEventType::Deleted) {
    pods_.erase(uid);
    return;
  }
  const Object spec = pod.value("spec", Object::object());
  if (!options_.nodes.count(spec.value("nodeName", ""))) return;
  auto it = pods_.find(uid);
  if (it == pods_.end()) {
    const Object status = pod.value("status", Object::object());
    const std::string phase = status.is_object() ? status.value("phase", "Pending") : "Pending";
    SimulatedPod p;
    p.ns = pod["metadata"].value("namespace", "");
    p.name = pod["metadata"].value("name", "");
    const Object containers = spec.value("containers", Object::array());
    const Object first = containers.empty() ? Object::object() : containers[0];
    p.container = first.value("name", "main");
    p.image = first.value("image", "");
    p.seen_bound = std::chrono::steady_clock::now();
    // Ended before this kubelet saw it (a restart of local serve): nothing left to do.
    p.ended = phase == "Succeeded" || phase == "Failed";
    it = pods_.emplace(uid, std::move(p)).first;
  }
  it->second.exit_code = exit_code_of(pod);
}

void SimulatedKubelet::set_running(SimulatedPod& pod) {
  const uint32_t host = next_ip_++;
  const std::string ip = "10." + std::to_string(128 + ((host >> 16) & 63)) + "." +
                         std::to_string((host >> 8) & 255) + "." + std::to_string(host & 255);
  pod.started_at = kube::now_rfc3339();
  pod.running_since = std::chrono::steady_clock::now();
  client_.merge_patch(kube::kPods, pod.ns, pod.name,
                      {{"status",
                        {{"phase", "Running"},
                         {"podIP", ip},
                         {"podIPs", {{{"ip", ip}}}},
                         {"startTime", pod.started_at},
                         {"conditions",
                          {condition("PodScheduled", true), condition("Initialized", true),
                           condition("ContainersReady", true), condition("Ready", true)}},
                         {"containerStatuses",
                          {{{"name", pod.container},
                            {"image", pod.image},
                            {"ready", true},
                            {"started", true},
                            {"restartCount", 0},
                            {"state", {{"running", {{"startedAt", pod.started_at}}}}}}}}}}},
                      true);
}

void SimulatedKubelet::set_terminated(SimulatedPod& pod, int exit_code) {
  pod.ended = true;
  const std::string reason = exit_code == 0 ? "PodCompleted" : "PodFailed";
  client_.merge_patch(
      kube::kPods, pod.ns, pod.name,
      {{"status",
        {{"phase", exit_code == 0 ? "Succeeded" : "Failed"},
         {"conditions",
          {condition("PodScheduled", true), condition("Initialized", true),
           condition("ContainersReady", false, reason), condition("Ready", false, reason)}},
         {"containerStatuses",
          {{{"name", pod.container},
            {"image", pod.image},
            {"ready", false},
            {"started", false},
            {"restartCount", 0},
            {"state",
             {{"terminated",
               {{"exitCode", exit_code},
                {"reason", exit_code == 0 ? "Completed" : "Error"},
                {"startedAt", pod.started_at},
                {"finishedAt", kube::now_rfc3339()}}}}}}}}}}},
      true);
}

void SimulatedKubelet::sync() {
  std::lock_guard lock(mutex_);
  const auto now = std::chrono::steady_clock::now();
  for (auto& [uid, pod] : pods_) {
    if (pod.ended) continue;
    try {
      if (!pod.running_since) {
        if (now - pod.seen_bound < options_.start_delay) continue;
        set_running(pod);
      }
      if (pod.exit_code)
        set_terminated(pod, *pod.exit_code);
      else if (options_.run_duration.count() > 0 &&
               now - *pod.running_since >= options_.run_duration)
        set_terminated(pod, 0);
    } catch (const ApiError& e) {
      if (!e.not_found()) throw;
      pod.ended = true;  // deleted meanwhile; its Deleted event removes it
    }
  }
}

}  // namespace kt::local

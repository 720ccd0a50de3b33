#include "operator/controller/children.h"

#include <algorithm>
#include <cmath>

namespace kt::controller {

using kube::Object;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = 1024.0 * kMiB;

Object owner_reference(const Object& owner) {
  return {{"apiVersion", owner.value("apiVersion", api::kApiVersion)},
          {"kind", owner.value("kind", "TrainingJob")},
          {"name", owner["metadata"]["name"]},
          {"uid", owner["metadata"].value("uid", "")},
          {"controller", true},
          {"blockOwnerDeletion", true}};
}

Object child_metadata(const Object& owner, const std::string& name) {
  const std::string job = owner["metadata"]["name"];
  return {{"name", name},
          {"namespace", owner["metadata"].value("namespace", "default")},
          {"labels", {{kJobNameLabel, job}}},
          {"ownerReferences", Object::array({owner_reference(owner)})}};
}

Object env_var(const std::string& name, const std::string& value) {
  return {{"name", name}, {"value", value}};
}

// A byte count as a Kubernetes quantity in whole MiB, rounded up ("1536Mi").
std::string mebibytes(double bytes) {
  return std::to_string(static_cast<int64_t>(std::ceil(bytes / kMiB))) + "Mi";
}

// Sets resources[kind][name] unless the job's own override (spec.resources.resources) set it.
void default_resource(Object& resources, const char* kind, const char* name,
                      const std::string& value) {
  if (!resources[kind].contains(name)) resources[kind][name] = value;
}

}  // namespace

WorkerPodResources worker_pod_resources(const api::Plan& plan) {
  WorkerPodResources r;
  const auto procs = static_cast<double>(plan.config.procs_per_node);
  const bool cuda = plan.device == api::DeviceKind::kCuda;
  r.gpus = cuda ? plan.config.procs_per_node : 0;
  // The plan's threads: each rank computes (CPU) or runs the CPU AdamW (CUDA) on cpu_threads.
  r.cpu_millis = plan.config.procs_per_node * std::max<int64_t>(1, plan.cpu_threads) * 1000;
  // /dev/shm: NCCL's SHM transport and the launcher's pipes. NCCL's per-peer buffers are a few
  // MiB (NCCL_BUFFSIZE 4 MiB by default, NCCL docs "Environment Variables"); 1 GiB per GPU rank
  // leaves room for many channels. Gloo (CPU) uses TCP, so a small one does.
  r.shm_bytes = cuda ? procs * kGiB : 256 * kMiB;
  // Host memory the plan itself needs on the node: offloaded state and pinned buffers, plus on
  // a CPU device the ranks' whole "device" memory (the planner's host check, cost_model.cpp).
  const double planned = plan.predicted.host_bytes_per_node +
                         (cuda ? 0.0 : plan.predicted.memory.total() * procs);
  // Margin: 10 % for allocator slack plus 512 MiB per rank process (binary, libraries, the CUDA
  // context's host side, data and comm buffers — measured RSS of a tiny CPU rank is ~60 MiB).
  // tmpfs pages in /dev/shm are charged to the pod's memory cgroup, so its size is added too.
  r.memory_bytes = planned * 1.10 + procs * 512 * kMiB + r.shm_bytes;
  // The grace period covers the SIGTERM checkpoint: at most the whole model state (fp32 master
  // weights, Adam m and v, and the bf16/fp32 weights: 16 bytes per parameter) written by one
  // node at a conservative 200 MB/s (a network-attached PVC), plus 30 s to stop; at least 60 s.
  const double checkpoint_bytes = static_cast<double>(plan.parameters) * 16.0;
  r.termination_grace_seconds =
      std::max<int64_t>(60, static_cast<int64_t>(std::ceil(checkpoint_bytes / 200e6)) + 30);
  return r;
}

double checkpoint_volume_bytes(const api::Plan& plan) {
  const double one = static_cast<double>(plan.parameters) * 16.0;
  const double keep = static_cast<double>(std::max<int64_t>(1, plan.checkpoint.keep));
  return std::max(kGiB, one * (keep + 1) * 1.25);
}

std::string checkpoint_claim_name(const std::string& job) {
  return job + "-checkpoints";
}

bool job_needs_checkpoint_claim(const api::TrainingJob& job, const ChildOptions& options) {
  return options.checkpoint_pvc && !job.spec.checkpoint.volume.is_object();
}

bool checkpoints_are_ephemeral(const api::TrainingJob& job, const ChildOptions& options) {
  const api::Json& volume = job.spec.checkpoint.volume;
  if (!volume.is_object()) return !options.checkpoint_pvc;
  return volume.contains("emptyDir");
}

Object render_checkpoint_claim(const Object& owner, const api::Plan& plan,
                               api::ClaimRetention retention, const ChildOptions& options) {
  const std::string job = owner["metadata"]["name"];
  // Every node's ranks write their shards into the same directory: one node can mount it
  // ReadWriteOnce, several need a shared (ReadWriteMany) volume.
  Object spec = {
      {"accessModes", {plan.config.nodes > 1 ? "ReadWriteMany" : "ReadWriteOnce"}},
      {"resources",
       {{"requests",
         {{"storage", options.checkpoint_size.empty()
                          ? std::to_string(static_cast<int64_t>(
                                std::ceil(checkpoint_volume_bytes(plan) / kGiB))) + "Gi"
                          : options.checkpoint_size}}}}}};
  if (!options.checkpoint_storage_class.empty())
    spec["storageClassName"] = options.checkpoint_storage_class;
  Object metadata = child_metadata(owner, checkpoint_claim_name(job));
  // Retain: no owner, so the garbage collector leaves the claim (and the progress in it) when
  // the job goes; the job label still finds it.
  if (retention == api::ClaimRetention::kRetain) metadata.erase("ownerReferences");
  return {{"apiVersion", "v1"},
          {"kind", "PersistentVolumeClaim"},
          {"metadata", metadata},
          {"spec", spec}};
}

api::GangScheduler gang_scheduler(const api::TrainingJob& job, const ChildOptions& options) {
  return job.spec.run_policy.scheduling.gang_scheduler.value_or(options.gang_scheduler);
}

const kube::Resource* pod_group_resource(api::GangScheduler scheduler) {
  if (scheduler == api::GangScheduler::kCoscheduling) return &kube::kCoschedulingPodGroups;
  if (scheduler == api::GangScheduler::kVolcano) return &kube::kVolcanoPodGroups;
  return nullptr;
}

Object render_pod_group(const Object& owner, const api::TrainingJob& job, const api::Plan& plan,
                        const ChildOptions& options) {
  const api::GangScheduler scheduler = gang_scheduler(job, options);
  const kube::Resource* resource = pod_group_resource(scheduler);
  if (!resource) throw kt::Error("render_pod_group: the gang scheduler has no PodGroup");
  const api::SchedulingPolicy& policy = job.spec.run_policy.scheduling;
  Object spec = {{"minMember", plan.config.nodes}};
  if (scheduler == api::GangScheduler::kCoscheduling) {
    spec["scheduleTimeoutSeconds"] =
        policy.schedule_timeout_seconds.value_or(kDefaultScheduleTimeoutSeconds);
  } else {
    // Volcano admits the group when minMember pods fit, and reserves minResources for it.
    const WorkerPodResources need = worker_pod_resources(plan);
    Object min_resources = {{"cpu", std::to_string(need.cpu_millis * plan.config.nodes) + "m"},
                            {"memory", mebibytes(need.memory_bytes * plan.config.nodes)}};
    if (need.gpus > 0) min_resources["nvidia.com/gpu"] = std::to_string(need.gpus * plan.config.nodes);
    spec["minResources"] = min_resources;
    if (!policy.queue.empty()) spec["queue"] = policy.queue;
  }
  return {{"apiVersion", resource->api_version()},
          {"kind", "PodGroup"},
          {"metadata", child_metadata(owner, owner["metadata"]["name"])},
          {"spec", spec}};
}

std::string kueue_pod_group_name(const std::string& job, int64_t attempt) {
  return job + "-a" + std::to_string(attempt);
}

std::string plan_config_map_name(const std::string& job) {
  return job + "-plan";
}

std::string worker_pod_name(const std::string& job, int64_t node_rank) {
  return job + "-worker-" + std::to_string(node_rank);
}

Object render_plan_config_map(const Object& owner, const api::Plan& plan, int64_t generation,
                              const std::string& inventory_hash, int64_t attempt) {
  const std::string job = owner["metadata"]["name"];
  Object meta = child_metadata(owner, plan_config_map_name(job));
  meta["annotations"] = {{kGenerationAnnotation, std::to_string(generation)},
                         {kInventoryHashAnnotation, inventory_hash},
                         {kPlanHashAnnotation, plan.plan_hash},
                         {kAttemptAnnotation, std::to_string(attempt)}};
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", meta},
          {"data", {{"plan.json", api::to_json(plan).dump(2) + "\n"}}}};
}

Object render_service(const Object& owner, const ChildOptions& options) {
  const std::string job = owner["metadata"]["name"];
  // Headless, and publishing not-ready addresses: the pods must resolve each other
  // (<job>-worker-0.<job>) before they are ready, since rendezvous is what makes them ready.
  return {{"apiVersion", "v1"},
          {"kind", "Service"},
          {"metadata", child_metadata(owner, job)},
          {"spec",
           {{"clusterIP", "None"},
            {"publishNotReadyAddresses", true},
            {"selector", {{kJobNameLabel, job}}},
            {"ports",
             {{{"name", "rendezvous"}, {"port", options.master_port}, {"protocol", "TCP"}},
              {{"name", "metrics"}, {"port", options.metrics_port}, {"protocol", "TCP"}}}}}}};
}

namespace {

// The restricted Pod Security Standard (kubernetes.io/docs/concepts/security/
// pod-security-standards): kubetrain's pods need no privilege and write only to their volumes.
// 65532 is the image's user; fsGroup makes a checkpoint PVC writable.
Object restricted_container_security() {
  return {{"allowPrivilegeEscalation", false},
          {"readOnlyRootFilesystem", true},
          {"capabilities", {{"drop", {"ALL"}}}}};
}
// The operator's imagePullSecrets for worker and profiling pods (none: the field is left out).
void add_pull_secrets(Object& pod_spec, const ChildOptions& options) {
  if (options.image_pull_secrets.empty()) return;
  Object secrets = Object::array();
  for (const std::string& secret : options.image_pull_secrets) secrets.push_back({{"name", secret}});
  pod_spec["imagePullSecrets"] = secrets;
}
Object restricted_pod_security() {
  return {{"runAsNonRoot", true},
          {"runAsUser", kWorkerUid},
          {"runAsGroup", kWorkerUid},
          {"fsGroup", kWorkerUid},
          {"seccompProfile", {{"type", "RuntimeDefault"}}}};
}

}  // namespace

Object render_worker_pod(const Object& owner, const api::TrainingJob& job, const api::Plan& plan,
                         int64_t node_rank, int64_t attempt, const ChildOptions& options) {
  const std::string name = job.metadata.name;
  const std::string pod_name = worker_pod_name(name, node_rank);
  Object meta = child_metadata(owner, pod_name);
  meta["labels"][kNodeRankLabel] = std::to_string(node_rank);
  meta["labels"][kRestartAttemptLabel] = std::to_string(attempt);
  meta["labels"][kPlanHashLabel] = plan.plan_hash;
  meta["labels"]["app.kubernetes.io/name"] = "kubetrain-worker";
  meta["labels"]["app.kubernetes.io/managed-by"] = "kubetrain-operator";
  meta["annotations"] = {{kPlanHashAnnotation, plan.plan_hash}};
  const WorkerPodResources need = worker_pod_resources(plan);

  const auto& spec = job.spec;
  Object volumes = Object::array();
  Object mounts = Object::array();
  volumes.push_back({{"name", "plan"}, {"configMap", {{"name", plan_config_map_name(name)}}}});
  mounts.push_back({{"name", "plan"}, {"mountPath", kPlanMountDir}, {"readOnly", true}});
  // Checkpoints: the job's volume, else the PVC the operator made for it (so that a restarted
  // gang resumes), else (checkpoint_pvc off) an emptyDir, which survives container restarts only.
  Object checkpoints =
      spec.checkpoint.volume.is_object() ? spec.checkpoint.volume
      : options.checkpoint_pvc
          ? Object{{"persistentVolumeClaim", {{"claimName", checkpoint_claim_name(name)}}}}
          : Object{{"emptyDir", Object::object()}};
  checkpoints["name"] = "checkpoints";
  volumes.push_back(checkpoints);
  mounts.push_back({{"name", "checkpoints"}, {"mountPath", kCheckpointDir}});
  // A memory-backed /dev/shm (the container runtime's default is 64 MiB, too small for NCCL)
  // and a writable /tmp, since the root filesystem is read-only.
  volumes.push_back({{"name", "dshm"},
                     {"emptyDir", {{"medium", "Memory"}, {"sizeLimit", mebibytes(need.shm_bytes)}}}});
  mounts.push_back({{"name", "dshm"}, {"mountPath", "/dev/shm"}});
  volumes.push_back({{"name", "tmp"}, {"emptyDir", Object::object()}});
  mounts.push_back({{"name", "tmp"}, {"mountPath", "/tmp"}});
  if (spec.data.volume.is_object()) {
    Object data = spec.data.volume;
    data["name"] = "data";
    volumes.push_back(data);
    mounts.push_back({{"name", "data"}, {"mountPath", kDataDir}, {"readOnly", true}});
  }

  const int64_t procs = plan.config.procs_per_node;
  Object env = Object::array({
      env_var("MASTER_ADDR", worker_pod_name(name, 0) + "." + name),
      env_var("MASTER_PORT", std::to_string(options.master_port)),
      env_var("WORLD_SIZE", std::to_string(plan.world)),
      env_var("NNODES", std::to_string(plan.config.nodes)),
      env_var("NODE_RANK", std::to_string(node_rank)),
      env_var("NPROC_PER_NODE", std::to_string(procs)),
      env_var("KUBETRAIN_PLAN", kPlanPath),
      env_var("KUBETRAIN_RESTART_ATTEMPT", std::to_string(attempt)),
      // Rank 0 writes its final progress there; the kubelet reports it in the pod's status.
      env_var("KUBETRAIN_TERMINATION_MESSAGE_PATH", kTerminationMessagePath),
      env_var("KUBETRAIN_JOB_NAME", name),
      env_var("KUBETRAIN_PLAN_HASH", plan.plan_hash),
      {{"name", "POD_NAME"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.name"}}}}}},
      {{"name", "POD_NAMESPACE"},
       {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.namespace"}}}}}},
  });

  // Requests from the plan, so that the scheduler puts the pod where it fits; the job's own
  // spec.resources.resources wins where it sets a value, except the GPUs, which the plan fixes.
  // Memory limit = request: a rank that outgrows its plan is stopped there, not by the node's
  // OOM killer among its neighbours. No CPU limit: CFS throttling stalls a rank's collectives
  // and with them the whole gang (requests still reserve the cores).
  Object resources =
      spec.resources.resources.is_object() ? spec.resources.resources : Object::object();
  if (!resources.contains("requests") || !resources["requests"].is_object())
    resources["requests"] = Object::object();
  if (!resources.contains("limits") || !resources["limits"].is_object())
    resources["limits"] = Object::object();
  default_resource(resources, "requests", "cpu", std::to_string(need.cpu_millis) + "m");
  default_resource(resources, "requests", "memory", mebibytes(need.memory_bytes));
  default_resource(resources, "limits", "memory", resources["requests"]["memory"].get<std::string>());
  if (need.gpus > 0) {
    resources["limits"]["nvidia.com/gpu"] = std::to_string(need.gpus);
    resources["requests"]["nvidia.com/gpu"] = std::to_string(need.gpus);
  }

  Object container = {
      {"name", "worker"},
      {"image", spec.resources.image.empty() ? options.default_image : spec.resources.image},
      {"command", {"kubetrain-worker"}},
      {"args",
       {"launch", "--plan", kPlanPath, "--checkpoint-dir", kCheckpointDir, "--metrics-port",
        std::to_string(options.metrics_port)}},
      {"env", env},
      {"terminationMessagePath", kTerminationMessagePath},
      {"ports",
       {{{"name", "rendezvous"}, {"containerPort", options.master_port}},
        {{"name", "metrics"}, {"containerPort", options.metrics_port}}}},
      {"volumeMounts", mounts},
      {"resources", resources},
      {"securityContext", restricted_container_security()},
  };

  // Placement: the plan names the node of each node rank; the scheduler (or the local pod
  // runner) binds the pod there and checks that it fits.
  Object node_selector = Object::object();
  for (const auto& [k, v] : spec.resources.node_selector) node_selector[k] = v;
  if (node_rank < static_cast<int64_t>(plan.placement.size()))
    node_selector["kubernetes.io/hostname"] = plan.placement[static_cast<size_t>(node_rank)];

  Object pod_spec = {{"hostname", pod_name},
                     {"subdomain", name},
                     {"restartPolicy", "Never"},
                     // SIGTERM makes the worker checkpoint before it exits (docs/WORKER.md).
                     {"terminationGracePeriodSeconds", need.termination_grace_seconds},
                     {"securityContext", restricted_pod_security()},
                     {"nodeSelector", node_selector},
                     {"containers", Object::array({container})},
                     {"volumes", volumes}};
  add_pull_secrets(pod_spec, options);
  switch (gang_scheduler(job, options)) {
    case api::GangScheduler::kNone:
      break;
    case api::GangScheduler::kCoscheduling:
      meta["labels"][kube::kCoschedulingPodGroupLabel] = name;
      if (!options.gang_scheduler_name.empty())
        pod_spec["schedulerName"] = options.gang_scheduler_name;
      break;
    case api::GangScheduler::kVolcano:
      meta["annotations"][kube::kVolcanoGroupAnnotation] = name;
      pod_spec["schedulerName"] =
          options.gang_scheduler_name.empty() ? "volcano" : options.gang_scheduler_name;
      break;
    case api::GangScheduler::kKueue:
      // Kueue's pod webhook gates these pods (kueue.x-k8s.io/admission) until the whole group
      // is admitted; the controller waits for gated pods as for any Pending one.
      meta["labels"][api::kKueueQueueLabel] = api::queue_name(job);
      meta["labels"][kube::kKueuePodGroupLabel] = kueue_pod_group_name(name, attempt);
      meta["annotations"][kube::kKueuePodGroupTotalCountAnnotation] = std::to_string(plan.config.nodes);
      break;
  }
  if (!spec.resources.tolerations.is_null()) pod_spec["tolerations"] = spec.resources.tolerations;
  if (!spec.resources.affinity.is_null()) pod_spec["affinity"] = spec.resources.affinity;
  return {{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", meta}, {"spec", pod_spec}};
}

Object render_profiling_pod(const std::string& ns, const std::string& name,
                            const ProfilingTarget& target, const std::string& image, bool quick,
                            const std::string& started, const ChildOptions& options) {
  const bool gpu = target.gpus > 0;
  Object command = {"kubetrain-worker", "profile", "--termination-message", "--device",
                    gpu ? "cuda" : "cpu"};
  if (gpu) command.push_back("--kind"), command.push_back(target.kind);
  if (quick) command.push_back("--quick");
  // It measures with every core of the node, and asks for one: a request of the node's every
  // core would never fit beside the node's daemons (the job waits meanwhile, so nothing of
  // kubetrain's runs beside it). A GPU node's every GPU: two of them for NCCL, and none busy.
  Object resources = {{"requests", {{"cpu", "1"}, {"memory", "1Gi"}}}};
  if (gpu) {
    resources["requests"]["nvidia.com/gpu"] = std::to_string(target.gpus);
    resources["limits"]["nvidia.com/gpu"] = std::to_string(target.gpus);
  }
  const Object container = {
      {"name", "profile"},
      {"image", image.empty() ? options.default_image : image},
      {"command", command},
      {"env",
       Object::array({env_var("KUBETRAIN_TERMINATION_MESSAGE_PATH", kTerminationMessagePath)})},
      {"terminationMessagePath", kTerminationMessagePath},
      {"resources", resources},
      {"securityContext", restricted_container_security()}};
  Object pod_spec = {{"restartPolicy", "Never"},
                     {"securityContext", restricted_pod_security()},
                     {"nodeSelector", {{"kubernetes.io/hostname", target.hostname}}},
                     {"containers", Object::array({container})}};
  add_pull_secrets(pod_spec, options);
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata",
           {{"name", name},
            {"namespace", ns},
            {"labels", {{kProfilingLabel, target.label}}},
            {"annotations",
             {{kNodeKindAnnotation, target.kind}, {kProfilingStartedAnnotation, started}}}}},
          {"spec", pod_spec}};
}

}  // namespace kt::controller

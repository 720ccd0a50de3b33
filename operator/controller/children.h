// The objects a TrainingJob owns (docs/OPERATIONS.md §2), rendered from the job and its Plan: the
// ConfigMap `<job>-plan` with plan.json, the headless Service `<job>`, and one worker Pod per node
// `<job>-worker-<node-rank>`. Names are deterministic so that creating them is idempotent.
#pragma once

#include <string>
#include <vector>

#include "api/plan.h"
#include "api/training_job.h"
#include "operator/kube/client.h"

namespace kt::controller {

// Labels on every child; the restart attempt tells one gang generation from the next.
inline constexpr const char* kJobNameLabel = "kubetrain.dev/job-name";
inline constexpr const char* kNodeRankLabel = "kubetrain.dev/node-rank";
inline constexpr const char* kRestartAttemptLabel = "kubetrain.dev/restart-attempt";
// On worker pods, so that an admin can select the pods of one plan.
inline constexpr const char* kPlanHashLabel = "kubetrain.dev/plan-hash";
// Annotations on the plan ConfigMap: the controller's record of what the job runs, so that a
// restarted controller keeps the plan and the attempt (it has no other memory).
inline constexpr const char* kGenerationAnnotation = "kubetrain.dev/generation";
inline constexpr const char* kInventoryHashAnnotation = "kubetrain.dev/inventory-hash";
inline constexpr const char* kPlanHashAnnotation = "kubetrain.dev/plan-hash";
inline constexpr const char* kAttemptAnnotation = "kubetrain.dev/restart-attempt";
// On a pod: the port its metrics are really served on, when a runtime remapped the container
// port (the local pod runner does: every local pod shares 127.0.0.1).
inline constexpr const char* kMetricsPortAnnotation = "kubetrain.dev/metrics-port";

// Gang scheduling (docs/OPERATIONS.md, "Gang scheduling"). Coscheduling: a PodGroup
// scheduling.x-k8s.io/v1alpha1 `<job>` and kube::kCoschedulingPodGroupLabel on the pods;
// Volcano: a PodGroup scheduling.volcano.sh/v1beta1 `<job>`, kube::kVolcanoGroupAnnotation and
// schedulerName volcano; Kueue's plain pod groups: the queue label, a group name per restart
// attempt and the group's pod count.
inline constexpr int64_t kDefaultScheduleTimeoutSeconds = 60;

inline constexpr const char* kPlanMountDir = "/etc/kubetrain";
inline constexpr const char* kPlanPath = "/etc/kubetrain/plan.json";
// Kubernetes' default terminationMessagePath: rank 0's final progress (Prometheus text).
inline constexpr const char* kTerminationMessagePath = "/dev/termination-log";
inline constexpr const char* kCheckpointDir = "/var/lib/kubetrain/checkpoints";
inline constexpr const char* kDataDir = "/data";

// The non-root user of the image (Dockerfile) that worker pods run as.
inline constexpr int64_t kWorkerUid = 65532;

// What one worker pod needs from its node, from the plan (docs/INSTALL.md, "Worker pods");
// children.cpp says where each figure comes from.
struct WorkerPodResources {
  int64_t gpus = 0;
  int64_t cpu_millis = 0;   // the ranks' threads
  double memory_bytes = 0;  // planned host memory + margin + /dev/shm
  double shm_bytes = 0;     // the memory-backed /dev/shm
  int64_t termination_grace_seconds = 60;  // covers the SIGTERM checkpoint write
};
WorkerPodResources worker_pod_resources(const api::Plan& plan);

struct ChildOptions {
  std::string default_image = "ghcr.io/kubetrain/kubetrain-worker:0.1.0";
  int master_port = 29500;
  int metrics_port = 9090;
  std::vector<std::string> image_pull_secrets;  // imagePullSecrets of worker pods
  // Checkpoints of a job that names no spec.checkpoint.volume: a PVC `<job>-checkpoints` the
  // operator creates (so that a restarted gang, a suspended and resumed job, keeps its
  // progress), or, with checkpoint_pvc false, an emptyDir (lost with the pod).
  bool checkpoint_pvc = true;
  std::string checkpoint_storage_class;  // "" = the cluster's default StorageClass
  std::string checkpoint_size;           // "" = from the model (checkpoint_volume_bytes)
  // The gang scheduler of a job whose spec.runPolicy.schedulingPolicy names none.
  api::GangScheduler gang_scheduler = api::GangScheduler::kNone;
  // The worker pods' schedulerName under Coscheduling ("": the cluster's default scheduler,
  // where the plugin runs in the default profile) and Volcano ("": "volcano").
  std::string gang_scheduler_name;
};

// The job's gang scheduler: its spec's, else the operator's default.
api::GangScheduler gang_scheduler(const api::TrainingJob& job, const ChildOptions& options);
// The PodGroup collection of a scheduler that has one (Coscheduling, Volcano), else nullptr.
const kube::Resource* pod_group_resource(api::GangScheduler scheduler);
// The PodGroup `<job>` for Coscheduling or Volcano: every worker pod of the plan (minMember),
// admitted all at once or not at all.
kube::Object render_pod_group(const kube::Object& owner, const api::TrainingJob& job,
                              const api::Plan& plan, const ChildOptions& options);
// Kueue's pod group of one restart attempt ("<job>-a<attempt>"): a new gang is a new workload.
std::string kueue_pod_group_name(const std::string& job, int64_t attempt);

// A profiling pod (ControllerOptions::profiling): `kubetrain-worker profile --device cpu|cuda
// --termination-message [--quick]` on the node whose kubernetes.io/hostname is `hostname`, with
// the worker pods' security and pull secrets; labelled with the node kind (kProfilingLabel) and
// the time it was started (by the operator's clock). A CPU kind requests one core (it measures
// with all of them); a GPU kind every GPU of the node (`--kind` names it; NCCL between two).
inline constexpr const char* kProfilingLabel = "kubetrain.dev/profiling";
inline constexpr const char* kNodeKindAnnotation = "kubetrain.dev/node-kind";
inline constexpr const char* kProfilingStartedAnnotation = "kubetrain.dev/profiling-started";
struct ProfilingTarget {
  std::string kind;      // "cpu" or a built-in GPU profile's name
  std::string label;     // the kind as a label value ("h100-sxm")
  std::string hostname;  // the node's kubernetes.io/hostname
  int64_t gpus = 0;      // the node's allocatable GPUs (0: a CPU node)
};
kube::Object render_profiling_pod(const std::string& ns, const std::string& name,
                                  const ProfilingTarget& target, const std::string& image,
                                  bool quick, const std::string& started,
                                  const ChildOptions& options);

// Bytes a job's checkpoint volume needs: `keep` checkpoints and one being written, each of
// 16 bytes per parameter (fp32 weights, Adam m and v, and the bf16/fp32 copy), plus 25 %;
// at least 1 GiB.
double checkpoint_volume_bytes(const api::Plan& plan);
std::string checkpoint_claim_name(const std::string& job);
// False when the job names its own volume or the operator is told to use emptyDir.
bool job_needs_checkpoint_claim(const api::TrainingJob& job, const ChildOptions& options);
// Owned by the job (deleted with it) unless `retention` is Retain.
kube::Object render_checkpoint_claim(const kube::Object& owner, const api::Plan& plan,
                                     api::ClaimRetention retention, const ChildOptions& options);
// True when a restart of the gang loses every checkpoint: the job's volume is an emptyDir, or it
// names none and the operator is told to use emptyDir.
bool checkpoints_are_ephemeral(const api::TrainingJob& job, const ChildOptions& options);

std::string plan_config_map_name(const std::string& job);
std::string worker_pod_name(const std::string& job, int64_t node_rank);

// `owner` is the TrainingJob object as stored (its uid makes the ownerReference).
kube::Object render_plan_config_map(const kube::Object& owner, const api::Plan& plan,
                                    int64_t generation, const std::string& inventory_hash,
                                    int64_t attempt);
kube::Object render_service(const kube::Object& owner, const ChildOptions& options);
kube::Object render_worker_pod(const kube::Object& owner, const api::TrainingJob& job,
                               const api::Plan& plan, int64_t node_rank, int64_t attempt,
                               const ChildOptions& options);

}  // namespace kt::controller

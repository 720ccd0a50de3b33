#include "operator/controller/children.h"

namespace kt::controller {

using kube::Object;

namespace {

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

}  // namespace

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

Object render_worker_pod(const Object& owner, const api::TrainingJob& job, const api::Plan& plan,
                         int64_t node_rank, int64_t attempt, const ChildOptions& options) {
  const std::string name = job.metadata.name;
  const std::string pod_name = worker_pod_name(name, node_rank);
  Object meta = child_metadata(owner, pod_name);
  meta["labels"][kNodeRankLabel] = std::to_string(node_rank);
  meta["labels"][kRestartAttemptLabel] = std::to_string(attempt);
  meta["annotations"] = {{kPlanHashAnnotation, plan.plan_hash}};

  const auto& spec = job.spec;
  Object volumes = Object::array();
  Object mounts = Object::array();
  volumes.push_back({{"name", "plan"}, {"configMap", {{"name", plan_config_map_name(name)}}}});
  mounts.push_back({{"name", "plan"}, {"mountPath", kPlanMountDir}, {"readOnly", true}});
  // Checkpoints: the job's volume (a PVC, so that a restarted gang resumes), else an emptyDir
  // (which survives container restarts only).
  Object checkpoints = spec.checkpoint.volume.is_object() ? spec.checkpoint.volume
                                                          : Object{{"emptyDir", Object::object()}};
  checkpoints["name"] = "checkpoints";
  volumes.push_back(checkpoints);
  mounts.push_back({{"name", "checkpoints"}, {"mountPath", kCheckpointDir}});
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
  });

  Object resources =
      spec.resources.resources.is_object() ? spec.resources.resources : Object::object();
  if (plan.device == api::DeviceKind::kCuda) {
    resources["limits"]["nvidia.com/gpu"] = std::to_string(procs);
    resources["requests"]["nvidia.com/gpu"] = std::to_string(procs);
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
  };
  if (!resources.empty()) container["resources"] = resources;

  // Placement: the plan names the node of each node rank; the scheduler (or the local pod
  // runner) binds the pod there and checks that it fits.
  Object node_selector = Object::object();
  for (const auto& [k, v] : spec.resources.node_selector) node_selector[k] = v;
  if (node_rank < static_cast<int64_t>(plan.placement.size()))
    node_selector["kubernetes.io/hostname"] = plan.placement[static_cast<size_t>(node_rank)];

  Object pod_spec = {{"hostname", pod_name},
                     {"subdomain", name},
                     {"restartPolicy", "Never"},
                     // SIGTERM makes the worker checkpoint before it exits (DESIGN.md §7).
                     {"terminationGracePeriodSeconds", 60},
                     {"nodeSelector", node_selector},
                     {"containers", Object::array({container})},
                     {"volumes", volumes}};
  if (!spec.resources.tolerations.is_null()) pod_spec["tolerations"] = spec.resources.tolerations;
  if (!spec.resources.affinity.is_null()) pod_spec["affinity"] = spec.resources.affinity;
  return {{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", meta}, {"spec", pod_spec}};
}

}  // namespace kt::controller

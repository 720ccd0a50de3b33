#!/usr/bin/env bash
# Simulated nodes (docs/KUBE.md, like KWOK) with the real kubectl and the operator binary:
# `kubetrain local serve --simulate-nodes 3` lists three 8 × H100 Nodes with GPU Feature
# Discovery's labels; a TrainingJob of 2 nodes × 8 GPUs gets its pods scheduled to simulated
# nodes, where the fake kubelet makes them Running; a pod that asks for more GPUs than any node
# has stays Pending with the scheduler's Unschedulable message; the exit-code annotation ends
# the job's pods on demand and the job Succeeds.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
KT=$1
OPERATOR=$2
require_kubectl
with_scratch

"$KT" local serve --help | grep -- "--simulate-nodes" >/dev/null || fail "--help lists no --simulate-nodes"
"$KT" local serve --simulate-nodes 3 --simulate-pod-start-delay 1 \
  --kubeconfig-out "$OUT/kubeconfig" --workdir "$OUT/work" > "$OUT/serve.log" 2>&1 &
PIDS+=($!)
wait_for 10 test -s "$OUT/kubeconfig" || fail "local serve wrote no kubeconfig"
K() { kubectl --kubeconfig "$OUT/kubeconfig" --request-timeout=20s "$@"; }

# ---- the Nodes ----
K get nodes -l kubetrain.dev/simulated=true > "$OUT/nodes.txt" || fail "kubectl get nodes"
cat "$OUT/nodes.txt"
[[ $(grep -c '^sim-node-0000[0-2] *Ready ' "$OUT/nodes.txt") -eq 3 ]] || fail "3 Ready simulated nodes: $(cat "$OUT/nodes.txt")"
K get nodes -o json > "$OUT/nodes.json"
python3 - "$OUT/nodes.json" <<'PY' || fail "node labels/resources: $(head -c 3000 "$OUT/nodes.json")"
import json, sys
nodes = {n["metadata"]["name"]: n for n in json.load(open(sys.argv[1]))["items"]}
sim = sorted(n for n in nodes if n.startswith("sim-node-"))
assert sim == ["sim-node-00000", "sim-node-00001", "sim-node-00002"], sorted(nodes)
for name in sim:
    labels, status = nodes[name]["metadata"]["labels"], nodes[name]["status"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3", labels
    assert labels["nvidia.com/gpu.count"] == "8" and labels["nvidia.com/gpu.present"] == "true", labels
    assert labels["nvidia.com/gpu.memory"] == "81559", labels
    assert labels["kubernetes.io/hostname"] == name, labels
    assert labels["node.kubernetes.io/instance-type"], labels
    for key in ("capacity", "allocatable"):
        assert status[key]["nvidia.com/gpu"] == "8" and status[key]["pods"] == "110", status
        assert status[key]["cpu"] == "224" and status[key]["memory"] == "2048Gi", status
    assert [c["status"] for c in status["conditions"] if c["type"] == "Ready"] == ["True"], status
PY

# ---- a TrainingJob of 2 nodes x 8 GPUs on them ----
K apply -f crds/trainingjobs.kubetrain.dev.yaml > /dev/null || fail "apply CRD"
"$OPERATOR" --kubeconfig "$OUT/kubeconfig" --metrics-bind-address 127.0.0.1:0 \
  --health-probe-bind-address 127.0.0.1:0 > "$OUT/op.log" 2>&1 &
PIDS+=($!)
cat > "$OUT/job.yaml" <<'YAML'
apiVersion: kubetrain.dev/v1alpha1
kind: TrainingJob
metadata:
  name: sim
spec:
  model: {preset: gpt2-124m}
  training: {steps: 100, globalBatchSize: 32}
  data: {source: synthetic}
  resources: {maxNodes: 2, gpusPerNode: 8}
  parallelism: {tensorParallel: 1, dataParallel: 16}
YAML
K apply -f "$OUT/job.yaml" > /dev/null || fail "apply the job"
running() {
  [[ "$(K get pod sim-worker-0 -o jsonpath='{.status.phase}')" == Running &&
     "$(K get pod sim-worker-1 -o jsonpath='{.status.phase}')" == Running ]]
}
wait_for 60 running || fail "the job's pods did not run: $(K get pods -o wide 2>&1)"
K get pods -o wide | tee "$OUT/pods.txt"
for rank in 0 1; do
  node=$(K get pod sim-worker-$rank -o jsonpath='{.spec.nodeName}')
  [[ $node == sim-node-* ]] || fail "sim-worker-$rank on node '$node', not a simulated one"
done
[[ "$(K get pod sim-worker-0 -o jsonpath='{.spec.nodeName}')" != "$(K get pod sim-worker-1 -o jsonpath='{.spec.nodeName}')" ]] ||
  fail "both 8-GPU pods on one node"
job_phase() { K get tj "$1" -o jsonpath='{.status.phase}'; }
wait_for 30 eval '[[ "$(job_phase sim)" == Running ]]' || fail "job phase $(job_phase sim), not Running"

# ---- a pod that needs more GPUs than any node has ----
cat > "$OUT/big.yaml" <<'YAML'
apiVersion: v1
kind: Pod
metadata:
  name: too-big
spec:
  containers:
  - name: c
    image: busybox
    command: ["sleep", "3600"]
    resources:
      limits: {nvidia.com/gpu: "16"}
YAML
K apply -f "$OUT/big.yaml" > /dev/null || fail "apply too-big"
nodes_total=$(K get nodes -o name | wc -l)
unschedulable() {
  [[ "$(K get pod too-big -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].reason}')" == Unschedulable ]]
}
wait_for 30 unschedulable || fail "too-big not Unschedulable: $(K get pod too-big -o yaml)"
message=$(K get pod too-big -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}')
echo "too-big: $message"
[[ "$message" == "0/$nodes_total nodes are available: $nodes_total Insufficient nvidia.com/gpu." ]] ||
  fail "message: $message"
[[ -z "$(K get pod too-big -o jsonpath='{.spec.nodeName}')" ]] || fail "too-big was bound"
[[ "$(K get pod too-big -o jsonpath='{.status.phase}')" == Pending ]] || fail "too-big not Pending"

# ---- a job that needs more GPUs than the cluster has: 4 nodes x 8 ----
sed -e 's/name: sim$/name: huge/' -e 's/maxNodes: 2/maxNodes: 4/' -e 's/dataParallel: 16/dataParallel: 32/' \
  "$OUT/job.yaml" > "$OUT/huge.yaml"
K apply -f "$OUT/huge.yaml" > /dev/null || fail "apply huge"
planned() { K get tj huge -o jsonpath='{.status.conditions[?(@.type=="Planned")].status}'; }
wait_for 30 eval '[[ -n "$(planned)" ]]' || fail "huge got no Planned condition: $(K get tj huge -o yaml)"
# The planner sees the free GPUs (allocatable minus the requests of the pods bound there): 8 of
# 24, so no plan, and no pod of huge is created or bound. (It needs 32 ranks and the cluster has 24
# GPUs in all, so it fails with NoFeasiblePlan rather than waiting for room.)
[[ "$(planned)" == False ]] || fail "huge was planned: $(K get tj huge -o yaml)"
reason=$(K get tj huge -o jsonpath='{.status.conditions[?(@.type=="Planned")].reason}')
message=$(K get tj huge -o jsonpath='{.status.conditions[?(@.type=="Planned")].message}')
echo "huge: $reason: $message"
[[ $reason == NoFeasiblePlan && $message == *"32 ranks but at most 8 are available"* ]] ||
  fail "huge's Planned condition: $reason: $message"
[[ -z "$(K get pods -l kubetrain.dev/job-name=huge -o name)" ]] || fail "huge has pods: $(K get pods -o wide)"

# ---- the exit-code annotation ends the pods: exit 0 on both, the job Succeeds ----
K annotate pod sim-worker-0 sim-worker-1 kubetrain.dev/simulate-exit-code=0 > /dev/null || fail "annotate"
wait_for 60 eval '[[ "$(job_phase sim)" == Succeeded ]]' ||
  fail "job phase $(job_phase sim) after both pods exited 0: $(K get pods 2>&1)"
[[ "$(K get pod sim-worker-0 -o jsonpath='{.status.containerStatuses[0].state.terminated.exitCode}')" == 0 ]] ||
  fail "sim-worker-0's exit code"
echo "PASS"

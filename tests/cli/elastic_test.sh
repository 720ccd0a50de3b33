#!/usr/bin/env bash
# Elastic within bounds (docs/PLANNER.md §11b), with the real kubectl and the operator binary
# against `kubetrain local serve --simulate-nodes 2` (two 8 × H100 Nodes whose fake kubelet runs
# pods):
#  1. a gpt2-124m job with minNodes 1, maxNodes 2 is planned over both nodes;
#  2. one node goes NotReady and its worker dies (exit 137): the restart re-plans onto the node
#     that is left instead of waiting for the old shape; status.planHistory says InventoryChanged
#     and a Replanned event names both shapes;
#  3. the node is Ready again and the next restart plans over both again;
#  4. with minNodes 2, a restart that finds one Ready node waits (Pending, WaitingForResources,
#     the message naming spec.resources.minNodes, no pod made) and runs over both once the node
#     is Ready again (the operator wakes waiting jobs when a node comes back).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
KT=$1
OPERATOR=$2
require_kubectl
with_scratch

serve_simulated 2
run_operator

cat > "$OUT/job.yaml" <<'YAML'
apiVersion: kubetrain.dev/v1alpha1
kind: TrainingJob
metadata:
  name: el
spec:
  model: {preset: gpt2-124m}
  training: {steps: 100000, globalBatchSize: 32}
  data: {source: synthetic}
  resources: {minNodes: 1, maxNodes: 2}
  parallelism: {autotune: "off"}
YAML
K apply -f "$OUT/job.yaml" > /dev/null || fail "apply the job"

jp() { K get tj el -o jsonpath="$1"; }
pods_running() {  # pods_running N: N pods of the job, every one Running
  local phases
  phases=$(K get pods -l kubetrain.dev/job-name=el -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}')
  [[ $(grep -c . <<< "$phases") -eq $1 && $(grep -c '^Running$' <<< "$phases") -eq $1 ]]
}
node_ready() {  # node_ready NODE True|False
  K patch node "$1" --subresource=status --type=merge \
    -p "{\"status\":{\"conditions\":[{\"type\":\"Ready\",\"status\":\"$2\",\"reason\":\"Test\"}]}}" > /dev/null
}
pod_on() { K get pods -l kubetrain.dev/job-name=el -o jsonpath="{.items[?(@.spec.nodeName==\"$1\")].metadata.name}"; }
history_len() { jp '{.status.planHistory[*].reason}' | wc -w; }

# ---- 1. both nodes ----
wait_for 60 pods_running 2 || fail "2 running pods: $(K get pods -o wide 2>&1)"
[[ "$(jp '{.status.plan.nodes}')" == 2 ]] || fail "plan nodes $(jp '{.status.plan.nodes}'), not 2"
first_hash=$(jp '{.status.plan.planHash}')

# ---- 2. a node lost: re-planned onto the one left ----
node_ready sim-node-00001 False || fail "patch node status"
# (Not `K get nodes | grep -q`: under pipefail, grep -q's early exit can SIGPIPE kubectl.)
nodes=$(K get nodes)
grep -q "^sim-node-00001 *NotReady" <<< "$nodes" || fail "kubectl get nodes: $nodes"
victim=$(pod_on sim-node-00001)
[[ -n $victim ]] || fail "no pod on sim-node-00001"
K annotate pod "$victim" kubetrain.dev/simulate-exit-code=137 > /dev/null || fail "annotate"
replanned() { [[ "$(history_len)" -ge 1 && "$(jp '{.status.plan.nodes}')" == 1 ]]; }
wait_for 60 replanned || fail "no re-plan onto one node: $(K get tj el -o yaml)"
wait_for 60 pods_running 1 || fail "1 running pod: $(K get pods -o wide 2>&1)"
[[ "$(K get pods -l kubetrain.dev/job-name=el -o jsonpath='{.items[0].spec.nodeName}')" == sim-node-00000 ]] ||
  fail "the new gang is not on sim-node-00000: $(K get pods -o wide)"
[[ "$(jp '{.status.planHistory[0].reason}')" == InventoryChanged ]] || fail "history: $(jp '{.status.planHistory}')"
[[ "$(jp '{.status.planHistory[0].fromPlanHash}')" == "$first_hash" ]] || fail "history from: $(jp '{.status.planHistory}')"
[[ "$(jp '{.status.planHistory[0].toPlanHash}')" == "$(jp '{.status.plan.planHash}')" ]] || fail "history to"
[[ "$(jp '{.status.restarts}')" == 1 ]] || fail "restarts $(jp '{.status.restarts}')"
K get events > "$OUT/events.txt"
grep -q "Normal *Replanned *trainingjob/el *the usable nodes or their figures changed: 2 node(s) × 8" "$OUT/events.txt" ||
  fail "no Replanned event: $(cat "$OUT/events.txt")"

# ---- 3. the node is back: the next restart plans over both ----
node_ready sim-node-00001 True || fail "patch node status"
K annotate pod "$(pod_on sim-node-00000)" kubetrain.dev/simulate-exit-code=137 > /dev/null || fail "annotate"
back() { [[ "$(history_len)" -ge 2 && "$(jp '{.status.plan.nodes}')" == 2 ]]; }
wait_for 60 back || fail "no re-plan onto two nodes: $(K get tj el -o yaml)"
wait_for 60 pods_running 2 || fail "2 running pods again: $(K get pods -o wide 2>&1)"

# ---- 4. minNodes 2: a restart with one Ready node waits for the other ----
K patch tj el --type=merge -p '{"spec":{"resources":{"minNodes":2}}}' > /dev/null || fail "patch minNodes"
wait_for 60 eval '[[ "$(jp "{.status.observedGeneration}")" == 2 ]]' || fail "generation 2 not observed"
wait_for 60 pods_running 2 || fail "2 running pods at generation 2: $(K get pods -o wide 2>&1)"
node_ready sim-node-00001 False || fail "patch node status"
K annotate pod "$(pod_on sim-node-00001)" kubetrain.dev/simulate-exit-code=137 > /dev/null || fail "annotate"
waiting() {
  [[ "$(jp '{.status.phase}')" == Pending &&
     "$(jp '{.status.conditions[?(@.type=="Planned")].reason}')" == WaitingForResources ]]
}
wait_for 60 waiting || fail "not waiting: $(K get tj el -o yaml)"
message=$(jp '{.status.conditions[?(@.type=="Planned")].message}')
echo "waiting: $message"
[[ $message == *"spec.resources.minNodes: is 2 but 1 schedulable node(s)"* ]] || fail "message: $message"
sleep 2
[[ -z "$(K get pods -l kubetrain.dev/job-name=el -o name)" ]] || fail "pods while waiting: $(K get pods -o wide)"
node_ready sim-node-00001 True || fail "patch node status"
# Woken by the node's return, well before the 30 s a waiting job is looked at again anyway.
wait_for 20 pods_running 2 || fail "no 2-node gang after the node came back: $(K get tj el -o yaml)"
[[ "$(jp '{.status.plan.nodes}')" == 2 ]] || fail "plan nodes $(jp '{.status.plan.nodes}')"
echo "PASS"

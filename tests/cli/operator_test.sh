#!/usr/bin/env bash
# The operator binary end to end, over HTTP, with the real kubectl: `kubetrain local serve` (this
# machine as a Node whose pods run as local processes) + `kubetrain-operator` + `kubectl apply` of
# the CRD and of examples/jobs/tiny.yaml → worker processes train → `kubectl get tj` shows
# Succeeded. The operator's /metrics passes promtool and counts the reconciles; /healthz and
# /readyz answer. Then two operators with --leader-elect: exactly one reconciles; SIGKILL it and
# the other takes the Lease over once it expires and reconciles a new job.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
KT=$1
OPERATOR=$2
require_kubectl
with_scratch
# The port an operator logged for "serving metrics" / "serving health probes".
port_of() { grep "msg=\"$2\"" "$1" | sed -n 's/.*address=[0-9.]*:\([0-9]*\).*/\1/p' | awk 'NR == 1'; }

"$KT" local serve --kubeconfig-out "$OUT/kubeconfig" --workdir "$OUT/work" > "$OUT/serve.log" 2>&1 &
PIDS+=($!)
wait_for 10 test -s "$OUT/kubeconfig" || fail "local serve wrote no kubeconfig"
K() { kubectl --kubeconfig "$OUT/kubeconfig" --request-timeout=20s "$@"; }
K apply -f crds/trainingjobs.kubetrain.dev.yaml > /dev/null || fail "apply CRD"

start_operator() {  # start_operator NAME [flags...]
  local name=$1; shift
  "$OPERATOR" --kubeconfig "$OUT/kubeconfig" --metrics-bind-address 127.0.0.1:0 \
    --health-probe-bind-address 127.0.0.1:0 "$@" > "$OUT/$name.log" 2>&1 &
  PIDS+=($!)
  LAST_PID=$!
  wait_for 10 grep -q 'msg="serving health probes"' "$OUT/$name.log" || fail "$name did not start"
}
phase() { K get tj "$1" -o jsonpath='{.status.phase}'; }
succeeded() { [[ "$(phase "$1")" == Succeeded ]]; }

# ---- one operator, one job ----
start_operator op
OP_PID=$LAST_PID
"$OPERATOR" --help | grep -- "--leader-elect" >/dev/null || fail "--help lists no --leader-elect"
K apply -f examples/jobs/tiny.yaml > /dev/null || fail "apply tiny"
running() { [[ "$(K get pod tiny-worker-0 -o jsonpath='{.status.phase}' 2>/dev/null)" == Running ]]; }
wait_for 120 running || fail "the worker pod did not run"
# The worker pod as the operator made it: requests from the plan, /dev/shm, restricted security.
K get pod tiny-worker-0 -o json > "$OUT/pod.json"
python3 - "$OUT/pod.json" <<'PY' || fail "worker pod spec: $(cat "$OUT/pod.json")"
import json, sys
pod = json.load(open(sys.argv[1]))
spec, c = pod["spec"], pod["spec"]["containers"][0]
r = c["resources"]
assert r["requests"]["cpu"].endswith("m") and int(r["requests"]["cpu"][:-1]) >= 1000, r
assert r["requests"]["memory"].endswith("Mi") and r["limits"]["memory"] == r["requests"]["memory"], r
shm = [v for v in spec["volumes"] if v["name"] == "dshm"][0]
assert shm["emptyDir"]["medium"] == "Memory", shm
assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"], c["volumeMounts"]
assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 65532
assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
sc = c["securityContext"]
assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
assert sc["capabilities"]["drop"] == ["ALL"], sc
assert pod["metadata"]["labels"]["kubetrain.dev/plan-hash"], pod["metadata"]["labels"]
PY
# What a user types while it runs: pods and events tables, logs, describe with its events.
K get pods > "$OUT/pods.txt"
grep -q "^NAME *READY *STATUS *RESTARTS *AGE" "$OUT/pods.txt" || fail "kubectl get pods: $(cat "$OUT/pods.txt")"
grep -q "^tiny-worker-0 *1/1 *Running *0 " "$OUT/pods.txt" || fail "kubectl get pods: $(cat "$OUT/pods.txt")"
K get nodes > "$OUT/nodes.txt" || fail "kubectl get nodes"
grep -q "^NAME *STATUS *ROLES *AGE *VERSION" "$OUT/nodes.txt" || fail "kubectl get nodes: $(cat "$OUT/nodes.txt")"
K get events > "$OUT/events.txt"
grep -q "^LAST SEEN *TYPE *REASON *OBJECT *MESSAGE" "$OUT/events.txt" || fail "kubectl get events: $(cat "$OUT/events.txt")"
grep -q "Normal *PlanChosen *trainingjob/tiny" "$OUT/events.txt" || fail "kubectl get events: $(cat "$OUT/events.txt")"
hasLog() { K logs tiny-worker-0 --tail 2 > "$OUT/tail.txt" 2>&1 && grep -q "step" "$OUT/tail.txt"; }
wait_for 60 hasLog || fail "kubectl logs: $(K logs tiny-worker-0 2>&1 | tail -3)"
[[ $(K logs tiny-worker-0 --tail 2 | wc -l) -eq 2 ]] || fail "kubectl logs --tail 2: $(K logs tiny-worker-0 --tail 2)"
if K logs tiny-worker-0 --previous 2> "$OUT/prev.txt"; then fail "kubectl logs --previous of a first container"; fi
grep -q 'previous terminated container "worker" in pod "tiny-worker-0" not found' "$OUT/prev.txt" ||
  fail "kubectl logs --previous: $(cat "$OUT/prev.txt")"
K describe tj tiny > "$OUT/describe.txt"
grep -A3 "^Events:" "$OUT/describe.txt" | grep "PlanChosen" >/dev/null || fail "kubectl describe tj: $(cat "$OUT/describe.txt")"
# -f follows the log until the pod ends.
timeout 300 kubectl --kubeconfig "$OUT/kubeconfig" logs -f tiny-worker-0 > "$OUT/follow.txt" || fail "kubectl logs -f did not end with the pod"
grep -q "step *200/200" "$OUT/follow.txt" || fail "kubectl logs -f: $(tail -3 "$OUT/follow.txt")"
wait_for 300 succeeded tiny || fail "tiny did not succeed (phase $(phase tiny))"
K get tj tiny | tee "$OUT/get.txt"
# Columns: NAME PHASE NODES TP DP OFFLOAD STEP LOSS TOK/S RESTARTS AGE; the loss and speed of a
# finished job come from rank 0's termination message.
grep -q "^tiny *Succeeded *1 *1 *1 *none *200 *[0-9.]\+ *[1-9][0-9.]* *0 " "$OUT/get.txt" ||
  fail "kubectl get tj: $(cat "$OUT/get.txt")"
K get tj tiny -o json > "$OUT/tiny.json"
python3 - "$OUT/tiny.json" <<'PY' || fail "status: $(cat "$OUT/tiny.json")"
import json, sys
s = json.load(open(sys.argv[1]))["status"]
conditions = {c["type"]: c["status"] for c in s["conditions"]}
assert conditions.get("Succeeded") == "True" and conditions.get("Planned") == "True", conditions
assert s["plan"]["configMap"] == "tiny-plan" and s["workers"]["succeeded"] == 1, s
assert s["observedGeneration"] == 1 and s.get("completionTime"), s
PY
grep -q "resumed\|step" "$OUT"/work/pods/default_tiny-worker-0*/log 2>/dev/null ||
  ls "$OUT/work/pods" > /dev/null || fail "no pod directory"
metrics_port=$(port_of "$OUT/op.log" "serving metrics")
health_port=$(port_of "$OUT/op.log" "serving health probes")
get "http://127.0.0.1:$metrics_port/metrics" > "$OUT/metrics" || fail "no /metrics"
grep -q '^controller_runtime_reconcile_total{controller="trainingjob",result="success"} [1-9]' "$OUT/metrics" ||
  fail "no successful reconciles counted: $(grep reconcile_total "$OUT/metrics")"
grep -q '^rest_client_requests_total{code="200"' "$OUT/metrics" || fail "no REST requests counted"
promtool check metrics < "$OUT/metrics" || fail "promtool rejects the operator's /metrics"
[[ "$(get "http://127.0.0.1:$health_port/healthz")" == ok ]] || fail "/healthz"
[[ "$(get "http://127.0.0.1:$health_port/readyz")" == ok ]] || fail "/readyz"
kill -TERM "$OP_PID"
wait "$OP_PID" || fail "the operator did not exit 0 on SIGTERM"

# ---- two operators with leader election ----
LEASE=(--leader-elect --leader-election-namespace default --leader-election-id e2e-lease)
start_operator a "${LEASE[@]}"
A_PID=$LAST_PID
start_operator b "${LEASE[@]}"
B_PID=$LAST_PID
wait_for 30 grep -q 'became the leader' "$OUT/a.log" "$OUT/b.log" || fail "nobody became the leader"
if grep -q 'became the leader' "$OUT/a.log"; then LEADER=a LPID=$A_PID OTHER=b; else LEADER=b LPID=$B_PID OTHER=a; fi
# A standby's only requests are its tries for the lease (a GET each retry period). Two more
# answered GETs than now: the second began after the first, which was answered after the leader
# had the lease, so the standby has seen it held at least once; then count the leaders.
lease_gets() {  # lease_gets NAME: the answered GETs NAME's operator has counted
  get "http://127.0.0.1:$(port_of "$OUT/$1.log" "serving metrics")/metrics" |
    sed -n 's/^rest_client_requests_total{code="200",method="GET"} \([0-9]*\).*/\1/p'
}
gets_before=$(lease_gets "$OTHER")
tried_twice() { local now; now=$(lease_gets "$OTHER"); (( ${now:-0} >= ${gets_before:-0} + 2 )); }
wait_for 30 tried_twice || fail "$OTHER did not try for the lease: $(lease_gets "$OTHER") GETs, $gets_before before"
echo "standby $OTHER: $(lease_gets "$OTHER") lease reads, $gets_before when $LEADER led"
leaders=$(grep -l 'became the leader' "$OUT/a.log" "$OUT/b.log" | wc -l)
[[ $leaders -eq 1 ]] || fail "$leaders leaders"
sed 's/name: tiny/name: tiny-two/' examples/jobs/tiny.yaml | K apply -f - > /dev/null
wait_for 300 succeeded tiny-two || fail "tiny-two did not succeed under the leader"
other_metrics=$(port_of "$OUT/$OTHER.log" "serving metrics")
get "http://127.0.0.1:$other_metrics/metrics" > "$OUT/other.metrics" || fail "standby /metrics"
if grep -q '^controller_runtime_reconcile_total{.*} [1-9]' "$OUT/other.metrics"; then
  fail "the standby reconciled: $(grep reconcile_total "$OUT/other.metrics")"
fi
grep -q '^leader_election_master_status{name="e2e-lease"} 0' "$OUT/other.metrics" ||
  fail "standby's leader_election_master_status: $(grep leader_election "$OUT/other.metrics")"
killed_at=$SECONDS
kill -KILL "$LPID"
# No release: the lease must expire (15 s) before the standby takes it; allow two retry periods.
wait_for 25 grep -q 'became the leader' "$OUT/$OTHER.log" || fail "$OTHER did not take over"
echo "takeover after $((SECONDS - killed_at)) s"
sed 's/name: tiny/name: tiny-three/' examples/jobs/tiny.yaml | K apply -f - > /dev/null
wait_for 300 succeeded tiny-three || fail "tiny-three did not succeed under the new leader"
echo "operator ok: tiny Succeeded via kubectl; one leader of two; $OTHER took over from $LEADER"

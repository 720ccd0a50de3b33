#!/usr/bin/env bash
# The Helm chart installed for real: a real helm v4 (server-side apply, its kstatus waiter, the
# Secret release storage) against `kubetrain local serve`, whose Deployment controller and pod
# runner run the chart's operator as a local process with its ServiceAccount's token, so RBAC
# decides what it may do.
#   helm install --wait → the operator pod runs → kubectl apply a TrainingJob → Succeeded
#   → every rule of the chart's RBAC removed in turn breaks the operator (403), restored it runs
#   → helm upgrade to 2 replicas (leader election: exactly one reconciles)
#   → helm uninstall: the CRD and the TrainingJobs stay (helm.sh/resource-policy: keep).
# Exit 77 (ctest: skipped) when helm or kubectl is missing (scripts/install-deps.sh installs helm).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
KT=$1
cd "$(dirname "$0")/../.."
for tool in helm kubectl python3; do
  command -v "$tool" > /dev/null || { echo "$tool not installed: skipped"; exit 77; }
done
OUT=$(mktemp -d)
SERVER_PID=""
cleanup() {
  if [[ -n "$SERVER_PID" ]]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$OUT"
}
trap cleanup EXIT
fail_context() {
  echo "--- server log (tail)"; tail -20 "$OUT/serve.log"
  echo "--- pods, TrainingJobs, the Lease"
  kubectl --request-timeout=10s get pods,trainingjobs,leases -A -o wide 2>&1 | tail -30 || true
  echo "--- pod directories"; ls "$OUT/work/pods" 2>&1 | tail -30
  echo "--- operator logs (tail)"
  local f
  for f in "$OUT"/work/pods/kubetrain-system_*/log; do
    [[ -f $f ]] && { echo "== $f"; tail -15 "$f"; }
  done
}

"$KT" local serve --kubeconfig-out "$OUT/kubeconfig" --workdir "$OUT/work" > "$OUT/serve.log" 2>&1 &
SERVER_PID=$!
wait_for 10 test -s "$OUT/kubeconfig" || fail "no kubeconfig written"
export KUBECONFIG=$OUT/kubeconfig
K() { kubectl --request-timeout=20s "$@"; }
NS=kubetrain-system

# ---- install ----
# The first job's namespace has no hardware profile: the operator measures one first. The full
# `profile` takes 80 s on an idle 2-core node, and under load it outlasted the first job's 180 s
# (CI, 2026-12-06); `profile --quick` takes a second and exercises the same RBAC.
QUICK_PROFILE=(--set profiling.quick=true)
helm install kt charts/kubetrain -n "$NS" --create-namespace "${QUICK_PROFILE[@]}" --wait --timeout 120s > "$OUT/install.txt" 2>&1 ||
  { cat "$OUT/install.txt"; fail "helm install"; }
[[ $(helm status kt -n "$NS" -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["info"]["status"])') == deployed ]] ||
  fail "helm status is not deployed"
[[ $(K get deploy kt-kubetrain -n "$NS" -o jsonpath='{.status.availableReplicas}') == 1 ]] || fail "the operator is not available"
# Helm 4 applied with server-side apply: its objects carry its managedFields.
K get deploy kt-kubetrain -n "$NS" -o json --show-managed-fields | python3 -c '
import json, sys
managers = {(m["manager"], m["operation"]) for m in json.load(sys.stdin)["metadata"]["managedFields"]}
assert ("helm", "Apply") in managers, managers' || fail "the Deployment was not server-side applied by helm"
operator_pod() { K get pods -n "$NS" -l app.kubernetes.io/name=kubetrain --field-selector status.phase=Running -o name | awk 'NR == 1'; }
operator_log() { cat "$OUT"/work/pods/kubetrain-system_kt-kubetrain-*/log 2>/dev/null; }
grep -q "kubeconfig.*kubetrain-system_kt-kubetrain" <(operator_log) || fail "the operator pod did not get its ServiceAccount's kubeconfig"

# Gang scheduling's PodGroup API (scheduler-plugins coscheduling), which every job below uses:
# the operator's podgroups rule is exercised too.
K apply -f tests/fixtures/podgroup-crds.yaml > /dev/null
job() {  # job NAME: a short tiny run that is deleted when done, so that every verb is used
  sed -e "s/name: tiny/name: $1/" -e 's/steps: 200/steps: 20/' examples/jobs/tiny.yaml > "$OUT/$1.yaml"
  cat >> "$OUT/$1.yaml" <<'YAML'
  runPolicy:
    cleanPodPolicy: All
    ttlSecondsAfterFinished: 0
    schedulingPolicy: {gangScheduler: Coscheduling}
YAML
  K apply -f "$OUT/$1.yaml" > /dev/null
}
gone() { ! K get tj "$1" > /dev/null 2>&1; }
job first
wait_for 180 gone first || fail "the first job did not succeed and get deleted (phase $(K get tj first -o jsonpath='{.status.phase}'))"
grep -q "forbidden" <(operator_log) && fail "the operator was refused something with the chart's RBAC"

# ---- each rule is needed ----
# Remove one rule of a role, restart the operator (its informers list again), run a job: the
# operator must be refused (403) before the job is done; then put the rule back.
# The operator pods running now; restart_operator deletes them and waits for new ones, whose
# log new_operator_log names (one of them: with 2 replicas, the leader's).
running_operators() { K get pods -n "$NS" -l app.kubernetes.io/name=kubetrain --field-selector status.phase=Running -o jsonpath='{.items[*].metadata.name}'; }
OLD_PODS=""
restart_operator() {
  OLD_PODS=$(running_operators)
  K delete pod -n "$NS" -l app.kubernetes.io/name=kubetrain --wait=false > /dev/null
  replaced() { local p; for p in $(running_operators); do [[ " $OLD_PODS " == *" $p "* ]] || return 0; done; return 1; }
  wait_for 60 replaced || fail "the operator pods were not replaced"
}
new_operator_log() {
  local p f leader=""
  for p in $(running_operators); do
    [[ " $OLD_PODS " == *" $p "* ]] && continue
    f="$OUT/work/pods/${NS}_$p/log"
    if [[ -z $leader ]] || grep -q "became the leader" "$f" 2>/dev/null || ! grep -q -- "--leader-elect" "$f" 2>/dev/null; then leader=$f; fi
  done
  echo "$leader"
}
strip_meta='import json,sys; r=json.load(open(sys.argv[1])); [r["metadata"].pop(k, None) for k in ("resourceVersion","uid","creationTimestamp","managedFields")]'
each_rule_is_needed() {  # each_rule_is_needed clusterrole|role NAME [-n NS]
  local kind=$1 name=$2; shift 2
  K get "$kind" "$name" "$@" -o json > "$OUT/role.json"
  local rules i rule before
  rules=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["rules"]))' "$OUT/role.json")
  (( rules > 0 )) || fail "$kind $name has no rules"
  for ((i = 0; i < rules; i++)); do
    rule=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["rules"][int(sys.argv[2])]; print(",".join(r["resources"]), "/", ",".join(r["verbs"]))' "$OUT/role.json" "$i")
    python3 -c "$strip_meta"'; del r["rules"][int(sys.argv[2])]; print(json.dumps(r))' "$OUT/role.json" "$i" > "$OUT/without.json"
    K replace -f "$OUT/without.json" > /dev/null
    # The Lease is created by the first leader: without one, `create` is exercised too.
    [[ $kind == role ]] && K delete lease kt-kubetrain -n "$NS" --ignore-not-found > /dev/null
    restart_operator
    job "rule-$kind-$i"
    refused() { grep -q "forbidden" "$(new_operator_log)" 2>/dev/null; }
    wait_for 90 refused || fail "without the rule [$rule] of $kind $name the operator was refused nothing"
    echo "without [$rule] of $kind $name: $(grep "forbidden" "$(new_operator_log)" | awk 'NR == 1' | grep -o 'cannot [a-z]* resource "[^"]*"' | awk 'NR == 1')"
    python3 -c "$strip_meta"'; print(json.dumps(r))' "$OUT/role.json" > "$OUT/with.json"
    K replace -f "$OUT/with.json" > /dev/null
    restart_operator
    wait_for 300 gone "rule-$kind-$i" || fail "with the rule back, job rule-$kind-$i did not finish (phase $(K get tj "rule-$kind-$i" -o jsonpath='{.status.phase}' 2>&1))"
  done
}
each_rule_is_needed clusterrole kt-kubetrain

# ---- upgrade to 2 replicas: leader election, one reconciler ----
helm upgrade kt charts/kubetrain -n "$NS" "${QUICK_PROFILE[@]}" --set operator.replicas=2 --wait --timeout 120s > "$OUT/upgrade.txt" 2>&1 ||
  { cat "$OUT/upgrade.txt"; fail "helm upgrade"; }
ready2() { [[ $(K get deploy kt-kubetrain -n "$NS" -o jsonpath='{.status.readyReplicas}') == 2 ]]; }
wait_for 60 ready2 || fail "2 operator replicas are not ready"
K get pdb kt-kubetrain -n "$NS" > /dev/null || fail "no PodDisruptionBudget with 2 replicas"
leaders() {
  local n=0 f
  for f in "$OUT"/work/pods/kubetrain-system_kt-kubetrain-*/log; do
    # only the pods of the upgraded ReplicaSet that still run
    [[ -f $f ]] || continue
    local pod=${f%/log}; pod=${pod##*kubetrain-system_}
    [[ $(K get pod "$pod" -n "$NS" -o jsonpath='{.status.phase}' 2>/dev/null) == Running ]] || continue
    grep -q -- "--leader-elect" "$f" || continue
    grep -q "became the leader" "$f" && n=$((n + 1))
  done
  echo $n
}
one_leader() { [[ $(leaders) == 1 ]]; }
wait_for 60 one_leader || fail "$(leaders) leaders among the 2 replicas"
job after-upgrade
wait_for 180 gone after-upgrade || fail "the job after the upgrade did not finish"
sleep 3
[[ $(leaders) == 1 ]] || fail "$(leaders) leaders"
# The leader-election Role (there since replicas > 1): each of its rules is needed too.
each_rule_is_needed role kt-kubetrain-leader-election -n "$NS"

# ---- uninstall: TrainingJobs and the CRD stay ----
K apply -f examples/jobs/tiny.yaml > /dev/null
helm uninstall kt -n "$NS" --wait --timeout 60s > "$OUT/uninstall.txt" 2>&1 || { cat "$OUT/uninstall.txt"; fail "helm uninstall"; }
K get crd trainingjobs.kubetrain.dev > /dev/null || fail "helm uninstall deleted the CRD"
K get tj tiny > /dev/null || fail "helm uninstall deleted a TrainingJob"
gone_deploy() { ! K get deploy kt-kubetrain -n "$NS" > /dev/null 2>&1; }
wait_for 30 gone_deploy || fail "the operator Deployment is still there"
# The Lease is owned by the leader-election Role: collected with it, no stale holder left.
gone_lease() { ! K get lease kt-kubetrain -n "$NS" > /dev/null 2>&1; }
wait_for 30 gone_lease || fail "the leader Lease outlived helm uninstall: $(K get lease kt-kubetrain -n "$NS" -o json)"
# ---- no credential in any log, event or status ----
# The ServiceAccount tokens the pods ran with (from the kubeconfigs the local node gave them)
# must appear nowhere a user or a log collector reads: the pods' logs (operator and workers), the
# server's log, helm's output, Events and TrainingJob status.
K get events -A -o json > "$OUT/events.json"
K get trainingjobs -A -o json > "$OUT/trainingjobs.json"
python3 - "$OUT" <<'PY' || fail "a credential leaked"
import glob, os, sys, yaml
out = sys.argv[1]
secrets = set()
for path in glob.glob(out + "/work/pods/*/kubeconfig"):
    for user in (yaml.safe_load(open(path)) or {}).get("users", []):
        for key in ("token", "client-key-data", "client-certificate-data", "password"):
            value = (user.get("user") or {}).get(key)
            if value: secrets.add(value)
assert secrets, "no pod got a ServiceAccount token: nothing was checked"
places = [p for p in glob.glob(out + "/**", recursive=True)
          if os.path.isfile(p) and not p.endswith("/kubeconfig") and "/volumes/" not in p]
leaks = []
for path in places:
    text = open(path, "rb").read()
    leaks += [(path, s[:8] + "...") for s in secrets if s.encode() in text]
print(f"{len(secrets)} token(s) searched for in {len(places)} files (logs, events, status): {len(leaks)} found")
assert not leaks, leaks
PY
echo "helm install/upgrade/uninstall against kubetrain local serve: ok"

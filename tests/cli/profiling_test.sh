#!/usr/bin/env bash
# Profiling pods end to end (docs/PLANNER.md §11a), with the real kubectl, the operator binary and
# the real worker: `kubetrain local serve` (this machine as a Node whose pods run as local
# processes) and `kubetrain-operator --profiling --profiling-quick`. A CPU job in a namespace with
# no hardware profile waits (Planned False, ProfilingNodes) while pod kubetrain-profile-cpu runs
# `kubetrain-worker profile --quick --termination-message`; the operator stores what it returns in
# ConfigMap kubetrain-profile-cpu, removes the pod, plans the job with the measured figures (the
# plan's peak says "measured on <this host>") and the job trains to Succeeded. A second job finds
# the profile and starts at once.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
KT=$1
OPERATOR=$2
require_kubectl
with_scratch

serve_local
run_operator --profiling --profiling-quick

sed 's/name: tiny/name: prof/; s/steps: 200/steps: 30/' examples/jobs/tiny.yaml > "$OUT/job.yaml"
K apply -f "$OUT/job.yaml" > /dev/null || fail "apply the job"
jp() { K get tj "${2:-prof}" -o jsonpath="$1"; }
profiling() { [[ "$(jp '{.status.conditions[?(@.type=="Planned")].reason}')" == ProfilingNodes ]]; }
wait_for 30 profiling || fail "the job did not wait for profiling: $(K get tj prof -o yaml)"
profiled() { K get configmap kubetrain-profile-cpu > /dev/null 2>&1; }
wait_for 120 profiled ||
  fail "no profile stored: $(K get pods -o wide 2>&1; K get events 2>&1 | tail -8; tail -5 "$OUT"/work/pods/*profile*/log 2>&1)"
K get configmap kubetrain-profile-cpu -o jsonpath='{.data.profile\.yaml}' > "$OUT/profile.yaml"
grep -q '^kind: HardwareProfile' "$OUT/profile.yaml" || fail "stored: $(cat "$OUT/profile.yaml")"
grep -q '^  profilingPod: default/kubetrain-profile-cpu' "$OUT/profile.yaml" ||
  fail "no provenance: $(cat "$OUT/profile.yaml")"
[[ "$(K get configmap kubetrain-profile-cpu -o jsonpath='{.metadata.labels.kubetrain\.dev/hardware-profile}')" == cpu ]] ||
  fail "the profile ConfigMap is not labelled"
succeeded() { [[ "$(jp '{.status.phase}' "$1")" == Succeeded ]]; }
wait_for 120 succeeded prof || fail "the job did not succeed: $(K get tj prof -o yaml)"
K get configmap prof-plan -o jsonpath='{.data.plan\.json}' > "$OUT/plan.json"
python3 - "$OUT/plan.json" <<'PY' || fail "not planned with the measured profile: $(cat "$OUT/plan.json")"
import json, sys
peak = json.load(open(sys.argv[1]))["peak"]
assert peak["source"].startswith("measured on "), peak
PY
gone() { ! K get pod kubetrain-profile-cpu > /dev/null 2>&1; }
wait_for 20 gone || fail "the profiling pod was left: $(K get pods 2>&1)"
K get events > "$OUT/events" || fail "kubectl get events"
grep -q "ProfilingNodes" "$OUT/events" && grep -q "Profiled" "$OUT/events" ||
  fail "events: $(cat "$OUT/events")"

sed 's/name: prof/name: prof2/' "$OUT/job.yaml" | K apply -f - > /dev/null || fail "apply the second job"
wait_for 120 succeeded prof2 || fail "the second job did not succeed: $(K get tj prof2 -o yaml)"
K get events -o json > "$OUT/events.json" || fail "kubectl get events -o json"
python3 - "$OUT/events.json" <<'PY' || fail "the second job profiled again: $(cat "$OUT/events")"
import json, sys
events = json.load(open(sys.argv[1]))["items"]
assert not [e for e in events
            if e["involvedObject"]["name"] == "prof2" and e["reason"] == "ProfilingNodes"]
assert [e for e in events if e["involvedObject"]["name"] == "prof" and e["reason"] == "Profiled"]
PY
echo "profiling pods: ok"

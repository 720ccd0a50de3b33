#!/usr/bin/env bash
# Deleted TrainingJobs leave nothing behind: `kubectl apply` 200 tiny jobs, delete them 15 s
# later, and within a minute no pod, plan ConfigMap, Service or PVC of theirs is left and no
# worker process runs; then 20 cycles of apply-then-delete 0.05-1.5 s apart, the same. Once an
# operator acting on a stale cache recreated children of deleted jobs (23 pods, 10 still
# training, after 200), and `local serve` collected dependents only when their owner went.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
KT=$1
OPERATOR=$2
require_kubectl
with_scratch
serve_local
run_operator

jobs_file() {  # jobs_file FIRST COUNT: COUNT tiny jobs that would train for long
  for ((i = $1; i < $1 + $2; ++i)); do
    cat <<YAML
---
apiVersion: kubetrain.dev/v1alpha1
kind: TrainingJob
metadata: {name: del-$i}
spec:
  model: {preset: tiny}
  training: {steps: 1000000, globalBatchSize: 8}
  checkpoint: {intervalSteps: 1000}
YAML
  done
}
# What the jobs left: pods, ConfigMaps, Services and PVCs with the job label, and worker
# processes of this server's pods (their work dir is under $OUT).
leftovers() {
  local n=0 kind
  for kind in pods configmaps services persistentvolumeclaims; do
    n=$((n + $(K get "$kind" -l kubetrain.dev/job-name -o name 2>/dev/null | wc -l)))
  done
  n=$((n + $(pgrep -f "kubetrain-worker.*" -a 2>/dev/null | grep -c "$OUT" || true)))
  echo "$n"
}
nothing_left() { [[ $(leftovers) -eq 0 ]]; }
describe_leftovers() {
  local kind
  for kind in pods configmaps services persistentvolumeclaims; do
    K get "$kind" -l kubetrain.dev/job-name -o name 2>/dev/null | head -5
  done
  pgrep -af kubetrain-worker | grep "$OUT" | head -5 || true
}

# ---- 200 jobs, deleted 15 s after ----
jobs_file 0 200 > "$OUT/jobs.yaml"
K apply -f "$OUT/jobs.yaml" > /dev/null || fail "apply 200 jobs"
running() { [[ $(K get pods -l kubetrain.dev/job-name -o name | wc -l) -ge 1 ]]; }
wait_for 60 running || fail "no worker pod was created"
sleep 15
K delete tj --all --wait=false > /dev/null || fail "delete the jobs"
wait_for 90 nothing_left || fail "after deleting 200 jobs, $(leftovers) children or processes are left: $(describe_leftovers)"
[[ $(K get tj -o name | wc -l) -eq 0 ]] || fail "jobs are left"
echo "200 jobs: nothing left"

# ---- 20 cycles of apply, then delete a moment later ----
for ((c = 0; c < 20; ++c)); do
  jobs_file $((1000 + c)) 1 > "$OUT/one.yaml"
  K apply -f "$OUT/one.yaml" > /dev/null || fail "apply cycle $c"
  sleep "$(python3 -c "import random; random.seed($c); print(round(random.uniform(0.05, 1.5), 2))")"
  K delete tj "del-$((1000 + c))" --wait=false > /dev/null || fail "delete cycle $c"
done
wait_for 90 nothing_left || fail "after 20 apply-delete cycles, $(leftovers) children or processes are left: $(describe_leftovers)"
echo "20 cycles: nothing left"

#!/usr/bin/env bash
# Autotune end to end (docs/PLANNER.md §11b), with the real kubectl and the operator binary against
# `kubetrain local serve --simulate-nodes 1` (an 8 × H100 Node whose fake kubelet runs pods): a
# gpt2-124m job is planned with tensor parallelism from the built-in figures; rank 0's metrics
# (served here by a stand-in, the pod's IP and metrics port pointed at it) say its TP
# all-reduces take 6× the predicted time. After the warm-up the operator folds that into the
# H100 profile ConfigMap, finds a plan with less TP predicted >= 10 % faster, and switches: the
# gang is replaced by one of the new plan (a new attempt, not a restart), status.planHistory and
# status.autotune say why, a Replanned event names both plans. Metrics of the new plan that
# match its prediction keep it.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
KT=$1
OPERATOR=$2
require_kubectl
with_scratch

serve_simulated 1
run_operator --autotune-restart-cost 0

cat > "$OUT/job.yaml" <<'YAML'
apiVersion: kubetrain.dev/v1alpha1
kind: TrainingJob
metadata:
  name: at
spec:
  model: {preset: gpt2-124m}
  training: {steps: 100000, globalBatchSize: 64}
  data: {source: synthetic}
YAML
K apply -f "$OUT/job.yaml" > /dev/null || fail "apply the job"
jp() { K get tj at -o jsonpath="$1"; }
pod_running() { [[ "$(K get pod at-worker-0 -o jsonpath='{.status.phase}' 2>/dev/null)" == Running ]]; }
wait_for 60 pod_running || fail "the job's pod did not run: $(K get pods -o wide 2>&1)"
[[ "$(jp '{.status.plan.tp}')" -gt 1 ]] || fail "the built-in figures chose tp $(jp '{.status.plan.tp}')"
first_hash=$(jp '{.status.plan.planHash}')

# serve_metrics SCALE: rank 0's metrics after 30 steps of the stored plan whose TP all-reduces took
# SCALE times the predicted time; the pod's IP and metrics port point at them.
PORT=$(free_port)
python3 -m http.server "$PORT" --bind 127.0.0.1 --directory "$OUT/www" > "$OUT/www.log" 2>&1 &
PIDS+=($!)
mkdir -p "$OUT/www"
serve_metrics() {
  K get configmap at-plan -o jsonpath='{.data.plan\.json}' > "$OUT/plan.json" || fail "plan ConfigMap"
  python3 - "$OUT/plan.json" "$1" > "$OUT/www/metrics" <<'PY' || fail "metrics"
import json, sys
plan, scale = json.load(open(sys.argv[1])), float(sys.argv[2])
b = plan["predicted"]["breakdownSeconds"]
names = {"compute": "compute", "tp_comm_total": "tpCommTotal", "tp_comm_exposed": "tpCommExposed",
         "dp_comm_total": "dpCommTotal", "dp_comm_exposed": "dpCommExposed",
         "transfer_total": "transferTotal", "transfer_exposed": "transferExposed",
         "optimizer_gpu": "optimizerGpu", "optimizer_cpu_total": "optimizerCpuTotal",
         "optimizer_cpu_exposed": "optimizerCpuExposed"}
steps, step = 30, 0.0
print(f'kubetrain_worker_steps_total{{rank="0"}} {steps}')
print(f'kubetrain_worker_step{{rank="0"}} {steps}')
for phase, key in names.items():
    seconds = b[key] * (scale if phase.startswith("tp_comm") else 1)
    print(f'kubetrain_worker_phase_seconds_total{{rank="0",phase="{phase}"}} {seconds * steps}')
    if phase in ("compute", "optimizer_gpu") or phase.endswith("_exposed"):
        step += seconds
tokens = plan["batch"]["global"] * plan["model"]["seqLen"]
print(f'kubetrain_worker_tokens_per_second{{rank="0"}} {tokens / step}')
PY
  K patch pod at-worker-0 --subresource=status --type=merge -p '{"status":{"podIP":"127.0.0.1"}}' > /dev/null ||
    fail "patch the pod's IP"
  K annotate --overwrite pod at-worker-0 kubetrain.dev/metrics-port="$PORT" > /dev/null || fail "annotate"
}
serve_metrics 6

switched() { [[ "$(jp '{.status.autotune.switches}')" == 1 ]]; }
wait_for 60 switched || fail "no switch: $(K get tj at -o yaml; grep -c . "$OUT/www.log")"
jp '{.status.autotune.message}'; echo
[[ "$(jp '{.status.planHistory[0].reason}')" == Autotune ]] || fail "history: $(jp '{.status.planHistory}')"
[[ "$(jp '{.status.planHistory[0].fromPlanHash}')" == "$first_hash" ]] || fail "history from"
[[ "$(jp '{.status.planHistory[0].toPlanHash}')" == "$(jp '{.status.plan.planHash}')" ]] || fail "history to"
[[ "$(jp '{.status.plan.tp}')" -lt 2 ]] || fail "the new plan has tp $(jp '{.status.plan.tp}')"
[[ "$(jp '{.status.restarts}')" == 0 ]] || fail "a switch counted as a restart"
K get events > "$OUT/events.txt"
grep -q "Normal *Replanned *trainingjob/at *autotune: 1 node(s) × 8, tp 2" "$OUT/events.txt" ||
  fail "no Replanned event: $(cat "$OUT/events.txt")"
# The fold-back: the H100 profile ConfigMap, with the scale and where it came from.
K get configmap -l kubetrain.dev/hardware-profile -o jsonpath='{.items[0].data.profile\.yaml}' > "$OUT/profile.yaml" ||
  fail "no profile ConfigMap"
grep -q "foldedBackFrom: default/at" "$OUT/profile.yaml" || fail "provenance: $(cat "$OUT/profile.yaml")"
python3 -c "
import sys, yaml
s = yaml.safe_load(open('$OUT/profile.yaml'))['spec']['tpCommScale']
sys.exit(0 if abs(s - 6) < 0.01 else 1)" || fail "tpCommScale: $(grep tpCommScale "$OUT/profile.yaml")"
# The new gang: attempt 1, the new plan's hash.
new_gang() {
  pod_running && [[ "$(K get pod at-worker-0 -o jsonpath='{.metadata.labels.kubetrain\.dev/restart-attempt}')" == 1 ]]
}
wait_for 60 new_gang || fail "no new gang: $(K get pods -o wide --show-labels)"
[[ "$(K get pod at-worker-0 -o jsonpath='{.metadata.labels.kubetrain\.dev/plan-hash}')" == "$(jp '{.status.plan.planHash}')" ]] ||
  fail "the new pod is not of the new plan"
# Measured as the new plan predicts (with the folded figures): it stays.
serve_metrics 1
evaluated() { [[ "$(jp '{.status.autotune.evaluatedAttempt}')" == 1 ]]; }
wait_for 60 evaluated || fail "attempt 1 not evaluated: $(K get tj at -o yaml)"
[[ "$(jp '{.status.autotune.switches}')" == 1 ]] || fail "switched again: $(jp '{.status.autotune.message}')"
[[ "$(jp '{.status.phase}')" == Running ]] || fail "phase $(jp '{.status.phase}')"
echo "PASS"

#!/usr/bin/env bash
# kubetrain-worker as a pod runs it: trains the tiny preset from a planner-made Plan, prints a
# falling loss, serves /metrics (checked by promtool) and /healthz while it runs, checkpoints
# and exits 143 on SIGTERM, resumes from the checkpoint, exports llm.c's format, and refuses a
# plan it cannot execute.
set -u
KT=$1
WORKER=$2
DIR=$(mktemp -d)
PID=
trap '[[ -n $PID ]] && kill $PID 2>/dev/null; rm -rf "$DIR"' EXIT
fail() { echo "FAIL: $*"; [[ -f $DIR/log ]] && tail -20 "$DIR/log"; exit 1; }

cat > "$DIR/job.yaml" <<'YAML'
apiVersion: kubetrain.dev/v1alpha1
kind: TrainingJob
metadata: {name: tiny-cli}
spec:
  model: {preset: tiny}
  training: {steps: 3000, globalBatchSize: 8, learningRate: 0.005, warmupSteps: 10, seed: 11}
  resources: {gpusPerNode: 1}
  checkpoint: {intervalSteps: 50, keep: 2}
YAML
"$KT" plan "$DIR/job.yaml" --cluster examples/clusters/cpu-local.yaml -o json > "$DIR/plan.json" ||
  fail "planning"

get() {  # get URL: the body, or nothing
  python3 -c 'import sys, urllib.request
try: print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode(), end="")
except Exception as e: sys.exit(1)' "$1"
}

"$WORKER" train --plan "$DIR/plan.json" --checkpoint-dir "$DIR/ckpt" --metrics-port 0 \
  --metrics-address 127.0.0.1 --log-every 10 > "$DIR/log" 2>&1 &
PID=$!
for _ in $(seq 100); do
  PORT=$(sed -n 's|^metrics on http://127.0.0.1:\([0-9]*\)/metrics$|\1|p' "$DIR/log")
  [[ -n $PORT ]] && break
  sleep 0.1
done
[[ -n ${PORT:-} ]] || fail "no metrics port announced"
for _ in $(seq 100); do  # wait until a few steps are counted
  get "http://127.0.0.1:$PORT/metrics" > "$DIR/metrics" || true
  grep -q "^kubetrain_worker_steps_total{.*} [1-9][0-9][0-9]" "$DIR/metrics" && break
  sleep 0.2
done
grep -q '^kubetrain_worker_steps_total{job="tiny-cli",namespace="default",rank="0",node_rank="0"} [1-9][0-9]' "$DIR/metrics" ||
  fail "steps_total not exposed: $(head -c 600 "$DIR/metrics")"
grep -q '^kubetrain_worker_loss{' "$DIR/metrics" || fail "no loss gauge"
grep -q '^kubetrain_worker_memory_bytes{.*kind="params"' "$DIR/metrics" || fail "no memory gauge"
promtool check metrics < "$DIR/metrics" || fail "promtool check metrics rejected /metrics"
[[ $(get "http://127.0.0.1:$PORT/healthz") == ok ]] || fail "/healthz"

kill -TERM $PID
wait $PID
rc=$?
PID=
[[ $rc -eq 143 ]] || fail "exit code after SIGTERM: $rc (want 143)"
grep -q "stopped by signal after step" "$DIR/log" || fail "no stop message"
[[ -f $DIR/ckpt/latest ]] || fail "no latest checkpoint after SIGTERM"
stopped=$(sed -n 's/.*stopped by signal after step \([0-9]*\).*/\1/p' "$DIR/log")

# Falling loss: the last logged loss is well below the first.
first=$(grep -m1 '^step ' "$DIR/log" | sed 's/.*| loss \([0-9.]*\) .*/\1/')
last=$(grep '^step ' "$DIR/log" | tail -1 | sed 's/.*| loss \([0-9.]*\) .*/\1/')
python3 -c "import sys; sys.exit(0 if float('$last') < float('$first') - 1.0 else 1)" ||
  fail "loss did not fall: $first -> $last"

# Resume: a short plan of the same job continues from the checkpoint to its end.
sed 's/steps: 3000/steps: '"$((stopped + 20))"'/' "$DIR/job.yaml" > "$DIR/job2.yaml"
"$KT" plan "$DIR/job2.yaml" --cluster examples/clusters/cpu-local.yaml -o json > "$DIR/plan2.json"
"$WORKER" train --plan "$DIR/plan2.json" --checkpoint-dir "$DIR/ckpt" --log-every 10 > "$DIR/log2" 2>&1 ||
  fail "resume run failed: $(tail -5 "$DIR/log2")"
grep -q "resumed from step $stopped" "$DIR/log2" || fail "did not resume from step $stopped: $(head -5 "$DIR/log2")"
grep -q "^done: $((stopped + 20)) steps" "$DIR/log2" || fail "resume did not finish"

"$WORKER" export-llmc --plan "$DIR/plan2.json" --checkpoint-dir "$DIR/ckpt" --out "$DIR/model.bin" > /dev/null ||
  fail "export-llmc"
params=$(python3 -c "import json; print(json.load(open('$DIR/plan2.json'))['model']['parameters'])")
[[ $(stat -c %s "$DIR/model.bin") -eq $((1024 + 4 * params)) ]] || fail "llm.c file size"
# Import: a fresh run starts from the exported llm.c weights (and is stopped right away).
"$WORKER" train --plan "$DIR/plan.json" --init-from-llmc "$DIR/model.bin" --log-every 1 > "$DIR/log3" 2>&1 &
PID=$!
for _ in $(seq 50); do grep -q '^step ' "$DIR/log3" && break; sleep 0.1; done
kill -TERM $PID; wait $PID; rc=$?; PID=
grep -q "initialised from llm.c model" "$DIR/log3" || fail "llm.c import: $(head -5 "$DIR/log3")"
first_imported=$(grep -m1 '^step ' "$DIR/log3" | sed 's/.*| loss \([0-9.]*\) .*/\1/')
python3 -c "import sys; sys.exit(0 if float('$first_imported') < float('$first') - 1.0 else 1)" ||
  fail "imported weights do not start trained: loss $first_imported"

# Window offload trains with the same losses as the device run; a plan this worker cannot execute
# is refused with a clear message; a multi-rank plan started without its ranks says how to start it.
sed -e 's/steps: 3000/steps: 20/' -e 's/gpusPerNode: 1/gpusPerNode: 1}\n  parallelism: {recompute: full/' \
  "$DIR/job.yaml" > "$DIR/dev.yaml"
sed 's/recompute: full/recompute: full, offload: window, offloadWindow: 1/' "$DIR/dev.yaml" > "$DIR/off.yaml"
"$KT" plan "$DIR/dev.yaml" --cluster examples/clusters/cpu-local.yaml -o json > "$DIR/dev.json" || fail "plan device"
"$KT" plan "$DIR/off.yaml" --cluster examples/clusters/cpu-local.yaml -o json > "$DIR/off.json" || fail "plan offload"
"$WORKER" train --plan "$DIR/dev.json" --log-every 1 > "$DIR/dev.out" 2>&1 || fail "device run"
"$WORKER" train --plan "$DIR/off.json" --log-every 1 > "$DIR/off.out" 2>&1 || fail "window run: $(tail -3 "$DIR/off.out")"
losses() { grep -o 'loss [0-9.]*' "$1" | head -20; }
[[ "$(losses "$DIR/off.out" | wc -l)" -eq 20 && "$(losses "$DIR/off.out")" == "$(losses "$DIR/dev.out")" ]] ||
  fail "window offload losses differ from the device run: $(losses "$DIR/off.out" | tail -2) vs $(losses "$DIR/dev.out" | tail -2)"
python3 - "$DIR/off.out" <<'PY' || fail "window offload loss does not fall"
import re, sys
losses = [float(x) for x in re.findall(r"loss ([0-9.]+)", open(sys.argv[1]).read())]
sys.exit(0 if losses[-1] < losses[0] - 0.3 else 1)
PY
sed 's/seed: 11}/seed: 11, precision: bf16}/' "$DIR/job.yaml" > "$DIR/bf16.yaml"
"$KT" plan "$DIR/bf16.yaml" --cluster examples/clusters/cpu-local.yaml -o json > "$DIR/bf16.json" || fail "plan bf16"
"$WORKER" train --plan "$DIR/bf16.json" > "$DIR/out" 2> "$DIR/err"
rc=$?
[[ $rc -eq 1 ]] && grep -q "cannot execute this plan: precision bf16" "$DIR/err" ||
  fail "bf16 not refused clearly (rc $rc): $(cat "$DIR/err")"
sed 's/gpusPerNode: 1/gpusPerNode: 2}\n  parallelism: {tensorParallel: 2/' "$DIR/job.yaml" > "$DIR/tp.yaml"
"$KT" plan "$DIR/tp.yaml" --cluster examples/clusters/cpu-local.yaml -o json > "$DIR/tp.json" || fail "plan tp2"
"$WORKER" train --plan "$DIR/tp.json" > "$DIR/out" 2> "$DIR/err"
rc=$?
[[ $rc -eq 1 ]] && grep -q "the plan has 2 rank(s) but WORLD_SIZE is 1 (start the ranks with kubetrain-worker launch)" "$DIR/err" ||
  fail "tp=2 without launch not explained (rc $rc): $(cat "$DIR/err")"
echo "worker ok: stopped at step $stopped, loss $first -> $last, resumed and finished, llm.c export ok"

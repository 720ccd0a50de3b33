#!/usr/bin/env bash
# kubetrain-worker as a pod runs it: trains the tiny preset from a planner-made Plan, prints a
# falling loss, serves /metrics (checked by promtool) and /healthz while it runs, checkpoints
# and exits 143 on SIGTERM, resumes from the checkpoint, exports llm.c's format, and refuses a
# plan it cannot execute or that was edited by hand; a full checkpoint disk is reported while
# training goes on, and a second writer to a checkpoint directory is refused.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
KT=$1
WORKER=$2
DIR=$(mktemp -d)
PID=
trap '[[ -n $PID ]] && kill $PID 2>/dev/null; rm -rf "$DIR"' EXIT
fail_context() { [[ -f $DIR/log ]] && tail -20 "$DIR/log"; }

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

"$WORKER" train --plan "$DIR/plan.json" --checkpoint-dir "$DIR/ckpt" --metrics-port 0 \
  --metrics-address 127.0.0.1 --log-every 10 > "$DIR/log" 2>&1 &
PID=$!
PORT=$(announced_port "$DIR/log")
[[ -n ${PORT:-} ]] || fail "no metrics port announced"
for _ in $(seq 100); do  # wait until a few steps are counted
  get "http://127.0.0.1:$PORT/metrics" > "$DIR/metrics" || true
  grep -q "^kubetrain_worker_steps_total{.*} [1-9][0-9][0-9]" "$DIR/metrics" && break
  sleep 0.2
done
grep -q '^kubetrain_worker_steps_total{trainingjob="tiny-cli",namespace="default",rank="0",node_rank="0"} [1-9][0-9]' "$DIR/metrics" ||
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
# Until its first step (a deadline, not a guess: a loaded machine takes longer to start).
for _ in $(seq 600); do grep -q '^step ' "$DIR/log3" && break; sleep 0.1; done
grep -q '^step ' "$DIR/log3" || fail "the llm.c-initialised run made no step in 60 s: $(tail -3 "$DIR/log3")"
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
# bf16 on the CPU (docs/WORKER.md, "bf16 on the CPU"): asked for, it trains where the CPU has bf16
# matmuls and is refused, naming what is missing, where it has not (ONEDNN_MAX_CPU_ISA=AVX512_CORE
# hides AMX and AVX512-BF16 from oneDNN, as a CPU without them); left to the planner, it falls back
# to fp32 with a warning instead.
sed 's/steps: 3000, /steps: 30, /; s/seed: 11}/seed: 11, precision: bf16}/' "$DIR/job.yaml" \
  > "$DIR/bf16.yaml"
"$KT" plan "$DIR/bf16.yaml" --cluster examples/clusters/cpu-local.yaml -o json > "$DIR/bf16.json" || fail "plan bf16"
if grep -qE '\b(amx_bf16|avx512_bf16)\b' /proc/cpuinfo; then
  "$WORKER" train --plan "$DIR/bf16.json" --log-every 10 > "$DIR/out" 2> "$DIR/err" ||
    fail "bf16 did not train on a CPU with bf16: $(cat "$DIR/err")"
  grep -q "bf16 matmuls on" "$DIR/err" "$DIR/out" ||
    fail "bf16 run does not say so: $(cat "$DIR/err")"
  grep -q "done: 30 steps" "$DIR/out" "$DIR/err" || fail "bf16 run: $(cat "$DIR/out")"
fi
ONEDNN_MAX_CPU_ISA=AVX512_CORE "$WORKER" train --plan "$DIR/bf16.json" > "$DIR/out" 2> "$DIR/err"
rc=$?
refusal="cannot execute this plan: precision bf16 on this CPU (.*), which has neither AMX-BF16"
[[ $rc -eq 1 ]] && grep -q "$refusal nor AVX512-BF16" "$DIR/err" ||
  fail "bf16 not refused clearly (rc $rc): $(cat "$DIR/err")"
cat > "$DIR/amx.yaml" <<'YAML'
apiVersion: kubetrain.dev/v1alpha1
kind: Inventory
nodes:
  - name: amx-box
    cpu: {cores: 2}
    memory: 24Gi
    labels: {feature.node.kubernetes.io/cpu-cpuid.AMXBF16: "true"}
YAML
sed 's/steps: 3000, /steps: 30, /' "$DIR/job.yaml" > "$DIR/auto.yaml"
"$KT" plan "$DIR/auto.yaml" --cluster "$DIR/amx.yaml" > "$DIR/auto.txt" || fail "plan on AMX nodes"
"$KT" plan "$DIR/auto.yaml" --cluster "$DIR/amx.yaml" -o json > "$DIR/auto.json" || fail "plan json"
# The built-in AMX figures predict bf16 faster than fp32 for any model.
python3 -c "import json,sys; p=json.load(open(sys.argv[1]))
sys.exit(0 if p['precisionAuto'] and p['precision'] == 'bf16' else 1)" "$DIR/auto.json" ||
  fail "the planner did not choose bf16 for AMX nodes itself: $(cat "$DIR/auto.txt")"
grep -q "on the CPU: predicted .* tokens/s against .* (these CPUs have bf16" "$DIR/auto.txt" ||
  fail "the plan does not explain its precision: $(cat "$DIR/auto.txt")"
ONEDNN_MAX_CPU_ISA=AVX512_CORE "$WORKER" train --plan "$DIR/auto.json" > "$DIR/out" 2> "$DIR/err" ||
  fail "an automatic bf16 plan did not fall back to fp32: $(cat "$DIR/err")"
warning="warning: the plan chose bf16, and this CPU .* has neither AMX-BF16 nor AVX512-BF16"
grep -q "$warning: training in fp32" "$DIR/err" "$DIR/out" ||
  fail "no fallback warning: $(cat "$DIR/err")"
sed 's/gpusPerNode: 1/gpusPerNode: 2}\n  parallelism: {tensorParallel: 2/' "$DIR/job.yaml" > "$DIR/tp.yaml"
"$KT" plan "$DIR/tp.yaml" --cluster examples/clusters/cpu-local.yaml -o json > "$DIR/tp.json" || fail "plan tp2"
"$WORKER" train --plan "$DIR/tp.json" > "$DIR/out" 2> "$DIR/err"
rc=$?
[[ $rc -eq 1 ]] && grep -q "the plan has 2 rank(s) but WORLD_SIZE is 1 (start the ranks with kubetrain-worker launch)" "$DIR/err" ||
  fail "tp=2 without launch not explained (rc $rc): $(cat "$DIR/err")"

# A hand-edited plan (docs/WORKER.md, "Plans and exit codes"): without its planHash, or with values
# the planner never emits (the hash recomputed so that only the values are wrong), is refused with
# exit code 1 and the field, never by a signal (exit codes 128+ are retried by the operator).
edit_plan() {  # edit_plan OUT rehash|keep PATH=JSON... : plan.json edited
  python3 - "$DIR/plan.json" "$@" <<'PY'
import json, sys
src, out, rehash, edits = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
plan = json.load(open(src))
for edit in edits:
    path, value = edit.split("=", 1)
    *parents, last = path.split(".")
    node = plan
    for key in parents: node = node[key]
    if value == "DELETE": del node[last]
    else: node[last] = json.loads(value)
if rehash == "rehash":  # api/plan.cpp compute_plan_hash: FNV-1a 64 of the executed part
    part = {k: v for k, v in plan.items()
            if k not in ("predicted", "peak", "alternatives", "explanation", "planHash")}
    h = 0xcbf29ce484222325
    for b in json.dumps(part, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode():
        h = ((h ^ b) * 0x100000001b3) % 2**64
    plan["planHash"] = "%016x" % h
json.dump(plan, open(out, "w"))
PY
}
edit_plan "$DIR/same.json" rehash || fail "edit_plan"
cmp -s <(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["planHash"])' "$DIR/same.json") \
  <(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["planHash"])' "$DIR/plan.json") ||
  fail "the test's plan hash differs from the planner's"
refused() {  # refused WORDS EDIT...: train and launch exit 1 saying WORDS
  edit_plan "$DIR/bad.json" "${@:2}" || fail "edit_plan $*"
  for cmd in train launch; do
    "$WORKER" $cmd --plan "$DIR/bad.json" > "$DIR/out" 2> "$DIR/err"
    rc=$?
    [[ $rc -eq 1 ]] && grep -qF "$DIR/bad.json: $1" "$DIR/err" ||
      fail "$cmd: ${*:2} not refused with '$1' (rc $rc): $(head -c 400 "$DIR/err")"
  done
}
refused "plan.planHash: required" keep planHash=DELETE
refused "plan.planHash: " keep offload.cpuThreads=100000
refused "plan.offload.cpuThreads: 100000 is not in [1, 4096]" rehash offload.cpuThreads=100000
refused "plan.model.heads: 128 does not divide hidden 64" rehash model.heads=128
refused "plan.model.seqLen: 1000000000 exceeds the limit" rehash model.seqLen=1000000000
refused "plan.model: " rehash model.seqLen=1000000
refused "plan.tp: 3 does not divide the model's heads 4" rehash tp=3 world=3

# A non-UTF-8 byte in `latest` falls back like any other bad pointer (it aborted before).
printf 'step-\xff\xfe\n' > "$DIR/ckpt/latest"
"$WORKER" train --plan "$DIR/plan2.json" --checkpoint-dir "$DIR/ckpt" > "$DIR/out" 2> "$DIR/err" ||
  fail "a garbage latest pointer: $(tail -3 "$DIR/err")"
grep -q "latest is corrupt" "$DIR/err" || fail "no fallback message: $(head -3 "$DIR/err")"
grep -q "^done: $((stopped + 20)) steps" "$DIR/out" || fail "did not resume from the newest step"

# The checkpoint disk fills up (latest.tmp is /dev/full: ENOSPC for root too, no mount needed):
# training goes on, the failure is logged and counted, the next interval saves again once there is
# space; a second writer is refused; SIGTERM with a failed save still exits 143 (retryable).
mkdir "$DIR/full" && ln -s /dev/full "$DIR/full/latest.tmp"
"$WORKER" train --plan "$DIR/plan.json" --checkpoint-dir "$DIR/full" --metrics-port 0 \
  --metrics-address 127.0.0.1 --log-every 0 > "$DIR/log" 2>&1 &
PID=$!
for _ in $(seq 600); do grep -q "^checkpoint at step 50 failed (ENOSPC" "$DIR/log" && break; sleep 0.1; done
grep -q "^checkpoint at step 50 failed (ENOSPC, 1 so far; training goes on" "$DIR/log" ||
  fail "no failure line for a full disk"
PORT=$(announced_port "$DIR/log")
get "http://127.0.0.1:$PORT/metrics" > "$DIR/metrics" || fail "no metrics after a failed save"
grep -q '^kubetrain_worker_checkpoint_failures_total{.*reason="ENOSPC"} [1-9]' "$DIR/metrics" ||
  fail "no failures counter: $(grep checkpoint "$DIR/metrics")"
grep -q '^kubetrain_worker_checkpoint_consecutive_failures{.*} [1-9]' "$DIR/metrics" ||
  fail "no consecutive failures gauge: $(grep checkpoint "$DIR/metrics")"
promtool check metrics < "$DIR/metrics" || fail "promtool check metrics rejected the failure metrics"
KUBETRAIN_CHECKPOINT_LOCK_WAIT_SECONDS=0 "$WORKER" train --plan "$DIR/plan.json" \
  --checkpoint-dir "$DIR/full" > "$DIR/out" 2> "$DIR/err"
rc=$?
[[ $rc -eq 1 ]] && grep -q "checkpoint directory $DIR/full is in use by another writer (held by \"pid $PID on " "$DIR/err" ||
  fail "a second writer was not refused (rc $rc): $(cat "$DIR/err")"
rm "$DIR/full/latest.tmp"  # space again
for _ in $(seq 600); do grep -q "^checkpoint $DIR/full/step-" "$DIR/log" && break; sleep 0.1; done
grep -q "^checkpoint $DIR/full/step-" "$DIR/log" || fail "no save after the disk had space again"
for _ in $(seq 50); do
  get "http://127.0.0.1:$PORT/metrics" > "$DIR/metrics" || true
  grep -q '^kubetrain_worker_checkpoint_consecutive_failures{.*} 0$' "$DIR/metrics" && break
  sleep 0.1
done
grep -q '^kubetrain_worker_checkpoint_consecutive_failures{.*} 0$' "$DIR/metrics" ||
  fail "consecutive failures not reset by a good save: $(grep checkpoint "$DIR/metrics")"
# Full again, then SIGTERM. The link is made while the worker is stopped and not between writing
# and renaming a latest.tmp of its own.
for _ in $(seq 100); do
  kill -STOP $PID
  [[ ! -e $DIR/full/latest.tmp && ! -L $DIR/full/latest.tmp ]] && ln -s /dev/full "$DIR/full/latest.tmp" && break
  kill -CONT $PID
  sleep 0.05
done
[[ -L $DIR/full/latest.tmp ]] || fail "could not fill the disk again"
kill -TERM $PID
kill -CONT $PID
wait $PID
rc=$?
PID=
[[ $rc -eq 143 ]] || fail "SIGTERM with a full disk: exit code $rc (want 143, retryable)"
grep -q "stopped by signal after step [0-9]* (its checkpoint failed" "$DIR/log" ||
  fail "the stop line does not say the checkpoint failed: $(tail -3 "$DIR/log")"
good=$(cat "$DIR/full/latest")
[[ -f "$DIR/full/$good/metadata.json" ]] || fail "latest does not name a complete checkpoint"

echo "worker ok: stopped at step $stopped, loss $first -> $last, resumed and finished, llm.c export ok, bad plans refused, checkpoint failures reported"

#!/usr/bin/env bash
# Oases' cutpoint over real processes and sockets (`kubetrain-worker launch`, Gloo): tiny with
# layer 0 at TP 1 × DP 2 and layer 1 at TP 2 × DP 1 on the same two ranks (the activations
# all-gathered at the cut, the tied embedding summed in both layouts over the world) ends at the
# one-rank run's final loss; its step-30 checkpoint (a shard before the cut, two after it)
# resumes as one rank to the same loss, and the one rank's checkpoint resumes with the cutpoint;
# the launcher's /metrics counts the cutpoint's groups where the planner predicts them (the TP
# group after the cut as "tp", the re-shard and the DP group after it as "dp"), promtool-clean.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
KT=$1
WORKER=$2
DIR=$(mktemp -d)
PID=
trap '[[ -n $PID ]] && kill $PID 2>/dev/null; rm -rf "$DIR"' EXIT
fail_context() { tail -20 "$DIR/log" "$DIR/log2" 2>/dev/null; }

cat > "$DIR/job.yaml" <<'YAML'
apiVersion: kubetrain.dev/v1alpha1
kind: TrainingJob
metadata: {name: tiny-cut}
spec:
  model: {preset: tiny}
  training: {steps: 60, globalBatchSize: 8, microBatchSize: 2, learningRate: 0.005, warmupSteps: 5, seed: 4}
  parallelism: {tensorParallel: 1, dataParallel: 2, cutpointLayer: 1, cutpointTensorParallel: 2}
  checkpoint: {intervalSteps: 30}
YAML
sed 's/cutpointLayer: 1, cutpointTensorParallel: 2/cutpointLayer: auto/; s/dataParallel: 2/dataParallel: 1/; s/tiny-cut/tiny-one/' \
  "$DIR/job.yaml" > "$DIR/one.yaml"
for job in job one; do
  "$KT" plan "$DIR/$job.yaml" --cluster examples/clusters/cpu-local.yaml -o json > "$DIR/$job.json" ||
    fail "planning $job.yaml"
done
python3 -c "
import json, sys
c = json.load(open('$DIR/job.json'))['cutpoint']
sys.exit(not (c['layer'] == 1 and c['tp'] == 2 and c['dp'] == 1))" ||
  fail "the plan has no cutpoint at layer 1 to TP 2"
"$KT" plan "$DIR/job.yaml" --cluster examples/clusters/cpu-local.yaml > "$DIR/table" ||
  fail "planning as a table"
grep -q 'TP 2 × DP 1 for layers 1-1 (Oases. cutpoint)' "$DIR/table" ||
  fail "the table does not show the cutpoint: $(grep parallelism "$DIR/table")"

MASTER_PORT=$(free_port) "$WORKER" launch --plan "$DIR/job.json" --checkpoint-dir "$DIR/ckpt" \
  > "$DIR/log" 2>&1 || fail "the cutpoint launch failed"
"$WORKER" train --plan "$DIR/one.json" --log-every 0 --checkpoint-dir "$DIR/one-ckpt" \
  > "$DIR/one.log" 2>&1 || fail "the one-rank run failed"
cut_final=$(final_loss "$DIR/log")
one_final=$(final_loss "$DIR/one.log")
[[ -n $one_final && $cut_final == "$one_final" ]] ||
  fail "final losses differ: one rank '$one_final', cutpoint '$cut_final'"
grep -q '\[rank 1\] done: 60 steps' "$DIR/log" || fail "rank 1 did not finish"
for shard in 0 1 2; do
  [[ -f $DIR/ckpt/step-00000030/rank-0000$shard.safetensors ]] ||
    fail "no shard $shard (1 before the cut, 2 after): $(ls "$DIR/ckpt/step-00000030")"
done

# Cutpoint -> one rank, and one rank -> cutpoint, from step 30.
expect_resumes_across_layouts "$WORKER" "$DIR" "$DIR/job.json" "$DIR/one.json" "$one_final"

# Per-stage TP over four processes: two pipeline stages, layer 0 at TP 1 × DP 2 and layer 1 at
# TP 2 (stage 1 all-gathers the activations it receives and the targets; the tied embedding
# summed over both stages' ranks in both layouts): the one-rank run's final loss; its step-30
# checkpoint (stage 0's shard, stage 1's two) resumes as one rank, and one rank's with it.
mkdir -p "$DIR/st"
cat > "$DIR/st/four.yaml" <<'YAML'
apiVersion: kubetrain.dev/v1alpha1
kind: Inventory
metadata: {name: four-cores}
nodes:
  - name: localhost
    cpu: {cores: 4}
    memory: 24Gi
YAML
sed 's/cutpointLayer: 1/pipelineParallel: 2, cutpointLayer: 1/; s/tiny-cut/tiny-stage-tp/' \
  "$DIR/job.yaml" > "$DIR/st/job.yaml"
"$KT" plan "$DIR/st/job.yaml" --cluster "$DIR/st/four.yaml" -o json > "$DIR/st/job.json" ||
  fail "planning per-stage TP"
python3 -c "
import json, sys
p = json.load(open('$DIR/st/job.json'))
sys.exit(not (p['pipeline']['stageTensorParallel'] == [1, 2] and p['cutpoint']['dp'] == 1 and p['world'] == 4))" ||
  fail "the plan is not 2 stages at TP 1 and TP 2: $(head -c 600 "$DIR/st/job.json")"
"$KT" plan "$DIR/st/job.yaml" --cluster "$DIR/st/four.yaml" > "$DIR/st/table" ||
  fail "planning per-stage TP as a table"
grep -q 'TP 2 × DP 1 for layers 1-1 (per-stage TP: stages 1-1)' "$DIR/st/table" ||
  fail "the table does not show the stages' TP: $(grep parallelism "$DIR/st/table")"
"$WORKER" train --plan "$DIR/one.json" --log-every 0 --checkpoint-dir "$DIR/st/one-ckpt" \
  > "$DIR/st/one.log" 2>&1 || fail "the one-rank run failed"
MASTER_PORT=$(free_port) "$WORKER" launch --plan "$DIR/st/job.json" --checkpoint-dir "$DIR/st/ckpt" \
  > "$DIR/st/log" 2>&1 || fail "the per-stage TP launch failed: $(tail -5 "$DIR/st/log")"
[[ $(final_loss "$DIR/st/log") == "$one_final" ]] ||
  fail "final losses differ: one rank '$one_final', per-stage TP '$(final_loss "$DIR/st/log")'"
for shard in 0 1 2; do
  [[ -f $DIR/st/ckpt/step-00000030/rank-0000$shard.safetensors ]] ||
    fail "no shard $shard (1 of stage 0, 2 of stage 1): $(ls "$DIR/st/ckpt/step-00000030")"
done
expect_resumes_across_layouts "$WORKER" "$DIR/st" "$DIR/st/job.json" "$DIR/one.json" "$one_final"

# The cutpoint's groups in the merged /metrics.
sed 's/steps: 60/steps: 100000/' "$DIR/job.yaml" > "$DIR/long.yaml"
"$KT" plan "$DIR/long.yaml" --cluster examples/clusters/cpu-local.yaml -o json > "$DIR/long.json"
METRICS=$(free_port)
MASTER_PORT=$(free_port) "$WORKER" launch --plan "$DIR/long.json" --metrics-port "$METRICS" \
  > "$DIR/log2" 2>&1 &
PID=$!
for _ in $(seq 100); do grep -qs '\[rank 0\] step  *5/' "$DIR/log2" && break; sleep 0.1; done
for _ in $(seq 50); do
  get "http://127.0.0.1:$METRICS/metrics" > "$DIR/metrics" 2>/dev/null || true
  grep -q 'kubetrain_worker_comm_seconds_total{.*rank="1".*group="tp"} [0-9]' "$DIR/metrics" && break
  sleep 0.1
done
for r in 0 1; do
  for group in tp dp; do  # the plan before the cut has no TP group
    grep -q "^kubetrain_worker_comm_seconds_total{.*rank=\"$r\".*group=\"$group\"}" "$DIR/metrics" ||
      fail "no $group comm metric of rank $r: $(grep comm_seconds "$DIR/metrics" | head -6)"
  done
done
promtool check metrics < "$DIR/metrics" || fail "promtool rejected the merged /metrics"
kill $PID
wait $PID 2>/dev/null
PID=
echo "launch cut ok: final loss $one_final for 1 rank, the cutpoint, per-stage TP and their resumes"

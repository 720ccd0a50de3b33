#!/usr/bin/env bash
# Pipeline stages over real processes and sockets (`kubetrain-worker launch`, Gloo's
# point-to-point sends between stages): a tiny plan in 2 stages (1F1B over 4 micro-batches) ends
# at the one-rank run's final loss; its step-30 checkpoint (a shard per stage) resumes as one rank
# to the same loss, and the one rank's checkpoint resumes in stages; the launcher's /metrics shows
# both stages' pipeline communication (group "pp", promtool-clean); killing a stage makes launch
# fail within the timeout, naming the rank.
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
metadata: {name: tiny-pp2}
spec:
  model: {preset: tiny}
  training: {steps: 60, globalBatchSize: 8, microBatchSize: 2, learningRate: 0.005, warmupSteps: 5, seed: 4}
  parallelism: {tensorParallel: 1, dataParallel: 1, pipelineParallel: 2}
  checkpoint: {intervalSteps: 30}
YAML
sed 's/pipelineParallel: 2/pipelineParallel: 1/; s/tiny-pp2/tiny-one/' "$DIR/job.yaml" > "$DIR/one.yaml"
for job in job one; do
  "$KT" plan "$DIR/$job.yaml" --cluster examples/clusters/cpu-local.yaml -o json > "$DIR/$job.json" ||
    fail "planning $job.yaml"
done
python3 -c "import json, sys; sys.exit(json.load(open('$DIR/job.json'))['pipeline']['stages'] != 2)" ||
  fail "the plan has no 2 stages"

MASTER_PORT=$(free_port) "$WORKER" launch --plan "$DIR/job.json" --checkpoint-dir "$DIR/ckpt" \
  > "$DIR/log" 2>&1 || fail "the 2-stage launch failed"
"$WORKER" train --plan "$DIR/one.json" --log-every 0 --checkpoint-dir "$DIR/one-ckpt" \
  > "$DIR/one.log" 2>&1 || fail "the one-rank run failed"
pp_final=$(final_loss "$DIR/log")
one_final=$(final_loss "$DIR/one.log")
[[ -n $one_final && $pp_final == "$one_final" ]] ||
  fail "final losses differ: one rank '$one_final', 2 stages '$pp_final'"
grep -q '\[rank 1\] done: 60 steps' "$DIR/log" || fail "stage 1 did not finish"
[[ -f $DIR/ckpt/step-00000030/rank-00000.safetensors && -f $DIR/ckpt/step-00000030/rank-00001.safetensors ]] ||
  fail "no shard per stage: $(ls "$DIR/ckpt/step-00000030")"

# Stages -> one rank, and one rank -> stages, from step 30.
expect_resumes_across_layouts "$WORKER" "$DIR" "$DIR/job.json" "$DIR/one.json" "$one_final"

# Virtual stages (the interleaved schedule): 4 layers in 2 stages of 2 chunks, rank 0 holding
# layers 0 and 2, rank 1 layers 1 and 3, through real processes; the one rank's final loss, and a
# shard per virtual stage in the checkpoint, which resumes as one rank to the same loss.
sed 's/{preset: tiny}/{layers: 4, hidden: 64, heads: 4, ffnHidden: 256, vocab: 256, seqLen: 32}/;
     s/pipelineParallel: 2}/pipelineParallel: 2, virtualStages: 2}/; s/tiny-pp2/tiny-vpp/' \
  "$DIR/job.yaml" > "$DIR/vpp.yaml"
sed 's/pipelineParallel: 2, virtualStages: 2/pipelineParallel: 1/; s/tiny-vpp/four-one/' \
  "$DIR/vpp.yaml" > "$DIR/four.yaml"
for job in vpp four; do
  "$KT" plan "$DIR/$job.yaml" --cluster examples/clusters/cpu-local.yaml -o json > "$DIR/$job.json" ||
    fail "planning $job.yaml"
done
python3 -c "import json, sys; sys.exit(json.load(open('$DIR/vpp.json'))['pipeline'].get('virtualStages') != 2)" ||
  fail "the plan has no 2 virtual stages"
MASTER_PORT=$(free_port) "$WORKER" launch --plan "$DIR/vpp.json" --checkpoint-dir "$DIR/vckpt" \
  > "$DIR/vlog" 2>&1 || { tail -20 "$DIR/vlog"; fail "the virtual-stage launch failed"; }
"$WORKER" train --plan "$DIR/four.json" --log-every 0 > "$DIR/four.log" 2>&1 ||
  fail "the one-rank run of 4 layers failed"
vpp_final=$(final_loss "$DIR/vlog")
four_final=$(final_loss "$DIR/four.log")
[[ -n $four_final && $vpp_final == "$four_final" ]] ||
  fail "final losses differ: one rank '$four_final', 2 stages × 2 virtual '$vpp_final'"
for shard in 0 1 2 3; do
  [[ -f $DIR/vckpt/step-00000030/rank-0000$shard.safetensors ]] ||
    fail "no shard $shard of 4 virtual stages: $(ls "$DIR/vckpt/step-00000030")"
done
rm -rf "$DIR/vckpt/step-00000060"
"$WORKER" train --plan "$DIR/four.json" --log-every 0 --checkpoint-dir "$DIR/vckpt" \
  > "$DIR/vresume.log" 2>&1 || fail "one rank did not resume the virtual stages' checkpoint"
[[ $(final_loss "$DIR/vresume.log") == "$four_final" ]] ||
  fail "resumed from the virtual stages: '$(final_loss "$DIR/vresume.log")', want '$four_final'"

# A dead stage: the launcher stops the job and names it.
sed 's/steps: 60/steps: 100000/' "$DIR/job.yaml" > "$DIR/long.yaml"
"$KT" plan "$DIR/long.yaml" --cluster examples/clusters/cpu-local.yaml -o json > "$DIR/long.json"
METRICS=$(free_port)
MASTER_PORT=$(free_port) KUBETRAIN_COMM_TIMEOUT_SECONDS=20 "$WORKER" launch --plan "$DIR/long.json" \
  --metrics-port "$METRICS" > "$DIR/log2" 2>&1 &
PID=$!
for _ in $(seq 100); do grep -qs '\[rank 0\] step  *5/' "$DIR/log2" && break; sleep 0.1; done
# Both stages' sends and receives are in the merged /metrics, as group "pp".
for _ in $(seq 50); do
  get "http://127.0.0.1:$METRICS/metrics" > "$DIR/metrics" 2>/dev/null || true
  grep -q 'kubetrain_worker_comm_seconds_total{.*rank="1".*group="pp"} [0-9]' "$DIR/metrics" && break
  sleep 0.1
done
for r in 0 1; do
  grep -q "^kubetrain_worker_comm_seconds_total{.*rank=\"$r\".*group=\"pp\"}" "$DIR/metrics" ||
    fail "no pp comm metric of rank $r: $(grep comm_seconds "$DIR/metrics" | head -4)"
done
promtool check metrics < "$DIR/metrics" || fail "promtool rejected the merged /metrics"
expect_dead_rank_noticed $PID "$DIR/log2"  # rank 1, the last stage
PID=
echo "launch pp ok: final loss $one_final for 1 rank, 2 stages and both resumes; $four_final for 2 stages × 2 virtual, one rank and its resume; killed stage noticed in ${NOTICED_IN}s: $(grep -m1 'launch: rank' "$DIR/log2")"

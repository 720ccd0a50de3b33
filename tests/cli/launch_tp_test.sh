#!/usr/bin/env bash
# Two real ranks through `kubetrain-worker launch`: a TP=2 tiny plan with the Oases overlap trains
# with a falling loss and one /metrics that shows both ranks (promtool-clean); its step-40
# checkpoint resumes as one rank (resharded) to the one-rank run's final loss; killing one rank
# makes launch fail within the timeout, naming the rank.
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
metadata: {name: tiny-tp2}
spec:
  model: {preset: tiny}
  training: {steps: 80, globalBatchSize: 8, learningRate: 0.005, warmupSteps: 5, seed: 4}
  parallelism: {tensorParallel: 2, overlap: on, recompute: commAware}
  checkpoint: {intervalSteps: 40}
YAML
"$KT" plan "$DIR/job.yaml" --cluster examples/clusters/cpu-local.yaml -o json > "$DIR/plan.json" ||
  fail "planning"
METRICS=$(free_port)
MASTER_PORT=$(free_port) "$WORKER" launch --plan "$DIR/plan.json" --metrics-port "$METRICS" \
  --checkpoint-dir "$DIR/ckpt" > "$DIR/log" 2>&1 &
PID=$!
for _ in $(seq 100); do
  get "http://127.0.0.1:$METRICS/metrics" > "$DIR/metrics" 2>/dev/null || true
  grep -q 'kubetrain_worker_steps_total{.*rank="1".*} [1-9]' "$DIR/metrics" && break
  sleep 0.2
done
for r in 0 1; do
  grep -q "^kubetrain_worker_steps_total{trainingjob=\"tiny-tp2\",namespace=\"default\",rank=\"$r\"" "$DIR/metrics" ||
    fail "rank $r missing from the launcher's /metrics: $(head -c 400 "$DIR/metrics")"
done
grep -q '^kubetrain_worker_comm_seconds_total{.*group="tp"}' "$DIR/metrics" || fail "no tp comm metric"
promtool check metrics < "$DIR/metrics" || fail "promtool rejected the merged /metrics"
wait $PID
rc=$?
PID=
[[ $rc -eq 0 ]] || fail "launch exited $rc"
first=$(grep -m1 '\[rank 0\] step ' "$DIR/log" | sed 's/.*| loss \([0-9.]*\) .*/\1/')
last=$(grep '\[rank 0\] step ' "$DIR/log" | tail -1 | sed 's/.*| loss \([0-9.]*\) .*/\1/')
python3 -c "import sys; sys.exit(0 if float('$last') < float('$first') - 1.0 else 1)" ||
  fail "loss did not fall: $first -> $last"
grep -q '\[rank 1\] done: 80 steps' "$DIR/log" || fail "rank 1 did not finish"

# Multi-process equivalence: the same job as one rank and as DP=2 (Gloo, bucketed gradient
# all-reduce) ends with the TP=2 + overlap + commAware run's loss (printed to 4 decimals).
tp_final=$(sed -n 's/^\[rank 0\] done: 80 steps, final loss \([0-9.]*\)$/\1/p' "$DIR/log")
sed 's/parallelism: {.*}/parallelism: {tensorParallel: 1, dataParallel: 1}/; s/tiny-tp2/tiny-one/' \
  "$DIR/job.yaml" > "$DIR/one.yaml"
sed 's/parallelism: {.*}/parallelism: {tensorParallel: 1, dataParallel: 2}/; s/tiny-tp2/tiny-dp2/' \
  "$DIR/job.yaml" > "$DIR/dp.yaml"
"$KT" plan "$DIR/one.yaml" --cluster examples/clusters/cpu-local.yaml -o json > "$DIR/one.json"
"$KT" plan "$DIR/dp.yaml" --cluster examples/clusters/cpu-local.yaml -o json > "$DIR/dp.json"
one_final=$("$WORKER" train --plan "$DIR/one.json" --log-every 0 | sed -n 's/^done: 80 steps, final loss \([0-9.]*\)$/\1/p')
MASTER_PORT=$(free_port) "$WORKER" launch --plan "$DIR/dp.json" > "$DIR/dp.log" 2>&1 || fail "dp=2 launch"
dp_final=$(sed -n 's/^\[rank 0\] done: 80 steps, final loss \([0-9.]*\)$/\1/p' "$DIR/dp.log")
[[ -n $one_final && $one_final == "$tp_final" && $one_final == "$dp_final" ]] ||
  fail "final losses differ: one rank '$one_final', TP=2 '$tp_final', DP=2 '$dp_final'"

# Resharding resume: the TP=2 run's step-40 checkpoint (its two shards) trains on as one rank.
rm -rf "$DIR/ckpt/step-00000080"
echo step-00000040 > "$DIR/ckpt/latest"
"$WORKER" train --plan "$DIR/one.json" --log-every 0 --checkpoint-dir "$DIR/ckpt" \
  > "$DIR/reshard.log" 2>&1 || fail "the resharded resume failed: $(tail -3 "$DIR/reshard.log")"
grep -q 'resumed from step 40 .*tensors resharded' "$DIR/reshard.log" ||
  fail "no resharded resume: $(head -5 "$DIR/reshard.log")"
reshard_final=$(sed -n 's/^done: 80 steps, final loss \([0-9.]*\)$/\1/p' "$DIR/reshard.log")
[[ $reshard_final == "$one_final" ]] ||
  fail "TP=2 -> 1 resumed to '$reshard_final', the one-rank run to '$one_final'"

# A dead rank: the launcher stops the job and names it.
sed 's/steps: 80/steps: 100000/' "$DIR/job.yaml" > "$DIR/long.yaml"
"$KT" plan "$DIR/long.yaml" --cluster examples/clusters/cpu-local.yaml -o json > "$DIR/long.json"
PORT2=$(free_port)
MASTER_PORT=$PORT2 KUBETRAIN_COMM_TIMEOUT_SECONDS=20 "$WORKER" launch --plan "$DIR/long.json" \
  > "$DIR/log2" 2>&1 &
PID=$!
expect_dead_rank_noticed $PID "$DIR/log2"
PID=
echo "launch ok: loss $first -> $last (final $one_final for 1 rank, TP=2 and DP=2); killed rank noticed in ${NOTICED_IN}s (exit $LAUNCH_RC): $(grep -m1 'launch: rank' "$DIR/log2")"

#!/usr/bin/env bash
# kubetrain-worker launch as a pod runs it, with fake ranks (tests/cli/fake_rank.py through
# KUBETRAIN_LAUNCH_CHILD): the rank environment, "[rank N] " output prefixes, the merged
# /metrics (checked by promtool) and /healthz, a failed or killed rank named and its code
# returned, the others stopped (SIGKILL after the grace period if they ignore SIGTERM), and
# SIGTERM forwarded.
# Usage: launch_test.sh KUBETRAIN KUBETRAIN_WORKER   (from the source root)
set -u
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
KT=$1
WORKER=$2
DIR=$(mktemp -d)
PID=
trap '[[ -n $PID ]] && kill $PID 2>/dev/null; rm -rf "$DIR"' EXIT
fail_context() { [[ -f $DIR/out ]] && tail -n 30 "$DIR/out" "$DIR/err"; }
export KUBETRAIN_LAUNCH_CHILD=$PWD/tests/cli/fake_rank.py
unset RANK WORLD_SIZE MASTER_ADDR MASTER_PORT NODE_RANK

cat > "$DIR/job.yaml" <<'YAML'
apiVersion: kubetrain.dev/v1alpha1
kind: TrainingJob
metadata: {name: tiny-launch}
spec:
  model: {preset: tiny}
  training: {steps: 10, globalBatchSize: 8}
  resources: {gpusPerNode: 1}
YAML
"$KT" plan "$DIR/job.yaml" --cluster examples/clusters/cpu-local.yaml -o json > "$DIR/plan1.json" ||
  fail "planning"
# Two nodes of two ranks each (tp 2 × dp 2): launch only reads the layout. The hand edit gets its
# planHash recomputed (api/plan.cpp compute_plan_hash: FNV-1a 64 of the executed part); a plan
# without one is refused.
python3 - "$DIR/plan1.json" "$DIR/plan.json" <<'PY' || fail "editing the plan"
import json, sys
plan = json.load(open(sys.argv[1]))
plan.update(nodes=2, procsPerNode=2, tp=2, dp=2, world=4)
part = {k: v for k, v in plan.items()
        if k not in ("predicted", "peak", "alternatives", "explanation", "planHash")}
h = 0xcbf29ce484222325
for b in json.dumps(part, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode():
    h = ((h ^ b) * 0x100000001b3) % 2**64
plan["planHash"] = "%016x" % h
json.dump(plan, open(sys.argv[2], "w"))
PY

run() {  # run [env...]: launch in the foreground; sets RC
  env "$@" "$WORKER" launch --plan "$DIR/plan.json" --checkpoint-dir "$DIR/ckpt" \
    > "$DIR/out" 2> "$DIR/err"
  RC=$?
}

# 1. All ranks succeed: exit 0, each rank's environment and arguments, prefixed output.
run NODE_RANK=1 MASTER_ADDR=10.1.2.3 FAKE_RANK=ok
[[ $RC == 0 ]] || fail "all ok: rc $RC"
want="[rank 2] env RANK=2 LOCAL_RANK=0 WORLD_SIZE=4 MASTER_ADDR=10.1.2.3 MASTER_PORT=29500"
want+=" NODE_RANK=1 args train --plan $DIR/plan.json --checkpoint-dir $DIR/ckpt"
want+=" --metrics-port 0 --metrics-address 127.0.0.1"
grep -qxF "$want" "$DIR/out" || fail "rank 2's environment"
grep -q "^\[rank 3\] env RANK=3 LOCAL_RANK=1 " "$DIR/out" || fail "rank 3's environment"
grep -qx "\[rank 3\] a line on stderr" "$DIR/err" || fail "stderr prefix"
echo "ok: all ranks exit 0, environment and prefixes"

# 2. A rank fails: named, the others get SIGTERM, launch exits with its code.
start=$(date +%s.%N)
run FAKE_RANK=fail:1:3
[[ $RC == 3 ]] || fail "failed rank: rc $RC"
grep -qx "kubetrain-worker launch: rank 1 exited with code 3" "$DIR/err" || fail "failure message"
grep -qx "\[rank 0\] got SIGTERM" "$DIR/out" || fail "rank 0 was not stopped"
python3 -c "import sys; sys.exit(0 if $(date +%s.%N) - $start < 5 else 1)" || fail "slow stop"
echo "ok: a failed rank is named and its code returned"

# 3. A rank killed by a signal: 128 + 9.
run FAKE_RANK=kill:0
[[ $RC == 137 ]] || fail "killed rank: rc $RC"
grep -q "^kubetrain-worker launch: rank 0 exited with code 137 (signal 9" "$DIR/err" ||
  fail "signal message"
echo "ok: a killed rank gives 137"

# 4. Ranks that ignore SIGTERM after a failure are killed after the 10 s grace period.
start=$(date +%s)
run FAKE_RANK=stubborn:0
took=$(( $(date +%s) - start ))
[[ $RC == 3 ]] || fail "stubborn: rc $RC"
grep -q "still running after 10 s; killing them" "$DIR/err" || fail "no SIGKILL message"
(( took >= 10 && took <= 14 )) || fail "stubborn ranks took ${took}s"
echo "ok: stubborn ranks are killed after the grace period (${took}s)"

# 5. Merged /metrics and /healthz while the ranks run, then SIGTERM is forwarded: 143.
FAKE_RANK=wait "$WORKER" launch --plan "$DIR/plan.json" --metrics-port 0 \
  --metrics-address 127.0.0.1 > "$DIR/out" 2> "$DIR/err" &
PID=$!
for _ in $(seq 100); do
  PORT=$(sed -n 's|^metrics on http://127.0.0.1:\([0-9]*\)/metrics$|\1|p' "$DIR/out")
  [[ -n $PORT ]] && [[ $(grep -c '^\[rank [01]\] metrics on' "$DIR/out") == 2 ]] && break
  sleep 0.1
done
[[ -n $PORT ]] || fail "launch did not announce its metrics port"
[[ $(get "http://127.0.0.1:$PORT/healthz") == ok ]] || fail "/healthz"
get "http://127.0.0.1:$PORT/metrics" > "$DIR/metrics" || fail "/metrics"
grep -qx 'fake_steps_total{rank="0"} 10' "$DIR/metrics" || fail "rank 0 missing in /metrics"
grep -qx 'fake_steps_total{rank="1"} 11' "$DIR/metrics" || fail "rank 1 missing in /metrics"
[[ $(grep -c '^# TYPE fake_step_seconds histogram' "$DIR/metrics") == 1 ]] || fail "TYPE twice"
if command -v promtool > /dev/null; then
  promtool check metrics < "$DIR/metrics" || fail "promtool rejected the merged /metrics"
fi
kill -TERM $PID
wait $PID
RC=$?
PID=
[[ $RC == 143 ]] || fail "SIGTERM: rc $RC"
[[ $(grep -c '^\[rank [01]\] got SIGTERM' "$DIR/out") == 2 ]] || fail "SIGTERM not forwarded"
grep -q "forwarding SIGTERM to 2 rank(s)" "$DIR/err" || fail "forwarding message"
echo "ok: merged /metrics, /healthz, SIGTERM forwarded (143)"

# 6. A plan whose layout does not fit NODE_RANK is refused.
run NODE_RANK=2 FAKE_RANK=ok
[[ $RC == 1 ]] || fail "bad NODE_RANK: rc $RC"
grep -q "NODE_RANK=2 with 2 rank(s) per node does not fit in a world of 4" "$DIR/err" ||
  fail "bad NODE_RANK message"
echo "ok: a NODE_RANK outside the plan is refused"
echo "PASS"

#!/usr/bin/env bash
# The worker's SIGTERM path under glibc's malloc checking, looped (docs/RELIABILITY.md, "The
# worker's SIGTERM path, 200 times"). Each iteration starts `kubetrain-worker train` as
# tests/cli/worker_test.sh does (the tiny preset, /metrics on a free port, a fresh checkpoint
# directory), lets it train a few steps, starts 4 clients scraping /metrics and /healthz as fast as
# they can, sends SIGTERM at a random moment while they scrape, and checks that the worker exits 143
# with its stop message and no malloc complaint. Extra busy processes (LOAD, default 1) keep the
# cores contended.
#
#   scripts/sigterm_loop.sh ITERATIONS [BUILD_DIR]     # prints one line per failure and a summary
#
# Malloc checking: glibc 2.36 reads MALLOC_CHECK_ only when libc_malloc_debug.so.0 is preloaded
# (checked on a one-byte heap overflow: aborts with the preload, runs on without), so the worker
# runs with LD_PRELOAD=libc_malloc_debug.so.0 GLIBC_TUNABLES=glibc.malloc.check=3
# MALLOC_CHECK_=3 MALLOC_PERTURB_=165. Exit 0 when every iteration passed.
set -u
ITERATIONS=${1:?usage: sigterm_loop.sh ITERATIONS [BUILD_DIR]}
BUILD=${2:-build}
KT=$(realpath "$BUILD/bin/kubetrain")
WORKER=$(realpath "$BUILD/bin/kubetrain-worker")
LOAD=${LOAD:-1}
DIR=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$DIR"; }
trap cleanup EXIT

[[ -x $KT && -x $WORKER ]] || { echo "no $KT or $WORKER (build first)"; exit 2; }
MALLOC_DEBUG=$(ldconfig -p | sed -n 's/.*libc_malloc_debug.so.0 .*=> //p' | head -1)
[[ -n $MALLOC_DEBUG ]] || { echo "libc_malloc_debug.so.0 not found (glibc >= 2.34 ships it)"; exit 2; }

cat > "$DIR/job.yaml" <<'YAML'
apiVersion: kubetrain.dev/v1alpha1
kind: TrainingJob
metadata: {name: sigterm-loop}
spec:
  model: {preset: tiny}
  training: {steps: 100000, globalBatchSize: 8, learningRate: 0.005, warmupSteps: 10, seed: 11}
  resources: {gpusPerNode: 1}
  checkpoint: {intervalSteps: 20, keep: 2}
YAML
"$KT" plan "$DIR/job.yaml" --cluster examples/clusters/cpu-local.yaml -o json > "$DIR/plan.json" ||
  { echo "planning failed"; exit 2; }

cat > "$DIR/scrape.py" <<'PY'
# Scrapes /metrics and /healthz from 4 threads until the server has refused for 2 s.
import sys, threading, time, urllib.request
port = sys.argv[1]
def scrape(path):
    refused_since = None
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2).read()
            refused_since = None
        except Exception:
            refused_since = refused_since or time.monotonic()
            if time.monotonic() - refused_since > 2:
                return
            time.sleep(0.01)
threads = [threading.Thread(target=scrape, args=(p,)) for p in ("/metrics",) * 3 + ("/healthz",)]
for t in threads: t.start()
for t in threads: t.join()
PY

for _ in $(seq "$LOAD"); do
  (while :; do :; done) &
  PIDS+=($!)
done

# A crash leaves a core in $DIR/run (core_pattern "core"); gdb prints its threads' stacks.
ulimit -c unlimited 2>/dev/null
mkdir -p "$DIR/run"
failures=0
aborts=0
for i in $(seq "$ITERATIONS"); do
  rm -rf "$DIR/ckpt" "$DIR"/run/core*
  (cd "$DIR/run" &&
    LD_PRELOAD=$MALLOC_DEBUG GLIBC_TUNABLES=glibc.malloc.check=3 MALLOC_CHECK_=3 MALLOC_PERTURB_=165 \
      exec "$WORKER" train --plan "$DIR/plan.json" --checkpoint-dir "$DIR/ckpt" --metrics-port 0 \
      --metrics-address 127.0.0.1 --log-every 5) > "$DIR/log" 2>&1 &
  pid=$!
  port=
  for _ in $(seq 200); do
    port=$(sed -n 's|^metrics on http://127.0.0.1:\([0-9]*\)/metrics$|\1|p' "$DIR/log")
    [[ -n $port ]] && grep -q '^step ' "$DIR/log" && break
    sleep 0.05
  done
  python3 "$DIR/scrape.py" "${port:-1}" &
  scraper=$!
  sleep "0.$((RANDOM % 10))$((RANDOM % 10))"  # 0 to 0.99 s into the scraping
  kill -TERM $pid
  wait $pid
  rc=$?
  wait $scraper
  problem=
  if [[ -z $port ]]; then
    problem="no metrics port or no step announced"
  elif [[ $rc -ne 143 ]]; then
    problem="exit code $rc (want 143)"
  elif ! grep -q "stopped by signal after step" "$DIR/log"; then
    problem="no stop message"
  elif grep -qiE 'malloc|free\(\)|corrupt|double free' "$DIR/log"; then
    problem="malloc complaint"
  fi
  if [[ -n $problem ]]; then
    failures=$((failures + 1))
    ((rc == 134 || rc == 139)) && aborts=$((aborts + 1))
    echo "iteration $i: $problem"
    tail -5 "$DIR/log" | sed 's/^/    /'
    cp "$DIR/log" "/tmp/sigterm_loop_failure_$i.log"
    for core in "$DIR"/run/core*; do
      [[ -f $core ]] && command -v gdb > /dev/null &&
        gdb -batch -q -ex 'thread apply all bt 30' "$WORKER" "$core" \
          >> "/tmp/sigterm_loop_failure_$i.log" 2>&1
    done
    echo "    log and stacks: /tmp/sigterm_loop_failure_$i.log"
  fi
done
echo "sigterm_loop: $ITERATIONS iterations, $failures failed ($aborts aborts/segfaults); load $LOAD busy process(es), 4 scrapers"
[[ $failures -eq 0 ]]

# What the shell tests share. Each sources it first thing after its `set` line:
#   source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"

# fail MESSAGE...: prints "FAIL: MESSAGE", then whatever the test's own `fail_context` function
# shows (its logs), then the message again (a CI log that keeps only the head and the tail of a
# long output still says what failed), and exits 1.
fail() {
  echo "FAIL: $*"
  if declare -F fail_context > /dev/null; then
    fail_context
    echo "FAIL (above): $*"
  fi
  exit 1
}

# free_port: a TCP port on 127.0.0.1 that was free a moment ago.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# get URL: the body on stdout; exit status 1 when it cannot be fetched.
get() {
  python3 -c 'import sys, urllib.request
try: print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode(), end="")
except Exception as e: sys.exit(1)' "$1"
}

# wait_for SECONDS COMMAND...: runs COMMAND (its output discarded) every 0.5 s until it succeeds;
# status 1 when SECONDS pass first.
# A wait that takes more than half its time is reported on stderr (what a loaded machine made
# slow, before it makes a test fail).
wait_for() {
  local budget=$1 start=$SECONDS
  local deadline=$((SECONDS + budget))
  shift
  until "$@" > /dev/null 2>&1; do
    if (( SECONDS >= deadline )); then
      echo "wait_for: gave up after ${budget} s: $*" >&2
      return 1
    fi
    sleep 0.5
  done
  if (( (SECONDS - start) * 2 > budget )); then
    echo "wait_for: slow, $((SECONDS - start)) s of ${budget} s: $*" >&2
  fi
}

# announced_port LOG: the port of the "metrics on http://127.0.0.1:PORT/metrics" line that
# kubetrain-worker writes to LOG, waiting up to 10 s for it; nothing (status 1) if none comes.
announced_port() {
  local port _
  for _ in $(seq 100); do
    port=$(sed -n 's|^metrics on http://127.0.0.1:\([0-9]*\)/metrics$|\1|p' "$1")
    [[ -n $port ]] && { echo "$port"; return 0; }
    sleep 0.1
  done
  return 1
}

# require_kubectl: exits 77 (ctest's "skipped") when kubectl is not installed.
require_kubectl() {
  if ! command -v kubectl > /dev/null; then
    echo "kubectl not installed: skipped"
    exit 77
  fi
}

# with_scratch: OUT, a scratch directory, and PIDS, the background processes to stop (append
# with `PIDS+=($!)`); on exit every one is killed and waited for and OUT removed. On failure
# (fail_context) the tail of every $OUT/*.log is shown.
with_scratch() {
  OUT=$(mktemp -d)
  PIDS=()
  trap _scratch_cleanup EXIT
  fail_context() { for f in "$OUT"/*.log; do echo "--- $f"; tail -30 "$f"; done; }
}
_scratch_cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2> /dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2> /dev/null || true; done
  rm -rf "$OUT"
}

# serve_simulated N: `$KT local serve --simulate-nodes N` in the background (kubeconfig
# $OUT/kubeconfig, log $OUT/serve.log), K (kubectl against it), and the TrainingJob CRD applied.
# serve_local: the same with this machine as the only Node, its pods run as local processes.
serve_simulated() {
  _serve --simulate-nodes "$1" --simulate-pod-start-delay 0.2
}
serve_local() {
  _serve
}
_serve() {
  "$KT" local serve "$@" \
    --kubeconfig-out "$OUT/kubeconfig" --workdir "$OUT/work" > "$OUT/serve.log" 2>&1 &
  PIDS+=($!)
  wait_for 10 test -s "$OUT/kubeconfig" || fail "local serve wrote no kubeconfig"
  K() { kubectl --kubeconfig "$OUT/kubeconfig" --request-timeout=20s "$@"; }
  K apply -f crds/trainingjobs.kubetrain.dev.yaml > /dev/null || fail "apply CRD"
}

# run_operator [FLAGS...]: `$OPERATOR` against that server in the background, logging to
# $OUT/op.log.
run_operator() {
  "$OPERATOR" --kubeconfig "$OUT/kubeconfig" --metrics-bind-address 127.0.0.1:0 \
    --health-probe-bind-address 127.0.0.1:0 "$@" > "$OUT/op.log" 2>&1 &
  PIDS+=($!)
}

# expect_dead_rank_noticed PID LOG: once LOG shows rank 0's step 5, SIGKILLs the highest-numbered
# rank process of the `kubetrain-worker launch` at PID (a child of this shell; rank 0 hosts the
# store), then expects the launcher to exit non-zero within 45 s naming the dead rank. Sets
# NOTICED_IN (seconds) and LAUNCH_RC. The caller forgets PID afterwards (it has exited).
expect_dead_rank_noticed() {
  local pid=$1 log=$2 victim start _
  for _ in $(seq 100); do grep -qs '\[rank 0\] step  *5/' "$log" && break; sleep 0.1; done
  victim=$(pgrep -P "$pid" | sort -n | tail -1)
  [[ -n $victim ]] || fail "no rank processes"
  start=$(date +%s)
  kill -9 "$victim"
  wait "$pid"
  LAUNCH_RC=$?
  NOTICED_IN=$(($(date +%s) - start))
  [[ $LAUNCH_RC -ne 0 ]] || fail "launch exited 0 after a rank was killed"
  grep -q 'kubetrain-worker launch: rank [0-9]* exited' "$log" || fail "the dead rank is not named"
  [[ $NOTICED_IN -le 45 ]] || fail "launch took ${NOTICED_IN}s to notice"
}

# final_loss LOG: the final loss a 60-step run printed ("done: 60 steps, final loss X"; rank 0's
# under launch).
final_loss() { sed -n 's/^\(\[rank 0\] \)\{0,1\}done: 60 steps, final loss \([0-9.]*\)$/\2/p' "$1"; }

# expect_resumes_across_layouts WORKER DIR PLAN ONE FINAL: DIR/ckpt holds PLAN's 60-step run
# (launched) and DIR/one-ckpt ONE's (one rank), both with a step-30 checkpoint. Rolls both back
# to step 30, resumes PLAN's checkpoint as one rank and ONE's under PLAN, and expects each
# resharded resume to end at FINAL (the one-rank run's final loss).
expect_resumes_across_layouts() {
  local worker=$1 dir=$2 plan=$3 one=$4 final=$5 from
  for from in ckpt one-ckpt; do
    rm -rf "$dir/$from/step-00000060"
    echo step-00000030 > "$dir/$from/latest"
  done
  "$worker" train --plan "$one" --log-every 0 --checkpoint-dir "$dir/ckpt" \
    > "$dir/resume1.log" 2>&1 || fail "one rank did not resume $plan's checkpoint: $(tail -3 "$dir/resume1.log")"
  grep -q 'resumed from step 30 .*tensors resharded' "$dir/resume1.log" ||
    fail "no resharded resume: $(head -5 "$dir/resume1.log")"
  [[ $(final_loss "$dir/resume1.log") == "$final" ]] ||
    fail "$plan -> one rank resumed to '$(final_loss "$dir/resume1.log")', not '$final'"
  MASTER_PORT=$(free_port) "$worker" launch --plan "$plan" --checkpoint-dir "$dir/one-ckpt" \
    > "$dir/resume2.log" 2>&1 || fail "$plan did not resume one rank's checkpoint: $(tail -3 "$dir/resume2.log")"
  grep -q '\[rank 1\] resumed from step 30' "$dir/resume2.log" || fail "rank 1 did not resume"
  [[ $(final_loss "$dir/resume2.log") == "$final" ]] ||
    fail "one rank -> $plan resumed to '$(final_loss "$dir/resume2.log")', not '$final'"
}

#!/usr/bin/env bash
# `kubetrain run` end to end: the reconciler, the local control plane and real worker processes.
#  1. examples/jobs/tiny.yaml succeeds, the loss falls, and checkpoints land in the work dir;
#  2. an invalid job exits non-zero naming the field, before anything runs;
#  3. a worker that exits 3 fails the job (permanent exit code) with the reason;
#  4. Ctrl-C stops a running job: exit 130, and no worker process is left behind;
#  4b. run again after Ctrl-C, it says that it resumes, and its summary counts this run's steps
#     from the step it resumed at;
#  5. a job deleted by ttlSecondsAfterFinished: 0 as it succeeds still exits 0;
#  6. a worker killed mid-run (exit 137, retryable) restarts the whole gang, which resumes from
#     the latest checkpoint and succeeds;
#  7. examples/jobs/tiny-pipeline.yaml (tiny in 2 stages: two ranks, 1F1B) succeeds with tiny's
#     losses;
#  8. examples/jobs/tiny-cutpoint.yaml (layer 0 at DP 2, layer 1 at TP 2: Oases' cutpoint)
#     succeeds with tiny's losses.
set -u
KT=$1
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
fail=0

# 1. tiny succeeds and learns.
start=$(date +%s.%N)
"$KT" run examples/jobs/tiny.yaml --workdir "$DIR/tiny" > "$DIR/out" 2> "$DIR/err"
rc=$?
end=$(date +%s.%N)
summary=$(grep '^Succeeded:' "$DIR/out")
if [[ $rc -ne 0 || -z $summary ]]; then
  echo "FAIL tiny: rc $rc"; cat "$DIR/out" "$DIR/err"; fail=1
else
  # "Succeeded: 200 steps in 6.1s, loss 5.5561 -> 4.3786, ..."
  first=$(sed -E 's/.*loss ([0-9.]+) -> ([0-9.]+).*/\1/' <<< "$summary")
  last=$(sed -E 's/.*loss ([0-9.]+) -> ([0-9.]+).*/\2/' <<< "$summary")
  steps=$(sed -E 's/^Succeeded: ([0-9]+) steps.*/\1/' <<< "$summary")
  if ! awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.5) }'; then
    echo "FAIL tiny: loss did not fall by 0.5: $first -> $last"; fail=1
  elif [[ $steps -ne 200 ]]; then
    echo "FAIL tiny: $steps steps, expected 200"; fail=1
  elif ! grep -q '^phase: Running' "$DIR/out"; then
    echo "FAIL tiny: never reported Running"; cat "$DIR/out"; fail=1
  elif [[ -z $(ls -A "$DIR/tiny/checkpoints" 2>/dev/null) ]]; then
    echo "FAIL tiny: no checkpoint in $DIR/tiny/checkpoints"; fail=1
  else
    echo "ok   tiny: loss $first -> $last in $(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.1f", b-a}') s wall"
  fi
fi

# 2. An invalid job names the field and starts nothing.
printf 'apiVersion: kubetrain.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: bad}\nspec:\n  model: {preset: tiny}\n  training: {steps: -4}\n' > "$DIR/bad.yaml"
"$KT" run "$DIR/bad.yaml" --workdir "$DIR/bad" > "$DIR/out" 2> "$DIR/err"
rc=$?
if [[ $rc -eq 0 ]] || ! grep -q 'spec.training.steps' "$DIR/err"; then
  echo "FAIL invalid: rc $rc"; cat "$DIR/err"; fail=1
elif [[ -d $DIR/bad/pods ]]; then
  echo "FAIL invalid: pods were started"; fail=1
else
  echo "ok   invalid (rc $rc): $(cat "$DIR/err")"
fi

# 3. A permanent worker failure fails the job with the reason.
printf '#!/bin/sh\necho "fake worker: $*"\nexit 3\n' > "$DIR/failing-worker"
chmod +x "$DIR/failing-worker"
"$KT" run examples/jobs/tiny.yaml --workdir "$DIR/failing" --worker "$DIR/failing-worker" > "$DIR/out" 2> "$DIR/err"
rc=$?
if [[ $rc -ne 1 ]] || ! grep -q 'WorkerFailed.*exit code 3' "$DIR/err"; then
  echo "FAIL worker-failure: rc $rc"; cat "$DIR/out" "$DIR/err"; fail=1
elif ! grep -q 'fake worker: launch --plan' "$DIR/err"; then
  echo "FAIL worker-failure: the pod log's tail is not shown"; cat "$DIR/err"; fail=1
else
  echo "ok   worker-failure (rc $rc): $(head -1 "$DIR/err")"
fi

# interrupt_run JOB WORKDIR: `kubetrain run` in the background, Ctrl-C once it has trained a
# step, then its exit status in $rc.
interrupt_run() {
  "$KT" run "$1" --workdir "$2" > "$DIR/out" 2> "$DIR/err" &
  local pid=$!
  for _ in $(seq 1 300); do
    grep -q '^progress: step [1-9]' "$DIR/out" && break
    sleep 0.1
  done
  kill -INT $pid
  for _ in $(seq 1 300); do kill -0 $pid 2> /dev/null || break; sleep 0.1; done
  wait $pid
  rc=$?
}

# 4. Ctrl-C stops a long job cleanly.
sed 's/steps: 200/steps: 1000000/' examples/jobs/tiny.yaml > "$DIR/long.yaml"
interrupt_run "$DIR/long.yaml" "$DIR/long"
left=$(pgrep -f -- "--checkpoint-dir $DIR/long" || true)
if [[ $rc -ne 130 ]]; then
  echo "FAIL interrupt: rc $rc"; cat "$DIR/out" "$DIR/err"; fail=1
elif [[ -n $left ]]; then
  echo "FAIL interrupt: workers left running: $left"; kill -9 $left; fail=1
elif ! grep -q '^progress: step' "$DIR/out"; then
  echo "FAIL interrupt: it never trained"; fail=1
else
  echo "ok   interrupt (rc $rc)"
fi
# 4b. Interrupted, then run again: it resumes from the checkpoint the interrupted run saved, says
# so, and its summary speaks of this run's steps only.
sed 's/steps: 200/steps: 400/' examples/jobs/tiny.yaml > "$DIR/resume.yaml"
interrupt_run "$DIR/resume.yaml" "$DIR/resume"
"$KT" run "$DIR/resume.yaml" --workdir "$DIR/resume" > "$DIR/out" 2> "$DIR/err"
rc=$?
resumed=$(grep '^Succeeded:' "$DIR/out")
from=$(sed -nE 's/.*resumed an earlier one at step ([0-9]+).*/\1/p' <<< "$resumed")
if [[ $rc -ne 0 ]]; then
  echo "FAIL resume: rc $rc"; cat "$DIR/out" "$DIR/err"; fail=1
elif ! grep -q '^resuming: .*holds an earlier run' "$DIR/out"; then
  echo "FAIL resume: no word of resuming"; cat "$DIR/out"; fail=1
elif [[ -z $from || $from -lt 1 ]]; then
  echo "FAIL resume: the summary does not say where it resumed: $resumed"; fail=1
elif ! grep -qE "^Succeeded: $((400 - from)) steps in .* \(steps $((from + 1)) to 400\)" <<< "$resumed"; then
  echo "FAIL resume: the summary counts other steps than this run's: $resumed"; fail=1
else
  echo "ok   resume: $resumed"
fi
# ...and once more: the checkpoint is at the last step, so nothing is trained, and it says so.
"$KT" run "$DIR/resume.yaml" --workdir "$DIR/resume" > "$DIR/out" 2> "$DIR/err"
rc=$?
if [[ $rc -ne 0 ]] || ! grep -q '^Succeeded: nothing left to train: the checkpoint of an earlier run is at step 400 of 400' "$DIR/out"; then
  echo "FAIL resume-finished: rc $rc"; cat "$DIR/out" "$DIR/err"; fail=1
else
  echo "ok   resume-finished: $(grep '^Succeeded:' "$DIR/out")"
fi

# 5. TTL 0: the job is gone the moment it succeeds.
sed -e 's/steps: 200/steps: 20/' examples/jobs/tiny.yaml > "$DIR/ttl.yaml"
printf '  runPolicy:\n    ttlSecondsAfterFinished: 0\n' >> "$DIR/ttl.yaml"
"$KT" run "$DIR/ttl.yaml" --workdir "$DIR/ttl" > "$DIR/out" 2> "$DIR/err"
rc=$?
if [[ $rc -ne 0 ]] || ! grep -q '^Succeeded: 20 steps' "$DIR/out"; then
  echo "FAIL ttl: rc $rc"; cat "$DIR/out" "$DIR/err"; fail=1
else
  echo "ok   ttl"
fi

# 6. Kill the first attempt after its first checkpoint; the second attempt must resume.
KW=$(cd "$(dirname "$KT")" && pwd)/kubetrain-worker
cat > "$DIR/flaky-worker" <<SH
#!/bin/sh
# Attempt 0 dies by SIGKILL once a checkpoint exists; later attempts are the real worker.
ckpt=""; prev=""
for a in "\$@"; do [ "\$prev" = "--checkpoint-dir" ] && ckpt=\$a; prev=\$a; done
if [ "\$KUBETRAIN_RESTART_ATTEMPT" = "0" ]; then
  "$KW" "\$@" &
  for i in \$(seq 1 1200); do [ -e "\$ckpt/latest" ] && break; sleep 0.05; done
  echo "flaky worker: killing attempt 0"
  kill -KILL \$\$
fi
exec "$KW" "\$@"
SH
chmod +x "$DIR/flaky-worker"
sed -e 's/steps: 200/steps: 300/' -e 's/intervalSteps: 500/intervalSteps: 50/' examples/jobs/tiny.yaml > "$DIR/flaky.yaml"
"$KT" run "$DIR/flaky.yaml" --workdir "$DIR/flaky" --worker "$DIR/flaky-worker" > "$DIR/out" 2> "$DIR/err"
rc=$?
log="$DIR/flaky/pods/default_tiny-worker-0/log"
if [[ $rc -ne 0 ]]; then
  echo "FAIL restart: rc $rc"; cat "$DIR/out" "$DIR/err"; fail=1
elif ! grep -q 'restarts: 1)' "$DIR/out" || ! grep -q '^phase: Restarting' "$DIR/out"; then
  echo "FAIL restart: no gang restart reported"; cat "$DIR/out"; fail=1
elif ! grep -q 'resumed from step [1-9]' "$log"; then
  echo "FAIL restart: the second attempt did not resume from a checkpoint"; cat "$log"; fail=1
elif [[ $(grep -c '^=== pod default/tiny-worker-0' "$log") -ne 2 ]]; then
  echo "FAIL restart: expected 2 pod starts in $log"; fail=1
else
  echo "ok   restart: $(grep -o 'resumed from step [0-9]*' "$log")"
fi

# expect_like_one_rank NAME EXAMPLE PLAN_LINE REPORT_LINE: `kubetrain run EXAMPLE` succeeds with
# the one-rank run's losses (of 1), its plan line shows PLAN_LINE and its run report REPORT_LINE.
expect_like_one_rank() {
  local name=$1 example=$2 plan_line=$3 report_line=$4 got
  "$KT" run "$example" --workdir "$DIR/$name" > "$DIR/out" 2> "$DIR/err"
  local rc=$?
  got=$(grep '^Succeeded:' "$DIR/out" | sed -E 's/.*(loss [0-9.]+ -> [0-9.]+).*/\1/')
  if [[ $rc -ne 0 || -z $got ]]; then
    echo "FAIL $name: rc $rc"; cat "$DIR/out" "$DIR/err"; fail=1
  elif ! grep -qF "$plan_line" "$DIR/out"; then
    echo "FAIL $name: the plan line does not show '$plan_line'"; head -5 "$DIR/out"; fail=1
  elif [[ $got != "$one_summary" ]]; then
    echo "FAIL $name: $got, $one_summary on one rank"; fail=1
  elif ! grep -qF "$report_line" "$DIR/$name/report.html"; then
    echo "FAIL $name: the run report does not show '$report_line'"; fail=1
  else
    echo "ok   $name: $got as on one rank"
  fi
}
one_summary=$(sed -E 's/.*(loss [0-9.]+ -> [0-9.]+).*/\1/' <<< "$summary")
# 7. Pipeline stages through the same path: the same losses as the one-rank run of 1.
expect_like_one_rank pipeline examples/jobs/tiny-pipeline.yaml 'TP 1 × PP 2 (1F1B)' \
  'TP 1 × PP 2 (1F1B) × DP 1'
# 8. A cutpoint through the same path.
expect_like_one_rank cutpoint examples/jobs/tiny-cutpoint.yaml \
  "TP 2 × DP 1 for layers 1-1 (Oases' cutpoint)" 'TP 1 × DP 2, TP 2 from layer 1 (Oases'
exit $fail

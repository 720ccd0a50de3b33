#!/usr/bin/env bash
# A checkpoint directory a cluster can hand a worker: read-only (training goes on, each save
# reports EROFS, as docs/RELIABILITY.md promises), a `.lock` that cannot be opened (refused:
# without the lock a second writer could use the directory unseen), and FIFOs where `latest`,
# the step log or the plan should be (never opened blocking: the worker ends or goes on at once,
# and SIGTERM is not held up). Needs root for the read-only mount (CI runs as root).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
KT=$1
WORKER=$2
DIR=$(mktemp -d)
RO=$DIR/ro
cleanup() { mountpoint -q "$RO" && umount "$RO"; rm -rf "$DIR"; }
trap cleanup EXIT
fail_context() { tail -20 "$DIR/log" 2>/dev/null; }

cat > "$DIR/job.yaml" <<'YAML'
apiVersion: kubetrain.dev/v1alpha1
kind: TrainingJob
metadata: {name: hostile-ckpt}
spec:
  model: {preset: tiny}
  training: {steps: 6, globalBatchSize: 8}
  checkpoint: {intervalSteps: 2}
YAML
"$KT" plan "$DIR/job.yaml" --cluster examples/clusters/cpu-local.yaml -o json > "$DIR/plan.json" ||
  fail "planning"

# Read-only: every save fails with EROFS and training goes on to its last step; then the run
# says that its final checkpoint could not be written (exit 1, as docs/RELIABILITY.md lists:
# the trained model would be lost). Once the step log in that directory stopped it at once.
mkdir -p "$RO"
mount -t tmpfs -o size=1m tmpfs "$RO" || fail "cannot mount a tmpfs (this test needs root)"
mkdir -p "$RO/ckpt"
mount -o remount,ro "$RO" || fail "cannot remount $RO read-only"
timeout 120 "$WORKER" train --plan "$DIR/plan.json" --checkpoint-dir "$RO/ckpt" > "$DIR/log" 2>&1
rc=$?
grep -q "step      6/6" "$DIR/log" || fail "a read-only checkpoint directory stopped training"
[[ $(grep -c "failed (EROFS" "$DIR/log") -eq 3 ]] || fail "the three saves were not each reported as EROFS"
[[ $rc -eq 1 ]] && grep -q "training finished at step 6, but its final checkpoint could not be written" "$DIR/log" ||
  fail "the lost final checkpoint was not the documented exit 1 (exit $rc)"

# A .lock that cannot be opened (a directory): refused, naming it, before any step.
mkdir -p "$DIR/locked/.lock"
timeout 60 "$WORKER" train --plan "$DIR/plan.json" --checkpoint-dir "$DIR/locked" > "$DIR/log" 2>&1
rc=$?
[[ $rc -ne 0 && $rc -ne 124 ]] || fail "an unopenable .lock was not refused (exit $rc)"
grep -q "cannot lock the checkpoint directory" "$DIR/log" || fail "the refusal does not say why"
grep -q "step 1/" "$DIR/log" && fail "it trained without the lock"

# FIFOs: `latest` (the pointer is skipped as not a regular file), the step log (kept without),
# and the plan (refused): none blocks.
mkdir -p "$DIR/fifo"
mkfifo "$DIR/fifo/latest" "$DIR/fifo/steps.jsonl" "$DIR/plan.fifo"
timeout 60 "$WORKER" train --plan "$DIR/plan.json" --checkpoint-dir "$DIR/fifo" > "$DIR/log" 2>&1
rc=$?
[[ $rc -ne 124 ]] || fail "a FIFO in the checkpoint directory blocked the worker"
grep -q "latest is not a regular file" "$DIR/log" || fail "the FIFO latest was not reported"
timeout 20 "$WORKER" train --plan "$DIR/plan.fifo" > "$DIR/log" 2>&1
rc=$?
[[ $rc -ne 124 ]] || fail "a FIFO as the plan blocked the worker"
grep -q "not a regular file" "$DIR/log" || fail "the FIFO plan was not refused as such"
echo "PASS"

#!/usr/bin/env bash
# The chaos bench (docs/RELIABILITY.md "Chaos"): TRIALS trials of tests/chaos/chaos.py
# (default 50) with seed SEED, then the figures (tests/chaos/summary.py): trials passed, kills per
# kind, median trial time, every failure. Not part of `make bench`: it takes about 30 minutes.
#   bench/chaos.sh [TRIALS] [SEED]
# The binaries and the CRD are copied once, so that a rebuild meanwhile does not mix versions.
# Trials run in chunks of CHUNK (default 5); with KT_CPU_LOCK=/tmp/kt-cpu.lock each chunk holds
# that lock (flock) while it runs. Results: $RESULTS (default build/chaos-results.jsonl), failed
# trials' work dirs under $KEEP (default build/chaos-failed).
set -euo pipefail
TRIALS=${1:-50}
SEED=${2:-1}
CHUNK=${CHUNK:-5}
BUILD=${BUILD:-build}
RESULTS=${RESULTS:-$BUILD/chaos-results.jsonl}
KEEP=${KEEP:-$BUILD/chaos-failed}
LOCK=()
[[ -n "${KT_CPU_LOCK:-}" ]] && LOCK=(flock "$KT_CPU_LOCK")
BIN=$(mktemp -d)
trap 'rm -rf "$BIN"' EXIT
cp "$BUILD"/bin/{kubetrain,kubetrain-operator,kubetrain-worker} "$BIN"/
cp crds/trainingjobs.kubetrain.dev.yaml "$BIN"/crd.yaml
: > "$RESULTS"
for ((first = 0; first < TRIALS; first += CHUNK)); do
  n=$(( TRIALS - first < CHUNK ? TRIALS - first : CHUNK ))
  "${LOCK[@]}" python3 tests/chaos/chaos.py --kubetrain "$BIN/kubetrain" --operator "$BIN/kubetrain-operator" \
    --crd "$BIN/crd.yaml" --baseline-cache "$BIN/baseline.json" --seed "$SEED" --first-trial "$first" \
    --trials "$n" --results "$RESULTS" --keep-failed "$KEEP" || true
done
echo "$(date) on $(nproc) cores, $(. /etc/os-release && echo "$PRETTY_NAME"): bench/chaos.sh $TRIALS $SEED"
python3 tests/chaos/summary.py "$RESULTS"

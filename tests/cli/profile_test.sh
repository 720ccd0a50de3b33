#!/usr/bin/env bash
# Measured hardware profiles end to end: `kubetrain-worker profile --quick` at a plan's shapes
# writes a HardwareProfile with provenance; `kubetrain plan --profile` plans with it and says so;
# the worker then reports MFU against that peak; a profile with a bad field, or of a kind the
# cluster has no node of, is refused naming the file and the field.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
KT=$1
WORKER=$2
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
fail_context() { tail -20 "$DIR/log" 2>/dev/null; }
CLUSTER=examples/clusters/cpu-local.yaml

"$KT" plan examples/jobs/tiny.yaml -c $CLUSTER -o json > "$DIR/plan.json" || fail "planning"
"$WORKER" profile --quick --plan "$DIR/plan.json" -o "$DIR/profile.yaml" 2> "$DIR/log" ||
  fail "profile exited $?"
for key in peakFp32Flops achievedFraction allreduceLatency intraAllreduceBusbw \
           cpuAdamParamsPerCore overlapInterference memoryBandwidth; do
  grep -q "^  $key: [0-9]" "$DIR/profile.yaml" || fail "no $key in $(cat "$DIR/profile.yaml")"
done
grep -q '^kind: HardwareProfile' "$DIR/profile.yaml" || fail "not a HardwareProfile"
# bf16 (docs/HARDWARE.md, "Measured profiles"): measured where the CPU has bf16 matmuls, said to be
# absent elsewhere.
if grep -qE '\b(amx_bf16|avx512_bf16)\b' /proc/cpuinfo; then
  grep -q '^  bf16: true' "$DIR/profile.yaml" ||
    fail "bf16 not measured: $(cat "$DIR/profile.yaml")"
  grep -q '^  bf16GemmFlopsPerSecond: [0-9]' "$DIR/profile.yaml" || fail "no bf16 GEMM rate"
  # (in (0, 1]: the profiler clamps it, and on a busy host the micro-batch can outrun the GEMMs
  # timed before it, which clamps to 1)
  grep -Eq '^  achievedFractionBf16: (0\.[0-9]+|1|1\.0)$' "$DIR/profile.yaml" ||
    fail "no bf16 fraction: $(grep achievedFractionBf16 "$DIR/profile.yaml")"
else
  grep -q '^  bf16: false' "$DIR/profile.yaml" ||
    fail "bf16 said present: $(cat "$DIR/profile.yaml")"
fi
grep -q '^  model: L=2 h=64 B=8 T=64' "$DIR/profile.yaml" || fail "not at the plan's shapes"
grep -q "^  host: " "$DIR/profile.yaml" || fail "no provenance"

"$KT" plan examples/jobs/tiny.yaml -c $CLUSTER --profile "$DIR/profile.yaml" > "$DIR/table" ||
  fail "plan --profile"
grep -q '^  figures      measured on ' "$DIR/table" || fail "the plan does not say: $(cat "$DIR/table")"
"$KT" plan examples/jobs/tiny.yaml -c $CLUSTER --profile "$DIR/profile.yaml" -o json \
  > "$DIR/measured.json" || fail "plan --profile -o json"
peak=$(python3 -c "import json; print(json.load(open('$DIR/measured.json'))['peak']['flopsPerRank'])")
# (The planner chose the precision: the profile's bf16 or fp32 peak, by the prediction.)
want=$(python3 -c "
import json, yaml; p = yaml.safe_load(open('$DIR/profile.yaml'))
bf16 = json.load(open('$DIR/measured.json'))['precision'] == 'bf16'
key = 'peakBf16Flops' if bf16 else 'peakFp32Flops'
print(p['spec'][key] * int(p['provenance']['threads']))")
python3 -c "import sys; sys.exit(0 if abs($peak - $want) <= 1e-6 * $want else 1)" ||
  fail "the plan's peak $peak is not the profile's $want"
# The worker's MFU is against that peak: model FLOPs per second / peak, as it prints them.
"$WORKER" train --plan "$DIR/measured.json" --log-every 1 > "$DIR/log" 2>&1 || fail "train"
python3 - "$DIR/log" "$DIR/measured.json" <<'PY' || fail "MFU is not against the plan's peak"
import json, re, sys
plan = json.load(open(sys.argv[2]))
m = plan["model"]
C, L, T = m["hidden"], m["layers"], m["seqLen"]
flops_per_token = 6 * plan["model"]["parameters"] + 12 * L * C * T
for line in open(sys.argv[1]):
    g = re.search(r"(\d+) tok/s \| MFU ([0-9.]+)%", line)
    if g:
        want = 100 * int(g.group(1)) * flops_per_token / plan["peak"]["flopsPerRank"]
        assert abs(float(g.group(2)) - want) <= 0.1 + 0.01 * want, (line, want)
PY

# The fold-back (`plan --refit`, what autotune does): a run's measured phase times refit the
# figures it was planned with (here the built-in ones: a --quick profile taken on a loaded machine
# can be further off than the 20x a scale may correct); the same plan predicted again has the
# run's median compute.
"$WORKER" train --plan "$DIR/plan.json" --checkpoint-dir "$DIR/run" > "$DIR/log" 2>&1 ||
  fail "train with a checkpoint directory"
"$KT" plan examples/jobs/tiny.yaml -c $CLUSTER --refit "$DIR/run" \
  -o json > "$DIR/refit.json" 2> "$DIR/refit.log" || fail "plan --refit: $(cat "$DIR/refit.log")"
grep -q "^refit cpu from 1 run(s):" "$DIR/refit.log" || fail "refit says: $(cat "$DIR/refit.log")"
grep -q "^  compute ×" "$DIR/refit.log" || fail "no compute scale: $(cat "$DIR/refit.log")"
python3 - "$DIR/run/steps.jsonl" "$DIR/plan.json" "$DIR/refit.json" <<'PY' ||
import json, statistics, sys
records = [json.loads(line) for line in open(sys.argv[1])]
steps = [r for r in records if r["kind"] == "step"]
steps = steps[len(steps) // 4:]
measured = statistics.median(r["phase_seconds"]["compute"] for r in steps)
before, after = json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
keys = ("tp", "dp", "recompute", "offload", "batch")
assert all(before[k] == after[k] for k in keys), "the refit chose another plan"
got = after["predicted"]["breakdownSeconds"]["compute"]
assert abs(got - measured) <= 1e-6 * measured, (got, measured)
PY
  fail "the refit plan's compute is not the run's measured median"
out=$("$KT" plan examples/jobs/tiny.yaml -c $CLUSTER --refit "$DIR/profile.yaml" 2>&1) &&
  fail "a profile was taken as a run"
[[ $out == *"$DIR/profile.yaml:1:"* ]] || fail "unclear --refit error: $out"

# Refusals name the file and the field.
sed 's/^  achievedFraction: .*/  achievedFraction: 3/' "$DIR/profile.yaml" > "$DIR/bad.yaml"
out=$("$KT" plan examples/jobs/tiny.yaml -c $CLUSTER --profile "$DIR/bad.yaml" 2>&1) &&
  fail "a bad profile was accepted"
[[ $out == *"$DIR/bad.yaml: spec.achievedFraction: 3.0 must be above 0 and at most 1.0"* ]] ||
  fail "unclear error: $out"
sed 's/^  name: cpu/  name: H200/' "$DIR/profile.yaml" > "$DIR/gpu.yaml"
out=$("$KT" plan examples/jobs/tiny.yaml -c $CLUSTER --profile "$DIR/gpu.yaml" 2>&1) &&
  fail "a profile of no node's kind was accepted"
[[ $out == *"--profile: no node of $CLUSTER is of the kind of the profile (H200)"* ]] ||
  fail "unclear error: $out"
echo "PASS"

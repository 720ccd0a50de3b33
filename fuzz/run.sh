#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/CMakeLists.txt: clang 14, ASan + UBSan) and runs them:
#   fuzz/run.sh NAME|all [SECONDS]     (default 30 s per harness)
# NAME is a harness, fuzz/NAME_fuzz.cpp. The build directory is $FUZZ_BUILD (default
# build/fuzz); each harness's seeds (fuzz/seeds.py) go to $FUZZ_BUILD/seeds/NAME, what it finds
# new to $FUZZ_BUILD/corpus/NAME (kept between runs), a reproducer of a finding to
# $FUZZ_BUILD/findings/NAME/. Exits 1 on any finding (crash, sanitizer report, leak, timeout,
# out of memory), 77 when clang++-14 is missing; prints executions per harness and in all.
# Harnesses run $JOBS at a time (default 2; libFuzzer keeps one core busy per harness), so each
# gets the same time and core as when they ran one after another.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
NAME=${1:?usage: fuzz/run.sh NAME|all [SECONDS]}
SECONDS_EACH=${2:-30}
BUILD=${FUZZ_BUILD:-build/fuzz}
CXX=${FUZZ_CXX:-clang++-14}
command -v "$CXX" >/dev/null || { echo "fuzz: $CXX not found (scripts/install-deps.sh installs it)" >&2; exit 77; }

if [[ $NAME == all ]]; then
  NAMES=()
  for f in fuzz/*_fuzz.cpp; do n=${f#fuzz/}; NAMES+=("${n%_fuzz.cpp}"); done
else
  [[ -f fuzz/${NAME}_fuzz.cpp ]] || { echo "fuzz: no harness fuzz/${NAME}_fuzz.cpp" >&2; exit 2; }
  NAMES=("$NAME")
fi

if [[ ! -f $BUILD/build.ninja ]]; then
  cmake -S . -B "$BUILD" -G Ninja -DKUBETRAIN_FUZZ=ON -DCMAKE_CXX_COMPILER="$CXX" \
    -DCMAKE_BUILD_TYPE=Fuzz >/dev/null
fi
build_start=$(date +%s)
cmake --build "$BUILD" -j "${JOBS:-2}" --target "${NAMES[@]/%/_fuzz}"
echo "fuzz: built ${#NAMES[@]} harness(es) in $(( $(date +%s) - build_start )) s"
rm -rf "$BUILD/seeds"
python3 fuzz/seeds.py . "$BUILD/seeds"

# One harness: its log, then one summary line in $BUILD/findings/NAME/summary; exit 1 on a finding.
run_one() {
  local n=$1 log start rc=0 seconds execs
  mkdir -p "$BUILD/corpus/$n" "$BUILD/seeds/$n" "$BUILD/findings/$n"
  rm -f "$BUILD/findings/$n/summary"
  log=$BUILD/findings/$n/last-run.log
  start=$(date +%s)
  # -timeout: one input over 10 s is a finding (a hang); -rss_limit_mb: so is over 2 GiB.
  "$BUILD/bin/${n}_fuzz" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$BUILD/findings/$n/" \
    "$BUILD/corpus/$n" "$BUILD/seeds/$n" >"$log" 2>&1 || rc=$?
  seconds=$(( $(date +%s) - start ))
  execs=$(awk '/stat::number_of_executed_units:/ {n = $2} END {print n + 0}' "$log")
  if [[ $rc -ne 0 ]]; then
    printf '%-18s %12d execs %5d s  FINDING (rc %d): %s\n' "$n" "$execs" "$seconds" "$rc" \
      "$(grep -m1 -E 'ERROR: |==ERROR|runtime error|fuzz invariant|Test unit written' "$log" | cut -c1-160)" \
      >"$BUILD/findings/$n/summary"
    { echo "fuzz: $n found something; its log: $log"; tail -40 "$log"; } >&2
    return 1
  fi
  printf '%-18s %12d execs %5d s  ok\n' "$n" "$execs" "$seconds" >"$BUILD/findings/$n/summary"
}

parallel=${JOBS:-2}
running=0
for n in "${NAMES[@]}"; do rm -f "$BUILD/findings/$n/summary"; done
for n in "${NAMES[@]}"; do
  if (( running >= parallel )); then
    wait -n || true
    running=$((running - 1))
  fi
  run_one "$n" &
  running=$((running + 1))
done
wait || true

total=0
failed=()
summary=()
for n in "${NAMES[@]}"; do
  line=$(cat "$BUILD/findings/$n/summary" 2>/dev/null || echo "$n: no result")
  summary+=("$line")
  [[ $line == *" ok" ]] || failed+=("$n")
  total=$(( total + $(awk '{print $2 + 0}' <<<"$line") ))
done
printf '%s\n' "${summary[@]}"
echo "fuzz: $total executions in all, ${#failed[@]} harness(es) with findings${failed:+: ${failed[*]}}"
[[ ${#failed[@]} -eq 0 ]]

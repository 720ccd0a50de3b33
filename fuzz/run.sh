#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/CMakeLists.txt: clang 14, ASan + UBSan) and runs them:
#   fuzz/run.sh NAME|all [SECONDS]     (default 30 s per harness)
# NAME is a harness, fuzz/NAME_fuzz.cpp. The build directory is $FUZZ_BUILD (default
# build/fuzz); each harness's seeds (fuzz/seeds.py) go to $FUZZ_BUILD/seeds/NAME, what it finds
# new to $FUZZ_BUILD/corpus/NAME (kept between runs), a reproducer of a finding to
# $FUZZ_BUILD/findings/NAME/. Exits 1 on any finding (crash, sanitizer report, leak, timeout,
# out of memory), 77 when clang++-14 is missing; prints executions per harness and in all.
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

total=0
failed=()
summary=()
for n in "${NAMES[@]}"; do
  mkdir -p "$BUILD/corpus/$n" "$BUILD/seeds/$n" "$BUILD/findings/$n"
  log=$BUILD/findings/$n/last-run.log
  start=$(date +%s)
  rc=0
  # -timeout: one input over 10 s is a finding (a hang); -rss_limit_mb: so is over 2 GiB.
  "$BUILD/bin/${n}_fuzz" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$BUILD/findings/$n/" \
    "$BUILD/corpus/$n" "$BUILD/seeds/$n" >"$log" 2>&1 || rc=$?
  seconds=$(( $(date +%s) - start ))
  execs=$(awk '/stat::number_of_executed_units:/ {n = $2} END {print n + 0}' "$log")
  total=$(( total + execs ))
  if [[ $rc -ne 0 ]]; then
    failed+=("$n")
    summary+=("$(printf '%-18s %12d execs %5d s  FINDING (rc %d): %s' "$n" "$execs" "$seconds" "$rc" \
      "$(grep -m1 -E 'ERROR: |==ERROR|runtime error|fuzz invariant|Test unit written' "$log" | cut -c1-160)")")
    echo "fuzz: $n found something; its log: $log" >&2
    tail -40 "$log" >&2
  else
    summary+=("$(printf '%-18s %12d execs %5d s  ok' "$n" "$execs" "$seconds")")
  fi
done
printf '%s\n' "${summary[@]}"
echo "fuzz: $total executions in all, ${#failed[@]} harness(es) with findings${failed:+: ${failed[*]}}"
[[ ${#failed[@]} -eq 0 ]]

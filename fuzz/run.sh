#!/usr/bin/env bash
# Builds one libFuzzer harness with clang 14 (ASan + UBSan) and runs it for a while:
#   fuzz/run.sh kube_protobuf|yaml [SECONDS]    (default 30 s; corpus under build/fuzz/<name>)
# Exits non-zero on a finding (crash, leak, timeout); the reproducer is in build/fuzz/<name>.
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=${1:?usage: fuzz/run.sh kube_protobuf|yaml [SECONDS]}
SECONDS_TO_RUN=${2:-30}
OUT=build/fuzz/$NAME
mkdir -p "$OUT/corpus"
FLAGS=(-std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I.)
case $NAME in
  kube_protobuf) SOURCES=(fuzz/kube_protobuf_fuzz.cpp operator/local/protobuf.cpp); LIBS=()
    # Seeds: a Secret and a Namespace as client-go encodes them (core/v1 field numbers).
    python3 - "$OUT/corpus" <<'PY'
import sys
def v(n):
    out = b""
    while n >= 0x80: out += bytes([(n & 0x7f) | 0x80]); n >>= 7
    return out + bytes([n])
def f(num, data): return v(num << 3 | 2) + v(len(data)) + data
def env(kind, raw): return b"k8s\0" + f(1, f(1, b"v1") + f(2, kind)) + f(2, raw)
meta = f(1, b"sh.helm.release.v1.kt.v1") + f(3, b"ns") + f(11, f(1, b"owner") + f(2, b"helm"))
open(sys.argv[1] + "/secret", "wb").write(env(b"Secret", f(1, meta) + f(2, f(1, b"release") + f(2, b"\x00\xff")) + f(3, b"Opaque")))
open(sys.argv[1] + "/namespace", "wb").write(env(b"Namespace", f(1, f(1, b"team-a")) + f(2, f(1, b"kubernetes"))))
open(sys.argv[1] + "/configmap", "wb").write(env(b"ConfigMap", f(1, meta) + f(2, f(1, b"k") + f(2, b"v"))))
PY
    ;;
  yaml) SOURCES=(fuzz/yaml_fuzz.cpp api/yaml_json.cpp); LIBS=(-lyaml-cpp)
        cp examples/jobs/*.yaml examples/clusters/*.yaml "$OUT/corpus/" ;;
  *) echo "unknown harness $NAME" >&2; exit 2 ;;
esac
clang++-14 "${FLAGS[@]}" "${SOURCES[@]}" "${LIBS[@]}" -o "$OUT/fuzzer"
cd "$OUT"
./fuzzer -max_total_time="$SECONDS_TO_RUN" -max_len=65536 -timeout=10 -print_final_stats=1 corpus

#!/usr/bin/env bash
# CPU emulation check of the flash-attention kernels (kernels/cuda/flash_attention.cu) for a
# machine without a GPU: the kernels' device code, compiled by g++ with ldmatrix, mma.sync,
# cp.async and warp shuffles emulated (one OS thread per CUDA thread), against the float64
# reference at small shapes. It checks indexing and fragment layouts; it says nothing about
# speed, async-copy races or the real compiler. Usage: scripts/flash_sim/run.sh [quick|all]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 "$here/extract.py" "$work/flash_sim_kernels.h"
g++ -std=c++20 -O1 -pthread -I"$here" -I"$work" -I"$here/../.." "$here/main.cpp" -o "$work/sim"
"$work/sim" "${1:-all}"

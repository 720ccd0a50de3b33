#!/usr/bin/env bash
# The first thing to run on a GPU machine (docs/ARCHITECTURE.md §9): builds the CUDA kernels, the
# CUDA device, gpu_tests and bench_gpu as a GPU-only CMake project (KUBETRAIN_GPU_ONLY: needs the
# CUDA toolkit, CMake and g++, none of the Debian -dev packages), runs every GPU test (gpu_tests:
# the kernels against the float64 CPU reference, the CUDA model on one rank and on several), then
# prints one table of kernel times against measured ceilings (cuBLASLt bf16 GEMM, D2D and pinned
# H2D/D2H copies: bench_gpu --kernels), then GPT-2 124M bf16 training tokens/s and MFU on the
# CUDA model the worker runs (worker/cuda_gpt), with and without offload: optimizer
# (bench_gpu --gpt).
#
#   scripts/device-check.sh                 build, test, bench (≈ 1–2 min on an H200)
#   scripts/device-check.sh --build-only    build only (works without a GPU: CI and dev machines)
#   scripts/device-check.sh --bundle-worker (here, after `make`) packs build/bin/kubetrain-worker,
#       and build/bin/kubetrain, their non-system shared libraries (not the CUDA ones: the GPU machine's toolkit has those)
#       and two GPT-2 124M plans for one H200 (offload none and optimizer) into gpu-worker/
#       (git-ignored; ≈ 11 MB xz, stripped). Carry ["gpu-worker"] and the check then also runs the real
#       `kubetrain-worker train` on both plans (12 steps each, checkpoint at the end) and prints
#       its step time, tokens/s and MFU next to the planner's prediction; and one small job on
#       the CPU, on the GPU, with offload: optimizer and window, and as 2 data-parallel and as 2
#       tensor-parallel ranks sharing the GPU (`kubetrain-worker launch`), comparing their losses;
#       `kubetrain-worker profile --device cuda` (the node's measured profile, into $OUT); and the
#       plan-fidelity table on the GPU (bench/fidelity.py --gpu, with the bundled `kubetrain`).
#
# Environment: OUT (a folder: the full log goes to $OUT/device-check.log, else build-gpu/),
# CUDA_ARCHS (default 90: H100/H200), JOBS (build parallelism; default nproc, 2 with --build-only),
# KUBETRAIN_NCCL_LIBRARY (libnccl.so.2's path when the loader does not find it; the script looks
# in the toolkit and the nvidia-nccl Python wheel).
# Fallback: if the build fails there but gpu_tests and bench_gpu built elsewhere were carried in
# gpu-prebuilt/ (git-ignored: `scripts/device-check.sh --build-only && mkdir -p gpu-prebuilt &&
# cp build-gpu/bin/gpu_tests build-gpu/bin/bench_gpu gpu-prebuilt/`, then carry
# ["gpu-prebuilt"]), those run; they need only libcudart.so.13 and libcublasLt.so.13 from the
# machine's toolkit. Do not carry build-gpu
# itself: its CMake cache names this machine's paths.
# Exit status: 0 when everything built and every GPU check passed; 2 when no GPU was usable.
set -uo pipefail
cd "$(dirname "$0")/.."

build_only=0
[[ "${1:-}" == "--build-only" ]] && build_only=1
if [[ "${1:-}" == "--bundle-worker" ]]; then
  full=${KT_FULL_BUILD:-build}
  worker="$full/bin/kubetrain-worker"
  [[ -x "$worker" && -x "$full/bin/kubetrain" ]] || { echo "device-check: build $worker first (make)" >&2; exit 1; }
  stage=$(mktemp -d)
  mkdir -p "$stage/lib" gpu-worker
  cp "$worker" "$full/bin/kubetrain" "$stage/"
  strip --strip-debug "$stage/kubetrain-worker" "$stage/kubetrain"  # the carry limit is 64 MiB
  # Everything they link but the C/C++ runtime and CUDA (the GPU machine's own are used); the
  # planner binary plans there with the profile measured there (bench/fidelity.py --gpu).
  ldd "$worker" "$full/bin/kubetrain" | awk '/=>/ {print $3}' | sort -u |
    grep -Ev 'libc\.so|libm\.so|libstdc\+\+|libgcc_s|libpthread|libdl\.so|librt\.so|ld-linux|libcuda|libcublas|libcudart' |
    xargs -r -I{} cp -L {} "$stage/lib/"
  for offload in none optimizer; do
    cat >"$stage/job-$offload.yaml" <<EOF
apiVersion: kubetrain.dev/v1alpha1
kind: TrainingJob
metadata: {name: gpt2-124m-$offload}
spec:
  model: {preset: gpt2-124m}
  training: {steps: 12, globalBatchSize: 512, learningRate: 6.0e-4, warmupSteps: 4}
  data: {source: synthetic}
  checkpoint: {intervalSteps: 12}
  parallelism: {offload: $offload}
EOF
    "$full/bin/kubetrain" plan "$stage/job-$offload.yaml" -c examples/clusters/h200-single.yaml \
      -o json >"$stage/plan-$offload.json" || exit 1
  done
  # One small model three ways, for the CPU-vs-GPU comparison: the CPU plan (fp32), the CUDA
  # plan (bf16, head size 64: the flash attention) and the CUDA plan with offload: optimizer.
  for variant in cpu cuda cuda-offload cuda-window; do
    cluster=h200-single parallelism=""
    [[ $variant == cpu ]] && cluster=cpu-local
    [[ $variant == cuda-offload ]] && parallelism="  parallelism: {offload: optimizer, gpuUpdateFraction: 0.5}"
    [[ $variant == cuda-window ]] && parallelism="  parallelism: {offload: window, offloadWindow: 1, recompute: full, gpuUpdateFraction: 0.1}"
    cat >"$stage/job-small-$variant.yaml" <<EOF
apiVersion: kubetrain.dev/v1alpha1
kind: TrainingJob
metadata: {name: small-$variant}
spec:
  model: {layers: 2, hidden: 128, heads: 2, vocab: 512, seqLen: 128}
  training: {steps: 30, globalBatchSize: 16, learningRate: 0.003, warmupSteps: 5, seed: 11}
  data: {source: synthetic}
  resources: {gpusPerNode: 1}
$parallelism
EOF
    "$full/bin/kubetrain" plan "$stage/job-small-$variant.yaml" -c "examples/clusters/$cluster.yaml" \
      -o json >"$stage/plan-small-$variant.json" || exit 1
  done
  # Data and tensor parallelism on CUDA: the small CUDA job as 2 DP ranks and as 2 TP ranks (plans
  # for a 2-GPU node). On the one-GPU device machine both ranks share the GPU, so their
  # collectives go through the host (NCCL needs a GPU per rank); the check runs them through
  # `kubetrain-worker launch`.
  cat >"$stage/h200x2.yaml" <<EOF
apiVersion: kubetrain.dev/v1alpha1
kind: Inventory
metadata: {name: h200x2}
nodes:
  - {name: h200, gpu: {product: NVIDIA-H200, count: 2}, cpu: {cores: 16}, memory: 128Gi}
EOF
  sed -e 's/name: small-cuda}$/name: small-cuda-dp2}/' -e 's/gpusPerNode: 1/gpusPerNode: 2/' \
    "$stage/job-small-cuda.yaml" >"$stage/job-small-cuda-dp2.yaml"
  echo "  parallelism: {tensorParallel: 1, dataParallel: 2}" >>"$stage/job-small-cuda-dp2.yaml"
  "$full/bin/kubetrain" plan "$stage/job-small-cuda-dp2.yaml" -c "$stage/h200x2.yaml" \
    -o json >"$stage/plan-small-cuda-dp2.json" || exit 1
  sed -e 's/name: small-cuda}$/name: small-cuda-tp2}/' -e 's/gpusPerNode: 1/gpusPerNode: 2/' \
    "$stage/job-small-cuda.yaml" >"$stage/job-small-cuda-tp2.yaml"
  echo "  parallelism: {tensorParallel: 2, dataParallel: 1, overlap: on}" >>"$stage/job-small-cuda-tp2.yaml"
  "$full/bin/kubetrain" plan "$stage/job-small-cuda-tp2.yaml" -c "$stage/h200x2.yaml" \
    -o json >"$stage/plan-small-cuda-tp2.json" || exit 1
  tar -C "$stage" -cf - . | xz -T0 -6 >gpu-worker/worker.tar.xz
  rm -rf "$stage"
  echo "device-check: gpu-worker/worker.tar.xz ($(du -h gpu-worker/worker.tar.xz | cut -f1)); carry [\"gpu-worker\"]"
  exit 0
fi
build_dir=${KT_GPU_BUILD:-build-gpu}
log_dir=${OUT:-$build_dir}
mkdir -p "$log_dir"
log="$log_dir/device-check.log"
exec > >(tee "$log") 2>&1

archs=${CUDA_ARCHS:-90}
if ((build_only)); then jobs=${JOBS:-2}; else jobs=${JOBS:-$(nproc)}; fi
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
if [[ -f "$build_dir/CMakeCache.txt" ]] && ! grep -q "KUBETRAIN_GPU_ONLY:BOOL=ON" "$build_dir/CMakeCache.txt"; then
  echo "device-check: $build_dir is not a GPU-only build; set KT_GPU_BUILD to another folder" >&2
  exit 1
fi

# libnccl for the NCCL reducer (loaded at run time): the loader's path, else the toolkit's, else
# the nvidia-nccl Python wheel's; its headers let the GPU-only build compile the NCCL group.
nccl_args=()
if [[ -z "${KUBETRAIN_NCCL_LIBRARY:-}" ]] && ! ldconfig -p 2>/dev/null | grep 'libnccl\.so\.2' >/dev/null; then
  wheel=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
  for candidate in /usr/local/cuda/lib64/libnccl.so.2 /usr/local/cuda/lib/libnccl.so.2 $wheel; do
    [[ -f $candidate ]] && { export KUBETRAIN_NCCL_LIBRARY=$candidate; break; }
  done
fi
if [[ -n "${KUBETRAIN_NCCL_LIBRARY:-}" && -f "$(dirname "$KUBETRAIN_NCCL_LIBRARY")/../include/nccl.h" ]]; then
  nccl_args=(-DNCCL_INCLUDE_DIR="$(cd "$(dirname "$KUBETRAIN_NCCL_LIBRARY")/../include" && pwd)")
fi

echo "== device-check $(date -u +%FT%TZ) on $(hostname); archs $archs; jobs $jobs"
echo "NCCL: ${KUBETRAIN_NCCL_LIBRARY:-libnccl.so.2 from the loader path} ${nccl_args[*]:-}"
command -v nvcc >/dev/null 2>&1 && nvcc --version | tail -2
start=$SECONDS
built=1
if ! cmake -S . -B "$build_dir" "${generator[@]}" "${nccl_args[@]}" -DKUBETRAIN_GPU_ONLY=ON -DKUBETRAIN_WERROR=ON \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$archs" >"$log_dir/configure.log" 2>&1; then
  built=0
  echo "device-check: configure FAILED:"; tail -30 "$log_dir/configure.log"
elif ! cmake --build "$build_dir" -j "$jobs"; then
  built=0
  echo "device-check: build FAILED"
fi
echo "== build: $([[ $built == 1 ]] && echo ok || echo FAILED) in $((SECONDS - start)) s"
tests="$build_dir/bin/gpu_tests"
bench="$build_dir/bin/bench_gpu"
if ((!built)) && [[ -x gpu-prebuilt/gpu_tests ]]; then
  tests=gpu-prebuilt/gpu_tests bench=gpu-prebuilt/bench_gpu
fi
if ((build_only)); then
  ((built)) || exit 1
  echo "device-check: built $tests and $bench (not run: --build-only)"
  exit 0
fi
if [[ ! -x "$tests" ]]; then
  echo "device-check: no $tests to run"; exit 1
fi
((built)) || echo "device-check: build failed; running the carried $tests and $bench"

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,temperature.gpu \
  --format=csv 2>&1 || true

echo "== GPU tests: kernels, the CUDA model, parallelism (fresh random inputs vs the float64 reference)"
timeout 300 "$tests"
test_rc=$?
bench_rc=skipped
if ((test_rc != 2)) && [[ ! -x "$bench" ]]; then
  echo "device-check: no $bench to run"
  bench_rc=missing
elif ((test_rc != 2)); then
  echo "== timings"
  timeout 240 "$bench" --kernels
  bench_rc=$?
  echo "== GPT-2 124M training step (bf16, the worker's CUDA model)"
  timeout 180 "$bench" --gpt
  gpt_rc=$?
  ((bench_rc == 0)) && bench_rc=$gpt_rc
fi
worker_rc=skipped
if ((test_rc != 2)) && [[ -f gpu-worker/worker.tar.xz ]]; then
  echo "== kubetrain-worker train on the GPU (GPT-2 124M plans for one H200, 12 steps each)"
  wdir="$build_dir/worker-bundle"
  rm -rf "$wdir" && mkdir -p "$wdir" && tar -C "$wdir" -xJf gpu-worker/worker.tar.xz
  worker_rc=0
  summary=()
  for offload in none optimizer; do
    plan="$wdir/plan-$offload.json"
    ckpt="$wdir/ckpt-$offload"
    LD_LIBRARY_PATH="$wdir/lib:${LD_LIBRARY_PATH:-}" timeout 150 "$wdir/kubetrain-worker" train \
      --plan "$plan" --checkpoint-dir "$ckpt" --log-every 1 >"$wdir/train-$offload.log" 2>&1
    rc=$?
    grep -E "training on|step +(1|6|12)/|checkpoint|error|cannot" "$wdir/train-$offload.log"
    ((rc == 0)) || { worker_rc=$rc; echo "kubetrain-worker ($offload) FAILED (exit $rc)"; tail -5 "$wdir/train-$offload.log"; }
    [[ -n "${OUT:-}" ]] && cp "$wdir/train-$offload.log" "$OUT/"
    # Median of steps 3..12 (format: "step N/M | loss … | 123.4 ms | 456 tok/s | MFU 12.3%").
    stats=$(python3 - "$wdir/train-$offload.log" <<'PY'
import re, statistics, sys
rows = []
for line in open(sys.argv[1]):
    m = re.search(r"step +(\d+)/\d+ .*\| ([\d.]+) ms \| (\d+) tok/s \| MFU ([\d.]+)%", line)
    if m and int(m.group(1)) >= 3:
        rows.append([float(g) for g in m.groups()[1:]])
if rows:
    ms, tok, mfu = (statistics.median(c) for c in zip(*rows))
    print("%.1f ms/step, %.0f tokens/s, MFU %.1f%%" % (ms, tok, mfu))
else:
    print("n/a")
PY
)
    predicted=$(python3 -c "import json,sys; p=json.load(open('$plan')); q=p['predicted']; print('%.1f ms/step, %.0f tokens/s' % (q['stepSeconds']*1e3, q['tokensPerSecond']))" 2>/dev/null || echo "n/a")
    summary+=("$(printf '%-10s measured %s; planner predicted %s' "$offload" "$stats" "$predicted")")
  done
  echo "kubetrain-worker, GPT-2 124M on one H200 (median of steps 3–12; gradient accumulation as planned):"
  printf '  %s\n' "${summary[@]}"
  # The measured profile of this GPU node (worker/cuda_profile.cpp), for the fidelity table:
  # plan the bundled jobs with it (`kubetrain plan --profile gpu-profile.yaml`) and compare.
  echo "== kubetrain-worker profile --device cuda (GPT-2 124M shapes, B 4, T 64)"
  LD_LIBRARY_PATH="$wdir/lib:${LD_LIBRARY_PATH:-}" timeout 120 "$wdir/kubetrain-worker" profile \
    --device cuda -o "$wdir/gpu-profile.yaml" 2>"$wdir/profile.log" ||
    { worker_rc=1; echo "kubetrain-worker profile FAILED"; }
  grep "^profile:" "$wdir/profile.log"
  [[ -n "${OUT:-}" ]] && cp "$wdir/gpu-profile.yaml" "$wdir/profile.log" "$OUT/" 2>/dev/null
  # The plan-fidelity table on the GPU (bench/fidelity.py --gpu: GPT-2 124M, the one-GPU plans,
  # predicted with the built-in and the measured profile, then measured).
  if [[ -x "$wdir/kubetrain" ]]; then
    echo "== plan fidelity on the GPU (bench/fidelity.py --gpu, GPT-2 124M)"
    LD_LIBRARY_PATH="$wdir/lib:${LD_LIBRARY_PATH:-}" timeout 420 python3 bench/fidelity.py --gpu \
      --kubetrain "$wdir/kubetrain" --worker "$wdir/kubetrain-worker" --steps 10 --warmup 3 \
      --rounds 2 --keep "${OUT:-$wdir}/fidelity" 2>&1 | tail -20 ||
      echo "plan fidelity FAILED"
  fi
  # The same small job on the CPU (fp32) and on the GPU (bf16, and with offload: optimizer):
  # the same seed, weights and data, so the losses must agree within bf16's error.
  echo "== the same job on the CPU and on the GPU (L2 C128 hs64, 30 steps, seed 11)"
  for variant in cpu cuda cuda-offload cuda-window; do
    LD_LIBRARY_PATH="$wdir/lib:${LD_LIBRARY_PATH:-}" OMP_NUM_THREADS=8 timeout 120 \
      "$wdir/kubetrain-worker" train --plan "$wdir/plan-small-$variant.json" --log-every 1 \
      >"$wdir/small-$variant.log" 2>&1 || { worker_rc=1; echo "small $variant FAILED"; tail -3 "$wdir/small-$variant.log"; }
    [[ -n "${OUT:-}" ]] && cp "$wdir/small-$variant.log" "$OUT/"
  done
  echo "== data and tensor parallelism on CUDA: the small CUDA job as 2 DP ranks, then 2 TP ranks, sharing the GPU (host collectives)"
  port=29517
  for variant in dp2 tp2; do
    LD_LIBRARY_PATH="$wdir/lib:${LD_LIBRARY_PATH:-}" OMP_NUM_THREADS=4 MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$port timeout 180 "$wdir/kubetrain-worker" launch \
      --plan "$wdir/plan-small-cuda-$variant.json" >"$wdir/small-cuda-$variant.log" 2>&1 ||
      { worker_rc=1; echo "small cuda-$variant FAILED"; tail -5 "$wdir/small-cuda-$variant.log"; }
    grep -E "through the host|NCCL on|step +(1|30)/" "$wdir/small-cuda-$variant.log"
    [[ -n "${OUT:-}" ]] && cp "$wdir/small-cuda-$variant.log" "$OUT/"
    port=$((port + 1))
  done
  python3 - "$wdir" <<'PY' || worker_rc=1
import re, sys
def losses(name):
    out = {}
    for line in open(f"{sys.argv[1]}/small-{name}.log"):
        m = re.search(r"step +(\d+)/\d+ \| loss ([\d.]+)", line)
        if m: out[int(m.group(1))] = float(m.group(2))
    return out
cpu, gpu, off = losses("cpu"), losses("cuda"), losses("cuda-offload")
steps = sorted(cpu)
ok = steps and sorted(gpu) == steps and sorted(off) == steps
worst_gpu = max((abs(gpu[s] - cpu[s]) / cpu[s] for s in steps), default=float("nan")) if ok else float("nan")
worst_off = max((abs(off[s] - gpu[s]) / gpu[s] for s in steps), default=float("nan")) if ok else float("nan")
for s in [s for s in steps if s in (1, 10, 20, 30)]:
    print(f"  step {s:3d}: loss cpu fp32 {cpu[s]:.4f} | cuda bf16 {gpu[s]:.4f} | cuda bf16 offload optimizer {off[s]:.4f}")
dp2 = losses("cuda-dp2")  # 2 ranks, each on half of every batch (its own data shard)
ok_dp = ok and sorted(dp2) == steps
worst_dp = max((abs(dp2[s] - gpu[s]) / gpu[s] for s in steps), default=float("nan")) if ok_dp else float("nan")
for s in [s for s in steps if s in (1, 10, 20, 30) and s in dp2]:
    print(f"  step {s:3d}: loss cuda bf16 1 rank {gpu[s]:.4f} | 2 DP ranks {dp2[s]:.4f}")
win = losses("cuda-window")  # both layers streamed through one slot, recompute full
ok_win = ok and sorted(win) == steps
worst_win = max((abs(win[s] - gpu[s]) / gpu[s] for s in steps), default=float("nan")) if ok_win else float("nan")
tp2 = losses("cuda-tp2")  # 2 TP ranks on the same batches as 1 rank
ok_tp = ok and sorted(tp2) == steps
worst_tp = max((abs(tp2[s] - gpu[s]) / gpu[s] for s in steps), default=float("nan")) if ok_tp else float("nan")
for s in [s for s in steps if s in (1, 10, 20, 30) and s in tp2]:
    print(f"  step {s:3d}: loss cuda bf16 1 rank {gpu[s]:.4f} | 2 TP ranks {tp2[s]:.4f}")
passed = ok and worst_gpu < 2e-2 and worst_off < 2e-2 and cpu[steps[-1]] < cpu[steps[0]] - 0.5
passed_dp = ok_dp and worst_dp < 2e-2 and ok_tp and worst_tp < 2e-2 and ok_win and worst_win < 2e-2
print(f"  worst relative loss difference: GPU vs CPU {worst_gpu:.2e} (tol 2e-2), offload vs not {worst_off:.2e} (tol 2e-2): {'PASS' if passed else 'FAIL'}")
print(f"  2 DP ranks vs 1 rank (same global batch, each rank its data shard): {worst_dp:.2e}; 2 TP ranks vs 1 rank: {worst_tp:.2e}; window offload vs not: {worst_win:.2e} (tol 2e-2 each): {'PASS' if passed_dp else 'FAIL'}")
passed = passed and passed_dp
sys.exit(0 if passed else 1)
PY
fi
case $test_rc in
  0) verdict=PASSED ;;
  2) verdict="NOT RUN (no usable GPU)" ;;
  *) verdict="FAILED (exit $test_rc)" ;;
esac
echo "== device-check: GPU tests $verdict; bench exit $bench_rc; worker $worker_rc; $((SECONDS - start)) s; log $log"
if ((test_rc != 0)); then exit "$test_rc"; fi
[[ $bench_rc == 0 && ($worker_rc == 0 || $worker_rc == skipped) ]]

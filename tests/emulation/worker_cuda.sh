#!/usr/bin/env bash
# kubetrain-worker's CUDA training loop (worker/trainer.cpp) under emulation
# (tests/emulation/README.md): planned `device: cuda` jobs trained by kubetrain-worker-emulated,
# each checked against the CPU worker (fp32) on the same job. The runs cover one rank, offload
# optimizer, window offload with recompute (each resumed from a checkpoint, continuing the same
# losses), gradient accumulation (alone, with the window, with DP), and 2 DP ranks (also with
# the distributed optimizer, also with offload optimizer or the window), 2 TP ranks, 2 pipeline
# stages (also with offload optimizer or the offload window, and 2 × 2 virtual stages, also with
# either) and a cutpoint (also with either; each resumed) through `kubetrain-worker launch`. The
# ranks share one emulated GPU, so they use the host collectives.
# Usage: worker_cuda.sh KUBETRAIN KUBETRAIN_WORKER KUBETRAIN_WORKER_EMULATED [EMULATED_LIBNCCL]
set -u
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
KT=$1
CPU_WORKER=$2
WORKER=$3
export KUBETRAIN_NCCL_LIBRARY=${4:-}
export OMP_NUM_THREADS=2
DIR=$(mktemp -d)
trap '[[ -n ${KEEP:-} ]] || rm -rf "$DIR"' EXIT

cat > "$DIR/h200x2.yaml" <<'YAML'
apiVersion: kubetrain.dev/v1alpha1
kind: Inventory
metadata: {name: h200x2}
nodes:
  - {name: h200, gpu: {product: NVIDIA-H200, count: 2}, cpu: {cores: 16}, memory: 128Gi}
YAML
# job NAME STEPS GPUS [PARALLELISM [MICRO-BATCH]]: a small GPT (head size 64: the flash-attention
# path), seed 11, 8 sequences per step.
job() {
  cat > "$DIR/$1.yaml" <<YAML
apiVersion: kubetrain.dev/v1alpha1
kind: TrainingJob
metadata: {name: small}
spec:
  model: {layers: 2, hidden: 128, heads: 2, vocab: 512, seqLen: 64}
  training: {steps: $2, globalBatchSize: 8, learningRate: 0.003, warmupSteps: 2, seed: 11${5:+, microBatchSize: $5}}
  data: {source: synthetic}
  resources: {gpusPerNode: $3}
  checkpoint: {intervalSteps: 3}
${4:+  parallelism: $4}
YAML
}
roll_back() {  # roll_back CHECKPOINT-DIR: to its step-3 checkpoint
  rm -rf "$1/step-00000006"
  echo step-00000003 > "$1/latest"
}
plan() {  # plan NAME CLUSTER-FILE
  "$KT" plan "$DIR/$1.yaml" --cluster "$2" -o json > "$DIR/$1.json" || fail "planning $1"
}
h200=examples/clusters/h200-single.yaml

job cpu 6 1
plan cpu examples/clusters/cpu-local.yaml
"$CPU_WORKER" train --plan "$DIR/cpu.json" --log-every 1 > "$DIR/cpu.log" 2>&1 ||
  fail "CPU worker: $(tail -3 "$DIR/cpu.log")"
job cuda 6 1
plan cuda $h200
grep -q '"device": *"cuda"' "$DIR/cuda.json" || fail "the H200 plan is not a CUDA plan"
job offload 6 1 "{offload: optimizer, gpuUpdateFraction: 0.5}"
plan offload $h200
job window 6 1 "{offload: window, offloadWindow: 1, recompute: full, gpuUpdateFraction: 0.1}"
plan window $h200
# Gradient accumulation: 4 micro-batches of 2 (the window's layer gradients summed in host memory).
job accum 6 1 "" 2
plan accum $h200
job window-accum 6 1 "{offload: window, offloadWindow: 1, recompute: full, gpuUpdateFraction: 0.1}" 2
plan window-accum $h200
# The same accumulation of a 4-layer model (the virtual stages' reference below).
job accum4 6 1 "" 2
sed -i 's/layers: 2,/layers: 4,/' "$DIR/accum4.yaml"
plan accum4 $h200
for run in cuda offload window accum window-accum accum4; do
  "$WORKER" train --plan "$DIR/$run.json" --checkpoint-dir "$DIR/ckpt-$run" --log-every 1 \
    > "$DIR/$run.log" 2>&1 ||
    fail "$run: $(tail -3 "$DIR/$run.log")"
done
grep -q "training on cuda:0 (emulated on the host), bf16" "$DIR/cuda.log" ||
  fail "not the CUDA loop: $(head -3 "$DIR/cuda.log")"
grep -q "AdamW of 1 of 3 offload units on the GPU\|AdamW of 2 of 3" "$DIR/offload.log" ||
  fail "offload optimizer did not split the AdamW: $(head -3 "$DIR/offload.log")"
# Each run checkpointed after steps 3 and 6: rolled back to step 3, it resumes from there.
for run in cuda offload window; do
  [[ -d $DIR/ckpt-$run/step-00000003 && -d $DIR/ckpt-$run/step-00000006 ]] ||
    fail "$run: no checkpoints of steps 3 and 6: $(ls "$DIR/ckpt-$run")"
  roll_back "$DIR/ckpt-$run"
  "$WORKER" train --plan "$DIR/$run.json" --checkpoint-dir "$DIR/ckpt-$run" --log-every 1 \
    > "$DIR/$run-resumed.log" 2>&1 || fail "$run resume: $(tail -3 "$DIR/$run-resumed.log")"
  grep -q "resumed from step 3" "$DIR/$run-resumed.log" ||
    fail "$run did not resume: $(head -3 "$DIR/$run-resumed.log")"
done
# 2 DP ranks (each its shard of the same global batch), 2 TP ranks with the Oases overlap.
job dp2 6 2 "{tensorParallel: 1, dataParallel: 2}"
plan dp2 "$DIR/h200x2.yaml"
job tp2 6 2 "{tensorParallel: 2, dataParallel: 1, overlap: on}"
plan tp2 "$DIR/h200x2.yaml"
job dp2-accum 6 2 "{tensorParallel: 1, dataParallel: 2}" 2
plan dp2-accum "$DIR/h200x2.yaml"
# The distributed optimizer over the 2 DP ranks: the same losses as dp2; its checkpoint (the
# shards gathered) rolled back to step 3 resumes to the same losses (the shards cut again).
job dp2-zero 6 2 "{tensorParallel: 1, dataParallel: 2, distributedOptimizer: on}"
plan dp2-zero "$DIR/h200x2.yaml"
grep -q '"distributedOptimizer": *true' "$DIR/dp2-zero.json" || fail "dp2-zero: not sharded"
# ... with offload optimizer: each rank's CPU updates its shard of the layers (resumed too).
job dp2-zero-offload 6 2 "{tensorParallel: 1, dataParallel: 2, distributedOptimizer: on, offload: optimizer, gpuUpdateFraction: 0.5}"
plan dp2-zero-offload "$DIR/h200x2.yaml"
grep -q '"offload": *"optimizer"' "$DIR/dp2-zero-offload.json" || fail "dp2-zero-offload: no offload"
# ... with the offload window (every layer streamed; each rank keeps a streamed layer's whole bf16
# copy and gradient accumulator, updates its shard on the CPU and all-gathers it), 2 micro-batches
# a step (resumed too).
job dp2-zero-window 6 2 "{tensorParallel: 1, dataParallel: 2, distributedOptimizer: on, offload: window, offloadWindow: 1, recompute: full, gpuUpdateFraction: 0.1}" 2
plan dp2-zero-window "$DIR/h200x2.yaml"
grep -q '"offload": *"window"' "$DIR/dp2-zero-window.json" && grep -q '"distributedOptimizer": *true' "$DIR/dp2-zero-window.json" ||
  fail "dp2-zero-window: not planned sharded with the window"
launch_ranks() {  # launch_ranks RUN [LOG]: the plan's 2 ranks
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$(free_port) timeout 300 "$WORKER" launch \
    --plan "$DIR/$1.json" --checkpoint-dir "$DIR/ckpt-$1" > "$DIR/${2:-$1}.log" 2>&1 ||
    fail "${2:-$1}: $(tail -5 "$DIR/${2:-$1}.log")"
}
resume_ranks() {  # resume_ranks RUN: rolled back to step 3 and launched again (RUN-resumed)
  roll_back "$DIR/ckpt-$1"
  launch_ranks "$1" "$1-resumed"
  grep -q "resumed from step 3" "$DIR/$1-resumed.log" ||
    fail "$1 did not resume: $(head -5 "$DIR/$1-resumed.log")"
}
# 2 pipeline stages (one layer each, 1F1B over 4 micro-batches of 2): the one-rank run's losses;
# its checkpoint (each stage's shard) rolled back to step 3 resumes to the same losses.
job pp2 6 2 "{tensorParallel: 1, dataParallel: 1, pipelineParallel: 2}" 2
plan pp2 "$DIR/h200x2.yaml"
grep -q '"stages": *2' "$DIR/pp2.json" || fail "pp2: not planned in 2 stages"
# The same stages with offload optimizer (each stage's layer updated by the CPU, resumed too).
job pp2-offload 6 2 "{tensorParallel: 1, dataParallel: 1, pipelineParallel: 2, offload: optimizer, gpuUpdateFraction: 0.1}" 2
plan pp2-offload "$DIR/h200x2.yaml"
grep -q '"offload": *"optimizer"' "$DIR/pp2-offload.json" || fail "pp2-offload: no offload planned"
# ... with the offload window: 4 layers in 2 stages, each stage's 2 layers streamed through one
# slot, their checkpoints kept per micro-batch in flight (1F1B's warm-up runs two forwards back to
# back): the 4-layer one-rank run's losses; resumed too.
job pp2-window 6 2 "{tensorParallel: 1, dataParallel: 1, pipelineParallel: 2, offload: window, offloadWindow: 1, recompute: full, gpuUpdateFraction: 0.1}" 2
sed -i 's/layers: 2,/layers: 4,/' "$DIR/pp2-window.yaml"
plan pp2-window "$DIR/h200x2.yaml"
grep -q '"offload": *"window"' "$DIR/pp2-window.json" || fail "pp2-window: no window planned"
# Virtual stages: 4 layers in 2 stages × 2 chunks (rank 0 holds layers 0 and 2, rank 1 layers 1
# and 3), the interleaved schedule over 4 micro-batches: the one-rank run's losses; its
# checkpoint (a shard per virtual stage) rolled back to step 3 resumes to the same losses.
job vpp2 6 2 "{tensorParallel: 1, dataParallel: 1, pipelineParallel: 2, virtualStages: 2}" 2
sed -i 's/layers: 2,/layers: 4,/' "$DIR/vpp2.yaml"
plan vpp2 "$DIR/h200x2.yaml"
grep -q '"virtualStages": *2' "$DIR/vpp2.json" || fail "vpp2: not planned with 2 virtual stages"
# ... with offload optimizer (each stage's units — its embeddings' copy, then its chunks' layers —
# partly on the CPU; resumed too).
job vpp2-offload 6 2 "{tensorParallel: 1, dataParallel: 1, pipelineParallel: 2, virtualStages: 2, offload: optimizer, gpuUpdateFraction: 0.4}" 2
sed -i 's/layers: 2,/layers: 4,/' "$DIR/vpp2-offload.yaml"
plan vpp2-offload "$DIR/h200x2.yaml"
grep -q '"offload": *"optimizer"' "$DIR/vpp2-offload.json" || fail "vpp2-offload: no offload planned"
# ... with the offload window (each chunk's layer streamed, its checkpoints per micro-batch in
# flight; vpp2's losses; resumed too).
job vpp2-window 6 2 "{tensorParallel: 1, dataParallel: 1, pipelineParallel: 2, virtualStages: 2, offload: window, offloadWindow: 1, recompute: full, gpuUpdateFraction: 0.1}" 2
sed -i 's/layers: 2,/layers: 4,/' "$DIR/vpp2-window.yaml"
plan vpp2-window "$DIR/h200x2.yaml"
grep -q '"offload": *"window"' "$DIR/vpp2-window.json" || fail "vpp2-window: no window planned"
# Oases' cutpoint: layer 0 at TP 1 (DP 2), layer 1 at TP 2 — the activations all-gathered at
# the cut, the embeddings summed over both ranks in both layouts: the one-rank run's losses; its
# checkpoint (layer 1 as TP shards of their own) resumes to the same losses, and one rank
# resumes from it too (resharded).
job cut 6 2 "{tensorParallel: 1, dataParallel: 2, cutpointLayer: 1, cutpointTensorParallel: 2}"
plan cut "$DIR/h200x2.yaml"
grep -q '"cutpoint": *{' "$DIR/cut.json" || fail "cut: no cutpoint planned"
# ... with offload optimizer (the layer after the cut updated by the CPU; resumed too).
job cut-offload 6 2 "{tensorParallel: 1, dataParallel: 2, cutpointLayer: 1, cutpointTensorParallel: 2, offload: optimizer, gpuUpdateFraction: 0.5}"
plan cut-offload "$DIR/h200x2.yaml"
grep -q '"offload": *"optimizer"' "$DIR/cut-offload.json" || fail "cut-offload: no offload planned"
# ... with the offload window (each segment's layer streamed through its own slot; resumed too).
job cut-window 6 2 "{tensorParallel: 1, dataParallel: 2, cutpointLayer: 1, cutpointTensorParallel: 2, offload: window, offloadWindow: 1, recompute: full, gpuUpdateFraction: 0.1}"
plan cut-window "$DIR/h200x2.yaml"
grep -q '"offload": *"window"' "$DIR/cut-window.json" || fail "cut-window: no window planned"
# Per-stage TP: 2 stages on 4 ranks, layer 0 at TP 1 × DP 2 and layer 1 at TP 2 — stage 1
# all-gathers the activations it receives on the device (and the targets on the host), the first
# and the last stage sum the embeddings over their 4 ranks in both layouts: the one-rank run's
# losses; its checkpoint (stage 0's shard, stage 1's two) resumes to the same losses.
cat > "$DIR/h200x4.yaml" <<'YAML'
apiVersion: kubetrain.dev/v1alpha1
kind: Inventory
metadata: {name: h200x4}
nodes:
  - {name: h200, gpu: {product: NVIDIA-H200, count: 4}, cpu: {cores: 16}, memory: 128Gi}
YAML
job stage-tp 6 4 "{tensorParallel: 1, dataParallel: 2, pipelineParallel: 2, cutpointLayer: 1, cutpointTensorParallel: 2}"
plan stage-tp "$DIR/h200x4.yaml"
python3 -c "
import json, sys
p = json.load(open('$DIR/stage-tp.json'))
sys.exit(not (p['pipeline']['stageTensorParallel'] == [1, 2] and p['world'] == 4))" ||
  fail "stage-tp: not planned as 2 stages at TP 1 and TP 2"
# ... with offload optimizer (each stage's layer updated by the CPU; resumed too).
job stage-tp-offload 6 4 "{tensorParallel: 1, dataParallel: 2, pipelineParallel: 2, cutpointLayer: 1, cutpointTensorParallel: 2, offload: optimizer, gpuUpdateFraction: 0.1}"
plan stage-tp-offload "$DIR/h200x4.yaml"
grep -q '"offload": *"optimizer"' "$DIR/stage-tp-offload.json" || fail "stage-tp-offload: no offload planned"
# ... with the offload window: 4 layers, each stage streaming its 2 through one slot (resumed too).
job stage-tp-window 6 4 "{tensorParallel: 1, dataParallel: 2, pipelineParallel: 2, cutpointLayer: 2, cutpointTensorParallel: 2, offload: window, offloadWindow: 1, recompute: full, gpuUpdateFraction: 0.1}"
sed -i 's/layers: 2,/layers: 4,/' "$DIR/stage-tp-window.yaml"
plan stage-tp-window "$DIR/h200x4.yaml"
grep -q '"offload": *"window"' "$DIR/stage-tp-window.json" || fail "stage-tp-window: no window planned"
for run in dp2 tp2 dp2-accum dp2-zero dp2-zero-offload dp2-zero-window pp2 pp2-offload pp2-window vpp2 \
  vpp2-offload vpp2-window cut cut-offload cut-window stage-tp stage-tp-offload stage-tp-window; do
  launch_ranks $run
  grep -q "through the host" "$DIR/$run.log" || fail "$run: no collectives chosen: $(head -5 "$DIR/$run.log")"
done
grep -q "transfers between 2 stages" "$DIR/pp2.log" ||
  fail "pp2: no transfers between the stages: $(head -5 "$DIR/pp2.log")"
grep -q "AdamW of [123] of 4 offload units on the GPU" "$DIR/cut-offload.log" ||
  fail "cut-offload: the segments did not offload: $(head -5 "$DIR/cut-offload.log")"
grep -q "AdamW of 3 of 4 offload units on the GPU" "$DIR/vpp2-offload.log" ||
  fail "vpp2-offload: the chunks did not offload: $(head -5 "$DIR/vpp2-offload.log")"
grep -q "AdamW of 1 of 2 offload units on the GPU" "$DIR/pp2-offload.log" ||
  fail "pp2-offload: the stages did not offload: $(head -5 "$DIR/pp2-offload.log")"
grep -q "the other layers streamed through 1 slot(s)" "$DIR/pp2-window.log" ||
  fail "pp2-window: the stages did not stream: $(head -5 "$DIR/pp2-window.log")"
grep -q "the other layers streamed through 1 slot(s)" "$DIR/vpp2-window.log" ||
  fail "vpp2-window: the chunks did not stream: $(head -5 "$DIR/vpp2-window.log")"
for run in pp2 pp2-offload pp2-window vpp2 vpp2-offload vpp2-window; do resume_ranks $run; done
[[ -f $DIR/ckpt-vpp2/step-00000006/rank-00003.safetensors ]] ||
  fail "vpp2: no shard per virtual stage: $(ls "$DIR/ckpt-vpp2/step-00000006")"

grep -q "the re-shard over 2 ranks and the embeddings' sum over 2" "$DIR/cut.log" ||
  fail "cut: no re-shard at the cutpoint: $(head -5 "$DIR/cut.log")"
cp -r "$DIR/ckpt-cut" "$DIR/ckpt-cut-one"
roll_back "$DIR/ckpt-cut-one"
resume_ranks cut
resume_ranks cut-offload
grep -q "the other layers streamed through 1 slot(s)" "$DIR/cut-window.log" ||
  fail "cut-window: the segments did not stream: $(head -5 "$DIR/cut-window.log")"
resume_ranks cut-window
grep -q "the re-shard over 2 ranks between stages of two TP degrees" "$DIR/stage-tp.log" ||
  fail "stage-tp: no re-shard between the stages: $(head -5 "$DIR/stage-tp.log")"
resume_ranks stage-tp
grep -q "AdamW of 1 of 2 offload units on the GPU" "$DIR/stage-tp-offload.log" ||
  fail "stage-tp-offload: the stages did not offload: $(head -5 "$DIR/stage-tp-offload.log")"
resume_ranks stage-tp-offload
grep -q "the other layers streamed through 1 slot(s)" "$DIR/stage-tp-window.log" ||
  fail "stage-tp-window: the stages did not stream: $(head -5 "$DIR/stage-tp-window.log")"
resume_ranks stage-tp-window
[[ -f $DIR/ckpt-stage-tp/step-00000006/rank-00002.safetensors ]] ||
  fail "stage-tp: no shard per stage and TP rank: $(ls "$DIR/ckpt-stage-tp/step-00000006")"
"$WORKER" train --plan "$DIR/cuda.json" --checkpoint-dir "$DIR/ckpt-cut-one" --log-every 1 \
  > "$DIR/cut-one.log" 2>&1 || fail "cut checkpoint on one rank: $(tail -3 "$DIR/cut-one.log")"
grep -q "resumed from step 3.*tensors resharded" "$DIR/cut-one.log" ||
  fail "one rank did not reshard the cut checkpoint: $(head -3 "$DIR/cut-one.log")"

for run in dp2-zero dp2-zero-offload dp2-zero-window; do
  grep -q "masters and moments sharded over 2 DP ranks" "$DIR/$run.log" ||
    fail "$run: the optimizer was not sharded: $(head -5 "$DIR/$run.log")"
  resume_ranks $run
done
grep -q "AdamW of 2 of 3 offload units on the GPU\|AdamW of 1 of 3" "$DIR/dp2-zero-offload.log" ||
  fail "dp2-zero-offload did not split the AdamW: $(head -5 "$DIR/dp2-zero-offload.log")"

# What it refuses, saying why: NCCL forced on ranks that share a GPU; a CUDA plan in fp32.
MASTER_ADDR=127.0.0.1 MASTER_PORT=$(free_port) KUBETRAIN_CUDA_COMM=nccl timeout 120 "$WORKER" \
  launch --plan "$DIR/dp2.json" > "$DIR/forced.log" 2>&1 && fail "NCCL forced on a shared GPU ran"
grep -q "KUBETRAIN_CUDA_COMM=nccl, but ranks 0 and 1 share a GPU" "$DIR/forced.log" ||
  fail "forced NCCL not refused clearly: $(tail -5 "$DIR/forced.log")"
sed 's/seed: 11}/seed: 11, precision: fp32}/' "$DIR/cuda.yaml" > "$DIR/fp32.yaml"
plan fp32 $h200
"$WORKER" train --plan "$DIR/fp32.json" > "$DIR/fp32.log" 2>&1 && fail "a CUDA fp32 plan ran"
grep -q "cannot execute this plan: precision fp32 on CUDA" "$DIR/fp32.log" ||
  fail "CUDA fp32 not refused clearly: $(cat "$DIR/fp32.log")"
echo "ok   refused: NCCL forced on a shared GPU, a CUDA plan in fp32"

# `kubetrain-worker profile --device cuda` (worker/cuda_profile.cpp) on two emulated GPUs: the
# profile of the kind named, its figures derived from its measurements as documented (NCCL's where
# the emulated libnccl is built), within the termination message's 4 KiB; the planner takes it.
KT_EMULATED_GPUS=2 KUBETRAIN_TERMINATION_MESSAGE_PATH="$DIR/profile.json" "$WORKER" profile \
  --device cuda --kind NVIDIA-H200 --quick --termination-message -o "$DIR/profile.yaml" \
  > /dev/null 2> "$DIR/profile.log" || fail "GPU profile: $(tail -5 "$DIR/profile.log")"
python3 - "$DIR/profile.json" "${KUBETRAIN_NCCL_LIBRARY:+nccl}" <<'PY' || fail "GPU profile figures"
import json, os, sys
doc = json.load(open(sys.argv[1]))
spec, m, prov = doc["spec"], doc["measurements"], doc["provenance"]
assert os.path.getsize(sys.argv[1]) <= 4096
assert doc["metadata"]["name"] == "H200", doc["metadata"]
assert prov["gpu"] == "emulated on the host" and prov["gpus"] == "2" and prov["driver"].startswith("CUDA ")
def near(a, b): return abs(a - b) <= 1e-9 * max(abs(a), abs(b))
assert near(spec["peakBf16Flops"], m["bf16GemmFlopsPerSecond"])
assert near(spec["peakFp32Flops"], m["gemmFlopsPerSecond"])
assert near(spec["memoryBandwidth"], 28 * m["deviceAdamwParamsPerSecond"])
assert near(spec["hostLinkBandwidth"], min(m["pinnedHostToDeviceBytesPerSecond"], m["pinnedDeviceToHostBytesPerSecond"]))
assert near(spec["cpuAdamParamsPerCore"] * os.cpu_count(), m["adamwParamsPerSecond"])
assert 0 < spec["achievedFraction"] <= 1 and spec["achievedFractionBf16"] == spec["achievedFraction"]
# recomputeRateRatio: every layer's forward again, (8bsh² + 4bshf + 4bs²h)·L FLOPs, over the
# time full recompute added (bracketed by the two plain runs), against the micro-batch's rate:
# the quick profile's model is tiny (L 2, h 64, ffn 256, vocab 256 padded to 256, T 64) at B 4.
L, h, f, T, B, V, P = 2, 64, 256, 64, 4, 256, None
P = V * h + T * h + L * (12 * h * h + 13 * h) + 2 * h  # GPT-2's parameters (tied LM head)
step_flops = (6 * P + 12 * L * h * T) * B * T  # api/flops.h
plain, full, again = m["bf16MicroBatchSeconds"], m["bf16MicroBatchFullRecomputeSeconds"], m["bf16MicroBatchSecondsAfterwards"]
added = max(full - (plain + again) / 2, 1e-9)
ratio = L * (8 * B * T * h * h + 4 * B * T * h * f + 4 * B * T * T * h) / added / (step_flops / plain)
assert near(spec["recomputeRateRatio"], min(max(ratio, 0.5), 3.0)), (spec["recomputeRateRatio"], ratio)
if sys.argv[2] == "nccl":
    assert near(spec["allreduceLatency"], m["ncclAllreduce1FloatSeconds"] / 2)
    a = spec["allreduceLatency"]
    assert near(spec["intraAllreduceBusbw"], m["ncclAllreduceBigBytes"] / (m["ncclAllreduceBigSeconds"] - 2 * a))
    want = min(max(m["gemmSecondsBesideAllreduce"] / m["gemmSecondsAlone"] - 1, 0), 4)
    assert near(spec["overlapInterference"], want)
else:
    assert "ncclAllreduce1FloatSeconds" not in m
PY
"$KT" plan "$DIR/cuda.yaml" --cluster $h200 --profile "$DIR/profile.yaml" > "$DIR/measured-plan.txt" 2>&1 ||
  fail "planning with the GPU profile: $(cat "$DIR/measured-plan.txt")"
grep -q "figures      measured on" "$DIR/measured-plan.txt" ||
  fail "the plan does not say it used the measured figures: $(head -8 "$DIR/measured-plan.txt")"
# Refused, saying why: a product it does not know without --kind, a kind that is no GPU, no GPU.
"$WORKER" profile --device cuda --quick > /dev/null 2> "$DIR/nokind.log" && fail "profiled an unknown GPU"
grep -q 'is not a known product (docs/HARDWARE.md lists them); name its node kind with --kind' \
  "$DIR/nokind.log" || fail "unknown GPU not refused clearly: $(cat "$DIR/nokind.log")"
"$WORKER" profile --device cuda --kind cpu --quick > /dev/null 2> "$DIR/cpukind.log" && fail "--kind cpu profiled a GPU"
grep -q -- '--kind "cpu" is not a GPU node kind' "$DIR/cpukind.log" ||
  fail "--kind cpu not refused clearly: $(cat "$DIR/cpukind.log")"
"$CPU_WORKER" profile --device cuda --quick > /dev/null 2> "$DIR/nogpu.log" && fail "profiled a GPU without one"
grep -Eq 'no GPU is usable here|built without the CUDA path' "$DIR/nogpu.log" ||
  fail "--device cuda without a GPU not refused clearly: $(cat "$DIR/nogpu.log")"
echo "ok   GPU profile (2 emulated GPUs${KUBETRAIN_NCCL_LIBRARY:+, NCCL}): figures from its measurements; planned with it; refusals"

# While training: /metrics (promtool-clean) shows the GPU and the CPU AdamW and the copies; SIGTERM
# checkpoints and exits 143; a plan of the same job two steps longer resumes from there.
job long 400 1 "{offload: optimizer, gpuUpdateFraction: 0.5}"
plan long $h200
"$WORKER" train --plan "$DIR/long.json" --checkpoint-dir "$DIR/ckpt-long" --metrics-port 0 \
  --metrics-address 127.0.0.1 --log-every 1 > "$DIR/long.log" 2>&1 &
PID=$!
trap '[[ -n ${PID:-} ]] && kill $PID 2>/dev/null; [[ -n ${KEEP:-} ]] || rm -rf "$DIR"' EXIT
PORT=$(announced_port "$DIR/long.log")
[[ -n ${PORT:-} ]] || fail "no metrics port announced: $(head -3 "$DIR/long.log")"
for _ in $(seq 150); do
  get "http://127.0.0.1:$PORT/metrics" > "$DIR/metrics" 2>/dev/null || true
  grep -q '^kubetrain_worker_steps_total{.*} [3-9]' "$DIR/metrics" && break
  sleep 0.2
done
for want in 'optimizer_seconds_total{.*device="cuda:0"' 'optimizer_seconds_total{.*device="host"}' \
  'transfer_bytes_total{.*direction="h2d"} [1-9]' 'transfer_bytes_total{.*direction="d2h"} [1-9]' \
  'memory_bytes{.*device="cuda:0",kind="params"}'; do
  grep -q "^kubetrain_worker_$want" "$DIR/metrics" ||
    fail "/metrics lacks kubetrain_worker_$want: $(grep -c . "$DIR/metrics") lines"
done
promtool check metrics < "$DIR/metrics" || fail "promtool rejected the CUDA worker's /metrics"
kill -TERM $PID
wait $PID
rc=$?
PID=
[[ $rc -eq 143 ]] || fail "exit code after SIGTERM: $rc (want 143): $(tail -3 "$DIR/long.log")"
stopped=$(sed -n 's/.*stopped by signal after step \([0-9]*\).*/\1/p' "$DIR/long.log")
[[ -n $stopped && -f $DIR/ckpt-long/latest ]] || fail "no checkpoint after SIGTERM: $(tail -3 "$DIR/long.log")"
job long2 $((stopped + 2)) 1 "{offload: optimizer, gpuUpdateFraction: 0.5}"
plan long2 $h200
"$WORKER" train --plan "$DIR/long2.json" --checkpoint-dir "$DIR/ckpt-long" > "$DIR/long2.log" 2>&1 ||
  fail "resume after SIGTERM: $(tail -3 "$DIR/long2.log")"
grep -q "resumed from step $stopped" "$DIR/long2.log" && grep -q "^done: $((stopped + 2)) steps" "$DIR/long2.log" ||
  fail "did not resume from step $stopped and finish: $(cat "$DIR/long2.log")"
echo "ok   metrics (promtool-clean), SIGTERM after step $stopped: exit 143, checkpoint, resumed"

python3 - "$DIR" <<'PY'
import re, sys
d = sys.argv[1]
def losses(name):
    out = {}
    for line in open(f"{d}/{name}.log"):
        m = re.match(r"(?:\[rank 0\] )?step +(\d+)/\d+ \| loss ([\d.]+)", line)
        if m:
            out[int(m.group(1))] = float(m.group(2))
    return out
cpu, cuda = losses("cpu"), losses("cuda")
accum = losses("accum")
runs = {"cuda": (cpu, 2e-2), "offload": (cuda, 1e-3), "window": (cuda, 1e-3),
        "dp2": (cuda, 2e-2), "tp2": (cuda, 2e-2), "accum": (cuda, 2e-2),
        "window-accum": (accum, 1e-3), "dp2-accum": (cuda, 2e-2),
        "dp2-zero": (losses("dp2"), 1e-3), "dp2-zero-offload": (losses("dp2"), 1e-3),
        "dp2-zero-window": (losses("dp2-accum"), 1e-3),
        "pp2": (accum, 2e-2), "pp2-offload": (losses("pp2"), 1e-3), "cut": (cuda, 2e-2),
        "vpp2": (losses("accum4"), 2e-2), "vpp2-offload": (losses("vpp2"), 1e-3),
        "pp2-window": (losses("accum4"), 2e-2), "vpp2-window": (losses("vpp2"), 1e-3),
        "cut-offload": (losses("cut"), 1e-3), "cut-window": (losses("cut"), 1e-3),
        "stage-tp": (cuda, 2e-2), "stage-tp-offload": (losses("stage-tp"), 1e-3),
        "stage-tp-window": (losses("accum4"), 2e-2)}
failed = False
for name, (ref, tol) in runs.items():
    got = losses(name)
    if sorted(got) != list(range(1, 7)):
        print(f"FAIL: {name} logged steps {sorted(got)}")
        failed = True
        continue
    worst = max(abs(got[s] - ref[s]) / ref[s] for s in got)
    ok = worst < tol
    failed |= not ok
    against = ("cpu" if ref is cpu else "accum" if ref is accum else "cuda" if ref is cuda
               else "dp2-accum" if name == "dp2-zero-window"
               else "pp2" if name == "pp2-offload" else "accum4" if name in ("vpp2", "pp2-window")
               else "vpp2" if name in ("vpp2-offload", "vpp2-window") else "cut" if name in ("cut-offload", "cut-window")
               else "stage-tp" if name == "stage-tp-offload"
               else "accum4" if name == "stage-tp-window"
               else "dp2")
    print(f"{'ok  ' if ok else 'FAIL'} {name:16s} vs {against:5s} worst rel loss diff {worst:.1e} (tol {tol:.0e})")
for name in ("cuda", "offload", "window", "dp2-zero", "dp2-zero-offload", "dp2-zero-window",
             "pp2", "pp2-offload",
             "pp2-window", "vpp2", "vpp2-offload", "vpp2-window", "cut", "cut-offload",
             "cut-window", "stage-tp", "stage-tp-offload",
             "stage-tp-window"):  # resumed at step 3: the same losses
    whole, resumed = losses(name), losses(f"{name}-resumed")
    same = sorted(resumed) == [4, 5, 6] and all(resumed[s] == whole[s] for s in resumed)
    print(f"{'ok  ' if same else 'FAIL'} {name:16s} resumed from step 3: steps 4-6 "
          f"{'print' if same else 'do not print'} the uninterrupted run's losses")
    failed |= not same
# The cut run's step-3 checkpoint on one rank: steps 4-6 near the cut run's own.
cut, one = losses("cut"), losses("cut-one")
worst = max((abs(one[s] - cut[s]) / cut[s] for s in one), default=1.0)
ok = sorted(one) == [4, 5, 6] and worst < 2e-2
print(f"{'ok  ' if ok else 'FAIL'} cut-one          its checkpoint resumed on one rank: steps 4-6 "
      f"within {worst:.1e} of the cut run's (tol 2e-02)")
failed |= not ok
if cuda[6] > cuda[1] - 0.2:
    print(f"FAIL: the CUDA loss did not fall: {cuda[1]} -> {cuda[6]}")
    failed = True
sys.exit(1 if failed else 0)
PY
rc=$?
[[ $rc -eq 0 ]] || { tail -n 4 "$DIR"/*.log; fail "losses"; }
echo "emulated CUDA worker ok"

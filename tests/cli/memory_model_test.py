#!/usr/bin/env python3
"""The planner's memory model against what CPU workers really hold.

For plans of several model sizes and modes (one rank, TP 2 with the Oases sub-batches and
commAware recompute, DP 2, full recompute, window and optimizer offload, two pipeline stages,
bf16), `kubetrain-worker launch` trains a few steps and saves a checkpoint while this script
samples the proportional set size (PSS: each page once, as a memory cgroup charges it) of the
pod's processes every 20 ms. It checks, for each plan:

  peak of the ranks  <=  the planned figure (memory per rank x ranks + host offload state)
  peak of the pod    <=  the pod's limits.memory (children.cpp's formula applied to the plan:
                         the planned figure + 10 % + 512 MiB per rank; controller_test.cpp
                         checks that the rendered pod carries it)

A plan that under-predicts fails here, as a kubelet would OOM-kill its pod.

Usage: memory_model_test.py KUBETRAIN KUBETRAIN_WORKER [ONLY]   (ONLY: run the plans named so)
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

KT, WORKER = sys.argv[1], sys.argv[2]
ONLY = sys.argv[3] if len(sys.argv) > 3 else ""
CLUSTER = "examples/clusters/cpu-local.yaml"
MIB = 1 << 20

# name, model, training, parallelism (forced, so that each mode is what runs)
CASES = [
    ("tiny", "{preset: tiny}", "{steps: 3, globalBatchSize: 8}", "{tensorParallel: 1, dataParallel: 1}"),
    ("small", "{layers: 4, hidden: 256, heads: 4, vocab: 50257, seqLen: 256}",
     "{steps: 2, globalBatchSize: 8, microBatchSize: 8}", "{tensorParallel: 1, dataParallel: 1}"),
    ("small-tp2-overlap", "{layers: 4, hidden: 256, heads: 4, vocab: 50257, seqLen: 256}",
     "{steps: 2, globalBatchSize: 8, microBatchSize: 8}",
     "{tensorParallel: 2, overlap: on, recompute: commAware}"),
    ("small-dp2", "{layers: 4, hidden: 256, heads: 4, vocab: 50257, seqLen: 256}",
     "{steps: 2, globalBatchSize: 8, microBatchSize: 4}", "{tensorParallel: 1, dataParallel: 2}"),
    ("small-full-recompute", "{layers: 4, hidden: 256, heads: 4, vocab: 50257, seqLen: 256}",
     "{steps: 2, globalBatchSize: 8, microBatchSize: 8}",
     "{tensorParallel: 1, dataParallel: 1, recompute: full}"),
    ("small-window", "{layers: 4, hidden: 256, heads: 4, vocab: 50257, seqLen: 256}",
     "{steps: 2, globalBatchSize: 8, microBatchSize: 8}",
     "{tensorParallel: 1, dataParallel: 1, offload: window, offloadWindow: 1}"),
    ("small-optimizer-offload", "{layers: 4, hidden: 256, heads: 4, vocab: 50257, seqLen: 256}",
     "{steps: 2, globalBatchSize: 8, microBatchSize: 8}",
     "{tensorParallel: 1, dataParallel: 1, offload: optimizer, gpuUpdateFraction: 0.5}"),
    ("small-pp2", "{layers: 4, hidden: 256, heads: 4, vocab: 50257, seqLen: 256}",
     "{steps: 2, globalBatchSize: 16, microBatchSize: 4}",
     "{tensorParallel: 1, dataParallel: 1, pipelineParallel: 2}"),
    ("small-bf16", "{layers: 4, hidden: 256, heads: 4, vocab: 50257, seqLen: 256}",
     "{steps: 2, globalBatchSize: 8, microBatchSize: 8, precision: bf16}",
     "{tensorParallel: 1, dataParallel: 1}"),
    ("gpt2-124m", "{preset: gpt2-124m, seqLen: 512}",
     "{steps: 1, globalBatchSize: 2, microBatchSize: 2}", "{tensorParallel: 1, dataParallel: 1}"),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children_of():
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    return kids


def pss(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_measured(argv, env, log):
    """Runs argv; returns (exit code, peak PSS of the whole tree, peak PSS of the ranks)."""
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    peak_pod = peak_ranks = 0
    while proc.poll() is None:
        kids = children_of()
        ranks, stack = [], list(kids.get(proc.pid, []))
        while stack:
            p = stack.pop()
            ranks.append(p)
            stack.extend(kids.get(p, []))
        rank_bytes = sum(pss(p) for p in ranks)
        peak_ranks = max(peak_ranks, rank_bytes)
        peak_pod = max(peak_pod, rank_bytes + pss(proc.pid))
        time.sleep(0.02)
    return proc.returncode, peak_pod, peak_ranks


def pod_limit_bytes(plan):
    """limits.memory as operator/controller/children.cpp renders it for a CPU plan."""
    pred = plan["predicted"]
    procs = plan["procsPerNode"]
    planned = pred["hostMemoryPerNodeBytes"]["used"] + pred["memoryPerRankBytes"]["total"] * procs
    return planned * 1.10 + procs * 512 * MIB, planned


def main():
    failures = []
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, training, parallelism in CASES:
            if ONLY and ONLY not in name:
                continue
            job = os.path.join(tmp, name + ".yaml")
            with open(job, "w") as f:
                f.write(
                    "apiVersion: kubetrain.dev/v1alpha1\nkind: TrainingJob\n"
                    f"metadata: {{name: {name}}}\nspec:\n  model: {model}\n  training: {training}\n"
                    f"  resources: {{cpuOnly: true}}\n  parallelism: {parallelism}\n"
                    "  checkpoint: {intervalSteps: 1}\n")
            planned = subprocess.run([KT, "plan", job, "--cluster", CLUSTER, "-o", "json"],
                                     capture_output=True, text=True)
            if planned.returncode != 0:
                failures.append(f"{name}: kubetrain plan failed: {planned.stderr.strip()}")
                continue
            plan_path = os.path.join(tmp, name + ".json")
            with open(plan_path, "w") as f:
                f.write(planned.stdout)
            plan = json.loads(planned.stdout)
            limit, planned_bytes = pod_limit_bytes(plan)
            env = dict(os.environ, MASTER_PORT=str(free_port()), OMP_WAIT_POLICY="passive")
            log_path = os.path.join(tmp, name + ".log")
            with open(log_path, "w") as log:
                rc, peak_pod, peak_ranks = run_measured(
                    [WORKER, "launch", "--plan", plan_path, "--checkpoint-dir",
                     os.path.join(tmp, name + "-ckpt")], env, log)
            rows.append((name, plan["procsPerNode"], peak_ranks, planned_bytes, peak_pod, limit))
            if rc != 0:
                with open(log_path) as log:
                    failures.append(f"{name}: launch exited {rc}: {log.read()[-800:]}")
            if peak_ranks > planned_bytes:
                failures.append(f"{name}: the ranks held {peak_ranks / MIB:.0f} MiB, "
                                f"more than the planned {planned_bytes / MIB:.0f} MiB")
            if peak_pod > limit:
                failures.append(f"{name}: the pod held {peak_pod / MIB:.0f} MiB, "
                                f"more than its limit of {limit / MIB:.0f} MiB")
    print(f"{'plan':26} {'ranks':>5} {'peak ranks':>11} {'planned':>9} {'peak pod':>9} {'limit':>9}"
          f" {'peak/planned':>12}")
    for name, procs, peak_ranks, planned_bytes, peak_pod, limit in rows:
        print(f"{name:26} {procs:5d} {peak_ranks / MIB:9.0f}Mi {planned_bytes / MIB:7.0f}Mi "
              f"{peak_pod / MIB:7.0f}Mi {limit / MIB:7.0f}Mi {peak_ranks / planned_bytes:12.2f}")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""bench_fidelity: how well the planner predicts the step time of plans it did not choose.

Forced plans of one small GPT (L 4, h 256, T 128, global batch 8) on this machine — TP 1/2, DP 1/2,
PP 1/2, a cutpoint (DP 2 then TP 2), overlap on/off, recompute none/full/commAware, offload none/optimizer/window — and the planner's
own pick, each trained through `kubetrain-worker launch` for WARMUP + STEPS steps, ROUNDS times
round robin. A plan's step time is the median over its rounds of the median of each run's last
STEPS step times (steps.jsonl). Every plan is predicted three times: with
the built-in CPU profile, and with a profile `kubetrain-worker profile` measured here at the
model's shapes just before, and a third time with that profile refit by the measured phase times
of every other forced plan's runs (`kubetrain plan --refit`, the fold-back autotune does; leave
one out, so that no plan predicts itself). Prints the table, the mean absolute percentage error (MAPE),
Kendall's tau between predicted and measured order, and whether the planner's pick (with the
measured profile) is the measured fastest or within 3 % of it.

With --gpu, the same on one GPU (examples/clusters/h200-single.yaml; scripts/device-check.sh runs
it with the worker bundle): GPT-2 124M at global batch 8, the single-GPU plans (recompute
none/full/commAware, offload none/optimizer/window), the profile measured with `profile --device
cuda`. --model replaces the model (tests run it small under emulation).

Usage: bench/fidelity.py [--kubetrain BIN] [--worker BIN] [--steps N] [--warmup N] [--rounds N]
                         [--keep DIR] [--gpu] [--model SPEC] [--quick-profile]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

MODEL = "layers: 4, hidden: 256, heads: 4, ffnHidden: 1024, vocab: 256, seqLen: 128"
CONFIGS = [
    ("TP 1, recompute none", "tensorParallel: 1, dataParallel: 1, recompute: none, offload: none"),
    ("TP 1, recompute full", "tensorParallel: 1, dataParallel: 1, recompute: full, offload: none"),
    ("TP 1, commAware", "tensorParallel: 1, dataParallel: 1, recompute: commAware, offload: none"),
    ("TP 1, offload optimizer 0.5",
     "tensorParallel: 1, dataParallel: 1, recompute: none, offload: optimizer, gpuUpdateFraction: 0.5"),
    ("TP 1, window 2 + commAware",
     "tensorParallel: 1, dataParallel: 1, recompute: commAware, offload: window, offloadWindow: 2, "
     "gpuUpdateFraction: 0.05"),
    ("TP 2, overlap off", "tensorParallel: 2, dataParallel: 1, overlap: off, recompute: none"),
    ("TP 2, overlap on", "tensorParallel: 2, dataParallel: 1, overlap: on, recompute: none"),
    ("DP 2", "tensorParallel: 1, dataParallel: 2, recompute: none, offload: none"),
    ("PP 2 (1F1B)",
     "tensorParallel: 1, dataParallel: 1, pipelineParallel: 2, recompute: none, offload: none"),
    ("cutpoint: DP 2, TP 2 from layer 2",
     "tensorParallel: 1, dataParallel: 2, cutpointLayer: 2, cutpointTensorParallel: 2, "
     "recompute: none, offload: none"),
]
CLUSTER = "examples/clusters/cpu-local.yaml"
# One GPU: the plans a single GPU runs (tensor and data parallelism need more than one).
GPU_MODEL = "preset: gpt2-124m"
GPU_CONFIGS = [
    ("recompute none", "recompute: none, offload: none"),
    ("recompute full", "recompute: full, offload: none"),
    ("commAware", "recompute: commAware, offload: none"),
    ("offload optimizer 0.5", "recompute: none, offload: optimizer, gpuUpdateFraction: 0.5"),
    ("window 2 + full", "recompute: full, offload: window, offloadWindow: 2, gpuUpdateFraction: 0.1"),
]
GPU_CLUSTER = "examples/clusters/h200-single.yaml"


def job_yaml(name, parallelism, steps):
    par = f"  parallelism: {{{parallelism}}}\n" if parallelism else ""
    return (f"apiVersion: kubetrain.dev/v1alpha1\nkind: TrainingJob\nmetadata: {{name: {name}}}\n"
            f"spec:\n  model: {{{MODEL}}}\n"
            f"  training: {{steps: {steps}, globalBatchSize: 8, learningRate: 0.001, seed: 5}}\n"
            f"  data: {{source: synthetic}}\n{par}")


def plan(kubetrain, job_path, profile=None, refit=()):
    cmd = [kubetrain, "plan", job_path, "-c", CLUSTER, "-o", "json"]
    if profile:
        cmd += ["--profile", profile]
    for run in refit:
        cmd += ["--refit", run]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def executed(p):
    """What the worker runs (so that two plans of one forced config can be compared)."""
    keys = ("tp", "dp", "pipeline", "overlap", "recompute", "offload", "batch", "procsPerNode",
            "cpuThreads")
    return json.dumps({k: p.get(k) for k in keys}, sort_keys=True)


def run_dir(work, plan_path, round_):
    return os.path.join(work, f"ckpt-{round_}-" + os.path.basename(plan_path))


def measure(worker, plan_path, work, warmup, steps, round_):
    ckpt = run_dir(work, plan_path, round_)
    shutil.rmtree(ckpt, ignore_errors=True)  # a kept dir's earlier run would be resumed
    env = dict(os.environ, MASTER_PORT=str(29600 + (hash(plan_path) % 300)))
    done = subprocess.run([worker, "launch", "--plan", plan_path, "--checkpoint-dir", ckpt],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{plan_path}: kubetrain-worker launch exited {done.returncode}:\n"
                         + done.stderr[-2000:])
    seconds = [r["seconds"] for r in map(json.loads, open(os.path.join(ckpt, "steps.jsonl")))
               if r.get("kind") == "step"]
    if len(seconds) < warmup + steps:
        raise SystemExit(f"{plan_path}: only {len(seconds)} steps recorded")
    return statistics.median(seconds[warmup:warmup + steps])


def kendall_tau(a, b):
    n, s = len(a), 0
    for i in range(n):
        for j in range(i + 1, n):
            x, y = a[i] - a[j], b[i] - b[j]
            s += (x > 0) - (x < 0) if y > 0 else ((x < 0) - (x > 0) if y < 0 else 0)
    return s / (n * (n - 1) / 2)


def mape(pred, meas):
    return 100 * statistics.mean(abs(p - m) / m for p, m in zip(pred, meas))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kubetrain", default="build/bin/kubetrain")
    ap.add_argument("--worker", default="build/bin/kubetrain-worker")
    ap.add_argument("--steps", type=int, default=20, help="measured steps per plan")
    ap.add_argument("--warmup", type=int, default=10, help="steps left out first")
    ap.add_argument("--rounds", type=int, default=3, help="runs of every plan, round robin")
    ap.add_argument("--keep", help="keep the plans, profile and logs here")
    ap.add_argument("--gpu", action="store_true", help="one GPU (h200-single), GPT-2 124M")
    ap.add_argument("--model", help="the model's fields, e.g. 'layers: 2, hidden: 128, ...'")
    ap.add_argument("--quick-profile", action="store_true", help="`profile --quick` (tests)")
    args = ap.parse_args()
    global MODEL, CONFIGS, CLUSTER
    profile_args = []
    if args.gpu:
        MODEL, CONFIGS, CLUSTER = GPU_MODEL, GPU_CONFIGS, GPU_CLUSTER
        profile_args = ["--device", "cuda", "--kind", "H200"]
    if args.model:
        MODEL = args.model
    if args.quick_profile:
        profile_args.append("--quick")
    work = args.keep or tempfile.mkdtemp(prefix="kt-fidelity-")
    os.makedirs(work, exist_ok=True)
    total = args.warmup + args.steps
    started = time.time()

    # The measured profile, at the model's shapes (the first config's plan).
    first_job = os.path.join(work, "job-0.yaml")
    open(first_job, "w").write(job_yaml("fidelity-0", CONFIGS[0][1], total))
    first_plan = os.path.join(work, "plan-0-builtin.json")
    json.dump(plan(args.kubetrain, first_job), open(first_plan, "w"))
    profile = os.path.join(work, "measured-profile.yaml")
    t0 = time.time()
    subprocess.run([args.worker, "profile", "--plan", first_plan, "-o", profile] + profile_args,
                   check=True, capture_output=True, text=True)
    profile_seconds = time.time() - t0

    rows = []
    configs = CONFIGS + [("planner's pick (measured profile)", "")]
    plans = []
    for i, (name, parallelism) in enumerate(configs):
        job = os.path.join(work, f"job-{i}.yaml")
        open(job, "w").write(job_yaml(f"fidelity-{i}", parallelism, total))
        builtin = plan(args.kubetrain, job)
        measured = plan(args.kubetrain, job, profile)
        path = os.path.join(work, f"plan-{i}.json")
        json.dump(measured, open(path, "w"))
        plans.append((builtin, measured, path))
    # Round robin, so that the machine's mood falls on every plan alike; each plan's time is the
    # median of its rounds.
    times = [[] for _ in plans]
    for r in range(args.rounds):
        for i, (_, _, path) in enumerate(plans):
            times[i].append(measure(args.worker, path, work, args.warmup, args.steps, r))
    # The fold-back (kubetrain plan --refit, what the operator's autotune does): each forced plan
    # predicted again from the measured profile refit by the runs of every OTHER forced plan
    # (leave one out: a plan's own run never predicts it).
    forced_paths = [path for (_, _, path), (_, par) in zip(plans, configs) if par]
    def runs_except(path):
        return [run_dir(work, other, r) for other in forced_paths if other != path
                for r in range(args.rounds)]
    folded = []
    for i, (name, parallelism) in enumerate(configs):
        job = os.path.join(work, f"job-{i}.yaml")
        path = plans[i][2]
        folded.append(plan(args.kubetrain, job, profile, runs_except(path) if parallelism
                           else runs_except(None)))
    # The planner's pick with every forced run folded back, measured like the others.
    pick_path = os.path.join(work, "plan-pick-folded.json")
    json.dump(folded[-1], open(pick_path, "w"))
    pick_times = [measure(args.worker, pick_path, work, args.warmup, args.steps, r)
                  for r in range(args.rounds)]
    for i, (name, parallelism) in enumerate(configs):
        builtin, measured, path = plans[i]
        same = executed(builtin) == executed(measured) == executed(folded[i])
        seconds = statistics.median(times[i])
        rows.append({"name": name, "builtin": builtin["predicted"]["stepSeconds"],
                     "measured_pred": measured["predicted"]["stepSeconds"], "measured": seconds,
                     "folded_pred": folded[i]["predicted"]["stepSeconds"],
                     "same": same, "pick": not parallelism,
                     "config": f"TP {measured['tp']} × DP {measured['dp']}, overlap "
                               f"{'on' if measured['overlap']['subBatches'] == 2 else 'off'}, "
                               f"{measured['recompute']}, offload {measured['offload']['mode']}"})
        print(f"  {name}: measured {seconds * 1e3:.1f} ms (rounds: "
              f"{', '.join(f'{t * 1e3:.1f}' for t in times[i])})", file=sys.stderr)

    fp = folded[-1]
    rows.append({"name": "planner's pick (measured profile, every forced run folded back)",
                 "builtin": plans[-1][0]["predicted"]["stepSeconds"],
                 "measured_pred": plans[-1][1]["predicted"]["stepSeconds"],
                 "folded_pred": fp["predicted"]["stepSeconds"],
                 "measured": statistics.median(pick_times), "same": True, "pick": True,
                 "config": f"TP {fp['tp']} × DP {fp['dp']}, overlap "
                           f"{'on' if fp['overlap']['subBatches'] == 2 else 'off'}, "
                           f"{fp['recompute']}, offload {fp['offload']['mode']}"})
    print(f"  folded pick: measured {rows[-1]['measured'] * 1e3:.1f} ms (rounds: "
          f"{', '.join(f'{t * 1e3:.1f}' for t in pick_times)})", file=sys.stderr)

    forced = [r for r in rows if not r["pick"]]
    meas = [r["measured"] for r in forced]
    b = [r["builtin"] for r in forced]
    m = [r["measured_pred"] for r in forced]
    f = [r["folded_pred"] for r in forced]
    print("| plan | predicted, built-in (ms) | predicted, measured profile (ms) | "
          "predicted, measured + folded back (ms) | measured (ms) |")
    print("|---|---|---|---|---|")
    for r in rows:
        note = "" if r["same"] else " ¹"
        label = r["name"] + (f" — {r['config']}" if r["pick"] else "")
        print(f"| {label}{note} | {r['builtin'] * 1e3:.1f} | {r['measured_pred'] * 1e3:.1f} | "
              f"{r['folded_pred'] * 1e3:.1f} | {r['measured'] * 1e3:.1f} |")
    if not all(r["same"] for r in rows):
        print("\n¹ the profiles plan this job differently (each prediction is of its own plan)")
    fastest = min(r["measured"] for r in rows)
    picks = [r for r in rows if r["pick"]]
    print()
    print(f"MAPE (forced plans): built-in {mape(b, meas):.1f} %, measured profile "
          f"{mape(m, meas):.1f} %, measured + folded back (leave one out) {mape(f, meas):.1f} %")
    print(f"Kendall's tau, predicted vs measured order: built-in {kendall_tau(b, meas):.2f}, "
          f"measured profile {kendall_tau(m, meas):.2f}, folded back {kendall_tau(f, meas):.2f}")
    for pick in picks:
        print(f"{pick['name']} ({pick['config']}) measures {pick['measured'] * 1e3:.1f} ms; the "
              f"fastest plan {fastest * 1e3:.1f} ms ({100 * (pick['measured'] / fastest - 1):+.1f} %)")
    print(f"(profile {profile_seconds:.0f} s; all {time.time() - started:.0f} s; per plan the median "
          f"of {args.rounds} round-robin runs, each the median of its steps {args.warmup + 1}–{total}; "
          f"{work})")


if __name__ == "__main__":
    main()

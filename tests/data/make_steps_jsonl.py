#!/usr/bin/env python3
"""Writes tests/data/steps.jsonl: a step log (worker/step_log.h) of examples/jobs/tiny.yaml's model
on two CPU ranks (TP 1 x DP 2) as rank 0 would write it through a bad afternoon, for the run
report's tests (tests/report/) and the fuzzer's seeds.

  steps 1-117, checkpoint 50 saved, checkpoint 100 failed with ENOSPC; the disk is still full
  when step 117's line is written, so only its first 61 bytes land (no newline), and the gang is
  restarted; the restart resumes from step 50, the last good checkpoint, appends its start
  record right after the torn bytes, reruns steps 51-200 (slower at first: a noisy neighbour),
  saves checkpoints 100, 150 and 200 and ends with "finished".

Deterministic (seeded). Keys in the writer's order (worker/step_log.cpp: "kind" first, phases by
name), separators compact, as nlohmann's dump() writes them.
Usage: make_steps_jsonl.py [OUT]   (default: tests/data/steps.jsonl beside this script)
"""
import json
import math
import os
import random
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "steps.jsonl")
rng = random.Random(1337)

TOKENS_PER_STEP = 8 * 64  # globalBatchSize 8 x seqLen 64
PREDICTED_STEP = 0.0214
PREDICTED_PHASES = {"compute": 0.0171, "tp_comm_total": 0.0, "tp_comm_exposed": 0.0,
                    "dp_comm_total": 0.0052, "dp_comm_exposed": 0.0031, "transfer_total": 0.0,
                    "transfer_exposed": 0.0, "optimizer_gpu": 0.0012, "optimizer_cpu_total": 0.0,
                    "optimizer_cpu_exposed": 0.0}
FLOOR = 3.1416  # the synthetic data's entropy, nats
START_LOSS = math.log(256)  # uniform over the tiny vocabulary


def line(record):
    for key in ("predicted_phase_seconds", "phase_seconds"):
        if key in record:
            record[key] = dict(sorted(record[key].items()))
    return json.dumps(record, separators=(",", ":"))


def start(t, resumed_from):
    return {"kind": "start", "time": t, "resumed_from": resumed_from, "total_steps": 200,
            "plan_hash": "9f3c2a71d04be5c8", "tp": 1, "dp": 2, "recompute": "none",
            "offload": "none", "precision": "fp32", "device": "cpu",
            "predicted_step_seconds": PREDICTED_STEP,
            "predicted_tokens_per_second": TOKENS_PER_STEP / PREDICTED_STEP,
            "predicted_phase_seconds": PREDICTED_PHASES, "loss_floor": FLOOR}


def step(t, n, slow):
    dp_total = 0.0061 * rng.uniform(0.9, 1.2) * slow
    dp_exposed = 0.0038 * rng.uniform(0.8, 1.2) * slow
    optimizer = 0.0013 * rng.uniform(0.95, 1.1)
    compute = 0.0183 * rng.uniform(0.95, 1.12) * slow
    seconds = compute + dp_exposed + optimizer
    loss = FLOOR + (START_LOSS - FLOOR) * math.exp(-n / 38.0) + rng.gauss(0, 0.03)
    return {"kind": "step", "time": t, "step": n, "loss": round(loss, 6),
            "seconds": round(seconds, 6), "tokens_per_second": round(TOKENS_PER_STEP / seconds, 2),
            "mfu": round(0.21 * PREDICTED_STEP / seconds, 4),
            "phase_seconds": {"compute": round(compute, 6), "tp_comm_total": 0.0,
                              "tp_comm_exposed": 0.0, "dp_comm_total": round(dp_total, 6),
                              "dp_comm_exposed": round(dp_exposed, 6),
                              "optimizer_gpu": round(optimizer, 6), "optimizer_cpu_total": 0.0}}


out = []
t = 1796180940.25  # 2026-12-02 03:09:00 UTC
out.append(line(start(t, 0)) + "\n")
t += 1.9  # planning, rendezvous
for n in range(1, 118):
    rec = step(t, n, 1.0)
    t += rec["seconds"] + 0.0004
    rec["time"] = round(t, 3)
    text = line(rec)
    if n == 117:
        out.append(text[:61])  # the disk is full: a short write, no newline
        break
    out.append(text + "\n")
    if n == 50:
        t += 0.31
        out.append(line({"kind": "checkpoint", "time": round(t, 3), "step": 50, "seconds": 0.31})
                   + "\n")
    if n == 100:
        t += 0.05
        out.append(line({"kind": "checkpoint_failed", "time": round(t, 3), "step": 100,
                         "reason": "ENOSPC"}) + "\n")
t += 14.6  # the failed pod, the gang restart, the new pods
out.append(line(start(round(t, 3), 50)) + "\n")
t += 1.7
for n in range(51, 201):
    rec = step(t, n, 1.6 if n < 80 else 1.0)
    t += rec["seconds"] + 0.0004
    rec["time"] = round(t, 3)
    out.append(line(rec) + "\n")
    if n % 50 == 0:
        t += 0.29 + rng.uniform(0, 0.05)
        out.append(line({"kind": "checkpoint", "time": round(t, 3), "step": n,
                         "seconds": round(0.29 + rng.uniform(0, 0.05), 3)}) + "\n")
t += 0.01
out.append(line({"kind": "end", "time": round(t, 3), "step": 200, "how": "finished"}) + "\n")

with open(OUT, "w") as f:
    f.write("".join(out))

#!/usr/bin/env python3
"""The chaos bench's figures from chaos.py's --results files (one JSON line per trial)."""
import json
import statistics
import sys

records = [json.loads(line) for path in sys.argv[1:] for line in open(path) if line.strip()]
if not records:
    sys.exit("no trials")
kills = {}
for r in records:
    for kind, n in r["kills"].items():
        kills[kind] = kills.get(kind, 0) + n
seconds = [r["seconds"] for r in records]
passed = sum(r["ok"] for r in records)
print(f"trials: {len(records)}, passed: {passed}, failed: {len(records) - passed}")
print("kills: " + ", ".join(f"{k} {n}" for k, n in kills.items()) + f" (total {sum(kills.values())})")
print(f"gang restarts: {sum(r['restarts'] or 0 for r in records)}, operator exits on their own "
      f"(lost lease): {sum(len(r['operator_exits']) for r in records)}, "
      f"watches opened by the recorder: {sum(r['watches'] for r in records)}, "
      f"relists: {sum(r['relists'] for r in records)}")
print(f"trial time: median {statistics.median(seconds):.1f} s, min {min(seconds):.1f} s, "
      f"max {max(seconds):.1f} s")
print("final losses: " + ", ".join(sorted({str(r['final_loss']) for r in records})))
for r in records:
    for f in r["failures"]:
        print(f"trial {r['trial']} (seed {r['seed']}): {f}")
sys.exit(0 if passed == len(records) else 1)

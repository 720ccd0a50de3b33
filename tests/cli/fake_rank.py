#!/usr/bin/env python3
"""A stand-in for `kubetrain-worker train` that `launch` runs in tests (KUBETRAIN_LAUNCH_CHILD):
it serves /metrics with a rank label like a real rank, prints what it was given, and fails,
hangs or stops as FAKE_RANK tells it.

FAKE_RANK (default "ok"):
  ok                exit 0 after FAKE_SECONDS (default 0.5)
  fail:R:C          rank R exits with code C after 0.5 s; the others wait for SIGTERM
  kill:R            rank R kills itself with SIGKILL after 0.5 s; the others wait for SIGTERM
  wait              wait for SIGTERM (then exit 143, like a rank that checkpointed)
  stubborn:R        like fail:R:3, but the other ranks ignore SIGTERM
"""
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import testlib  # noqa: E402  (tests/support/testlib.py)

rank = int(os.environ["RANK"])
mode = os.environ.get("FAKE_RANK", "ok").split(":")


METRICS = (
    "# HELP fake_steps_total Steps done.\n"
    "# TYPE fake_steps_total counter\n"
    f'fake_steps_total{{rank="{rank}"}} {10 + rank}\n'
    "# HELP fake_step_seconds Step time.\n"
    "# TYPE fake_step_seconds histogram\n"
    f'fake_step_seconds_bucket{{rank="{rank}",le="1"}} 1\n'
    f'fake_step_seconds_bucket{{rank="{rank}",le="+Inf"}} 1\n'
    f'fake_step_seconds_sum{{rank="{rank}"}} 0.5\n'
    f'fake_step_seconds_count{{rank="{rank}"}} 1\n'
)
server = testlib.metrics_server(lambda: METRICS)
threading.Thread(target=server.serve_forever, daemon=True).start()
print(f"metrics on http://127.0.0.1:{server.server_address[1]}/metrics", flush=True)
env = " ".join(f"{k}={os.environ.get(k)}" for k in
               ["RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK"])
print(f"env {env} args {' '.join(sys.argv[1:])}", flush=True)
print("a line on stderr", file=sys.stderr, flush=True)


def on_term(signum, frame):
    print("got SIGTERM", flush=True)
    sys.exit(143)


signal.signal(signal.SIGTERM, on_term)


def wait_forever():
    while True:
        time.sleep(0.1)


if mode[0] == "ok":
    time.sleep(float(os.environ.get("FAKE_SECONDS", "0.5")))
    sys.exit(0)
if mode[0] == "wait":
    wait_forever()
if mode[0] in ("fail", "stubborn"):
    victim = int(mode[1])
    if rank == victim:
        time.sleep(0.5)
        sys.exit(int(mode[2]) if mode[0] == "fail" else 3)
    if mode[0] == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    wait_forever()
if mode[0] == "kill":
    if rank == int(mode[1]):
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    wait_forever()

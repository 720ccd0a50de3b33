#!/usr/bin/env python3
"""Chaos test (docs/RELIABILITY.md "Chaos"): a TrainingJob through `kubetrain-operator` (2
replicas, leader election) and `kubetrain local serve --inject-faults RATE`, while processes are
SIGKILLed at random moments: a rank (`kubetrain-worker train`), the launcher (`kubetrain-worker
launch`), the operator that holds the lease (at a random moment, or 0-0.5 s after a rank kill,
while it restarts the gang) and the standby operator. Killed or exited operators are started again
after 1 s, as a Deployment would.

Each trial asserts:
  * the job ends Succeeded (within --trial-timeout), never Failed; status.restarts counts every
    failed pod seen (and no more than the worker kills);
  * its final loss equals an uninterrupted run's exactly: the final checkpoint's loss (written
    with round-trip precision), rank 0's termination message, its "done: ... final loss" line and
    the job's status.progress.loss;
  * every checkpoint is readable: each step directory passes an independent check (metadata,
    sizes, SHA-256, safetensors header) and the worker's own loader (`kubetrain-worker
    export-llmc` on it), and is bit-identical to the uninterrupted run's checkpoint of that step;
    the same steps are there;
  * never two pods of one rank at once: from a pod watch stream recorded during the run (a pod is
    alive from its first event until it is Succeeded, Failed or DELETED), and from the processes
    themselves (/proc sampled every 100 ms: at most one `train` process per RANK, one `launch`
    per NODE_RANK).

The uninterrupted run is the same job through the same path without kills or faults, once per
invocation. Trial i uses the seed (seed, i), so `--first-trial` reruns any trial alone.

  chaos.py --kubetrain build/bin/kubetrain --operator build/bin/kubetrain-operator \\
           --trials 3 --seed 1 [--fault-rate 0.05] [--results FILE] [--keep-failed DIR]

Exit status 0 when every trial passed. One JSON line per trial goes to --results (appended).
"""
import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from testlib import log  # noqa: E402  (tests/support/testlib.py)

JOB = "chaos"
NAMESPACE = "default"
LEASE = "chaos-lease"
JOB_LABEL = "kubetrain.dev/job-name"
RANK_LABEL = "kubetrain.dev/node-rank"
ATTEMPT_LABEL = "kubetrain.dev/restart-attempt"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def job_manifest(steps, interval, data_parallel):
    # keep: 1000 so that every checkpoint written stays for the check; backoffLimit high enough
    # for every kill a trial makes (each rank or launcher kill is a counted restart).
    return f"""apiVersion: kubetrain.dev/v1alpha1
kind: TrainingJob
metadata:
  name: {JOB}
spec:
  model:
    preset: tiny
  training:
    steps: {steps}
    globalBatchSize: 8
    learningRate: 6.0e-4
  data:
    source: synthetic
  parallelism:
    dataParallel: {data_parallel}
  checkpoint:
    intervalSteps: {interval}
    keep: 1000
  runPolicy:
    backoffLimit: 100
"""


# ---- the API, raw (so that a fault or a cut watch is seen as it is) -----------------------------

class Api:
    def __init__(self, url):
        self.url = url

    def call(self, method, path, body=None, content_type="application/json", deadline_s=30):
        """The JSON answer; retries 500, 429 and transport errors until deadline_s."""
        deadline = time.monotonic() + deadline_s
        while True:
            data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
            req = urllib.request.Request(self.url + path, data=data, method=method)
            if data is not None:
                req.add_header("Content-Type", content_type)
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    return json.loads(r.read() or b"null")
            except urllib.error.HTTPError as e:
                if e.code not in (429, 500, 503) or time.monotonic() > deadline:
                    raise
            except (urllib.error.URLError, ConnectionError, socket.timeout, OSError):
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.1)

    def get(self, path):
        try:
            return self.call("GET", path)
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise


def job_path():
    return f"/apis/kubetrain.dev/v1alpha1/namespaces/{NAMESPACE}/trainingjobs/{JOB}"


# ---- the pod watch recorder ---------------------------------------------------------------------

class PodRecorder(threading.Thread):
    """Records every pod event of the job from a raw watch, resuming from the last
    resourceVersion when the stream ends or is cut; a 410 relists (and records what changed)."""

    def __init__(self, api):
        super().__init__(daemon=True)
        self.api = api
        self.events = []  # (monotonic time, type, uid, name, rank, attempt, phase, relisted)
        self.known = {}   # uid -> last event
        self.stopping = threading.Event()
        self.watches = 0
        self.relists = 0
        self.rv = None

    def record(self, kind, pod, relisted=False):
        md = pod.get("metadata", {})
        labels = md.get("labels", {})
        ev = (time.monotonic(), kind, md.get("uid"), md.get("name"), labels.get(RANK_LABEL),
              labels.get(ATTEMPT_LABEL), pod.get("status", {}).get("phase", "Pending"), relisted)
        self.events.append(ev)
        if kind == "DELETED":
            self.known.pop(md.get("uid"), None)
        else:
            self.known[md.get("uid")] = ev

    def relist(self):
        listing = self.api.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={JOB_LABEL}%3D{JOB}")
        self.relists += 1
        present = {p["metadata"]["uid"]: p for p in listing["items"]}
        for uid, ev in list(self.known.items()):
            if uid not in present:
                self.record("DELETED", {"metadata": {"uid": uid, "name": ev[3],
                                                     "labels": {RANK_LABEL: ev[4], ATTEMPT_LABEL: ev[5]}},
                                        "status": {"phase": ev[6]}}, relisted=True)
        for p in present.values():
            self.record("MODIFIED" if p["metadata"]["uid"] in self.known else "ADDED", p, relisted=True)
        self.rv = listing["metadata"]["resourceVersion"]

    def run(self):
        while not self.stopping.is_set():
            try:
                if self.rv is None:
                    self.relist()
                self.watch_once()
            except Exception:
                time.sleep(0.1)

    def watch_once(self):
        path = (f"/api/v1/namespaces/{NAMESPACE}/pods?watch=1&allowWatchBookmarks=true"
                f"&labelSelector={JOB_LABEL}%3D{JOB}&resourceVersion={self.rv}&timeoutSeconds=60")
        try:
            r = urllib.request.urlopen(self.api.url + path, timeout=30)
        except urllib.error.HTTPError as e:
            if e.code == 410:
                self.rv = None
            time.sleep(0.05)
            return
        self.watches += 1
        with r:
            while not self.stopping.is_set():
                line = r.readline()  # a timeout or a cut stream raises: watch again
                if not line:
                    return
                ev = json.loads(line)
                obj = ev.get("object", {})
                if ev["type"] == "ERROR":
                    if obj.get("code") == 410:
                        self.rv = None
                    return
                self.rv = obj.get("metadata", {}).get("resourceVersion", self.rv)
                if ev["type"] != "BOOKMARK":
                    self.record(ev["type"], obj)

    def overlaps(self):
        """Pods of one node rank alive at the same time, in the stream's order."""
        alive = {}  # rank -> {uid: name}
        found = []
        for _, kind, uid, name, rank, attempt, phase, _ in self.events:
            pods = alive.setdefault(rank, {})
            if kind == "DELETED" or phase in ("Succeeded", "Failed"):
                pods.pop(uid, None)
                continue
            if uid not in pods and pods:
                found.append(f"rank {rank}: {name} (uid {uid}, attempt {attempt}) while "
                             f"{sorted(pods.values())} alive")
            pods[uid] = name
        return found


# ---- processes ----------------------------------------------------------------------------------

def read(path, mode="rb"):
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError:
        return None


def trial_processes(workdir):
    """kubetrain-worker processes under this trial's work dir: pid -> (sub, ppid, env)."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        cmdline = read(f"/proc/{name}/cmdline")
        if not cmdline:
            continue
        argv = cmdline.split(b"\0")
        if len(argv) < 2 or argv[1] not in (b"train", b"launch"):
            continue
        try:  # the launcher starts its ranks as /proc/self/exe
            if not os.readlink(f"/proc/{name}/exe").endswith("/kubetrain-worker"):
                continue
        except OSError:
            continue
        environ = read(f"/proc/{name}/environ") or b""
        env = dict(kv.split(b"=", 1) for kv in environ.split(b"\0") if b"=" in kv)
        if workdir.encode() not in cmdline and workdir.encode() not in env.get(b"KUBECONFIG", b""):
            continue
        stat = read(f"/proc/{name}/stat") or b""
        try:
            ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        except (ValueError, IndexError):
            continue
        found[int(name)] = (argv[1].decode(), ppid, {k.decode(): v.decode(errors="replace") for k, v in env.items()})
    return found


class ProcessSampler(threading.Thread):
    """At most one `train` process per RANK and one `launch` per NODE_RANK at any sample."""

    def __init__(self, workdir):
        super().__init__(daemon=True)
        self.workdir = workdir
        self.stopping = threading.Event()
        self.violations = []
        self.samples = 0

    def run(self):
        while not self.stopping.wait(0.1):
            procs = trial_processes(self.workdir)
            self.samples += 1
            by_key = {}
            for pid, (sub, ppid, env) in procs.items():
                # A launcher's child between fork and exec still looks like the launcher.
                if ppid in procs and procs[ppid][0] == sub:
                    continue
                key = (sub, env.get("RANK" if sub == "train" else "NODE_RANK", "?"))
                by_key.setdefault(key, []).append((pid, env.get("POD_NAME", "?")))
            for (sub, rank), pids in by_key.items():
                if len(pids) > 1:
                    # Confirm: both still there and still this trial's (not reused pids).
                    again = trial_processes(self.workdir)
                    still = [p for p in pids if p[0] in again]
                    if len(still) > 1:
                        self.violations.append(f"{len(still)} {sub} processes of rank {rank} at once: {still}")


# ---- checkpoints --------------------------------------------------------------------------------

def check_safetensors(path):
    """The reader's rules (docs/CHECKPOINTS.md): header in range, F32, tensors tile the data."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError("shorter than 8 bytes")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8 or n > 100_000_000:
            raise ValueError(f"header length {n} beyond the file ({size} bytes)")
        header = json.loads(f.read(n))
    spans = []
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            raise ValueError(f"{name}: dtype {t['dtype']}")
        numel = 1
        for d in t["shape"]:
            numel *= d
        b, e = t["data_offsets"]
        if e - b != 4 * numel:
            raise ValueError(f"{name}: offsets {b}..{e} for {numel} values")
        spans.append((b, e))
    spans.sort()
    at = 0
    for b, e in spans:
        if b != at:
            raise ValueError(f"tensors do not tile the data block at {at}")
        at = e
    if at != size - 8 - n:
        raise ValueError(f"data block is {size - 8 - n} bytes, tensors end at {at}")


def check_checkpoint(step_dir):
    """Independent of the worker's loader: {file: sha256} of a valid checkpoint, or raises."""
    meta = json.load(open(os.path.join(step_dir, "metadata.json")))
    if meta.get("format") != "kubetrain-checkpoint/v1":
        raise ValueError(f"format {meta.get('format')}")
    if f"step-{meta['step']:08d}" != os.path.basename(step_dir):
        raise ValueError(f"step {meta['step']} in {os.path.basename(step_dir)}")
    sums = {}
    for name, rec in meta["files"].items():
        path = os.path.join(step_dir, name)
        if os.path.getsize(path) != rec["bytes"]:
            raise ValueError(f"{name}: {os.path.getsize(path)} bytes, metadata.json records {rec['bytes']}")
        digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
        if digest != rec["checksum"]:
            raise ValueError(f"{name}: sha256 {digest}, metadata.json records {rec['checksum']}")
        check_safetensors(path)
        sums[name] = digest
    return {"loss": meta["loss"], "files": sums}


def checkpoints(root, worker, plan_path):
    """step -> {loss, files} for every step directory; errors as a list."""
    found, errors = {}, []
    if not os.path.isdir(root):
        return found, [f"no checkpoint directory {root}"]
    latest = (read(os.path.join(root, "latest"), "r") or "").strip()
    steps = sorted(d for d in os.listdir(root) if re.fullmatch(r"step-\d{8,}", d))
    if latest not in steps:
        errors.append(f"latest names {latest!r}, not one of {steps}")
    scratch = tempfile.mkdtemp(prefix="chaos-load-")
    try:
        for d in steps:
            try:
                found[int(d[5:])] = check_checkpoint(os.path.join(root, d))
            except Exception as e:
                errors.append(f"{d}: {e}")
                continue
            # The worker's own loader, on this checkpoint alone.
            alone = os.path.join(scratch, d)
            os.makedirs(alone)
            os.symlink(os.path.join(root, d), os.path.join(alone, d))
            with open(os.path.join(alone, "latest"), "w") as f:
                f.write(d + "\n")
            r = subprocess.run([worker, "export-llmc", "--plan", plan_path, "--checkpoint-dir", alone,
                                "--out", os.path.join(alone, "model.bin")],
                               capture_output=True, text=True, timeout=60)
            if r.returncode != 0 or "corrupt" in r.stderr:
                errors.append(f"{d}: the worker's loader: rc {r.returncode}: {r.stderr.strip()[-300:]}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return found, errors


# ---- one run of the job -------------------------------------------------------------------------

class Cluster:
    """local serve + 2 operators (restarted when they exit) in a fresh work dir."""

    def __init__(self, args, workdir, fault_rate, fault_seed):
        self.args = args
        self.workdir = workdir
        self.kubeconfig = os.path.join(workdir, "kubeconfig")
        self.procs = []
        self.serve = self.spawn("serve", [args.kubetrain, "local", "serve", "--kubeconfig-out", self.kubeconfig,
                                          "--workdir", os.path.join(workdir, "work"),
                                          "--inject-faults", str(fault_rate), "--fault-seed", str(fault_seed)])
        deadline = time.monotonic() + 20
        while not (os.path.exists(self.kubeconfig) and os.path.getsize(self.kubeconfig) > 0):
            if time.monotonic() > deadline or self.serve.poll() is not None:
                raise RuntimeError("local serve wrote no kubeconfig")
            time.sleep(0.1)
        url = re.search(r"server: (\S+)", open(self.kubeconfig).read()).group(1)
        self.api = Api(url)
        self.kubectl("apply", "-f", args.crd)
        self.operators = [None, None]
        self.operator_starts = 0
        self.operator_exits = []  # exit codes of operators that ended by themselves
        self.killed_pids = set()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        for slot in (0, 1):
            self.start_operator(slot)
        self.supervisor = threading.Thread(target=self.supervise, daemon=True)
        self.supervisor.start()

    def spawn(self, name, argv):
        out = open(os.path.join(self.workdir, name + ".log"), "ab")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs.append(p)
        return p

    def kubectl(self, *argv, stdin=None, tries=30):
        for _ in range(tries):
            r = subprocess.run(["kubectl", "--kubeconfig", self.kubeconfig, "--request-timeout=20s", *argv],
                               input=stdin, capture_output=True, text=True, timeout=60)
            if r.returncode == 0:
                return r.stdout
            time.sleep(0.3)  # an injected 500 or 429
        raise RuntimeError(f"kubectl {' '.join(argv)}: {r.stderr.strip()}")

    def start_operator(self, slot):
        self.operators[slot] = self.spawn(f"operator-{slot}", [
            self.args.operator, "--kubeconfig", self.kubeconfig, "--leader-elect",
            "--leader-election-namespace", NAMESPACE, "--leader-election-id", LEASE,
            "--metrics-bind-address", "127.0.0.1:0", "--health-probe-bind-address", "127.0.0.1:0"])
        self.operator_starts += 1

    def supervise(self):
        """A Deployment's part: an operator that ended is replaced after 1 s."""
        while not self.stopping.wait(0.2):
            with self.lock:
                for slot, p in enumerate(self.operators):
                    if p.poll() is None:
                        continue
                    if p.pid not in self.killed_pids:
                        self.operator_exits.append(p.returncode)
                    if not hasattr(p, "ended_at"):
                        p.ended_at = time.monotonic()
                    elif time.monotonic() - p.ended_at >= 1.0:
                        self.start_operator(slot)

    def leader_pid(self):
        lease = self.api.get(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEASE}")
        holder = (lease or {}).get("spec", {}).get("holderIdentity", "")
        pid = holder.rsplit("_", 1)[-1]
        with self.lock:
            for p in self.operators:
                if str(p.pid) == pid and p.poll() is None:
                    return p.pid
        return None

    def standby_pid(self):
        leader = self.leader_pid()
        with self.lock:
            for p in self.operators:
                if p.poll() is None and p.pid != leader:
                    return p.pid
        return None

    def kill_operator(self, pid):
        with self.lock:
            self.killed_pids.add(pid)
            os.kill(pid, signal.SIGKILL)

    def job(self):
        return self.api.get(job_path())

    def stop(self):
        self.stopping.set()
        self.supervisor.join(timeout=5)
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def checkpoint_root(self):
        """The local node's directory of the job's checkpoint claim (pvc-<uid>; before, pvc-<name>)."""
        claim = self.api.get(f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims/{JOB}-checkpoints") or {}
        volumes = os.path.join(self.workdir, "work", "volumes")
        for name in (f"pvc-{claim.get('metadata', {}).get('uid')}", f"pvc-{JOB}-checkpoints"):
            if os.path.isdir(os.path.join(volumes, name)):
                return os.path.join(volumes, name)
        return os.path.join(volumes, f"pvc-{JOB}-checkpoints")

    def plan_file(self):
        cm = self.api.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/{JOB}-plan")
        path = os.path.join(self.workdir, "plan.json")
        with open(path, "w") as f:
            f.write(cm["data"]["plan.json"])
        return path, json.loads(cm["data"]["plan.json"]).get("planHash")

    def worker_logs(self):
        pods = os.path.join(self.workdir, "work", "pods")
        text = ""
        for d in sorted(os.listdir(pods)) if os.path.isdir(pods) else []:
            if d.startswith(f"{NAMESPACE}_{JOB}-worker-0"):
                text += read(os.path.join(pods, d, "log"), "r") or ""
        return text


def outcome(cluster, args):
    """What a finished run left: the figures the trials are compared on."""
    job = cluster.job()
    plan_path, plan_hash = cluster.plan_file()
    found, errors = checkpoints(cluster.checkpoint_root(), args.worker, plan_path)
    pod = cluster.api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{JOB}-worker-0") or {}
    message = ""
    for cs in pod.get("status", {}).get("containerStatuses", []):
        message = cs.get("state", {}).get("terminated", {}).get("message", "")
    termination_loss = re.search(r"^kubetrain_worker_loss (\S+)$", message, re.M)
    done = re.findall(r"^(?:\[rank 0\] )?done: (\d+) steps, final loss (\S+)$", cluster.worker_logs(), re.M)
    status = job.get("status", {})
    return {
        "phase": status.get("phase"),
        "restarts": status.get("restarts", 0),
        "status_loss": status.get("progress", {}).get("loss"),
        "termination_loss": termination_loss.group(1) if termination_loss else None,
        "done_line": list(done[-1]) if done else None,
        "plan_hash": plan_hash,
        "checkpoints": found,
        "checkpoint_errors": errors,
    }


def wait_finished(cluster, timeout_s):
    deadline = time.monotonic() + timeout_s
    phases = set()
    while time.monotonic() < deadline:
        try:
            job = cluster.job()
        except Exception:
            job = None
        phase = (job or {}).get("status", {}).get("phase")
        phases.add(phase)
        if phase in ("Succeeded", "Failed"):
            return phase, phases
        time.sleep(0.25)
    return None, phases


def baseline(args, root):
    workdir = os.path.join(root, "baseline")
    os.makedirs(workdir)
    log("baseline: the job without kills or faults")
    cluster = Cluster(args, workdir, 0, 0)
    started = time.monotonic()
    try:
        cluster.kubectl("apply", "-f", "-", stdin=job_manifest(args.steps, args.interval, args.data_parallel))
        phase, _ = wait_finished(cluster, args.trial_timeout)
        if phase != "Succeeded":
            raise RuntimeError(f"the uninterrupted run ended {phase}; see {workdir}")
        base = outcome(cluster, args)
    finally:
        cluster.stop()
    missing = [k for k in ("status_loss", "termination_loss", "done_line", "plan_hash") if base[k] is None]
    if missing or not base["checkpoints"]:
        raise RuntimeError(f"the uninterrupted run left no {missing or 'checkpoints'}; see {workdir}")
    if base["checkpoint_errors"]:
        raise RuntimeError(f"the uninterrupted run's checkpoints: {base['checkpoint_errors']}")
    log(f"baseline: {time.monotonic() - started:.1f} s, final loss {base['done_line']} "
        f"(status {base['status_loss']}, termination message {base['termination_loss']}), "
        f"{len(base['checkpoints'])} checkpoints, plan {base['plan_hash']}")
    return base


KINDS = ["rank", "launcher", "leader", "leader-mid-reconcile", "standby"]


def chaos(cluster, rng, kills, stop, errors):
    """Makes 2-4 chaos events at random moments while the job runs, at least one of them a kill
    of a rank or the launcher."""
    plan = [rng.choice(KINDS) for _ in range(rng.randint(2, 4))]
    if not any(k in ("rank", "launcher", "leader-mid-reconcile") for k in plan):
        plan[0] = rng.choice(["rank", "launcher", "leader-mid-reconcile"])
    for kind in plan:
        if stop.wait(rng.uniform(0.5, 3.0)):
            return
        try:
            chaos_event(cluster, rng, kills, stop, kind)
        except Exception as e:  # an API fault while looking for the leader: next event
            errors.append(f"{kind}: {type(e).__name__}: {e}")


def chaos_event(cluster, rng, kills, stop, kind):
    workdir = cluster.workdir
    if kind in ("rank", "launcher", "leader-mid-reconcile"):
        sub = "launch" if kind == "launcher" else "train"
        deadline = time.monotonic() + 30
        targets = []
        while not stop.is_set() and time.monotonic() < deadline:
            procs = trial_processes(workdir)
            targets = [pid for pid, (s, ppid, _) in procs.items()
                       if s == sub and not (ppid in procs and procs[ppid][0] == s)]
            if targets:
                break
            time.sleep(0.1)
        if not targets:
            return
        # A random moment of the rank's life, not just its start.
        if stop.wait(rng.uniform(0, 1.5)):
            return
        pid = rng.choice(targets)
        if pid not in trial_processes(workdir):
            return
        os.kill(pid, signal.SIGKILL)
        kills[kind if kind != "leader-mid-reconcile" else "rank"] += 1
        if kind == "leader-mid-reconcile":
            # The leader is now seeing the pod fail and restarting the gang.
            time.sleep(rng.uniform(0, 0.5))
            leader = cluster.leader_pid()
            if leader:
                cluster.kill_operator(leader)
                kills["leader-mid-reconcile"] += 1
    else:
        pid = cluster.leader_pid() if kind == "leader" else cluster.standby_pid()
        if pid:
            cluster.kill_operator(pid)
            kills[kind] += 1


def trial(args, root, index, base):
    seed = args.seed * 1_000_003 + index
    rng = random.Random(seed)
    workdir = os.path.join(root, f"trial-{index}")
    os.makedirs(workdir)
    kills = {k: 0 for k in KINDS}
    failures = []
    started = time.monotonic()
    cluster = Cluster(args, workdir, args.fault_rate, seed)
    recorder = PodRecorder(cluster.api)
    sampler = ProcessSampler(workdir)
    stop_chaos = threading.Event()
    chaos_errors = []
    result = {}
    try:
        recorder.start()
        sampler.start()
        cluster.kubectl("apply", "-f", "-", stdin=job_manifest(args.steps, args.interval, args.data_parallel))
        chaos_thread = threading.Thread(target=chaos, args=(cluster, rng, kills, stop_chaos, chaos_errors),
                                        daemon=True)
        chaos_thread.start()
        phase, phases = wait_finished(cluster, args.trial_timeout)
        stop_chaos.set()
        chaos_thread.join(timeout=40)
        time.sleep(0.5)  # the last pod events reach the recorder
        if phase != "Succeeded":
            conditions = [(c.get("type"), c.get("status"), c.get("reason"), c.get("message"))
                          for c in ((cluster.job() or {}).get("status", {}).get("conditions", []))]
            failures.append(f"the job did not succeed within {args.trial_timeout} s: phase {phase}, "
                            f"conditions {conditions}")
        if "Failed" in phases:
            failures.append("the job was Failed at some point")
        result = outcome(cluster, args)
    except Exception as e:
        failures.append(f"harness: {type(e).__name__}: {e}")
    finally:
        stop_chaos.set()
        recorder.stopping.set()
        sampler.stopping.set()
        sampler.join(timeout=5)
        cluster.stop()
    seconds = time.monotonic() - started

    if result:
        for key in ("status_loss", "termination_loss", "done_line", "plan_hash"):
            if result[key] != base[key]:
                failures.append(f"{key}: {result[key]!r}, uninterrupted {base[key]!r}")
        failures += [f"checkpoint {e}" for e in result["checkpoint_errors"]]
        got, want = result["checkpoints"], base["checkpoints"]
        if sorted(got) != sorted(want):
            failures.append(f"checkpoint steps {sorted(got)}, uninterrupted {sorted(want)}")
        for step in sorted(set(got) & set(want)):
            if got[step] != want[step]:
                failures.append(f"checkpoint step {step} differs from the uninterrupted run's: "
                                f"{got[step]} vs {want[step]}")
        # Each worker kill fails at most one pod (two kills can land in one pod's last moments);
        # each failed pod is one counted restart (status.restarts must not lose any).
        failed = {ev[2] for ev in recorder.events if ev[6] == "Failed"}
        worker_kills = kills["rank"] + kills["launcher"]
        if not len(failed) <= (result["restarts"] or 0) <= worker_kills:
            failures.append(f"status.restarts {result['restarts']}: {len(failed)} failed pods seen, "
                            f"{worker_kills} worker kills")
    failures += [f"watch: {o}" for o in recorder.overlaps()]
    failures += [f"processes: {v}" for v in sampler.violations]
    ok = not failures
    record = {"trial": index, "seed": seed, "ok": ok, "seconds": round(seconds, 1), "kills": kills,
              "restarts": result.get("restarts"), "operator_starts": cluster.operator_starts,
              "operator_exits": cluster.operator_exits, "pod_events": len(recorder.events),
              "watches": recorder.watches, "relists": recorder.relists,
              "process_samples": sampler.samples, "chaos_errors": chaos_errors, "final_loss": (result.get("done_line") or [None, None])[1],
              "failures": failures}
    log(f"trial {index}: {'ok' if ok else 'FAILED'} in {seconds:.1f} s, kills {kills}, "
        f"restarts {record['restarts']}, operator exits {cluster.operator_exits}, "
        f"{recorder.watches} watches / {recorder.relists} lists")
    for f in failures:
        log("  FAIL:", f)
    if not ok and args.keep_failed:
        dest = os.path.join(args.keep_failed, f"trial-{index}-seed-{seed}")
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(workdir, dest, symlinks=True, ignore_dangling_symlinks=True)
        log(f"  kept in {dest}")
    shutil.rmtree(workdir, ignore_errors=True)
    return record


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kubetrain", required=True)
    p.add_argument("--operator", required=True)
    p.add_argument("--worker", help="kubetrain-worker (default: next to --kubetrain)")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--first-trial", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--fault-rate", type=float, default=0.05, help="local serve --inject-faults")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--interval", type=int, default=20, help="checkpoint intervalSteps")
    p.add_argument("--data-parallel", type=int, default=2, help="ranks (one launcher)")
    p.add_argument("--trial-timeout", type=float, default=180)
    p.add_argument("--crd", default=os.path.join(REPO, "crds/trainingjobs.kubetrain.dev.yaml"))
    p.add_argument("--baseline-cache", help="the uninterrupted run's figures: read from here if "
                   "there (same job parameters), else measured and written")
    p.add_argument("--results", help="append one JSON line per trial here")
    p.add_argument("--keep-failed", help="copy a failed trial's work dir here")
    args = p.parse_args()
    args.kubetrain = os.path.abspath(args.kubetrain)
    args.operator = os.path.abspath(args.operator)
    args.worker = os.path.abspath(args.worker or os.path.join(os.path.dirname(args.kubetrain), "kubetrain-worker"))
    if shutil.which("kubectl") is None:
        print("kubectl not installed: skipped")
        return 77
    root = tempfile.mkdtemp(prefix="kt-chaos-")
    try:
        key = {"steps": args.steps, "interval": args.interval, "data_parallel": args.data_parallel}
        base = None
        if args.baseline_cache and os.path.exists(args.baseline_cache):
            cached = json.load(open(args.baseline_cache))
            if cached.get("key") == key:
                base = cached["baseline"]
                base["checkpoints"] = {int(k): v for k, v in base["checkpoints"].items()}
                log(f"baseline from {args.baseline_cache}: final loss {base['done_line']}")
        if base is None:
            base = baseline(args, root)
            if args.baseline_cache:
                with open(args.baseline_cache, "w") as f:
                    json.dump({"key": key, "baseline": base}, f)
        records = []
        for i in range(args.first_trial, args.first_trial + args.trials):
            records.append(trial(args, root, i, base))
            if args.results:
                with open(args.results, "a") as f:
                    f.write(json.dumps(records[-1]) + "\n")
        passed = sum(r["ok"] for r in records)
        log(f"chaos: {passed}/{len(records)} trials passed")
        return 0 if passed == len(records) else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The shipped dashboards and alert rules against a real Prometheus scraping a real run: every
dashboard query must return data and every rule must load and evaluate (docs/METRICS.md, "Tested
against a real Prometheus").

What runs, all on 127.0.0.1 in a fresh temporary directory:
  * `kubetrain local serve` (the API server and the local node whose pods are processes);
  * `kubetrain-operator` with its /metrics;
  * a TrainingJob of the tiny preset with 2 data-parallel ranks (one worker pod, its launcher
    merging both ranks' /metrics) that checkpoints every few steps;
  * a stand-in for NVIDIA's dcgm-exporter (this file) serving DCGM_FI_DEV_GPU_UTIL,
    DCGM_FI_DEV_FB_USED and DCGM_FI_PROF_PIPE_TENSOR_ACTIVE with the labels its Kubernetes pod
    mapping gives (gpu, UUID, device, modelName, Hostname, pod, namespace, container), for the
    job's pods as the API lists them;
  * /usr/bin/prometheus with a generated configuration: scrape_interval 1s, the three targets
    with the target labels a stock kube-prometheus-stack produces for them (the chart's
    PodMonitor for the workers and its ServiceMonitor for the operator, both honorLabels true; the
    dcgm-exporter chart's ServiceMonitor, honorLabels false as it ships), dashboards/alerts.yaml
    as its rule file, evaluated every second.

Once every target has been scraped for a while (rate windows hold several samples) and a
checkpoint has been saved, one evaluation time T is fixed and, at T:
  * every templating variable of every dashboard/*.json is resolved through Prometheus'
    HTTP API the way Grafana does (label_values(metric, label) → /api/v1/series,
    label_values(label) → /api/v1/label/<label>/values, query_result(q) → /api/v1/query); the
    run's namespace and TrainingJob must be among the values offered;
  * every target of every panel (rows' nested panels included) is queried with the variables,
    Grafana's built-ins ($__rate_interval, $__interval, $__range … = 10s) substituted, and must
    return at least one series: a target that returns none is a panel line showing "No data";
  * every alert rule of dashboards/alerts.yaml is loaded (/api/v1/rules lists each, health
    "ok" after evaluations) and its expression evaluates without error.
A table of panel → series per target is printed; the test fails listing every empty target and
every failing variable or rule. Processes are stopped at exit, whatever the outcome.

  prometheus_test.py --kubetrain build/bin/kubetrain --operator build/bin/kubetrain-operator
"""
import argparse
import glob
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from testlib import free_port, log, metrics_server  # noqa: E402  (tests/support/testlib.py)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB = "dash"
NAMESPACE = "default"
JOB_LABEL = "kubetrain.dev/job-name"
# What Grafana's built-in interval variables become: with a 1 s scrape interval a 10 s window
# holds about 10 samples (rate needs 2).
WINDOW = "10s"
WINDOW_SECONDS = 10
# The ServiceMonitor of NVIDIA's dcgm-exporter chart and of the GPU Operator
# (dcgmExporter.serviceMonitor.honorLabels) default to honorLabels: false, so the pod, namespace
# and container of the GPU's pod arrive as exported_pod, exported_namespace, exported_container
# (the target's own are the exporter's).
DCGM_HONOR_LABELS = False


def request(method, url, body=None, content_type=None, timeout=10):
    req = urllib.request.Request(url, data=body, method=method)
    if content_type:
        req.add_header("Content-Type", content_type)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


def write_json(path, value):
    with open(path + ".tmp", "w") as f:
        json.dump(value, f)
    os.replace(path + ".tmp", path)  # file_sd must never read a half-written file


def wait_until(what, seconds, probe, interval=0.25):
    """probe() until it returns something truthy; raises with `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    last = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value:
                return value
        except Exception as e:  # not up yet
            last = e
        time.sleep(interval)
    raise RuntimeError(f"timed out after {seconds} s waiting for {what}" + (f" (last error: {last})" if last else ""))


def job_manifest(steps, interval):
    return f"""apiVersion: kubetrain.dev/v1alpha1
kind: TrainingJob
metadata:
  name: {JOB}
  namespace: {NAMESPACE}
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
    dataParallel: 2
  checkpoint:
    intervalSteps: {interval}
"""


# ---- the processes ------------------------------------------------------------------------------

class Processes:
    """Everything this test starts; stop() ends each by its pid (SIGTERM, then SIGKILL)."""

    def __init__(self, workdir):
        self.workdir = workdir
        self.procs = []

    def spawn(self, name, argv):
        out = open(os.path.join(self.workdir, name + ".log"), "ab")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        p.name = name
        self.procs.append(p)
        return p

    def log_of(self, name):
        try:
            with open(os.path.join(self.workdir, name + ".log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class Api:
    def __init__(self, url):
        self.url = url

    def get(self, path):
        return json.loads(request("GET", self.url + path))

    def apply_yaml(self, path, text):
        """Server-side apply (what `kubectl apply --server-side` sends)."""
        return request("PATCH", self.url + path + "?fieldManager=prometheus-test&force=true", text.encode(),
                    "application/apply-patch+yaml")

    def job_pods(self):
        sel = urllib.parse.quote(f"{JOB_LABEL}={JOB}")
        return self.get(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={sel}")["items"]


# ---- the stand-in dcgm-exporter -----------------------------------------------------------------

class DcgmExporter(threading.Thread):
    """Serves /metrics like dcgm-exporter with DCGM_EXPORTER_KUBERNETES=true on a node with one
    GPU per rank of each running job pod: the GPU's labels plus pod, namespace and container of the
    pod the GPU is assigned to (the pods are read from the API on every scrape)."""

    GPUS_PER_POD = 2
    FIELDS = [("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", lambda g, t: 90 + 5 * math.sin(t + g)),
              ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", lambda g, t: 61440 + 128 * g),
              ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active.",
               lambda g, t: 0.4 + 0.05 * math.cos(t + g))]

    def __init__(self, api):
        super().__init__(daemon=True)
        self.api = api
        self.server = metrics_server(self.exposition)
        self.port = self.server.server_address[1]

    def run(self):
        self.server.serve_forever(poll_interval=0.2)

    def exposition(self):
        gpus = []
        for pod in self.api.job_pods():
            if pod.get("status", {}).get("phase") != "Running":
                continue
            md, spec = pod["metadata"], pod["spec"]
            for _ in range(self.GPUS_PER_POD):
                g = len(gpus)
                gpus.append({"gpu": str(g), "UUID": f"GPU-5f0c9a3e-0000-4000-8000-{g:012d}",
                             "device": f"nvidia{g}", "modelName": "NVIDIA H100 80GB HBM3",
                             "Hostname": spec.get("nodeName", ""), "container": spec["containers"][0]["name"],
                             "namespace": md["namespace"], "pod": md["name"]})
        now = time.time()
        lines = []
        for name, kind, help_text, value in self.FIELDS:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            for g in gpus:
                labels = ",".join(f'{k}="{v}"' for k, v in g.items())
                lines.append(f"{name}{{{labels}}} {value(int(g['gpu']), now):.6g}")
        return "\n".join(lines) + "\n"


# ---- Prometheus ---------------------------------------------------------------------------------

def prometheus_config(rules, workers_file, operator, dcgm, node):
    """The targets with the labels the Prometheus Operator's relabelling gives them. The worker
    pods are discovered (file_sd, as a PodMonitor discovers them) once they run."""
    def scrape(job, honor, targets):
        return (f"  - job_name: \"{job}\"\n    honor_labels: {'true' if honor else 'false'}\n"
                f"    metrics_path: /metrics\n" + targets)

    def static(address, labels):
        label_lines = "".join(f"          {k}: \"{v}\"\n" for k, v in labels.items())
        return f"    static_configs:\n      - targets: [\"{address}\"]\n        labels:\n{label_lines}"
    return (
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
        f"rule_files:\n  - \"{rules}\"\nscrape_configs:\n"
        # The chart's PodMonitor (charts/kubetrain/templates/podmonitor.yaml): job is
        # <namespace>/<podmonitor>, honorLabels true.
        + scrape("monitoring/kubetrain-workers", True,
                 f"    file_sd_configs:\n      - files: [\"{workers_file}\"]\n        refresh_interval: 1s\n")
        # The chart's ServiceMonitor (charts/kubetrain/templates/servicemonitor.yaml): job is
        # the Service's name, honorLabels true (the per-TrainingJob series keep their namespace).
        + scrape("kubetrain-operator-metrics", True, static(operator, {
            "namespace": "kubetrain-system", "pod": "kubetrain-operator-5d9c7b8f6-x2x7q", "container": "operator",
            "service": "kubetrain-operator-metrics", "endpoint": "metrics"}))
        # dcgm-exporter's chart (and the GPU Operator's) ServiceMonitor, as they ship.
        + scrape("nvidia-dcgm-exporter", DCGM_HONOR_LABELS, static(dcgm, {
            "namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-7kq2p", "container": "nvidia-dcgm-exporter",
            "service": "nvidia-dcgm-exporter", "endpoint": "gpu-metrics", "node": node}))
    )


def write_worker_targets(path, pod):
    """A worker pod as a PodMonitor's target: podIP and its metrics port (on the local node, the
    port local serve moved --metrics-port to, in the pod's annotation: how the operator's
    controller.cpp progress() finds it), with the pod's namespace, name and container."""
    address = f"{pod['status']['podIP']}:{pod['metadata']['annotations']['kubetrain.dev/metrics-port']}"
    labels = {"namespace": pod["metadata"]["namespace"], "pod": pod["metadata"]["name"],
              "container": pod["spec"]["containers"][0]["name"], "endpoint": "metrics"}
    write_json(path, [{"targets": [address], "labels": labels}])
    return address


class Prometheus:
    def __init__(self, url):
        self.url = url

    def api(self, path, **params):
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            body = request("GET", f"{self.url}/api/v1/{path}" + (f"?{query}" if query else ""), timeout=30)
        except urllib.error.HTTPError as e:  # 400/422: the answer carries the error
            body = e.read()
        answer = json.loads(body)
        if answer.get("status") != "success":
            raise PromError(f"{answer.get('errorType')}: {answer.get('error')}")
        return answer["data"]

    def query(self, expr, at):
        return self.api("query", query=expr, time=f"{at:.3f}")

    def value(self, expr, at=None):
        data = self.query(expr, time.time() if at is None else at)
        if data["resultType"] == "vector" and data["result"]:
            return float(data["result"][0]["value"][1])
        if data["resultType"] == "scalar":
            return float(data["result"][1])
        return None


class PromError(Exception):
    pass


# ---- dashboards ---------------------------------------------------------------------------------

BUILTINS = {"__interval": WINDOW, "__rate_interval": WINDOW, "__range": WINDOW,
            "__interval_ms": str(WINDOW_SECONDS * 1000), "__range_s": str(WINDOW_SECONDS),
            "__range_ms": str(WINDOW_SECONDS * 1000)}
VARIABLE = re.compile(r"\$\{(\w+)(?::(\w+))?\}|\[\[(\w+)\]\]|\$(\w+)")


def substitute(expr, values, at):
    """Grafana's interpolation for the Prometheus datasource: a single value as it is, several
    (multi or All) as a regex alternation of the escaped values, unless allValue is set."""
    builtins = dict(BUILTINS, __from=str(int((at - WINDOW_SECONDS) * 1000)), __to=str(int(at * 1000)))
    unknown = []

    def one(m):
        name = m.group(1) or m.group(3) or m.group(4)
        fmt = m.group(2)
        if name in builtins:
            return builtins[name]
        if name not in values:
            unknown.append(name)
            return m.group(0)
        v = values[name]
        if isinstance(v, str):
            return v
        if fmt in ("csv",):
            return ",".join(v)
        if fmt in ("pipe",):
            return "|".join(v)
        escaped = [re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\1", x) for x in v]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"

    return VARIABLE.sub(one, expr), unknown


def all_panels(panels):
    for p in panels:
        yield p
        yield from all_panels(p.get("panels", []))  # a collapsed row holds its panels


def variable_query(v):
    q = v.get("query", "")
    return q.get("query", "") if isinstance(q, dict) else q


def resolve_variables(prom, dashboard, at, run_values, problems, where):
    """Variable name → the value Grafana would substitute (a str, or a list for multi/All)."""
    values = {}
    for v in dashboard.get("templating", {}).get("list", []):
        name, kind = v.get("name"), v.get("type")
        if kind == "datasource":
            values[name] = "prometheus"
            continue
        if kind in ("constant", "textbox", "custom", "interval"):
            current = (v.get("current") or {}).get("value") or v.get("query", "")
            values[name] = current if isinstance(current, str) else list(current)
            continue
        if kind != "query":
            problems.append(f"{where}: variable {name}: type {kind} not supported by this test")
            continue
        raw = variable_query(v)
        q, unknown = substitute(raw, values, at)
        if unknown:
            problems.append(f"{where}: variable {name}: unknown variables {unknown} in {raw}")
            continue
        try:
            options = variable_options(prom, q, at)
        except PromError as e:
            problems.append(f"{where}: variable {name}: {q}: {e}")
            continue
        if v.get("regex"):
            options = [o for o in options if re.search(v["regex"], o)]
        print(f"  variable {name}: {q} → {options}")
        if not options:
            problems.append(f"{where}: variable {name} offers no values: {q}")
            continue
        if name in run_values:
            if run_values[name] not in options:
                problems.append(f"{where}: variable {name} does not offer the run's {run_values[name]!r}: {options}")
                continue
            values[name] = run_values[name]
        elif v.get("includeAll"):
            values[name] = v["allValue"] if v.get("allValue") else sorted(options)
        else:
            values[name] = sorted(options)[0]
    return values


def variable_options(prom, q, at):
    q = q.strip()
    m = re.fullmatch(r"label_values\(\s*(.+?)\s*,\s*(\w+)\s*\)", q, re.S)
    if m:
        series = prom.api("series", **{"match[]": m.group(1), "start": f"{at - 60:.3f}", "end": f"{at:.3f}"})
        return sorted({s[m.group(2)] for s in series if m.group(2) in s})
    m = re.fullmatch(r"label_values\(\s*(\w+)\s*\)", q)
    if m:
        return sorted(prom.api(f"label/{m.group(1)}/values", start=f"{at - 60:.3f}", end=f"{at:.3f}"))
    m = re.fullmatch(r"query_result\((.+)\)", q, re.S)
    if m:
        data = prom.query(m.group(1), at)
        return [json.dumps(r["metric"]) for r in data["result"]] if data["resultType"] == "vector" else []
    raise PromError(f"not a variable query this test knows (label_values, query_result): {q}")


def series_count(data):
    if data["resultType"] in ("vector", "matrix"):
        return len(data["result"])
    return 1  # scalar or string: one value


def first_value(data):
    """The first series' value as Grafana would show it (NaN shows as NaN, not "No data")."""
    if data["resultType"] == "vector" and data["result"]:
        return data["result"][0]["value"][1]
    if data["resultType"] == "scalar":
        return data["result"][1]
    return ""


def check_dashboards(prom, at, run_values):
    problems, rows = [], []
    for path in sorted(glob.glob(os.path.join(REPO, "dashboards", "*.json"))):
        name = os.path.basename(path)
        with open(path) as f:
            dashboard = json.load(f)
        print(f"{name} ({dashboard.get('title')}):")
        values = resolve_variables(prom, dashboard, at, run_values, problems, name)
        for panel in all_panels(dashboard.get("panels", [])):
            if panel.get("type") == "row":
                continue
            title = panel.get("title", f"panel {panel.get('id')}")
            targets = panel.get("targets", [])
            if not targets:
                problems.append(f"{name} / {title}: no targets")
            for t in targets:
                raw = t.get("expr", "")
                where = f"{name} / {title} / {t.get('refId', '?')}"
                expr, unknown = substitute(raw, values, at)
                if unknown:
                    problems.append(f"{where}: unknown variables {unknown}: {raw}")
                    rows.append((name, title, t.get("refId", "?"), "?", ""))
                    continue
                try:
                    data = prom.query(expr, at)
                    n = series_count(data)
                except PromError as e:
                    problems.append(f"{where}: error: {e}\n      {expr}")
                    rows.append((name, title, t.get("refId", "?"), "error", ""))
                    continue
                rows.append((name, title, t.get("refId", "?"), n, first_value(data)))
                if n == 0:
                    problems.append(f"{where}: no data\n      {expr}\n" + diagnose(prom, expr, at))
    return rows, problems


def metric_names(expr):
    """The metric names an expression selects: identifiers outside strings, label matchers,
    ranges and by/on/... clauses that are neither functions nor keywords."""
    e = re.sub(r'"(\\.|[^"\\])*"', '""', expr)
    e = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    keywords = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
                "bool", "offset", "Inf", "NaN", "inf", "nan"}
    return sorted({m.group(1) for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", e)
                   if not m.group(2) and m.group(1) not in keywords})


def diagnose(prom, expr, at):
    """For an empty query: what Prometheus holds of each metric it names, so that a missing
    series can be told from a selector that does not match it."""
    lines = []
    for metric in metric_names(expr):
        series = prom.api("series", **{"match[]": metric, "start": f"{at - 60:.3f}", "end": f"{at:.3f}"})
        if not series:
            lines.append(f"      {metric}: no series at all")
            continue
        shown = [",".join(f'{k}="{v}"' for k, v in sorted(s.items()) if k != "__name__") for s in series[:2]]
        lines.append(f"      {metric}: {len(series)} series, e.g. " + "; ".join("{" + x + "}" for x in shown))
    return "\n".join(lines)


# ---- alerts -------------------------------------------------------------------------------------

def alert_names(path):
    """The alert names of a rules file (read without a YAML library: `- alert: Name` lines)."""
    with open(path) as f:
        return re.findall(r"^\s*-\s*alert:\s*[\"']?([A-Za-z0-9_:]+)", f.read(), re.M)


def check_alerts(prom, at, rules_path):
    problems = []
    want = alert_names(rules_path)
    if not want:
        problems.append(f"{rules_path}: no alerts found")
    groups = prom.api("rules")["groups"]
    loaded = {r["name"]: r for g in groups for r in g["rules"]}
    print("alerts:")
    for name in want:
        r = loaded.get(name)
        if r is None:
            problems.append(f"alert {name}: not loaded by Prometheus (/api/v1/rules)")
            continue
        try:
            n = series_count(prom.query(r["query"], at))
            result = f"{n} series" if n else "silent"
        except PromError as e:
            result = "error"
            problems.append(f"alert {name}: its expression does not evaluate: {e}\n      {r['query']}")
        print(f"  {name:32} health {r.get('health'):7} state {r.get('state'):8} now {result}")
        if r.get("health") != "ok":
            problems.append(f"alert {name}: health {r.get('health')!r}: {r.get('lastError')}")
    for name in loaded:
        if name not in want:
            problems.append(f"rule {name} loaded but not found in {rules_path}")
    return problems


# ---- the run ------------------------------------------------------------------------------------

def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kubetrain", required=True)
    p.add_argument("--operator", required=True)
    p.add_argument("--prometheus", default=shutil.which("prometheus") or "/usr/bin/prometheus")
    p.add_argument("--steps", type=int, default=100000, help="more than the test lets it run")
    p.add_argument("--checkpoint-interval", type=int, default=20)
    p.add_argument("--keep", help="copy the work dir (logs, Prometheus config) here at the end")
    args = p.parse_args()
    if not os.access(args.prometheus, os.X_OK):
        print(f"FAIL: no prometheus at {args.prometheus} (Debian: apt-get install prometheus; "
              "scripts/install-deps.sh installs it)")
        return 1
    # ctest's timeout sends SIGTERM (then SIGKILL): stop what we started on the first.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(2))
    workdir = tempfile.mkdtemp(prefix="kt-prometheus-")
    procs = Processes(workdir)
    servers = []  # in-process HTTP servers (the DCGM stand-in), shut down at the end
    started = time.monotonic()
    try:
        return run(args, workdir, procs, servers)
    except RuntimeError as e:
        print(f"FAIL: {e}")
        for name in ("serve", "operator", "prometheus"):
            print(f"--- {name}.log (tail)")
            print("\n".join(procs.log_of(name).splitlines()[-25:]))
        return 1
    finally:
        for server in servers:
            server.shutdown()
        procs.stop()
        if args.keep:
            shutil.copytree(workdir, args.keep, dirs_exist_ok=True, symlinks=True, ignore_dangling_symlinks=True)
        shutil.rmtree(workdir, ignore_errors=True)
        log(f"total {time.monotonic() - started:.1f} s")


def run(args, workdir, procs, servers):
    kubeconfig = os.path.join(workdir, "kubeconfig")
    serve = procs.spawn("serve", [args.kubetrain, "local", "serve", "--kubeconfig-out", kubeconfig,
                                  "--workdir", os.path.join(workdir, "work")])
    wait_until("local serve's kubeconfig", 20,
               lambda: serve.poll() is None and os.path.exists(kubeconfig) and os.path.getsize(kubeconfig) > 0)
    api = Api(re.search(r"server: (\S+)", open(kubeconfig).read()).group(1))
    with open(os.path.join(REPO, "crds", "trainingjobs.kubetrain.dev.yaml")) as f:
        api.apply_yaml("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/trainingjobs.kubetrain.dev", f.read())
    wait_until("the TrainingJob resource to be served", 20,
               lambda: api.get(f"/apis/kubetrain.dev/v1alpha1/namespaces/{NAMESPACE}/trainingjobs") is not None)

    # As the chart runs it with leader election on (operator.leaderElection.enabled, or replicas
    # > 1): the Operator dashboard's Leader panel and KubetrainOperatorNoLeader read its Lease
    # metric, which an operator without --leader-elect does not export.
    procs.spawn("operator", [args.operator, "--kubeconfig", kubeconfig, "--leader-elect",
                             f"--leader-election-namespace={NAMESPACE}", "--leader-election-id=kubetrain",
                             "--workers=2", "--metrics-bind-address", "127.0.0.1:0",
                             "--health-probe-bind-address", "127.0.0.1:0"])
    operator_port = wait_until("the operator's metrics port", 20, lambda: (re.findall(
        r'msg="serving metrics".*?address=[0-9.]+:(\d+)', procs.log_of("operator")) or [None])[0])
    log(f"local serve at {api.url}, operator metrics on {operator_port}")

    # Prometheus first, so that it sees the job start (the operator's lifecycle counters and
    # time-to-running histogram move inside its window).
    dcgm = DcgmExporter(api)
    dcgm.start()
    servers.append(dcgm.server)
    prom_port = free_port()
    config = os.path.join(workdir, "prometheus.yml")
    workers_file = os.path.join(workdir, "worker-targets.json")
    write_json(workers_file, [])
    node = api.get("/api/v1/nodes")["items"][0]["metadata"]["name"]
    with open(config, "w") as f:
        f.write(prometheus_config(os.path.join(REPO, "dashboards", "alerts.yaml"), workers_file,
                                  f"127.0.0.1:{operator_port}", f"127.0.0.1:{dcgm.port}", node))
    prom_proc = procs.spawn("prometheus", [
        args.prometheus, f"--config.file={config}", f"--storage.tsdb.path={os.path.join(workdir, 'tsdb')}",
        f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"])
    prom = Prometheus(f"http://127.0.0.1:{prom_port}")
    wait_until("Prometheus to be ready", 30,
               lambda: prom_proc.poll() is None and request("GET", f"{prom.url}/-/ready", timeout=2))
    wait_until("Prometheus to scrape the operator", 20, lambda: prom.value("count(up == 1)") == 2)
    log(f"Prometheus on {prom.url}, TSDB in {workdir}/tsdb")

    api.apply_yaml(f"/apis/kubetrain.dev/v1alpha1/namespaces/{NAMESPACE}/trainingjobs/{JOB}",
                   job_manifest(args.steps, args.checkpoint_interval))

    def running_pod():
        for pod in api.job_pods():
            ann = pod["metadata"].get("annotations", {})
            if pod.get("status", {}).get("phase") == "Running" and ann.get("kubetrain.dev/metrics-port"):
                return pod
    pod = wait_until("the worker pod to run", 60, running_pod)
    log(f"pod {pod['metadata']['name']} serves metrics on {write_worker_targets(workers_file, pod)}")

    # Enough history: every target up with several samples in a 10 s window, and a checkpoint.
    sel = f'namespace="{NAMESPACE}", trainingjob="{JOB}"'
    def history():
        if prom_proc.poll() is not None:
            raise RuntimeError("Prometheus exited")
        up = prom.value('count(up == 1)') or 0
        ranks = prom.value(f"count(kubetrain_worker_steps_total{{{sel}}})") or 0
        samples = prom.value(f"min(count_over_time(kubetrain_worker_steps_total{{{sel}}}[{WINDOW}]))") or 0
        checkpoint = prom.value(f"max(kubetrain_worker_last_checkpoint_step{{{sel}}})") or 0
        gpu = prom.value(f"min(count_over_time(DCGM_FI_DEV_GPU_UTIL[{WINDOW}]))") or 0
        return up == 3 and ranks == 2 and samples >= 8 and checkpoint > 0 and gpu >= 8
    wait_until("10 s of scrapes of every target and a checkpoint", 60, history, interval=0.5)
    # Every rule evaluated at least once since then.
    wait_until("every rule to be evaluated", 10, lambda: all(
        r.get("health") != "unknown" for g in prom.api("rules")["groups"] for r in g["rules"]))
    at = time.time()
    steps = prom.value(f"max(kubetrain_worker_steps_total{{{sel}}})", at)
    log(f"evaluating at {at:.3f}: step {steps:.0f}, checkpoint step "
        f"{prom.value(f'max(kubetrain_worker_last_checkpoint_step{{{sel}}})', at):.0f}")

    rows, problems = check_dashboards(prom, at, {"namespace": NAMESPACE, "trainingjob": JOB})
    problems += check_alerts(prom, at, os.path.join(REPO, "dashboards", "alerts.yaml"))

    width = max(len(f"{d} / {t}") for d, t, _, _, _ in rows) if rows else 10
    print(f"\n{'dashboard / panel':{width}}  target  series  first value")
    for d, t, ref, n, value in rows:
        print(f"{f'{d} / {t}':{width}}  {ref:6}  {n!s:6}  {value}")
    empty = sum(1 for r in rows if r[3] in (0, "error", "?"))
    print(f"\n{len(rows)} targets, {len(rows) - empty} with data")
    # Not a failure (a quantile of a histogram that did not move is NaN by definition), but worth
    # a look: the panel shows NaN or ±Inf.
    for d, t, ref, _, value in rows:
        if value in ("NaN", "+Inf", "-Inf"):
            print(f"note: {d} / {t} / {ref} shows {value}")
    if problems:
        print(f"\nFAIL: {len(problems)} problem(s):")
        for problem in problems:
            print("  " + problem)
        return 1
    print("OK: every panel target returned data and every alert rule evaluates")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Checks the Grafana dashboards and the alert rules under dashboards/ (docs/METRICS.md):

* every dashboard is valid JSON with schemaVersion 39 (Grafana 10/11), a `datasource` variable
  of type datasource (prometheus), and panels with unique ids, a unit, and ${datasource} as the
  datasource of the panel and of every target (no hard-coded uid);
* trainingjob.json has the variables namespace, trainingjob and rank from label_values queries,
  and fleet.json links to it;
* every metric name in every query (panels, variables, alerts) is one the code registers
  (telemetry/, operator/: registry.counter/gauge/histogram("name", ...), histograms with their
  _bucket/_sum/_count series) or one of NVIDIA DCGM's documented names;
* every alert has summary, description and a runbook_url whose anchor is a heading of
  docs/METRICS.md;
* the chart's copies (charts/kubetrain/dashboards/*.json, charts/kubetrain/files/alerts.yaml) are
  byte-for-byte the files under dashboards/ when they exist.

Usage: check_dashboards.py REPO_ROOT
"""
import glob
import json
import os
import re
import sys

import yaml

ROOT = sys.argv[1] if len(sys.argv) > 1 else "."
DCGM = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"}
# Prometheus' own series (scrape health); allowed in queries.
PROMETHEUS = {"up"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
            "bool", "offset", "Inf", "NaN", "inf", "nan"}
errors = []


def fail(msg):
    errors.append(msg)


def code_metrics():
    names = set()
    call = re.compile(r'\.(counter|gauge|histogram)\(\s*"([a-zA-Z_:][a-zA-Z0-9_:]*)"', re.S)
    for path in glob.glob(os.path.join(ROOT, "telemetry", "**", "*.cpp"), recursive=True) + \
            glob.glob(os.path.join(ROOT, "operator", "**", "*.cpp"), recursive=True):
        with open(path) as f:
            for kind, name in call.findall(f.read()):
                names.add(name)
                if kind == "histogram":
                    names.update({name + "_bucket", name + "_sum", name + "_count"})
    return names


def metric_names(expr):
    """The metric names an expression selects (identifiers that are not functions, keywords,
    label names or durations)."""
    e = re.sub(r'"(\\.|[^"\\])*"', '""', expr)  # strings
    e = re.sub(r"\{[^}]*\}", "{}", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", "[]", e)  # ranges
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\$\{?[a-zA-Z_]+\}?", "1", e)  # dashboard variables
    names = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", e):
        name, call = m.group(1), m.group(2)
        if call or name in KEYWORDS:
            continue
        names.add(name)
    return names


known = code_metrics() | DCGM | PROMETHEUS
if "kubetrain_worker_steps_total" not in known or "workqueue_depth" not in known:
    fail(f"could not extract the code's metric names (found {sorted(known)})")


def check_expr(where, expr):
    for name in metric_names(expr):
        if name not in known:
            fail(f"{where}: metric {name} is not exported by the code nor a DCGM name: {expr}")


def is_ds(ds):
    return isinstance(ds, dict) and ds.get("uid") == "${datasource}" and ds.get("type") == "prometheus"


dashboards = {}
for path in sorted(glob.glob(os.path.join(ROOT, "dashboards", "*.json"))):
    name = os.path.basename(path)
    try:
        with open(path) as f:
            d = json.load(f)
    except ValueError as e:
        fail(f"{name}: not valid JSON: {e}")
        continue
    dashboards[name] = d
    if d.get("schemaVersion") != 39:
        fail(f"{name}: schemaVersion {d.get('schemaVersion')}, want 39")
    if not d.get("uid") or not d.get("title"):
        fail(f"{name}: no uid or title")
    variables = {v.get("name"): v for v in d.get("templating", {}).get("list", [])}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        fail(f"{name}: no datasource variable of type datasource (prometheus)")
    for v in variables.values():
        if v.get("type") == "query":
            if not is_ds(v.get("datasource")):
                fail(f"{name}: variable {v['name']} does not use ${{datasource}}")
            q = v.get("query", {})
            q = q.get("query", "") if isinstance(q, dict) else q
            m = re.fullmatch(r"label_values\((.*),\s*([a-zA-Z_]+)\)", q.strip())
            if not m:
                fail(f"{name}: variable {v['name']} is not a label_values query: {q}")
            else:
                check_expr(f"{name} variable {v['name']}", m.group(1))
    ids = []
    for p in d.get("panels", []):
        ids.append(p.get("id"))
        where = f"{name} panel {p.get('id')} {p.get('title')!r}"
        if p.get("type") == "row":
            continue
        if not is_ds(p.get("datasource")):
            fail(f"{where}: datasource is not ${{datasource}}")
        if not p.get("fieldConfig", {}).get("defaults", {}).get("unit"):
            fail(f"{where}: no unit")
        if not p.get("targets"):
            fail(f"{where}: no targets")
        for t in p.get("targets", []):
            if not is_ds(t.get("datasource")):
                fail(f"{where} target {t.get('refId')}: datasource is not ${{datasource}}")
            if not t.get("expr"):
                fail(f"{where} target {t.get('refId')}: no expr")
            check_expr(f"{where} target {t.get('refId')}", t.get("expr", ""))
    if len(ids) != len(set(ids)) or None in ids:
        fail(f"{name}: panel ids not unique: {ids}")

for want in ("trainingjob.json", "operator.json", "fleet.json"):
    if want not in dashboards:
        fail(f"dashboards/{want} missing")
tj = dashboards.get("trainingjob.json", {})
tj_vars = {v.get("name") for v in tj.get("templating", {}).get("list", [])}
for v in ("datasource", "namespace", "trainingjob", "rank"):
    if v not in tj_vars:
        fail(f"trainingjob.json: no variable {v}")
fleet = json.dumps(dashboards.get("fleet.json", {}))
if tj.get("uid") and f"/d/{tj['uid']}/" not in fleet:
    fail("fleet.json does not link to the TrainingJob dashboard (/d/<uid>/)")
# No hard-coded datasource uid anywhere: every "datasource" object uses the variable.
for name, d in dashboards.items():
    def walk(x, path):
        if isinstance(x, dict):
            if "datasource" in x and isinstance(x["datasource"], dict) and not is_ds(x["datasource"]):
                fail(f"{name}: {path}.datasource is hard-coded: {x['datasource']}")
            for k, v in x.items():
                walk(v, f"{path}.{k}")
        elif isinstance(x, list):
            for i, v in enumerate(x):
                walk(v, f"{path}[{i}]")
    walk(d, "")

# Alerts.
with open(os.path.join(ROOT, "docs", "METRICS.md")) as f:
    metrics_md = f.read()


def anchor(heading):
    a = heading.strip().lower()
    a = re.sub(r"[^\w\- ]", "", a)
    return a.replace(" ", "-")


anchors = {anchor(h) for h in re.findall(r"^#+\s+(.*)$", metrics_md, re.M)}
with open(os.path.join(ROOT, "dashboards", "alerts.yaml")) as f:
    rules = yaml.safe_load(f)
alerts = 0
for group in rules.get("groups", []):
    for rule in group.get("rules", []):
        if "alert" not in rule:
            continue
        alerts += 1
        where = f"alerts.yaml {rule['alert']}"
        check_expr(where, str(rule.get("expr", "")))
        ann = rule.get("annotations", {})
        for key in ("summary", "description", "runbook_url"):
            if not ann.get(key):
                fail(f"{where}: no {key}")
        url = ann.get("runbook_url", "")
        if "docs/METRICS.md#" not in url or url.split("#", 1)[1] not in anchors:
            fail(f"{where}: runbook_url {url} is not an anchor of docs/METRICS.md")
if alerts == 0:
    fail("alerts.yaml has no alert")

# The chart's copies, once the chart ships them.
for path in glob.glob(os.path.join(ROOT, "charts", "kubetrain", "dashboards", "*.json")):
    src = os.path.join(ROOT, "dashboards", os.path.basename(path))
    if not os.path.exists(src) or open(src, "rb").read() != open(path, "rb").read():
        fail(f"{path} differs from {src} (cp dashboards/*.json charts/kubetrain/dashboards/)")
copy = os.path.join(ROOT, "charts", "kubetrain", "files", "alerts.yaml")
if os.path.exists(copy) and open(copy, "rb").read() != \
        open(os.path.join(ROOT, "dashboards", "alerts.yaml"), "rb").read():
    fail(f"{copy} differs from dashboards/alerts.yaml (cp dashboards/alerts.yaml {copy})")

for e in errors:
    print("FAIL:", e)
if errors:
    sys.exit(1)
n_panels = sum(len(d.get("panels", [])) for d in dashboards.values())
print(f"OK: {len(dashboards)} dashboards, {n_panels} panels, {alerts} alerts, "
      f"{len(known)} known metric names")

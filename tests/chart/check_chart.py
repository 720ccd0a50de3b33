#!/usr/bin/env python3
"""What charts/kubetrain must render, checked on the `helm template` outputs that
tests/chart/chart_test.sh wrote (one file per case), and what the chart must agree with in the
repository: operator/main.cpp's flags, the API calls in operator/ (RBAC), crds/, CMakeLists.txt's
version and docs/INSTALL.md's table of values.

Usage: check_chart.py OUT_DIR REPO_ROOT. Prints every failed expectation; exits 1 if any.
"""
import json
import os
import re
import sys

import yaml

OUT, ROOT = sys.argv[1], sys.argv[2]
CHART = os.path.join(ROOT, "charts/kubetrain")
NS = "kubetrain-system"  # the release namespace of every case
FULLNAME = "kt-kubetrain"  # release "kt", chart "kubetrain"
failures = []


def check(cond, message):
    if not cond:
        failures.append(message)
    return cond


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def rendered(case):
    with open(os.path.join(OUT, case + ".yaml"), encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def objects(docs, kind, name=None):
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs, kind, name=None, case=""):
    found = objects(docs, kind, name)
    check(len(found) == 1, f"{case}: expected one {kind} {name or ''}, found {len(found)}")
    return found[0] if found else {}


def deployment(docs, case):
    return one(docs, "Deployment", case=case)


def container(docs, case):
    d = deployment(docs, case)
    cs = d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
    check(len(cs) == 1, f"{case}: the operator pod has {len(cs)} containers, not 1")
    return cs[0] if cs else {}


def args(docs, case):
    return container(docs, case).get("args", [])


def pod_spec(docs, case):
    return deployment(docs, case).get("spec", {}).get("template", {}).get("spec", {})


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


values = yaml.safe_load(read("charts/kubetrain/values.yaml"))
schema = json.loads(read("charts/kubetrain/values.schema.json"))
chart = yaml.safe_load(read("charts/kubetrain/Chart.yaml"))
APP = chart["appVersion"]

# ---- the chart's version is the project's ---------------------------------------------------
cmake_version = re.search(r"project\(kubetrain\s+VERSION\s+([0-9.]+)", read("CMakeLists.txt"))
check(cmake_version, "CMakeLists.txt: no project(kubetrain VERSION …)")
if cmake_version:
    v = cmake_version.group(1)
    check(chart["version"] == v, f"Chart.yaml version {chart['version']} != CMakeLists.txt {v}")
    check(str(APP) == v, f"Chart.yaml appVersion {APP} != CMakeLists.txt {v}")

# ---- the CRD: the chart's copy is crds/'s, and renders as it ----------------------------------
crd_source = read("crds/trainingjobs.kubetrain.dev.yaml")
check(read("charts/kubetrain/files/trainingjobs.kubetrain.dev.yaml") == crd_source,
      "charts/kubetrain/files/trainingjobs.kubetrain.dev.yaml differs from crds/: "
      "cp crds/trainingjobs.kubetrain.dev.yaml charts/kubetrain/files/")
default = rendered("default")
crd = one(default, "CustomResourceDefinition", "trainingjobs.kubetrain.dev", "default")
source = yaml.safe_load(crd_source)
check(crd.get("spec") == source["spec"], "default: the rendered CRD's spec is not crds/'s")
check(crd.get("apiVersion") == source["apiVersion"], "default: the rendered CRD's apiVersion")
check(crd.get("metadata", {}).get("annotations", {}).get("helm.sh/resource-policy") == "keep",
      "default: the CRD lacks helm.sh/resource-policy: keep")
check(not objects(rendered("nocrd"), "CustomResourceDefinition"), "crds.enabled=false: a CRD")
nokeep = one(rendered("nokeep"), "CustomResourceDefinition", case="nokeep")
check("helm.sh/resource-policy" not in nokeep.get("metadata", {}).get("annotations", {}),
      "crds.keep=false: the CRD still has the keep policy")

# ---- labels and namespaces on every object ----------------------------------------------------
CLUSTER_SCOPED = {"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}
for case in ["default", "replicas2", "namespaced", "monitoring", "dashboards"]:
    for d in rendered(case):
        what = f"{case}: {d['kind']} {d['metadata']['name']}"
        labels = d["metadata"].get("labels", {})
        for key, want in [("app.kubernetes.io/name", "kubetrain"), ("app.kubernetes.io/instance", "kt"),
                          ("app.kubernetes.io/version", str(APP)), ("app.kubernetes.io/managed-by", "Helm"),
                          ("helm.sh/chart", f"kubetrain-{chart['version']}")]:
            check(labels.get(key) == want, f"{what}: label {key}={labels.get(key)!r}, want {want!r}")
        if d["kind"] in CLUSTER_SCOPED:
            check("namespace" not in d["metadata"], f"{what}: cluster-scoped, yet has a namespace")
        else:
            check(d["metadata"].get("namespace"), f"{what}: no namespace")

# ---- the operator Deployment, defaults ----------------------------------------------------------
c = container(default, "default")
spec = pod_spec(default, "default")
dep = deployment(default, "default")
check(dep.get("metadata", {}).get("name") == FULLNAME, f"default: Deployment name {dep.get('metadata')}")
check(dep.get("metadata", {}).get("namespace") == NS, "default: Deployment not in the release namespace")
check(dep.get("spec", {}).get("replicas") == 1, "default: replicas != 1")
check(c.get("command") == ["kubetrain-operator"], f"default: command {c.get('command')}")
check(c.get("image") == f"ghcr.io/kubetrain/kubetrain-operator:{APP}", f"default: image {c.get('image')}")
check(c.get("imagePullPolicy") == "IfNotPresent", "default: imagePullPolicy")
check(sorted(c.get("args", [])) == sorted([
    "--workers=2", "--metrics-bind-address=:8080", "--health-probe-bind-address=:8081",
    f"--worker-image=ghcr.io/kubetrain/kubetrain-worker:{APP}", "--default-checkpoint-volume=pvc",
    "--gang-scheduler=None", "--autotune-restart-cost=120", "--autotune-warmup-steps=20",
    "--autotune-max-switches=3", "--profiling", "--profiling-timeout=600"]),
    f"default: args {c.get('args')}")
check("imagePullSecrets" not in spec, "default: imagePullSecrets without pullSecrets")
check(c.get("resources") == values["operator"]["resources"], "default: resources are not values.yaml's")
ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
check(ports == {"metrics": 8080, "health": 8081}, f"default: container ports {ports}")
for probe, path in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")]:
    get = c.get(probe, {}).get("httpGet", {})
    check(get.get("path") == path and ports.get(get.get("port")) == 8081,
          f"default: {probe} is not GET {path} on the health port: {get}")
check(spec.get("terminationGracePeriodSeconds") == 30, "default: terminationGracePeriodSeconds")
# The restricted Pod Security Standard.
psc, sc = spec.get("securityContext", {}), c.get("securityContext", {})
check(psc.get("runAsNonRoot") is True and psc.get("runAsUser") == 65532, f"default: pod securityContext {psc}")
check(psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", "default: pod seccompProfile")
check(sc.get("allowPrivilegeEscalation") is False, "default: allowPrivilegeEscalation")
check(sc.get("readOnlyRootFilesystem") is True, "default: readOnlyRootFilesystem")
check(sc.get("capabilities", {}).get("drop") == ["ALL"], "default: capabilities not drop ALL")
check(sc.get("runAsNonRoot") is True, "default: container runAsNonRoot")
check(sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", "default: container seccompProfile")
check(not sc.get("privileged"), "default: privileged")
pod_labels = dep.get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {})
check(selects(dep.get("spec", {}).get("selector", {}).get("matchLabels"), pod_labels),
      "default: the Deployment's selector does not select its pods")
for absent in ["PodDisruptionBudget", "Role", "RoleBinding", "ServiceMonitor", "PodMonitor", "ConfigMap",
               "PrometheusRule"]:
    check(not objects(default, absent), f"default: unexpected {absent}")

# ServiceAccount and who is bound.
sa = one(default, "ServiceAccount", FULLNAME, "default")
check(spec.get("serviceAccountName") == FULLNAME, f"default: serviceAccountName {spec.get('serviceAccountName')}")
for b in objects(default, "ClusterRoleBinding") + objects(rendered("replicas2"), "RoleBinding"):
    check(b.get("subjects") == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NS}],
          f"{b['kind']} {b['metadata']['name']}: subjects {b.get('subjects')}")
norbac = rendered("norbac")
for kind in ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount"]:
    check(not objects(norbac, kind), f"rbac.create=false, serviceAccount.create=false: a {kind}")
check(pod_spec(norbac, "norbac").get("serviceAccountName") == "existing-sa", "serviceAccount.name not used")

# The metrics Service.
svc = one(default, "Service", FULLNAME + "-metrics", "default")
check(selects(svc.get("spec", {}).get("selector"), pod_labels), "default: the metrics Service selects no operator pod")
check([(p["name"], p["port"], p["targetPort"]) for p in svc.get("spec", {}).get("ports", [])]
      == [("metrics", 8080, "metrics")], "default: metrics Service ports")

# ---- every flag the chart passes is an operator flag; every operator flag can be set ----------
main_cpp = read("operator/main.cpp")
operator_flags = set(re.findall(r'add_(?:option|flag)\(\s*"(--[a-z-]+)"', main_cpp))
check(operator_flags, "operator/main.cpp: no flags found")
passed = set()
for case in ["default", "replicas2", "leader1", "namespaced", "image", "placement"]:
    for a in args(rendered(case), case):
        flag = a.split("=", 1)[0]
        passed.add(flag)
        check(flag in operator_flags, f"{case}: {flag} is not a flag of operator/main.cpp")
check(operator_flags - {"--kubeconfig"} <= passed,
      f"flags of operator/main.cpp the chart cannot set: {sorted(operator_flags - {'--kubeconfig'} - passed)}")

# ---- replicas > 1: leader election and a PodDisruptionBudget ----------------------------------
r2 = rendered("replicas2")
a2 = args(r2, "replicas2")
check(deployment(r2, "replicas2").get("spec", {}).get("replicas") == 2, "replicas2: replicas")
for want in ["--leader-elect", f"--leader-election-namespace={NS}", f"--leader-election-id={FULLNAME}"]:
    check(want in a2, f"replicas2: no {want} in {a2}")
pdb = one(r2, "PodDisruptionBudget", case="replicas2")
check(pdb.get("spec", {}).get("minAvailable") == 1, "replicas2: PDB minAvailable")
check(selects(pdb.get("spec", {}).get("selector", {}).get("matchLabels"),
              deployment(r2, "replicas2")["spec"]["template"]["metadata"]["labels"]),
      "replicas2: the PDB does not select the operator pods")
l1 = rendered("leader1")
a1 = args(l1, "leader1")
for want in ["--leader-elect", "--leader-election-namespace=locks", "--leader-election-id=my-lease"]:
    check(want in a1, f"leader1: no {want} in {a1}")
check(not objects(l1, "PodDisruptionBudget"), "leader1: a PDB with one replica")
check(not any(a.startswith("--leader") for a in args(default, "default")), "default: leader election flags")

# ---- RBAC: exactly the API calls the operator makes -------------------------------------------
# The calls, read from the code: client_.VERB(kube::kRESOURCE, NS, …) in operator/controller and
# the Lease elector, the informers the manager starts (list + watch), and blockOwnerDeletion on
# the children (the OwnerReferencesPermissionEnforcement admission plugin then requires update
# on the owner's finalizers).
resources = {}
for name, group, plural, namespaced in re.findall(
        r'const Resource (k\w+)\{"([^"]*)",\s*"[^"]*",\s*"([^"]+)",\s*"[^"]*",\s*(true|false)\}',
        read("operator/kube/resources.cpp")):
    resources[name] = (group, plural, namespaced == "true")
check(resources, "operator/kube/resources.cpp: no Resource constants found")
VERBS = {"get": "get", "list": "list", "create": "create", "update": "update", "update_status": "update",
         "merge_patch": "patch", "remove": "delete", "watch": "watch"}
needed_namespaced, needed_cluster_wide, needed_lease = set(), set(), set()


def need(res, verb, ns_arg, lease_file=False):
    if res not in resources:
        failures.append(f"RBAC check: {res} is not in operator/kube/resources.cpp")
        return
    group, plural, namespaced = resources[res]
    if verb == "update_status":
        plural += "/status"
    entry = (group, plural, VERBS[verb])
    if lease_file:
        needed_lease.add(entry)
    elif not namespaced or ns_arg.strip() == '""':
        needed_cluster_wide.add(entry)  # cluster-scoped, or listed across all namespaces
    else:
        needed_namespaced.add(entry)


CALL = re.compile(r'client_?\.(' + "|".join(VERBS) + r')\(\s*(?:kube::)?(k\w+)\s*,\s*([^,)]*)')
for f in sorted(os.listdir(os.path.join(ROOT, "operator/controller"))):
    if f.endswith(".cpp"):
        for verb, res, ns_arg in CALL.findall(read("operator/controller/" + f)):
            need(res, verb, ns_arg)
# Calls on the gang's PodGroup, client_.VERB(*resource, NS, …): resource is one of what
# children.cpp's pod_group_resource() returns.
pod_group_fn = re.search(r'pod_group_resource\([^)]*\)\s*\{(.*?)\n\}', read("operator/controller/children.cpp"), re.S)
check(pod_group_fn, "operator/controller/children.cpp: no pod_group_resource() found")
pod_groups = re.findall(r'return &(?:kube::)?(k\w+);', pod_group_fn.group(1) if pod_group_fn else "")
check(pod_groups, "operator/controller/children.cpp: pod_group_resource() returns no Resource")
RESOURCE_CALL = re.compile(r'client_\.(' + "|".join(VERBS) + r')\(\s*\*resource\s*,\s*([^,)]*)')
for verb, ns_arg in RESOURCE_CALL.findall(read("operator/controller/controller.cpp")):
    for res in pod_groups:
        need(res, verb, ns_arg)
for verb, res, ns_arg in CALL.findall(read("operator/kube/leader_election.cpp")):
    need(res, verb, ns_arg, lease_file=True)
# The informer caches: operator_cache_options() lists {kube::kRESOURCE, NS, ...} entries, each
# an informer that lists and watches that collection (NS "" = every namespace).
manager = read("operator/controller/manager.cpp")
cache_options = re.search(r'operator_cache_options\([^)]*\)\s*\{(.*?)\n\}', manager, re.S)
check(cache_options, "operator/controller/manager.cpp: no operator_cache_options() found")
cached = re.findall(r'\{\s*(?:kube::)?(k\w+)\s*,\s*([^,}]*)', cache_options.group(1) if cache_options else "")
check(cached, "operator/controller/manager.cpp: operator_cache_options() caches nothing")
for res, ns_arg in cached:
    need(res, "list", ns_arg)
    need(res, "watch", ns_arg)
if "blockOwnerDeletion" in read("operator/controller/children.cpp"):
    needed_namespaced.add(("kubetrain.dev", "trainingjobs/finalizers", "update"))
check(needed_namespaced and needed_lease, "RBAC check: found no API calls in operator/")


def granted(role):
    out = set()
    for rule in role.get("rules", []):
        for g in rule.get("apiGroups", []):
            for r in rule.get("resources", []):
                for v in rule.get("verbs", []):
                    out.add((g, r, v))
    return out


def show(s):
    return ", ".join(f"{g or 'core'}/{r}:{v}" for g, r, v in sorted(s))


def same(case, what, got, want):
    check(got == want, f"{case}: {what} grants [{show(got - want)}] more and [{show(want - got)}] less "
                       "than operator/ calls (see docs/INSTALL.md, RBAC)")


# Every namespace: one ClusterRole; namespaced-only calls and cluster-wide ones together.
cr = one(default, "ClusterRole", FULLNAME, "default")
same("default", "the ClusterRole", granted(cr), needed_namespaced | needed_cluster_wide)
check(not objects(default, "Role"), "default: a Role without leader election")
# Leader election: the Lease Role, get/update limited to the Lease's name.
lease_role = one(r2, "Role", FULLNAME + "-leader-election", "replicas2")
check(lease_role.get("metadata", {}).get("namespace") == NS, "replicas2: the Lease Role's namespace")
same("replicas2", "the Lease Role", granted(lease_role), needed_lease)
for rule in lease_role.get("rules", []):
    if rule.get("resources") == ["leases"] and set(rule.get("verbs", [])) & {"get", "update"}:
        check(rule.get("resourceNames") == [FULLNAME], f"replicas2: Lease get/update not limited to {FULLNAME}")
    if rule.get("resources") == ["roles"]:  # the Lease's owner, itself
        check(rule.get("resourceNames") == [FULLNAME + "-leader-election"],
              f"replicas2: roles get not limited to {FULLNAME}-leader-election")
check(f"--leader-election-role={FULLNAME}-leader-election" in args(r2, "replicas2"),
      "replicas2: the Lease's owner Role is not passed to the operator")
lease_role1 = one(l1, "Role", FULLNAME + "-leader-election", "leader1")
check(lease_role1.get("metadata", {}).get("namespace") == "locks", "leader1: the Lease Role is not in 'locks'")
check(any(r.get("resourceNames") == ["my-lease"] for r in lease_role1.get("rules", [])),
      "leader1: the Lease Role is not limited to my-lease")
same("replicas2", "the ClusterRole", granted(one(r2, "ClusterRole", FULLNAME, "replicas2")),
     needed_namespaced | needed_cluster_wide)

# Namespace-scoped: a Role in the watched namespace, and a read-only inventory ClusterRole.
nsd = rendered("namespaced")
check("--namespace=team-a" in args(nsd, "namespaced"), "namespaced: no --namespace=team-a")
check(not any(a.startswith("--namespace") for a in args(default, "default")), "default: --namespace")
role = one(nsd, "Role", FULLNAME, "namespaced")
check(role.get("metadata", {}).get("namespace") == "team-a", "namespaced: the Role is not in team-a")
same("namespaced", "the Role", granted(role), needed_namespaced)
rb = one(nsd, "RoleBinding", FULLNAME, "namespaced")
check(rb.get("metadata", {}).get("namespace") == "team-a" and rb.get("roleRef", {}).get("name") == FULLNAME,
      "namespaced: the RoleBinding")
crs = objects(nsd, "ClusterRole")
check([x["metadata"]["name"] for x in crs] == [FULLNAME + "-inventory"],
      f"namespaced: ClusterRoles {[x['metadata']['name'] for x in crs]}, want only the inventory one")
for x in crs:
    same("namespaced", "the inventory ClusterRole", granted(x), needed_cluster_wide)
    check(all(v in ("get", "list", "watch") for _, _, v in granted(x)), "namespaced: a ClusterRole that writes")
crb = one(nsd, "ClusterRoleBinding", FULLNAME + "-inventory", "namespaced")
check(crb.get("roleRef", {}).get("name") == FULLNAME + "-inventory", "namespaced: the inventory binding")

# No wildcard anywhere, in any case.
for f in sorted(os.listdir(OUT)):
    if not f.endswith(".yaml") or f.endswith(".values.yaml"):
        continue
    for d in rendered(f[:-5]):
        for rule in d.get("rules", []) if d["kind"] in ("Role", "ClusterRole") else []:
            for key in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                check(not any("*" in x for x in rule.get(key, [])),
                      f"{f[:-5]}: {d['kind']} {d['metadata']['name']} has a '*' in {key}")

# ---- images and pull secrets ----------------------------------------------------------------------
img = rendered("image")
ci = container(img, "image")
check(ci.get("image") == "registry.example.com:5000/ml/op:1.2.3", f"image: {ci.get('image')}")
check(ci.get("imagePullPolicy") == "Always", "image: pullPolicy")
check(pod_spec(img, "image").get("imagePullSecrets") == [{"name": "regcred"}, {"name": "other"}],
      f"image: imagePullSecrets {pod_spec(img, 'image').get('imagePullSecrets')}")
check("--worker-image=ml/worker:9.9" in ci.get("args", []), f"image: worker image in {ci.get('args')}")
check("--worker-image-pull-secret=worker-cred" in ci.get("args", []),
      f"image: worker pull secret in {ci.get('args')}")
for want in ["--default-checkpoint-volume=pvc", "--checkpoint-storage-class=fast",
             "--checkpoint-volume-size=200Gi", "--gang-scheduler=Volcano",
             "--gang-scheduler-name=volcano-gpu", "--autotune-restart-cost=600",
             "--autotune-max-switches=0", "--profiling", "--profiling-quick",
             "--profiling-timeout=120"]:
    check(want in ci.get("args", []), f"image: {want} not in {ci.get('args')}")
noprof = one(rendered("noprofiling"), "Deployment", FULLNAME, "noprofiling")
noprof_args = noprof["spec"]["template"]["spec"]["containers"][0].get("args", [])
check(not any(a.startswith("--profiling") for a in noprof_args),
      f"noprofiling: profiling flags in {noprof_args}")

# ---- monitoring: only when asked for and the cluster has monitoring.coreos.com/v1 -------------
children_h, children_cpp = read("operator/controller/children.h"), read("operator/controller/children.cpp")
worker_metrics_port = re.search(r"metrics_port\s*=\s*(\d+)", children_h)
check(worker_metrics_port and worker_metrics_port.group(1) == "9090", "children.h: worker metrics port is not 9090")
check('{"name", "metrics"}, {"containerPort", options.metrics_port}' in children_cpp,
      "children.cpp: the worker container port is no longer named 'metrics' (the PodMonitor scrapes it)")
check('kJobNameLabel = "kubetrain.dev/job-name"' in children_h, "children.h: the job-name label changed")
mon = rendered("monitoring")
sm = one(mon, "ServiceMonitor", FULLNAME, "monitoring")
msvc = one(mon, "Service", FULLNAME + "-metrics", "monitoring")
check(selects(sm.get("spec", {}).get("selector", {}).get("matchLabels"), msvc.get("metadata", {}).get("labels", {})),
      "monitoring: the ServiceMonitor does not select the metrics Service")
check(sm.get("spec", {}).get("namespaceSelector") == {"matchNames": [NS]}, "monitoring: ServiceMonitor namespaceSelector")
check([e.get("port") for e in sm.get("spec", {}).get("endpoints", [])] == ["metrics"], "monitoring: ServiceMonitor endpoint port")
check(sm.get("metadata", {}).get("labels", {}).get("release") == "prom", "monitoring: serviceMonitor.labels")
pm = one(mon, "PodMonitor", FULLNAME + "-workers", "monitoring")
check(pm.get("spec", {}).get("selector") ==
      {"matchExpressions": [{"key": "kubetrain.dev/job-name", "operator": "Exists"}]},
      f"monitoring: PodMonitor selector {pm.get('spec', {}).get('selector')}")
eps = pm.get("spec", {}).get("podMetricsEndpoints", [])
check([(e.get("port"), e.get("interval"), e.get("honorLabels")) for e in eps] == [("metrics", "5s", True)],
      f"monitoring: PodMonitor endpoints {eps}")
check(pm.get("spec", {}).get("namespaceSelector") == {"any": True}, "monitoring: PodMonitor namespaceSelector")
pmn = one(rendered("monitoring_namespaced"), "PodMonitor", case="monitoring_namespaced")
check(pmn.get("spec", {}).get("namespaceSelector") == {"matchNames": ["team-a"]},
      "monitoring_namespaced: the PodMonitor does not look only in team-a")
rule = one(mon, "PrometheusRule", FULLNAME, "monitoring")
check(rule.get("metadata", {}).get("labels", {}).get("release") == "prom", "monitoring: prometheusRule.labels")
check(rule.get("spec", {}).get("groups") == yaml.safe_load(read("dashboards/alerts.yaml"))["groups"],
      "monitoring: the PrometheusRule's groups are not dashboards/alerts.yaml's")
no_api = rendered("monitoring_no_api")
check(not objects(no_api, "PrometheusRule"), "monitoring without monitoring.coreos.com/v1: a PrometheusRule")
check(not objects(no_api, "ServiceMonitor") and not objects(no_api, "PodMonitor"),
      "monitoring without monitoring.coreos.com/v1: a ServiceMonitor or PodMonitor")

# ---- placement, resources, ports, names -----------------------------------------------------
pl = rendered("placement")
placement = yaml.safe_load(open(os.path.join(OUT, "placement.values.yaml")))
pd = one(pl, "Deployment", "ktop", "placement")
ps = pd.get("spec", {}).get("template", {}).get("spec", {})
pc = (ps.get("containers") or [{}])[0]
op = placement["operator"]
check(pc.get("resources") == op["resources"], f"placement: resources {pc.get('resources')}")
for key in ["nodeSelector", "tolerations", "affinity", "priorityClassName", "terminationGracePeriodSeconds"]:
    check(ps.get(key) == op[key], f"placement: {key} {ps.get(key)!r}")
meta = pd.get("spec", {}).get("template", {}).get("metadata", {})
check(meta.get("annotations") == op["podAnnotations"], "placement: podAnnotations")
check(meta.get("labels", {}).get("example.com/tier") == "control", "placement: podLabels")
check(not selects({"example.com/tier": "control"}, pd.get("spec", {}).get("selector", {}).get("matchLabels", {})),
      "placement: podLabels leaked into the (immutable) selector")
for want in ["--workers=8", "--metrics-bind-address=:9443", "--health-probe-bind-address=:9444"]:
    check(want in pc.get("args", []), f"placement: no {want}")
pports = {p["name"]: p["containerPort"] for p in pc.get("ports", [])}
check(pports == {"metrics": 9443, "health": 9444}, f"placement: ports {pports}")
check(pc.get("readinessProbe", {}).get("httpGet", {}).get("port") == "health", "placement: readiness port")
psvc = one(pl, "Service", "ktop-metrics", "placement")
check([p["port"] for p in psvc.get("spec", {}).get("ports", [])] == [9443], "placement: metrics Service port")
check(one(pl, "ClusterRoleBinding", "ktop", "placement").get("subjects", [{}])[0].get("name") == "ktop",
      "placement: fullnameOverride not used for the ServiceAccount")

# ---- Grafana dashboards -----------------------------------------------------------------------
dash = rendered("dashboards")
cms = objects(dash, "ConfigMap")
check(len(cms) == 2, f"dashboards: {len(cms)} ConfigMaps for 2 dashboard files")
by_file = {}
for cm in cms:
    check(cm["metadata"].get("namespace") == "monitoring", f"dashboards: {cm['metadata']['name']} namespace")
    check(cm["metadata"].get("labels", {}).get("my_dashboard") == "yes", f"dashboards: {cm['metadata']['name']} label")
    check(re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", cm["metadata"]["name"]),
          f"dashboards: ConfigMap name {cm['metadata']['name']} is not a DNS label")
    by_file.update({k: json.loads(v) for k, v in cm.get("data", {}).items()})
check(by_file.get("training.json") == {"title": "Training", "panels": []}, "dashboards: training.json content")
check(by_file.get("Operator_Health.json", {}).get("title") == "Operator health", "dashboards: Operator_Health.json")
check(not objects(rendered("dashboards_off"), "ConfigMap"), "dashboards.enabled=false: ConfigMaps")
# The chart's own dashboards, byte for byte those of dashboards/, labelled grafana_dashboard: "1".
real = {}
for cm in objects(rendered("dashboards_real"), "ConfigMap"):
    check(cm["metadata"].get("labels", {}).get("grafana_dashboard") == "1",
          f"dashboards_real: {cm['metadata']['name']} not labelled grafana_dashboard: \"1\"")
    real.update(cm.get("data", {}))
for name in ["trainingjob.json", "operator.json", "fleet.json"]:
    check(name in real and json.loads(real[name]) == json.loads(read("dashboards/" + name)),
          f"dashboards_real: {name} missing or not dashboards/{name}")
check(not objects(rendered("dashboards_none"), "ConfigMap"), "no dashboard files: ConfigMaps")

# ---- the packaged chart renders as the directory ------------------------------------------------
check(rendered("packaged") == default, "helm package: the packaged chart renders differently (files/ left out?)")

# ---- every value is commented in values.yaml and documented in docs/INSTALL.md -----------------


def value_paths(node, sch, prefix=""):
    """The chart's settings: descend while the schema says the object is a closed set of keys."""
    for key, val in node.items():
        path = prefix + key
        sub = sch.get("properties", {}).get(key, {})
        if isinstance(val, dict) and sub.get("additionalProperties") is False:
            yield from value_paths(val, sub, path + ".")
        else:
            yield path


paths = list(value_paths(values, schema))
check(len(paths) > 40, f"values.yaml: only {len(paths)} values found")
# Comments: the line above each key (at any depth) is a comment, or the key opens a section.
lines = read("charts/kubetrain/values.yaml").splitlines()
stack = []
path_set = set(paths)
for i, line in enumerate(lines):
    m = re.match(r"^( *)([A-Za-z][\w.-]*):", line)
    if not m or line.lstrip().startswith("#"):
        continue
    depth = len(m.group(1)) // 2
    stack = stack[:depth] + [m.group(2)]
    path = ".".join(stack)
    if path in path_set:
        check(i > 0 and lines[i - 1].strip().startswith("#"), f"values.yaml: {path} has no comment above it")
docs = read("docs/INSTALL.md") if check(os.path.exists(os.path.join(ROOT, "docs/INSTALL.md")), "no docs/INSTALL.md") else ""
documented = set(re.findall(r"^\| `([A-Za-z][\w.]*)` \|", docs, re.M))
for p in paths:
    check(p in documented, f"docs/INSTALL.md: value {p} is not in the Values table")
for p in sorted(documented - path_set):  # rows of other tables (RBAC) name no top-level value
    check(p.split(".")[0] not in values, f"docs/INSTALL.md: {p} is documented but is no value of values.yaml")
for section in ["## Building the image", "(see the Dockerfile section below)"]:
    check(section in docs, f"docs/INSTALL.md: no '{section}'")

if failures:
    for f in failures:
        print("FAIL:", f)
    sys.exit(1)
permissions = needed_namespaced | needed_cluster_wide | needed_lease
print(f"chart: all checks passed ({len(paths)} values; {len(permissions)} (resource, verb) permissions "
      "derived from operator/)")

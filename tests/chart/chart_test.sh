#!/usr/bin/env bash
# The Helm chart (charts/kubetrain) as helm renders it: `helm lint --strict`, the schema's
# refusals, and `helm template` with the defaults and with each important value changed; the
# rendered objects are checked by tests/chart/check_chart.py (what each case must produce, the
# RBAC rules against the API calls in operator/, every value documented in docs/INSTALL.md, the
# chart's CRD copy against crds/, the chart version against CMakeLists.txt).
# Exit 77 (ctest: skipped) when helm is not installed (scripts/install-deps.sh installs it).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
cd "$(dirname "$0")/../.."
HELM=${HELM:-helm}
if ! command -v "$HELM" >/dev/null; then
  echo "helm not installed: skipped (scripts/install-deps.sh installs it)"
  exit 77
fi
python3 -c 'import yaml' 2>/dev/null || { echo "FAIL: python3 has no PyYAML (Debian: python3-yaml)"; exit 1; }

CHART=charts/kubetrain
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

"$HELM" lint --strict "$CHART" > "$OUT/lint" 2>&1 || { cat "$OUT/lint"; fail "helm lint --strict"; }
"$HELM" lint --strict "$CHART" --set watchNamespace=team-a,operator.replicas=3 \
  --set metrics.serviceMonitor.enabled=true,metrics.podMonitor.enabled=true,dashboards.enabled=true \
  > "$OUT/lint2" 2>&1 || { cat "$OUT/lint2"; fail "helm lint --strict with values changed"; }

# One rendering per case: $OUT/<case>.yaml, rendered as `helm install kt … -n kubetrain-system`.
render() {
  local name=$1
  shift
  "$HELM" template kt "$CHART" --namespace kubetrain-system "$@" > "$OUT/$name.yaml" 2> "$OUT/$name.err" ||
    { cat "$OUT/$name.err"; fail "helm template ($name): $*"; }
}
render default
render replicas2 --set operator.replicas=2
render leader1 --set operator.leaderElection.enabled=true \
  --set operator.leaderElection.namespace=locks,operator.leaderElection.id=my-lease
render namespaced --set watchNamespace=team-a
render nocrd --set crds.enabled=false
render nokeep --set crds.keep=false
render norbac --set rbac.create=false,serviceAccount.create=false,serviceAccount.name=existing-sa
render image --set operator.image.registry=registry.example.com:5000,operator.image.repository=ml/op \
  --set operator.image.tag=1.2.3,operator.image.pullPolicy=Always \
  --set 'operator.image.pullSecrets={regcred,other}' \
  --set worker.image.registry=,worker.image.repository=ml/worker,worker.image.tag=9.9 \
  --set 'worker.image.pullSecrets={worker-cred}' \
  --set worker.checkpointStorage.storageClassName=fast,worker.checkpointStorage.size=200Gi \
  --set worker.gangScheduling.scheduler=Volcano,worker.gangScheduling.schedulerName=volcano-gpu \
  --set autotune.restartCostSeconds=600,autotune.maxSwitches=0 \
  --set profiling.quick=true,profiling.timeoutSeconds=120
render noprofiling --set profiling.enabled=false
MONITORING=(--set "metrics.serviceMonitor.enabled=true,metrics.podMonitor.enabled=true,metrics.prometheusRule.enabled=true"
            --set "metrics.prometheusRule.labels.release=prom"
            --set "metrics.serviceMonitor.labels.release=prom,metrics.podMonitor.interval=5s")
render monitoring "${MONITORING[@]}" --api-versions monitoring.coreos.com/v1
render monitoring_namespaced "${MONITORING[@]}" --set watchNamespace=team-a \
  --api-versions monitoring.coreos.com/v1
render monitoring_no_api "${MONITORING[@]}"
cat > "$OUT/placement.values.yaml" <<'EOF'
fullnameOverride: ktop
operator:
  workers: 8
  terminationGracePeriodSeconds: 45
  priorityClassName: system-cluster-critical
  resources:
    requests: {cpu: 250m, memory: 256Mi}
    limits: {cpu: "1", memory: 1Gi}
  nodeSelector: {node-role.kubernetes.io/control-plane: ""}
  tolerations: [{key: node-role.kubernetes.io/control-plane, operator: Exists, effect: NoSchedule}]
  affinity:
    podAntiAffinity:
      preferredDuringSchedulingIgnoredDuringExecution:
        - weight: 100
          podAffinityTerm:
            topologyKey: kubernetes.io/hostname
            labelSelector: {matchLabels: {app.kubernetes.io/name: kubetrain}}
  podAnnotations: {example.com/team: ml}
  podLabels: {example.com/tier: control}
metrics:
  port: 9443
health:
  port: 9444
EOF
render placement -f "$OUT/placement.values.yaml"

# Dashboards: the chart's own (dashboards/*.json), and a copy of the chart with two other files
# instead, and one with none.
render dashboards_real --set dashboards.enabled=true
cp -r "$CHART" "$OUT/chart"
rm -f "$OUT/chart/dashboards/"*.json
echo '{"title": "Training", "panels": []}' > "$OUT/chart/dashboards/training.json"
echo '{"title": "Operator health", "panels": [{"id": 1}]}' > "$OUT/chart/dashboards/Operator_Health.json"
CHART="$OUT/chart" render dashboards --set dashboards.enabled=true,dashboards.label=my_dashboard \
  --set dashboards.labelValue=yes,dashboards.namespace=monitoring
CHART="$OUT/chart" render dashboards_off
cp -r "$CHART" "$OUT/chart_none"
rm -f "$OUT/chart_none/dashboards/"*.json
CHART="$OUT/chart_none" render dashboards_none --set dashboards.enabled=true

# The packaged chart carries files/ (the CRD) and renders the same objects.
"$HELM" package "$CHART" -d "$OUT/package" > /dev/null || fail "helm package"
CHART=$(ls "$OUT"/package/kubetrain-*.tgz) render packaged

# The schema refuses bad values, each for its own reason: the message names the value (helm 4
# says "at '/operator/replicas': …" and "additional properties 'x' not allowed", helm 3
# "operator.replicas: Invalid type …" and "Additional property x is not allowed").
refuse() {
  local expect=$1
  shift
  if "$HELM" template kt "$CHART" "$@" > /dev/null 2> "$OUT/refused.err"; then
    fail "schema accepted: $*"
  fi
  grep -qiE -- "$expect" "$OUT/refused.err" || { cat "$OUT/refused.err"; fail "refused, but not for '$expect': $*"; }
}
extra() { echo "additional propert(y|ies) '?$1'? (is )?not allowed"; }
refuse "operator[./]replicas" --set operator.replicas=two
refuse "$(extra replica)" --set replica=2
refuse "$(extra bogus)" --set operator.bogus=1
refuse "operator[./]workers" --set operator.workers=65
refuse "operator[./]image[./]pullPolicy" --set operator.image.pullPolicy=Sometimes
refuse "metrics[./]port" --set metrics.port=70000
refuse "watchNamespace" --set watchNamespace=Team_A
refuse "metrics[./]serviceMonitor[./]interval" --set metrics.serviceMonitor.interval=often
refuse "worker[./]checkpointStorage[./]volume" --set worker.checkpointStorage.volume=hostPath
refuse "worker[./]checkpointStorage[./]size" --set worker.checkpointStorage.size=lots
refuse "worker[./]gangScheduling[./]scheduler" --set worker.gangScheduling.scheduler=yunikorn
refuse "profiling[./]timeoutSeconds" --set profiling.timeoutSeconds=5

python3 tests/chart/check_chart.py "$OUT" .

#!/usr/bin/env bash
# The real kubectl against `kubetrain local serve`: discovery, client-side validation (OpenAPI),
# apply of the TrainingJob CRD and of a TrainingJob, get (table and JSON), watch, delete, and an
# error status that kubectl reports as the API server's message.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
KT=$1
if ! command -v kubectl >/dev/null; then
  echo "kubectl not installed: skipped"
  exit 77  # ctest's conventional "skipped"; registered with SKIP_RETURN_CODE
fi
OUT=$(mktemp -d)
SERVER_PID=""
cleanup() {
  if [[ -n "$SERVER_PID" ]]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$OUT"
}
trap cleanup EXIT
fail_context() { echo "--- server log"; cat "$OUT/serve.log"; }

"$KT" local serve --kubeconfig-out "$OUT/kubeconfig" --workdir "$OUT/work" > "$OUT/serve.log" 2>&1 &
SERVER_PID=$!
wait_for 10 test -s "$OUT/kubeconfig" || fail "no kubeconfig written within 10 s"
K() { kubectl --kubeconfig "$OUT/kubeconfig" --request-timeout=20s "$@"; }

CRD=crds/trainingjobs.kubetrain.dev.yaml

K version -o json > "$OUT/version" || fail "kubectl version"
grep -q '"gitVersion"' "$OUT/version" || fail "no server version"
K apply -f "$CRD" | tee "$OUT/apply-crd"
grep -q "customresourcedefinition.apiextensions.k8s.io/trainingjobs.kubetrain.dev created" "$OUT/apply-crd" || fail "CRD not created"
K api-resources --api-group=kubetrain.dev > "$OUT/resources"
grep -q "trainingjobs.*tj.*kubetrain.dev/v1alpha1.*true.*TrainingJob" "$OUT/resources" || { cat "$OUT/resources"; fail "TrainingJob not discovered"; }

# The CRD's schema, as a real API server enforces it: unknown fields refused (kubectl asks for
# strict field validation), every invalid value listed with its field path, defaults filled in.
cat > "$OUT/bad.yaml" <<'YAML'
apiVersion: kubetrain.dev/v1alpha1
kind: TrainingJob
metadata:
  name: bad
spec:
  colour: blue
  model: {preset: tiny}
  training: {steps: 0}
  parallelism: {offload: sometimes}
YAML
if K apply -f "$OUT/bad.yaml" 2> "$OUT/bad.err"; then fail "a TrainingJob with spec.colour was accepted"; fi
grep -q 'strict decoding error: unknown field "spec.colour"' "$OUT/bad.err" || { cat "$OUT/bad.err"; fail "unknown field not refused"; }
sed -i '/colour/d' "$OUT/bad.yaml"
if K apply -f "$OUT/bad.yaml" 2> "$OUT/bad.err"; then fail "an invalid TrainingJob was accepted"; fi
cat "$OUT/bad.err"
grep -q 'The TrainingJob "bad" is invalid' "$OUT/bad.err" || fail "no Invalid status"
grep -q 'spec.parallelism.offload: Unsupported value: "sometimes": supported values: "auto", "none", "optimizer", "window"' "$OUT/bad.err" || fail "offload enum not checked"
grep -q 'spec.training.steps: Invalid value: 0: spec.training.steps in body should be greater than or equal to 1' "$OUT/bad.err" || fail "steps minimum not checked"
if K get tj bad > /dev/null 2>&1; then fail "the invalid job was stored"; fi
# kubectl explain reads the CRD's schema from /openapi/v3.
K explain trainingjob.spec.parallelism > "$OUT/explain" 2>&1 || { cat "$OUT/explain"; fail "kubectl explain"; }
grep -q "offload" "$OUT/explain" && grep -q "gpuUpdateFraction" "$OUT/explain" || { cat "$OUT/explain"; fail "kubectl explain: no fields"; }

K apply -f examples/jobs/tiny.yaml | tee "$OUT/apply-tj"
grep -q "trainingjob.kubetrain.dev/tiny created" "$OUT/apply-tj" || fail "TrainingJob not created"
K apply -f examples/jobs/tiny.yaml | grep "trainingjob.kubetrain.dev/tiny unchanged" >/dev/null || fail "re-apply is not a no-op"

K get tj > "$OUT/get"
cat "$OUT/get"
head -1 "$OUT/get" | grep "^NAME" >/dev/null || fail "no table header"
grep -q "^tiny " "$OUT/get" || fail "tiny not listed"

K get tj tiny -o json > "$OUT/tiny.json"
python3 - "$OUT/tiny.json" <<'PY'
import json, sys
tj = json.load(open(sys.argv[1]))
assert tj["kind"] == "TrainingJob" and tj["apiVersion"] == "kubetrain.dev/v1alpha1", tj["kind"]
assert tj["metadata"]["name"] == "tiny" and tj["metadata"]["namespace"] == "default"
assert tj["metadata"]["generation"] == 1 and tj["metadata"]["resourceVersion"]
assert tj["spec"]["training"]["steps"] == 200, tj["spec"]
assert "kubectl.kubernetes.io/last-applied-configuration" in tj["metadata"]["annotations"]
assert tj["spec"]["training"]["weightDecay"] == 0.1, tj["spec"]  # the schema's default
print("tiny.json ok")
PY

# A changed spec through apply is a patch; the generation moves; a watching kubectl sees it.
K get tj --watch --output-watch-events > "$OUT/watch" 2>&1 &
WATCH_PID=$!
for _ in $(seq 100); do grep -q "ADDED" "$OUT/watch" && break; sleep 0.1; done
sed 's/steps: 200/steps: 300/' examples/jobs/tiny.yaml > "$OUT/tiny-300.yaml"
K apply -f "$OUT/tiny-300.yaml" | grep "configured" >/dev/null || fail "apply of a change did not patch"
[[ $(K get tj tiny -o jsonpath='{.spec.training.steps} {.metadata.generation}') == "300 2" ]] || fail "patch not applied"
for _ in $(seq 100); do grep -q "MODIFIED" "$OUT/watch" && break; sleep 0.1; done
kill "$WATCH_PID" 2>/dev/null || true
wait "$WATCH_PID" 2>/dev/null || true
cat "$OUT/watch"
grep -q "^ADDED *tiny" "$OUT/watch" || fail "kubectl get --watch saw no ADDED"
grep -q "^MODIFIED *tiny" "$OUT/watch" || fail "kubectl get --watch saw no MODIFIED"

# The status subresource through kubectl, and the printer columns read from it.
K patch tj tiny --subresource=status --type=merge -p '{"status":{"phase":"Running","restarts":2}}' > /dev/null \
  || fail "status patch"
K get tj tiny > "$OUT/get-status"
grep -q "^tiny *Running" "$OUT/get-status" || { cat "$OUT/get-status"; fail "the Phase column does not show the status"; }

# An error status reaches the user as the server's message.
if K get tj missing 2> "$OUT/err"; then fail "get of a missing object succeeded"; fi
grep -q 'trainingjobs.kubetrain.dev "missing" not found' "$OUT/err" || { cat "$OUT/err"; fail "NotFound message"; }

# The same control plane as `kubetrain run`: this machine is a Node, and a Pod bound to it runs
# as a local process.
K get nodes -o name | grep "^node/" >/dev/null || fail "no local node"
cat > "$OUT/pod.yaml" <<'YAML'
apiVersion: v1
kind: Pod
metadata:
  name: hello
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: busybox
    command: ["sh", "-c", "echo hello from a local pod"]
YAML
K apply -f "$OUT/pod.yaml" | grep "pod/hello created" >/dev/null || fail "pod not created"
for _ in $(seq 200); do
  [[ $(K get pod hello -o jsonpath='{.status.phase}') == Succeeded ]] && break
  sleep 0.1
done
[[ $(K get pod hello -o jsonpath='{.status.phase}') == Succeeded ]] || fail "the pod did not run to Succeeded"
grep -rq "hello from a local pod" "$OUT/work/pods" || fail "no pod log"
K delete pod hello > /dev/null

# --dry-run=server checks the object and creates nothing.
K apply --dry-run=server -f "$OUT/pod.yaml" > "$OUT/dry.txt" || fail "kubectl apply --dry-run=server"
grep -q "pod/hello created (server dry run)" "$OUT/dry.txt" || fail "dry run: $(cat "$OUT/dry.txt")"
if K get pod hello > /dev/null 2>&1; then fail "kubectl apply --dry-run=server created the pod"; fi

# --sort-by asks for whole objects in the Table's rows (includeObject=Object).
for e in late:2026-12-07T10:00:00Z early:2026-12-07T09:00:00Z; do
  cat > "$OUT/event.yaml" <<YAML
apiVersion: v1
kind: Event
metadata: {name: ${e%%:*}}
involvedObject: {kind: Pod, name: hello, namespace: default}
reason: Tested
message: ${e%%:*}
type: Normal
lastTimestamp: "${e#*:}"
YAML
  K apply -f "$OUT/event.yaml" > /dev/null || fail "apply of an Event"
done
K get events --sort-by=.lastTimestamp > "$OUT/events.txt" 2>&1 || { cat "$OUT/events.txt"; fail "kubectl get events --sort-by"; }
[[ $(grep -c Tested "$OUT/events.txt") -eq 2 ]] || { cat "$OUT/events.txt"; fail "kubectl get events --sort-by: not both events"; }
[[ $(grep Tested "$OUT/events.txt" | awk '{print $NF}' | paste -sd,) == early,late ]] \
  || { cat "$OUT/events.txt"; fail "kubectl get events --sort-by=.lastTimestamp: not sorted"; }

# Built-in kinds print the columns a real API server gives them.
cat > "$OUT/pdb.yaml" <<'YAML'
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: p}
spec: {minAvailable: 1, selector: {matchLabels: {a: b}}}
YAML
K apply -f "$OUT/pdb.yaml" > /dev/null || fail "apply of a PodDisruptionBudget"
# (Output captured first: `grep -q` would stop reading early, and pipefail would see kubectl's SIGPIPE.)
K get pdb > "$OUT/pdb.txt" || fail "kubectl get pdb"
grep -q "^NAME *MIN AVAILABLE *MAX UNAVAILABLE *ALLOWED DISRUPTIONS *AGE" "$OUT/pdb.txt" || fail "kubectl get pdb: $(cat "$OUT/pdb.txt")"
K get ns > "$OUT/ns.txt" || fail "kubectl get ns"
grep -q "^default *Active" "$OUT/ns.txt" || fail "kubectl get ns: $(cat "$OUT/ns.txt")"

# A port in use is a one-line error and exit code 1.
PORT=$(grep -o 'http://127.0.0.1:[0-9]*' "$OUT/serve.log" | awk 'NR == 1' | sed 's/.*://')
set +e
"$KT" local serve --api-only --port "$PORT" > "$OUT/second.log" 2>&1
RC=$?
set -e
[[ $RC -eq 1 ]] || fail "a second server on port $PORT exited $RC"
grep -q "cannot listen on 127.0.0.1:$PORT" "$OUT/second.log" || { cat "$OUT/second.log"; fail "no port-in-use message"; }

K delete tj tiny | grep 'trainingjob.kubetrain.dev "tiny" deleted' >/dev/null || fail "delete"
K get tj 2>&1 | grep "No resources found" >/dev/null || fail "tiny still listed after delete"
echo "kubectl against kubetrain local serve: ok"

#!/usr/bin/env bash
# The issue's acceptance command: the table shows the plan, step time, tokens/s, memory per GPU
# by kind and the four baselines; -o json is a valid Plan that the worker-side decoder accepts.
set -eu
KT=$1
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
"$KT" plan examples/jobs/gpt2-1.5b.yaml --cluster examples/clusters/3090x32-pcie.yaml > "$OUT/table"
for want in "predicted" "s/step" "tokens/s" "memory/GPU" "params" "grads" "optimizer" \
            "activations" "workspace" "reserve" "megatron" "zero-offload" "stronghold" "oases" \
            "why" "plan hash"; do
  grep -qF -- "$want" "$OUT/table" || { echo "table lacks '$want'"; cat "$OUT/table"; exit 1; }
done
"$KT" plan examples/jobs/gpt2-1.5b.yaml --cluster examples/clusters/3090x32-pcie.yaml -o json > "$OUT/plan.json"
python3 - "$OUT/plan.json" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
assert plan["apiVersion"] == "kubetrain.dev/v1alpha1" and plan["kind"] == "Plan", plan.get("kind")
assert plan["tp"] * plan["dp"] == plan["world"]
assert plan["nodes"] * plan["procsPerNode"] == plan["world"]
assert len(plan["placement"]) == plan["nodes"]
assert len(plan["offload"]["layers"]) == plan["model"]["layers"]
assert plan["model"]["parameters"] == 1557686400, plan["model"]["parameters"]
assert {a["name"] for a in plan["alternatives"]} == {"megatron", "zero-offload", "stronghold", "oases"}
p = plan["predicted"]
assert p["stepSeconds"] > 0 and p["tokensPerSecond"] > 0
assert abs(plan["batch"]["global"] * plan["model"]["seqLen"] / p["stepSeconds"] - p["tokensPerSecond"]) < 1e-6 * p["tokensPerSecond"]
assert len(plan["planHash"]) == 16
print("plan.json ok:", plan["tp"], plan["dp"], plan["offload"]["mode"])
PY
"$KT" plan examples/jobs/gpt2-1.5b.yaml --cluster examples/clusters/3090x32-pcie.yaml -o yaml > "$OUT/plan.yaml"
grep -q "^kind: Plan$" "$OUT/plan.yaml"
# Every example job validates and plans on every example cluster it fits.
for j in examples/jobs/*.yaml; do "$KT" validate "$j" > /dev/null; done
"$KT" plan examples/jobs/tiny.yaml --cluster examples/clusters/cpu-local.yaml > /dev/null
"$KT" plan examples/jobs/gpt2-124m.yaml --cluster tests/data/kubectl-nodes.json > /dev/null
echo "plan outputs ok"

#!/usr/bin/env bash
# Bad input through the real CLI: each case must exit non-zero with one line on stderr that
# names the field (or the file) and the problem.
set -u
KT=$1
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
fail=0

job() {  # job NAME SPEC-YAML
  printf 'apiVersion: kubetrain.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: j}\nspec:\n%s\n' "$2" > "$DIR/$1.yaml"
}

expect() {  # expect CASE EXPECTED-SUBSTRING COMMAND...
  local name=$1 want=$2
  shift 2
  "$@" > "$DIR/out" 2> "$DIR/err"
  local rc=$? lines
  lines=$(wc -l < "$DIR/err")
  if [[ $rc -eq 0 ]]; then
    echo "FAIL $name: exit 0"; fail=1
  elif ! grep -qF -- "$want" "$DIR/err"; then
    echo "FAIL $name: stderr lacks '$want':"; cat "$DIR/err"; fail=1
  elif [[ $lines -ne 1 ]]; then
    echo "FAIL $name: $lines lines on stderr:"; cat "$DIR/err"; fail=1
  else
    echo "ok   $name (rc $rc): $(cat "$DIR/err")"
  fi
}

CL=examples/clusters/h100x32.yaml
job neg '  model: {layers: -1, hidden: 768, heads: 12, vocab: 50257, seqLen: 1024}
  training: {steps: 10}'
expect negative-dim "spec.model.layers: -1 must be > 0" "$KT" validate "$DIR/neg.yaml"
job zero '  model: {preset: gpt2-124m, hidden: 0}
  training: {steps: 10}'
expect zero-dim "spec.model.hidden: 0 must be > 0" "$KT" plan "$DIR/zero.yaml" --cluster $CL
job heads '  model: {layers: 12, hidden: 768, heads: 7, vocab: 50257, seqLen: 1024}
  training: {steps: 10}'
expect heads "spec.model.heads: 7 does not divide hidden 768" "$KT" plan "$DIR/heads.yaml" --cluster $CL
job preset '  model: {preset: gpt5}
  training: {steps: 10}'
expect unknown-preset 'spec.model.preset: unknown preset "gpt5"' "$KT" validate "$DIR/preset.yaml"
printf 'apiVersion: kubetrain.dev/v1alpha1\nkind: TrainingJob\nspec: {model: [1, 2\n' > "$DIR/malformed.yaml"
expect malformed-yaml "malformed YAML" "$KT" validate "$DIR/malformed.yaml"
job ok '  model: {preset: gpt2-124m}
  training: {steps: 10}'
printf 'kind: Inventory\nnodes:\n- name: x\n  gpu: {product: NVIDIA-Z1, count: 8}\n  cpu: {cores: 8}\n  memory: 64Gi\n' > "$DIR/gpu.yaml"
expect unknown-gpu 'nodes[0].gpu.product: unknown GPU product "NVIDIA-Z1"' "$KT" plan "$DIR/ok.yaml" --cluster "$DIR/gpu.yaml"
printf 'kind: Inventory\nnodes: []\n' > "$DIR/empty.yaml"
expect empty-cluster "nodes: the cluster has no nodes" "$KT" plan "$DIR/ok.yaml" --cluster "$DIR/empty.yaml"
job huge '  model: {layers: 96, hidden: 12288, heads: 96, vocab: 50257, seqLen: 2048}
  training: {steps: 10, globalBatchSize: 8}
  parallelism: {offload: none}'
expect fits-nowhere "per GPU with the best plan" "$KT" plan "$DIR/huge.yaml" --cluster examples/clusters/h200-single.yaml
expect fits-nowhere-names-capacity "nodes have 141.0 GiB" "$KT" plan "$DIR/huge.yaml" --cluster examples/clusters/h200-single.yaml
expect missing-file "does not exist" "$KT" plan "$DIR/nope.yaml" --cluster $CL
# Hostile documents: refused with a message, not a signal or unbounded memory.
job hugelr '  model: {preset: tiny}
  training: {steps: 10, learningRate: 1e400}'
expect huge-number "the number 1e400 is out of range" "$KT" validate "$DIR/hugelr.yaml"
printf 'a: &a [*a]\n' > "$DIR/alias.yaml"
expect self-alias "an alias that contains itself" "$KT" validate "$DIR/alias.yaml"
{ printf 'a: &a [x,x,x,x,x,x,x,x,x,x]\n'; p=a
  for c in b c d e f g h i j; do printf '%s: &%s [*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s,*%s]\n' $c $c $p $p $p $p $p $p $p $p $p $p; p=$c; done
} > "$DIR/laughs.yaml"
expect billion-laughs "values (after expanding aliases): refused" "$KT" validate "$DIR/laughs.yaml"
python3 -c "print('{\"apiVersion\":\"kubetrain.dev/v1alpha1\",\"kind\":\"TrainingJob\",\"metadata\":{\"name\":\"j\"},\"spec\":{\"model\":{\"preset\":\"tiny\"},\"training\":{\"steps\":5},\"resources\":{\"affinity\":{\"a\":' + '['*100000 + ']'*100000 + '}}}}')" > "$DIR/deep.json"
expect deep-json "deep.json: nested more than 100 levels deep" "$KT" validate "$DIR/deep.json"
printf 'apiVersion: kubetrain.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: j, labels: {team: caf\xe9}}\nspec: {model: {preset: tiny}, training: {steps: 5}}\n' > "$DIR/latin1.yaml"
expect non-utf8 "latin1.yaml:3: not UTF-8" "$KT" validate -o json "$DIR/latin1.yaml"
# Numbers that once overflowed or hung the planner (under a timeout: a hang fails, not stalls).
job hugebatch '  model: {preset: tiny}
  training: {steps: 10, globalBatchSize: 9223372036854775807}'
expect huge-batch "spec.training.globalBatchSize: 9223372036854775807 exceeds the limit of 16777216" timeout 20 "$KT" plan "$DIR/hugebatch.yaml" --cluster $CL
job hugelayers '  model: {layers: 1000000000000000000, hidden: 768, heads: 12, vocab: 50257, seqLen: 1024}
  training: {steps: 10}'
expect huge-layers "spec.model.layers: 1000000000000000000 exceeds the limit of 4096" "$KT" validate "$DIR/hugelayers.yaml"
printf 'kind: Inventory\nnodes:\n- name: x\n  cpu: {cores: 1000000000000000000}\n  memory: 64Gi\n' > "$DIR/cores.yaml"
expect huge-cores "cores.yaml: nodes[0].cpu.cores: 1000000000000000000 exceeds the limit of 65536" timeout 20 "$KT" plan "$DIR/ok.yaml" --cluster "$DIR/cores.yaml"
# Every problem at once, one line each, each naming the file (as kubectl shows the API server's).
job many '  model: {preset: tiny, layrs: 3}
  training: {steps: ten, precision: fp8}
  checkpoint: {keep: 0}'
"$KT" validate "$DIR/many.yaml" > /dev/null 2> "$DIR/err"
rc=$?
if [[ $rc -ne 1 || $(grep -c "^kubetrain: $DIR/many.yaml: spec\." "$DIR/err") -ne 4 ]]; then
  echo "FAIL all-at-once (rc $rc):"; cat "$DIR/err"; fail=1
else
  echo "ok   all-at-once: 4 problems, 4 lines"
fi
exit $fail

#!/usr/bin/env python3
"""Writes the seed corpus of every harness into OUT/<name>/ (fuzz/run.sh calls it).

Seeds come from examples/ and tests/data, plus small hand-made inputs of each binary or line
format, so that the fuzzers start from inputs the parsers accept. Usage: seeds.py SOURCE_DIR OUT
"""
import glob
import json
import os
import struct
import sys

import yaml

SRC, OUT = sys.argv[1], sys.argv[2]


def write(name, seed, data):
    os.makedirs(os.path.join(OUT, name), exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(OUT, name, seed), "wb") as f:
        f.write(data)


def read(path):
    with open(os.path.join(SRC, path), "rb") as f:
        return f.read()


jobs = sorted(glob.glob(os.path.join(SRC, "examples/jobs/*.yaml")))
clusters = sorted(glob.glob(os.path.join(SRC, "examples/clusters/*.yaml")))

for path in jobs + clusters:
    write("yaml", os.path.basename(path), read(path))
for path in jobs:
    base = os.path.basename(path)
    write("training_job", base, read(path))
    write("training_job", base + ".json", json.dumps(yaml.safe_load(read(path))))
for path in clusters:
    write("inventory", os.path.basename(path), read(path))
write("inventory", "kubectl-nodes.json", read("tests/data/kubectl-nodes.json"))

for path in sorted(glob.glob(os.path.join(SRC, "fuzz/corpus/*/*"))):
    write(os.path.basename(os.path.dirname(path)), os.path.basename(path), read(path))

# hardware: the product, then key=value annotations.
for i, text in enumerate([
        "NVIDIA-H100-80GB-HBM3\npcie-gbps=25\nintra-busbw-gbps=300\ngpu-link=nvlink",
        "NVIDIA GeForce RTX 3090\ngpu-link=pcie\npeak-tflops=71\nachieved-fraction=0.45",
        "cpu\ncpu-adam-mparams=400\nallreduce-latency-us=12\ninter-node-gbps=12.5",
        "H200\n"]):
    write("hardware", "seed%d" % i, text)

# kubeconfig: the context, a newline, the file.
kubeconfig = {
    "apiVersion": "v1", "kind": "Config", "current-context": "prod",
    "clusters": [{"name": "prod", "cluster": {"server": "https://10.0.0.1:6443",
                                              "certificate-authority-data": "aGVsbG8="}},
                 {"name": "dev", "cluster": {"server": "http://127.0.0.1:8080",
                                             "insecure-skip-tls-verify": True}}],
    "contexts": [{"name": "prod", "context": {"cluster": "prod", "user": "admin",
                                              "namespace": "team"}},
                 {"name": "dev", "context": {"cluster": "dev", "user": "dev"}}],
    "users": [{"name": "admin", "user": {"client-certificate-data": "aGVsbG8=",
                                         "client-key-data": "a2V5"}},
              {"name": "dev", "user": {"token": "abc", "tokenFile": "token"}}],
}
write("kubeconfig", "yaml", "dev\n" + yaml.safe_dump(kubeconfig))
write("kubeconfig", "json", "prod\n" + json.dumps(kubeconfig))

# safetensors: 8 bytes of data that follow, then the file's header length and JSON header.
def safetensors(tensors, metadata):
    header, offset = {}, 0
    for name, shape in tensors:
        n = 4
        for d in shape:
            n *= d
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", offset) + struct.pack("<Q", len(text)) + text


write("safetensors", "params", safetensors(
    [("param/wte", [64, 16]), ("adam_m/wte", [64, 16]), ("param/ln_f.bias", [16])],
    {"slice/param/wte": json.dumps({"logical_shape": [128, 16], "offset": [64, 0]})}))
write("safetensors", "empty", safetensors([], {}))
write("safetensors", "scalar", safetensors([("x", [])], {"format": "pt"}))

# checkpoint: `latest`, NUL, metadata.json.
metadata = {"format": "kubetrain-checkpoint/v1", "step": 120,
            "dataCursor": {"kind": "synthetic", "sequence": 3840, "world": 2},
            "rng": {"seed": 1337}, "planHash": "0123456789abcdef", "loss": 4.25,
            "extra": {"model": {"layers": 2}},
            "files": {"rank-00000.safetensors": {"bytes": 4096, "checksum": "ab" * 32}}}
write("checkpoint", "step120", "step-00000120\n\0" + json.dumps(metadata))
metadata["loss"] = None
metadata["dataCursor"] = {"kind": "tokens", "epoch": 1, "shard": 0, "window": 5, "seqLen": 64}
write("checkpoint", "nullloss", "step-00000120\0" + json.dumps(metadata))
# A cursor position beyond int64 (once converted to int64 by json: undefined behaviour).
metadata["dataCursor"] = {"kind": "synthetic", "sequence": 384088888888888888888, "world": 2}
write("checkpoint", "huge_cursor", "step-00000060\n\0" + json.dumps(metadata))

# llm.c: 8 bytes of file size, then the 256 header words.
def llmc(maxT, V, L, NH, C, Vp):
    floats = Vp * C + maxT * C + L * (C + C + 3 * C * C + 3 * C + C * C + C + C + C + 4 * C * C +
                                      4 * C + 4 * C * C + C) + C + C
    words = [20240326, 3, maxT, V, L, NH, C, Vp] + [0] * 248
    return struct.pack("<Q", 1024 + 4 * floats) + struct.pack("<256i", *words)


write("llmc", "model", llmc(64, 50257, 2, 4, 64, 50304))
write("llmc", "model-small", llmc(8, 10, 1, 1, 4, 16))
write("llmc", "shard", struct.pack("<Q", 2 * (1024 + 2 * 1000)) +
      struct.pack("<256i", *([20240520, 1, 1000] + [0] * 253)))

# prometheus_merge: the ranks' texts, NUL-separated.
rank = """# HELP kubetrain_step_seconds Seconds per optimizer step.
# TYPE kubetrain_step_seconds histogram
kubetrain_step_seconds_bucket{rank="%d",le="0.1"} 3
kubetrain_step_seconds_bucket{rank="%d",le="+Inf"} 5
kubetrain_step_seconds_sum{rank="%d"} 1.5
kubetrain_step_seconds_count{rank="%d"} 5
# HELP kubetrain_loss Training loss.
# TYPE kubetrain_loss gauge
kubetrain_loss{rank="%d",job="a b}c"} 4.2
# TYPE kubetrain_tokens_total counter
kubetrain_tokens_total{rank="%d"} 1024
"""
write("prometheus_merge", "two_ranks", rank % ((0,) * 6) + "\0" + rank % ((1,) * 6))
write("prometheus_merge", "summary", "# TYPE rpc summary\nrpc{quantile=\"0.5\"} 1\nrpc_sum 2\n"
      "rpc_count 3\nuntyped_x 1\r\n\0rpc_sum 2\n")

# rendezvous: the requests a client sends, back to back.
def message(*fields):
    out = struct.pack(">I", len(fields))
    for f in fields:
        f = f.encode() if isinstance(f, str) else f
        out += struct.pack(">I", len(f)) + f
    return out


write("rendezvous", "session", message("set", "job/world_size/0", b"4") +
      message("get", "job/world_size/0", "60000", "job/abort") +
      message("wait", "60000", "", "job/a", "job/b"))
write("rendezvous", "bad", message("get", "k", "-5", "") + message("wait", "1e9", "") +
      message("nope"))

# watch_stream: frames as the API server streams them.
pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
    "name": "job-worker-0", "namespace": "default", "resourceVersion": "42",
    "labels": {"kubetrain.dev/job": "job"}}, "status": {"phase": "Running"}}
frames = [{"type": "ADDED", "object": pod}, {"type": "MODIFIED", "object": pod},
          {"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
                                          "metadata": {"resourceVersion": "50"}}},
          {"type": "DELETED", "object": pod},
          {"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                       "code": 410, "reason": "Expired",
                                       "message": "too old resource version"}}]
write("watch_stream", "pods", "\n".join(json.dumps(f) for f in frames) + "\n")

# selectors: the selector, NUL, the object.
for i, selector in enumerate(["app=x,tier in (a, b),!gone", "app==x,env notin (prod)",
                              "app!=y,team", "metadata.name=job-worker-0,status.phase!=Failed",
                              "spec.nodeName==local,involvedObject.kind=Pod"]):
    write("selectors", "seed%d" % i, selector + "\0" + json.dumps(
        {**pod, "spec": {"nodeName": "local"}, "metadata": {**pod["metadata"], "labels": {
            "app": "x", "tier": "a", "team": "ml"}}}))

# merge_patch: a byte picking the object (0 ConfigMap, 1 Pod, 2 TrainingJob; +3: status), the
# patch.
write("merge_patch", "configmap", b"\0" + json.dumps(
    {"data": {"a": None, "c": "3"}, "metadata": {"labels": {"tier": "b"}}}).encode())
write("merge_patch", "pod", b"\x01" + json.dumps(
    {"spec": {"containers": [{"name": "c", "image": "j"}]}}).encode())
write("merge_patch", "pod_status", b"\x04" + json.dumps({"status": {"phase": "Running"}}).encode())
write("merge_patch", "job", b"\x02" + json.dumps(
    {"spec": {"training": {"steps": 20, "learningRate": 0.001}, "runPolicy": {"suspend": True}}})
    .encode())
# Metadata the API server validates on every write: owner references, finalizers, labels and
# annotations of the wrong shape are refused, and nothing else of the store stops working.
write("merge_patch", "owner_string", b"\0" + json.dumps({"metadata": {"ownerReferences": "x"}}).encode())
write("merge_patch", "owner_uid_number", b"\0" + json.dumps(
    {"metadata": {"ownerReferences": [{"uid": 5}]}}).encode())
write("merge_patch", "owner_missing", b"\0" + json.dumps({"metadata": {"ownerReferences": [
    {"apiVersion": "v1", "kind": "ConfigMap", "name": "gone", "uid": "u-1"}]}}).encode())
write("merge_patch", "label_object", b"\x01" + json.dumps(
    {"metadata": {"labels": {"kubetrain.dev/job-name": {"a": 1}}}}).encode())
write("merge_patch", "finalizers", b"\x02" + json.dumps(
    {"metadata": {"finalizers": ["example.com/x", 3], "annotations": {"a": "b"}}}).encode())
write("merge_patch", "job_status", b"\x05" + json.dumps(
    {"status": {"phase": "Running", "progress": {"step": 3}}}).encode())

# kube_protobuf: a Secret, a Namespace and a ConfigMap as client-go encodes them.
def varint(n):
    out = b""
    while n >= 0x80:
        out += bytes([(n & 0x7f) | 0x80])
        n >>= 7
    return out + bytes([n])


def field(num, data):
    return varint(num << 3 | 2) + varint(len(data)) + data


def envelope(kind, raw):
    return b"k8s\0" + field(1, field(1, b"v1") + field(2, kind)) + field(2, raw)


meta = field(1, b"sh.helm.release.v1.kt.v1") + field(3, b"ns") + field(11, field(1, b"owner") +
                                                                       field(2, b"helm"))
write("kube_protobuf", "secret", envelope(b"Secret", field(1, meta) + field(
    2, field(1, b"release") + field(2, b"\x00\xff")) + field(3, b"Opaque")))
write("kube_protobuf", "namespace", envelope(b"Namespace", field(1, field(1, b"team-a")) +
                                             field(2, field(1, b"kubernetes"))))
write("kube_protobuf", "configmap", envelope(b"ConfigMap", field(1, meta) +
                                             field(2, field(1, b"k") + field(2, b"v"))))

# http_request: what clients send.
body = json.dumps({"metadata": {"labels": {"a": "b"}}})
write("http_request", "get", "GET /api/v1/namespaces/default/pods?labelSelector=a%3Db&watch=1 "
      "HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: kubectl/v1.35\r\nAccept: application/json\r\n\r\n")
write("http_request", "patch", "PATCH /apis/kubetrain.dev/v1alpha1/namespaces/default/"
      "trainingjobs/j HTTP/1.1\r\nHost: x\r\nContent-Type: application/merge-patch+json\r\n"
      "Content-Length: %d\r\n\r\n%s" % (len(body), body))
write("http_request", "chunked", "POST /api/v1/namespaces HTTP/1.1\r\nHost: x\r\n"
      "Transfer-Encoding: chunked\r\n\r\n5;ext=1\r\n{\"a\":\r\n3\r\n 1}\r\n0\r\nTrailer: x\r\n\r\n")
write("http_request", "pipelined", "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
      "HEAD /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET * HTTP/1.1\r\n\r\n")

# plan: what the operator writes into the ConfigMap (api/plan.cpp, to_json), without planHash
# (with one the content must hash to it).
plan = {
    "apiVersion": "kubetrain.dev/v1alpha1", "kind": "Plan",
    "job": {"name": "tiny", "namespace": "default"},
    "model": {"layers": 2, "hidden": 64, "heads": 4, "ffnHidden": 256, "vocab": 256,
              "paddedVocab": 256, "seqLen": 64, "parameters": 118784},
    "batch": {"global": 8, "micro": 2, "gradAccum": 2}, "world": 2, "nodes": 1,
    "procsPerNode": 2, "placement": ["local"], "hardware": "cpu", "tp": 1, "dp": 2,
    "overlap": {"subBatches": 1}, "recompute": "none",
    "offload": {"mode": "optimizer", "window": 0, "gpuUpdateFraction": 0.5, "cpuThreads": 1,
                "embeddings": {"resident": True, "update": "gpu"},
                "layers": [{"resident": True, "update": "gpu"}, {"resident": True, "update": "cpu"}]},
    "precision": "fp32", "device": "cpu",
    "training": {"steps": 50, "learningRate": 0.0006, "warmupSteps": 5, "weightDecay": 0.1,
                 "gradClip": 1.0, "seed": 1337},
    "data": {"source": "synthetic"}, "checkpoint": {"intervalSteps": 25, "keep": 3},
    "predicted": {"stepSeconds": 0.01}, "alternatives": [], "explanation": ["why"],
}
write("plan", "tiny", json.dumps(plan))
plan.update({"tp": 2, "dp": 1, "recompute": "commAware", "overlap": {"subBatches": 2},
             "device": "cuda", "precision": "bf16", "hardware": "H200",
             "data": {"source": "tokens", "path": "/data/*.bin"}})
del plan["offload"]
write("plan", "tp2", json.dumps(plan, indent=2))
# Pipeline stages with offload inside each, and a cutpoint (the layers from 1 on at TP 1).
plan.update({"pipeline": {"stages": 2, "layersPerStage": 1}, "distributedOptimizer": True,
             "device": "cpu", "precision": "fp32", "world": 4,
             "offload": {"mode": "optimizer", "layers": [{"update": "cpu"}, {"update": "cpu"}]}})
write("plan", "stages", json.dumps(plan))
del plan["pipeline"], plan["offload"]
plan.update({"world": 2, "cutpoint": {"layer": 1, "tp": 1, "dp": 2}})
write("plan", "cutpoint", json.dumps(plan))

# worker_progress: rank 0's /metrics as the worker serves it (two ranks merged), and its
# termination message.
write("worker_progress", "metrics", "\n".join([
    "# HELP kubetrain_worker_steps_total Steps this process ran.",
    "# TYPE kubetrain_worker_steps_total counter",
    'kubetrain_worker_steps_total{rank="0"} 30',
    'kubetrain_worker_steps_total{rank="1"} 30',
    'kubetrain_worker_step{rank="0"} 130',
    'kubetrain_worker_loss{rank="0"} 3.25',
    'kubetrain_worker_tokens_per_second{rank="0"} 45210.5',
    'kubetrain_worker_phase_seconds_total{rank="0",phase="compute"} 2.5',
    'kubetrain_worker_phase_seconds_total{rank="0",phase="tp_comm_total"} 0.75',
    'kubetrain_worker_checkpoint_failures_total{rank="0",reason="ENOSPC"} 2',
    'kubetrain_worker_last_checkpoint_step{rank="0"} 100',
]) + "\n")
write("worker_progress", "termination", "kubetrain_worker_steps_total 200\n"
      "kubetrain_worker_loss 4.3785\nkubetrain_worker_tokens_per_second 29831\n"
      "kubetrain_worker_checkpoint_failures_total 0\n"
      "kubetrain_worker_checkpoint_consecutive_failures 0\n")
write("worker_progress", "hostile", "kubetrain_worker_loss nan\nkubetrain_worker_step inf\n"
      'kubetrain_worker_phase_seconds_total{phase="x"} 1e308\n'
      'kubetrain_worker_phase_seconds_total{phase="x"} 1e308\n'
      'kubetrain_worker_loss{rank="0 1\nkubetrain_worker_loss{\n')

# steps_log: the fixture (a restart after a torn write, a failed checkpoint), its head with a
# torn last line, and a record of each kind with nulls where the writer has no finite value.
steps = read("tests/data/steps.jsonl").decode()
write("steps_log", "fixture", steps)
write("steps_log", "torn_last", steps[:1500])
write("steps_log", "nulls", "\n".join(json.dumps(r) for r in [
    {"kind": "start", "time": 1.5, "resumed_from": 0, "total_steps": 3, "plan_hash": "ab",
     "tp": 2, "dp": 1, "pp": 1, "cut_layer": 1, "cut_tp": 1, "recompute": "full", "offload": "optimizer", "precision": "bf16",
     "device": "cuda", "predicted_step_seconds": None, "predicted_tokens_per_second": 10,
     "predicted_phase_seconds": {"compute": 1, "transfer_total": None}, "loss_floor": None},
    {"kind": "step", "time": 2, "step": 1, "loss": None, "seconds": 0.5, "tokens_per_second": None,
     "mfu": None, "phase_seconds": {"compute": 0.4, "x": None}},
    {"kind": "checkpoint", "time": 3, "step": 1, "seconds": None},
    {"kind": "checkpoint_failed", "time": 4, "step": 1, "reason": "EROFS <&>"},
    {"kind": "future", "time": 5},
    {"kind": "end", "time": 6, "step": 1, "how": "signal"}]) + "\n")

# reshard: the safetensors JSON header of rank 0 of a TP 2 checkpoint of reshard_fuzz.cpp's GPT
# (L 1, C 8, 2 heads, F 16, Vp 32, maxT 8): every parameter and moment with its slice metadata.
L, C, F, VP, MAXT = 1, 8, 16, 32, 8
PARAMS = [("wte", [VP, C], 0), ("wpe", [MAXT, C], -1), ("ln1w", [L, C], -1), ("ln1b", [L, C], -1),
          ("qkvw", [L, 3, C, C], 2), ("qkvb", [L, 3, C], 2), ("attprojw", [L, C, C], 2),
          ("attprojb", [L, C], -1), ("ln2w", [L, C], -1), ("ln2b", [L, C], -1),
          ("fcw", [L, F, C], 1), ("fcb", [L, F], 1), ("fcprojw", [L, C, F], 2),
          ("fcprojb", [L, C], -1), ("lnfw", [C], -1), ("lnfb", [C], -1)]
def shard_header(shape_of, slice_of=None):
    """The JSON header of a shard holding every parameter and moment, shape_of(name, logical)."""
    header, meta, offset = {}, {}, 0
    for group in ("param/", "adam_m/", "adam_v/"):
        for name, logical, tp_dim in PARAMS:
            shape = shape_of(name, logical, tp_dim)
            if slice_of and tp_dim >= 0:
                meta["slice/" + group + name] = json.dumps(slice_of(logical))
            n = 4
            for d in shape:
                n *= d
            header[group + name] = {"dtype": "F32", "shape": shape,
                                    "data_offsets": [offset, offset + n]}
            offset += n
    if meta:
        header["__metadata__"] = meta
    return header


def rank0_of_two(name, logical, tp_dim):
    shape = list(logical)
    if tp_dim >= 0:
        shape[tp_dim] //= 2
    return shape


header = shard_header(rank0_of_two,
                      lambda logical: {"logical_shape": logical, "offset": [0] * len(logical)})
write("reshard", "tp2_rank0", json.dumps(header))
header["__metadata__"]["slice/param/wte"] = json.dumps({"logical_shape": [32, 8], "offset": [24, 0]})
write("reshard", "outside", json.dumps(header))
# ... and a whole TP 1 checkpoint in llm.c's shapes (qkvw [L, 3C, C]): TP 1 reads it as it is,
# rank 1 of TP 2 assembles its slices from it.
write("reshard", "tp1_whole", json.dumps(shard_header(
    lambda name, logical, tp_dim:
        [L, 3 * C, C] if name == "qkvw" else [L, 3 * C] if name == "qkvb" else logical)))

# measured_profile: what `kubetrain-worker profile` writes, and a GPU kind with a few figures.
write("measured_profile", "cpu", json.dumps({
    "apiVersion": "kubetrain.dev/v1alpha1", "kind": "HardwareProfile", "metadata": {"name": "cpu"},
    "provenance": {"host": "vm", "date": "2026-12-03T15:22:37Z", "threads": "2"},
    "spec": {"peakFp32Flops": 1.05e11, "achievedFraction": 0.88, "allreduceLatency": 1.65e-4,
             "intraAllreduceBusbw": 9.3e8, "overlapInterference": 0.75},
    "measurements": {"gemmFlopsPerSecond": 2.1e11}}))
write("measured_profile", "h200", "apiVersion: kubetrain.dev/v1alpha1\nkind: HardwareProfile\n"
      "metadata: {name: NVIDIA-H200}\nspec: {peakBf16Flops: 7.0e14, hostLinkBandwidth: 5.0e10}\n")

#!/usr/bin/env bash
# The container image (Dockerfile) as a pod runs it:   tests/image/image_test.sh [BIN_DIR]
# Builds it with scripts/build-image.sh (buildah on a debootstrapped Debian 12 base, CPU only) —
# with BIN_DIR, from the binaries the test build made there (--binaries: the Dockerfile's runtime
# stage as written, its build stage replaced by those binaries, which saves compiling them a
# second time; `make image` runs the build stage) — then checks, with `buildah run` as the
# image's user 65532:
#   - `kubetrain-worker --version` / `kubetrain --version` print the CMake project version;
#     `kubetrain-operator --help` works; every shared library the binaries need is there (ldd);
#   - nothing in the image is writable for that user but the checkpoint directory (with /tmp,
#     /var/tmp and /run/lock locked too), which stands in for a read-only root filesystem;
#   - a `tiny` job planned inside the image trains there and writes its checkpoint into a mounted
#     host directory, as uid 65532;
#   - no compiler, CMake, Ninja, make or -dev package is in the image; it has at most 4 layers
#     and stays under SIZE_LIMIT_MB (default 200; CPU build measured 147 MB).
# Without running it, the Dockerfile's build stage is checked to install a package for every
# find_package() of the top-level CMakeLists.txt and to build the three binaries this test packs.
# Exit 77 (skipped) only where the image cannot be built at all here (not root).
set -u
cd "$(dirname "$0")/../.."
SIZE_LIMIT_MB=${SIZE_LIMIT_MB:-200}
IMAGE=localhost/kubetrain
B=(buildah --storage-driver "${KUBETRAIN_STORAGE_DRIVER:-vfs}")
DIR=$(mktemp -d)
CTR=
trap '[[ -n $CTR ]] && "${B[@]}" rm "$CTR" >/dev/null 2>&1; rm -rf "$DIR"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }
run() {  # run [OPTIONS] -- CMD...: CMD in the test container
  local opts=()
  while [[ $1 != -- ]]; do opts+=("$1"); shift; done
  shift
  "${B[@]}" run --isolation chroot "${opts[@]}" "$CTR" -- "$@" </dev/null
}

BIN_DIR=${1:-}

# The build stage, read: a Debian package for each dependency CMake finds, the binaries it builds.
python3 - <<'PY' || fail "the Dockerfile's build stage does not match CMakeLists.txt"
import re
docker = open("Dockerfile").read()
stage = docker[docker.index("AS build"):docker.index("COPY . /src")]
packages = set(re.findall(r"[a-z0-9][a-z0-9.+-]+", " ".join(re.findall(r"--no-install-recommends([^;]*);", stage))))
# find_package() name -> the Debian 12 package that provides it (g++ brings OpenMP and Threads).
provider = {"Threads": "g++", "OpenMP": "g++", "yaml-cpp": "libyaml-cpp-dev",
            "nlohmann_json": "nlohmann-json3-dev", "CLI11": "libcli11-dev", "dnnl": "libdnnl-dev",
            "cpprestsdk": "libcpprest-dev", "OpenSSL": "libssl-dev", "Gloo": "libgloo-dev",
            "CUDAToolkit": "cuda-nvcc-$CUDA_VERSION", "GTest": None}
top = open("CMakeLists.txt").read()
missing = []
for name in sorted(set(re.findall(r"find_package\((\S+)", top))):
    assert name in provider, f"find_package({name}) in CMakeLists.txt: say in tests/image/image_test.sh which package provides it"
    want = provider[name]
    if want and want.replace("$CUDA_VERSION", "") not in packages and want not in stage:
        missing.append(f"{name} ({want})")
# dnnl's CMake config needs the OpenCL loader's headers (docs/ARCHITECTURE.md §8).
if "ocl-icd-opencl-dev" not in packages:
    missing.append("dnnl's OpenCL loader (ocl-icd-opencl-dev)")
assert not missing, "the build stage installs nothing for: " + ", ".join(missing)
build = re.search(r"cmake --build \S+ -j \S+ --target ([^;]+);", docker)
assert build and set(build.group(1).split()) == {"kubetrain-operator", "kubetrain-worker", "kubetrain"}, \
    "the build stage does not build exactly kubetrain, kubetrain-operator and kubetrain-worker"
print(f"Dockerfile build stage: {len(packages)} packages cover CMakeLists.txt's find_package()s")
PY

[[ $(id -u) -eq 0 ]] || { echo "SKIP: building the image needs root (debootstrap, buildah)"; exit 77; }
start=$(now)
build_args=()
[[ -n $BIN_DIR ]] && build_args=(--binaries "$BIN_DIR")
scripts/build-image.sh "${build_args[@]}" > "$DIR/build.log" 2>&1
rc=$?
[[ $rc -eq 3 ]] && { tail -3 "$DIR/build.log"; echo "SKIP: the image cannot be built here"; exit 77; }
[[ $rc -eq 0 ]] || { tail -40 "$DIR/build.log"; fail "scripts/build-image.sh exited $rc"; }
grep '^build-image: ' "$DIR/build.log"
echo "build: $(grep -c '^--> Using cache' "$DIR/build.log") of $(grep -c 'STEP [0-9]*/' "$DIR/build.log") steps from the cache"
echo "image built in $(since "$start")"
t=$(now)

VERSION=$(sed -n 's/^project(kubetrain VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
inspect() { "${B[@]}" inspect --type image --format "$1" "$IMAGE:$VERSION"; }
[[ $(inspect '{{.OCIv1.Config.User}}') == 65532:65532 ]] || fail "image user: $(inspect '{{.OCIv1.Config.User}}')"
[[ $(inspect '{{index .OCIv1.Config.Labels "org.opencontainers.image.version"}}') == "$VERSION" ]] ||
  fail "org.opencontainers.image.version label is not $VERSION"
for l in title description revision source; do
  [[ -n $(inspect "{{index .OCIv1.Config.Labels \"org.opencontainers.image.$l\"}}") ]] ||
    fail "no org.opencontainers.image.$l label"
done
layers=$(inspect '{{len .OCIv1.RootFS.DiffIDs}}')
[[ $layers -le 4 ]] || fail "$layers layers (want at most 4: base, packages, binaries)"

CTR=$("${B[@]}" from --pull=never --name "kubetrain-image-test-$$" "$IMAGE:$VERSION") ||
  fail "buildah from $IMAGE:$VERSION"
ROOT=$("${B[@]}" mount "$CTR") || fail "buildah mount"

# What is (not) in the image.
size_mb=$(du -sxm "$ROOT" | cut -f1)
[[ $size_mb -le $SIZE_LIMIT_MB ]] || fail "image is $size_mb MB, over the $SIZE_LIMIT_MB MB bound"
for tool in gcc g++ cc c++ cmake ninja make ld as nvcc; do
  for d in /usr/bin /usr/local/bin /bin /usr/local/cuda/bin; do
    [[ -e $ROOT$d/$tool ]] && fail "build tool $d/$tool is in the image"
  done
done
dev=$(sed -n 's/^Package: \(.*-dev\)$/\1/p' "$ROOT/var/lib/dpkg/status" | tr '\n' ' ')
[[ -z $dev ]] || fail "-dev packages in the image: $dev"
[[ ! -e $ROOT/usr/include/dnnl.hpp && ! -e $ROOT/usr/include/c++ ]] || fail "headers in the image"
for b in kubetrain-operator kubetrain-worker kubetrain; do
  [[ $(stat -c '%u %A' "$ROOT/usr/local/bin/$b") == "0 -rwxr-xr-x" ]] ||
    fail "/usr/local/bin/$b: $(stat -c '%u %A' "$ROOT/usr/local/bin/$b") (want root's, 0755)"
done
echo "image: $size_mb MB on disk, $layers layers, user 65532:65532, no build tools"

# The binaries, as the image's user.
out=$(run -- kubetrain-worker --version 2>&1) || fail "kubetrain-worker --version: $out"
[[ $out == *"$VERSION"* ]] || fail "kubetrain-worker --version printed '$out', not $VERSION"
out=$(run -- kubetrain --version 2>&1) || fail "kubetrain --version: $out"
[[ $out == *"$VERSION"* ]] || fail "kubetrain --version printed '$out', not $VERSION"
out=$(run -- kubetrain-operator --help 2>&1) || fail "kubetrain-operator --help: $out"
[[ $out == *"--leader-elect"* ]] || fail "kubetrain-operator --help: $(head -3 <<<"$out")"
out=$(run -- sh -c 'ldd /usr/local/bin/kubetrain-operator /usr/local/bin/kubetrain-worker /usr/local/bin/kubetrain' 2>&1) ||
  fail "ldd: $out"
! grep -q 'not found' <<<"$out" || fail "missing shared libraries: $(grep 'not found' <<<"$out" | sort -u)"

# Read-only root: lock /tmp, /var/tmp, /run/lock and the user's HOME as well, then nothing but the
# checkpoint mount point may be writable for uid 65532.
run --user 0:0 -- chmod 0755 /tmp /var/tmp /run/lock || fail "chmod as root"
run --user 0:0 -- chmod 0555 /var/lib/kubetrain || fail "chmod as root"
writable=$(run -- find / \( -path /proc -o -path /sys -o -path /dev \) -prune -o -writable -print 2>/dev/null |
           grep -vx /var/lib/kubetrain/checkpoints)
[[ -z $writable ]] || fail "writable for uid 65532 besides the checkpoint directory: $(head -5 <<<"$writable")"

# A tiny job, planned and trained in the image; the checkpoint goes to a mounted host directory.
mkdir -p "$DIR/plan" "$DIR/ckpt"
chown 65532:65532 "$DIR/ckpt"
run -- kubetrain plan /usr/share/kubetrain/examples/jobs/tiny.yaml \
  --cluster /usr/share/kubetrain/examples/clusters/cpu-local.yaml -o json > "$DIR/plan/plan.json" 2>"$DIR/plan.err" ||
  fail "kubetrain plan in the image: $(cat "$DIR/plan.err")"
steps=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["training"]["steps"])' "$DIR/plan/plan.json") ||
  fail "the plan is not JSON with training.steps: $(head -c 300 "$DIR/plan/plan.json")"
run -v "$DIR/plan:/etc/kubetrain:ro" -v "$DIR/ckpt:/var/lib/kubetrain/checkpoints" -- \
  sh -c 'echo "uid $(id -u) gid $(id -g)"; exec kubetrain-worker train --plan /etc/kubetrain/plan.json \
           --checkpoint-dir /var/lib/kubetrain/checkpoints --log-every 50' > "$DIR/train.log" 2>&1 ||
  { tail -20 "$DIR/train.log"; fail "training in the image failed"; }
grep -qx 'uid 65532 gid 65532' "$DIR/train.log" || fail "not run as 65532:65532: $(head -1 "$DIR/train.log")"
grep -q "^done: $steps steps" "$DIR/train.log" || { tail -5 "$DIR/train.log"; fail "no 'done: $steps steps'"; }
[[ -f $DIR/ckpt/latest ]] || fail "no checkpoint in the mounted directory: $(ls -la "$DIR/ckpt")"
others=$(find "$DIR/ckpt" -mindepth 1 ! -uid 65532)
[[ -z $others ]] || fail "checkpoint files not written by uid 65532: $others"
echo "trained $steps steps in the image as uid 65532; checkpoint $(cat "$DIR/ckpt/latest") in the mounted directory"
echo "checks took $(since "$t"); whole test $(since "$start")"
echo "PASS"

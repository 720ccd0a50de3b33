#!/usr/bin/env bash
# Installs every Debian 12 package kubetrain needs to build, test and benchmark.
# Idempotent: when everything is already installed it only runs dpkg-query (well under a second).
# Facts behind the list: ../shared/TOOLCHAIN.md (e.g. dnnl's CMake config needs ocl-icd-opencl-dev).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git python3
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcpprest-dev libssl-dev libboost-system-dev zlib1g-dev
  libgloo-dev libdnnl-dev ocl-icd-opencl-dev libopenblas-dev
  prometheus wrk hyperfine
  openssl  # the kube TLS tests make a CA and certificates and run `openssl s_server`
)
# kubectl is not a Debian 12 package: tests/cli/kubectl_test.sh is skipped (exit 77) without it.

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${#missing[@]} missing package(s): ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: not root and no sudo; install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
$SUDO apt-get update -q
# --no-install-recommends keeps the set small; ocl-icd-opencl-dev is therefore named explicitly.
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install-deps: done"

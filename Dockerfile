# The kubetrain image: kubetrain-operator, kubetrain-worker and kubetrain in /usr/local/bin, built
# from this tree with the project's CMake, on Debian 12. docs/INSTALL.md, "Building the image".
#
#   GPU (the default, CUDA 13.0):  docker build -t kubetrain:0.1.0 .
#   CPU only:                      docker build --build-arg CUDA=OFF -t kubetrain:0.1.0-cpu .
#   without a daemon:              make image   (scripts/build-image.sh: buildah, CPU only)
#
# Why Debian 12 and not an nvidia/cuda image: the code is written against Debian 12's packages
# (oneDNN 2.6 with the 2.x API, CMake >= 3.25, yaml-cpp 0.7, Gloo 2022, cpprestsdk 2.10). NVIDIA's
# CUDA 13.0 images (nvidia/cuda:13.0.0-devel-ubuntu24.04, -ubuntu22.04, RHEL-likes) have no Debian
# tags, and their Ubuntus do not fit: 24.04 ships oneDNN 3.1 (the 3.x API, which this code does
# not compile against), 22.04 CMake 3.22, oneDNN 2.2 and a 2020 Gloo. So both stages are Debian 12,
# and with CUDA=ON the toolkit parts come from NVIDIA's Debian 12 apt repository (nvcc, cudart,
# cuBLAS, NCCL). The runtime stage holds only runtime packages (no -dev, no compiler): the
# libraries that `ldd` shows the binaries load, and libnccl2, which the worker dlopens.

# Bases: both must be Debian 12 (bookworm). The runtime's default is the slim variant (no docs,
# man pages or locales). scripts/build-image.sh points both at a debootstrapped
# localhost/debian:bookworm made the same way.
ARG BUILD_BASE=debian:12
ARG RUNTIME_BASE=debian:12-slim

# ---- build ----------------------------------------------------------------------------------
FROM ${BUILD_BASE} AS build
# ON: the CUDA path (device: cuda plans); OFF: a CPU-only image (-DKUBETRAIN_CUDA=OFF).
ARG CUDA=ON
# CUDA release, as NVIDIA's Debian package names spell it (cuda-nvcc-13-0, libcublas-13-0).
ARG CUDA_VERSION=13-0
ARG CUDA_ARCHITECTURES=80;90
ARG CUDA_REPO=https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64
ARG JOBS=2
# One layer: the Debian -dev packages of scripts/install-deps.sh that the three binaries need (no
# gtest, benchmark, OpenBLAS or tools), and with CUDA=ON the toolkit parts from NVIDIA's repository,
# NCCL pinned to the build for this CUDA release.
RUN set -eu; export DEBIAN_FRONTEND=noninteractive; \
    apt-get update -q; \
    apt-get install -y -q --no-install-recommends g++ cmake ninja-build \
      libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libcpprest-dev libssl-dev \
      libboost-system-dev zlib1g-dev libgloo-dev libdnnl-dev ocl-icd-opencl-dev; \
    if [ "$CUDA" = ON ]; then \
      apt-get install -y -q --no-install-recommends ca-certificates curl; \
      curl -fsSL -o /tmp/cuda-keyring.deb "$CUDA_REPO/cuda-keyring_1.1-1_all.deb"; \
      dpkg -i /tmp/cuda-keyring.deb; rm /tmp/cuda-keyring.deb; apt-get update -q; \
      nccl=$(apt-cache madison libnccl-dev | awk -F' *[|] *' -v c="+cuda$(echo "$CUDA_VERSION" | tr - .)" \
             'index($2, c) { print $2; exit }'); \
      [ -n "$nccl" ] || { echo "no libnccl-dev for CUDA $CUDA_VERSION in $CUDA_REPO" >&2; exit 1; }; \
      apt-get install -y -q --no-install-recommends "cuda-nvcc-$CUDA_VERSION" \
        "cuda-cudart-dev-$CUDA_VERSION" "libcublas-dev-$CUDA_VERSION" "libnccl-dev=$nccl" "libnccl2=$nccl"; \
    elif [ "$CUDA" != OFF ]; then echo "CUDA must be ON or OFF, not '$CUDA'" >&2; exit 1; \
    fi; \
    rm -rf /var/lib/apt/lists/*
COPY . /src
# The project's CMake, tests and benchmarks off, only the three binaries' targets. RelWithDebInfo
# (what `make` and the tests build: -O2 -DNDEBUG) without -g, then stripped: the same code, a
# smaller image and a shorter build. With CUDA=ON the build fails unless the worker links cudart.
RUN set -eu; \
    cuda_flags=-DKUBETRAIN_CUDA=OFF; \
    if [ "$CUDA" = ON ]; then \
      cuda_flags="-DKUBETRAIN_CUDA=ON -DCMAKE_CUDA_COMPILER=/usr/local/cuda-$(echo "$CUDA_VERSION" | tr - .)/bin/nvcc"; \
      cuda_flags="$cuda_flags -DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHITECTURES"; \
    fi; \
    cmake -S /src -B /tmp/build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -DNDEBUG" "-DCMAKE_CUDA_FLAGS_RELWITHDEBINFO=-O2 -DNDEBUG" \
      -DKUBETRAIN_TESTS=OFF -DKUBETRAIN_BENCH=OFF $cuda_flags; \
    cmake --build /tmp/build -j "$JOBS" --target kubetrain-operator kubetrain-worker kubetrain; \
    mkdir -p /out/usr/local/bin /out/usr/share/kubetrain; \
    for b in kubetrain-operator kubetrain-worker kubetrain; do \
      strip --strip-unneeded -o "/out/usr/local/bin/$b" "/tmp/build/bin/$b"; done; \
    cp -r /src/examples /src/crds /out/usr/share/kubetrain/; \
    if [ "$CUDA" = ON ]; then \
      ldd /out/usr/local/bin/kubetrain-worker | grep -q libcudart || \
        { echo "CUDA=ON but kubetrain-worker was built without the CUDA path" >&2; exit 1; }; \
    fi; \
    rm -rf /tmp/build

# ---- runtime --------------------------------------------------------------------------------
FROM ${RUNTIME_BASE}
ARG CUDA=ON
ARG CUDA_VERSION=13-0
ARG CUDA_REPO=https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64
# One layer: the runtime packages (cpprest, oneDNN and its OpenCL loader, Gloo, yaml-cpp, libgomp;
# with CUDA=ON cudart, cuBLAS and NCCL from NVIDIA's repository), the user 65532 and the
# directories the pods mount: /etc/kubetrain (the plan), /var/lib/kubetrain/checkpoints, /data.
RUN set -eu; export DEBIAN_FRONTEND=noninteractive; \
    apt-get update -q; \
    apt-get install -y -q --no-install-recommends libcpprest2.10 libdnnl2 ocl-icd-libopencl1 \
      libgloo0 libyaml-cpp0.7 libgomp1; \
    if [ "$CUDA" = ON ]; then \
      apt-get install -y -q --no-install-recommends ca-certificates curl; \
      curl -fsSL -o /tmp/cuda-keyring.deb "$CUDA_REPO/cuda-keyring_1.1-1_all.deb"; \
      dpkg -i /tmp/cuda-keyring.deb; rm /tmp/cuda-keyring.deb; apt-get update -q; \
      nccl=$(apt-cache madison libnccl2 | awk -F' *[|] *' -v c="+cuda$(echo "$CUDA_VERSION" | tr - .)" \
             'index($2, c) { print $2; exit }'); \
      [ -n "$nccl" ] || { echo "no libnccl2 for CUDA $CUDA_VERSION in $CUDA_REPO" >&2; exit 1; }; \
      apt-get install -y -q --no-install-recommends "cuda-cudart-$CUDA_VERSION" \
        "libcublas-$CUDA_VERSION" "libnccl2=$nccl"; \
      apt-get purge -y -q --auto-remove curl; \
      echo "/usr/local/cuda-$(echo "$CUDA_VERSION" | tr - .)/targets/x86_64-linux/lib" \
        > /etc/ld.so.conf.d/kubetrain-cuda.conf; \
      ldconfig; \
    fi; \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log; \
    echo 'kubetrain:x:65532:65532:kubetrain:/var/lib/kubetrain:/usr/sbin/nologin' >> /etc/passwd; \
    echo 'kubetrain:x:65532:' >> /etc/group; \
    mkdir -p /etc/kubetrain /var/lib/kubetrain/checkpoints /data; \
    chown -R 65532:65532 /var/lib/kubetrain
# The binaries (stripped), examples/ and crds/ (as /usr/share/kubetrain/...), owned by root.
COPY --from=build /out/ /

# The binaries write nothing outside the worker's checkpoint directory (the operator mounts a PVC
# or an emptyDir there) and /dev/termination-log (the kubelet's), so the root filesystem can be
# read-only (the operator also mounts emptyDirs at /tmp and /dev/shm). HOME is the user's
# directory, which nothing writes either.
ENV HOME=/var/lib/kubetrain \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
WORKDIR /var/lib/kubetrain
USER 65532:65532
CMD ["kubetrain", "--help"]

# Last, so that a new revision does not invalidate the layers above.
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=https://github.com/kubetrain/kubetrain
LABEL org.opencontainers.image.title="kubetrain" \
      org.opencontainers.image.description="Kubernetes-native GPT training operator: kubetrain-operator, kubetrain-worker and the kubetrain CLI" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      dev.kubetrain.cuda="${CUDA}"

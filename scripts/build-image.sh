#!/usr/bin/env bash
# Builds the kubetrain image from the Dockerfile without a Docker daemon or a registry: buildah
# (vfs storage, chroot isolation) on a Debian 12 base that debootstrap makes once from this
# machine's Debian mirror (docs/ARCHITECTURE.md §8). CPU-only by default: NVIDIA's repository, which
# the CUDA build needs, is not reachable here. `make image` runs it; docs/INSTALL.md, "Building
# the image".
#
#   scripts/build-image.sh [--binaries DIR]
# --binaries DIR packs kubetrain, kubetrain-operator and kubetrain-worker from DIR (a CPU build
# made on Debian 12; DIR/kubetrain-worker-cpu stands in for a kubetrain-worker built with the CUDA
# path) instead of compiling them in the Dockerfile's build stage: a build context named "build"
# replaces that stage with the same /out tree (stripped binaries, examples/, crds/). The image
# test's way (tests/image), which reuses the binaries the test build made; without it the
# Dockerfile compiles, as `make image` does.
#
# Tags IMAGE:latest and IMAGE:VERSION (VERSION from CMakeLists.txt's project()). Environment:
#   IMAGE      default localhost/kubetrain
#   CUDA       OFF (default) or ON
#   JOBS       parallel compile jobs in the build stage, default 2
#   BASE       the base of both stages, default localhost/debian:bookworm (made here when absent)
#   KUBETRAIN_STORAGE_DRIVER  buildah's storage driver, default vfs
#   KUBETRAIN_IMAGE_CACHE  where the debootstrapped root filesystem is kept, default
#              /var/cache/kubetrain-image
# Exit codes: 0 built, 1 failed, 3 cannot build here (not root, so no debootstrap or buildah).
set -euo pipefail
cd "$(dirname "$0")/.."

BINARIES=
while [[ $# -gt 0 ]]; do
  case $1 in
    --binaries) BINARIES=${2:?--binaries needs a directory}; shift 2 ;;
    --binaries=*) BINARIES=${1#--binaries=}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-image: unknown argument '$1' (see --help)" >&2; exit 1 ;;
  esac
done

IMAGE=${IMAGE:-localhost/kubetrain}
CUDA=${CUDA:-OFF}
JOBS=${JOBS:-2}
BASE=${BASE:-localhost/debian:bookworm}
CACHE=${KUBETRAIN_IMAGE_CACHE:-/var/cache/kubetrain-image}
# vfs: works on any file system (overlay may not, e.g. nested in a container), at the price of a
# full copy per layer. buildah 1.28 ignores STORAGE_DRIVER, hence the flag on every call.
DRIVER=${KUBETRAIN_STORAGE_DRIVER:-vfs}
export BUILDAH_ISOLATION=chroot

say() { echo "build-image: $*"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }

if [[ $(id -u) -ne 0 ]]; then
  say "needs root (debootstrap, and buildah with the vfs driver and chroot isolation)" >&2
  exit 3
fi
if ! command -v buildah >/dev/null || ! command -v debootstrap >/dev/null; then
  say "installing buildah and debootstrap"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends buildah debootstrap
fi
buildah() { command buildah --storage-driver "$DRIVER" "$@"; }

VERSION=$(sed -n 's/^project(kubetrain VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
[[ -n $VERSION ]] || { say "no project(kubetrain VERSION ...) in CMakeLists.txt" >&2; exit 1; }
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [[ $REVISION != unknown ]] && [[ -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]]; then
  REVISION=$REVISION-dirty
fi
source_args=()  # org.opencontainers.image.source: the origin remote where there is one
if url=$(git remote get-url origin 2>/dev/null) && [[ -n $url ]]; then
  source_args=(--build-arg "SOURCE=$url")
fi

# ---- the base: debootstrap --variant=minbase bookworm, once --------------------------------------
make_rootfs() {  # make_rootfs DIR: a minimal Debian 12 like the debian:12-slim image
  local dir=$1 mirror
  mirror=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  mirror=${mirror:-http://deb.debian.org/debian}
  umount "$dir/proc" 2>/dev/null || true  # left mounted by an interrupted run
  rm -rf --one-file-system "$dir"
  mkdir -p "$(dirname "$dir")"
  say "debootstrap --variant=minbase bookworm from $mirror"
  debootstrap --variant=minbase bookworm "$dir" "$mirror" >"$dir.log" 2>&1 ||
    { tail -20 "$dir.log" >&2; return 1; }
  # apt sources as this machine's (bookworm, bookworm-updates, bookworm-security), else Debian's.
  rm -f "$dir/etc/apt/sources.list"
  if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
    cp /etc/apt/sources.list.d/debian.sources "$dir/etc/apt/sources.list.d/"
  else
    cat >"$dir/etc/apt/sources.list.d/debian.sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  fi
  # What debian:12-slim leaves out of every package installed later: docs (but the copyright
  # files), man pages, locales.
  cat >"$dir/etc/dpkg/dpkg.cfg.d/excludes" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
EOF
  # Security and point-release updates of the base packages, then the same clean-up.
  cp /etc/resolv.conf "$dir/etc/resolv.conf"
  mount -t proc proc "$dir/proc"
  local rc=0
  chroot "$dir" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    sh -c 'apt-get update -q && apt-get upgrade -y -q' >>"$dir.log" 2>&1 || rc=$?
  umount "$dir/proc"
  [[ $rc -eq 0 ]] || { tail -20 "$dir.log" >&2; return 1; }
  find "$dir/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$dir/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$dir"/usr/share/{man,groff,info,lintian,linda,locale}/* "$dir"/var/lib/apt/lists/* \
         "$dir"/var/cache/apt/* "$dir"/var/log/* "$dir"/tmp/* "$dir"/etc/resolv.conf
  : >"$dir/etc/machine-id" 2>/dev/null || true
}

if ! buildah inspect --type image "$BASE" >/dev/null 2>&1; then
  [[ $BASE == localhost/debian:bookworm ]] ||
    { say "the base $BASE is not in buildah's storage (and only localhost/debian:bookworm is made here)" >&2; exit 1; }
  rootfs=$CACHE/bookworm-rootfs
  t=$(now)
  if [[ ! -f $rootfs.done ]]; then
    make_rootfs "$rootfs"
    touch "$rootfs.done"
    say "root filesystem made in $(since "$t") ($(du -sh "$rootfs" | cut -f1)), kept in $rootfs"
  fi
  t=$(now)
  c=$(buildah from scratch)
  m=$(buildah mount "$c")
  cp -a "$rootfs/." "$m/"
  buildah umount "$c" >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd bash --label org.opencontainers.image.description="debootstrap --variant=minbase bookworm" "$c"
  buildah commit -q --rm "$c" "$BASE" >/dev/null
  say "committed $BASE in $(since "$t")"
fi

# ---- the image -----------------------------------------------------------------------------------
t=$(now)
log=$(mktemp)
stage=
trap 'rm -f "$log"; [[ -z $stage ]] || rm -rf "$stage"' EXIT
context_args=()
if [[ -n $BINARIES ]]; then
  # The build stage's /out tree, from binaries built here (the Dockerfile's build stage does the
  # same: strip each binary, copy examples/ and crds/).
  [[ $CUDA == OFF ]] || { say "--binaries packs a CPU build: CUDA must be OFF" >&2; exit 1; }
  stage=$(mktemp -d)
  mkdir -p "$stage/out/usr/local/bin" "$stage/out/usr/share/kubetrain"
  for b in kubetrain-operator kubetrain-worker kubetrain; do
    src=$BINARIES/$b
    [[ $b == kubetrain-worker && -x $BINARIES/kubetrain-worker-cpu ]] && src=$BINARIES/kubetrain-worker-cpu
    [[ -x $src ]] || { say "--binaries: no $src" >&2; exit 1; }
    strip --strip-unneeded -o "$stage/out/usr/local/bin/$b" "$src"
    chmod 0755 "$stage/out/usr/local/bin/$b"
  done
  if ldd "$stage/out/usr/local/bin/kubetrain-worker" | grep -qE 'libcudart|libcublas'; then
    say "--binaries: $BINARIES's kubetrain-worker has the CUDA path; the CPU image needs a CPU build (kubetrain-worker-cpu)" >&2
    exit 1
  fi
  cp -r examples crds "$stage/out/usr/share/kubetrain/"
  context_args=(--build-context "build=$stage")
  say "packing the binaries of $BINARIES (the Dockerfile's build stage is not run)"
fi
say "building $IMAGE:$VERSION (CUDA=$CUDA, revision $REVISION) on $BASE"
set +e
buildah bud --layers --force-rm --pull=never --isolation chroot \
  --build-arg BUILD_BASE="$BASE" --build-arg RUNTIME_BASE="$BASE" \
  --build-arg CUDA="$CUDA" --build-arg JOBS="$JOBS" \
  --build-arg VERSION="$VERSION" --build-arg REVISION="$REVISION" "${source_args[@]}" \
  "${context_args[@]}" \
  -t "$IMAGE:latest" -t "$IMAGE:$VERSION" -f Dockerfile . 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
[[ $rc -eq 0 ]] || { say "buildah bud failed (exit $rc)"; exit 1; }

# vfs stores every layer as a full copy: drop the untagged images of earlier builds (a source
# change leaves a stale COPY and compile layer of about 1 GB each), keeping this build's own
# layers, which are the cache of the next build.
keep=" $(grep -oE -- '^--> (Using cache )?[0-9a-f]{11,64}' "$log" | grep -oE '[0-9a-f]{11,64}$' |
        cut -c1-11 | tr '\n' ' ') "
removed=0
for _ in 1 2 3 4 5 6; do  # parents become removable once their stale children are gone
  progress=0
  while read -r id name; do
    [[ $name == "<none>" || $name == "<none>:<none>" ]] || continue
    [[ $keep == *" ${id:0:11} "* ]] && continue
    if buildah rmi "$id" >/dev/null 2>&1; then removed=$((removed + 1)); progress=1; fi
  done < <(buildah images --all --noheading --format '{{.ID}} {{.Name}}:{{.Tag}}')
  [[ $progress -eq 1 ]] || break
done
[[ $removed -eq 0 ]] || say "removed $removed stale cached image(s) of earlier builds"

size=$(buildah images --noheading --format '{{.Size}}' "$IMAGE:latest" | awk 'NR == 1')
say "built $IMAGE:latest and $IMAGE:$VERSION in $(since "$t"), $size"

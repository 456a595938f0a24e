#!/usr/bin/env bash
# The compose tier (`make compose-test`; scripts/test.sh runs it under CI=true):
# installs podman and Debian's docker-compose, builds the images once per set of
# inputs (scripts/compose/build.sh), then tests/compose starts docker-compose.yml
# under podman and walks a newcomer's steps against the published ports.
#
# Where no image can be pulled (this project's CI), the base image and the
# third-party services are stand-ins made here from Debian's and PyPI's packages
# (COMPOSE_STANDIN=1, found out by a pull that fails; docker-compose.standin.yml).
# CI=true: a tool that cannot be installed fails the tier; otherwise it is skipped.
set -euo pipefail
cd "$(dirname "$0")/../.."
started=$SECONDS

case "${CI:-}" in
  true | 1 | yes) strict=1 ;;
  *) strict=0 ;;
esac
cannot_run() {
  if ((strict)); then
    echo "CI=true: the compose tier cannot run: $1" >&2
    exit 1
  fi
  echo "WARNING: $1: the compose tier is SKIPPED (CI=true fails here)" >&2
  exit 0
}
apt_install() {
  apt-get -o DPkg::Lock::Timeout=600 update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "$@"
}

# netavark and aardvark-dns: the compose services find each other by name;
# catatonit: podman's init; debootstrap: the stand-in base.
packages=()
for tool in podman:podman netavark:netavark aardvark-dns:aardvark-dns catatonit:catatonit \
  debootstrap:debootstrap docker-compose:docker-compose; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || [[ -x "/usr/lib/podman/${tool%%:*}" ]] \
    || packages+=("${tool#*:}")
done
if ((${#packages[@]})); then
  apt_install "${packages[@]}" >/dev/null || true
fi
for tool in podman docker-compose debootstrap; do
  command -v "$tool" >/dev/null 2>&1 || cannot_run "$tool could not be installed"
done
export CONTAINERS_CONF="$PWD/scripts/compose/containers.conf"
# crun (podman's default runtime here) refuses a host with cgroups in hybrid mode
# (v1 controllers beside a v2 "unified" mount: "cgroups in hybrid mode not
# supported"); runc runs there. The runtime is picked for this run only, in a copy
# of the settings, so a machine where crun works keeps it.
if [[ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" == tmpfs \
  && "$(stat -fc %T /sys/fs/cgroup/unified 2>/dev/null)" == cgroup2fs ]]; then
  command -v runc >/dev/null 2>&1 || apt_install runc >/dev/null || true
  command -v runc >/dev/null 2>&1 || cannot_run "cgroups in hybrid mode need runc, which could not be installed"
  conf="$(mktemp -t compose-containers.XXXXXX.conf)"
  { cat "$CONTAINERS_CONF"; printf '\n[engine]\nruntime = "runc"\n'; } >"$conf"
  export CONTAINERS_CONF="$conf"
  echo "compose tier: cgroups in hybrid mode: containers run with runc"
fi
echo "compose tier: tools ready in $((SECONDS - started)) s"

if [[ -z "${COMPOSE_STANDIN:-}" ]]; then
  COMPOSE_STANDIN=0
  if ! podman image exists python:3.11-slim-bookworm \
    && ! timeout 120 podman pull -q docker.io/library/python:3.11-slim-bookworm >/dev/null 2>&1; then
    echo "compose tier: no image can be pulled here: stand-ins from Debian's packages"
    COMPOSE_STANDIN=1
  fi
fi
export COMPOSE_STANDIN
logs="$(mktemp -d -t compose-build.XXXXXX)"
trap 'rm -rf "$logs" "${conf:-}"' EXIT
if [[ "$COMPOSE_STANDIN" == 1 ]]; then
  bash scripts/compose/standin-base.sh
  # The two builds side by side: mostly downloads and unpacking.
  BUILD_LOG="$logs/standins" bash scripts/compose/build.sh standins &
  standins=$!
  BUILD_LOG="$logs/product" bash scripts/compose/build.sh product || { wait "$standins" || true; exit 1; }
  wait "$standins"
else
  BUILD_LOG="$logs/product" bash scripts/compose/build.sh product
fi
echo "compose tier: images ready in $((SECONDS - started)) s"

.venv/bin/pytest tests/compose -m compose -q -p no:cacheprovider -n 0 "$@"
echo "compose tier: done in $((SECONDS - started)) s"

#!/usr/bin/env bash
# Makes the stand-in base images on a machine that cannot pull from a registry
# (docs/operators/deployment.md, "Where no image can be pulled"): built only
# from Debian's packages, named so that nobody mistakes them for the public ones.
#   localhost/debian-bookworm-minbase-standin   debootstrap --variant=minbase bookworm
#   localhost/python-3.11-slim-standin          that, plus Debian's python3 (3.11)
#                                               in a venv on PATH, as python:3.11-slim has
# Idempotent: an image that exists is kept (STANDIN_REBUILD=1 remakes them).
set -euo pipefail
cd "$(dirname "$0")/../.."
PODMAN=(podman)
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
BASE=localhost/debian-bookworm-minbase-standin
PYTHON_BASE=localhost/python-3.11-slim-standin
# This machine refuses podman's default ulimits (docs/operators/deployment.md).
ULIMITS=(--ulimit nofile=1024:1024 --ulimit nproc=1024:1024)

have() { [[ "${STANDIN_REBUILD:-0}" != 1 ]] && "${PODMAN[@]}" image exists "$1"; }

if ! have "$BASE"; then
  root="$(mktemp -d -t standin-root.XXXXXX)"
  trap 'rm -rf "$root"' EXIT
  started=$SECONDS
  debootstrap --variant=minbase bookworm "$root" "$MIRROR" >/dev/null
  # Debian's security and point-release updates too, as the public images have.
  printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb http://security.debian.org/debian-security bookworm-security main\n' \
    "$MIRROR" "$MIRROR" >"$root/etc/apt/sources.list"
  # Empty apt lists and caches, as the public image ships them.
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
  tar -C "$root" -c . | "${PODMAN[@]}" import \
    --change 'CMD ["bash"]' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    - "$BASE" >/dev/null 2>&1
  rm -rf "$root"
  trap - EXIT
  echo "standin-base: $BASE made in $((SECONDS - started)) s"
fi

if ! have "$PYTHON_BASE"; then
  started=$SECONDS
  "${PODMAN[@]}" build -q "${ULIMITS[@]}" --build-arg BASE_IMAGE="$BASE" \
    -t "$PYTHON_BASE" -f deploy/docker/python-standin.Dockerfile deploy/docker >/dev/null
  echo "standin-base: $PYTHON_BASE made in $((SECONDS - started)) s"
fi

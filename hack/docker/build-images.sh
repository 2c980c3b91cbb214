#!/usr/bin/env bash
# Builds both mmprep images on this machine: mmprep-operator:$IMAGE_TAG and mmprep-runtime:$IMAGE_TAG,
# and on request the runtime's vLLM flavor, mmprep-runtime-vllm:$IMAGE_TAG (~10 GB).
#
#   hack/docker/build-images.sh [operator|runtime|runtime-vllm ...]       default: operator runtime
#
# The vLLM flavor always builds online (pip reaches PyPI from inside the build): its wheels
# (vLLM, its torch and CUDA libraries) are not in the host's wheelhouse.
#
# Environment:
#   BASE_IMAGE        base for both images; default `local`: the debootstrap image from
#                     build-base.sh (no registry needed). Online: BASE_IMAGE=python:3.11-slim-bookworm
#   MMPREP_WHEELHOUSE 1 (default): fill ./wheelhouse from the host (wheelhouse.sh) and build
#                     offline; 0: build online (pip reaches PyPI from inside the build)
#   PIP_CERT_FILE     CA bundle handed to an online build as the `pip-cert` secret
#                     (default /etc/ssl/certs/ca-certificates.crt when it exists)
#   IMAGE_PREFIX, IMAGE_TAG  image names: $IMAGE_PREFIX<target>:$IMAGE_TAG
#                     (default mmprep-operator:<version in pyproject.toml>)
#
# Rebuilds are cached by BuildKit: dependencies change only with pyproject.toml, so a source edit
# costs one small wheel stage and one small layer per image.
set -euo pipefail
here=$(dirname "$0")
. "$here/lib.sh"
repo=$(cd "$here/../.." && pwd)
targets=("$@"); [ ${#targets[@]} -gt 0 ] || targets=(operator runtime)

"$here/start-dockerd.sh"
docker_cli
base=${BASE_IMAGE:-local}
if [ "$base" = local ]; then "$here/build-base.sh"; base=$LOCAL_BASE_IMAGE; fi
light=()
for t in "${targets[@]}"; do [ "$t" = runtime-vllm ] || light+=("$t"); done
if [ "${MMPREP_WHEELHOUSE:-1}" = 1 ] && [ ${#light[@]} -gt 0 ]; then "$here/wheelhouse.sh" "${light[@]}"; fi

wheelhouse_mode=auto
[ "${MMPREP_WHEELHOUSE:-1}" = 1 ] || wheelhouse_mode=off
secret=()
cert=${PIP_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
if [ -s "$cert" ]; then secret=(--secret "id=pip-cert,src=$cert"); fi

for t in "${targets[@]}"; do
  case "$t" in operator|runtime|runtime-vllm) ;; *) die "unknown target '$t' (operator, runtime or runtime-vllm)";; esac
  image="$IMAGE_PREFIX$t:$IMAGE_TAG"
  mode=$wheelhouse_mode
  [ "$t" != runtime-vllm ] || mode=off
  log "building $image from $base"
  start=$(date +%s)
  previous=$(docker image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
  "$DOCKER" build --progress=plain --target "$t" --build-arg "BASE_IMAGE=$base" --build-arg "WHEELHOUSE=$mode" \
    "${secret[@]}" --tag "$image" "$repo" >"$DOCKER_CACHE/build-$t.log" 2>&1 \
    || { tail -40 "$DOCKER_CACHE/build-$t.log" >&2; die "building $image failed (log: $DOCKER_CACHE/build-$t.log)"; }
  # The image a rebuild replaces would stay behind untagged; drop it (unless a container uses it).
  current=$(docker image inspect --format '{{.Id}}' "$image")
  if [ -n "$previous" ] && [ "$previous" != "$current" ]; then docker rmi "$previous" >/dev/null 2>&1 || true; fi
  size=$(docker image inspect --format '{{.Size}}' "$image")
  log "built $image in $(( $(date +%s) - start )) s, $(( size / 1000000 )) MB"
done

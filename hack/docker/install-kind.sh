#!/usr/bin/env bash
# Installs kind (sigs.k8s.io/kind) from the Go module proxy into $MMPREP_CACHE, once per version,
# and prints its path. kind itself installs anywhere Go does; running it needs a Docker engine and
# a kind node image (pulled from a registry, or loaded with `docker load`).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
KIND_VERSION=${KIND_VERSION:-v0.33.0}
dir="$MMPREP_CACHE/bin/kind-$KIND_VERSION"
if [ ! -x "$dir/kind" ]; then
  command -v go >/dev/null || die "go is needed to install kind (or put kind on PATH and set KIND)"
  log "installing kind $KIND_VERSION into $dir"
  mkdir -p "$dir"
  GOBIN="$dir" GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0 go install "sigs.k8s.io/kind@$KIND_VERSION"
fi
echo "$dir/kind"

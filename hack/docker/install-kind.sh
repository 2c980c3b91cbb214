#!/usr/bin/env bash
# Installs kind (sigs.k8s.io/kind) from the Go module proxy into $MMPREP_CACHE/kind/bin, once per
# version, and prints its path. The version is the one the local node image mirrors
# (hack/kind/versions.sh): kind's node image internals are tied to its release.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
. "$here/../kind/versions.sh"
dir=$(kind_bin_dir kind "$KIND_VERSION")
if [ ! -x "$dir/kind" ]; then
  command -v go >/dev/null || die "go is needed to install kind (or put kind on PATH and set KIND)"
  log "installing kind $KIND_VERSION into $dir"
  mkdir -p "$dir"
  GOBIN="$dir.tmp" GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kind@$KIND_VERSION"
  mv "$dir.tmp/kind" "$dir/kind"; rmdir "$dir.tmp"
fi
echo "$dir/kind"

#!/usr/bin/env bash
# Prints the folder holding KEDA's own CRDs (keda.sh_scaledobjects.yaml, ...) for one pinned KEDA
# release, fetching them once from the Go module proxy.
#
# Why from the module: KEDA's CRDs are generated from its Go types and published in its module
# (config/crd/bases); the module proxy is reachable where no release download is. The integration
# tier installs the ScaledObject CRD into the local API server, so what the operator renders is
# validated by KEDA's real schema. Cached under $MMPREP_CACHE keyed by version, like the control
# plane's binaries: a bump of KEDA_VERSION fetches again, nothing else does.
set -euo pipefail

KEDA_VERSION=${KEDA_VERSION:-v2.21.0}
CACHE=${MMPREP_CACHE:-$HOME/.cache/mmprep}
DIR="$CACHE/keda/crds-$KEDA_VERSION"
PROXY=${MMPREP_GOPROXY:-https://proxy.golang.org}
MODULE=github.com/kedacore/keda/v2
# What the tests need: the ScaledObject CRD (the one the operator renders) and its neighbours.
FILES=(keda.sh_scaledobjects.yaml keda.sh_triggerauthentications.yaml keda.sh_clustertriggerauthentications.yaml)

log() { printf '[keda-crds %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

complete() { for f in "${FILES[@]}"; do [ -s "$DIR/$f" ] || return 1; done; }
if complete; then echo "$DIR"; exit 0; fi

# The module zip is a few MB; refuse to start with less than 100 MB free where it lands.
mkdir -p "$CACHE/keda"
free_kb=$(df -Pk "$CACHE/keda" | awk 'NR==2 {print $4}')
[ "$free_kb" -gt 102400 ] || { log "error: under 100 MB free in $CACHE/keda"; exit 1; }

work=$(mktemp -d "$CACHE/keda/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT
log "fetching $MODULE@$KEDA_VERSION's CRDs from $PROXY"
curl -fsSL --retry 3 --max-time 300 -o "$work/module.zip" "$PROXY/$MODULE/@v/$KEDA_VERSION.zip"
prefix="$MODULE@$KEDA_VERSION/config/crd/bases"
unzip -q -j "$work/module.zip" "${FILES[@]/#/$prefix/}" -d "$work/crds"
rm -f "$work/module.zip"
# Renamed into place whole: an interrupted fetch never leaves a half folder taken as complete.
rm -rf "$DIR"
mv "$work/crds" "$DIR"
echo "$DIR"

#!/usr/bin/env bash
# Builds the binaries of a real local control plane from Go modules, once per version.
#
# Why from source: this machine has no container registry (kind cannot pull a node image) and no
# download site, but it reaches the Go module proxy. Binaries are cached outside the repo under
# $MMPREP_CACHE (default ~/.cache/mmprep) keyed by version, so only a new machine pays the build.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.35.4}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
HELM_VERSION=${HELM_VERSION:-v3.22.0}
CACHE=${MMPREP_CACHE:-$HOME/.cache/mmprep}
BIN="$CACHE/bin/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION"
# Each binary is written under a temporary name and renamed when complete, so a build that was
# interrupted never leaves a truncated binary that a later run would take as built.
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0

log() { printf '[build-control-plane %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

want=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok helm)
missing=()
for b in "${want[@]}"; do [ -x "$BIN/$b" ] || missing+=("$b"); done
if [ ${#missing[@]} -eq 0 ]; then echo "$BIN"; exit 0; fi
log "building ${missing[*]} into $BIN (first time on this machine: 15-30 minutes on 2 cores)"
mkdir -p "$BIN"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

build_module() {  # name module-path version main-package...
  local name=$1 mod=$2 ver=$3; shift 3
  local dir="$work/$name"; mkdir -p "$dir"; cd "$dir"
  go mod init "mmprep.local/build/$name" >/dev/null 2>&1
  printf 'package tools\nimport (\n' > tools.go
  for p in "$@"; do printf '\t_ "%s"\n' "$p" >> tools.go; done
  printf ')\n' >> tools.go
  sed -i '1s/^/\/\/go:build tools\n\n/' tools.go
  go mod edit -require="$mod@$ver"
  if [ "$name" = kubernetes ]; then
    # k/k requires each staging module at v0.0.0; point them at the published v0.X.Y twins.
    local gomod; gomod=$(go mod download -json "$mod@$ver" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
    local stagever="v0.${ver#v1.}"
    grep -E '^\s+k8s.io/[a-z0-9-]+ v0.0.0$' "$gomod" | awk '{print $1}' | while read -r m; do
      go mod edit -replace="$m=$m@$stagever"
    done
  fi
  log "$name $ver: resolving modules"
  go mod tidy -e >/dev/null 2>"$dir/tidy.log" || { cat "$dir/tidy.log" >&2; return 1; }
}

ldflags_k8s() {
  local v=$1 major minor; major=${v#v}; major=${major%%.*}; minor=$(echo "$v" | cut -d. -f2)
  local x=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    x+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  echo "-s -w$x"
}

need() { for b in "$@"; do [[ " ${missing[*]} " == *" $b "* ]] && return 0; done; return 1; }

if need etcd; then
  build_module etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION" go.etcd.io/etcd/server/v3
  log "etcd: compiling"; go build -trimpath -ldflags "-s -w" -o "$BIN/.etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$BIN/.etcd.tmp" "$BIN/etcd"
fi
if need kwok; then
  build_module kwok sigs.k8s.io/kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok
  log "kwok: compiling"; go build -trimpath -ldflags "-s -w" -o "$BIN/.kwok.tmp" sigs.k8s.io/kwok/cmd/kwok
  mv "$BIN/.kwok.tmp" "$BIN/kwok"
fi
if need helm; then
  build_module helm helm.sh/helm/v3 "$HELM_VERSION" helm.sh/helm/v3/cmd/helm
  log "helm: compiling"; go build -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" -o "$BIN/.helm.tmp" helm.sh/helm/v3/cmd/helm
  mv "$BIN/.helm.tmp" "$BIN/helm"
fi
if need kube-apiserver kube-controller-manager kube-scheduler kubectl; then
  cmds=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
  build_module kubernetes k8s.io/kubernetes "$K8S_VERSION" "${cmds[@]/#/k8s.io/kubernetes/cmd/}"
  for c in "${cmds[@]}"; do
    log "kubernetes: compiling $c"
    go build -trimpath -tags selinux,notest -ldflags "$(ldflags_k8s "$K8S_VERSION")" -o "$BIN/.$c.tmp" "k8s.io/kubernetes/cmd/$c"
    mv "$BIN/.$c.tmp" "$BIN/$c"
  done
fi
log "done"
echo "$BIN"

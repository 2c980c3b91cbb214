#!/usr/bin/env bash
# Builds every binary of the kind node image that is not a Debian package, from Go modules (and
# pause from its C source), once per version, into $MMPREP_CACHE/kind/bin/<name>-<version>/.
#
#   hack/kind/build-binaries.sh        prints nothing; seconds when everything is cached
#
# kubelet, kubeadm and kube-proxy come from k8s.io/kubernetes exactly as hack/build-control-plane.sh
# builds the control plane (same flags, so the Go build cache is shared); containerd, runc (cgo +
# seccomp, the way runc's Makefile builds it), crictl, coredns, metrics-server and kind itself from
# their modules.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/versions.sh"
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0

# runc and pause are cgo/C builds: their compiler and headers (libseccomp) come from Debian.
"$here/../system-packages.sh" cgo
# Concurrent runs (the node image build and CI) wait for each other instead of building twice.
mkdir -p "$KIND_CACHE"; exec 9>"$KIND_CACHE/.build-binaries.lock"; flock 9
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

# install DIR BINARY... -- go-install-args: builds into a temp GOBIN, then moves into place, so an
# interrupted build never leaves a binary that a later run would take as complete.
have() { local d=$1; shift; for b in "$@"; do [ -x "$d/$b" ] || return 1; done; }
go_install() {
  local dir=$1; shift; local bins=(); while [ "$1" != -- ]; do bins+=("$1"); shift; done; shift
  have "$dir" "${bins[@]}" && return 0
  local tmp="$work/gobin-$(basename "$dir")"; mkdir -p "$tmp" "$dir"
  local start=$SECONDS
  GOBIN="$tmp" go install -trimpath "$@"
  for b in "${bins[@]}"; do mv "$tmp/$b" "$dir/$b"; done
  klog "built ${bins[*]} in $((SECONDS - start)) s"
}

kube_dir=$(kind_bin_dir kubernetes-node "$K8S_VERSION")
if ! have "$kube_dir" kubelet kubeadm kube-proxy; then
  cmds=(kubelet kubeadm kube-proxy)
  mod="$work/kubernetes"; mkdir -p "$mod"; cd "$mod"
  go mod init mmprep.local/build/kubernetes-node >/dev/null 2>&1
  { echo '//go:build tools'; echo; echo 'package tools'; echo 'import ('
    for c in "${cmds[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$c\""; done; echo ')'; } > tools.go
  go mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
  # k/k requires its staging modules at v0.0.0 (replaced in-tree); point them at the published twins.
  gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  grep -E '^\s+k8s.io/[a-z0-9-]+ v0.0.0$' "$gomod" | awk '{print $1}' | while read -r m; do
    go mod edit -replace="$m=$m@v0.${K8S_VERSION#v1.}"
  done
  klog "kubernetes $K8S_VERSION: resolving modules"
  go mod tidy -e >/dev/null 2>"$mod/tidy.log" || { cat "$mod/tidy.log" >&2; exit 1; }
  major=${K8S_VERSION#v}; major=${major%%.*}; minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  x=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    x+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  mkdir -p "$kube_dir"
  for c in "${cmds[@]}"; do
    [ -x "$kube_dir/$c" ] && continue
    start=$SECONDS
    go build -trimpath -tags selinux,notest -ldflags "-s -w$x" -o "$kube_dir/.$c.tmp" "k8s.io/kubernetes/cmd/$c"
    mv "$kube_dir/.$c.tmp" "$kube_dir/$c"
    klog "built $c in $((SECONDS - start)) s"
  done
  cd "$here"
fi

go_install "$(kind_bin_dir containerd "$CONTAINERD_VERSION")" containerd ctr containerd-shim-runc-v2 -- \
  -tags "no_btrfs no_devmapper no_zfs urfave_cli_no_docs" \
  -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
  "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
  "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION" \
  "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION"
# runc needs cgo for seccomp; it links libseccomp.so.2, which the bookworm node image carries.
CGO_ENABLED=1 go_install "$(kind_bin_dir runc "$RUNC_VERSION")" runc -- \
  -tags "seccomp urfave_cli_no_docs" -ldflags "-s -w -X main.version=${RUNC_VERSION#v}" \
  "github.com/opencontainers/runc@$RUNC_VERSION"
go_install "$(kind_bin_dir crictl "$CRICTL_VERSION")" crictl -- \
  -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" \
  "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
go_install "$(kind_bin_dir coredns "$COREDNS_VERSION")" coredns -- -ldflags "-s -w" \
  "github.com/coredns/coredns@$COREDNS_VERSION"
go_install "$(kind_bin_dir metrics-server "$METRICS_SERVER_VERSION")" metrics-server -- \
  -ldflags "-s -w -X sigs.k8s.io/metrics-server/pkg/version.gitVersion=$METRICS_SERVER_VERSION" \
  "sigs.k8s.io/metrics-server/cmd/metrics-server@$METRICS_SERVER_VERSION"
start=$SECONDS; "$here/../docker/install-kind.sh" >/dev/null

# pause: the C program from the Kubernetes module (build/pause has no go.mod, so it is in the zip).
pause_dir=$(kind_bin_dir pause "$K8S_VERSION")
if [ ! -x "$pause_dir/pause" ]; then
  src=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')/build/pause/linux/pause.c
  mkdir -p "$pause_dir"
  gcc -Os -Wall -Werror -static -DVERSION="v3.10.1-mmprep" -o "$pause_dir/.pause.tmp" "$src"
  mv "$pause_dir/.pause.tmp" "$pause_dir/pause"
fi

# Versions of everything in the locally built kind node image (sourced by the hack/kind scripts).
#
# kind's node internals are not a stable interface, so one kind release is pinned and its bookworm
# base files are mirrored exactly; bookworm (systemd 252) still boots on cgroup v1 hosts, the
# trixie base of kind >= v0.32 does not. The other pins are the newest releases the Go module proxy
# serves that pair with that kind release and with Kubernetes 1.35.
KIND_VERSION=${KIND_VERSION:-v0.31.0}
K8S_VERSION=${K8S_VERSION:-v1.35.4}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.2.1}
RUNC_VERSION=${RUNC_VERSION:-v1.3.4}
CRICTL_VERSION=${CRICTL_VERSION:-v1.34.0}
COREDNS_VERSION=${COREDNS_VERSION:-v1.13.1}
# metrics-server: the autoscaling tests' CPU signal (resource metrics of the kubelets).
METRICS_SERVER_VERSION=${METRICS_SERVER_VERSION:-v0.8.0}
DEBIAN_SUITE=${DEBIAN_SUITE:-bookworm}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

MMPREP_CACHE=${MMPREP_CACHE:-$HOME/.cache/mmprep}
KIND_CACHE="$MMPREP_CACHE/kind"
# One folder per component and version: a bump rebuilds only what changed.
kind_bin_dir() { echo "$KIND_CACHE/bin/$1-$2"; }

klog() { printf '[%s %s] %s\n' "$(basename "$0")" "$(date +%H:%M:%S)" "$*" >&2; }
kdie() { klog "error: $*"; exit 1; }

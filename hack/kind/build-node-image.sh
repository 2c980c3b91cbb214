#!/usr/bin/env bash
# Builds a kind node image without any registry, the way `kind build node-image` does, by hand:
#
#   hack/kind/build-node-image.sh          prints the image name; seconds when it already exists
#   hack/kind/build-node-image.sh rootfs   only the two debootstrap root filesystems (downloads)
#
#   1. binaries: hack/kind/build-binaries.sh (kubelet, kubeadm, kube-proxy, containerd, runc,
#      crictl, coredns, metrics-server, kind, pause) and hack/build-control-plane.sh (etcd, kube-apiserver,
#      kube-controller-manager, kube-scheduler, kubectl), all cached by version;
#   2. base: a debootstrap bookworm root filesystem (systemd 252, which still boots on cgroup v1
#      hosts) with the pinned kind release's base files, trimmed and enabled as kind's base
#      Dockerfile does; containerd with restrict_oom_score_adj (runc cannot lower oom_score_adj on
#      hosts without CAP_SYS_RESOURCE, and containerd and kubelet ask for -998/-997);
#   3. component images under the exact names `kubeadm config images list` prints (one minimal
#      bookworm root filesystem with iptables for the four Kubernetes images and etcd; coredns,
#      metrics-server and pause as single binaries), imported into the node's containerd as kind does;
#   4. a default CNI config (ptp, 10.244.0.0/24): kindnetd's Go module is not served by the module
#      proxy, so multi-node clusters mount one config per node (hack/docker/kind-up.sh).
#
# Cache: the image tag carries a hash of every pin and of these scripts; the debootstrap root
# filesystems are kept as tarballs under $MMPREP_CACHE/kind.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/versions.sh"
repo=$(cd "$here/../.." && pwd)

pins="$KIND_VERSION $K8S_VERSION $ETCD_VERSION $CONTAINERD_VERSION $RUNC_VERSION $CRICTL_VERSION $COREDNS_VERSION $METRICS_SERVER_VERSION $DEBIAN_SUITE"
key=$(cat "$here"/build-node-image.sh "$here"/build-binaries.sh "$here"/ptp-conflist.sh <(echo "$pins") | sha256sum | cut -c1-12)
NODE_IMAGE=${KIND_NODE_IMAGE:-mmprep-kind-node:$K8S_VERSION-$key}

"$repo/hack/docker/start-dockerd.sh"
if docker image inspect "$NODE_IMAGE" >/dev/null 2>&1; then echo "$NODE_IMAGE"; exit 0; fi
[ "$(id -u)" = 0 ] || kdie "building the node image needs root (debootstrap, chroot)"
"$repo/hack/system-packages.sh" debootstrap tools cgo
total=$SECONDS
mkdir -p "$KIND_CACHE"
work=$(mktemp -d "$KIND_CACHE/build.XXXXXX")
cid=""
cleanup() { [ -z "$cid" ] || docker rm -f "$cid" >/dev/null 2>&1; rm -rf "$work"; }
trap cleanup EXIT

# debootstrap NAME PACKAGES: a cached minbase root filesystem tarball; prints its path.
BASE_PACKAGES=systemd,dbus,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,bash,ca-certificates,jq,procps,containernetworking-plugins,e2fsprogs
COMPONENT_PACKAGES=iptables,nftables,conntrack,ca-certificates
rootfs_tarball() {
  local name=$1 packages=$2
  local tarball="$KIND_CACHE/rootfs-$DEBIAN_SUITE-$name-$(echo "$packages" | sha256sum | cut -c1-8).tar"
  if [ ! -s "$tarball" ]; then
    local dir="$work/debootstrap-$name" start=$SECONDS
    debootstrap --variant=minbase --include="$packages" "$DEBIAN_SUITE" "$dir" "$DEBIAN_MIRROR" \
      >"$work/debootstrap-$name.log" 2>&1 || { tail -20 "$work/debootstrap-$name.log" >&2; kdie "debootstrap $name failed"; }
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/* "$dir"/usr/share/doc/* "$dir"/usr/share/man/*
    tar -C "$dir" --numeric-owner -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
    rm -rf "$dir"
    klog "debootstrap $name: $((SECONDS - start)) s"
  fi
  echo "$tarball"
}

if [ "${1:-}" = rootfs ]; then
  rootfs_tarball kind-base "$BASE_PACKAGES" & rootfs_tarball components "$COMPONENT_PACKAGES"; wait $!
  exit 0
fi
# The two debootstraps are mostly downloads and the Go builds mostly CPU: run them side by side.
rootfs_tarball kind-base "$BASE_PACKAGES" >"$work/base.path" &
base_job=$!
rootfs_tarball components "$COMPONENT_PACKAGES" >"$work/components.path" &
components_job=$!
"$here/build-binaries.sh"
cp_bin=$("$repo/hack/build-control-plane.sh")
wait "$base_job" || kdie "base root filesystem failed"
wait "$components_job" || kdie "component root filesystem failed"

kube=$(kind_bin_dir kubernetes-node "$K8S_VERSION")
ctrd=$(kind_bin_dir containerd "$CONTAINERD_VERSION")
kind_files=$(GOTOOLCHAIN=local go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')/images/base/files
[ -d "$kind_files" ] || kdie "kind $KIND_VERSION base files not found in the Go module cache"

# --- images the node must hold, named exactly as kubeadm will ask for them -----------------------
mapfile -t kubeadm_images < <("$kube/kubeadm" config images list --kubernetes-version "$K8S_VERSION")
sandbox_image=$(sed -n 's/^ *sandbox_image *= *"\(.*\)"/\1/p' "$kind_files/etc/containerd/config.toml")
image_named() { printf '%s\n' "${kubeadm_images[@]}" | grep -E "^registry.k8s.io/$1:" ; }
etcd_image=$(image_named etcd); coredns_image=$(image_named coredns/coredns); pause_image=$(image_named pause)

start=$SECONDS
comp="$work/components"; mkdir -p "$comp"
tar -C "$comp" -xf "$(cat "$work/components.path")"
install -m 0755 "$cp_bin"/{kube-apiserver,kube-controller-manager,kube-scheduler,etcd} "$kube/kube-proxy" "$comp/usr/local/bin/"
tar -C "$comp" --numeric-owner -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "mmprep-kind-components:$key" >/dev/null
saved=()
for name in kube-apiserver kube-controller-manager kube-scheduler kube-proxy; do
  docker tag "mmprep-kind-components:$key" "registry.k8s.io/$name:$K8S_VERSION"; saved+=("registry.k8s.io/$name:$K8S_VERSION")
done
docker tag "mmprep-kind-components:$key" "$etcd_image"; saved+=("$etcd_image")

mkdir -p "$work/coredns/etc/ssl/certs" "$work/coredns/tmp"
install -m 0755 "$(kind_bin_dir coredns "$COREDNS_VERSION")/coredns" "$work/coredns/coredns"
cp "$comp/etc/ssl/certs/ca-certificates.crt" "$work/coredns/etc/ssl/certs/"
tar -C "$work/coredns" --numeric-owner -c . | docker import --change 'ENTRYPOINT ["/coredns"]' - "$coredns_image" >/dev/null
saved+=("$coredns_image")

# metrics-server under its upstream name, so hack/kind/metrics-server.yaml reads as any install does.
mkdir -p "$work/metrics-server/tmp"
install -m 0755 "$(kind_bin_dir metrics-server "$METRICS_SERVER_VERSION")/metrics-server" "$work/metrics-server/metrics-server"
metrics_server_image="registry.k8s.io/metrics-server/metrics-server:$METRICS_SERVER_VERSION"
tar -C "$work/metrics-server" --numeric-owner -c . | docker import --change 'ENTRYPOINT ["/metrics-server"]' \
  --change 'USER 65534:65534' - "$metrics_server_image" >/dev/null
saved+=("$metrics_server_image")

mkdir -p "$work/pause"
install -m 0755 "$(kind_bin_dir pause "$K8S_VERSION")/pause" "$work/pause/pause"
tar -C "$work/pause" --numeric-owner -c . | docker import --change 'ENTRYPOINT ["/pause"]' --change 'USER 65535:65535' - "$pause_image" >/dev/null
saved+=("$pause_image")
if [ "$sandbox_image" != "$pause_image" ]; then docker tag "$pause_image" "$sandbox_image"; saved+=("$sandbox_image"); fi
docker save "${saved[@]}" -o "$work/images.tar"
docker rmi "${saved[@]}" "mmprep-kind-components:$key" >/dev/null
klog "component images (${#saved[@]} names): $((SECONDS - start)) s"

# --- base: kind's base image, from the debootstrap root filesystem --------------------------------
start=$SECONDS
root="$work/base"; mkdir -p "$root"
tar -C "$root" -xf "$(cat "$work/base.path")"
f="$kind_files"
install -m 0755 "$f"/usr/local/bin/* "$root/usr/local/bin/"
mkdir -p "$root/kind/bin" "$root/LICENSES" "$root/etc/containerd" "$root/etc/default" "$root/etc/sysctl.d" \
  "$root/etc/systemd/system/kubelet.service.d" "$root/etc/kubernetes/manifests" "$root/etc/cni/net.d"
install -m 0644 "$f"/kind/README.txt "$root/kind/"
install -m 0755 "$f"/kind/bin/* "$root/kind/bin/"
install -m 0644 "$f"/LICENSES/* "$root/LICENSES/"
install -m 0644 "$f"/etc/crictl.yaml "$root/etc/"
install -m 0644 "$f"/etc/containerd/* "$root/etc/containerd/"
install -m 0644 "$f"/etc/default/* "$root/etc/default/"
install -m 0644 "$f"/etc/sysctl.d/* "$root/etc/sysctl.d/"
install -m 0644 "$f"/etc/systemd/system/*.service "$f"/etc/systemd/system/*.slice "$root/etc/systemd/system/"
install -m 0644 "$f"/etc/systemd/system/kubelet.service.d/* "$root/etc/systemd/system/kubelet.service.d/"
sed -i 's/^\( *restrict_oom_score_adj *= *\)false/\1true/' "$root/etc/containerd/config.toml"
grep -q 'restrict_oom_score_adj = true' "$root/etc/containerd/config.toml" || kdie "could not set restrict_oom_score_adj"
# kind's systemd trimming: no udev, no getty, no tmpfiles-setup, journald without /dev/kmsg.
find "$root/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
rm -f "$root"/lib/systemd/system/multi-user.target.wants/* "$root"/etc/systemd/system/*.wants/* \
  "$root"/lib/systemd/system/local-fs.target.wants/* "$root"/lib/systemd/system/sockets.target.wants/*udev* \
  "$root"/lib/systemd/system/sockets.target.wants/*initctl* "$root"/lib/systemd/system/basic.target.wants/*
echo "ReadKMsg=no" >>"$root/etc/systemd/journald.conf"
ln -sf /lib/systemd/systemd "$root/sbin/init"
install -m 0755 "$ctrd"/{containerd,ctr,containerd-shim-runc-v2} "$root/usr/local/bin/"
install -m 0755 "$(kind_bin_dir runc "$RUNC_VERSION")/runc" "$root/usr/local/sbin/runc"
install -m 0755 "$(kind_bin_dir crictl "$CRICTL_VERSION")/crictl" "$root/usr/local/bin/"
mkdir -p "$root/opt/cni"; ln -sfn /usr/lib/cni "$root/opt/cni/bin"
"$ctrd/ctr" oci spec \
  | jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
  | jq 'del(.process.rlimits)' >"$root/etc/containerd/cri-base.json"
chroot "$root" systemctl enable kubelet.service containerd.service undo-mount-hacks.service >/dev/null 2>&1
chroot "$root" systemctl mask systemd-binfmt.service >/dev/null 2>&1
# The node layer (what kind's builder adds on top of its base image).
install -m 0755 "$kube"/{kubeadm,kubelet} "$cp_bin/kubectl" "$root/usr/bin/"
echo "$K8S_VERSION" >"$root/kind/version"
"$here/ptp-conflist.sh" 10.244.0.0/24 >"$root/etc/cni/net.d/10-kind-ptp.conflist"
tar -C "$root" --numeric-owner -c . | docker import --change 'ENV container=docker' \
  --change 'ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]' - "mmprep-kind-base:$key" >/dev/null
rm -rf "$root"
# `docker import` refuses STOPSIGNAL; the legacy builder sets it offline (FROM a local image).
printf 'FROM mmprep-kind-base:%s\nSTOPSIGNAL SIGRTMIN+3\n' "$key" \
  | DOCKER_BUILDKIT=0 docker build -q -t "mmprep-kind-base:$key" - >/dev/null
klog "base image: $((SECONDS - start)) s"

# --- preload the images into the node's containerd, as kind's image importer does --------------
start=$SECONDS
cid=$(docker run -d --entrypoint=sleep --security-opt seccomp=unconfined "mmprep-kind-base:$key" infinity)
docker exec "$cid" bash -c 'nohup containerd >/tmp/containerd.log 2>&1 &'
for _ in $(seq 60); do docker exec "$cid" ctr version >/dev/null 2>&1 && break; sleep 1; done
docker exec -i "$cid" ctr -n k8s.io images import --label=io.cri-containerd.pinned=pinned \
  --all-platforms --no-unpack --digests - <"$work/images.tar" >/dev/null
have=$(docker exec "$cid" ctr -n k8s.io images ls -q)
for img in "${saved[@]}"; do grep -qx "$img" <<<"$have" || kdie "$img missing from the node's containerd"; done
docker exec "$cid" pkill containerd || true
for _ in $(seq 30); do docker exec "$cid" pgrep -x containerd >/dev/null || break; sleep 1; done
docker exec "$cid" rm -f /tmp/containerd.log
docker commit --change 'ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]' "$cid" "$NODE_IMAGE" >/dev/null
docker rm -f "$cid" >/dev/null; cid=""
docker rmi "mmprep-kind-base:$key" >/dev/null
# Node images of earlier pins or scripts are dead weight (1 GB each); those a cluster runs on stay.
for old in $(docker images --format '{{.Repository}}:{{.Tag}}' mmprep-kind-node); do
  [ "$old" = "$NODE_IMAGE" ] || docker rmi "$old" >/dev/null 2>&1 || true
done
klog "node image $NODE_IMAGE: preload $((SECONDS - start)) s, all steps $((SECONDS - total)) s, $(( $(docker image inspect -f '{{.Size}}' "$NODE_IMAGE") / 1000000 )) MB"
echo "$NODE_IMAGE"

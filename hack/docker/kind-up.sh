#!/usr/bin/env bash
# A kind cluster running mmprep for real: both images loaded, fake GPU nodes, the chart installed.
#
#   hack/docker/kind-up.sh          prints the kubeconfig path on stdout
#
# What it does (idempotent; a second run reuses the cluster):
#   1. builds both images (hack/docker/build-images.sh) and, unless KIND_NODE_IMAGE names one, the
#      kind node image (hack/kind/build-node-image.sh), all cached;
#   2. host fixes kind needs on small VMs: inotify limits, and a Docker engine that can run
#      privileged containers (hack/docker/start-dockerd.sh);
#   3. makes real processor folders with the runtime image (`make-model`, no hub) in
#      $KIND_MODELS_DIR, mounted at /mmprep-models on every kind node;
#   4. creates the cluster (one control plane, two workers, one writable folder shared by both as
#      /mmprep-shared): static per-node CNI configs and pod
#      routes between the nodes (kindnetd is not built here), kubelets allowed on cgroup v1;
#   5. loads both images into the workers (hack/kind/load-image.sh: what `kind load` does, but the
#      6 GB runtime image is stored once per node);
#   6. labels worker 1 as an H200 node the way GPU Feature Discovery would and advertises
#      `nvidia.com/gpu` through node status (no real GPU: pods there preprocess on the CPU path);
#      worker 2 stays a CPU-only node;
#   7. creates namespace $KIND_NAMESPACE (restricted Pod Security Standard) with a
#      PersistentVolume/Claim `mmprep-models` (the volume the examples mount at /models);
#   8. starts metrics-server (hack/kind/metrics-server.yaml; its image is in the node image);
#   9. `helm install`s charts/mmprep into mmprep-system.
#
# Needs: root (or a running Docker engine), Go (kind and the node image build), helm and kubectl
# (PATH, or the control-plane build cache).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
. "$here/../kind/versions.sh"  # METRICS_SERVER_VERSION
repo=$(cd "$here/../.." && pwd)

KIND_CLUSTER=${KIND_CLUSTER:-mmprep}
KIND_NAMESPACE=${KIND_NAMESPACE:-mmprep-demo}
KIND_MODELS_DIR=${KIND_MODELS_DIR:-$MMPREP_CACHE/kind/models}
KIND_KUBECONFIG=${KIND_KUBECONFIG:-$MMPREP_CACHE/kind/$KIND_CLUSTER.kubeconfig}
POD_SUBNET_PREFIX=10.244  # kind's default podSubnet 10.244.0.0/16; node i gets 10.244.i.0/24

tool() {  # name: from the environment (KIND, HELM, KUBECTL), PATH, or the local caches
  local name=$1 var; var=$(echo "$1" | tr a-z A-Z)
  if [ -n "${!var:-}" ]; then echo "${!var}"; return; fi
  if [ "$name" = kind ]; then "$here/install-kind.sh"; return; fi
  if command -v "$name" >/dev/null; then command -v "$name"; return; fi
  echo "$("$here/../build-control-plane.sh")/$name"
}
phase() { log "$1 (${SECONDS}s so far)"; }

"$here/start-dockerd.sh"
# One bring-up per cluster at a time: the test session starts one in the background, and a kind
# test run on its own (or a developer's make kind-up) waits for it and then finds everything ready.
mkdir -p "$MMPREP_CACHE/kind"
exec 8>"$MMPREP_CACHE/kind/$KIND_CLUSTER.lock"
flock 8
[ "${SKIP_IMAGES:-0}" = 1 ] || "$here/build-images.sh"
KIND_NODE_IMAGE=${KIND_NODE_IMAGE:-$("$here/../kind/build-node-image.sh")}
KIND=$(tool kind); HELM=$(tool helm); KUBECTL=$(tool kubectl)
k() { "$KUBECTL" --kubeconfig "$KIND_KUBECONFIG" "$@"; }
operator_image="${IMAGE_PREFIX}operator:$IMAGE_TAG"
runtime_image="${IMAGE_PREFIX}runtime:$IMAGE_TAG"
phase "images ready"

# kind's known issue: every node runs systemd and a kubelet, which exhaust the default inotify limits.
raise_sysctl() {
  local have; have=$(sysctl -n "$1" 2>/dev/null || echo 0)
  [ "$have" -ge "$2" ] || sysctl -w "$1=$2" >/dev/null || die "cannot raise $1 to $2 (needs root)"
}
raise_sysctl fs.inotify.max_user_instances 512
raise_sysctl fs.inotify.max_user_watches 524288
if ! docker image inspect "$KIND_NODE_IMAGE" >/dev/null 2>&1; then
  log "pulling $KIND_NODE_IMAGE"
  docker pull "$KIND_NODE_IMAGE" >&2 || die "kind node image $KIND_NODE_IMAGE is not available (unset KIND_NODE_IMAGE to build one)"
fi
docker run --rm --privileged --entrypoint true "$KIND_NODE_IMAGE" \
  || die "this Docker engine cannot run privileged containers (kind nodes); see hack/docker/start-dockerd.sh"

mkdir -p "$KIND_MODELS_DIR"; chmod 0777 "$KIND_MODELS_DIR"
for model in qwen2-vl uncloneable; do
  [ -d "$KIND_MODELS_DIR/$model" ] && continue
  log "making the $model processor folder with $runtime_image"
  docker run --rm --read-only --tmpfs /tmp --network none -v "$KIND_MODELS_DIR:/out" "$runtime_image" \
    make-model --kind "$model" --out "/out/$model" >/dev/null
done

state="$MMPREP_CACHE/kind/$KIND_CLUSTER"
mkdir -p "$(dirname "$KIND_KUBECONFIG")" "$state" "$state/shared"
# /mmprep-shared: one writable folder seen by both workers, what a ReadWriteMany volume (NFS) gives
# pods on several nodes; tests provision PersistentVolumes in it as a cluster admin would.
chmod 0777 "$state/shared"
roles=(control-plane worker worker)
clusters=$("$KIND" get clusters 2>/dev/null || true)
if ! grep -qx "$KIND_CLUSTER" <<<"$clusters"; then
  cfg="$state/kind.yaml"
  {
    echo "kind: Cluster"
    echo "apiVersion: kind.x-k8s.io/v1alpha4"
    echo "networking: {disableDefaultCNI: true}"
    # Kubernetes >= 1.35 kubelets refuse cgroup v1 hosts unless told otherwise (KEP-5573).
    echo "kubeadmConfigPatches:"
    echo "- |"
    echo "  kind: KubeletConfiguration"
    echo "  failCgroupV1: false"
    echo "nodes:"
    for i in "${!roles[@]}"; do
      "$here/../kind/ptp-conflist.sh" "$POD_SUBNET_PREFIX.$i.0/24" >"$state/cni-$i.conflist"
      echo "- role: ${roles[$i]}"
      echo "  extraMounts:"
      echo "  - {hostPath: \"$state/cni-$i.conflist\", containerPath: /etc/cni/net.d/10-kind-ptp.conflist, readOnly: true}"
      [ "${roles[$i]}" = worker ] && echo "  - {hostPath: \"$KIND_MODELS_DIR\", containerPath: /mmprep-models, readOnly: true}"
      [ "${roles[$i]}" = worker ] && echo "  - {hostPath: \"$state/shared\", containerPath: /mmprep-shared}"
    done
  } >"$cfg"
  log "creating kind cluster $KIND_CLUSTER from $KIND_NODE_IMAGE"
  "$KIND" create cluster --name "$KIND_CLUSTER" --image "$KIND_NODE_IMAGE" --config "$cfg" \
    --kubeconfig "$KIND_KUBECONFIG" --wait 300s >&2
  phase "cluster created"
fi
"$KIND" get kubeconfig --name "$KIND_CLUSTER" >"$KIND_KUBECONFIG"

# Pod routes between nodes (what kindnetd would program): node i's pods live in 10.244.i.0/24.
nodes=("$KIND_CLUSTER-control-plane" "$KIND_CLUSTER-worker" "$KIND_CLUSTER-worker2")
ips=()
for n in "${nodes[@]}"; do ips+=("$(docker inspect -f '{{.NetworkSettings.Networks.kind.IPAddress}}' "$n")"); done
for i in "${!nodes[@]}"; do
  for j in "${!nodes[@]}"; do
    [ "$i" = "$j" ] || docker exec "${nodes[$i]}" ip route replace "$POD_SUBNET_PREFIX.$j.0/24" via "${ips[$j]}"
  done
done
k wait --for=condition=Ready nodes --all --timeout=300s >&2

log "loading $operator_image and $runtime_image into the workers"
for image in "$operator_image" "$runtime_image"; do "$here/../kind/load-image.sh" "$image" "${nodes[1]}" "${nodes[2]}"; done
phase "images loaded"

gpu_node=${nodes[1]}
log "labelling $gpu_node as an NVIDIA H200 node (GPU Feature Discovery labels, nvidia.com/gpu capacity)"
k label node "$gpu_node" --overwrite \
  nvidia.com/gpu.present=true nvidia.com/gpu.count=8 nvidia.com/gpu.product=NVIDIA-H200 \
  nvidia.com/gpu.family=hopper nvidia.com/gpu.memory=143771 \
  nvidia.com/gpu.compute.major=9 nvidia.com/gpu.compute.minor=0 >&2
# Extended resources are advertised through node status (what a device plugin's kubelet reports).
k patch node "$gpu_node" --subresource=status --type=json -p \
  '[{"op":"add","path":"/status/capacity/nvidia.com~1gpu","value":"8"}]' >&2

k create namespace "$KIND_NAMESPACE" --dry-run=client -o yaml | k apply -f - >&2
k label namespace "$KIND_NAMESPACE" --overwrite pod-security.kubernetes.io/enforce=restricted >&2
k apply -f - >&2 <<YAML
apiVersion: v1
kind: PersistentVolume
metadata: {name: mmprep-models-$KIND_NAMESPACE}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadOnlyMany]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  hostPath: {path: /mmprep-models, type: Directory}
  claimRef: {namespace: $KIND_NAMESPACE, name: mmprep-models}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: mmprep-models, namespace: $KIND_NAMESPACE}
spec:
  accessModes: [ReadOnlyMany]
  storageClassName: ""
  volumeName: mmprep-models-$KIND_NAMESPACE
  resources: {requests: {storage: 1Gi}}
YAML

log "starting metrics-server (the resource metrics API the autoscaling tests scale on)"
sed "s/METRICS_SERVER_VERSION/$METRICS_SERVER_VERSION/" "$here/../kind/metrics-server.yaml" | k apply -f - >&2

log "installing the chart"
"$HELM" upgrade --install mmprep "$repo/charts/mmprep" --kubeconfig "$KIND_KUBECONFIG" \
  --namespace mmprep-system --create-namespace --set "tests.namespace=$KIND_NAMESPACE" --wait --timeout 300s >&2
phase "chart installed"
# Started before the chart so that its first scrapes overlap the install. This API server has been
# seen not routing an APIService added while it ran, in two ways, both until it restarted: its
# availability check of the service answered 404 (Available stays False, FailedDiscoveryCheck,
# while metrics-server itself answers that path), or the APIService was Available and the group
# answered 404. So: wait for Available and the real path, and restart the API server once (the
# kubelet brings its static pod back) when either does not come.
metrics_api() {
  k wait --for=condition=Available apiservice/v1beta1.metrics.k8s.io --timeout="$1" >/dev/null 2>&1 &&
    k get --raw /apis/metrics.k8s.io/v1beta1/nodes >/dev/null 2>&1
}
metrics_up() { local tries=$1; for _ in $(seq "$tries"); do metrics_api 5s && return 0; sleep 2; done; return 1; }
if ! metrics_up 30; then
  log "metrics.k8s.io is not served through the API server ($(k get apiservice v1beta1.metrics.k8s.io --no-headers 2>&1)): restarting it once"
  docker exec "${nodes[0]}" sh -c 'crictl stop $(crictl ps -q --name kube-apiserver)' >&2
  metrics_up 60 || die "metrics.k8s.io does not answer through the API server: $(k get apiservice v1beta1.metrics.k8s.io --no-headers 2>&1)"
fi
phase "metrics-server available"
echo "$KIND_KUBECONFIG"

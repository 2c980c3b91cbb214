#!/usr/bin/env bash
# A kind cluster running mmprep for real: both images loaded, fake GPU nodes, the chart installed.
#
#   hack/docker/kind-up.sh          prints the kubeconfig path on stdout
#
# What it does (idempotent; a second run reuses the cluster):
#   1. builds both images (hack/docker/build-images.sh, cached);
#   2. makes a real processor folder with the runtime image (`make-model`, no hub) in
#      $KIND_MODELS_DIR, mounted at /mmprep-models on every kind node;
#   3. creates the cluster (one control plane, two workers) from $KIND_NODE_IMAGE;
#   4. `kind load`s both images;
#   5. labels worker 1 as an H200 node the way GPU Feature Discovery would and patches
#      `nvidia.com/gpu` into its capacity (no real GPU: pods there preprocess on the CPU path);
#      worker 2 stays a CPU-only node;
#   6. creates namespace $KIND_NAMESPACE with a PersistentVolume/Claim `mmprep-models` (the
#      volume the examples mount at /models);
#   7. `helm install`s charts/mmprep into mmprep-system.
#
# Needs: a Docker engine, kind (hack/docker/install-kind.sh), helm and kubectl (PATH, or the
# control-plane build cache), and the kind node image locally or from a registry. Node images for
# Kubernetes >= 1.35 need cgroup v2 on the host.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
repo=$(cd "$here/../.." && pwd)

KIND_CLUSTER=${KIND_CLUSTER:-mmprep}
# kind v0.33.0's image for Kubernetes 1.35 (the local control plane's minor version).
KIND_NODE_IMAGE=${KIND_NODE_IMAGE:-kindest/node:v1.35.8@sha256:07b2536e30b803ed61d1677a79df6115f798ce64c80f9e22f6ed45afd09323c0}
KIND_NAMESPACE=${KIND_NAMESPACE:-mmprep-demo}
KIND_MODELS_DIR=${KIND_MODELS_DIR:-$MMPREP_CACHE/kind/models}
KIND_KUBECONFIG=${KIND_KUBECONFIG:-$MMPREP_CACHE/kind/$KIND_CLUSTER.kubeconfig}

tool() {  # name: from the environment (KIND, HELM, KUBECTL), PATH, or the local caches
  local name=$1 var; var=$(echo "$1" | tr a-z A-Z)
  if [ -n "${!var:-}" ]; then echo "${!var}"; return; fi
  if [ "$name" = kind ]; then "$here/install-kind.sh"; return; fi
  if command -v "$name" >/dev/null; then command -v "$name"; return; fi
  echo "$("$here/../build-control-plane.sh")/$name"
}
KIND=$(tool kind); HELM=$(tool helm); KUBECTL=$(tool kubectl)
k() { "$KUBECTL" --kubeconfig "$KIND_KUBECONFIG" "$@"; }

"$here/start-dockerd.sh"
[ "${SKIP_IMAGES:-0}" = 1 ] || "$here/build-images.sh"
operator_image="${IMAGE_PREFIX}operator:$IMAGE_TAG"
runtime_image="${IMAGE_PREFIX}runtime:$IMAGE_TAG"

if ! docker image inspect "$KIND_NODE_IMAGE" >/dev/null 2>&1; then
  log "pulling $KIND_NODE_IMAGE"
  docker pull "$KIND_NODE_IMAGE" >&2 || die "kind node image $KIND_NODE_IMAGE is not available (set KIND_NODE_IMAGE, or docker load it)"
fi

mkdir -p "$KIND_MODELS_DIR"; chmod 0777 "$KIND_MODELS_DIR"
if [ ! -d "$KIND_MODELS_DIR/qwen2-vl" ]; then
  log "making the qwen2-vl processor folder with $runtime_image"
  docker run --rm --read-only --tmpfs /tmp --network none -v "$KIND_MODELS_DIR:/out" "$runtime_image" \
    make-model --kind qwen2-vl --out /out/qwen2-vl >/dev/null
fi

mkdir -p "$(dirname "$KIND_KUBECONFIG")"
if ! "$KIND" get clusters 2>/dev/null | grep -qx "$KIND_CLUSTER"; then
  cfg=$(mktemp); trap 'rm -f "$cfg"' EXIT
  cat >"$cfg" <<YAML
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
- role: control-plane
- role: worker
  extraMounts: [{hostPath: "$KIND_MODELS_DIR", containerPath: /mmprep-models, readOnly: true}]
- role: worker
  extraMounts: [{hostPath: "$KIND_MODELS_DIR", containerPath: /mmprep-models, readOnly: true}]
YAML
  log "creating kind cluster $KIND_CLUSTER from $KIND_NODE_IMAGE"
  "$KIND" create cluster --name "$KIND_CLUSTER" --image "$KIND_NODE_IMAGE" --config "$cfg" \
    --kubeconfig "$KIND_KUBECONFIG" --wait 180s >&2
fi
"$KIND" get kubeconfig --name "$KIND_CLUSTER" >"$KIND_KUBECONFIG"

log "loading $operator_image and $runtime_image into the nodes"
"$KIND" load docker-image --name "$KIND_CLUSTER" "$operator_image" "$runtime_image" >&2

mapfile -t workers < <(k get nodes -l '!node-role.kubernetes.io/control-plane' -o name | sort)
[ ${#workers[@]} -ge 2 ] || die "expected two worker nodes, got ${workers[*]}"
gpu_node=${workers[0]#node/}
log "labelling $gpu_node as an NVIDIA H200 node (GPU Feature Discovery labels, nvidia.com/gpu capacity)"
k label node "$gpu_node" --overwrite \
  nvidia.com/gpu.present=true nvidia.com/gpu.count=8 nvidia.com/gpu.product=NVIDIA-H200 \
  nvidia.com/gpu.family=hopper nvidia.com/gpu.memory=143771 \
  nvidia.com/gpu.compute.major=9 nvidia.com/gpu.compute.minor=0 >&2
k patch node "$gpu_node" --subresource=status --type=json -p \
  '[{"op":"add","path":"/status/capacity/nvidia.com~1gpu","value":"8"},{"op":"add","path":"/status/allocatable/nvidia.com~1gpu","value":"8"}]' >&2

k create namespace "$KIND_NAMESPACE" --dry-run=client -o yaml | k apply -f - >&2
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

log "installing the chart"
"$HELM" upgrade --install mmprep "$repo/charts/mmprep" --kubeconfig "$KIND_KUBECONFIG" \
  --namespace mmprep-system --create-namespace --wait --timeout 180s \
  --set "image.pullPolicy=IfNotPresent" --set "runtimeImage.pullPolicy=IfNotPresent" >&2
echo "$KIND_KUBECONFIG"

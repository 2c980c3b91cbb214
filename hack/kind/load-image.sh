#!/usr/bin/env bash
# Loads a local Docker image into kind nodes, like `kind load docker-image`, storing it once per node:
#
#   hack/kind/load-image.sh IMAGE NODE...        (NODE: the kind node container's name)
#
# The runtime image is 6 GB. `kind load` imports `docker save`'s uncompressed layers, so each node
# keeps the image twice (content store + unpacked snapshot) plus a temporary copy on the host; two
# workers need about 30 GB. Here layers are streamed gzip-compressed (oci_gzip.py, no temporary
# file), unpacked, and then dropped from the content store, as containerd's discard_unpacked_layers
# does for pulled images: the node keeps the unpacked snapshot and the image's manifest and config.
# Skips nodes that already hold the same image id.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/versions.sh"
image=${1:?usage: load-image.sh IMAGE NODE...}; shift
id=$(docker image inspect -f '{{.Id}}' "$image")
case "$image" in
  */*/*|*.*/*|localhost/*) ref=$image ;;
  */*) ref="docker.io/$image" ;;
  *) ref="docker.io/library/$image" ;;
esac
plan="$KIND_CACHE/plans/${id#sha256:}.json"
# (Listed into a variable first: `grep -q` would close the pipe early and pipefail take that as failure.)
loaded() { local ids; ids=$(docker exec "$1" crictl images -q --no-trunc 2>/dev/null || true); grep -qx "$id" <<<"$ids"; }
todo=()
for node in "$@"; do loaded "$node" || todo+=("$node"); done
[ ${#todo[@]} -gt 0 ] || exit 0
if [ ! -s "$plan" ]; then
  mkdir -p "$(dirname "$plan")"
  docker save "$image" | python3 "$here/oci_gzip.py" plan "$plan.tmp"
  mv "$plan.tmp" "$plan"
fi
mapfile -t layers < <(python3 -c 'import json,sys; [print(l["digest"]) for l in json.load(open(sys.argv[1]))["layers"]]' "$plan")
# The nodes' containerd stores live under the engine's data root: each node needs the unpacked image
# plus its gzip layers until they are dropped. Say so before a 6 GB import fails half way.
root=$(docker info -f '{{.DockerRootDir}}')
need_mb=$(( $(docker image inspect -f '{{.Size}}' "$image") / 1048576 * 3 / 2 ))
err=$(mktemp)
trap 'rm -f "$err"' EXIT
for node in "${todo[@]}"; do
  start=$SECONDS
  : >"$err" # this node's errors only
  free_mb=$(df -Pm "$root" | awk 'NR == 2 { print $4 }')
  [ "$free_mb" -ge "$need_mb" ] ||
    kdie "not enough disk to load $image into $node: $free_mb MB free under $root, about $need_mb MB needed"
  if ! docker save "$image" | python3 "$here/oci_gzip.py" write "$plan" "$ref" 2>>"$err" \
    | docker exec -i "$node" ctr -n k8s.io images import --digests --snapshotter overlayfs - >/dev/null 2>>"$err"; then
    kdie "loading $image into $node failed ($(df -Pm "$root" | awk 'NR == 2 { print $4 }') MB free under $root now): $(tail -n 5 "$err")"
  fi
  docker exec "$node" ctr -n k8s.io content rm "${layers[@]}" >/dev/null
  # The CRI plugin learns of the import from containerd's events: give it a moment.
  for _ in $(seq 60); do loaded "$node" && break; sleep 1; done
  loaded "$node" || kdie "$image is not usable on $node after loading"
  klog "loaded $image into $node in $((SECONDS - start)) s"
done

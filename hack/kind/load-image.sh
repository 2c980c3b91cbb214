#!/usr/bin/env bash
# Loads a local Docker image into kind nodes, like `kind load docker-image`, storing it once per node:
#
#   hack/kind/load-image.sh IMAGE NODE...        (NODE: the kind node container's name)
#
# The runtime image is 6 GB. `kind load` imports `docker save`'s uncompressed layers one node after
# the other, so each node keeps the image twice (content store + unpacked snapshot) and pays the
# whole save again. Here (oci_fanout.py) the image is saved and compressed once, streamed to every
# node's containerd side by side, unpacked, and then the compressed layers are dropped from each
# content store, as containerd's discard_unpacked_layers does for pulled images: a node keeps the
# unpacked snapshot and the image's manifest and config. Skips nodes that already hold the same
# image id. When the disk cannot hold every node's import at once, the nodes load one at a time
# from the same compressed copy. The compressed copy is kept, by image id, for the next cluster:
# a warm machine loads the same runtime image in every test session, and saving and compressing it
# again cost as much CPU, beside the tests, as both nodes' imports (one node, measured in one run:
# the loader 109 s and dockerd's save 57 s, the node's import 124 s).
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
# (Listed into a variable first: `grep -q` would close the pipe early and pipefail take that as failure.)
loaded() { local ids; ids=$(docker exec "$1" crictl images -q --no-trunc 2>/dev/null || true); grep -qx "$id" <<<"$ids"; }
todo=()
for node in "$@"; do loaded "$node" || todo+=("$node"); done
[ ${#todo[@]} -gt 0 ] || exit 0
# The image each node holds under this name now: a rebuild replaces it, and the replaced one (6 GB
# for the runtime) is removed once the new one is in, or every rebuild would leave one behind.
declare -A replaced
for node in "${todo[@]}"; do
  replaced[$node]=$(docker exec "$node" crictl inspecti -o go-template --template '{{.status.id}}' "$ref" 2>/dev/null || true)
done

# The nodes' containerd stores live under the engine's data root. Each node keeps the unpacked
# image, and holds its compressed layers too until they are dropped; the compressed copy on the
# host (about half the image) stays. Loading N nodes at once peaks at 1.5 images per node beside
# that copy; one at a time, at N + 0.5. Say so before a 6 GB import fails half way.
root=$(docker info -f '{{.DockerRootDir}}')
size_mb=$(( $(docker image inspect -f '{{.Size}}' "$image") / 1048576 ))
free_mb() { df -Pm "$1" | awk 'NR == 2 { print $4 }'; }
# The compressed copies of the images this engine still holds by name; the others are dropped.
compressed=$KIND_CACHE/compressed
mkdir -p "$compressed"
held=$(docker images --filter dangling=false -q --no-trunc | sed 's/^sha256://' | sort -u)
for dir in "$compressed"/*/; do
  if [ -d "$dir" ] && ! grep -qx "$(basename "$dir")" <<<"$held"; then rm -rf "$dir"; fi
done
work=$compressed/${id#sha256:}
copy_mb=$(( size_mb / 2 )); [ -f "$work/image.json" ] && copy_mb=0
at_once_mb=$(( copy_mb + ${#todo[@]} * size_mb * 3 / 2 ))
one_by_one_mb=$(( copy_mb + (2 * ${#todo[@]} + 1) * size_mb / 2 ))
# The test session loads while its other tiers run and write (virtualenvs' caches, model folders,
# logs): loading at once, which saves minutes nobody waits for there, needs this much to spare.
AT_ONCE_SPARE_MB=${AT_ONCE_SPARE_MB:-8192}
if [ "$(free_mb "$root")" -ge "$(( at_once_mb + AT_ONCE_SPARE_MB ))" ]; then
  groups=("${todo[*]}")
else
  [ "$(free_mb "$root")" -ge "$one_by_one_mb" ] ||
    kdie "not enough disk to load $image into ${#todo[@]} node(s): $(free_mb "$root") MB free under $root, about $one_by_one_mb MB needed (free space, e.g. docker builder prune, or old files under /tmp)"
  klog "loading ${#todo[@]} nodes one at a time: $(free_mb "$root") MB free, at once needs $at_once_mb MB and $AT_ONCE_SPARE_MB to spare"
  groups=("${todo[@]}")
fi
mkdir -p "$work"
# The kept copy is shared by every bring-up on this machine: one writes it at a time, and a second
# bring-up of the same image waits and then reads it.
exec 7>"$work/lock"
flock 7
# Each node's import errors are written beside the copy; a failure prints them, then they go.
trap 'rm -f "$work"/*.err' EXIT
for group in "${groups[@]}"; do
  read -r -a nodes <<<"$group"
  start=$SECONDS
  if ! failed=$(python3 "$here/oci_fanout.py" "$image" "$ref" "$work" "${nodes[@]}"); then
    kdie "loading $image failed ($(free_mb "$root") MB free under $root now): $failed"
  fi
  mapfile -t layers <"$work/layers"
  for node in "${nodes[@]}"; do
    docker exec "$node" ctr -n k8s.io content rm "${layers[@]}" >/dev/null
  done
  for node in "${nodes[@]}"; do
    # The CRI plugin learns of the import from containerd's events: give it a moment.
    for _ in $(seq 60); do loaded "$node" && break; sleep 1; done
    loaded "$node" || kdie "$image is not usable on $node after loading"
    old=${replaced[$node]:-}
    if [ -n "$old" ] && [ "$old" != "$id" ]; then
      docker exec "$node" crictl rmi "$old" >/dev/null 2>&1 || klog "$node still uses the replaced $old (a pod runs it); kept"
    fi
  done
  klog "loaded $image into ${nodes[*]} in $((SECONDS - start)) s"
done

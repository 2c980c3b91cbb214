# Shared helpers for the hack/docker scripts (sourced, not run).
#
# Everything expensive (the debootstrap root filesystem, the host wheelhouse, the dockerd log) lives
# under $MMPREP_CACHE, outside the repo, so a second run on the same machine takes seconds.
MMPREP_CACHE=${MMPREP_CACHE:-$HOME/.cache/mmprep}
DOCKER_CACHE="$MMPREP_CACHE/docker"
# The locally built base image: Debian bookworm minbase + python3 + venv + CA certificates.
LOCAL_BASE_IMAGE=${LOCAL_BASE_IMAGE:-mmprep-base:bookworm}
# Images are $IMAGE_PREFIX<target>:$IMAGE_TAG, e.g. mmprep-runtime:0.1.0: the names the operator
# and the chart default to, so a local build runs without overriding any image value.
IMAGE_PREFIX=${IMAGE_PREFIX:-mmprep-}
IMAGE_TAG=${IMAGE_TAG:-$(sed -n 's/^version = "\(.*\)"$/\1/p' "$(dirname "${BASH_SOURCE[0]}")/../../pyproject.toml")}

log() { printf '[%s %s] %s\n' "$(basename "$0")" "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# pick_docker prints a docker CLI that can run BuildKit builds (RUN --mount, --secret).
# A Docker >= 23 CLI needs the buildx plugin for that; a 20.10 CLI (Debian's docker.io) has
# BuildKit built in. Machines may have both, so probe each one on PATH.
pick_docker() {
  local c ver
  while read -r c; do
    [ -x "$c" ] || continue
    if "$c" buildx version >/dev/null 2>&1; then echo "$c"; return 0; fi
    ver=$("$c" version --format '{{.Client.Version}}' 2>/dev/null || true)
    case "$ver" in 1[0-9].*|2[0-2].*) echo "$c"; return 0 ;; esac
  done < <(type -ap docker | awk '!seen[$0]++')
  return 1
}

docker_cli() {
  DOCKER=${DOCKER:-$(pick_docker)} || die "no docker CLI with BuildKit found (install docker.io, or docker-ce with the buildx plugin)"
  export DOCKER DOCKER_BUILDKIT=1
}

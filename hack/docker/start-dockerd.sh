#!/usr/bin/env bash
# Makes sure a Docker engine answers; installs (Debian's docker.io) and starts dockerd if needed.
#
# Idempotent: exits at once when `docker info` works. Starting dockerd needs root; on machines
# without systemd we start it directly and leave it running for later builds and tests.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

if docker info >/dev/null 2>&1; then exit 0; fi
[ "$(id -u)" = 0 ] || die "no Docker engine answers and starting one needs root"
if ! command -v dockerd >/dev/null; then
  [ "${MMPREP_INSTALL_DOCKER:-1}" = 1 ] || die "dockerd is not installed (MMPREP_INSTALL_DOCKER=0)"
  command -v apt-get >/dev/null || die "dockerd is not installed and apt-get is not available"
  log "installing docker.io and debootstrap from Debian"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker.io debootstrap >/dev/null \
    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker.io debootstrap >/dev/null; }
fi
mkdir -p "$DOCKER_CACHE"
if ! pgrep -x dockerd >/dev/null; then
  # Bound the BuildKit cache: every change of the dependency layers leaves a 6 GB snapshot behind,
  # and a full disk takes the whole machine down. An existing /etc/docker/daemon.json wins.
  config=()
  if [ ! -e /etc/docker/daemon.json ]; then
    printf '{"builder": {"gc": {"enabled": true, "defaultKeepStorage": "%s"}}}\n' "${MMPREP_BUILD_CACHE:-16GB}" \
      >"$DOCKER_CACHE/daemon.json"
    config=(--config-file "$DOCKER_CACHE/daemon.json")
  fi
  log "starting dockerd (log: $DOCKER_CACHE/dockerd.log)"
  # setsid: the daemon must outlive this script and the test session that called it.
  setsid dockerd "${config[@]}" >"$DOCKER_CACHE/dockerd.log" 2>&1 < /dev/null &
fi
for _ in $(seq 60); do
  docker info >/dev/null 2>&1 && exit 0
  sleep 1
done
tail -20 "$DOCKER_CACHE/dockerd.log" >&2 || true
die "dockerd did not answer within 60 s"

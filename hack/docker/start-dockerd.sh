#!/usr/bin/env bash
# Makes sure a Docker engine answers; installs (hack/system-packages.txt: docker) and starts dockerd if needed.
#
# Idempotent: when `docker info` already works it only makes sure of the runc wrapper below. Starting
# dockerd needs root; on machines without systemd we start it directly and leave it running for
# later builds, tests and kind clusters: one engine serves all of them.
#
# Privileged containers (kind nodes) on hosts whose capability bounding set lacks a capability the
# kernel knows: Docker 20.10 grants such containers every kernel capability and runc then fails with
# "unable to apply caps". On those hosts the engine's default runtime becomes hack/docker/runc-dropcaps,
# which drops exactly the missing ones (computed from the bounding set). Ordinary containers are
# unaffected: they never ask for a capability the host lacks. The setting lives in our own daemon
# config; a running engine started from it is reloaded with SIGHUP (runtimes are reloadable), so
# builds and containers already running are not disturbed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

WRAPPER_RUNTIME=mmprep-runc
wrapper="$DOCKER_CACHE/runc-dropcaps"
config_file="$DOCKER_CACHE/daemon.json"

# needs_wrapper: is any capability the kernel knows (up to cap_last_cap) missing from our bounding set?
needs_wrapper() {
  local last bnd; last=$(cat /proc/sys/kernel/cap_last_cap 2>/dev/null) || return 1
  bnd=$((16#$(awk '/^CapBnd:/ {print $2}' /proc/self/status)))
  (( (bnd & ((1 << (last + 1)) - 1)) != (1 << (last + 1)) - 1 ))
}

write_config() {  # our daemon.json: a bounded BuildKit cache (+ the wrapper runtime where needed)
  local runtime=""
  if needs_wrapper; then
    command -v jq >/dev/null || "$here/../system-packages.sh" tools
    local real; real=$(PATH=/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin command -v runc) \
      || die "runc is not installed (the engine's packages bring it: hack/system-packages.sh docker)"
    sed "s|@REAL_RUNC@|$real|" "$here/runc-dropcaps" >"$wrapper.tmp"
    chmod 0755 "$wrapper.tmp"; mv "$wrapper.tmp" "$wrapper"
    runtime=$(printf ', "runtimes": {"%s": {"path": "%s"}}, "default-runtime": "%s"' "$WRAPPER_RUNTIME" "$wrapper" "$WRAPPER_RUNTIME")
  fi
  # Bound the BuildKit cache: every change of the dependency layers leaves a 6 GB snapshot behind,
  # and a full disk takes the whole machine down.
  printf '{"builder": {"gc": {"enabled": true, "defaultKeepStorage": "%s"}}%s}\n' "${MMPREP_BUILD_CACHE:-16GB}" "$runtime" \
    >"$config_file.tmp"
  mv "$config_file.tmp" "$config_file"
}

wrapper_ok() {  # the running engine runs privileged containers (or does not need to be told how)
  needs_wrapper || return 0
  [ "$(docker info --format '{{.DefaultRuntime}}' 2>/dev/null)" = "$WRAPPER_RUNTIME" ]
}

if docker info >/dev/null 2>&1; then
  wrapper_ok && exit 0
  pid=$(pgrep -x dockerd | head -1 || true)
  if [ -n "$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "--config-file $config_file"; then
    log "adding the $WRAPPER_RUNTIME runtime to the running dockerd (reload)"
    write_config
    kill -HUP "$pid"
    for _ in $(seq 30); do wrapper_ok && exit 0; sleep 1; done
    die "dockerd did not take the $WRAPPER_RUNTIME runtime (log: $DOCKER_CACHE/dockerd.log)"
  fi
  log "warning: this Docker engine lacks capabilities the kernel knows and is not ours to reconfigure;"
  log "privileged containers (kind nodes) will fail unless its default runtime drops them (see $here/runc-dropcaps)"
  exit 0
fi
[ "$(id -u)" = 0 ] || die "no Docker engine answers and starting one needs root"
if ! command -v dockerd >/dev/null; then
  # Only where no engine is installed at all: Debian's docker.io would conflict with docker-ce.
  [ "${MMPREP_INSTALL_DOCKER:-1}" = 1 ] || die "dockerd is not installed (MMPREP_INSTALL_DOCKER=0)"
  "$here/../system-packages.sh" docker
fi
mkdir -p "$DOCKER_CACHE"
if ! pgrep -x dockerd >/dev/null; then
  # An existing /etc/docker/daemon.json wins (and then the engine is the machine owner's to set up).
  config=()
  if [ ! -e /etc/docker/daemon.json ]; then write_config; config=(--config-file "$config_file"); fi
  log "starting dockerd (log: $DOCKER_CACHE/dockerd.log)"
  # setsid: the daemon must outlive this script and the test session that called it.
  # The callers' lock files (fds 8 and 9) are closed: a daemon must not hold them forever.
  setsid dockerd "${config[@]}" >"$DOCKER_CACHE/dockerd.log" 2>&1 </dev/null 8>&- 9>&- &
fi
for _ in $(seq 60); do
  docker info >/dev/null 2>&1 && exit 0
  sleep 1
done
tail -20 "$DOCKER_CACHE/dockerd.log" >&2 || true
die "dockerd did not answer within 60 s"

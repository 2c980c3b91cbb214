#!/usr/bin/env bash
# Builds the local base image ($LOCAL_BASE_IMAGE) for machines that cannot pull from a registry:
# a Debian bookworm minbase root filesystem with python3, python3-venv and CA certificates, made
# with debootstrap and loaded with `docker import`.
#
# Cached twice: the image itself (skip when present) and the root filesystem tarball under
# $MMPREP_CACHE (a fresh Docker data dir re-imports it in seconds instead of re-bootstrapping).
# Online users do not need this: the Dockerfile defaults to the official python image.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

SUITE=${DEBIAN_SUITE:-bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
TARBALL="$DOCKER_CACHE/rootfs-$SUITE-minbase-python3.tar"

"$(dirname "$0")/start-dockerd.sh"
if docker image inspect "$LOCAL_BASE_IMAGE" >/dev/null 2>&1; then exit 0; fi

if [ ! -s "$TARBALL" ]; then
  [ "$(id -u)" = 0 ] || die "debootstrap needs root"
  "$(dirname "$0")/../system-packages.sh" debootstrap
  mkdir -p "$DOCKER_CACHE"
  root=$(mktemp -d "$DOCKER_CACHE/rootfs.XXXXXX")
  trap 'rm -rf "$root"' EXIT
  log "debootstrap $SUITE minbase into $root (about a minute)"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$SUITE" "$root" "$MIRROR" >"$DOCKER_CACHE/debootstrap.log" 2>&1 \
    || { tail -20 "$DOCKER_CACHE/debootstrap.log" >&2; die "debootstrap failed"; }
  # Package caches and lists are dead weight in an image; the images never run apt.
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*
  tar -C "$root" --numeric-owner -cf "$TARBALL.tmp" .
  mv "$TARBALL.tmp" "$TARBALL"
fi
log "importing $TARBALL as $LOCAL_BASE_IMAGE"
docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' \
  "$TARBALL" "$LOCAL_BASE_IMAGE" >/dev/null
log "built $LOCAL_BASE_IMAGE"

#!/usr/bin/env bash
# Proves that CI's build steps install every Debian package they need: runs hack/ci-build.sh
# (the Python environment, the control plane, vLLM's virtualenv, the Docker engine, both images and
# the kind node image) in a clean Debian root, and fails if any step fails there.
#
#   hack/clean-root-check.sh          the working tree as it is (tracked and untracked files)
#
# The clean root is a privileged container of the locally built base image (hack/docker/build-base.sh:
# a debootstrap bookworm minbase with python3, python3-venv and CA certificates, package lists
# empty), with a Docker engine of its own inside (its data root on a volume: overlay on overlay
# does not work). It is given only what a new machine of this project's kind starts with: Go
# (mounted read-only from the host) and this machine's CA bundle (its network needs it). Nothing
# is shared with the host's caches but the Go modules' downloads (a read-only file:// GOPROXY in
# front of the real one): every compile, every pip install and every Debian package install happens inside.
#
# It takes about as long as a cold CI build (40-60 minutes on 2 cores) and about 40 GB of disk,
# freed at the end (MMPREP_KEEP_CLEAN_ROOT=1 keeps the container and its volume to look inside).
# The log: $MMPREP_CACHE/clean-root/check.log.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
. "$here/docker/lib.sh"
name=mmprep-clean-root
volumes=(mmprep-clean-root-home mmprep-clean-root-docker)
out="$MMPREP_CACHE/clean-root"
mkdir -p "$out"

"$here/docker/start-dockerd.sh"
"$here/docker/build-base.sh"
go_root=$(go env GOROOT)
modcache=$(go env GOMODCACHE)
cert=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}

cleanup() {
  [ "${MMPREP_KEEP_CLEAN_ROOT:-0}" = 1 ] && return 0
  docker rm -f "$name" >/dev/null 2>&1 || true
  # The engine may still hold a volume for a moment after removing the container.
  for _ in 1 2 3 4 5; do docker volume rm "${volumes[@]}" >/dev/null 2>&1 && break; sleep 2; done
}
docker rm -f "$name" >/dev/null 2>&1 || true
docker volume rm "${volumes[@]}" >/dev/null 2>&1 || true
trap cleanup EXIT
# Volumes for /root (the caches the build fills: tens of GB must not land in the container's own
# layer) and for the inner engine's data root (overlay on overlay does not work). A low CPU weight:
# on a shared machine the check takes only what other work leaves.
docker run -d --name "$name" --privileged --hostname clean-root --cpu-shares "${MMPREP_CLEAN_ROOT_CPU_SHARES:-1024}" \
  -v "${volumes[0]}:/root" -v "${volumes[1]}:/var/lib/docker" \
  -v "$go_root:/usr/local/go:ro" \
  -v "$modcache/cache/download:/host-go-downloads:ro" \
  -v "$cert:/host-ca.crt:ro" \
  -e PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  -e GOPROXY=file:///host-go-downloads,https://proxy.golang.org \
  -e SSL_CERT_FILE=/host-ca.crt -e PIP_CERT=/host-ca.crt -e REQUESTS_CA_BUNDLE=/host-ca.crt \
  -e CURL_CA_BUNDLE=/host-ca.crt -e MMPREP_BUILD_CACHE=8GB \
  --entrypoint sleep mmprep-base:bookworm infinity >/dev/null
docker exec "$name" sh -c 'mkdir -p /root/src && ! command -v gcc && ! command -v make && ! command -v docker && ! command -v jq' >/dev/null \
  || die "the clean root is not clean: it already has gcc, make, docker or jq"
# The working tree as a user's checkout would have it: tracked and untracked files, no ignored ones.
git -C "$repo" ls-files -z --cached --others --exclude-standard \
  | tar -C "$repo" --null -T - -cf - | docker exec -i "$name" tar -C /root/src -xf -
log "running hack/ci-build.sh in the clean root (log: $out/check.log)"
start=$SECONDS
if docker exec -w /root/src "$name" bash -c 'hack/ci-build.sh' >"$out/check.log" 2>&1; then
  status=0
else
  status=$?
fi
grep -E '^== ' "$out/check.log" || true
if [ "$status" != 0 ]; then
  tail -40 "$out/check.log" >&2
  die "hack/ci-build.sh failed in the clean root after $((SECONDS - start)) s (exit $status; log: $out/check.log)"
fi
docker exec "$name" sh -c 'docker image ls --format "{{.Repository}}:{{.Tag}} {{.Size}}"' | sed 's/^/  built: /' >&2
log "hack/ci-build.sh passed in the clean root in $((SECONDS - start)) s"

#!/usr/bin/env bash
# Fills a host wheelhouse with every wheel the images need, then links it into ./wheelhouse/ (the
# build context), so `docker build` installs with --no-index: no network inside the build, no CA
# bundle to pass in, and torch's large CUDA wheels are downloaded once per machine, not per build.
#
#   hack/docker/wheelhouse.sh [EXTRA...]     default extras: operator runtime
#
# Cache: $MMPREP_CACHE/wheelhouse/<python>-<arch>/, keyed by a hash of the requirements, so a
# second run with unchanged pyproject.toml does nothing. For another architecture (arm64 nodes),
# set PIP_DOWNLOAD_ARGS="--platform manylinux_2_28_aarch64 --python-version 3.11 --implementation cp".
set -euo pipefail
. "$(dirname "$0")/lib.sh"
repo=$(cd "$(dirname "$0")/../.." && pwd)
extras=("$@"); [ ${#extras[@]} -gt 0 ] || extras=(operator runtime)

py=${PYTHON:-}
if [ -z "$py" ]; then
  if [ -x "$repo/.venv/bin/python" ]; then py="$repo/.venv/bin/python"; else py=python3; fi
fi
pyver=$("$py" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
arch=$(uname -m)
dest="$MMPREP_CACHE/wheelhouse/$pyver-$arch"
mkdir -p "$dest"

req=$(mktemp); trap 'rm -f "$req"' EXIT
args=(); for e in "${extras[@]}"; do args+=(--extra "$e"); done
"$py" "$(dirname "$0")/requirements.py" "$repo/pyproject.toml" "${args[@]}" --build-system > "$req"
key=$(cat "$req" <(echo "${PIP_DOWNLOAD_ARGS:-}") | sha256sum | cut -c1-16)
if [ ! -e "$dest/.complete-$key" ]; then
  log "downloading wheels for ${extras[*]} into $dest (torch with CUDA libraries: several GB, once)"
  # shellcheck disable=SC2086  # PIP_DOWNLOAD_ARGS is a list of flags on purpose
  "$py" -m pip download --quiet --only-binary=:all: --dest "$dest" -r "$req" ${PIP_DOWNLOAD_ARGS:-}
  touch "$dest/.complete-$key"
fi

# Hard links cost no space; fall back to copies across filesystems.
mkdir -p "$repo/wheelhouse"
for w in "$dest"/*.whl; do
  t="$repo/wheelhouse/$(basename "$w")"
  [ -e "$t" ] || ln "$w" "$t" 2>/dev/null || cp "$w" "$t"
done
log "wheelhouse ready: $(ls "$repo/wheelhouse"/*.whl | wc -l) wheels, $(du -sh "$dest" | cut -f1)"

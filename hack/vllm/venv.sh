#!/usr/bin/env bash
# vLLM's own virtualenv, for the compatibility tests and the benchmark that run its render server.
# vLLM pins its own torch and transformers, so it cannot share the project's environment. The
# virtualenv is cached outside the repo, keyed by vLLM and Python versions: the first run installs
# (minutes, ~9 GB of wheels), later runs print the path in well under a second. mmprep's general
# render path (vLLM's own processing in mmprep's worker processes) runs from it too.
# Prints the virtualenv's directory on stdout; progress goes to stderr.
set -euo pipefail
PYTHON=${MMPREP_VLLM_PYTHON:-python3.11}
# mmprep's general render path runs in this virtualenv too (its worker processes import vLLM):
# the runtime's light dependencies from pyproject's `vllm` extra, less vLLM itself, which pins
# the rest. Seconds; done once per list (its hash is the marker). The extra's vLLM pin is the
# version installed: the render tier runs the vLLM minor version of the engine it feeds.
repo=$(cd "$(dirname "$0")/../.." && pwd)
extra=$("$PYTHON" - "$repo/pyproject.toml" <<'PY'
import sys, tomllib
extra = tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]["vllm"]
print(next(d.split("==")[1] for d in extra if d.startswith("vllm==")))
print("\n".join(d for d in extra if not d.startswith("vllm")))
PY
)
VLLM_VERSION=${MMPREP_VLLM_VERSION:-$(head -n1 <<<"$extra")}
deps=$(tail -n +2 <<<"$extra")
pyver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
root=${MMPREP_CACHE:-$HOME/.cache/mmprep}/vllm
venv=$root/vllm-$VLLM_VERSION-py$pyver
marker="$venv/.mmprep-deps-$(printf '%s' "$deps" | sha256sum | cut -c1-12)"
if [ -f "$venv/.installed" ] && [ -f "$marker" ]; then
  echo "$venv"
  exit 0
fi
# MMPREP_VLLM_IF_INSTALLED=1: only say where it is; never install (exit 3 when it is not there).
if [ "${MMPREP_VLLM_IF_INSTALLED:-0}" = 1 ]; then
  echo "vLLM's virtualenv is not installed at $venv (make vllm-venv)" >&2
  exit 3
fi
mkdir -p "$root"
# One installer at a time: concurrent test sessions wait for the first one's result.
exec 9>"$root/.lock-$VLLM_VERSION-py$pyver"
flock 9
if [ ! -f "$venv/.installed" ]; then
  rm -rf "$venv"
  echo "installing vllm==$VLLM_VERSION into $venv" >&2
  "$PYTHON" -m venv "$venv" >&2
  "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
  "$venv/bin/python" -m pip install --quiet "vllm==$VLLM_VERSION" >&2
  "$venv/bin/python" -c 'import vllm, msgspec, blake3' >&2
  touch "$venv/.installed"
fi
if [ ! -f "$marker" ]; then
  echo "installing mmprep's general-path dependencies into $venv" >&2
  printf '%s\n' "$deps" >"$venv/.mmprep-deps.txt"
  "$venv/bin/python" -m pip install --quiet -r "$venv/.mmprep-deps.txt" >&2
  "$venv/bin/python" -c 'import msgpack, blake3, psutil, orjson, pybase64, aiohttp, av, soundfile, soxr, scipy.signal' >&2
  touch "$marker"
fi
echo "$venv"

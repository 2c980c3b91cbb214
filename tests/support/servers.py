"""How the tests and benchmarks start local servers: a free port, mmprep's runtime command, and
vLLM's render server as the peer of mmprep's render API (``hack/vllm/venv.sh``)."""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import sys
from collections.abc import Sequence


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now (the kernel's pick, for the next server)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def runtime_command() -> list[str]:
    """``mmprep-runtime`` as this virtualenv installs it (or its module, when run from a checkout)."""
    script = shutil.which("mmprep-runtime", path=os.path.dirname(sys.executable))
    return [script] if script else [sys.executable, "-m", "mmprep_runtime.cli"]


def vllm_render_command(
    venv: pathlib.Path, model: pathlib.Path, port: int, *, normalized: bool, options: Sequence[str] = ()
) -> list[str]:
    """vLLM's render server on ``model``, its processor cache off (repeated images would hit it),
    with uint8 pixels (its default) or normalized ones (mmprep's ``--normalized-pixels``), and
    vLLM's ``options``."""
    command = [str(venv / "bin" / "vllm"), "launch", "render", str(model), "--host", "127.0.0.1", "--port", str(port)]
    command += ["--mm-processor-cache-gb", "0", *options]
    return [*command, "--no-mm-device-do-normalize"] if normalized else command


#: vLLM on the CPU, offline, reporting nothing (the test agent gives its vLLM-image pods these too).
VLLM_CPU_ENV = {
    "CUDA_VISIBLE_DEVICES": "",
    "VLLM_TARGET_DEVICE": "cpu",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


def vllm_render_env() -> dict[str, str]:
    """vLLM on the CPU, offline, reporting nothing, in its own virtualenv (not this one)."""
    env = {**os.environ, **VLLM_CPU_ENV}
    env.pop("VIRTUAL_ENV", None)
    return env


def cpu_engine_env(venv: pathlib.Path) -> dict[str, str]:
    """``vllm_render_env()`` for vLLM's CPU build (``hack/vllm/venv.sh cpu-engine``), its engine and
    the tier run from it: a KV cache of 1 GiB (vLLM's default takes a share of the machine's memory),
    and its own cache of model inspections, which venv.sh fills. The render virtualenv's vLLM keeps
    its own under the same file names, for another version's modules: sharing one, each would find
    the other's entries stale and inspect the model again at every start."""
    return {**vllm_render_env(), "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CACHE_ROOT": str(venv / "vllm-cache")}

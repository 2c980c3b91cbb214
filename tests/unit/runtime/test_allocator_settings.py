"""The allocator settings: applied on glibc, left alone when the environment sets malloc knobs.

Their effect (page faults per request) is measured by the benchmark on real requests; a unit test
of fault counts on synthetic allocations proved to depend on the address-space layout of the run.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mmprep_runtime.engine import memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_glibc_accepts_the_settings():
    # In a fresh interpreter, with no malloc knobs in its environment.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    script = "from mmprep_runtime.engine import memory; print(memory.tune_allocator())"
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "True"


def test_malloc_knobs_in_the_environment_win(monkeypatch):
    monkeypatch.setenv("MALLOC_TOP_PAD_", "0")
    assert memory.tune_allocator() is False

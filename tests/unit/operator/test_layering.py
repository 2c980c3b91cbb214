"""The deciding and rendering modules are pure: importing them pulls in no API client or kopf."""

from __future__ import annotations

import subprocess
import sys

PURE = [
    "api",
    "gpus",
    "nodes",
    "naming",
    "replicas",
    "config",
    "pools",
    "decide",
    "render",
    "probe",
    "status",
    "plan",
    "crd",
    "rbac",
    "podstates",
]
IO_LIBRARIES = ["kopf", "aiohttp", "kubernetes", "torch", "transformers"]


def test_pure_modules_import_no_io_library() -> None:
    # One fresh interpreter for all of them: sys.modules then shows what any of them dragged in.
    code = (
        "import importlib, sys\n"
        f"for m in {PURE!r}: importlib.import_module('mmprep_operator.' + m)\n"
        f"print(','.join(m for m in {IO_LIBRARIES!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "", f"a pure module imports {out.stdout.strip()}"


def test_the_check_would_notice_an_io_import() -> None:
    code = f"import sys, mmprep_operator.kube\nprint(','.join(m for m in {IO_LIBRARIES!r} if m in sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert "aiohttp" in out.stdout

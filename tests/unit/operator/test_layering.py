"""The operator's pure layers stay pure when imported: a second check beside the import contracts.

``lint-imports`` (the contracts in ``pyproject.toml``, the one statement of the layers) reads the
source; this test imports every module of the pure packages named there in a fresh interpreter
and looks at what got loaded, so an import made through ``importlib`` or a plugin is caught too.
"""

from __future__ import annotations

import subprocess
import sys

PURE_PACKAGES = ["mmprep_operator.api", "mmprep_operator.logic"]
IO_LIBRARIES = ["kopf", "aiohttp", "kubernetes", "torch", "transformers"]


def _loaded_after_importing(code: str) -> str:
    script = f"import importlib, pkgutil, sys\n{code}\nprint(','.join(m for m in {IO_LIBRARIES!r} if m in sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.strip()


def test_pure_modules_import_no_io_library() -> None:
    # One fresh interpreter for all of them: sys.modules then shows what any of them dragged in.
    code = (
        f"for name in {PURE_PACKAGES!r}:\n"
        "    package = importlib.import_module(name)\n"
        "    for info in pkgutil.walk_packages(package.__path__, name + '.'):\n"
        "        importlib.import_module(info.name)\n"
    )
    assert _loaded_after_importing(code) == "", "a pure module imports an I/O library"


def test_the_check_would_notice_an_io_import() -> None:
    assert "aiohttp" in _loaded_after_importing("import mmprep_operator.kube")

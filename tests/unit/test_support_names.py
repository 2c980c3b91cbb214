"""The test helpers in tests/support never shadow an installed module.

tests/support is on sys.path (as a script's own folder, or through the tests' imports), so a helper
named like a library (``packaging.py``) would be imported in its place, by vLLM's check script or
by any library that imports it: a failure far from its cause.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SUPPORT = Path(__file__).resolve().parents[1] / "support"


def test_no_helper_is_named_like_an_installed_module() -> None:
    elsewhere = [p for p in sys.path if Path(p or ".").resolve() != SUPPORT]
    shadowing = []
    for helper in sorted(SUPPORT.glob("*.py")):
        if helper.stem == "__init__":
            continue
        saved = sys.path[:]
        try:
            sys.path[:] = elsewhere
            spec = importlib.util.find_spec(helper.stem)
        finally:
            sys.path[:] = saved
        if spec is not None and spec.origin and Path(spec.origin).resolve() != helper.resolve():
            shadowing.append(f"{helper.name} shadows {spec.origin}")
    assert not shadowing, shadowing


def test_every_test_module_has_a_name_of_its_own() -> None:
    """The tiers' folders are not packages, so pytest imports each test file by its bare name: two
    files named alike in two tiers stop the whole session at collection (`make unit` alone, which
    collects one tier, would not show it)."""
    tests = Path(__file__).resolve().parents[1]
    seen: dict[str, list[str]] = {}
    for path in tests.rglob("test_*.py"):
        seen.setdefault(path.name, []).append(str(path.relative_to(tests)))
    assert not {name: paths for name, paths in seen.items() if len(paths) > 1}

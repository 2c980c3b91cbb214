"""Print the pip requirements of mmprep for the given extras, one per line, from pyproject.toml.

Used on the host (to fill a wheelhouse) and inside the Dockerfile (to install dependencies in a
layer that only changes when pyproject.toml does, not on every source edit). Standard library
only: it runs on a bare base image before anything is installed.

    python3 requirements.py PYPROJECT [--extra NAME ...] [--build-system]
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path


def requirements(pyproject: Path, extras: list[str], build_system: bool) -> list[str]:
    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    project = data["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise SystemExit(f"unknown extra(s) {unknown}; pyproject has {sorted(optional)}")
    reqs: list[str] = list(project.get("dependencies", []))
    for extra in extras:
        reqs.extend(optional[extra])
    if build_system:
        reqs.extend(data.get("build-system", {}).get("requires", []))
    # Keep the first occurrence: extras may repeat a requirement (aiohttp is in two).
    return list(dict.fromkeys(reqs))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pyproject", type=Path)
    parser.add_argument("--extra", action="append", default=[])
    parser.add_argument("--build-system", action="store_true", help="add [build-system] requires")
    args = parser.parse_args(argv)
    print("\n".join(requirements(args.pyproject, args.extra, args.build_system)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

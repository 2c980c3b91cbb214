"""What users and other programs see stays as it is: a snapshot of every generated output.

Committed under ``tests/unit/golden/``: the CRD (``mmprep-operator crd``), the ClusterRole
(``mmprep-operator rbac``), the policy file's schema, the objects ``mmprep-operator render``
prints for every file in ``examples/`` (on ``hack/nodes.yaml``, once with the assumed probe and
the probe Job, once with the real probe of the examples' model), both CLIs' flags (names, env
defaults, choices) and the runtime's HTTP routes. Each is produced through the public entry
points (the console scripts' ``main`` functions, ``create_app``), so moving modules around
cannot change them unnoticed.

Regenerate only after an intended change, with ``MMPREP_UPDATE_GOLDEN=1 pytest tests/unit/golden``,
and review the diff like code.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
from typing import Any

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
GOLDEN = pathlib.Path(__file__).parent / "data"
EXAMPLES = sorted(p.stem for p in (REPO / "examples").glob("*.yaml"))
NODES = REPO / "hack" / "nodes.yaml"
# The real probe answer for the examples' model (qwen2-vl), as `mmprep-runtime probe` printed it.
REAL_PROBE = REPO / "tests" / "unit" / "operator" / "data" / "probe-runtime-qwen2-vl.json"


def _compare(name: str, text: str) -> None:
    golden = GOLDEN / name
    if os.environ.get("MMPREP_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert golden.exists(), f"no snapshot {name}; generate it (see module docstring)"
    assert golden.read_text() == text, f"{name} changed; if intended, regenerate it (see module docstring) and review the diff"


def _operator(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    from mmprep_operator.cli import main

    capsys.readouterr()
    assert main(list(argv)) == 0
    out, _ = capsys.readouterr()
    return out


@pytest.mark.parametrize("command", ["crd", "rbac", "policy-schema"])
def test_generated_manifests_are_unchanged(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    _compare(f"{command}.txt", _operator(capsys, command))


@pytest.mark.parametrize("example", EXAMPLES)
def test_rendered_examples_with_the_assumed_probe_are_unchanged(example: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = REPO / "examples" / f"{example}.yaml"
    _compare(f"render/{example}.yaml", _operator(capsys, "render", "-f", str(path), "--nodes", str(NODES), "--with-probe-job"))


@pytest.mark.parametrize("example", EXAMPLES)
def test_rendered_examples_with_the_real_probe_are_unchanged(example: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = REPO / "examples" / f"{example}.yaml"
    out = _operator(capsys, "render", "-f", str(path), "--nodes", str(NODES), "--probe", str(REAL_PROBE))
    _compare(f"render/{example}-probed.yaml", out)


def _parser_shape(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """Every flag a parser takes, with its destination, default and choices; subcommands nested."""
    shape: dict[str, Any] = {"options": [], "commands": {}}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in sorted(action.choices.items()):
                shape["commands"][name] = _parser_shape(sub)
            continue
        if isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        shape["options"].append(
            {
                "flags": list(action.option_strings) or [action.dest],
                "dest": action.dest,
                "default": repr(action.default),
                "choices": sorted(map(repr, action.choices)) if action.choices else None,
                "nargs": repr(action.nargs),
                "required": action.required,
            }
        )
    return shape


def test_both_command_lines_are_unchanged() -> None:
    from mmprep_operator import cli as operator_cli
    from mmprep_runtime import cli as runtime_cli

    shapes = {
        "mmprep-operator": _parser_shape(operator_cli.build_parser()),
        "mmprep-runtime": _parser_shape(runtime_cli.build_parser()),
    }
    _compare("command-lines.json", json.dumps(shapes, indent=1, sort_keys=True) + "\n")


def test_the_runtime_serves_the_same_routes() -> None:
    from mmprep_runtime import cli as runtime_cli
    from mmprep_runtime.server.app import create_app
    from mmprep_runtime.settings import serve_settings_from_args

    args = runtime_cli.build_parser().parse_args(["serve", "--model", "/models/m"])
    app = create_app(serve_settings_from_args(args, {}))
    routes = sorted(f"{r.method} {r.resource.canonical}" for r in app.router.routes() if r.resource is not None)
    _compare("routes.txt", "\n".join(routes) + "\n")

"""Neither package has an import cycle, lazy (function-level) imports included.

A lazy import can hide a cycle from the interpreter (the second module is loaded only when the
function runs), not from the design: the two modules still depend on each other. grimp (the graph
import-linter builds its contracts on) reads every import statement, at any depth, so a cycle is
found whether or not it would ever fail at run time. The check runs twice: between modules, and
between the parts each package is split into (its subpackages and top-level modules), which is
what the layer contracts in ``pyproject.toml`` order.
"""

from __future__ import annotations

import functools

import grimp
import pytest

PACKAGES = ["mmprep_operator", "mmprep_runtime"]


@functools.cache
def graph(package: str) -> grimp.ImportGraph:
    return grimp.build_graph(package)


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of a directed graph, as the list of its nodes, or None."""
    visiting: list[str] = []
    done: set[str] = set()

    def visit(node: str) -> list[str] | None:
        if node in visiting:
            return [*visiting[visiting.index(node) :], node]
        if node in done:
            return None
        visiting.append(node)
        for nxt in sorted(edges.get(node, ())):
            found = visit(nxt)
            if found:
                return found
        visiting.pop()
        done.add(node)
        return None

    for start in sorted(edges):
        found = visit(start)
        if found:
            return found
    return None


def _edges(package: str, part: int | None) -> dict[str, set[str]]:
    """Imports between modules (``part`` None) or between the package's parts (``part`` 1)."""
    g = graph(package)

    def name(module: str) -> str:
        return module if part is None else ".".join(module.split(".")[: 1 + part])

    edges: dict[str, set[str]] = {}
    for module in g.modules:
        for imported in g.find_modules_directly_imported_by(module):
            a, b = name(module), name(imported)
            if a != b and b != package:
                edges.setdefault(a, set()).add(b)
    return edges


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_imports_itself_through_others(package: str) -> None:
    cycle = _cycle(_edges(package, None))
    assert cycle is None, f"import cycle: {' -> '.join(cycle or [])}"


@pytest.mark.parametrize("package", PACKAGES)
def test_no_part_of_a_package_imports_itself_through_others(package: str) -> None:
    cycle = _cycle(_edges(package, 1))
    assert cycle is None, f"import cycle between parts: {' -> '.join(cycle or [])}"


def test_the_check_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}}) is None

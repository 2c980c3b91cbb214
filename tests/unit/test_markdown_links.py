"""Every relative link in README.md, docs/ and the benchmarks' READMEs points at a file that exists,
and every #anchor at a heading of its target, so moving text between them cannot leave a dead link."""

from __future__ import annotations

import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
DOCUMENTS = sorted(
    [
        REPO / "README.md",
        *(REPO / "docs").glob("*.md"),
        *(REPO / "benchmarks").glob("*/README.md"),
        REPO / "charts/mmprep/README.md",
    ]
)
# [text](target): the target up to the first space or closing parenthesis; images too.
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
# Inline code is no link either: a regular expression in the CRD reference reads like `[a](b)`.
CODE_SPAN = re.compile(r"`[^`\n]+`")


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", FENCE.sub("", markdown), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def _links(document: pathlib.Path) -> list[str]:
    return LINK.findall(CODE_SPAN.sub("", FENCE.sub("", document.read_text())))


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(document: pathlib.Path) -> None:
    dead = []
    for target in _links(document):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        path, _, anchor = target.partition("#")
        resolved = (document.parent / path).resolve() if path else document
        if not resolved.exists():
            dead.append(f"{target} (no {resolved.relative_to(REPO) if resolved.is_relative_to(REPO) else resolved})")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved.read_text()):
            dead.append(f"{target} (no heading #{anchor})")
    assert not dead, f"{document.relative_to(REPO)}: dead links: {dead}"


def test_the_readme_is_a_guide_of_at_most_about_250_lines() -> None:
    assert len((REPO / "README.md").read_text().splitlines()) <= 260

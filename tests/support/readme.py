"""The README's sections and code blocks as the tests that run them read them: what a user copies
is what runs."""

from __future__ import annotations

import re

from support.kube import REPO

README = REPO / "README.md"


def code_blocks(heading: str, language: str) -> list[str]:
    """The ``language`` fenced blocks of the README's section titled ``heading`` (a level-2 title),
    in their order."""
    text = README.read_text()
    section = text[text.index(f"## {heading}") :]
    end = section.find("\n## ", 1)
    section = section if end < 0 else section[:end]
    return re.findall(rf"```{re.escape(language)}\n(.*?)```", section, re.S)

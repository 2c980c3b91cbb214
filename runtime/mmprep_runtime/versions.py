"""Library versions, as reported by probe and /v1/info (what a measurement was made with)."""

from __future__ import annotations

import importlib.metadata
import platform

_DISTRIBUTIONS = ("mmprep", "torch", "torchvision", "transformers", "tokenizers", "pillow")


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in _DISTRIBUTIONS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found

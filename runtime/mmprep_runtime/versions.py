"""Library versions, as reported by probe and /v1/info (what a measurement was made with)."""

from __future__ import annotations

import importlib.metadata
import platform

_DISTRIBUTIONS = ("mmprep", "torch", "torchvision", "transformers", "tokenizers", "pillow", "vllm")


def version_of(distribution: str) -> str | None:
    """An installed distribution's version, from its metadata (nothing is imported), or None."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def vllm_version() -> str | None:
    """The installed vLLM's version (the general render path's, and what ``/version`` says)."""
    return version_of("vllm")


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in _DISTRIBUTIONS:
        found[name] = version_of(name)
    return found

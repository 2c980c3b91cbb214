"""Which path renders a model's vLLM render requests, and why (``choose``): pure, no I/O.

- **native**: mmprep's own rendering on clone-per-thread workers (``stages``). It exists for
  the families where it is measured faster than vLLM and byte-equal to it (``NATIVE_FAMILIES``).
- **general**: vLLM's own processing in worker processes (``forwarding``): every model the
  installed vLLM renders, answered exactly as that vLLM version answers.

With ``auto``, a native family takes the native path and keeps the general path beside it (when
vLLM is installed) for requests the native path does not render exactly (``errors.BeyondFastPath``:
a video, a tool list, a chat-template argument); every other model takes the general path.
"""

from __future__ import annotations

import dataclasses
from typing import Final

#: Processor classes the native path renders byte-equal to vLLM (images and text).
NATIVE_FAMILIES: Final = frozenset({"Qwen2VLProcessor", "Qwen2_5_VLProcessor", "Qwen3VLProcessor"})

NATIVE: Final = "native"
GENERAL: Final = "general"


@dataclasses.dataclass(frozen=True)
class RenderPath:
    """The path serving the model's render requests, whether the general path runs beside it as
    the fallback, and the reason in words (``/v1/info``)."""

    primary: str
    general_fallback: bool
    reason: str

    @property
    def needs_general(self) -> bool:
        return self.primary == GENERAL or self.general_fallback


class NoRenderPath(ValueError):
    """The path asked for cannot run here (the general path without vLLM installed)."""


def choose(setting: str, processor_class: str, vllm_version: str | None) -> RenderPath:
    """The path for ``processor_class`` under ``--render-path setting`` with vLLM ``vllm_version``
    installed (None: not installed)."""
    native_family = processor_class in NATIVE_FAMILIES
    if setting == NATIVE:
        return RenderPath(NATIVE, False, "--render-path native")
    if setting == GENERAL:
        if vllm_version is None:
            raise NoRenderPath("--render-path general needs vLLM installed (the mmprep[vllm] image)")
        return RenderPath(GENERAL, False, f"--render-path general: vLLM {vllm_version}'s own processing")
    if native_family:
        if vllm_version is None:
            return RenderPath(NATIVE, False, f"{processor_class} has the native fast path; vLLM is not installed, no fallback")
        return RenderPath(
            NATIVE,
            True,
            f"{processor_class} has the native fast path (measured faster, byte-equal); "
            f"vLLM {vllm_version}'s own processing renders what it does not",
        )
    if vllm_version is None:
        return RenderPath(
            NATIVE,
            False,
            f"{processor_class} has no native fast path and vLLM is not installed: text only "
            "(install the mmprep[vllm] image for every model vLLM renders)",
        )
    return RenderPath(GENERAL, False, f"{processor_class} has no native fast path: vLLM {vllm_version}'s own processing")

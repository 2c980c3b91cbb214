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
from collections.abc import Sequence
from typing import Final

from mmprep_runtime.settings import vllm_option_names

#: Processor classes the native path renders byte-equal to vLLM (images, Qwen2-Audio's audio, text).
NATIVE_FAMILIES: Final = frozenset(
    {
        "Qwen2VLProcessor",
        "Qwen2_5_VLProcessor",
        "Qwen3VLProcessor",
        "Glm4vProcessor",
        "Gemma3Processor",
        "PixtralProcessor",
        "LlavaOnevisionProcessor",
        "InternVLProcessor",
        "Idefics3Processor",
        "Qwen2AudioProcessor",
    }
)

NATIVE: Final = "native"
GENERAL: Final = "general"

#: vLLM options that change every chat render's answer (vLLM's render then carries the reasoning
#: parser's state, or renders another template): the native path does not implement them, so
#: given any, its answers would differ from vLLM's. The tool options change only requests with
#: tools, which the native path hands to the general one already.
NATIVE_CHANGING_OPTIONS: Final = (
    "--reasoning-parser",
    "--chat-template",
    "--default-chat-template-kwargs",
    "--chat-template-content-format",
)


#: vLLM options that make its chat derender parse every answer (tool calls, reasoning): the
#: native derender leaves chat derenders to vLLM's code when any is given.
PARSER_OPTIONS: Final = ("--tool-call-parser", "--reasoning-parser")


def parses_chats(vllm_args: Sequence[str]) -> bool:
    """Whether ``vllm_args`` configures a parser of vLLM's chat derender."""
    given = vllm_option_names(vllm_args)
    return any(option in given for option in PARSER_OPTIONS)


def gives_reasoning_parser(vllm_args: Sequence[str]) -> bool:
    """Whether ``vllm_args`` names a reasoning parser (the engine's API then counts reasoning tokens)."""
    return "--reasoning-parser" in vllm_option_names(vllm_args)


def native_changing_options(vllm_args: Sequence[str]) -> list[str]:
    """Which of ``NATIVE_CHANGING_OPTIONS`` ``vllm_args`` gives (``--name value`` or ``--name=value``)."""
    given = vllm_option_names(vllm_args)
    return [option for option in NATIVE_CHANGING_OPTIONS if option in given]


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


def choose(setting: str, processor_class: str, vllm_version: str | None, vllm_args: Sequence[str] = ()) -> RenderPath:
    """The path for ``processor_class`` under ``--render-path setting`` with vLLM ``vllm_version``
    installed (None: not installed) and vLLM's options ``vllm_args``."""
    native_family = processor_class in NATIVE_FAMILIES
    changing = native_changing_options(vllm_args)
    if setting == NATIVE:
        if changing:
            raise NoRenderPath(
                f"--render-path native does not implement {', '.join(changing)}: its answers would differ from "
                "vLLM's; use --render-path auto or general"
            )
        return RenderPath(NATIVE, False, "--render-path native")
    if setting == GENERAL:
        if vllm_version is None:
            raise NoRenderPath("--render-path general needs vLLM installed (the mmprep[vllm] image)")
        return RenderPath(GENERAL, False, f"--render-path general: vLLM {vllm_version}'s own processing")
    if native_family and changing and vllm_version is not None:
        return RenderPath(
            GENERAL,
            False,
            f"{processor_class} has the native fast path, but it does not implement {', '.join(changing)}: "
            f"vLLM {vllm_version}'s own processing",
        )
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

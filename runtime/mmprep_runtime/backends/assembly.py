"""The backends a server starts: the path chosen (``choice``), then the backend for it, with the
general one beside a native primary when vLLM is installed (``fallback``). Blocking; the server
runs it off its event loop while the model loads.

The one module outside ``backends.vllm`` that names it: the server asks for "the backend", and
this module decides which engine's code that is.
"""

from __future__ import annotations

import dataclasses
import logging

from mmprep_runtime import versions
from mmprep_runtime.backends import choice
from mmprep_runtime.backends.fallback import WithFallback
from mmprep_runtime.backends.model_facts import ModelFacts
from mmprep_runtime.backends.native.backend import NativeBackend
from mmprep_runtime.backends.protocol import RenderBackend
from mmprep_runtime.backends.vllm.backend import Unavailable, VllmBackend
from mmprep_runtime.engine import core, cpus
from mmprep_runtime.httpio import fetching
from mmprep_runtime.settings import ServeSettings

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Rendering:
    """The path chosen and why (``/v1/info``), and the backend that serves it."""

    path: choice.RenderPath
    backend: RenderBackend


def start(settings: ServeSettings, engine: core.Engine, model: ModelFacts, fetcher: fetching.Fetcher) -> Rendering:
    """Choose the render path and start what serves it; ``Unavailable`` when the general path is
    the primary one and its processes cannot start."""
    path = choice.choose(settings.render.path, engine.facts.processor_class, versions.vllm_version(), settings.render.vllm_args)
    native = NativeBackend(engine, model, settings.limits, fetcher, parses_chats=choice.parses_chats(settings.render.vllm_args))
    if not path.needs_general:
        return Rendering(path, native)
    primary = path.primary == choice.GENERAL
    processes = settings.render.processes or (cpus.usable_cpus() if primary else 1)
    try:
        general = VllmBackend.start(settings.model.model, processes, settings.render, fetcher)
    except Unavailable as exc:
        if primary or settings.render.vllm_args:
            # With vLLM's options given, serving on without vLLM's processes would ignore them (a
            # tool parser, a chat template): a wrong one stops the server with vLLM's own error, as
            # it stops vLLM's server.
            raise
        # Only the fallback failed: the native path serves what it renders, and says the rest.
        logger.error("the general render path (the native path's fallback) did not start: %s", exc)
        reason = f"{path.reason}; the fallback did not start: {str(exc).splitlines()[0]}"
        return Rendering(dataclasses.replace(path, general_fallback=False, reason=reason), native)
    if primary:
        return Rendering(path, general)
    return Rendering(path, WithFallback(native, general))

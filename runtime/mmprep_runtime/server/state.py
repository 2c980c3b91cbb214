"""What one running server holds (``ServerState``, kept in the app under ``STATE``) and the one
answer to "can this pod serve now?" (``not_ready_reason``).

``lifecycle`` fills it in as the engine starts, ``requests`` admits requests by it, ``health``
reports it; ``serve`` sets ``draining`` on SIGTERM.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Final

from aiohttp import web

from mmprep_runtime.apis import fetching, vllm_model
from mmprep_runtime.engine import core
from mmprep_runtime.server.admission import Admission
from mmprep_runtime.server.metrics import Metrics
from mmprep_runtime.settings import ServeSettings


@dataclasses.dataclass
class ServerState:
    settings: ServeSettings
    metrics: Metrics
    fetcher: fetching.Fetcher
    engine: core.Engine | None = None
    #: The vLLM render API's view of the model (served name, context length, pixel hand-off).
    render_model: vllm_model.ModelFacts | None = None
    admission: Admission | None = None
    startup_error: BaseException | None = None
    draining: bool = False
    #: Set when the engine is ready or failed: `serve` waits on it to report a failed start.
    settled: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    started: int = dataclasses.field(default_factory=lambda: int(time.time()))


STATE: Final = web.AppKey("mmprep_state", ServerState)


def not_ready_reason(state: ServerState) -> str | None:
    """Why this pod cannot serve now, or None: the one answer behind ``/readyz``, ``/health`` and
    request admission, so a probe never says ready while requests are refused."""
    if state.startup_error is not None:
        return f"start-up failed: {state.startup_error}"
    if state.draining:
        return "shutting down"
    if state.engine is None or state.admission is None:
        return "the processor is loading"
    return state.engine.pool.no_workers_reason

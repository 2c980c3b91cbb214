"""What one running server holds (``ServerState``, kept in the app under ``STATE``), and the two
answers read from it: "does this pod take requests now?" (``not_serving_reason``, admission) and
"should traffic be sent here?" (``not_ready_reason``, the probes).

``lifecycle`` fills it in as the engine starts, ``requests`` admits requests by it, ``health``
reports it; ``serve`` moves its ``drain`` on from SIGTERM.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Final

from aiohttp import web

from mmprep_runtime.apis.routing import Serving
from mmprep_runtime.backends import choice
from mmprep_runtime.engine import core
from mmprep_runtime.generation.engines import EnginePool
from mmprep_runtime.httpio import fetching
from mmprep_runtime.server.admission import Admission
from mmprep_runtime.server.drain import Drain
from mmprep_runtime.server.metrics import Metrics
from mmprep_runtime.settings import ServeSettings


@dataclasses.dataclass
class ServerState:
    settings: ServeSettings
    metrics: Metrics
    fetcher: fetching.Fetcher
    engine: core.Engine | None = None
    #: What the handlers serve with (the engine, the render backend, the model's facts): set once
    #: everything started.
    serving: Serving | None = None
    #: Which path renders vLLM render requests, and why.
    render_path: choice.RenderPath | None = None
    admission: Admission | None = None
    #: The OpenAI front's engines and its own slots (a generation lasts far longer than a render:
    #: it holds one of these, not a render slot); None without ``--engine``.
    engines: EnginePool | None = None
    generations: Admission | None = None
    startup_error: BaseException | None = None
    drain: Drain = dataclasses.field(default_factory=Drain)
    #: Set when the engine is ready or failed: `serve` waits on it to report a failed start.
    settled: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    started: int = dataclasses.field(default_factory=lambda: int(time.time()))


STATE: Final = web.AppKey("mmprep_state", ServerState)


#: Why a draining pod is not ready, and why a closing one refuses.
DRAINING: Final = "draining: shutting down"
SHUTTING_DOWN: Final = "shutting down"


def not_serving_reason(state: ServerState) -> str | None:
    """Why this pod refuses a request now, or None: request admission's answer."""
    if state.startup_error is not None:
        return f"start-up failed: {state.startup_error}"
    if not state.drain.admits:
        return SHUTTING_DOWN
    if state.serving is None or state.admission is None:
        return "the processor is loading"
    return state.serving.renderer.no_workers_reason


def not_ready_reason(state: ServerState) -> str | None:
    """Why no traffic should be sent here, or None: the one answer behind ``/readyz`` and
    ``/health``. Never ready while requests are refused (it includes ``not_serving_reason``);
    not ready but still serving while the drain's window lasts (``drain``)."""
    reason = not_serving_reason(state)
    if reason is None and not state.drain.ready:
        return DRAINING
    return reason


def _slots(state: ServerState) -> list[Admission]:
    return [slots for slots in (state.admission, state.generations) if slots is not None]


def in_flight(state: ServerState) -> int:
    """Requests being answered: render and preprocess requests, and the OpenAI front's."""
    return sum(slots.in_flight for slots in _slots(state))


async def drained(state: ServerState, timeout: float | None) -> bool:
    """Wait until nothing is in flight; False if ``timeout`` passed first."""
    return all(await asyncio.gather(*(slots.drained(timeout) for slots in _slots(state))))

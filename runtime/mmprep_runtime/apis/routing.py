"""What an HTTP API module declares (``Route``) and what each of its handlers is given
(``Serving``): the server wraps every admitted route in the same readiness, admission, deadline,
metrics and error mapping, and each API keeps only its own paths, bodies and error shape.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web

from mmprep_runtime import errors
from mmprep_runtime.backends.model_facts import ModelFacts
from mmprep_runtime.backends.protocol import RenderBackend
from mmprep_runtime.engine import core
from mmprep_runtime.generation.chain import Chain
from mmprep_runtime.httpio.messages import Answer
from mmprep_runtime.settings import Limits


class Slots(Protocol):
    """Request slots (the server's admission): taken while a request is worked on here."""

    @property
    def capacity(self) -> int: ...

    def try_enter(self) -> bool: ...

    def leave(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class Serving:
    """What a loaded server serves with, handed to every handler: made once, when it is ready."""

    engine: core.Engine
    renderer: RenderBackend
    model: ModelFacts
    limits: Limits
    #: When the server started (Unix seconds): vLLM's model card says it.
    started: int
    #: The key vLLM's guarded paths ask for (``--api-key``); None: open.
    api_key: str | None = None
    #: Seconds a request may take to be rendered (the server's deadline).
    deadline_s: float = 30.0
    #: The render slots (the render routes' admission): the OpenAI front holds one while it renders.
    render_slots: Slots | None = None
    #: Render, generate and derender for the OpenAI front; None: no engines, no front.
    chain: Chain | None = None


Handler = Callable[[web.Request, Serving], Awaitable[Answer]]
ErrorResponse = Callable[[errors.RequestError], web.Response]


@dataclasses.dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Handler
    #: The API's error JSON for a request it refuses or fails.
    error_response: ErrorResponse
    #: Admitted routes take a request slot and the deadline; the others (a model list) only need
    #: the server ready.
    admitted: bool = True
    #: A route that generates (the OpenAI front): it takes a slot of the front's own for its whole
    #: length (a generation lasts seconds to minutes: no render slot, no render deadline) and a
    #: render slot only while it renders.
    generates: bool = False

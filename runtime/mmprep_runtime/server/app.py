"""The HTTP server: ``create_app(settings)``, its routes, and the thin handlers that join them.

Each API module declares its routes (``apis.routing.Route``: ``apis.preprocess``,
``apis.vllm_render_server``); each admitted one runs inside ``requests.admitted`` (readiness,
admission, deadline, metrics, error mapping); ``health`` answers the probes, ``/v1/info`` and
``/metrics``; ``lifecycle`` starts the engine and the render backend in the background after the
socket is open. The event loop only moves bytes and awaits.

Endpoints: mmprep's own ``POST /v1/preprocess``, ``GET /healthz``, ``GET /readyz``, ``GET /v1/info``,
``GET /metrics``; vLLM's render server's routes (``apis.vllm_render_server``), ``GET /health``,
``GET /version``; with engines (``--engine``), OpenAI's ``POST /v1/chat/completions`` and
``POST /v1/completions`` (``apis.openai``).
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Final

from aiohttp import hdrs, web

from mmprep_runtime import errors
from mmprep_runtime.apis import openai, preprocess, vllm_render_server
from mmprep_runtime.apis.routing import Route
from mmprep_runtime.engine import core as engine_module
from mmprep_runtime.generation.engines import EnginePool
from mmprep_runtime.httpio import fetching
from mmprep_runtime.server import health
from mmprep_runtime.server.lifecycle import EngineFactory, start_engine
from mmprep_runtime.server.metrics import Metrics
from mmprep_runtime.server.requests import admitted
from mmprep_runtime.server.state import STATE, ServerState, not_serving_reason
from mmprep_runtime.settings import ServeSettings


def _admitted(route: Route) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        return await admitted(request, route.handler, route.error_response, generates=route.generates)

    return handle


def _when_ready(route: Route) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A route that takes no request slot (a model list): answered once the server serves."""

    async def handle(request: web.Request) -> web.StreamResponse:
        state = request.app[STATE]
        reason = not_serving_reason(state)
        if reason is not None or state.serving is None:
            return route.error_response(errors.NotReady(f"not ready: {reason}"))
        try:
            return (await route.handler(request, state.serving)).response
        except errors.RequestError as error:
            return route.error_response(error)

    return handle


#: Every HTTP API's routes; each module declares its own. The OpenAI front's exist with engines.
API_ROUTES: Final = (*preprocess.ROUTES, *vllm_render_server.ROUTES)
FRONT_ROUTES: Final = openai.ROUTES


#: How long the pools may take to stop once the server's requests are done (or cut off); with the
#: server's own stop it stays within ``contract.SHUTDOWN_STOP_SECONDS``.
POOL_STOP_SECONDS: Final = 2.0

#: An id a client may give (``X-Request-Id``): echoed only when it is short and plain, so a log
#: line or a header can never carry what a client smuggled in; otherwise one is made.
_REQUEST_ID: Final = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")


async def request_id(request: web.Request, response: web.StreamResponse) -> None:
    """Every answer carries ``X-Request-Id``: the client's, or a new one when it sent none.

    Set as the answer is prepared (``on_response_prepare``), so streamed answers and aiohttp's own
    (404, 405, 413) carry it too.
    """
    given = request.headers.get("X-Request-Id", "")
    response.headers["X-Request-Id"] = given if _REQUEST_ID.fullmatch(given) else uuid.uuid4().hex


async def close_while_draining(request: web.Request, response: web.StreamResponse) -> None:
    """Once the drain began, every answer closes its connection and says so (``Connection: close``),
    so a keep-alive client reconnects through the Service to a pod that stays instead of sending
    its next request down a connection this pod is about to close.

    Set as the answer is prepared (``on_response_prepare``), for every route alike. aiohttp has
    chosen the connection header by then: the header is set here, and ``force_close`` makes the
    server close the connection after this answer as the header says.
    """
    if request.app[STATE].drain.closes_connections:
        response.force_close()
        response.headers[hdrs.CONNECTION] = "close"


def create_app(settings: ServeSettings, *, engine_factory: EngineFactory = engine_module.start_engine) -> web.Application:
    """The application; nothing is loaded until it starts (the engine loads in the background)."""
    # aiohttp's own body limit backs up ours for bodies without Content-Length (chunked).
    app = web.Application(client_max_size=settings.limits.max_body_bytes)
    app.on_response_prepare.append(request_id)
    app.on_response_prepare.append(close_while_draining)
    state = ServerState(settings=settings, metrics=Metrics(), fetcher=fetching.Fetcher(settings.render.fetch))
    app[STATE] = state
    for route in (*API_ROUTES, *(FRONT_ROUTES if settings.engines.urls else ())):
        handler = _admitted(route) if route.admitted else _when_ready(route)
        if route.method == "GET":
            app.router.add_get(route.path, handler)  # and HEAD, as every GET route here answers it
        else:
            app.router.add_route(route.method, route.path, handler)
    app.router.add_get("/health", health.handle_health)
    app.router.add_get("/healthz", health.handle_healthz)
    app.router.add_get("/readyz", health.handle_readyz)
    app.router.add_get("/v1/info", health.handle_info)
    app.router.add_get("/version", health.handle_version)
    app.router.add_get("/metrics", health.handle_metrics)

    async def lifecycle(app: web.Application) -> Any:
        if settings.engines.urls:
            state.engines = EnginePool(settings.engines, state.metrics.registry)
            await state.engines.start()
        task = asyncio.create_task(start_engine(state, engine_factory))
        yield
        if not task.done():
            # Shutting down mid-load: the load thread cannot be interrupted; let it finish.
            await asyncio.wait({task})
        if state.serving is not None:
            await state.serving.renderer.close(POOL_STOP_SECONDS)
        if state.engine is not None:
            # In-flight requests were waited for already (``serve``): what is left of the pool's
            # jobs belongs to requests cut off at the timeout, so the join is short.
            await asyncio.to_thread(state.engine.close, POOL_STOP_SECONDS)
        if state.engines is not None:
            await state.engines.close()
        await state.fetcher.close()

    app.cleanup_ctx.append(lifecycle)
    return app

"""The HTTP adapter: ``create_app(settings)`` and its handlers, over the pipeline and the engine.

The event loop only moves bytes and awaits: JSON parsing and decoding run on the IO pool, or on
the processor worker itself when the workers alone fill the CPUs (``Engine.decode_on_worker``),
the processor on the processor pool, large (safetensors) answers are encoded on the IO pool. The engine starts in the background after the socket
is open, so ``/healthz`` answers while the model loads and ``/readyz`` turns 200 once the pool is
warm.

Endpoints: ``POST /v1/preprocess``, ``GET /healthz``, ``GET /readyz``, ``GET /v1/info``,
``GET /metrics``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import time
from typing import Any, Callable, Final

from aiohttp import web

from mmprep_runtime import engine as engine_module
from mmprep_runtime import errors, pipeline
from mmprep_runtime.admission import Admission
from mmprep_runtime.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from mmprep_runtime.metrics import Metrics
from mmprep_runtime.settings import ServeSettings

logger = logging.getLogger(__name__)

OCTET_STREAM: Final = "application/octet-stream"
JSON_TYPE: Final = "application/json"

EngineFactory = Callable[..., engine_module.Engine]


@dataclasses.dataclass
class ServerState:
    settings: ServeSettings
    metrics: Metrics
    engine: engine_module.Engine | None = None
    admission: Admission | None = None
    startup_error: BaseException | None = None
    draining: bool = False
    #: Set when the engine is ready or failed: `serve` waits on it to report a failed start.
    settled: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)


STATE: Final = web.AppKey("mmprep_state", ServerState)


def _error_response(error: errors.RequestError) -> web.Response:
    return web.json_response(error.as_json(), status=error.status, headers=error.headers)


def _wants_safetensors(request: web.Request) -> bool:
    fmt = request.query.get("format")
    if fmt is not None:
        if fmt not in ("json", "safetensors"):
            raise errors.BadRequest(f"format must be 'json' or 'safetensors', got {fmt!r}")
        return fmt == "safetensors"
    accept = request.headers.get("Accept", "")
    if not accept:
        return False
    kinds = [part.split(";")[0].strip().lower() for part in accept.split(",")]
    if OCTET_STREAM in kinds and JSON_TYPE not in kinds:
        return True
    if not {JSON_TYPE, OCTET_STREAM, "*/*", "application/*"} & set(kinds):
        raise errors.NotAcceptable(f"cannot answer with {accept!r}; use {JSON_TYPE} or {OCTET_STREAM}")
    return False


async def _read_body(request: web.Request, limit: int) -> bytes:
    """The whole body, copied once on the event loop.

    ``request.read()`` copies a body three times more (joining the buffered chunks, growing a
    bytearray, then a bytes of it): for a 570 KB body that was a tenth of the loop thread's time
    per request. With a Content-Length (checked against the limit before this), the parser's
    chunks are kept as they come and joined once (a buffer filled in place would first be zeroed,
    which cost as much as a copy).
    """
    length = request.content_length
    if length is None:  # chunked: aiohttp's reader enforces the limit as it reads
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise errors.BodyTooLarge(f"body is over the limit of {limit} bytes") from None
    chunks: list[bytes] = []
    received = 0
    while True:
        chunk, _ = await request.content.readchunk()
        if not chunk:
            break
        received += len(chunk)
        if received > length:  # aiohttp's parser stops at the length; never trust it blindly
            raise errors.BadRequest(f"body is longer than the {length} bytes its Content-Length announced")
        chunks.append(chunk)
    if received != length:
        raise errors.BadRequest(f"body ended after {received} of the {length} bytes its Content-Length announced")
    return b"".join(chunks)


async def _preprocess(request: web.Request, state: ServerState, engine: engine_module.Engine) -> web.Response:
    limits = state.settings.limits
    content_type = request.content_type
    if content_type != JSON_TYPE:
        raise errors.UnsupportedMediaType(f"Content-Type must be {JSON_TYPE}, got {content_type!r}")
    binary = _wants_safetensors(request)
    if request.content_length is not None and request.content_length > limits.max_body_bytes:
        raise errors.BodyTooLarge(
            f"body of {request.content_length} bytes is over the limit of {limits.max_body_bytes}"
        )
    body = await _read_body(request, limits.max_body_bytes)
    loop = asyncio.get_running_loop()
    if engine.decode_on_worker:
        # One job per request: no hop through the IO pool and back through the loop (see Engine).
        if not binary:
            answer = await asyncio.wrap_future(
                engine.pool.submit(pipeline.decode_and_process_to_json, body, engine.facts, limits)
            )
            state.metrics.decode_seconds.observe(answer.decode_seconds)
            return web.Response(body=answer.value, content_type=JSON_TYPE)
        answer = await asyncio.wrap_future(engine.pool.submit(pipeline.decode_and_process, body, engine.facts, limits))
        state.metrics.decode_seconds.observe(answer.decode_seconds)
        payload = await loop.run_in_executor(
            engine.io_pool, pipeline.encode_safetensors, answer.value, engine.facts.model
        )
        return web.Response(body=payload, content_type=OCTET_STREAM)
    started = time.perf_counter()
    decoded = await loop.run_in_executor(
        engine.io_pool, pipeline.decode_request, body, engine.facts, limits
    )
    del body  # the decoded request is what we keep; the raw body can go
    state.metrics.decode_seconds.observe(time.perf_counter() - started)
    if not binary:
        payload = await asyncio.wrap_future(engine.pool.submit(pipeline.process_to_json, decoded, engine.facts))
        return web.Response(body=payload, content_type=JSON_TYPE)
    outputs = await asyncio.wrap_future(engine.pool.submit(pipeline.process, decoded, engine.facts))
    # Tens of megabytes to copy: on the IO pool, so the worker is free for the next request.
    payload = await loop.run_in_executor(engine.io_pool, pipeline.encode_safetensors, outputs, engine.facts.model)
    return web.Response(body=payload, content_type=OCTET_STREAM)


async def handle_preprocess(request: web.Request) -> web.Response:
    state = request.app[STATE]
    arrived = time.perf_counter()
    outcome = "ok"
    try:
        engine, admission = state.engine, state.admission
        if engine is None or admission is None or state.draining:
            raise errors.NotReady("not ready: the processor is loading" if not state.draining else "shutting down")
        if not admission.try_enter():
            retry = state.settings.load.retry_after_s
            raise errors.Overloaded(
                f"all {admission.capacity} request slots are taken; retry in {retry} s",
                headers={"Retry-After": str(retry)},
            )
        try:
            async with asyncio.timeout(state.settings.load.deadline_s):
                return await _preprocess(request, state, engine)
        except TimeoutError:
            raise errors.DeadlineExceeded(
                f"no answer within the deadline of {state.settings.load.deadline_s:g} s"
            ) from None
        finally:
            admission.leave()
    except errors.RequestError as error:
        outcome = error.code
        if error.status >= 500:
            logger.warning("preprocess failed (%d): %s", error.status, error.message)
        return _error_response(error)
    except asyncio.CancelledError:
        outcome = errors.CLIENT_GONE  # the client disconnected (or the server is stopping)
        raise
    except Exception as exc:  # noqa: BLE001 - a bug: answer like every other failure, log the traceback
        logger.exception("preprocess failed unexpectedly")
        internal = errors.InternalError(f"internal error: {type(exc).__name__}: {exc}")
        outcome = internal.code
        return _error_response(internal)
    finally:
        state.metrics.answered(outcome, time.perf_counter() - arrived)


async def handle_healthz(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.startup_error is not None:
        return web.json_response({"status": "failed", "error": str(state.startup_error)}, status=500)
    return web.json_response({"status": "ok"})


async def handle_readyz(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.engine is None or state.draining:
        reason = "shutting down" if state.draining else "loading"
        if state.startup_error is not None:
            reason = f"failed: {state.startup_error}"
        return web.json_response({"ready": False, "reason": reason}, status=503)
    return web.json_response({"ready": True})


def event_loop_name(loop: asyncio.AbstractEventLoop) -> str:
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


async def handle_info(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.engine is None:
        body: dict[str, Any] = {"model": state.settings.model.model, "ready": False}
        if state.startup_error is not None:
            body["error"] = str(state.startup_error)
        return web.json_response(body, status=503)
    info = state.engine.info()
    info["ready"] = not state.draining
    info["queue_capacity"] = state.admission.capacity if state.admission else None
    info["limits"] = dataclasses.asdict(state.settings.limits)
    info["deadline_s"] = state.settings.load.deadline_s
    info["event_loop"] = event_loop_name(asyncio.get_running_loop())
    return web.json_response(info, dumps=functools.partial(json.dumps, indent=2))


async def handle_metrics(request: web.Request) -> web.Response:
    body = request.app[STATE].metrics.render()
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})


def _install_engine(state: ServerState, engine: engine_module.Engine) -> None:
    queue = state.settings.load.queue_size
    if queue is None:
        queue = 4 * engine.decision.processor_workers
    state.admission = Admission(engine.decision.processor_workers + queue)
    admission = state.admission
    state.metrics.bind_live(
        in_flight=lambda: admission.in_flight,
        queue_depth=lambda: engine.pool.waiting,
        busy=lambda: engine.pool.busy,
        workers=engine.decision.processor_workers,
        busy_seconds=lambda: engine.pool.busy_seconds,
    )
    state.metrics.describe_engine(engine.info())
    state.engine = engine
    state.metrics.ready.set(1)


async def _start_engine(state: ServerState, factory: EngineFactory) -> None:
    settings = state.settings
    try:
        engine = await asyncio.to_thread(
            factory,
            settings.model,
            processor_workers=settings.processor_workers,
            io_workers=settings.io_workers,
            intra_op_threads=settings.intra_op_threads,
            observer=state.metrics,
        )
    except Exception as exc:  # noqa: BLE001 - reported by /healthz and by serve's exit status
        logger.error("the processor could not be started: %s", exc)
        state.startup_error = exc
    else:
        _install_engine(state, engine)
    finally:
        state.settled.set()


def create_app(
    settings: ServeSettings, *, engine_factory: EngineFactory = engine_module.start_engine
) -> web.Application:
    """The application; nothing is loaded until it starts (the engine loads in the background)."""
    # aiohttp's own body limit backs up ours for bodies without Content-Length (chunked).
    app = web.Application(client_max_size=settings.limits.max_body_bytes)
    state = ServerState(settings=settings, metrics=Metrics())
    app[STATE] = state
    app.router.add_post("/v1/preprocess", handle_preprocess)
    app.router.add_get("/healthz", handle_healthz)
    app.router.add_get("/readyz", handle_readyz)
    app.router.add_get("/v1/info", handle_info)
    app.router.add_get("/metrics", handle_metrics)

    async def lifecycle(app: web.Application) -> Any:
        task = asyncio.create_task(_start_engine(state, engine_factory))
        yield
        if not task.done():
            # Shutting down mid-load: the load thread cannot be interrupted; let it finish.
            await asyncio.wait({task})
        if state.engine is not None:
            await asyncio.to_thread(state.engine.close, settings.load.shutdown_grace_s)

    app.cleanup_ctx.append(lifecycle)
    return app

"""The HTTP adapter: ``create_app(settings)`` and its handlers, over the pipeline and the engine.

A handler parses the HTTP request, hands the body to ``Engine.serve`` with its API's stages
(``pipeline.Api``) and writes the answer; where each stage runs is the engine's decision. The
event loop only moves bytes and awaits. The engine starts in the background after the socket is
open, so ``/healthz`` answers while the model loads and ``/readyz`` turns 200 once the pool is
warm.

Endpoints: mmprep's own ``POST /v1/preprocess``, ``GET /healthz``, ``GET /readyz``, ``GET /v1/info``,
``GET /metrics``; vLLM's render API ``POST /v1/chat/completions/render``,
``POST /v1/completions/render``, ``GET /v1/models``, ``GET /health`` (``render``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

from aiohttp import web

from mmprep_runtime import errors
from mmprep_runtime.apis import fetching, vllm_format, vllm_render
from mmprep_runtime.engine import core as engine_module
from mmprep_runtime.engine import executor, loading, pipeline
from mmprep_runtime.server.admission import Admission
from mmprep_runtime.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from mmprep_runtime.server.metrics import Metrics
from mmprep_runtime.settings import Limits, ServeSettings

logger = logging.getLogger(__name__)

OCTET_STREAM: Final = "application/octet-stream"
JSON_TYPE: Final = "application/json"

EngineFactory = Callable[..., engine_module.Engine]


@dataclasses.dataclass
class ServerState:
    settings: ServeSettings
    metrics: Metrics
    fetcher: fetching.Fetcher
    engine: engine_module.Engine | None = None
    #: The vLLM render API's view of the model (served name, context length, pixel hand-off).
    render_model: vllm_render.ModelFacts | None = None
    admission: Admission | None = None
    startup_error: BaseException | None = None
    draining: bool = False
    #: Set when the engine is ready or failed: `serve` waits on it to report a failed start.
    settled: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    started: int = dataclasses.field(default_factory=lambda: int(time.time()))


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


async def _read_json_body(request: web.Request, limits: Limits) -> bytes:
    content_type = request.content_type
    if content_type != JSON_TYPE:
        raise errors.UnsupportedMediaType(f"Content-Type must be {JSON_TYPE}, got {content_type!r}")
    if request.content_length is not None and request.content_length > limits.max_body_bytes:
        raise errors.BodyTooLarge(f"body of {request.content_length} bytes is over the limit of {limits.max_body_bytes}")
    return await _read_body(request, limits.max_body_bytes)


def _wants_uint8(request: web.Request, engine: engine_module.Engine) -> bool:
    pixels = request.query.get("pixels", "normalized")
    if pixels not in ("normalized", "uint8"):
        raise errors.BadRequest(f"pixels must be 'normalized' or 'uint8', got {pixels!r}")
    if pixels == "uint8" and not engine.facts.normalizes_on_device:
        raise errors.BadRequest(
            f"pixels=uint8: this processor ({engine.facts.processor_class}) cannot leave normalization to the GPU"
        )
    return pixels == "uint8"


async def _preprocess(request: web.Request, state: ServerState, engine: engine_module.Engine) -> web.Response:
    binary = _wants_safetensors(request)
    uint8 = _wants_uint8(request, engine)
    body = await _read_json_body(request, state.settings.limits)
    api = pipeline.PreprocessApi(
        engine.facts, state.settings.limits, binary, dict(loading.DEVICE_NORMALIZE_KWARGS) if uint8 else {}
    )
    served = await engine.serve(api, body)
    state.metrics.decode_seconds.observe(served.decode_seconds)
    return web.Response(body=served.payload, content_type=OCTET_STREAM if binary else JSON_TYPE)


Handler = Callable[[web.Request, ServerState, engine_module.Engine], Awaitable[web.Response]]
ErrorRenderer = Callable[[errors.RequestError], web.Response]


async def admitted(request: web.Request, handler: Handler, render_error: ErrorRenderer = _error_response) -> web.Response:
    """Readiness, admission, deadline, metrics and error mapping around one API handler: every
    HTTP API shares them, only the error JSON's shape is the API's."""
    state = request.app[STATE]
    arrived = time.perf_counter()
    outcome = "ok"
    try:
        engine, admission, reason = state.engine, state.admission, not_ready_reason(state)
        if reason is not None or engine is None or admission is None:
            raise errors.NotReady(f"not ready: {reason or 'the processor is loading'}")
        if not admission.try_enter():
            retry = state.settings.load.retry_after_s
            raise errors.Overloaded(
                f"all {admission.capacity} request slots are taken; retry in {retry} s",
                headers={"Retry-After": str(retry)},
            )
        try:
            async with asyncio.timeout(state.settings.load.deadline_s):
                return await handler(request, state, engine)
        except executor.NoWorkersLeft as exc:
            # Every worker's clone failed after start-up: the pod cannot serve (readiness says so).
            raise errors.NotReady(f"not ready: {exc}") from None
        except TimeoutError:
            raise errors.DeadlineExceeded(f"no answer within the deadline of {state.settings.load.deadline_s:g} s") from None
        finally:
            admission.leave()
    except errors.RequestError as error:
        outcome = error.code
        if error.status >= 500:
            logger.warning("%s failed (%d): %s", request.path, error.status, error.message)
        return render_error(error)
    except asyncio.CancelledError:
        outcome = errors.CLIENT_GONE  # the client disconnected (or the server is stopping)
        raise
    except Exception as exc:  # noqa: BLE001 - a bug: answer like every other failure, log the traceback
        logger.exception("%s failed unexpectedly", request.path)
        internal = errors.InternalError(f"internal error: {type(exc).__name__}: {exc}")
        outcome = internal.code
        return render_error(internal)
    finally:
        state.metrics.answered(outcome, time.perf_counter() - arrived)


async def handle_preprocess(request: web.Request) -> web.Response:
    return await admitted(request, _preprocess)


# ---- the vLLM render API (same paths, bodies, answers and error shape as vLLM's render server) ---


def _vllm_error(error: errors.RequestError) -> web.Response:
    return web.json_response(
        vllm_format.error_body(error.message, error.status, getattr(error, "param", None)),
        status=error.status,
        headers=error.headers,
    )


def _render_handler(chat: bool) -> Handler:
    async def handler(request: web.Request, state: ServerState, engine: engine_module.Engine) -> web.Response:
        body = await _read_json_body(request, state.settings.limits)
        assert state.render_model is not None
        api = vllm_render.RenderApi(
            engine.facts,
            state.render_model,
            state.settings.limits,
            state.fetcher,
            chat,
            request_id=request.headers.get("X-Request-Id"),
        )
        served = await engine.serve(api, body)
        state.metrics.decode_seconds.observe(served.decode_seconds)
        return web.Response(body=served.payload, content_type=JSON_TYPE)

    return handler


_RENDER_CHAT: Final = _render_handler(chat=True)
_RENDER_COMPLETION: Final = _render_handler(chat=False)


async def handle_render_chat(request: web.Request) -> web.Response:
    return await admitted(request, _RENDER_CHAT, _vllm_error)


async def handle_render_completion(request: web.Request) -> web.Response:
    return await admitted(request, _RENDER_COMPLETION, _vllm_error)


async def handle_models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    reason = not_ready_reason(state)
    model = state.render_model
    if reason is not None or model is None:
        return _vllm_error(errors.NotReady(f"not ready: {reason}"))
    permission = {
        "id": f"modelperm-{state.started:x}",
        "object": "model_permission",
        "created": state.started,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    card = {
        "id": model.served_name,
        "object": "model",
        "created": state.started,
        "owned_by": "vllm",
        "root": model.model_id,
        "parent": None,
        "max_model_len": model.max_model_len,
        "permission": [permission],
    }
    return web.json_response({"object": "list", "data": [card]})


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


async def handle_health(request: web.Request) -> web.Response:
    """vLLM's liveness-and-readiness probe: 200 with an empty body while serving."""
    return web.Response(status=503 if not_ready_reason(request.app[STATE]) else 200)


async def handle_healthz(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.startup_error is not None:
        return web.json_response({"status": "failed", "error": str(state.startup_error)}, status=500)
    return web.json_response({"status": "ok"})


async def handle_readyz(request: web.Request) -> web.Response:
    reason = not_ready_reason(request.app[STATE])
    if reason is not None:
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
    if state.render_model is not None:
        model = state.render_model
        info["vllm_render"] = {
            "served_model_name": model.served_name,
            "max_model_len": model.max_model_len,
            "pixels": "uint8" if model.device_normalize else "normalized",
            "fetch_allowed_networks": [str(n) for n in state.settings.render.fetch.allowed_networks],
        }
    return web.json_response(info, dumps=functools.partial(json.dumps, indent=2))


async def handle_metrics(request: web.Request) -> web.Response:
    body = request.app[STATE].metrics.render()
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})


def _install_engine(state: ServerState, engine: engine_module.Engine, render_model: vllm_render.ModelFacts) -> None:
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
    state.render_model = render_model
    state.engine = engine
    state.metrics.ready.set(1)


async def _start_engine(state: ServerState, factory: EngineFactory) -> None:
    settings = state.settings

    def start() -> tuple[engine_module.Engine, vllm_render.ModelFacts]:
        # Off the event loop, like the load: the render API's model facts read the model's config
        # (a file, or the hub for a model id).
        engine = factory(
            settings.model,
            processor_workers=settings.processor_workers,
            io_workers=settings.io_workers,
            intra_op_threads=settings.intra_op_threads,
            observer=state.metrics,
            operator_decision=settings.operator_decision,
        )
        try:
            return engine, vllm_render.model_facts(engine.processor, engine.facts, settings.render)
        except BaseException:
            engine.close()
            raise

    try:
        engine, render_model = await asyncio.to_thread(start)
    except Exception as exc:  # noqa: BLE001 - reported by /healthz and by serve's exit status
        logger.error("the processor could not be started: %s", exc)
        state.startup_error = exc
    else:
        _install_engine(state, engine, render_model)
    finally:
        state.settled.set()


def create_app(settings: ServeSettings, *, engine_factory: EngineFactory = engine_module.start_engine) -> web.Application:
    """The application; nothing is loaded until it starts (the engine loads in the background)."""
    # aiohttp's own body limit backs up ours for bodies without Content-Length (chunked).
    app = web.Application(client_max_size=settings.limits.max_body_bytes)
    state = ServerState(settings=settings, metrics=Metrics(), fetcher=fetching.Fetcher(settings.render.fetch))
    app[STATE] = state
    app.router.add_post("/v1/preprocess", handle_preprocess)
    app.router.add_post("/v1/chat/completions/render", handle_render_chat)
    app.router.add_post("/v1/completions/render", handle_render_completion)
    app.router.add_get("/v1/models", handle_models)
    app.router.add_get("/health", handle_health)
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
        await state.fetcher.close()

    app.cleanup_ctx.append(lifecycle)
    return app

"""OpenAI's API over HTTP, through the tier: ``POST /v1/chat/completions`` and ``/v1/completions``
(JSON, or server-sent events under ``stream: true``), served when the server has engines
(``serve --engine URL``). ``GET /v1/models`` is the render server's (``vllm_render_server``).

A thin adapter over ``generation.chain``: the body is read and the render done under a render
slot and the request deadline; the generation and the derender run under the front's own slot
(``Route.generates``) and the engine's timeout. Errors are vLLM's JSON, which is OpenAI's shape;
the API key guards these paths as vLLM's does.

A client that goes away is noticed while its answer is made (the connection is looked at every
``_CLIENT_CHECK_S``), not only at the next write: the request is cancelled, which closes the
engine's stream, and the engine stops generating for it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Final

import orjson
from aiohttp import web

from mmprep_runtime import errors
from mmprep_runtime.apis.routing import Handler, Route, Serving
from mmprep_runtime.apis.vllm_render_server import authorized, error_response
from mmprep_runtime.generation import chain
from mmprep_runtime.httpio.messages import JSON_TYPE, Answer, read_json_body

#: How often a request being answered looks whether its client is still connected.
_CLIENT_CHECK_S: Final = 0.1
_SSE_HEADERS: Final = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def _watch_client(request: web.Request, task: asyncio.Task[Any]) -> None:
    # A poll: aiohttp tells a handler nothing when its client leaves (it is not cancelled).
    while not _client_gone(request):  # noqa: ASYNC110
        await asyncio.sleep(_CLIENT_CHECK_S)
    task.cancel()


@contextlib.asynccontextmanager
async def _cancelled_if_client_leaves(request: web.Request) -> AsyncIterator[None]:
    watcher = asyncio.create_task(_watch_client(request, asyncio.current_task()))  # type: ignore[arg-type]
    try:
        yield
    finally:
        watcher.cancel()


def _passed(reply_status: int, body: bytes) -> web.Response:
    return web.Response(status=reply_status, body=body, content_type=JSON_TYPE)


async def _render(request: web.Request, serving: Serving, kind: chain.Kind) -> chain.Rendered:
    front = serving.chain
    assert front is not None  # the routes exist only where engines do
    slots = serving.render_slots
    if slots is not None and not slots.try_enter():
        raise errors.Overloaded(f"all {slots.capacity} render slots are taken; retry in 1 s", headers={"Retry-After": "1"})
    try:
        async with asyncio.timeout(serving.deadline_s):
            body = await read_json_body(request, serving.limits)
            try:
                original = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                raise errors.BadRequest(f"the body is not JSON: {exc}") from None
            if not isinstance(original, dict):
                raise errors.BadRequest("the body must be a JSON object")
            return await front.render(kind, body, original, request.headers.get("X-Request-Id"))
    except TimeoutError:
        raise errors.DeadlineExceeded(f"not rendered within the deadline of {serving.deadline_s:g} s") from None
    finally:
        if slots is not None:
            slots.leave()


async def _stream(request: web.Request, events: AsyncIterator[bytes]) -> web.StreamResponse:
    response = web.StreamResponse(headers=_SSE_HEADERS)
    try:
        await response.prepare(request)
        async for event in events:
            await response.write(event)
        await response.write_eof()
    except ConnectionResetError:
        pass  # the client went: closing the events closes the engine's stream
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    return response


def _completing(kind: chain.Kind) -> Handler:
    async def handle(request: web.Request, serving: Serving) -> Answer:
        if not authorized(request, serving.api_key):
            return Answer(web.json_response({"error": "Unauthorized"}, status=401), 0.0)
        front = serving.chain
        assert front is not None
        try:
            async with _cancelled_if_client_leaves(request):
                rendered = await _render(request, serving, kind)
                if rendered.stream:
                    return Answer(await _stream(request, await front.open_stream(rendered)), 0.0)
                return Answer(web.Response(body=await front.whole(rendered), content_type=JSON_TYPE), 0.0)
        except chain.Passed as passed:
            return Answer(_passed(passed.reply.status, passed.reply.body), 0.0)

    handle.__name__ = f"handle_{kind.request_field}"
    return handle


def _route(path: str, kind: chain.Kind) -> Route:
    return Route("POST", path, _completing(kind), error_response, generates=True)


ROUTES: Final = (
    _route("/v1/chat/completions", chain.CHAT),
    _route("/v1/completions", chain.COMPLETION),
)

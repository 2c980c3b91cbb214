"""A vLLM engine's HTTP face on a real local port, for the OpenAI front's unit tests (which have no
vLLM): ``POST /inference/v1/generate`` answered as each test scripts it (whole JSON, server-sent
events, a refusal, a connection closed mid-answer, an answer held open) and ``GET /health``
answering ``health_status``. It records each generate body it was sent and sees a client that
leaves (``client_left``).

A port that refuses connections is a socket bound and not listening (``bound_socket``): the port
stays the test's, and ``FakeEngine(sock)`` can start listening on it later (an engine back up).
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

GENERATE_PATH = "/inference/v1/generate"
DONE = b"data: [DONE]\n\n"

#: How a test has the engine answer one generate request (the request, its JSON body).
Answerer = Callable[["FakeEngine", web.Request, dict[str, Any]], Awaitable[web.StreamResponse]]


def bound_socket() -> socket.socket:
    """A socket bound to a free port on 127.0.0.1, not listening: connecting to it is refused."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


def url_of(sock: socket.socket) -> str:
    return f"http://127.0.0.1:{sock.getsockname()[1]}"


def sse(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def generate_response(
    request_id: str, token_ids: Sequence[int], *, index: int = 0, finish_reason: str | None = "length", usage: Any = None
) -> dict[str, Any]:
    """What vLLM's generate route answers (whole, or as one streamed event)."""
    answer: dict[str, Any] = {
        "request_id": request_id,
        "choices": [{"index": index, "logprobs": None, "finish_reason": finish_reason, "token_ids": list(token_ids)}],
        "prompt_logprobs": None,
        "kv_transfer_params": None,
    }
    if usage is not None:
        answer["usage"] = usage
    return answer


def answer_json(payload: Any, status: int = 200) -> Answerer:
    async def answer(engine: FakeEngine, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        return web.json_response(payload, status=status)

    return answer


def answer_text(text: str, status: int) -> Answerer:
    async def answer(engine: FakeEngine, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        return web.Response(text=text, status=status)

    return answer


async def _sse_response(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    return response


def answer_events(payloads: Sequence[Any], *, done: bool = True, gate: asyncio.Event | None = None) -> Answerer:
    """Server-sent events, one per payload, then ``[DONE]``; with ``gate``, the answer waits for it
    after the first event (a request held open at this engine)."""

    async def answer(engine: FakeEngine, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        response = await _sse_response(request)
        for i, payload in enumerate(payloads):
            await response.write(sse(payload))
            if i == 0 and gate is not None:
                await gate.wait()
        if done:
            await response.write(DONE)
        await response.write_eof()
        return response

    return answer


def answer_events_then_close(payloads: Sequence[Any]) -> Answerer:
    """Server-sent events, then the connection closed with no ``[DONE]`` and no end of the chunked
    body (the engine died mid-answer)."""

    async def answer(engine: FakeEngine, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        response = await _sse_response(request)
        for payload in payloads:
            await response.write(sse(payload))
        assert request.transport is not None
        request.transport.close()  # what was written is flushed first, then the FIN
        return response

    return answer


def answer_cut_body(prefix: bytes, length: int) -> Answerer:
    """Headers saying ``length`` bytes, ``prefix`` of them, then the connection closed."""

    async def answer(engine: FakeEngine, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = length
        await response.prepare(request)
        await response.write(prefix)
        assert request.transport is not None
        request.transport.close()
        return response

    return answer


def answer_nothing() -> Answerer:
    """The connection closed once the request arrived, before any answer."""

    async def answer(engine: FakeEngine, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.close()
        return web.Response()

    return answer


def answer_until_client_leaves(payload: Any, every_s: float = 0.005) -> Answerer:
    """An event every ``every_s`` seconds for as long as the client stays; its leaving sets
    ``engine.client_left``."""

    async def answer(engine: FakeEngine, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        response = await _sse_response(request)
        try:
            while request.transport is not None and not request.transport.is_closing():
                await response.write(sse(payload))
                await asyncio.sleep(every_s)
        except ConnectionError:
            pass  # the write found the client gone
        engine.client_left.set()
        return response

    return answer


class FakeEngine:
    def __init__(self, sock: socket.socket | None = None) -> None:
        self.sock = sock if sock is not None else bound_socket()
        self.url = url_of(self.sock)
        #: The JSON bodies of the generate requests it was sent, in order.
        self.generated: list[dict[str, Any]] = []
        self.health_status = 200
        self.health_checks = 0
        self.answer: Answerer = answer_json(generate_response("generate-tokens-0", [1, 2, 3]))
        self.client_left = asyncio.Event()
        self._runner: web.AppRunner | None = None

    async def start(self) -> FakeEngine:
        app = web.Application()
        app.router.add_post(GENERATE_PATH, self._generate)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.SockSite(self._runner, self.sock).start()
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.sock.close()

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.generated.append(body)
        return await self.answer(self, request, body)

    async def _health(self, request: web.Request) -> web.Response:
        self.health_checks += 1
        return web.Response(status=self.health_status)

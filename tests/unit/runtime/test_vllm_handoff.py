"""The general path's handoff on real sockets: a request goes to a render process with its client's
connection, the process writes the answer's body into that connection itself, and the front
writes only the status line and headers (``backends.vllm.handoff``, ``backends.vllm.forwarding``).

The render process's side is ``worker``'s own handoff server, in this process, over a small
ASGI app standing in for vLLM's (the compatibility tests run it over vLLM's app); the front is
mmprep's ``GeneralRenderer`` in a real aiohttp server, the client a real HTTP client.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from mmprep_runtime import errors
from mmprep_runtime.backends.vllm import forwarding, worker, worker_pool
from mmprep_runtime.httpio import fetching
from mmprep_runtime.settings import FetchSettings

ANSWER = b'{"token_ids":[1,2,3],"kwargs":"' + b"A" * 3_000_000 + b'"}'


async def render_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers like vLLM's render app: JSON, its length, and what it was asked (in a header)."""
    request = await receive()
    body = request["body"]
    if b"raise" in body:
        raise RuntimeError("the processor raised")
    status, answer = (200, ANSWER) if body != b"bad" else (400, b'{"error":{"message":"bad","code":400}}')
    asked = json.dumps({"path": scope["path"], "request_id": dict(scope["headers"]).get(b"x-request-id", b"").decode()})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
    headers.append((b"x-asked", asked.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


class FakePool:
    """The pool's leasing (processes, lease, lost) over given sockets; no processes started."""

    vllm_args: tuple[str, ...] = ()

    def __init__(self, handoff_paths: list[str]) -> None:
        self.paths = handoff_paths
        self.lost_paths: list[str] = []

    @property
    def processes(self) -> int:
        return len(self.paths)

    @contextlib.contextmanager
    def lease(self, affinity: int | None = None) -> Iterator[worker_pool.Endpoint]:
        del affinity  # the first live socket is every stream's process here
        alive = [p for p in self.paths if p not in self.lost_paths]
        if not alive:
            raise worker_pool.GeneralPathUnavailable("every process is lost")
        yield worker_pool.Endpoint(http=alive[0], handoff=alive[0])

    def lost(self, path: str) -> None:
        self.lost_paths.append(path)


@contextlib.asynccontextmanager
async def render_process(path: str) -> AsyncIterator[None]:
    """``worker``'s handoff server over ``render_app`` on ``path``."""
    task = asyncio.create_task(worker._serve_handoffs(render_app, worker._listen(path)))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def front(pool: FakePool) -> AsyncIterator[str]:
    renderer = forwarding.GeneralRenderer(pool, fetching.Fetcher(FetchSettings()))  # type: ignore[arg-type]

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        try:
            return await renderer.forward(request, body, {"X-Request-Id": request.headers.get("X-Request-Id", "")})
        except errors.RequestError as error:
            return web.json_response({"error": error.message}, status=error.status, headers=error.headers)

    app = web.Application()
    app.router.add_post("/v1/chat/completions/render", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/v1/chat/completions/render"
    finally:
        await renderer.close()
        await runner.cleanup()


async def test_the_process_writes_the_body_and_the_connection_carries_the_next_request(tmp_path) -> None:
    path = str(tmp_path / "w0.handoff.sock")
    async with render_process(path), front(FakePool([path])) as url, aiohttp.ClientSession() as client:
        for number in range(3):  # one kept-alive connection: each answer must end where it says
            async with client.post(url, data=b"{}", headers={"X-Request-Id": f"r{number}"}) as response:
                assert response.status == 200
                assert await response.read() == ANSWER
                assert response.headers["Content-Length"] == str(len(ANSWER))
                assert response.headers["Content-Type"] == "application/json"
                asked = json.loads(response.headers["X-Asked"])
                assert asked == {"path": "/v1/chat/completions/render", "request_id": f"r{number}"}
        async with client.post(url, data=b"bad") as response:
            assert response.status == 400 and (await response.json())["error"]["message"] == "bad"
        connector = client.connector
        assert connector is not None and sum(len(c) for c in connector._conns.values()) == 1  # type: ignore[attr-defined]


async def test_an_app_that_raises_is_a_500_and_the_process_serves_on(tmp_path) -> None:
    path = str(tmp_path / "w0.handoff.sock")
    async with render_process(path), front(FakePool([path])) as url, aiohttp.ClientSession() as client:
        async with client.post(url, data=b"raise") as response:
            assert response.status == 500 and await response.read() == b"Internal Server Error"
        async with client.post(url, data=b"{}") as response:
            assert response.status == 200 and await response.read() == ANSWER


async def test_a_server_error_over_a_clip_no_decoder_opens_is_a_400_and_the_connection_serves_on(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # vLLM 0.33 answers a clip it cannot decode with a 500: the front replaces it before GO, so the
    # process's answer never reaches the client and the kept-alive connection stays in step.
    monkeypatch.setattr(forwarding.decoding, "audio_decode_problem", lambda clip: "truncated" if clip == b"BAD" else None)

    def clip_body(clip: bytes) -> bytes:
        part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(clip).decode(), "format": "wav"}}
        return json.dumps({"raise": True, "messages": [{"role": "user", "content": [part]}]}).encode()

    path = str(tmp_path / "w0.handoff.sock")
    async with render_process(path), front(FakePool([path])) as url, aiohttp.ClientSession() as client:
        async with client.post(url, data=clip_body(b"BAD")) as response:
            assert response.status == 400, await response.text()
            refused = (await response.json())["error"]
            assert refused == "messages[0].content[0].input_audio: the audio cannot be decoded: truncated"
        async with client.post(url, data=clip_body(b"RIFF")) as response:  # it opens: vLLM's 500 stands
            assert response.status == 500 and await response.read() == b"Internal Server Error"
        async with client.post(url, data=b"{}") as response:
            assert response.status == 200 and await response.read() == ANSWER
        connector = client.connector
        assert connector is not None and sum(len(c) for c in connector._conns.values()) == 1  # type: ignore[attr-defined]


async def test_a_process_that_refuses_is_skipped_for_the_next(tmp_path) -> None:
    dead, live = str(tmp_path / "w0.handoff.sock"), str(tmp_path / "w1.handoff.sock")
    pool = FakePool([dead, live])
    async with render_process(live), front(pool) as url, aiohttp.ClientSession() as client:
        response = await client.post(url, data=b"{}")
        assert response.status == 200 and await response.read() == ANSWER
    assert pool.lost_paths == [dead]


def _dying_process(path: str) -> tuple[socket.socket, asyncio.Task[None]]:
    """A render process's socket on ``path`` that takes one request and dies holding it."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    listener.setblocking(False)

    async def die_after_the_request() -> None:
        conversation, _ = await asyncio.get_running_loop().sock_accept(listener)
        await asyncio.get_running_loop().sock_recv(conversation, 1 << 16)
        conversation.close()  # as a process killed mid-request: no answer, the conversation ends

    return listener, asyncio.create_task(die_after_the_request())


async def test_a_request_whose_process_dies_before_answering_is_retried_once_on_another(tmp_path) -> None:
    dying, live = str(tmp_path / "w0.handoff.sock"), str(tmp_path / "w1.handoff.sock")
    listener, died = _dying_process(dying)
    pool = FakePool([dying, live])
    async with (
        render_process(live),
        front(pool) as url,
        aiohttp.ClientSession() as client,
        client.post(url, data=b"{}", headers={"X-Request-Id": "r-1"}) as response,
    ):
        assert response.status == 200 and await response.read() == ANSWER
        assert json.loads(response.headers["X-Asked"])["request_id"] == "r-1"
    await died
    listener.close()
    assert pool.lost_paths == [dying]


async def test_a_request_that_ends_two_processes_is_a_retryable_503_not_sent_to_a_third(tmp_path) -> None:
    paths = [str(tmp_path / f"w{i}.handoff.sock") for i in range(3)]
    dying = [_dying_process(p) for p in paths[:2]]
    pool = FakePool(paths)
    async with render_process(paths[2]), front(pool) as url, aiohttp.ClientSession() as client:
        async with client.post(url, data=b"{}") as response:
            assert response.status == 503, await response.text()
            assert response.headers["Retry-After"] == "1"
            assert "render process stopped" in (await response.json())["error"]
        # The third process was never sent it, and serves the next request.
        async with client.post(url, data=b"{}") as response:
            assert response.status == 200
    for listener, died in dying:
        await died
        listener.close()
    assert pool.lost_paths == paths[:2]


async def test_a_lone_process_that_dies_holding_the_request_is_a_retryable_503(tmp_path) -> None:
    path = str(tmp_path / "w0.handoff.sock")
    listener, died = _dying_process(path)
    pool = FakePool([path])
    async with front(pool) as url, aiohttp.ClientSession() as client, client.post(url, data=b"{}") as response:
        assert response.status == 503, await response.text()
        assert "render process stopped" in (await response.json())["error"]
    await died
    listener.close()
    assert pool.lost_paths == [path]


@pytest.mark.parametrize("signal_", [b"", b"X"])
def test_the_process_writes_nothing_without_go(tmp_path, signal_: bytes) -> None:
    """The front closing the conversation (or saying anything but GO) leaves the client's socket
    untouched: the answer is dropped, not written into a connection the front moved on with."""

    async def scenario() -> bytes:
        path = str(tmp_path / "w0.handoff.sock")
        client_end, passed = socket.socketpair()
        async with render_process(path):
            conversation = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conversation.setblocking(False)
            await asyncio.get_running_loop().sock_connect(conversation, path)
            message = {"method": "POST", "path": "/x", "headers": [], "length": 2}
            from mmprep_runtime.backends.vllm import handoff

            await handoff.send_with_socket(conversation, handoff.frame(message), passed.fileno())
            await asyncio.get_running_loop().sock_sendall(conversation, b"{}")
            answer, _ = await handoff.read_frame(conversation)
            assert answer["status"] == 200 and answer["length"] == len(ANSWER)
            if signal_:
                await asyncio.get_running_loop().sock_sendall(conversation, signal_)
            conversation.shutdown(socket.SHUT_WR)
            assert await handoff.read_byte(conversation) == b""  # the process ended the conversation
            conversation.close()
        passed.close()
        client_end.setblocking(False)
        try:
            return client_end.recv(1 << 16)
        finally:
            client_end.close()

    assert asyncio.run(scenario()) == b""

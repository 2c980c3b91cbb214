"""The general render path's HTTP side: a render request forwarded to one of vLLM's own render
processes (``backends.vllm.worker_pool``), its answer returned as vLLM wrote it.

The request goes with its client's connection (``backends.vllm.handoff``): the process answers
status, headers and length, this server writes the status line and headers (so the answer
carries the request id and the drain's ``Connection: close`` like every other), and the process
writes the body into the client's socket itself. The megabytes of an answer never pass through
this process. A connection without a socket to pass (none here) is forwarded over HTTP instead.

What mmprep adds in front of vLLM, and nothing else:
- media URLs are fetched here, under mmprep's rules (public addresses only unless allowed, every
  redirect checked, a size cap and timeouts: ``fetching.Fetcher``), and handed to vLLM inline as
  base64 data URIs. vLLM decodes a URL's bytes and a data URI's bytes the same way, so the answer
  does not change, but vLLM never reaches the network on a client's say-so;
- when vLLM answers a request with inline audio with a server error, and a clip of it is one no
  decoder can open, the answer is a 400 naming the clip instead (vLLM 0.33 answers 500, a server
  error that tells a client to retry its bad file). Clips are looked at only then: opening a 10 s
  clip cost the front about 2 ms, more than the rest of the request (about 1.5 ms), and a clip
  vLLM renders needs no second opinion;
- the request is leased to the process with the fewest requests in flight;
- a process that cannot be connected to is skipped (the request goes to the next one); one that
  dies mid-request gives a retryable 503; the pool restarts either.

Everything else (the chat template, every modality, vLLM's limits such as ``--limit-mm-per-prompt``
and ``--allowed-local-media-path``, the answer and every error's shape) is vLLM's own code.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import socket
from collections.abc import Iterator
from typing import Any, Final

import aiohttp
import orjson
from aiohttp import web

from mmprep_runtime import errors
from mmprep_runtime.backends.vllm import handoff, worker_pool
from mmprep_runtime.engine import decoding
from mmprep_runtime.httpio import fetching

#: The content parts whose URL vLLM would fetch, and the key holding the URL object.
_URL_PARTS: Final = ("image_url", "video_url", "audio_url")
#: vLLM reads a data URI's bytes as it reads a fetched body, except for this type (a list of JPEG
#: frames); fetched bytes are never that, so they go under a neutral type.
_INLINE_TYPE: Final = "application/octet-stream"
#: How long one forwarded request may take at most; the server's deadline usually ends it first.
_FORWARD_TIMEOUT_S: Final = 600.0


class RenderProcessLost(errors.NotReady):
    """The render process died while it held the request: retry, another process (or the
    restarted one) answers."""

    code = "render_process_lost"


def _content_parts(body: Any) -> Iterator[tuple[dict[str, Any], str]]:
    """Each content part of the chat messages that is an object, with where it is. Anything else
    in the body is left for vLLM to answer."""
    messages = body.get("messages") if isinstance(body, dict) else None
    for m, message in enumerate(messages if isinstance(messages, list) else ()):
        content = message.get("content") if isinstance(message, dict) else None
        for p, part in enumerate(content if isinstance(content, list) else ()):
            if isinstance(part, dict):
                yield part, f"messages[{m}].content[{p}]"


def _url_parts(body: Any) -> Iterator[tuple[dict[str, Any], str]]:
    """Each (URL object, where) of the chat messages' media parts with an http(s) URL."""
    for part, where in _content_parts(body):
        for key in _URL_PARTS:
            target = part.get(key)
            if not isinstance(target, dict):
                continue
            url = target.get("url")
            if isinstance(url, str) and url[:5].lower() != "data:" and url.split(":", 1)[0].lower() in ("http", "https"):
                yield target, f"{where}.{key}"


def _audio_clips(body: Any) -> Iterator[tuple[str, str]]:
    """Each (base64 data, where) of the chat messages' inline audio: ``input_audio`` parts, and
    ``audio_url`` parts with a data URI (fetched URLs are data URIs by now)."""
    for part, where in _content_parts(body):
        inline, url = part.get("input_audio"), part.get("audio_url")
        if isinstance(inline, dict) and isinstance(inline.get("data"), str):
            yield inline["data"], f"{where}.input_audio"
        elif isinstance(url, dict) and isinstance(url.get("url"), str) and url["url"][:5].lower() == "data:":
            header, _, data = url["url"].partition(",")
            if header.lower().endswith(";base64"):
                yield data, f"{where}.audio_url"


def check_audio(body: Any) -> None:
    """Raise a 400 naming the first audio clip of ``body`` no decoder can open; called once vLLM
    answered the request with a server error, which is how vLLM 0.33 answers such a clip."""
    for data, where in _audio_clips(body):
        try:
            clip = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            continue  # not plain base64: vLLM's own answer says what it makes of it
        problem = decoding.audio_decode_problem(clip)
        if problem is not None:
            raise errors.BadMedia(f"{where}: the audio cannot be decoded: {problem}")


async def inline_media_urls(body: Any, fetcher: fetching.Fetcher) -> bool:
    """Replace, in the parsed ``body``, every http(s) media URL with the fetched bytes as a data
    URI; True when there was one."""
    targets = list(_url_parts(body))
    for target, where in targets:
        data = await fetcher.fetch(target["url"], where)
        target["url"] = f"data:{_INLINE_TYPE};base64,{base64.b64encode(data).decode()}"
    return bool(targets)


async def prepare(body: bytes, fetcher: fetching.Fetcher) -> tuple[bytes, Any]:
    """The body vLLM gets, media URLs fetched here and inlined, and the parsed body (None when it
    is not JSON: vLLM answers that). The body is ``body`` itself, byte for byte, when nothing
    changed.

    Always parsed, never screened by searching the bytes: JSON may spell any character of a URL
    as an escape (``"\\u0068ttp://10.0.0.1/"``), which a search for ``http`` misses and vLLM would
    fetch. Parsing is also the cheaper of the two: orjson reads a 600 KB body in a quarter of a
    millisecond, where each search over its base64 took longer.
    """
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body, None
    changed = await inline_media_urls(parsed, fetcher)
    return (orjson.dumps(parsed) if changed else body), parsed


def check_server_error(status: int, parsed: Any) -> None:
    """Before a server error from vLLM is passed on: a 400 instead when a clip is the cause."""
    if status >= 500:
        check_audio(parsed)


class _Refused(ConnectionError):
    """The render process's socket refused the connection: nothing was sent, try another."""


def _client_socket(request: web.Request) -> Any:
    """The client connection's socket, to pass on (None where the transport has none)."""
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    return sock if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6) else None


async def _flushed(request: web.Request) -> None:
    """Until this server's transport holds none of the connection's bytes: the render process
    writes into the socket next, so whatever is still queued here (the status line and headers,
    the tail of an earlier answer) must be in the kernel's queue first. Almost always at once."""
    transport = request.transport
    while transport is not None and transport.get_write_buffer_size():
        if transport.is_closing():
            raise ConnectionResetError("the client's connection closed")
        await asyncio.sleep(0.001)


class HandedOverAnswer(web.StreamResponse):
    """An answer whose body the render process writes: this server writes the status line and
    headers, then says GO and waits for the process to say it is done (``handoff``).

    It runs as aiohttp finishes the response, after the handler returned (as any answer's body is
    written), so the request's deadline never cuts an answer in the middle."""

    def __init__(self, conversation: socket.socket, answer: dict[str, Any]) -> None:
        super().__init__(status=int(answer["status"]))
        for name, value in answer["headers"]:
            self.headers.add(str(name), str(value))
        self.content_length = int(answer["length"])
        self._conversation = conversation

    async def write_eof(self, data: bytes = b"") -> None:
        loop = asyncio.get_running_loop()
        outcome = b""
        try:
            await self.write(b"")  # aiohttp may hold the headers for the first body bytes: not here
            await _flushed(self._req)  # type: ignore[arg-type]  # prepared: the request is set
            await loop.sock_sendall(self._conversation, handoff.GO)
            outcome = await handoff.read_byte(self._conversation)
        except OSError:
            outcome = b""
        finally:
            self._conversation.close()
        if outcome != handoff.DONE:
            # The body did not all arrive: this connection can carry no further answer.
            self.force_close()
        await super().write_eof()


class GeneralRenderer:
    """Hands render requests to ``worker_pool``'s processes (``handoff``), or forwards them over HTTP."""

    def __init__(self, pool: worker_pool.VllmWorkerPool, fetcher: fetching.Fetcher) -> None:
        self.pool = pool
        self.fetcher = fetcher
        self._sessions: dict[str, aiohttp.ClientSession] = {}

    def _session(self, socket_path: str) -> aiohttp.ClientSession:
        session = self._sessions.get(socket_path)
        if session is None or session.closed:
            session = aiohttp.ClientSession(
                # A connection per request (a Unix socket's costs microseconds): a process that died
                # then shows as a refused connect, which nothing was sent on and which is safe to
                # send elsewhere, never as a kept-alive connection failing mid-write.
                connector=aiohttp.UnixConnector(path=socket_path, force_close=True),
                timeout=aiohttp.ClientTimeout(total=_FORWARD_TIMEOUT_S),
                auto_decompress=False,
            )
            self._sessions[socket_path] = session
        return session

    async def render(self, request: web.Request, body: bytes, headers: dict[str, str]) -> web.StreamResponse:
        body, parsed = await prepare(body, self.fetcher)
        client = _client_socket(request)
        # A process that cannot be connected to got nothing: the request goes to the next one.
        for _ in range(self.pool.processes):
            # Only taking the lease raises GeneralPathUnavailable (no process is ready).
            try:
                with self.pool.lease() as endpoint:
                    try:
                        if client is not None:
                            return await self._hand_over(endpoint.handoff, request, client, body, headers, parsed)
                        return await self._forward(endpoint.http, request.path, body, headers, parsed)
                    except (aiohttp.ClientConnectorError, _Refused):
                        self.pool.lost(endpoint.http)
                    except (aiohttp.ClientConnectionError, aiohttp.ServerDisconnectedError, ConnectionError) as exc:
                        # It had the request and died with it: the client may retry; this one is not
                        # resent here, as the request may be what ended the process.
                        self.pool.lost(endpoint.http)
                        raise RenderProcessLost(
                            f"the render process stopped while it held this request ({type(exc).__name__}); retry",
                            headers={"Retry-After": "1"},
                        ) from None
            except worker_pool.GeneralPathUnavailable as exc:
                raise errors.NotReady(f"not ready: {exc}") from None
        raise errors.NotReady("not ready: no render process accepts connections; they are restarting")

    async def _hand_over(
        self, path: str, request: web.Request, client: Any, body: bytes, headers: dict[str, str], parsed: Any
    ) -> web.StreamResponse:
        """The request and its client's socket to the process on ``path``; its answer's head back.
        An answer replaced here (``check_server_error``) is dropped: the conversation closes
        without GO, and the process writes nothing to the client."""
        loop = asyncio.get_running_loop()
        conversation = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conversation.setblocking(False)
        try:
            try:
                await loop.sock_connect(conversation, path)
            except OSError as exc:
                raise _Refused(str(exc)) from None
            message = {"method": request.method, "path": request.path, "headers": list(headers.items()), "length": len(body)}
            await handoff.send_with_socket(conversation, handoff.frame(message), client.fileno())
            await loop.sock_sendall(conversation, body)
            answer, _ = await handoff.read_frame(conversation)
            check_server_error(int(answer["status"]), parsed)
            return HandedOverAnswer(conversation, answer)
        except BaseException:
            conversation.close()
            raise

    async def _forward(self, socket_path: str, path: str, body: bytes, headers: dict[str, str], parsed: Any) -> web.Response:
        async with self._session(socket_path).post(f"http://localhost{path}", data=body, headers=headers) as answer:
            check_server_error(answer.status, parsed)
            payload = await answer.read()
            return web.Response(status=answer.status, body=payload, content_type=answer.content_type, charset=answer.charset)

    async def close(self) -> None:
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()

"""The general render path's HTTP side: a request to vLLM's render server (render, derender,
tokenize, the Anthropic and Responses renders) forwarded to one of vLLM's own render processes
(``backends.vllm.worker_pool``), its answer returned as vLLM wrote it.

The request goes with its client's connection (``backends.vllm.handoff``): the process answers
status, headers and length, this server writes the status line and headers (so the answer
carries the request id and the drain's ``Connection: close`` like every other), and the process
writes the body into the client's socket itself. The megabytes of an answer never pass through
this process. A connection without a socket to pass (none here) is forwarded over HTTP instead.

What mmprep adds in front of vLLM, and nothing else:
- media URLs are fetched here, under mmprep's rules (public addresses only unless allowed, every
  redirect checked, a size cap and timeouts: ``fetching.Fetcher``), and handed to vLLM inline as
  base64 data URIs, in every body shape vLLM loads media from (chat parts, Anthropic sources,
  Responses ``input_image``). vLLM decodes a URL's bytes and a data URI's bytes the same way, so
  the answer does not change, but vLLM never reaches the network on a client's say-so; a
  ``file:`` URL is a 400 unless vLLM was allowed a local folder;
- when vLLM answers a request with inline audio with a server error, and a clip of it is one no
  decoder can open, the answer is a 400 naming the clip instead (vLLM 0.33 answers 500, a server
  error that tells a client to retry its bad file). Clips are looked at only then: opening a 10 s
  clip cost the front about 2 ms, more than the rest of the request (about 1.5 ms), and a clip
  vLLM renders needs no second opinion;
- the request is leased to the process with the fewest requests in flight;
- a process that cannot be connected to is skipped (the request goes to the next one); one that
  dies holding a request, before any byte of its answer reached the client, has it retried once
  on another process (a second loss is a retryable 503); the pool restarts either.

Everything else (the chat template, every modality, vLLM's limits such as ``--limit-mm-per-prompt``
and ``--allowed-local-media-path``, the answer and every error's shape) is vLLM's own code.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import socket
import zlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final, TypeVar

import aiohttp
import orjson
from aiohttp import web

from mmprep_runtime import errors
from mmprep_runtime.backends.protocol import Operation, Reply
from mmprep_runtime.backends.vllm import handoff, worker_pool
from mmprep_runtime.engine import decoding
from mmprep_runtime.httpio import fetching
from mmprep_runtime.settings import vllm_option_names

#: The content parts whose URL vLLM would fetch, and the key holding the URL object.
_URL_PARTS: Final = ("image_url", "video_url", "audio_url")
#: vLLM reads a data URI's bytes as it reads a fetched body, except for this type (a list of JPEG
#: frames); fetched bytes are never that, so they go under a neutral type.
_INLINE_TYPE: Final = "application/octet-stream"
#: How long one forwarded request may take at most; the server's deadline usually ends it first.
_FORWARD_TIMEOUT_S: Final = 600.0

_T = TypeVar("_T")


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


def _objects(value: Any, where: str) -> Iterator[tuple[dict[str, Any], str]]:
    """Every JSON object inside ``value`` (itself included), with where it is."""
    if isinstance(value, dict):
        yield value, where
        for key, item in value.items():
            yield from _objects(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _objects(item, f"{where}[{i}]")


def _media_urls(body: Any) -> Iterator[tuple[dict[str, Any], str, str]]:
    """Each (object, key, where) holding a media URL that vLLM would load, in any of the bodies
    its render server takes: a chat's ``image_url``/``video_url``/``audio_url`` parts, an
    Anthropic ``{"type": "url"}`` source (nested in tool results too), a Responses
    ``input_image``'s ``image_url``. Only the messages (chat, Anthropic) and the input (Responses)
    are looked in: media anywhere else is nothing vLLM loads."""
    if not isinstance(body, dict):
        return
    for field in ("messages", "input"):
        for obj, where in _objects(body.get(field), field):
            for key in _URL_PARTS:
                target = obj.get(key)
                if isinstance(target, dict) and isinstance(target.get("url"), str):
                    yield target, "url", f"{where}.{key}"
            if obj.get("type") == "url" and isinstance(obj.get("url"), str):
                yield obj, "url", where
            if obj.get("type") == "input_image" and isinstance(obj.get("image_url"), str):
                yield obj, "image_url", f"{where}.image_url"


def _scheme(url: str) -> str:
    return url.split(":", 1)[0].lower() if ":" in url else ""


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


async def inline_media_urls(body: Any, fetcher: fetching.Fetcher, *, local_files: bool = False) -> bool:
    """Replace, in the parsed ``body``, every http(s) media URL with the fetched bytes as a data
    URI; True when there was one. A ``file:`` URL is refused with a 400 unless vLLM was given
    ``--allowed-local-media-path`` (``local_files``), where vLLM's own rules decide: vLLM 0.33
    answers it with a 500, a server error that tells a client to retry what never succeeds."""
    targets = []
    for target, key, where in _media_urls(body):
        scheme = _scheme(target[key])
        if scheme in ("http", "https"):
            targets.append((target, key, where))
        elif scheme == "file" and not local_files:
            raise errors.BadMedia(f"{where}: cannot load local files without `--allowed-local-media-path`")
    for target, key, where in targets:
        data = await fetcher.fetch(target[key], where)
        target[key] = f"data:{_INLINE_TYPE};base64,{base64.b64encode(data).decode()}"
    return bool(targets)


async def prepare(body: bytes, fetcher: fetching.Fetcher, *, local_files: bool = False) -> tuple[bytes, Any]:
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
    changed = await inline_media_urls(parsed, fetcher, local_files=local_files)
    return (orjson.dumps(parsed) if changed else body), parsed


def stream_affinity(path: str, parsed: Any) -> int | None:
    """A streamed chat derender's number, from its generate request's id: each call of one stream
    gets the same, so they go to one render process while it can take them (``lease``)."""
    if path != Operation.CHAT_DERENDER.value or not isinstance(parsed, dict) or parsed.get("stream") is not True:
        return None
    chunk = parsed.get("generate_chunk")
    request_id = chunk.get("request_id") if isinstance(chunk, dict) else None
    return zlib.crc32(request_id.encode()) if isinstance(request_id, str) else None


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
    """Hands requests to ``worker_pool``'s processes (``handoff``), or forwards them over HTTP."""

    def __init__(self, pool: worker_pool.VllmWorkerPool, fetcher: fetching.Fetcher) -> None:
        self.pool = pool
        self.fetcher = fetcher
        #: vLLM loads ``file:`` URLs itself only where it was told which folder it may read.
        self.local_files = "--allowed-local-media-path" in vllm_option_names(pool.vllm_args)
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

    async def forward(self, request: web.Request, body: bytes, headers: dict[str, str]) -> web.StreamResponse:
        """The answer of a render process to ``request`` (any route of vLLM's render server)."""
        if body:
            body, parsed = await prepare(body, self.fetcher, local_files=self.local_files)
        else:
            parsed = None
        client = _client_socket(request)

        affinity = stream_affinity(request.path, parsed)

        async def send(endpoint: worker_pool.Endpoint) -> web.StreamResponse:
            if client is not None:
                return await self._hand_over(endpoint.handoff, request, client, body, headers, parsed)
            url = f"http://localhost{request.path}"
            answer = await self._request(endpoint.http, request.method, url, body, headers, parsed)
            status, payload, content_type, charset = answer
            return web.Response(status=status, body=payload, content_type=content_type, charset=charset)

        return await self._on_a_process(send, affinity)

    async def call(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> Reply:
        """A render process's answer to a request this server makes itself, held whole."""
        if body:
            body, parsed = await prepare(body, self.fetcher, local_files=self.local_files)
        else:
            parsed = None

        async def send(endpoint: worker_pool.Endpoint) -> Reply:
            status, payload, _, _ = await self._request(endpoint.http, method, f"http://localhost{path}", body, headers, parsed)
            return Reply(status, payload)

        return await self._on_a_process(send, stream_affinity(path, parsed))

    async def _on_a_process(self, send: Callable[[worker_pool.Endpoint], Awaitable[_T]], affinity: int | None = None) -> _T:
        """``send`` on the process with the fewest requests in flight, and on another when that
        one cannot take it.

        A process that cannot be connected to got nothing: the request goes to the next one. One
        that died holding it had written nothing to the client yet (the answer's head comes back
        here first): the request goes to another process once. A request that ends two
        processes is answered 503 rather than sent on to end a third."""
        lost: RenderProcessLost | None = None
        for _ in range(self.pool.processes + 1):
            # Only taking the lease raises GeneralPathUnavailable (no process is ready).
            try:
                with self.pool.lease(affinity if lost is None else None) as endpoint:
                    try:
                        return await send(endpoint)
                    except (aiohttp.ClientConnectorError, _Refused):
                        self.pool.lost(endpoint.http)
                    except (aiohttp.ClientConnectionError, aiohttp.ServerDisconnectedError, ConnectionError) as exc:
                        self.pool.lost(endpoint.http)
                        if lost is not None:
                            raise lost from None
                        lost = RenderProcessLost(
                            f"the render process stopped while it held this request ({type(exc).__name__}) "
                            "and no other process could take it; retry",
                            headers={"Retry-After": "1"},
                        )
            except worker_pool.GeneralPathUnavailable as exc:
                if lost is not None:
                    raise lost from None
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

    async def _request(
        self, socket_path: str, method: str, url: str, body: bytes, headers: dict[str, str], parsed: Any
    ) -> tuple[int, bytes, str, str | None]:
        """Status, body, content type and charset of a process's answer over HTTP."""
        async with self._session(socket_path).request(method, url, data=body, headers=headers) as answer:
            check_server_error(answer.status, parsed)
            return answer.status, await answer.read(), answer.content_type, answer.charset

    async def close(self) -> None:
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()

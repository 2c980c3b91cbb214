"""What both HTTP APIs share on the wire: reading a bounded JSON body, and what a handler answers.

A handler of either API (``preprocess``, ``vllm_render_server``) reads its body through
``read_json_body`` (the Content-Type and the size limit checked before a byte is read) and
returns an ``Answer``: the response and the time the engine spent decoding, which the server
records. The server (``server.requests``) wraps every handler in readiness, admission, the
deadline, metrics and error mapping.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from aiohttp import abc, payload, web

from mmprep_runtime import errors
from mmprep_runtime.engine.pipeline import AnswerBody, Pieces
from mmprep_runtime.settings import Limits

OCTET_STREAM: Final = "application/octet-stream"
JSON_TYPE: Final = "application/json"


@dataclasses.dataclass(frozen=True)
class Answer:
    """A handler's response, with the seconds its request spent decoding (for the histogram)."""

    response: web.StreamResponse
    decode_seconds: float


class PiecesPayload(payload.Payload):
    """A ``Pieces`` answer for aiohttp: its length announced up front, its pieces written in turn."""

    def __init__(self, pieces: Pieces, content_type: str) -> None:
        super().__init__(pieces, content_type=content_type)
        self._pieces = pieces
        self._size = pieces.size

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self._pieces.joined().decode(encoding, errors)

    async def as_bytes(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self._pieces.joined()

    async def write(self, writer: abc.AbstractStreamWriter) -> None:
        for part in self._pieces.parts:
            await writer.write(part)

    async def write_with_length(self, writer: abc.AbstractStreamWriter, content_length: int | None) -> None:
        # aiohttp's own writers call this with the announced length: the pieces are that long.
        await self.write(writer)


def answer_response(body: AnswerBody, content_type: str) -> web.Response:
    """The response for an encoded answer (``pipeline.AnswerBody``)."""
    if isinstance(body, Pieces):
        return web.Response(body=PiecesPayload(body, content_type))
    return web.Response(body=body, content_type=content_type)


async def read_body(request: web.Request, limit: int) -> bytes:
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


async def read_json_body(request: web.Request, limits: Limits) -> bytes:
    content_type = request.content_type
    if content_type != JSON_TYPE:
        raise errors.UnsupportedMediaType(f"Content-Type must be {JSON_TYPE}, got {content_type!r}")
    if request.content_length is not None and request.content_length > limits.max_body_bytes:
        raise errors.BodyTooLarge(f"body of {request.content_length} bytes is over the limit of {limits.max_body_bytes}")
    return await read_body(request, limits.max_body_bytes)

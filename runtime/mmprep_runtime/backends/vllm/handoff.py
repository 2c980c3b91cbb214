"""Handing a client's connection to a render process, so its answer goes to the client directly.

The general path's answers are megabytes (a kwargs item's base64). Returned through mmprep's front
they would cross one more process: the render process writes them into a Unix socket, the front
reads them back and writes them again to the client, which cost the front about 9 ms of CPU per
6 MB answer on two cores, as much as a sixth of the request. Instead, the front passes the
client's socket itself to the render process (``SCM_RIGHTS``) with the request; the render process
runs vLLM's app and tells the front the answer's status, headers and length; the front writes the
status line and headers through its own HTTP server, waits until they have left its buffers, and
says "go"; the render process writes the body into the client's socket and says when it is done.
The front stays the only HTTP server the client talks to (admission, deadlines, drain, metrics,
the request id), and no byte of the answer passes through it.

The conversation, one Unix connection per request (a refused connect means the process is gone
and nothing was sent, so the request may go elsewhere):

    front -> process   frame {"method", "path", "headers", "length"} with the client's socket,
                       then ``length`` bytes of body
    process -> front   frame {"status", "headers", "length"}
    front -> process   GO (or nothing: the front closes the connection, the answer is dropped)
    process -> front   DONE, or FAILED when the client's socket refused the body

A frame is a 4-byte big-endian length and that many bytes of JSON. Pure sockets and asyncio; both
sides import it (``worker`` in the render process, ``backends.vllm.forwarding`` in the front).
"""

from __future__ import annotations

import array
import asyncio
import json
import socket
import struct
from typing import Any, Final

_LENGTH: Final = struct.Struct("!I")
#: A frame holds a request's method, path and a few headers, or an answer's status and headers.
MAX_FRAME: Final = 1 << 20
GO: Final = b"G"
DONE: Final = b"D"
FAILED: Final = b"F"
#: Headers that describe the connection or the body's framing: each side's HTTP layer sets its own.
HOP_HEADERS: Final = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive", "date", "server"})


class HandoffError(ConnectionError):
    """The other side closed the conversation or broke its protocol."""


def frame(message: dict[str, Any]) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return _LENGTH.pack(len(data)) + data


async def _readable(sock: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(sock.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())


async def send_with_socket(sock: socket.socket, data: bytes, passed: int) -> None:
    """``data`` with the descriptor ``passed`` attached (the first byte carries it)."""
    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [passed]))]
    sent = sock.sendmsg([data[:1]], rights)
    if sent != 1:  # pragma: no cover - a fresh Unix socket always takes one byte
        raise HandoffError("the descriptor could not be sent")
    await asyncio.get_running_loop().sock_sendall(sock, data[1:])


async def receive_socket(sock: socket.socket) -> tuple[bytes, socket.socket | None]:
    """The first bytes of a conversation and the socket passed with them (None when none came)."""
    fds = array.array("i")
    while True:
        try:
            data, ancillary, _, _ = sock.recvmsg(1 << 16, socket.CMSG_SPACE(fds.itemsize))
            break
        except BlockingIOError:
            await _readable(sock)
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    if not data:
        for fd in fds:
            socket.socket(fileno=fd).close()
        raise HandoffError("the conversation ended before it began")
    passed = socket.socket(fileno=fds[0]) if fds else None
    for fd in fds[1:]:
        socket.socket(fileno=fd).close()
    return data, passed


async def read_exactly(sock: socket.socket, count: int, start: bytes = b"") -> bytes:
    """``count`` bytes: ``start`` (already received) and the rest from ``sock``."""
    if len(start) >= count:
        return start[:count]
    loop = asyncio.get_running_loop()
    buffer = bytearray(count)
    buffer[: len(start)] = start
    view = memoryview(buffer)
    filled = len(start)
    while filled < count:
        got = await loop.sock_recv_into(sock, view[filled:])
        if not got:
            raise HandoffError(f"the conversation ended after {filled} of {count} bytes")
        filled += got
    return bytes(buffer)


async def read_frame(sock: socket.socket, start: bytes = b"") -> tuple[dict[str, Any], bytes]:
    """One frame, and whatever of the following bytes came with it."""
    loop = asyncio.get_running_loop()
    data = start
    while len(data) < _LENGTH.size:
        more = await loop.sock_recv(sock, 1 << 16)
        if not more:
            raise HandoffError("the conversation ended before a frame")
        data += more
    (length,) = _LENGTH.unpack_from(data)
    if length > MAX_FRAME:
        raise HandoffError(f"a frame of {length} bytes is over the limit of {MAX_FRAME}")
    end = _LENGTH.size + length
    while len(data) < end:
        more = await loop.sock_recv(sock, max(end - len(data), 1 << 16))
        if not more:
            raise HandoffError("the conversation ended inside a frame")
        data += more
    message = json.loads(data[_LENGTH.size : end])
    if not isinstance(message, dict):
        raise HandoffError("a frame is not a JSON object")
    return message, data[end:]


async def read_byte(sock: socket.socket) -> bytes:
    """The next one-byte signal (GO, DONE, FAILED); empty when the other side closed."""
    data: bytes = await asyncio.get_running_loop().sock_recv(sock, 1)
    return data

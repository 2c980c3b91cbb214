"""The runtime's listening sockets, and how they stop taking connections without resetting one.

Closing a listening socket resets every connection the kernel has already completed but the server
has not yet accepted: a client that connected a moment before the close sees ECONNRESET after
sending its request, which it cannot tell from a crash. A client that keeps connecting to a
terminating pod (one that ignores readiness, or a proxy slow to learn of it) hits that window every
time the drain ends. So the close comes in two steps (``quiesce``, then the site's stop):

1. the socket stops starting handshakes: a socket filter that drops every SYN (a packet that asks
   for a new connection) is attached to it. A connecting client's SYN goes unanswered; it sends it
   again about a second later, when the socket is closed, and is refused: a clean "not delivered"
   it can retry elsewhere. Every other packet passes, and that matters: a handshake the socket
   answered just before the filter ends with the client's ACK, which the listener's filter sees
   too. Dropped, it would leave that client sending its request into a connection the server never
   completes, until the close resets it. Let through, the connection joins the accept queue;
2. the event loop accepts what is queued (the closing server answers them 503 with Retry-After),
   and the socket closes once the queue has stayed empty for a moment (``_SETTLE_S``): long enough
   for the ACK of a handshake still under way to arrive.

The filter is classic BPF (``SO_ATTACH_FILTER``): any process may attach one to its own socket, no
capability needed. Where it cannot be attached (not Linux), the close resets the queue as before.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import select
import socket
import struct
import sys
import time
from collections.abc import Sequence
from typing import Final

logger = logging.getLogger(__name__)

#: A queue of pending connections as deep as the kernel allows (capped by net.core.somaxconn).
BACKLOG: Final = 4096
#: Linux's SO_ATTACH_FILTER (asm-generic/socket.h); the socket module does not name it.
SO_ATTACH_FILTER: Final = 26


def _instruction(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    """One classic BPF instruction (``struct sock_filter``)."""
    return struct.pack("HBBI", code, jt, jf, k)


#: Drop a TCP packet whose SYN flag is set and ACK flag clear (a new connection's first packet);
#: keep every other one whole. A TCP socket's filter sees the packet from its TCP header on, so
#: byte 13 is the flags byte (ACK 0x10, SYN 0x02).
_DROP_NEW_CONNECTIONS: Final = b"".join(
    (
        _instruction(0x30, 13),  # ldb [13]: the flags
        _instruction(0x54, 0x12),  # and #0x12: SYN and ACK only
        _instruction(0x15, 0x02, jt=0, jf=1),  # jeq #SYN: a SYN alone drops, else keep
        _instruction(0x06, 0),  # ret #0: keep nothing (drop)
        _instruction(0x06, 0xFFFFFFFF),  # ret #-1: keep the whole packet
    )
)

#: How often ``quiesce`` looks whether the accept queue is empty yet.
_POLL_S: Final = 0.005
#: How long the queue must stay empty before the socket may close: a handshake answered before the
#: filter completes one round trip later (microseconds on a node, well under this across a cluster).
_SETTLE_S: Final = 0.1


def listen(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for ``host:port``, one per address it resolves to (as asyncio's
    create_server binds them), owned here so that ``quiesce`` can reach them."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    families = {info[0] for info in infos}
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and len(families) > 1:
                # Both families are bound separately: the IPv6 socket must not claim IPv4 too.
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(BACKLOG)
            sock.setblocking(False)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def stop_handshakes(sock: socket.socket) -> bool:
    """Drop every new connection's SYN that reaches ``sock`` from now on, so it starts no handshake
    (the ones under way still complete). False where no socket filter can be attached (the caller
    closes as before)."""
    if not sys.platform.startswith("linux"):
        return False
    program = ctypes.create_string_buffer(_DROP_NEW_CONNECTIONS)
    # struct sock_fprog {unsigned short len; struct sock_filter *filter;}, native alignment. The
    # kernel copies the program during the call, so the buffer need not outlive it.
    fprog = struct.pack("@HP", len(_DROP_NEW_CONNECTIONS) // 8, ctypes.addressof(program))
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
    except OSError as exc:
        logger.warning("cannot stop new connections before closing the listener (%s): queued ones are reset", exc)
        return False
    return True


def pending(sockets: Sequence[socket.socket]) -> bool:
    """Whether a connection waits in any socket's accept queue (a listening socket is readable)."""
    readable, _, _ = select.select(list(sockets), [], [], 0)
    return bool(readable)


async def quiesce(sockets: Sequence[socket.socket], timeout: float) -> int:
    """Stop new handshakes on ``sockets`` and let the event loop accept what is queued, for at most
    ``timeout`` seconds; returns how many sockets still had a queue when the time ran out."""
    stopped = [sock for sock in sockets if stop_handshakes(sock)]
    deadline = time.monotonic() + timeout
    empty_since: float | None = None
    # A poll: the loop's accept callback runs between them, and nothing signals an empty queue (a
    # second reader on the socket would replace the server's own in asyncio's selector loop).
    while stopped and (now := time.monotonic()) < deadline:
        if pending(stopped):
            empty_since = None
        elif empty_since is None:
            empty_since = now
        elif now - empty_since >= _SETTLE_S:
            break
        await asyncio.sleep(_POLL_S)
    left = sum(1 for sock in stopped if pending([sock]))
    if left:
        logger.warning("connections still queued after %g s: the close resets them", timeout)
    return left

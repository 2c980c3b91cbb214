"""The listener's close (``server.listener``): new handshakes stop first, the queued connections are
accepted and answered, and only then does the socket close, so no client that connected before the
close is reset. Real sockets on the loopback, a real aiohttp server; the control shows that closing
at once resets the queue, which is what the two steps are for."""

from __future__ import annotations

import asyncio
import socket
import sys

import pytest
import uvloop
from aiohttp import web

from mmprep_runtime.server import listener

REQUEST = b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"


def _connect(port: int, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def _answer(client: socket.socket) -> bytes:
    """Everything the server sends until it closes; raises ConnectionResetError on a reset."""
    chunks = []
    with client:
        while data := client.recv(65536):
            chunks.append(data)
    return b"".join(chunks)


async def _serve_then_close(quiesce_first: bool, clients: int) -> list[bytes | BaseException]:
    async def hello(_: web.Request) -> web.Response:
        return web.Response(text="hello")

    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    sockets = listener.listen("127.0.0.1", 0)
    port = sockets[0].getsockname()[1]
    for sock in sockets:
        await web.SockSite(runner, sock).start()
    # Connected and sent while the loop runs nothing else: the kernel completes the handshakes and
    # the connections wait in the accept queue, as they do when a busy loop has not accepted yet.
    queued = [_connect(port) for _ in range(clients)]
    for client in queued:
        client.sendall(REQUEST)
    assert listener.pending(sockets)
    if quiesce_first:
        assert await listener.quiesce(sockets, 5.0) == 0
    for site in list(runner.sites):
        await site.stop()
    answers = await asyncio.gather(*(asyncio.to_thread(_answer, c) for c in queued), return_exceptions=True)
    await runner.cleanup()
    return answers


#: Both event loops the runtime may run on (commands/serve.py prefers uvloop).
LOOPS = pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])


@LOOPS
def test_the_connections_queued_at_the_close_are_answered_not_reset(run):
    answers = run(_serve_then_close(quiesce_first=True, clients=5))
    assert all(isinstance(a, bytes) and a.startswith(b"HTTP/1.1 200") and a.endswith(b"hello") for a in answers), answers


@LOOPS
def test_control_closing_at_once_resets_the_queued_connections(run):
    answers = run(_serve_then_close(quiesce_first=False, clients=5))
    assert any(isinstance(a, ConnectionResetError) for a in answers), answers


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="socket filters are Linux's")
def test_once_handshakes_stop_a_new_client_waits_and_is_refused_after_the_close():
    [sock] = listener.listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    with sock:
        early = _connect(port)  # queued before: a child of the socket, untouched by the filter
        assert listener.stop_handshakes(sock) is True
        with pytest.raises(TimeoutError):
            _connect(port, timeout=0.3)  # its SYN is dropped: no answer at all, not a reset
        accepted, _ = sock.accept()
        with accepted, early:
            early.sendall(b"ping")
            accepted.settimeout(5)
            assert accepted.recv(4) == b"ping", "the queued connection still works"
    with pytest.raises(ConnectionRefusedError):
        _connect(port)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="socket filters are Linux's")
@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_the_filter_drops_only_a_new_connections_syn_so_a_handshake_under_way_completes(host):
    """The handshake's last packet is an ACK, and the listener's filter sees it: dropping it would
    leave the client sending into a connection that the close then resets. The filter is put on an
    accepted connection here, whose packets all carry ACK, to show the kernel passes them; and on a
    listener, whose SYNs it drops (the offset of the flags is the same for IPv4 and IPv6)."""
    with socket.socket(socket.getaddrinfo(host, 0)[0][0]) as sock:
        sock.bind((host, 0))
        sock.listen(8)
        port = sock.getsockname()[1]
        client = socket.create_connection((host, port), timeout=5)
        accepted, _ = sock.accept()
        with client, accepted:
            assert listener.stop_handshakes(accepted) is True
            client.sendall(b"ping")
            accepted.settimeout(5)
            assert accepted.recv(4) == b"ping", "a packet with ACK set passes the filter"
            assert listener.stop_handshakes(sock) is True
            with pytest.raises(TimeoutError):
                socket.create_connection((host, port), timeout=0.3)


def test_listen_binds_every_address_the_host_resolves_to_and_reports_a_taken_port():
    sockets = listener.listen("localhost", 0)
    try:
        assert sockets and all(s.getsockname()[1] for s in sockets)
        port = sockets[0].getsockname()[1]
        family = sockets[0].family
        with pytest.raises(OSError):
            listener.listen("127.0.0.1" if family == socket.AF_INET else "::1", port)
    finally:
        for s in sockets:
            s.close()

"""One worker process of the general render path: vLLM's own render server, on a Unix socket.

``python -m mmprep_runtime.backends.vllm.worker --socket PATH [--handoff PATH] -- MODEL [vLLM's options]``

The process builds what ``vllm launch render`` builds (vLLM's argument parser and checks, its
``VllmConfig`` with quantization cleared, its FastAPI app and render state: chat template,
renderer, multimodal processor, kwargs encoding) and serves it with uvicorn on ``PATH`` instead
of a TCP port. Every answer, error answers included, is therefore vLLM's own, computed by the
installed vLLM's code: the general path is correct by construction and follows vLLM's version.

With ``--handoff``, the same app also takes requests handed over with their client's connection
(``handoff``): it is called in this process as uvicorn would call it, and its answer's body is
written straight into the client's socket. The HTTP socket stays for health checks and the
calibration's load. Either way the answer is written as vLLM writes it, with its megabytes of
base64 spliced in rather than passed through a JSON encoder (``answer_splice``). A streamed derender
with a parser continues the parser this process kept from the stream's previous call, where vLLM
replays every output id (``parsed_streams``).

Why processes and not threads: vLLM runs a model's multimodal processing on one thread fixed in
its code, and that processing holds the GIL for most of its time (``worker_pool`` measures the
share). Threads inside one such process cannot add throughput; processes can, one core each.
``worker_pool`` starts, watches and leases these processes; ``backends.vllm.forwarding`` forwards requests.

vLLM is imported only here (and in ``vllm_pool.vllm_version``): the rest of the runtime runs
without it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import socket
import sys
from typing import Any

from mmprep_runtime.backends.vllm import answer_splice, audio_backends, handoff, parsed_streams, reasoning_count

logger = logging.getLogger(__name__)


def _vllm_args(argv: list[str]) -> argparse.Namespace:
    """vLLM's own parser and checks, as ``vllm launch render`` applies them."""
    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    except ModuleNotFoundError:  # vLLM 0.32 keeps them with its launchers
        from vllm.entrypoints.launchers.cli_args import (
            make_arg_parser,
            validate_parsed_serve_args,
        )
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="mmprep-runtime vllm worker"))
    args = parser.parse_args(argv)
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    validate_parsed_serve_args(args)
    namespace: argparse.Namespace = args
    return namespace


async def _build_app(args: argparse.Namespace) -> Any:
    """The render server's app and state, built the way vLLM's render launcher builds them."""
    from vllm import AsyncEngineArgs, envs
    from vllm.config import VllmConfig
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.render.app_state import init_render_app_state

    engine_args = AsyncEngineArgs.from_cli_args(args)
    model_config = engine_args.create_model_config()
    # As vLLM's launcher: rendering runs no kernels, so no quantization checks, and no KV cache.
    model_config.quantization = None
    envs.VLLM_CPU_KVCACHE_SPACE = 0
    vllm_config = VllmConfig(
        model_config=model_config,
        logging_config=engine_args.create_logging_config(),
        structured_outputs_config=engine_args.create_structured_outputs_config(),
    )
    app = build_app(args, ("render",))
    # Before the state is built: its derenderer binds the method it wraps when it is made.
    parsed_streams.install()  # the same parsed stream answers, without replaying every output id
    await init_render_app_state(vllm_config, app.state, args)
    answer_splice.install()  # the same answers, without their megabytes through a JSON encoder
    audio_backends.install()  # the same audio decoding, without a failed torchcodec load per clip
    reasoning_count.install(app, getattr(args, "reasoning_parser", None))  # the front's usage details
    return app


async def _call_app(app: Any, request: dict[str, Any], body: bytes) -> tuple[int, list[list[str]], bytes]:
    """The app's answer to one request, called as an ASGI server calls it: status, headers, body."""
    path = str(request["path"])
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": str(request["method"]),
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(str(k).lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in request["headers"]],
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 0),
    }
    answered = asyncio.Event()
    body_given = False
    start: dict[str, Any] = {}
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await answered.wait()  # as a server does: "disconnected" only once the answer is out
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
        elif message["type"] == "http.response.body":
            chunks.append(bytes(message.get("body", b"")))
            if not message.get("more_body"):
                answered.set()

    try:
        await app(scope, receive, send)
    except Exception:  # noqa: BLE001 - as uvicorn: an app that raised before answering is a 500
        if not start:
            logger.exception("the render app raised")
            return 500, [["content-type", "text/plain; charset=utf-8"]], b"Internal Server Error"
        logger.exception("the render app raised after answering")
    finally:
        answered.set()
    headers = [[k.decode("latin-1"), v.decode("latin-1")] for k, v in start.get("headers", [])]
    headers = [[k, v] for k, v in headers if k.lower() not in handoff.HOP_HEADERS]
    return int(start.get("status", 500)), headers, b"".join(chunks)


async def _take_handoff(app: Any, conversation: socket.socket) -> None:
    """One handed-over request: run it, report the answer, write its body to the client on GO."""
    loop = asyncio.get_running_loop()
    client = None
    try:
        first, client = await handoff.receive_socket(conversation)
        request, rest = await handoff.read_frame(conversation, first)
        body = await handoff.read_exactly(conversation, int(request["length"]), rest)
        if client is None:
            raise handoff.HandoffError("no client socket came with the request")
        status, headers, answer = await _call_app(app, request, body)
        await loop.sock_sendall(conversation, handoff.frame({"status": status, "headers": headers, "length": len(answer)}))
        if await handoff.read_byte(conversation) != handoff.GO:
            return  # the front gave up on it (its deadline, its client gone): nothing is written
        try:
            # The front's socket is non-blocking already (one open file, shared): nothing to set.
            await loop.sock_sendall(client, answer)
            outcome = handoff.DONE
        except OSError:
            outcome = handoff.FAILED
        await loop.sock_sendall(conversation, outcome)
    except (OSError, ValueError, KeyError, handoff.HandoffError) as exc:
        logger.warning("a handed-over request was dropped: %s", exc)
    finally:
        if client is not None:
            client.close()  # this process's copy only: the front still holds the connection
        conversation.close()


def _remove_stale(path: str) -> None:
    """A socket left at ``path`` by a worker that died: this one replaces it."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _listen(path: str) -> socket.socket:
    _remove_stale(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(128)
    listener.setblocking(False)
    return listener


async def _serve_handoffs(app: Any, listener: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    running: set[asyncio.Task[None]] = set()
    while True:
        conversation, _ = await loop.sock_accept(listener)
        conversation.setblocking(False)
        task = asyncio.create_task(_take_handoff(app, conversation))
        running.add(task)
        task.add_done_callback(running.discard)


async def _serve(socket_path: str, handoff_path: str | None, args: argparse.Namespace) -> None:
    import uvicorn

    app = await _build_app(args)
    _remove_stale(socket_path)
    config = uvicorn.Config(app, uds=socket_path, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    # The handoff socket listens before the HTTP one answers /health: ready means both are.
    handoffs = asyncio.create_task(_serve_handoffs(app, _listen(handoff_path))) if handoff_path else None
    # The parent owns the signals: SIGTERM reaches a worker only when the pool stops it.
    try:
        await server.serve()
    finally:
        if handoffs is not None:
            handoffs.cancel()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: python -m mmprep_runtime.backends.vllm.worker --socket PATH -- MODEL [vLLM options]", file=sys.stderr)
        return 2
    split = argv.index("--")
    ours = argparse.ArgumentParser(prog="mmprep-runtime vllm worker")
    ours.add_argument("--socket", required=True)
    ours.add_argument("--handoff", help="also take requests handed over with their client's connection, on this socket")
    mine = ours.parse_args(argv[:split])
    args = _vllm_args(argv[split + 1 :])
    try:
        import uvloop

        uvloop.run(_serve(mine.socket, mine.handoff, args))
    except ImportError:
        asyncio.run(_serve(mine.socket, mine.handoff, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

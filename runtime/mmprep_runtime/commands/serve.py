"""``mmprep-runtime serve``: run the server until SIGTERM, then shut down gracefully.

On SIGTERM (what Kubernetes sends before killing a pod) or SIGINT the server drains
(``server.drain``): readiness turns 503 at once while requests are still served for the drain
window (``--drain-seconds``; a SIGUSR1, which the pod's preStop hook sends, begins it earlier and
SIGTERM then waits only for what is left of it), then the listening socket closes, in-flight requests finish (up to
``--shutdown-timeout``), the pools stop, and the process exits 0. A second signal skips what is
left of the drain. A processor that fails to load exits 1, and a
CUDA device that cannot be started or warmed exits 3, with the reason on stderr and, given
``--termination-log``, in that file (Kubernetes shows it as the container's termination message,
and the operator reports it in the resource's status).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, Final

from aiohttp import web

from mmprep_runtime import contract, exits
from mmprep_runtime.engine import cuda
from mmprep_runtime.server import listener
from mmprep_runtime.server import logs as server_logs
from mmprep_runtime.server import state as server_state
from mmprep_runtime.server.app import create_app
from mmprep_runtime.settings import ServeSettings, SettingsError, serve_settings_from_args

logger = logging.getLogger("mmprep_runtime.serve")

EXIT_LOAD_FAILED = exits.EXIT_LOAD_FAILED
EXIT_USAGE = exits.EXIT_USAGE
EXIT_DEVICE_FAILED = exits.EXIT_DEVICE_FAILED


#: Seconds aiohttp may take to finish what is left on its connections after the in-flight wait
#: (the probes' and metrics' answers; handlers cut off at the timeout are cancelled then).
SERVER_STOP_SECONDS: Final = 1.0


async def run_server(
    settings: ServeSettings, stop: asyncio.Event | None = None, termination_log: str | None = None, *, access_log: bool = False
) -> int:
    app = create_app(settings)
    state = app[server_state.STATE]
    # No access log unless asked for (server/logs.py says why); /metrics counts requests by outcome.
    # Handler cancellation: when a client goes away, its request gives up its slot and its job is
    # dropped if no worker has started it, instead of being processed for nobody.
    runner = web.AppRunner(
        app,
        handle_signals=False,
        shutdown_timeout=SERVER_STOP_SECONDS,
        access_log=logging.getLogger(server_logs.ACCESS_LOGGER) if access_log else None,
        access_log_class=server_logs.AccessLog,
        handler_cancellation=True,
    )
    await runner.setup()
    # The sockets are made here rather than by the site so that the drain can stop new handshakes
    # on them before they close (server/listener.py says why).
    sockets = listener.listen(settings.host, settings.port)
    sites = [web.SockSite(runner, sock) for sock in sockets]
    for site in sites:
        await site.start()
    logger.info("listening on %s:%d", settings.host, settings.port)

    stop = stop or asyncio.Event()
    # A second signal (a person pressing Ctrl-C again) cuts the drain short.
    hurry = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: hurry.set() if stop.is_set() else stop.set())
    # The pod's preStop hook begins the drain before SIGTERM (``server.drain``): the window is then
    # spent with the process aware of it, and SIGTERM finds it over.
    loop.add_signal_handler(DRAIN_SIGNAL, begin_drain, state, f"the preStop hook (SIG{contract.DRAIN_SIGNAL})")

    failed = asyncio.create_task(state.settled.wait())
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({failed, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not stop.is_set() and state.startup_error is None:
            await stopping  # ready: serve until told to stop
        exit_code = 0
        if state.startup_error is not None:
            exit_code = EXIT_DEVICE_FAILED if isinstance(state.startup_error, cuda.CudaUnavailable) else EXIT_LOAD_FAILED
            exits.write_termination_message(termination_log, str(state.startup_error))
        await drain(state, sockets, runner, hurry)
    finally:
        failed.cancel()
        stopping.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT, DRAIN_SIGNAL):
            loop.remove_signal_handler(sig)
    await runner.cleanup()
    logger.info(
        "stopped: %d request(s) served and %d refused (retryable 503) since the drain began",
        state.drain.served,
        state.drain.refused,
    )
    return exit_code


#: What the preStop hook sends (``contract.DrainEnv.pre_stop``).
DRAIN_SIGNAL: Final = signal.Signals[f"SIG{contract.DRAIN_SIGNAL}"]
#: At most this long to accept the connections queued when the listener stops taking new ones.
LISTENER_QUIESCE_SECONDS: Final = 1.0
#: Then this long for a connection accepted a moment ago to deliver its request before the idle
#: connections close: a connection that has sent nothing yet counts as idle, and closing it under a
#: client that is about to send resets that client's request instead of answering it 503.
FIRST_REQUEST_GRACE_SECONDS: Final = 0.25


async def _until(event: asyncio.Event, timeout: float) -> None:
    """Wait ``timeout`` seconds, or less when ``event`` is set first."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)


def begin_drain(state: server_state.ServerState, by: str) -> None:
    """Not ready from now on, still serving, every answer closing its connection; a no-op once begun."""
    if state.drain.begin(time.monotonic()):
        state.metrics.draining.set(1)
        logger.info("drain begun by %s: not ready, still serving", by)


async def drain(
    state: server_state.ServerState, sockets: Sequence[socket.socket], runner: web.BaseRunner, hurry: asyncio.Event
) -> None:
    """The drain (``server.drain`` has the phases and why): not ready while serving for the window,
    then the listener and idle connections closed (the queue of connections accepted first), then
    the requests in flight finished, at most the shutdown timeout. Each phase is logged; ``hurry``
    (a second signal) skips what is left."""
    load = state.settings.load
    begin_drain(state, "SIGTERM")
    # A pod that never became ready was in no endpoints: nothing can be on its way to it. A drain
    # begun by the preStop hook has spent its window (or part of it) already.
    window = load.drain_s if state.engine is not None else 0.0
    spent = time.monotonic() - (state.drain.began_at or time.monotonic())
    left = max(0.0, window - spent)
    if left:
        in_flight = server_state.in_flight(state)
        logger.info("draining: not ready, still serving for %.3g s more, %d request(s) in flight", left, in_flight)
    elif window:
        logger.info("draining: the window (%g s) was spent since the preStop hook began the drain", window)
    else:
        logger.info("draining: not ready, no drain window (--drain-seconds 0, or never ready)")
    await _until(hurry, left)
    state.drain.close()
    if not hurry.is_set():
        await listener.quiesce(sockets, LISTENER_QUIESCE_SECONDS)
        await _until(hurry, FIRST_REQUEST_GRACE_SECONDS)
    for site in list(runner.sites):
        await site.stop()
    if runner.server is not None:
        # Idle keep-alive connections close now; busy ones after their answer (Connection: close).
        runner.server.pre_shutdown()
    in_flight = server_state.in_flight(state)
    logger.info(
        "drain window over: listener closed, refusing new requests, finishing %d in flight (at most %g s)",
        in_flight,
        load.shutdown_grace_s,
    )
    if in_flight:
        finished = asyncio.create_task(server_state.drained(state, load.shutdown_grace_s))
        hurried = asyncio.create_task(hurry.wait())
        await asyncio.wait({finished, hurried}, return_when=asyncio.FIRST_COMPLETED)
        hurried.cancel()
        if not finished.done() or not finished.result():
            finished.cancel()
            logger.warning(
                "shutdown timeout over with %d request(s) still in flight: they are cut off", server_state.in_flight(state)
            )
        else:
            logger.info("every request in flight finished")
    state.drain.stop()


def run_event_loop(main_coroutine: Coroutine[Any, Any, int]) -> int:
    """Run the server on uvloop when it is installed (the runtime extra has it), else on asyncio.

    The event loop holds the GIL while it reads request bodies and writes answers, and every
    millisecond it holds is a millisecond a worker may wait for. uvloop does the same work in less
    time: at 2 workers on 2 cores, 3% more requests per second through HTTP (benchmarks/runtime).
    """
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main_coroutine)
    return uvloop.run(main_coroutine)


def log_choices(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[str, bool]:
    """(log format, access log): the flag, else the env, else text and off."""
    log_format = args.log_format or environ.get("MMPREP_LOG_FORMAT") or "text"
    if log_format not in server_logs.FORMATS:
        raise SettingsError(f"MMPREP_LOG_FORMAT must be one of {', '.join(server_logs.FORMATS)}, not {log_format!r}")
    access = args.access_log if args.access_log is not None else environ.get("MMPREP_ACCESS_LOG", "0") == "1"
    return log_format, access


def main(args: argparse.Namespace) -> int:
    try:
        log_format, access_log = log_choices(args, os.environ)
    except SettingsError as exc:
        print(f"mmprep-runtime serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    server_logs.configure(str(args.log_level), log_format)
    try:
        settings = serve_settings_from_args(args, os.environ)
        # A bad device setting fails the start on any path: ignored on the CPU path, it would
        # surface only when the pod lands on a GPU.
        cuda.device_index(os.environ)
    except (SettingsError, cuda.CudaUnavailable) as exc:
        print(f"mmprep-runtime serve: {exc}", file=sys.stderr)
        exits.write_termination_message(args.termination_log, str(exc))
        return EXIT_DEVICE_FAILED if isinstance(exc, cuda.CudaUnavailable) else EXIT_USAGE
    code = run_event_loop(run_server(settings, termination_log=args.termination_log, access_log=access_log))
    if code in (EXIT_LOAD_FAILED, EXIT_DEVICE_FAILED):
        print("mmprep-runtime serve: the processor could not be started; the reason is logged above", file=sys.stderr)
    return code

"""The vLLM engines behind the OpenAI front: which one takes a generate request, whether each is
up, and what each did (``/v1/info`` and the metrics).

An engine is ``vllm serve MODEL --enable-scale-out``: ``POST /inference/v1/generate`` takes what
the render produced and answers token ids, whole or as server-sent events. A request goes to the
engine with the fewest of this server's requests in flight, among those not known to be down.
An engine is down when it refused a connection (or did not accept one within the connect timeout)
or its ``/health`` did not answer 200; it is skipped until its health check passes again, which
runs in the background every few seconds. When every engine is down the request is tried on each
once more (a refused connection costs microseconds, and a health check may lag an engine that is
back) before it is answered 503: the bound is the connect timeout per engine tried, never a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from mmprep_runtime import errors
from mmprep_runtime.settings import EngineSettings

logger = logging.getLogger(__name__)

GENERATE_PATH: Final = "/inference/v1/generate"
HEALTH_PATH: Final = "/health"
#: Seconds a health check may take; an engine busy generating still answers /health at once.
_HEALTH_TIMEOUT_S: Final = 2.0
# A token takes milliseconds to a second; a whole answer seconds to minutes.
_TOKEN_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_ANSWER_BUCKETS: Final = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class EngineUnavailable(errors.NotReady):
    """No engine took the request: each refused it, did not connect in time, or is down."""

    code = "engine_unavailable"


class EngineFailed(errors.RequestError):
    """The engine accepted the request and then failed it: it closed the connection, timed out,
    or answered something that is not its API's."""

    status = 502
    code = "engine_failed"


@dataclasses.dataclass
class Engine:
    """One engine as this server sees it."""

    url: str
    in_flight: int = 0
    #: Set when a connection failed or a health check did; cleared by a passing health check.
    down: bool = False
    #: What the last failure was (a connection's or a health check's), for ``/v1/info``.
    last_error: str | None = None
    checked_at: float | None = None
    requests: int = 0
    failures: int = 0

    def info(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "up": not self.down,
            "in_flight": self.in_flight,
            "requests": self.requests,
            "failures": self.failures,
            "last_error": self.last_error,
        }


class EngineMetrics:
    """Per engine: requests by outcome, time to the first event and to the whole answer, whether
    it is up and what is in flight there."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "mmprep_engine_requests",
            "Generate requests sent to each engine, by outcome",
            ["engine", "outcome"],
            registry=registry,
        )
        self.first_event_seconds = Histogram(
            "mmprep_engine_time_to_first_token_seconds",
            "From sending a generate request to the engine's first answer byte (its first token when streamed)",
            ["engine"],
            buckets=_TOKEN_BUCKETS,
            registry=registry,
        )
        self.answer_seconds = Histogram(
            "mmprep_engine_answer_seconds",
            "From sending a generate request to the engine's last answer byte",
            ["engine"],
            buckets=_ANSWER_BUCKETS,
            registry=registry,
        )
        self.up = Gauge("mmprep_engine_up", "1 while the engine is taken to be up", ["engine"], registry=registry)
        self.in_flight = Gauge("mmprep_engine_in_flight", "This server's requests at the engine", ["engine"], registry=registry)


class Generation:
    """One generate request at one engine: the answer's status and headers, then its body (whole,
    or event by event); the caller closes it (``async with``), which closes the connection, and
    an engine stops generating for a request whose connection closed."""

    def __init__(self, pool: EnginePool, engine: Engine, response: aiohttp.ClientResponse, sent: float) -> None:
        self.engine = engine
        self.status = response.status
        self.content_type = response.content_type
        self._pool = pool
        self._response = response
        self._sent = sent
        self._first_seen = False
        self._complete = False
        self._outcome = "ok" if response.status == 200 else f"http_{response.status}"

    def _first_byte(self) -> None:
        if not self._first_seen:
            self._first_seen = True
            self._pool.metrics.first_event_seconds.labels(self.engine.url).observe(time.perf_counter() - self._sent)

    async def read(self) -> bytes:
        """The whole body (a non-streamed answer, or an error)."""
        try:
            body = await self._response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._outcome = "failed"
            raise EngineFailed(f"the engine {self.engine.url} failed while answering: {_describe(exc)}") from None
        self._first_byte()
        return body

    async def events(self) -> AsyncIterator[bytes]:
        """The JSON of each server-sent event, as it arrives, until ``data: [DONE]``; EngineFailed
        when the stream ends without it (the engine died, or the timeout cut it)."""
        try:
            async for line in self._response.content:
                self._first_byte()
                if not line.startswith(b"data:"):
                    continue  # blank separators, comments, other fields: not vLLM's payload
                data = line[5:].strip()
                if data == b"[DONE]":
                    self._complete = True
                    return
                yield data
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._outcome = "failed"
            raise EngineFailed(f"the engine {self.engine.url} stopped mid-answer: {_describe(exc)}") from None
        self._outcome = "failed"
        raise EngineFailed(f"the engine {self.engine.url} ended its answer without [DONE]")

    def close(self) -> None:
        if self._outcome == "ok" and not self._complete and not self._response.content.at_eof():
            self._outcome = "abandoned"  # closed before its end: the client went, or a derender failed
        self._response.close()
        self._pool.finished(self.engine, self._outcome, time.perf_counter() - self._sent)


def _in_flight(engine: Engine) -> float:
    return engine.in_flight


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class EnginePool:
    """The engines, their background health checks, and the choice of one per request."""

    def __init__(self, settings: EngineSettings, registry: CollectorRegistry) -> None:
        if not settings.urls:
            raise ValueError("an engine pool needs at least one engine URL")
        self.settings = settings
        self.engines = [Engine(url) for url in settings.urls]
        self.metrics = EngineMetrics(registry)
        for engine in self.engines:
            self.metrics.up.labels(engine.url).set(1)
            self.metrics.in_flight.labels(engine.url).set_function(functools.partial(_in_flight, engine))
        self._session: aiohttp.ClientSession | None = None
        self._checks: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Open the connection pool and start the health checks (from the event loop)."""
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.settings.timeout_s, sock_connect=self.settings.connect_timeout_s),
            # Generate answers are JSON or SSE as the engine wrote them: nothing to decompress.
            auto_decompress=False,
            # A connection per request: a kept-alive one that the engine closed while idle fails the
            # next request mid-write, which cannot be told from one the engine may be generating
            # (so it could not go to another engine). A connect costs a fraction of a millisecond
            # beside seconds of generation.
            connector=aiohttp.TCPConnector(limit=0, force_close=True),
        )
        self._checks = asyncio.create_task(self._check_forever())

    async def close(self) -> None:
        if self._checks is not None:
            self._checks.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checks
        if self._session is not None:
            await self._session.close()

    def info(self) -> list[dict[str, Any]]:
        return [engine.info() for engine in self.engines]

    def _candidates(self) -> list[Engine]:
        """The engines to try in turn: the live ones by fewest in flight, then the down ones."""
        order = sorted(range(len(self.engines)), key=lambda i: (self.engines[i].down, self.engines[i].in_flight, i))
        return [self.engines[i] for i in order]

    def _mark_down(self, engine: Engine, why: str) -> None:
        if not engine.down:
            logger.warning("engine %s is down: %s", engine.url, why)
        engine.down = True
        engine.last_error = why
        self.metrics.up.labels(engine.url).set(0)

    def _mark_up(self, engine: Engine) -> None:
        if engine.down:
            logger.info("engine %s is up again", engine.url)
        engine.down = False
        self.metrics.up.labels(engine.url).set(1)

    @contextlib.asynccontextmanager
    async def generate(self, body: bytes, headers: Mapping[str, str]) -> AsyncIterator[Generation]:
        """A generate request with ``body`` on one engine; its answer is read inside the block."""
        if self._session is None:
            raise RuntimeError("the engine pool was not started")
        tried = []
        for engine in self._candidates():
            sent = time.perf_counter()
            engine.in_flight += 1
            try:
                response = await self._session.post(engine.url + GENERATE_PATH, data=body, headers=dict(headers))
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
                # Nothing reached the engine: another may take the request.
                engine.in_flight -= 1
                why = _describe(exc)
                self._mark_down(engine, why)
                self.metrics.requests.labels(engine.url, "not_connected").inc()
                engine.failures += 1
                tried.append(f"{engine.url}: {why}")
                continue
            except (aiohttp.ClientError, TimeoutError) as exc:
                # Sent, and lost before an answer: the engine may be generating it, so it is not
                # sent again (twice the work, or two different answers).
                self.finished(engine, "failed", time.perf_counter() - sent)
                raise EngineFailed(f"the engine {engine.url} failed before answering: {_describe(exc)}") from None
            engine.requests += 1
            generation = Generation(self, engine, response, sent)
            try:
                yield generation
            finally:
                generation.close()
            return
        raise EngineUnavailable(
            f"no engine took the request (each was tried once, {self.settings.connect_timeout_s:g} s to connect at most): "
            + "; ".join(tried),
            headers={"Retry-After": "1"},
        )

    def finished(self, engine: Engine, outcome: str, seconds: float) -> None:
        engine.in_flight -= 1
        if outcome not in ("ok", "abandoned"):
            engine.failures += 1
        self.metrics.requests.labels(engine.url, outcome).inc()
        self.metrics.answer_seconds.labels(engine.url).observe(seconds)

    async def _check(self, engine: Engine) -> None:
        assert self._session is not None
        try:
            timeout = aiohttp.ClientTimeout(total=_HEALTH_TIMEOUT_S)
            async with self._session.get(engine.url + HEALTH_PATH, timeout=timeout) as answer:
                healthy, why = answer.status == 200, f"/health answered {answer.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            healthy, why = False, f"/health: {_describe(exc)}"
        engine.checked_at = time.time()
        if healthy:
            self._mark_up(engine)
        else:
            self._mark_down(engine, why)

    async def _check_forever(self) -> None:
        while True:
            await asyncio.gather(*(self._check(engine) for engine in self.engines))
            await asyncio.sleep(self.settings.health_interval_s)

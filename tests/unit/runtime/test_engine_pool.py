"""The engines behind the OpenAI front (``generation.engines``) and their settings: which engine a
generate request goes to, an engine that refuses connections or does not accept them in time, one
that comes back, one that fails mid-answer, and what ``info()`` and the metrics say of each.

The engines are real HTTP servers on 127.0.0.1 (``support.fake_vllm_engine``) answering as vLLM's
``/inference/v1/generate`` and ``/health`` do; a refusing engine is a port bound and not listening.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Callable

import pytest
from prometheus_client import CollectorRegistry
from support.fake_vllm_engine import (
    FakeEngine,
    answer_cut_body,
    answer_events,
    answer_json,
    answer_nothing,
    bound_socket,
    generate_response,
    url_of,
)

from mmprep_runtime import cli, settings
from mmprep_runtime.generation.engines import EngineFailed, EnginePool, EngineUnavailable
from mmprep_runtime.settings import EngineSettings, SettingsError

WAIT_S = 5.0
JSON = {"Content-Type": "application/json"}
BODY = b'{"request_id": "chatcmpl-1", "token_ids": [1, 2], "sampling_params": {"max_tokens": 3}, "stream": false}'


async def _until(condition: Callable[[], bool], timeout: float = WAIT_S) -> None:
    """Wait for ``condition`` to hold, polling; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {condition}")
        await asyncio.sleep(0.01)


class Pools:
    """Pools made in a test, closed at its end (with the engines the test started)."""

    def __init__(self) -> None:
        self.closing: list[EnginePool | FakeEngine] = []
        self.registry = CollectorRegistry()

    async def engine(self, sock: socket.socket | None = None) -> FakeEngine:
        engine = await FakeEngine(sock).start()
        self.closing.append(engine)
        return engine

    async def pool(self, *urls: str, **fields: float) -> EnginePool:
        pool = EnginePool(EngineSettings(urls=urls, **fields), self.registry)  # type: ignore[arg-type]
        await pool.start()
        self.closing.append(pool)
        return pool

    def sample(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)


@pytest.fixture
async def made() -> AsyncIterator[Pools]:
    pools = Pools()
    yield pools
    for thing in reversed(pools.closing):
        await thing.close()


async def _generate_whole(pool: EnginePool) -> tuple[str, int, bytes]:
    async with pool.generate(BODY, JSON) as generation:
        return generation.engine.url, generation.status, await generation.read()


def _checked(pool: EnginePool) -> bool:
    return all(engine.checked_at is not None for engine in pool.engines)


async def test_a_request_goes_to_the_engine_with_the_fewest_in_flight(made: Pools) -> None:
    a, b = await made.engine(), await made.engine()
    gate = asyncio.Event()
    a.answer = answer_events([generate_response("g-a", [7])], gate=gate)
    b.answer = answer_json(generate_response("g-b", [8]))
    pool = await made.pool(a.url, b.url, health_interval_s=3600)
    async with pool.generate(BODY, JSON) as held:
        events = held.events()
        assert json.loads(await anext(events)) == generate_response("g-a", [7])
        assert held.engine.url == a.url  # a tie goes to the first engine
        assert pool.info()[0]["in_flight"] == 1 and made.sample("mmprep_engine_in_flight", engine=a.url) == 1
        url, status, _ = await _generate_whole(pool)
        assert (url, status) == (b.url, 200)  # A holds one: B takes the next
        assert len(a.generated) == 1 and len(b.generated) == 1
        gate.set()
        assert [event async for event in events] == []  # [DONE] ends the events
    assert [engine["in_flight"] for engine in pool.info()] == [0, 0]
    assert made.sample("mmprep_engine_in_flight", engine=a.url) == 0
    url, _, _ = await _generate_whole(pool)
    assert url == a.url  # nothing in flight anywhere: the first again
    assert [engine["requests"] for engine in pool.info()] == [2, 1]


async def test_an_engine_refusing_connections_is_skipped_and_reported_down(made: Pools) -> None:
    refusing = bound_socket()
    b = await made.engine()
    try:
        # The request is sent before any health check ran: the pool takes A to be up and tries it
        # first (a tie goes to the first engine); its refusal is what marks it down.
        pool = await made.pool(url_of(refusing), b.url, health_interval_s=3600)
        url, status, body = await _generate_whole(pool)
        assert (url, status) == (b.url, 200), body
        assert len(b.generated) == 1
        assert made.sample("mmprep_engine_requests_total", engine=url_of(refusing), outcome="not_connected") == 1
        a_info, b_info = pool.info()
        assert a_info["up"] is False and "ClientConnectorError" in a_info["last_error"], a_info
        assert a_info["failures"] >= 1 and a_info["in_flight"] == 0 and a_info["requests"] == 0
        assert b_info["up"] is True and b_info["requests"] == 1
        assert made.sample("mmprep_engine_up", engine=url_of(refusing)) == 0
        assert made.sample("mmprep_engine_up", engine=b.url) == 1
        assert made.sample("mmprep_engine_requests_total", engine=b.url, outcome="ok") == 1
        url, _, _ = await _generate_whole(pool)
        assert url == b.url  # a down engine is skipped while another is up: not tried again
        assert made.sample("mmprep_engine_requests_total", engine=url_of(refusing), outcome="not_connected") == 1
    finally:
        refusing.close()


def _not_accepting() -> tuple[socket.socket, list[socket.socket]]:
    """A listening socket whose accept queue is full (backlog 0, one connection queued, never
    accepted): the kernel drops further SYNs, so a connection to it neither opens nor is refused."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    fillers = []
    for _ in range(2):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(listener.getsockname())
        fillers.append(filler)
    return listener, fillers


async def test_no_engine_taking_the_request_is_a_503_within_the_connect_timeout(made: Pools) -> None:
    refusing = bound_socket()
    silent, fillers = _not_accepting()
    urls = url_of(refusing), url_of(silent)
    connect_timeout = 0.3
    try:
        pool = await made.pool(*urls, connect_timeout_s=connect_timeout, health_interval_s=3600)
        started = time.perf_counter()
        with pytest.raises(EngineUnavailable) as raised:
            await _generate_whole(pool)
        took = time.perf_counter() - started
    finally:
        for sock in (refusing, silent, *fillers):
            sock.close()
    assert raised.value.status == 503 and raised.value.headers == {"Retry-After": "1"}
    # Each engine tried once: the refused one at once, the silent one for the connect timeout.
    assert connect_timeout * 0.9 <= took < connect_timeout + 0.7, took
    assert urls[0] in raised.value.message and urls[1] in raised.value.message
    assert "ClientConnectorError" in raised.value.message and "ConnectionTimeoutError" in raised.value.message
    assert [engine["up"] for engine in pool.info()] == [False, False]
    assert made.sample("mmprep_engine_requests_total", engine=urls[1], outcome="not_connected") == 1


async def test_a_down_engine_is_up_again_once_its_health_check_passes(made: Pools) -> None:
    sock = bound_socket()  # A refuses until it listens on this socket
    b = await made.engine()
    pool = await made.pool(url_of(sock), b.url, health_interval_s=0.05)
    await _until(lambda: pool.info()[0]["up"] is False)
    assert "/health" in pool.info()[0]["last_error"]
    assert made.sample("mmprep_engine_up", engine=url_of(sock)) == 0
    url, _, _ = await _generate_whole(pool)
    assert url == b.url
    a = await made.engine(sock)  # A listens now
    await _until(lambda: pool.info()[0]["up"] is True)
    assert a.health_checks >= 1 and made.sample("mmprep_engine_up", engine=a.url) == 1
    url, _, _ = await _generate_whole(pool)
    assert url == a.url and len(a.generated) == 1  # a tie goes to the first engine: A takes requests again


async def test_a_health_check_answering_503_marks_the_engine_down_until_it_answers_200(made: Pools) -> None:
    a, b = await made.engine(), await made.engine()
    pool = await made.pool(a.url, b.url, health_interval_s=0.05)
    await _until(lambda: _checked(pool))
    a.health_status = 503
    await _until(lambda: pool.info()[0]["up"] is False)
    assert pool.info()[0]["last_error"] == "/health answered 503"
    url, _, _ = await _generate_whole(pool)
    assert url == b.url and a.generated == []
    a.health_status = 200
    await _until(lambda: pool.info()[0]["up"] is True)
    assert made.sample("mmprep_engine_up", engine=a.url) == 1


async def test_an_engine_closing_the_connection_mid_body_is_a_502(made: Pools) -> None:
    a, b = await made.engine(), await made.engine()
    a.answer = answer_cut_body(b'{"request_id": "g", "choi', length=1000)
    pool = await made.pool(a.url, b.url, health_interval_s=3600)
    with pytest.raises(EngineFailed) as raised:
        await _generate_whole(pool)
    assert raised.value.status == 502 and a.url in raised.value.message
    assert b.generated == []  # sent once: the engine may have been generating it
    assert pool.info()[0]["failures"] == 1 and pool.info()[0]["in_flight"] == 0
    assert made.sample("mmprep_engine_requests_total", engine=a.url, outcome="failed") == 1


async def test_an_engine_closing_the_connection_before_answering_is_a_502_not_sent_again(made: Pools) -> None:
    a, b = await made.engine(), await made.engine()
    a.answer = answer_nothing()
    pool = await made.pool(a.url, b.url, health_interval_s=3600)
    with pytest.raises(EngineFailed) as raised:
        await _generate_whole(pool)
    assert raised.value.status == 502
    assert len(a.generated) == 1 and b.generated == []
    assert pool.info()[0]["in_flight"] == 0 and pool.info()[0]["up"] is True  # it took the request: not down


async def test_a_whole_answer_counts_as_ok(made: Pools) -> None:
    a = await made.engine()
    pool = await made.pool(a.url, health_interval_s=3600)
    url, status, body = await _generate_whole(pool)
    assert (url, status) == (a.url, 200) and json.loads(body) == generate_response("generate-tokens-0", [1, 2, 3])
    assert made.sample("mmprep_engine_requests_total", engine=a.url, outcome="ok") == 1
    assert made.sample("mmprep_engine_answer_seconds_count", engine=a.url) == 1
    assert made.sample("mmprep_engine_time_to_first_token_seconds_count", engine=a.url) == 1


async def test_a_stream_ending_without_done_is_a_502(made: Pools) -> None:
    a = await made.engine()
    a.answer = answer_events([generate_response("g", [1])], done=False)
    pool = await made.pool(a.url, health_interval_s=3600)
    seen: list[bytes] = []

    async def read_events() -> None:
        async with pool.generate(BODY, JSON) as generation:
            async for event in generation.events():
                seen.append(event)

    with pytest.raises(EngineFailed, match="without \\[DONE\\]"):
        await read_events()
    assert len(seen) == 1
    assert made.sample("mmprep_engine_requests_total", engine=a.url, outcome="failed") == 1


def test_a_pool_needs_an_engine() -> None:
    with pytest.raises(ValueError, match="at least one"):
        EnginePool(EngineSettings(), CollectorRegistry())


# Settings: --engine, MMPREP_ENGINE_URLS, engine_url.


@pytest.mark.parametrize(
    ("text", "url"),
    [
        ("http://vllm-engine:8000", "http://vllm-engine:8000"),
        ("http://vllm-engine:8000/", "http://vllm-engine:8000"),
        ("  https://engine.example.com/  ", "https://engine.example.com"),
        ("http://10.0.0.7:8000/prefix/", "http://10.0.0.7:8000/prefix"),
        ("http://[::1]:8000", "http://[::1]:8000"),
    ],
)
def test_engine_url_takes_http_base_urls(text: str, url: str) -> None:
    assert settings.engine_url(text) == url


@pytest.mark.parametrize(
    "text",
    [
        "ftp://engine:8000",
        "grpc://engine:8000",
        "engine:8000",
        "//engine:8000",
        "http://",
        "http:///path",
        "http://engine:8000/?model=x",
        "http://engine:8000#frag",
        "http://engine:99999",
        "http://engine:port",
        "",
    ],
)
def test_engine_url_refuses_what_is_not_a_base_url(text: str) -> None:
    with pytest.raises(SettingsError):
        settings.engine_url(text)


def _serve_args(*extra: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["serve", "--model", "m", *extra])


def test_engines_come_from_repeated_flags_and_duplicates_are_dropped() -> None:
    args = _serve_args("--engine", "http://a:8000/", "--engine", "http://b:8000", "--engine", "http://a:8000")
    engines = settings.engine_settings_from_args(args, {})
    assert engines.urls == ("http://a:8000", "http://b:8000")


def test_engines_come_from_the_env_and_flags_win_over_it() -> None:
    env = {"MMPREP_ENGINE_URLS": "  http://c:8000 http://c:8000/\thttp://d:8000  "}
    from_env = settings.engine_settings_from_args(_serve_args(), env)
    assert from_env.urls == ("http://c:8000", "http://d:8000")
    flagged = settings.engine_settings_from_args(_serve_args("--engine", "http://a:8000"), env)
    assert flagged.urls == ("http://a:8000",)
    assert settings.serve_settings_from_args(_serve_args(), env).engines.urls == from_env.urls


def test_no_engine_given_is_no_engines_and_a_bad_one_is_refused() -> None:
    assert settings.engine_settings_from_args(_serve_args(), {}).urls == ()
    assert settings.engine_settings_from_args(_serve_args(), {"MMPREP_ENGINE_URLS": "  "}).urls == ()
    with pytest.raises(SettingsError):
        settings.engine_settings_from_args(_serve_args(), {"MMPREP_ENGINE_URLS": "http://a:8000 a:8000"})
    with pytest.raises(SettingsError):
        settings.engine_settings_from_args(_serve_args("--engine", "file:///tmp/x"), {})


def test_engine_timeout_is_taken_when_positive() -> None:
    engines = settings.engine_settings_from_args(_serve_args("--engine", "http://a:1", "--engine-timeout", "30"), {})
    assert engines.timeout_s == 30.0
    with pytest.raises(SettingsError, match="--engine-timeout"):
        settings.engine_settings_from_args(_serve_args("--engine-timeout", "0"), {})


# Failing: runtime bugs reported, not fixed here.


async def test_a_stream_read_to_its_done_counts_as_ok_not_abandoned(made: Pools) -> None:
    a = await made.engine()
    a.answer = answer_events([generate_response("g", [1]), generate_response("g", [2])])
    pool = await made.pool(a.url, health_interval_s=3600)
    async with pool.generate(BODY, JSON) as generation:
        assert len([event async for event in generation.events()]) == 2
    assert made.sample("mmprep_engine_requests_total", engine=a.url, outcome="abandoned") is None
    assert made.sample("mmprep_engine_requests_total", engine=a.url, outcome="ok") == 1


async def test_an_engine_gone_since_its_last_check_is_skipped_not_a_502(made: Pools) -> None:
    a, b = await made.engine(), await made.engine()
    pool = await made.pool(a.url, b.url, health_interval_s=3600)
    await _until(lambda: _checked(pool))  # both checked: the pool holds a keep-alive connection to each
    await a.close()  # A goes (its connections closed, its port refusing); the pool still takes it to be up
    url, status, body = await _generate_whole(pool)
    assert (url, status) == (b.url, 200), body  # the request never reached A: B may take it
    assert pool.info()[0]["up"] is False


async def test_an_http_client_of_a_tier_whose_engines_are_all_down_gets_a_503_in_openais_error_shape(serve, qwen_dir) -> None:
    """Through the real app (render in-process, the engine pool, the OpenAI route): a JSON 503
    with Retry-After within the connect timeout per engine, and the render pool serves on."""
    from mmprep_runtime.settings import ModelSettings, ServeSettings

    refusing = bound_socket()
    silent, fillers = _not_accepting()
    connect_timeout = 0.3
    engines = EngineSettings(urls=(url_of(refusing), url_of(silent)), connect_timeout_s=connect_timeout, health_interval_s=3600)
    try:
        served = await serve(ServeSettings(ModelSettings(str(qwen_dir)), engines=engines))
        body = {"model": str(qwen_dir), "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        for path in ("/v1/chat/completions", "/v1/completions"):
            asked = body if path.endswith("chat/completions") else {"model": str(qwen_dir), "prompt": "Hi", "max_tokens": 2}
            started = time.perf_counter()
            async with served.client.post(served.url + path, json=asked) as response:
                status, headers, answer = response.status, response.headers, await response.json()
            took = time.perf_counter() - started
            assert status == 503 and headers["Retry-After"] == "1", answer
            assert set(answer) == {"error"} and answer["error"]["code"] == 503, answer
            assert {"message", "type", "param", "code"} <= set(answer["error"]) and url_of(silent) in answer["error"]["message"]
            assert took < 2 * connect_timeout + 2.0, took
        async with served.client.post(served.url + "/v1/chat/completions/render", json=body) as response:
            assert response.status == 200, "the render serves on"
    finally:
        for sock in (refusing, silent, *fillers):
            sock.close()

"""The drain from SIGTERM to exit (``server.drain``): not ready at once, still serving through the
window with every connection closed after its answer, then refusing with a retryable 503 while
in-flight requests finish, then exit 0. In-process for each phase's answers on both APIs; in the
real ``serve`` process, under a steady load with slow requests in flight, for the whole sequence.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from conftest import QWEN_TEXT, b64
from support.kube import wait_for
from support.load_client import FAILED, NOT_DELIVERED, OK, RETRYABLE, Load
from support.servers import free_port, runtime_command

from mmprep_runtime import cli
from mmprep_runtime.server.drain import Drain, Phase
from mmprep_runtime.settings import SettingsError, serve_settings_from_args
from mmprep_runtime.synthetic import media, models
from mmprep_runtime.synthetic.media import jpeg

# ------------------------------------------------------------------------------ the phases


def test_the_phases_only_move_forward_and_say_what_each_allows():
    drain = Drain()
    assert (drain.phase, drain.ready, drain.admits, drain.closes_connections) == (Phase.SERVING, True, True, False)
    drain.answered(refused=False)
    assert drain.served == 0, "answers before the drain are not the drain's"
    assert drain.begin() is True
    assert (drain.ready, drain.admits, drain.closes_connections) == (False, True, True)
    assert drain.begin() is False, "a second SIGTERM does not restart the drain"
    drain.answered(refused=False)
    assert drain.close() is True
    assert (drain.ready, drain.admits, drain.closes_connections) == (False, False, True)
    drain.answered(refused=True)
    assert drain.begin() is False and drain.phase is Phase.CLOSING, "never back"
    assert drain.stop() is True and drain.stop() is False
    assert (drain.served, drain.refused) == (1, 1)


def test_a_drain_without_a_window_goes_straight_to_closing():
    drain = Drain()
    assert drain.close() is True and drain.phase is Phase.CLOSING and drain.begin() is False


# ------------------------------------------------------------------------------ settings


def _settings(argv: list[str], environ: dict[str, str]):
    return serve_settings_from_args(cli.build_parser().parse_args(["serve", "--model", "m", *argv]), environ)


def test_drain_and_shutdown_timeout_come_from_the_flag_then_the_env_then_the_default():
    default = _settings([], {}).load
    assert (default.drain_s, default.shutdown_grace_s) == (0.0, 25.0)
    env = {"MMPREP_DRAIN_SECONDS": "10", "MMPREP_SHUTDOWN_TIMEOUT_SECONDS": "30"}
    assert (_settings([], env).load.drain_s, _settings([], env).load.shutdown_grace_s) == (10.0, 30.0)
    flags = _settings(["--drain-seconds", "2.5", "--shutdown-timeout", "4"], env).load
    assert (flags.drain_s, flags.shutdown_grace_s) == (2.5, 4.0)


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        ([], {"MMPREP_DRAIN_SECONDS": "soon"}, "MMPREP_DRAIN_SECONDS must be a number of seconds; got 'soon'"),
        (["--drain-seconds", "-1"], {}, "--drain-seconds must be >= 0 seconds"),
        ([], {"MMPREP_SHUTDOWN_TIMEOUT_SECONDS": "0"}, "MMPREP_SHUTDOWN_TIMEOUT_SECONDS must be > 0 seconds"),
        (["--shutdown-timeout", "inf"], {}, "--shutdown-timeout must be > 0 seconds"),
    ],
)
def test_a_bad_drain_setting_is_refused_naming_it(argv, environ, message):
    with pytest.raises(SettingsError, match=message.replace("(", r"\(")):
        _settings(argv, environ)


# ------------------------------------------------------------------------------ each phase's answers


def _chat_body() -> dict:
    uri = f"data:image/jpeg;base64,{b64(jpeg(64, 48))}"
    return {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": uri}}]}
        ]
    }


async def _post(running, path: str, body: dict) -> tuple[int, dict[str, str]]:
    async with running.client.post(running.url + path, json=body) as response:
        await response.read()
        return response.status, dict(response.headers)


async def test_while_draining_both_apis_serve_with_connection_close_and_readiness_says_503(start_server, qwen_dir):
    running = await start_server(qwen_dir)
    preprocess = {"text": QWEN_TEXT, "images": [b64(jpeg(64, 48))]}
    status, headers = await _post(running, "/v1/preprocess", preprocess)
    assert status == 200 and headers.get("Connection", "").lower() != "close", "keep-alive while serving"

    running.state.drain.begin()
    assert await running.json("/readyz") == (503, {"ready": False, "reason": "draining: shutting down"})
    assert await running.json("/healthz") == (200, {"status": "ok"}), "liveness stays: a draining pod is not restarted"
    async with running.client.get(running.url + "/health") as response:
        assert response.status == 503, "vLLM's readiness path agrees"
    for path, body in (("/v1/preprocess", preprocess), ("/v1/chat/completions/render", _chat_body())):
        status, headers = await _post(running, path, body)
        assert status == 200, f"{path} is still served in the window"
        assert headers["Connection"] == "close", f"{path}: the client must reconnect elsewhere"
    status, info = await running.json("/v1/info")
    assert info["ready"] is False and info["drain"] == "draining"


async def test_once_the_window_is_over_requests_are_refused_with_a_retryable_503_on_both_apis(start_server, qwen_dir):
    running = await start_server(qwen_dir)
    running.state.drain.begin()
    await _post(running, "/v1/preprocess", {"text": QWEN_TEXT, "images": [b64(jpeg(64, 48))]})
    running.state.drain.close()
    async with running.client.post(running.url + "/v1/preprocess", json={"text": "x"}) as response:
        assert response.status == 503 and response.headers["Retry-After"] == "1"
        assert response.headers["Connection"] == "close"
        assert (await response.json())["error"]["code"] == "shutting_down"
    async with running.client.post(running.url + "/v1/chat/completions/render", json=_chat_body()) as response:
        assert response.status == 503 and response.headers["Retry-After"] == "1"
        assert response.headers["Connection"] == "close"
    async with running.client.get(f"{running.url}/metrics") as response:
        metrics = await response.text()
    assert "mmprep_draining 1.0" not in metrics, "serve sets the gauge, not the state"
    assert 'mmprep_drain_requests_total{outcome="served"} 1.0' in metrics
    assert 'mmprep_drain_requests_total{outcome="refused"} 2.0' in metrics
    assert (running.state.drain.served, running.state.drain.refused) == (1, 2)


# ------------------------------------------------------------------------------ the real process

TIMEOUT = 120
DRAIN_SECONDS = 5.0


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def _metric(base: str, name: str) -> float:
    with urllib.request.urlopen(f"{base}/metrics", timeout=TIMEOUT) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"no {name}")


def _serve(model, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    """The real ``serve`` process on one processor worker, its log on stderr; and its base URL."""
    port = free_port()
    process = subprocess.Popen(
        [*runtime_command(), "serve", "--model", str(model), "--host", "127.0.0.1", "--port", str(port)],
        env={**os.environ, "MMPREP_PROCESSOR_WORKERS": "1", **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    return process, f"http://127.0.0.1:{port}"


@pytest.mark.slow
def test_serve_drains_under_load_on_sigterm_with_no_failed_request_and_exits_zero(qwen_dir):
    process, base = _serve(qwen_dir, {"MMPREP_IO_WORKERS": "2", "MMPREP_DRAIN_SECONDS": str(DRAIN_SECONDS)})
    small = json.dumps({"text": QWEN_TEXT, "images": [b64(jpeg(64, 48))]}).encode()
    # Large images on one worker: these queue behind each other and are in flight at SIGTERM.
    large = json.dumps(
        {
            "text": f"what is {models.QWEN_IMAGE_PLACEHOLDER}",
            "images": [base64.b64encode(media.jpeg(1600, 1200)).decode()],
        }
    ).encode()
    url = f"{base}/v1/preprocess"
    try:
        wait_for(lambda: process.poll() is None and _ready(base), TIMEOUT, what="the server ready", interval=0.05)
        # Keep-alive clients (as HTTP pools are) and a client opening a connection per request.
        with Load(url, small, clients=2) as steady, Load(url, small, clients=1, keep_alive=False) as fresh:
            slow = Load(url, large, clients=2)
            slow.start()
            wait_for(
                lambda: _metric(base, "mmprep_requests_in_flight") >= 2, TIMEOUT, what="slow requests in flight", interval=0.02
            )
            steady.wait_for(lambda attempts: len(attempts) >= 4, TIMEOUT)
            sigterm = time.monotonic()
            process.send_signal(signal.SIGTERM)
            wait_for(lambda: _get(f"{base}/readyz") == 503, TIMEOUT, what="readiness 503", interval=0.02)
            not_ready = time.monotonic()
            assert _get(f"{base}/healthz") == 200
            # Requests keep being served after SIGTERM: a keep-alive client's answers say so by
            # closing its connection (nothing else does; the other client closes its own).
            steady.wait_for(lambda attempts: any(a.outcome == OK and a.closed_connection for a in attempts), TIMEOUT)
            slow_tally = slow.stop()  # waits for the slow ones in flight: they must all be answered
            # The clients run on until the listener closes and no connection is accepted any more.
            for load in (steady, fresh):
                load.wait_for(lambda attempts: any(a.outcome == NOT_DELIVERED for a in attempts), TIMEOUT)
        assert process.wait(TIMEOUT) == 0
        stopped = time.monotonic()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(TIMEOUT)
        stderr = process.stderr.read().decode() if process.stderr else ""
        for stream in (process.stdout, process.stderr):
            if stream:
                stream.close()

    attempts = [*steady.tally.attempts, *fresh.tally.attempts, *slow_tally.attempts]
    failed = [a for a in attempts if a.outcome == FAILED]
    assert not failed, f"requests failed during the drain: {failed[:5]}\n{stderr}"
    assert {a.outcome for a in slow_tally.attempts} == {OK}, "every slow request in flight was answered"
    answered_draining = [a for a in steady.tally.attempts if a.sent > not_ready and a.outcome in (OK, RETRYABLE)]
    assert all(a.closed_connection for a in answered_draining), "every answer once not ready closes its connection"
    refused = [a for a in attempts if a.outcome == RETRYABLE]
    assert all(a.status == 503 and a.retry_after == 1 for a in refused), refused
    first_undelivered = min(a.sent for a in attempts if a.outcome == NOT_DELIVERED)
    assert first_undelivered - sigterm >= DRAIN_SECONDS - 0.5, "the listener stayed open through the window"
    assert stopped - sigterm < DRAIN_SECONDS + 25 + 5, "the exit came within the drain and the shutdown timeout"
    for phase in ("drain begun by SIGTERM", "still serving for 5 s more", "drain window over: listener closed", "stopped:"):
        assert phase in stderr, f"{phase!r} not logged:\n{stderr}"


#: The hook's window in the preStop test: long enough that a second window would show.
HOOK_WINDOW_SECONDS = 6.0


@pytest.mark.slow
def test_the_prestop_hooks_sigusr1_begins_the_drain_and_sigterm_then_waits_only_for_what_is_left(qwen_dir):
    process, base = _serve(qwen_dir, {"MMPREP_DRAIN_SECONDS": str(HOOK_WINDOW_SECONDS)})
    small = json.dumps({"text": QWEN_TEXT, "images": [b64(jpeg(64, 48))]}).encode()
    try:
        wait_for(lambda: process.poll() is None and _ready(base), TIMEOUT, what="the server ready", interval=0.05)
        with Load(f"{base}/v1/preprocess", small, clients=1) as steady:
            steady.wait_for(lambda attempts: len(attempts) >= 2, TIMEOUT)
            # What the operator's preStop hook does: `kill -USR1 1; sleep <window>`, then the kubelet
            # sends SIGTERM.
            hook = time.monotonic()
            process.send_signal(signal.SIGUSR1)
            wait_for(lambda: _get(f"{base}/readyz") == 503, TIMEOUT, what="readiness 503", interval=0.02)
            steady.wait_for(lambda attempts: any(a.outcome == OK and a.closed_connection for a in attempts), TIMEOUT)
            time.sleep(max(0.0, hook + HOOK_WINDOW_SECONDS - time.monotonic()))  # the hook's own sleep
            sigterm = time.monotonic()
            process.send_signal(signal.SIGTERM)
            steady.wait_for(lambda attempts: any(a.outcome == NOT_DELIVERED for a in attempts), TIMEOUT)
        assert process.wait(TIMEOUT) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(TIMEOUT)
        stderr = process.stderr.read().decode() if process.stderr else ""
        if process.stderr:
            process.stderr.close()

    attempts = steady.tally.attempts
    assert not [a for a in attempts if a.outcome == FAILED], (attempts, stderr)
    first_undelivered = min(a.sent for a in attempts if a.outcome == NOT_DELIVERED)
    assert first_undelivered - sigterm < HOOK_WINDOW_SECONDS - 1, "SIGTERM did not begin a second window"
    assert "drain begun by the preStop hook (SIGUSR1)" in stderr, stderr
    # The hook's sleep and the runtime's window end together: SIGTERM finds the window spent, or a
    # moment of it left (the signal reaches the event loop a little after the hook sent it).
    assert "drain begun by SIGTERM" not in stderr and "still serving for 6 s more" not in stderr, stderr


def _ready(base: str) -> bool:
    try:
        return _get(f"{base}/readyz") == 200
    except OSError:
        return False  # not listening yet


@pytest.mark.slow
def test_a_second_signal_cuts_a_long_drain_short(qwen_dir):
    process, base = _serve(qwen_dir, {"MMPREP_DRAIN_SECONDS": "600"})
    try:
        wait_for(lambda: process.poll() is None and _ready(base), TIMEOUT, what="the server ready", interval=0.05)
        process.send_signal(signal.SIGTERM)
        wait_for(lambda: _get(f"{base}/readyz") == 503, TIMEOUT, what="readiness 503", interval=0.02)
        process.send_signal(signal.SIGINT)  # a person pressing Ctrl-C again
        assert process.wait(60) == 0, "the 600 s window was skipped"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(TIMEOUT)
        if process.stderr:
            process.stderr.close()

"""What an operator of the runtime sees: request ids, the process's own metrics, JSON logs, the
opt-in access log, and the version, on the real app and the real command line."""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import io
import json
import logging
import re

import aiohttp
import pytest
from aiohttp import web
from conftest import QWEN_TEXT, b64
from prometheus_client.parser import text_string_to_metric_families

from mmprep_runtime import cli
from mmprep_runtime.commands import serve as serve_command
from mmprep_runtime.server import logs as server_logs
from mmprep_runtime.settings import SettingsError
from mmprep_runtime.synthetic.media import jpeg as jpeg_bytes

HEX_ID = re.compile(r"[0-9a-f]{32}")


def _id(headers: dict[str, str]) -> str:
    """The answer's request id (header names are case-insensitive; aiohttp writes X-Request-ID)."""
    return {k.lower(): v for k, v in headers.items()}["x-request-id"]


async def _get(running, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str]]:
    async with running.client.get(f"{running.url}{path}", headers=headers or {}) as response:
        await response.read()
        return response.status, dict(response.headers)


async def test_every_answer_carries_the_clients_request_id_or_a_new_one(start_server, qwen_dir):
    running = await start_server(qwen_dir)
    payload = {"text": QWEN_TEXT, "images": [b64(jpeg_bytes(64, 48))]}
    status, headers, _ = await running.post(payload, headers={"X-Request-Id": "req-42.a:b"})
    assert (status, _id(headers)) == (200, "req-42.a:b")
    status, headers, _ = await running.post(payload)
    assert status == 200 and HEX_ID.fullmatch(_id(headers)), headers
    # A 4xx of ours, and aiohttp's own 404, carry one too.
    status, headers, _ = await running.post(data=b"{not json", headers={"X-Request-Id": "bad-body"})
    assert (status, _id(headers)) == (400, "bad-body")
    status, headers = await _get(running, "/no/such/route", {"X-Request-Id": "lost"})
    assert (status, _id(headers)) == (404, "lost")
    # An id that is too long or not plain is never echoed: the answer gets a fresh one.
    for smuggled in ("x" * 129, "a b", "id;drop", "<script>"):
        status, headers = await _get(running, "/healthz", {"X-Request-Id": smuggled})
        assert status == 200 and HEX_ID.fullmatch(_id(headers)), (smuggled, headers)


async def test_metrics_carry_the_process_and_gc_collectors(start_server, qwen_dir):
    running = await start_server(qwen_dir)
    async with running.client.get(f"{running.url}/metrics") as response:
        text = await response.text()
    names = {family.name for family in text_string_to_metric_families(text)}
    assert {"process_cpu_seconds", "process_resident_memory_bytes", "python_gc_objects_collected", "python_info"} <= names
    assert "mmprep_requests" in names


def test_the_operators_metrics_carry_them_too() -> None:
    from prometheus_client import generate_latest

    from mmprep_operator.control.metrics import Metrics

    names = {f.name for f in text_string_to_metric_families(generate_latest(Metrics().registry).decode())}
    assert {"process_cpu_seconds", "python_gc_objects_collected", "mmprep_operator_reconciles"} <= names


def _record(message: str, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("mmprep_runtime.test", logging.WARNING, __file__, 1, message, (), None)
    record.__dict__.update(extra)
    return record


def test_json_logs_are_one_object_per_line_with_the_extra_fields() -> None:
    line = server_logs.JsonFormatter().format(_record("pool %s", pool="cpu", status=429))
    parsed = json.loads(line)
    assert parsed["level"] == "warning" and parsed["logger"] == "mmprep_runtime.test"
    assert parsed["message"] == "pool %s" and parsed["pool"] == "cpu" and parsed["status"] == 429
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", parsed["time"])
    with pytest.raises(ValueError, match="json"):
        server_logs.configure("INFO", "yaml")


def _serve_args(*flags: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["serve", "--model", "m", *flags])


def test_log_format_and_access_log_come_from_the_flag_then_the_env_then_the_default() -> None:
    assert serve_command.log_choices(_serve_args(), {}) == ("text", False)
    assert serve_command.log_choices(_serve_args(), {"MMPREP_LOG_FORMAT": "json", "MMPREP_ACCESS_LOG": "1"}) == ("json", True)
    assert serve_command.log_choices(_serve_args("--log-format", "text", "--access-log"), {"MMPREP_LOG_FORMAT": "json"}) == (
        "text",
        True,
    )
    with pytest.raises(SettingsError, match="MMPREP_LOG_FORMAT"):
        serve_command.log_choices(_serve_args(), {"MMPREP_LOG_FORMAT": "xml"})


async def test_the_access_log_writes_one_record_per_answer_with_its_request_id(aiohttp_free_app) -> None:
    app, log = aiohttp_free_app
    runner = web.AppRunner(app, access_log=logging.getLogger(server_logs.ACCESS_LOGGER), access_log_class=server_logs.AccessLog)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        async with (
            aiohttp.ClientSession() as client,
            client.get(f"http://{host}:{port}/ping", headers={"X-Request-Id": "r-1"}) as r,
        ):
            assert r.status == 200
        for _ in range(100):  # the record is written after the answer is sent
            if log.getvalue():
                break
            await asyncio.sleep(0.01)
    finally:
        await runner.cleanup()
    parsed = json.loads(log.getvalue().splitlines()[0])
    assert (parsed["method"], parsed["path"], parsed["status"], parsed["request_id"]) == ("GET", "/ping", 200, "r-1")
    assert parsed["ms"] >= 0


@pytest.fixture
def aiohttp_free_app():
    """A tiny app with the runtime's request-id hook, and the access log captured as JSON."""
    from mmprep_runtime.server.app import request_id

    async def ping(request: web.Request) -> web.Response:
        return web.Response(text="pong")

    app = web.Application()
    app.on_response_prepare.append(request_id)
    app.router.add_get("/ping", ping)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(server_logs.JsonFormatter())
    logger = logging.getLogger(server_logs.ACCESS_LOGGER)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield app, stream
    logger.removeHandler(handler)


def test_both_command_lines_print_the_installed_version(capsys) -> None:
    from mmprep_operator import cli as operator_cli

    version = importlib.metadata.version("mmprep")
    for parser, prog in ((cli.build_parser(), "mmprep-runtime"), (operator_cli.build_parser(), "mmprep-operator")):
        with pytest.raises(SystemExit) as done:
            parser.parse_args(["--version"])
        assert done.value.code == 0
        assert capsys.readouterr().out.strip() == f"{prog} {version}"

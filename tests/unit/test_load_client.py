"""The drain tests' load client (``support.load_client``) counts each way a request can end, and
retries only what is safe to retry: a real local server answers 200, a retryable 503, a 500, or
resets the connection, in turn."""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import load_client
from support.load_client import FAILED, NOT_DELIVERED, OK, RETRYABLE, Load
from support.servers import free_port


@pytest.fixture
def server() -> Iterator[tuple[str, list[str]]]:
    """A server answering by a script of ``ok``, ``busy`` (503 Retry-After 0), ``bug`` (500) and
    ``reset`` (closes without an answer), one per request, ``ok`` after the script ends."""
    script: list[str] = []
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            with lock:
                step = script.pop(0) if script else "ok"
            if step == "reset":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                self.close_connection = True
                return
            status, headers = {"ok": (200, {}), "busy": (503, {"Retry-After": "0"}), "bug": (500, {})}[step]
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1/preprocess", script
    httpd.shutdown()
    httpd.server_close()


def test_each_outcome_is_counted_and_only_retryable_ones_are_retried(server) -> None:
    url, script = server
    script.extend(["busy", "ok", "bug", "reset"])
    with Load(url, b"{}", clients=1, retries=2) as load:
        load.wait_for(lambda attempts: len(attempts) >= 6, 30)
    outcomes = [a.outcome for a in load.tally.attempts[:5]]
    assert outcomes == [RETRYABLE, OK, FAILED, FAILED, OK]
    assert load.tally.attempts[0].retry_after == 0.0 and load.tally.attempts[0].status == 503
    assert load.tally.attempts[2].status == 500 and load.tally.attempts[3].status is None
    # busy+ok is one request that succeeded; bug and reset are two that failed.
    assert load.tally.requests_failed == 2 and load.tally.requests_ok >= 2


def test_a_port_nobody_listens_on_counts_as_not_delivered_never_as_failed() -> None:
    with Load(f"http://127.0.0.1:{free_port()}/x", b"{}", clients=1) as load:
        load.wait_for(lambda attempts: len(attempts) >= 2, 30)
    assert {a.outcome for a in load.tally.attempts} == {NOT_DELIVERED}


def test_as_a_script_it_prints_the_tally_and_fails_when_a_request_failed(server, tmp_path: Path) -> None:
    url, script = server
    script.append("bug")
    body = tmp_path / "body.json"
    body.write_text("{}")
    done = subprocess.run(
        [
            sys.executable,
            load_client.__file__,
            url,
            "--body-file",
            str(body),
            "--clients",
            "1",
            "--duration",
            "0.5",
            "--summary-file",
            str(tmp_path / "summary.json"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    summary = json.loads(done.stdout)
    assert json.loads((tmp_path / "summary.json").read_text())["by_outcome"] == summary["by_outcome"]
    assert done.returncode == 1 and summary["by_outcome"][FAILED] == 1 and summary["by_outcome"][OK] >= 1, summary

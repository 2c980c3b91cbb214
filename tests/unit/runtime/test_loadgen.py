"""The autoscaling load generator (benchmarks/autoscale/loadgen.py) against a real runtime server:
what the kind tests and the step-load benchmark count is what happened."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from support.servers import free_port, runtime_command

from mmprep_runtime.synthetic import models

LOADGEN = Path(__file__).resolve().parents[3] / "benchmarks" / "autoscale" / "loadgen.py"


def run_loadgen(url: str, *args: str) -> tuple[list[dict], dict]:
    done = subprocess.run(
        [sys.executable, str(LOADGEN), "--url", url, *args], capture_output=True, text=True, timeout=120, check=True
    )
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    return [line for line in lines if "t" in line], lines[-1]["summary"]


def test_every_request_sent_is_counted_once_served_or_failed(qwen_dir: Path) -> None:
    port = free_port()
    env = {**os.environ, "MMPREP_PROCESSOR_WORKERS": "1"}
    server = subprocess.Popen(
        [*runtime_command(), "serve", "--model", str(qwen_dir), "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "the runtime never got ready"
                time.sleep(0.2)
        text = f"{models.QWEN_IMAGE_PLACEHOLDER}describe"
        url = f"http://127.0.0.1:{port}/v1/preprocess"
        seconds, summary = run_loadgen(url, "--schedule", "0:4,1:8", "--duration", "3", "--text", text, "--image-side", "64")
        assert summary["sent"] == sum(s["sent"] for s in seconds) >= 10
        assert summary["ok"] == summary["sent"] and summary["failed"] == 0, summary
        assert summary["p99_s"] >= summary["p50_s"] > 0
        # The schedule's step shows in the per-second counts.
        assert seconds[0]["rate"] == 4 and seconds[2]["rate"] == 8
        assert [(step["from_s"], step["rate"]) for step in summary["steps"]] == [(0, 4), (1, 8)]
        assert sum(step["sent"] for step in summary["steps"]) == summary["sent"]
        # A body the runtime refuses (4xx) is a failure, not a success or a retry.
        _, refused = run_loadgen(url, "--schedule", "0:4", "--duration", "1", "--text", "no placeholder", "--image-side", "64")
        assert refused["failed"] == refused["sent"] > 0 and refused["retried"] == 0, refused
        assert refused["refusals"] == {}, refused
    finally:
        server.terminate()
        server.wait(60)


def test_a_pool_that_is_not_listening_fails_every_request_after_its_retries() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1/preprocess"
    _, summary = run_loadgen(url, "--schedule", "0:3", "--duration", "1", "--retries", "2")
    assert summary["sent"] > 0 and summary["ok"] == 0
    assert summary["failed"] == summary["sent"] and summary["retried"] == 2 * summary["sent"]
    assert summary["errors"] == {"connect refused": summary["sent"]}
    assert summary["refusals"] == {"connect refused": summary["retried"]}


def test_the_stop_file_ends_a_long_run_early(tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    stop.touch()
    url = f"http://127.0.0.1:{free_port()}/v1/preprocess"
    started = time.monotonic()
    _, summary = run_loadgen(url, "--schedule", "0:3", "--duration", "600", "--stop-file", str(stop), "--retries", "0")
    assert time.monotonic() - started < 60 and summary["duration_s"] < 5, summary

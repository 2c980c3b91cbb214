"""The commands as a pod runs them: ``serve`` in its own process (SIGTERM), ``probe``, ``bench``."""

from __future__ import annotations

import base64
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from support.servers import free_port, runtime_command

from mmprep_runtime import cli, exits
from mmprep_runtime.commands import bench, probe
from mmprep_runtime.contract import ProbeAnswer
from mmprep_runtime.settings import ModelSettings
from mmprep_runtime.synthetic import media, models

TIMEOUT = 120


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _post(url: str, payload: dict) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _wait_ready(process: subprocess.Popen, base: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read().decode() if process.stderr else "exited"
        try:
            if _get(f"{base}/readyz")[0] == 200:
                return
        except OSError:
            pass  # not listening yet
        time.sleep(0.1)
    raise AssertionError("the server did not become ready")


def _in_flight(base: str) -> float:
    _, body = _get(f"{base}/metrics")
    for line in body.decode().splitlines():
        if line.startswith("mmprep_requests_in_flight "):
            return float(line.split()[1])
    raise AssertionError("no in-flight gauge")


@pytest.mark.slow
def test_serve_finishes_in_flight_requests_on_sigterm_and_exits_zero(qwen_dir):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "MMPREP_PROCESSOR_WORKERS": "1", "MMPREP_IO_WORKERS": "2"}
    process = subprocess.Popen(
        [*runtime_command(), "serve", "--model", str(qwen_dir), "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_ready(process, base)
        _, info = _get(f"{base}/v1/info")
        assert json.loads(info)["workers"] == {**json.loads(info)["workers"], "processor": 1, "reason": "Explicit"}
        # The runtime extra installs uvloop, and the served process must actually run on it.
        assert json.loads(info)["event_loop"] == "uvloop"
        # The test extra installs OpenCV: its split deinterleaves the pixels.
        assert json.loads(info)["channel_split"] == "opencv"
        # Large images on one worker: the requests queue behind each other for a while.
        payload = {
            "text": f"what is {models.QWEN_IMAGE_PLACEHOLDER}",
            "images": [base64.b64encode(media.jpeg(1600, 1200)).decode()],
        }
        with concurrent.futures.ThreadPoolExecutor(4) as clients:
            answers = [clients.submit(_post, f"{base}/v1/preprocess", payload) for _ in range(4)]
            deadline = time.monotonic() + TIMEOUT
            while _in_flight(base) < 2:
                assert time.monotonic() < deadline, "requests never got in flight"
                time.sleep(0.01)
            process.send_signal(signal.SIGTERM)
            statuses = [answer.result(TIMEOUT)[0] for answer in answers]
        assert statuses == [200, 200, 200, 200], "in-flight requests finish after SIGTERM"
        assert process.wait(TIMEOUT) == 0
        stderr = process.stderr.read().decode()
        assert "drain window over" in stderr and "stopped" in stderr
        with pytest.raises(OSError):
            _get(f"{base}/healthz")  # the socket is closed
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(TIMEOUT)
        for stream in (process.stdout, process.stderr):
            if stream:
                stream.close()


def test_serve_with_a_bad_env_value_exits_with_a_clear_message(qwen_dir):
    result = subprocess.run(
        [*runtime_command(), "serve", "--model", str(qwen_dir), "--port", "0"],
        env={**os.environ, "MMPREP_DEVICE": "tpu"},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == cli.EXIT_USAGE
    assert "MMPREP_DEVICE must be one of auto, cpu, cuda" in result.stderr


def test_probe_answers_with_the_contract_keys_under_4_kib(qwen_dir, tmp_path, capsys):
    log = tmp_path / "termination-log"
    assert cli.main(["probe", "--model", str(qwen_dir), "--termination-log", str(log)]) == 0
    printed = capsys.readouterr().out.strip()
    answer = json.loads(printed)
    # Exactly the contract's fields, each as the operator will read it back.
    assert ProbeAnswer.from_message(printed).model_dump(mode="json") == answer
    assert answer["cloneable"] is True and answer["error"] is None
    assert answer["processor_class"] == "Qwen2VLProcessor"
    assert answer["fast_image_processor"] is True and answer["path_if_gpu"] == "gpu"
    assert answer["declared_workers"] == 2  # the built-in table for Qwen2-VL
    assert answer["versions"]["transformers"]
    assert log.read_text() == printed and len(printed.encode()) < 4096


def test_a_probe_whose_answer_cannot_reach_the_operator_fails(qwen_dir, tmp_path, caplog):
    # The answer is printed, but the operator reads only the termination message: exit non-zero.
    log = tmp_path / "no-such-dir" / "termination-log"
    assert cli.main(["probe", "--model", str(qwen_dir), "--termination-log", str(log)]) == exits.EXIT_LOAD_FAILED
    assert f"cannot write the termination message to {log}" in caplog.text


def test_probe_says_path_if_gpu_is_cpu_for_pil_and_audio(model_factory, whisper_dir):
    pil = probe.probe(ModelSettings(str(model_factory("qwen2-vl", backend="pil"))))
    assert (pil.fast_image_processor, pil.path_if_gpu) == (False, "cpu")
    audio = probe.probe(ModelSettings(str(whisper_dir)))
    assert (audio.image_processor_class, audio.path_if_gpu) == (None, "cpu")


def test_probe_of_an_uncloneable_processor_answers_with_exit_zero(uncloneable_dir, tmp_path, capsys):
    log = tmp_path / "log"
    code = cli.main(["probe", "--model", str(uncloneable_dir), "--trust-remote-code", "--termination-log", str(log)])
    assert code == 0
    answer = json.loads(log.read_text())
    assert answer["cloneable"] is False and "cannot be copied" in answer["error"]
    assert answer["processor_class"] == models.UNCLONEABLE_CLASS


def test_probe_of_a_model_that_cannot_load_exits_non_zero_with_the_error(uncloneable_dir, tmp_path):
    log = tmp_path / "log"
    result = subprocess.run(
        [*runtime_command(), "probe", "--model", str(uncloneable_dir), "--termination-log", str(log)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == probe.EXIT_LOAD_FAILED
    assert "trust_remote_code" in result.stderr
    answer = json.loads(log.read_text())
    assert ProbeAnswer.from_message(log.read_text()).model_dump(mode="json") == answer
    assert "trust_remote_code" in answer["error"]
    assert len(log.read_bytes()) < 4096


def test_a_huge_error_still_fits_the_termination_message():
    answer = probe.failure("m", "x" * 100_000)
    assert len(answer.to_message().encode()) < 4096


def test_bench_reports_throughput_latency_and_cpu_per_worker_count(llava_dir, tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = cli.main(
        [
            "bench",
            "--model",
            str(llava_dir),
            "--workers",
            "1,2",
            "--duration",
            "0.4",
            "--warmup",
            "0",
            "--image",
            "96x64",
            "--decode",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert json.loads(out.read_text()) == report
    assert [row["workers"] for row in report["results"]] == [1, 2]
    for row in [report["direct"], *report["results"]]:
        assert row["requests"] > 0 and row["req_per_s"] > 0
        assert row["p50_ms"] <= row["p99_ms"]
        assert row["cpu_ms_per_request"] > 0 and row["rss_mb"] > 0
    one, two = report["results"]
    assert two["speedup_vs_1_worker"] == pytest.approx(two["req_per_s"] / one["req_per_s"], abs=1e-3)
    assert two["throughput_vs_direct"] == pytest.approx(two["req_per_s"] / report["direct"]["req_per_s"], abs=1e-3)
    assert (one["workers"], two["workers"]) == (1, 2)
    # The pool's own cost per job, from jobs that do nothing: measured, and far below a real call.
    dispatch = report["dispatch"]
    assert dispatch["workers"] == 1 and dispatch["jobs"] > 0
    assert dispatch["us_per_job"] > 0 and 0 < dispatch["share_of_direct_call"] < 0.5
    # The table.
    assert "req/s" in captured.err and "pool-2" in captured.err and "pool's own cost per job" in captured.err
    assert "2 worker(s):" in captured.err  # the progress display


@pytest.mark.parametrize("api", ["preprocess", "vllm-render"])
def test_bench_measures_the_served_path_of_each_api(qwen_dir, api, capsys):
    code = cli.main(
        [
            "bench",
            "--model",
            str(qwen_dir),
            "--workers",
            "1",
            "--duration",
            "0.5",
            "--warmup",
            "0",
            "--rounds",
            "1",
            "--image",
            "112x84",
            "--api",
            api,
            "--no-progress",
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["api"] == api
    (served,) = report["results"]
    assert served["label"] == "served-1" and served["requests"] > 0 and served["cpu_ms_per_request"] > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workers", "1,x"], "comma-separated integers"),
        (["--workers", "0"], "between 1 and 64"),
        (["--workers", "2,65"], "--workers must be between 1 and 64, got 65"),
        (["--workers", ","], "must list worker counts"),
        (["--image", "big"], "WIDTHxHEIGHT"),
        (["--duration", "0"], "must be positive"),
    ],
)
def test_bench_refuses_bad_arguments(argv, message, capsys):
    assert cli.main(["bench", "--model", "m", *argv]) == bench.EXIT_USAGE
    assert message in capsys.readouterr().err


def test_serve_exits_non_zero_when_the_processor_cannot_load(uncloneable_dir):
    result = subprocess.run(
        [*runtime_command(), "serve", "--model", str(uncloneable_dir), "--host", "127.0.0.1", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 1
    assert "trust_remote_code" in result.stderr and "could not be started" in result.stderr


def test_the_cli_loads_no_synthetic_model_builder_until_a_command_uses_one() -> None:
    """The builders are test and demo code: importing the CLI and its --help load none of them
    (a fresh interpreter, since this one imported them above)."""
    script = (
        "import sys, contextlib, io\n"
        "from mmprep_runtime import cli\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "    cli.main(['--help'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('mmprep_runtime.synthetic')))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=TIMEOUT, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout

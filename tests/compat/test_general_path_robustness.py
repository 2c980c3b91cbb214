"""The general render path under bad input and a lost process: every refusal a 4xx in vLLM's error
shape naming its cause, the pool serving on after each, a killed render process replaced.

One server: ``mmprep-runtime serve --render-path general`` with two of vLLM's render processes on a
Qwen3-VL folder (it takes images and video, not audio), vLLM's per-prompt limit set through
``--vllm-args`` (``--limit-mm-per-prompt``) and image URLs allowed only from this machine.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from support.kube import REPO, wait_for
from support.render_servers import Server, data_uri
from support.servers import free_port, vllm_render_env

from mmprep_runtime.synthetic import media, models

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

CHAT = "/v1/chat/completions/render"


@pytest.fixture(scope="module")
def general(vllm_venv: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("general-robustness")
    folder = models.make_model("qwen3-vl", work / "qwen3-vl")
    command = [str(vllm_venv / "bin" / "python"), "-m", "mmprep_runtime.cli", "serve", "--model", str(folder)]
    command += ["--host", "127.0.0.1", "--port", str(free_port()), "--render-path", "general", "--render-processes", "2"]
    command += ["--fetch-allowed-networks", "127.0.0.1/32"]
    command += ["--vllm-args", """--mm-processor-cache-gb 0 --limit-mm-per-prompt '{"image": 1, "video": 1}'"""]
    server = Server("mmprep", command, {**vllm_render_env(), "PYTHONPATH": str(REPO / "runtime")}, "/health", work / "log")
    try:
        yield server.wait()
    finally:
        server.stop()


def _ask(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "What is it?"}]}]}


def _image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


GOOD = _ask(_image(data_uri(media.jpeg(320, 240, seed=5), "image/jpeg")))


def _assert_serving(server: Server) -> None:
    status, answer = server.post(CHAT, GOOD)
    assert status == 200 and answer["features"]["mm_hashes"]["image"], (status, str(answer)[:500])


def _assert_vllm_error(status: int, answer: Any, *words: str) -> None:
    assert 400 <= status < 500, (status, answer)
    error = answer["error"]
    # vLLM's ErrorResponse: message, type, param, code.
    assert {"message", "type", "code"} <= set(error), error
    assert all(word.lower() in error["message"].lower() for word in words), error["message"]


_JPEG = media.jpeg(320, 240, seed=9)
BAD_REQUESTS = {
    "a truncated image": (_ask(_image(data_uri(_JPEG[: len(_JPEG) // 3], "image/jpeg"))), ()),
    "a corrupt video file": (
        _ask({"type": "video_url", "video_url": {"url": data_uri(b"\x00\x00\x00\x18ftypmp42" + os.urandom(4000), "video/mp4")}}),
        (),
    ),
    "more images than the per-prompt limit": (
        _ask(_image(data_uri(_JPEG, "image/jpeg")), _image(data_uri(_JPEG, "image/jpeg"))),
        ("image",),
    ),
    "a modality the model does not take": (
        _ask({"type": "input_audio", "input_audio": {"data": base64.b64encode(b"RIFF0000WAVE").decode(), "format": "wav"}}),
        ("audio",),
    ),
    "a private address": (_ask(_image("http://10.1.2.3/cat.jpg")), ("10.1.2.3", "not a public address")),
    "an unreachable address": (_ask(_image(f"http://127.0.0.1:{free_port()}/cat.jpg")), ("cannot connect",)),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_a_bad_request_gets_a_4xx_in_vllms_shape_and_the_pool_serves_on(general: Server, case: str) -> None:
    body, words = BAD_REQUESTS[case]
    status, answer = general.post(CHAT, body)
    _assert_vllm_error(status, answer, *words)
    _assert_serving(general)


def test_a_killed_render_process_is_replaced_and_the_other_serves_meanwhile(general: Server) -> None:
    info = general.get("/v1/info")[1]["vllm_render"]["general"]
    assert info["ready_processes"] == 2 and info["restarts"] == 0, info
    os.kill(info["pids"][0], signal.SIGKILL)
    # A request that reaches the dying process before the kernel has closed its socket had nothing
    # of its answer written: it is sent once more, to the live process. The pool leases the dead
    # one no more, so every request is answered while it is restarted.
    outcomes = []
    for _ in range(6):
        status, answer = general.post(CHAT, GOOD)
        outcomes.append((status, answer if status != 200 else None))
    assert [status for status, _ in outcomes] == [200] * 6, outcomes
    back = wait_for(
        lambda: (i := general.get("/v1/info")[1]["vllm_render"]["general"])["ready_processes"] == 2 and i,
        600,
        what="the killed render process to be replaced",
    )
    assert back["restarts"] == 1 and back["pids"][0] != info["pids"][0], back
    _assert_serving(general)


def test_the_probe_in_the_vllm_environment_reports_vllms_version(vllm_venv: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """The operator's probe Job runs the image's `mmprep-runtime probe`; its answer (the resource's
    status.probe.result) carries the vLLM version the render tier runs, read from the install."""
    folder = models.make_model("qwen2-audio", tmp_path / "qwen2-audio")
    done = subprocess.run(
        [str(vllm_venv / "bin" / "python"), "-m", "mmprep_runtime.cli", "probe", "--model", str(folder)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**vllm_render_env(), "PYTHONPATH": str(REPO / "runtime")},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    installed = subprocess.run(
        [str(vllm_venv / "bin" / "python"), "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
        capture_output=True,
        text=True,
        check=True,
        env=vllm_render_env(),
    ).stdout.strip()
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["versions"]["vllm"] == installed and answer["processor_class"] == "Qwen2AudioProcessor", answer
    # What the operator shows in status.probe.result: the path auto takes for this model here (with
    # vLLM's processing beside it for what that path does not render).
    assert answer["render_path"] == "native" and "native fast path" in answer["render_path_reason"], answer


#: A wrong vLLM option, the family it is given to and the words of vLLM's own error at start: on a
#: general family, and on a native one (whose fallback needs the option: serving on natively would
#: ignore it).
WRONG_OPTIONS = {
    "an unknown tool parser, native family": (
        "qwen2.5-vl",
        "--tool-call-parser no-such-parser --enable-auto-tool-choice",
        "tool_parser:'no-such-parser' which has not been registered",
    ),
    "an unknown reasoning parser": (
        "gemma3",
        "--reasoning-parser no-such-reasoner",
        "reasoning_parser_name='no-such-reasoner' has not been registered",
    ),
    "a chat template file that does not exist": (
        "gemma3",
        "--chat-template /no/such/template.jinja",
        "The supplied chat template string (/no/such/template.jinja) appears path-like, but doesn't exist!",
    ),
}


@pytest.fixture(scope="module")
def wrong_option_starts(vllm_venv: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str]]:
    """Every case's server started at once and run until it exits: each start is an import of
    vLLM in two processes that then fail, and side by side they take little more than the longest."""
    work = tmp_path_factory.mktemp("wrong-options")
    env = {**vllm_render_env(), "PYTHONPATH": str(REPO / "runtime")}
    started: dict[str, tuple[subprocess.Popen[bytes], pathlib.Path]] = {}
    for number, (case, (kind, options, _)) in enumerate(sorted(WRONG_OPTIONS.items())):
        folder = models.make_model(kind, work / f"{number}-{kind}")
        command = [str(vllm_venv / "bin" / "python"), "-m", "mmprep_runtime.cli", "serve", "--model", str(folder)]
        command += ["--host", "127.0.0.1", "--port", str(free_port()), "--render-processes", "1", "--vllm-args", options]
        log = work / f"{number}.log"
        with log.open("wb") as out:
            started[case] = (subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT), log)
    ended: dict[str, tuple[int, str]] = {}
    try:
        for case, (process, log) in started.items():
            ended[case] = (process.wait(timeout=600), log.read_text(errors="replace"))
    finally:
        for process, _ in started.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    return ended


@pytest.mark.parametrize("case", sorted(WRONG_OPTIONS))
def test_a_wrong_vllm_option_stops_the_server_at_start_with_vllms_own_error(
    wrong_option_starts: dict[str, tuple[int, str]], case: str
) -> None:
    """A wrong option given through --vllm-args: the render processes fail as vLLM's server fails
    on it, and mmprep exits with vLLM's message in its log instead of serving."""
    returncode, log = wrong_option_starts[case]
    message = WRONG_OPTIONS[case][2]
    assert returncode == 1, log[-3000:]
    assert message in log, log[-3000:]
    assert "the processor could not be started" in log, log[-3000:]

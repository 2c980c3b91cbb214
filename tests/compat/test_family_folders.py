"""Every vision-language family ``make-model`` builds loads here and renders in vLLM's render server.

For each family kind (``mmprep_runtime.testing_families``): the folder loads through this
virtualenv's ``AutoProcessor``, and vLLM (``hack/vllm/venv.sh``: its own virtualenv, its own,
older transformers) serves it with ``vllm launch render``, started once per kind. vLLM recomputes
each image's placeholder count from the folder's ``config.json`` and refuses a request where it
differs from what the HF processor produced, so a 200 with one image hash means the config, the
tokenizer and the processor agree. The families that take video also render a video given as
JPEG frames (``data:video/jpeg;base64,<frame>,<frame>,...``). Every request carries a system message
as a list of parts, the form vLLM hands the chat template.
"""

from __future__ import annotations

import base64
import json
import pathlib
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from support.kube import HACK, wait_for
from support.servers import free_port, vllm_render_command, vllm_render_env

from mmprep_runtime import testing_families, testing_media, testing_models

# Starting vLLM takes ~15-50 s per kind on a 2-core machine; the first test may also install vLLM's
# virtualenv (minutes) when it is not cached.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

KINDS = list(testing_families.FAMILIES)
VIDEO_KINDS = [kind for kind, family in testing_families.FAMILIES.items() if family.chat.video]
START_TIMEOUT = 600.0
REQUEST_TIMEOUT = 120.0
RENDER = "/v1/chat/completions/render"
SYSTEM = {"role": "system", "content": [{"type": "text", "text": "Answer in one sentence."}]}


@pytest.fixture(scope="session")
def vllm_venv() -> pathlib.Path:
    """vLLM's virtualenv, installed on first use and cached by version (seconds when warm)."""
    done = subprocess.run([str(HACK / "vllm" / "venv.sh")], stdout=subprocess.PIPE, text=True, timeout=3600, check=False)
    if done.returncode != 0:
        pytest.fail(f"hack/vllm/venv.sh failed with exit code {done.returncode}; see its output above", pytrace=False)
    return pathlib.Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("families")
    return {kind: testing_models.make_model(kind, root / kind) for kind in KINDS}


class Server:
    """vLLM's render server on one folder, its output in a log file shown when it fails."""

    def __init__(self, venv: pathlib.Path, model: pathlib.Path, log: pathlib.Path):
        self.log = log
        self.url = f"http://127.0.0.1:{(port := free_port())}"
        self._out = log.open("wb")
        command = vllm_render_command(venv, model, port, normalized=False)
        self.process = subprocess.Popen(command, env=vllm_render_env(), stdout=self._out, stderr=subprocess.STDOUT)

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"vLLM exited with {self.process.returncode}:\n{self.tail()}")
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        request = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)
        self._out.close()


@pytest.fixture(scope="module", params=KINDS)
def served(request: pytest.FixtureRequest, vllm_venv, folders, tmp_path_factory) -> Iterator[tuple[str, Server]]:
    """vLLM's render server on one kind's folder, started once for that kind's tests."""
    kind = request.param
    server = Server(vllm_venv, folders[kind], tmp_path_factory.mktemp("logs") / f"vllm-{kind}.log")
    try:
        wait_for(server.ready, START_TIMEOUT, what=f"vLLM render on {kind} to be ready", interval=0.5, describe=server.tail)
        yield kind, server
    finally:
        server.stop()


def _chat(part: dict[str, Any], text: str) -> dict[str, Any]:
    return {"messages": [SYSTEM, {"role": "user", "content": [part, {"type": "text", "text": text}]}], "max_tokens": 16}


def _check(status: int, answer: Any, modality: str, server: Server) -> None:
    assert status == 200, f"vLLM answered {status}: {json.dumps(answer)[:2000]}\n{server.tail()}"
    tokens = answer["token_ids"]
    assert tokens
    features = answer["features"]
    assert len(features["mm_hashes"][modality]) == 1
    (placeholder,) = features["mm_placeholders"][modality]
    assert placeholder["length"] > 0 and placeholder["offset"] + placeholder["length"] <= len(tokens)


@pytest.mark.parametrize("kind", KINDS)
def test_the_folder_loads_with_this_virtualenvs_transformers(folders, kind):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(str(folders[kind]))
    prompt = processor.apply_chat_template([SYSTEM, {"role": "user", "content": [{"type": "image"}]}], tokenize=False)
    assert testing_families.FAMILIES[kind].chat.image in prompt


def test_vllm_warms_up_on_the_folder(served):
    # vLLM's warm-up processes the largest dummy inputs its config allows; it only logs a failure
    # (a config key vLLM reads raw and the folder lacks), which a real request would meet later.
    _kind, server = served
    assert "Multi-modal warmup completed" in server.log.read_text(errors="replace"), server.tail()


def test_vllm_renders_an_image(served):
    _kind, server = served
    image = base64.b64encode(testing_media.jpeg(640, 480, seed=1)).decode()
    part = {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{image}"}}
    _check(*server.post(RENDER, _chat(part, "Describe this picture in one sentence.")), "image", server)


def test_vllm_renders_a_video_of_jpeg_frames(served):
    kind, server = served
    if kind not in VIDEO_KINDS:
        pytest.skip(f"{kind} takes no video")
    frames = ",".join(base64.b64encode(testing_media.jpeg(320, 240, seed=seed)).decode() for seed in range(8))
    part = {"type": "video_url", "video_url": {"url": f"data:video/jpeg;base64,{frames}"}}
    _check(*server.post(RENDER, _chat(part, "Describe this video.")), "video", server)

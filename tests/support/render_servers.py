"""Render servers under test, as processes: start one, wait until it answers, send it JSON, stop it
(``Server``); and the media the compatibility tests send (``data_uri``, ``rgba_png``)."""

from __future__ import annotations

import base64
import io
import json
import os
import pathlib
import subprocess
import urllib.error
import urllib.request
from typing import Any

from mmprep_runtime.synthetic import media
from support.kube import wait_for

# A deadline, not a pause: a loaded 2-core machine (the kind bring-up beside) needs minutes to start vLLM.
START_TIMEOUT = 600.0
REQUEST_TIMEOUT = 120.0


def rgba_png(width: int, height: int) -> bytes:
    """A PNG with transparency: vLLM composites it onto white, and the conversion joins its hash."""
    from PIL import Image

    image = Image.open(io.BytesIO(media.png(width, height, seed=3))).convert("RGBA")
    alpha = Image.linear_gradient("L").resize((width, height))
    image.putalpha(alpha)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def data_uri(data: bytes, media_type: str) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


class Server:
    def __init__(self, name: str, command: list[str], env: dict[str, str], ready_path: str, log: pathlib.Path):
        self.name, self.ready_path, self.log = name, ready_path, log
        self.port = int(command[command.index("--port") + 1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._out = log.open("wb")
        self.process = subprocess.Popen(command, env=env, stdout=self._out, stderr=subprocess.STDOUT)

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.process.returncode}:\n{self.tail()}")
        try:
            with urllib.request.urlopen(self.url + self.ready_path, timeout=5) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait(self) -> Server:
        wait_for(self.ready, START_TIMEOUT, what=f"{self.name} to be ready", interval=0.5, describe=self.tail)
        return self

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        request = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")

    def get(self, path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=REQUEST_TIMEOUT) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, None

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)
        self._out.close()


#: vLLM's own judge of two answers (run by vLLM's Python; it imports nothing of mmprep).
CHECKER = pathlib.Path(__file__).resolve().parent / "vllm_check.py"


def vllm_check(venv: pathlib.Path, manifest: pathlib.Path) -> dict[str, Any]:
    """Each case of ``manifest`` (name -> [ours.json, theirs.json]) judged by ``vllm_check.py`` in
    vLLM's virtualenv, in one run (importing vLLM takes seconds): name -> {ok, problems, summary}."""
    checked = subprocess.run(
        [str(venv / "bin" / "python"), str(CHECKER), str(manifest)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "VLLM_TARGET_DEVICE": "cpu"},
    )
    assert checked.returncode == 0, checked.stderr[-3000:]
    results: dict[str, Any] = json.loads(checked.stdout.strip().splitlines()[-1])
    return results

"""The compatibility tiers' shared fixtures: vLLM's virtualenv, and a local server of media URLs."""

from __future__ import annotations

import http.server
import pathlib
import subprocess
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from support.kube import HACK

from mmprep_runtime.synthetic import media


@pytest.fixture(scope="session")
def vllm_venv() -> pathlib.Path:
    """vLLM's virtualenv, installed on first use and cached by version (seconds when warm)."""
    done = subprocess.run([str(HACK / "vllm" / "venv.sh")], stdout=subprocess.PIPE, text=True, timeout=3600, check=False)
    if done.returncode != 0:
        pytest.fail(f"hack/vllm/venv.sh failed with exit code {done.returncode}; see its output above", pytrace=False)
    return pathlib.Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def cpu_engine_venv() -> pathlib.Path:
    """vLLM's CPU build, the engine of the generate tests, installed on first use and cached by
    version (seconds when warm)."""
    done = subprocess.run(
        [str(HACK / "vllm" / "venv.sh"), "cpu-engine"], stdout=subprocess.PIPE, text=True, timeout=3600, check=False
    )
    if done.returncode != 0:
        pytest.fail(f"hack/vllm/venv.sh cpu-engine failed with exit code {done.returncode}; see its output above", pytrace=False)
    return pathlib.Path(done.stdout.strip().splitlines()[-1])


class _Media(http.server.BaseHTTPRequestHandler):
    files: ClassVar[dict[str, tuple[str, bytes]]] = {}

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        found = self.files.get(self.path)
        if found is None:
            self.send_error(404)
            return
        content_type, body = found
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture(scope="session")
def media_server() -> Iterator[str]:
    """A local HTTP server with a JPEG (``/photo.jpg``) and a WAV clip (``/clip.wav``): both render
    servers fetch the same URLs."""
    _Media.files = {
        "/photo.jpg": ("image/jpeg", media.jpeg(400, 300, seed=7)),
        "/clip.wav": ("audio/wav", media.wav(0.8)),
    }
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Media)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()

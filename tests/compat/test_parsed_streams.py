"""A render process's resumed parsed streams (``backends.vllm.parsed_streams``) against vLLM's own
replaying derender, side by side on one derenderer (``parsed_stream_check.py``, run by vLLM's
Python): a Hermes tool call and a Qwen3 reasoning block, streamed in chunks of 1 to 3 tokens, every
call's chunk and state equal to vLLM's; every call after the first resumed, none replayed; a stream
begun by vLLM's function (another server) replayed once where it changes hands, then resumed.
The HTTP answers of both servers are compared in ``test_general_path_compat`` (its parsed cases).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
from typing import Any

import pytest
from support.kube import REPO
from support.servers import vllm_render_env

from mmprep_runtime.synthetic import models

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PARSERS = ["--tool-call-parser", "hermes", "--enable-auto-tool-choice", "--reasoning-parser", "qwen3"]


@pytest.fixture(scope="module")
def checked(vllm_venv: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = models.make_model("qwen2.5-vl", tmp_path_factory.mktemp("parsed-streams") / "qwen2.5-vl")
    done = subprocess.run(
        [str(vllm_venv / "bin" / "python"), str(pathlib.Path(__file__).parent / "parsed_stream_check.py"), str(folder), *PARSERS],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**vllm_render_env(), "PYTHONPATH": str(REPO / "runtime")},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


CASES = [
    "a tool call, 1 token a call",
    "a tool call, 1-3 tokens a call",
    "a reasoning block, 2 tokens a call",
    "a reasoning block, 1-3 tokens a call",
]


@pytest.mark.parametrize("case", CASES)
def test_a_resumed_parsed_stream_answers_every_call_as_vllms_replay(checked: dict[str, Any], case: str) -> None:
    assert checked["installed"] is True
    result = checked[case]
    assert result["first difference"] is None, result["first difference"]
    assert (result["resumed"], result["replayed"]) == (result["calls"] - 1, 0), result


@pytest.mark.parametrize("case", CASES)
def test_a_stream_begun_elsewhere_is_replayed_once_then_resumed(checked: dict[str, Any], case: str) -> None:
    result = checked[f"{case}, switched mid-stream"]
    assert result["first difference"] is None, result["first difference"]
    # Calls 0-3 were vLLM's; the first here replays the state it did not write.
    assert (result["resumed"], result["replayed"]) == (result["calls"] - 5, 1), result


def test_a_finished_stream_keeps_nothing(checked: dict[str, Any]) -> None:
    assert checked["kept streams"] == 0

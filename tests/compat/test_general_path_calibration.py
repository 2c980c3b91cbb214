"""The calibration of the general render path, with the real vLLM: it measures render processes.

``mmprep-runtime calibrate --render-path general`` on a Qwen2-Audio folder (vLLM's own processing
serves it) from vLLM's virtualenv, as the operator's calibration Job runs it in the
vLLM image: vLLM's render processes start once, 1..N of them are loaded with real render requests
(a WAV clip each: the family takes audio), and the report says it counted render processes, each
count with a throughput.
"""

from __future__ import annotations

import pathlib
import subprocess

import pytest
from support.kube import REPO
from support.servers import vllm_render_env

from mmprep_runtime.calibration_report import RENDER_PROCESSES, Report
from mmprep_runtime.synthetic import models

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_the_general_paths_calibration_measures_render_processes(vllm_venv: pathlib.Path, tmp_path: pathlib.Path) -> None:
    folder = models.make_model("qwen2-audio", tmp_path / "qwen2-audio")
    log = tmp_path / "termination-log"
    command = [str(vllm_venv / "bin" / "python"), "-m", "mmprep_runtime.cli", "calibrate", "--model", str(folder)]
    command += ["--render-path", "general", "--vllm-args", "--mm-processor-cache-gb 0", "--max-workers", "2"]
    command += ["--duration", "6", "--rounds", "2", "--warmup", "1", "--termination-log", str(log)]
    done = subprocess.run(
        command,
        env={**vllm_render_env(), "PYTHONPATH": str(REPO / "runtime")},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = Report.from_message(log.read_text())
    print(done.stderr[-600:])
    assert report.dimension == RENDER_PROCESSES, report
    assert [p.workers for p in report.curve] == [1, 2]
    assert all(p.req_per_s > 0 and p.p50_ms is not None for p in report.curve), report.curve
    assert report.chosen in (1, 2) and report.images == (), "no image sizes for a model that takes none"
    assert "render process(es)" in done.stderr

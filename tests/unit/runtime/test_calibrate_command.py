"""``mmprep-runtime calibrate``: a real curve from real processors and threads, and its failures."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from mmprep_runtime import cli
from mmprep_runtime.calibration_report import PROCESSOR_WORKERS, Report
from mmprep_runtime.commands import calibrate, measuring
from mmprep_runtime.engine import cpus, decoding, loading
from mmprep_runtime.settings import ModelSettings
from mmprep_runtime.synthetic import media


def test_calibrate_measures_a_real_curve_and_writes_the_report_as_a_termination_message(qwen_dir, tmp_path, capsys, monkeypatch):
    # Two counts whatever the machine: the curve's shape is the machine's, its form is ours.
    monkeypatch.setattr(cpus, "usable_cpus", lambda: 2)
    log = tmp_path / "termination-log"
    code = cli.main([
        "calibrate", "--model", str(qwen_dir), "--max-workers", "4", "--image", "320x240,160x120",
        "--duration", "0.6", "--rounds", "2", "--warmup", "0", "--termination-log", str(log),
    ])  # fmt: skip
    assert code == 0
    report = Report.from_message(log.read_text())
    assert Report.from_message(capsys.readouterr().out.strip()) == report
    assert [p.workers for p in report.curve] == [1, 2]  # capped by the CPUs this process may use
    assert all(p.req_per_s > 0 and p.p99_ms is not None and p.p99_ms >= p.p50_ms for p in report.curve)
    best = max(report.curve, key=lambda p: p.req_per_s)
    assert report.best == best.workers
    chosen = next(p for p in report.curve if p.workers == report.chosen)
    assert chosen.req_per_s >= best.req_per_s * (1 - report.tolerance)
    assert report.images == ("320x240", "160x120") and report.usable_cpus == 2
    assert len(log.read_bytes()) <= 4096


def test_calibrate_rotates_through_sample_files(llava_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cpus, "usable_cpus", lambda: 1)
    samples = tmp_path / "samples"
    samples.mkdir()
    (samples / "a.jpg").write_bytes(media.jpeg(200, 150, seed=1))
    (samples / "b.png").write_bytes(media.png(120, 90, seed=2))
    (samples / "notes.txt").write_text("not an image")
    code = cli.main(["calibrate", "--model", str(llava_dir), "--samples", str(samples), "--duration", "0.3",
                     "--rounds", "1", "--warmup", "0"])  # fmt: skip
    assert code == 0
    report = Report.from_message(capsys.readouterr().out.strip())
    assert report.images == ("a.jpg", "b.png") and report.chosen == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--image", "big"], "WIDTHxHEIGHT"),
        (["--tolerance", "1.5"], "tolerance"),
        (["--duration", "0"], "duration"),
    ],
)
def test_calibrate_refuses_bad_arguments_with_a_report_the_operator_can_read(argv, message, tmp_path, qwen_dir, capsys):
    log = tmp_path / "log"
    assert cli.main(["calibrate", "--model", str(qwen_dir), *argv, "--termination-log", str(log)]) == calibrate.EXIT_USAGE
    assert message in Report.from_message(log.read_text()).error
    assert message in capsys.readouterr().err


def test_calibrate_with_an_empty_sample_folder_or_a_broken_sample_fails_clearly(tmp_path, qwen_dir, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.main(["calibrate", "--model", str(qwen_dir), "--samples", str(empty)]) == calibrate.EXIT_USAGE
    assert "holds no" in json.loads(capsys.readouterr().out)["error"]
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "x.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    assert (
        cli.main(["calibrate", "--model", str(qwen_dir), "--samples", str(broken), "--duration", "0.2"]) == calibrate.EXIT_USAGE
    )
    assert "x.jpg" in json.loads(capsys.readouterr().out)["error"]


def test_calibrate_of_a_model_that_does_not_load_reports_the_error(uncloneable_dir, capsys):
    # Remote code without --trust-remote-code: the load fails, and the report says why.
    assert cli.main(["calibrate", "--model", str(uncloneable_dir), "--duration", "0.2"]) == calibrate.EXIT_FAILED
    assert "trust" in json.loads(capsys.readouterr().out)["error"].lower()


def test_a_decoding_workload_takes_its_images_in_turn(qwen_dir):
    _processor, facts = loading.load_processor(ModelSettings(str(qwen_dir)))
    images = (media.jpeg(64, 48, seed=1), media.png(32, 40, seed=2))
    workload = measuring.build_workload(facts, (8, 8), decode=True, images=images)
    seen: list[tuple[int, int]] = []

    def recording_processor(*, text: str, images: list[Any], **kwargs: Any) -> dict[str, Any]:
        seen.append(decoding.image_size(images[0]))
        return {}

    for _ in range(3):
        workload.job(recording_processor)
    assert seen == [(64, 48), (32, 40), (64, 48)]


# ----------------------------------------------------------------- the vLLM render API's general path


def test_with_the_native_render_path_calibrate_measures_worker_threads(qwen_dir, capsys, monkeypatch):
    # Qwen2-VL has the native fast path: under auto it serves, and its workers are what is measured.
    monkeypatch.setattr(cpus, "usable_cpus", lambda: 1)
    argv = ["calibrate", "--model", str(qwen_dir), "--render-path", "auto", "--duration", "0.3", "--rounds", "1"]
    assert cli.main([*argv, "--warmup", "0", "--image", "160x120"]) == 0
    report = Report.from_message(capsys.readouterr().out.strip())
    assert report.dimension == PROCESSOR_WORKERS and report.chosen == 1


def test_the_general_render_path_without_vllm_installed_is_a_failure_the_operator_can_read(qwen_dir, tmp_path, capsys):
    log = tmp_path / "log"
    argv = ["calibrate", "--model", str(qwen_dir), "--render-path", "general", "--termination-log", str(log)]
    assert cli.main(argv) == calibrate.EXIT_FAILED
    assert "needs vLLM installed" in Report.from_message(log.read_text()).error


def _content(body: bytes) -> list[dict[str, Any]]:
    (message,) = json.loads(body)["messages"]
    return list(message["content"])


def test_the_general_paths_requests_carry_what_the_model_takes(qwen_dir, whisper_dir):
    inputs = calibrate.synthetic_inputs([(64, 48), (32, 24)])
    _processor, images = loading.load_processor(ModelSettings(str(qwen_dir)))
    bodies = calibrate.render_bodies(images, inputs)
    assert len(bodies) == 2
    for body, image in zip(bodies, inputs.images, strict=True):
        first, text = _content(body)
        assert first["type"] == "image_url" and text["type"] == "text"
        assert base64.b64decode(first["image_url"]["url"].split(",", 1)[1]) == image
    _processor, audio = loading.load_processor(ModelSettings(str(whisper_dir)))
    ((clip, _text),) = [_content(b) for b in calibrate.render_bodies(audio, inputs)]
    assert clip["type"] == "input_audio" and clip["input_audio"]["format"] == "wav"


def test_an_audio_workload_carries_the_placeholder_its_processor_expands(tmp_path):
    # Qwen2-Audio's processor refuses a clip whose text has no <|AUDIO|>; Whisper's takes none.
    from mmprep_runtime.synthetic import models

    folder = models.make_model("qwen2-audio", tmp_path / "qwen2-audio")
    processor, facts = loading.load_processor(ModelSettings(str(folder)))
    assert facts.audio_token == "<|AUDIO|>"
    workload = measuring.build_workload(facts, (8, 8), decode=False)
    assert workload.request.text.endswith("<|AUDIO|>")
    workload.job(processor)  # the processor runs it

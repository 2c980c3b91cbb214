"""``mmprep-runtime calibrate``: measure worker counts 1..N on this machine and choose one.

The operator runs this in a Job on one node of a pool, with the pool's own image, model,
backend, device, resources and placement, and reads the report from the termination message
(``calibration_report.Report``). It is the closed loop of ``measuring`` (shared with ``bench``),
measured the way a pod serves: every job decodes its image (decoding is part of a request's CPU cost), images rotate through a set
(synthetic photos at the given sizes, or sample files from a folder), and the counts are measured
in interleaved rounds so background load on the node hits all of them alike.

N is the smaller of ``--max-workers`` and the CPUs this process may use (the pod's CPU limit
shows up as a cgroup quota): more workers than CPUs cannot be faster on the CPU path, and on the
GPU path the curve shows whether a second one is (the device's own contention is what is measured).

With ``--render-path`` (a pool serving the vLLM render API) the path that would serve the model is
measured: the native path's worker threads as above, or, on the general path, vLLM render
processes 1..N (``measure_render_processes``): threads inside one of vLLM's processes add nothing
(its processing holds the GIL), so processes are the dimension there. The report says which
(``Report.dimension``).
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import os
import pathlib
import sys
from typing import Any, Final

from mmprep_runtime import calibration_report, errors, exits, versions
from mmprep_runtime.backends import choice
from mmprep_runtime.backends.vllm import worker_pool
from mmprep_runtime.commands import measuring
from mmprep_runtime.engine import core as engine
from mmprep_runtime.engine import cpus, decoding, loading
from mmprep_runtime.exits import ModelLoadError, write_termination_message
from mmprep_runtime.settings import (
    Limits,
    ModelSettings,
    RenderSettings,
    SettingsError,
    model_settings_from_args,
    render_settings_from_args,
)
from mmprep_runtime.synthetic import media

EXIT_USAGE: Final = exits.EXIT_USAGE
#: The model did not load, or no worker count could be measured.
EXIT_FAILED: Final = exits.EXIT_LOAD_FAILED
SAMPLE_SUFFIXES: Final = (".jpg", ".jpeg", ".png", ".webp")
MAX_SAMPLES: Final = 64


@dataclasses.dataclass(frozen=True)
class Inputs:
    """Encoded images and where they came from (for the report)."""

    images: tuple[bytes, ...]
    names: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How each count is measured: ``duration`` seconds in all, split into ``rounds`` interleaved
    with the other counts', after ``warmup`` seconds; and the choice's ``tolerance``."""

    duration: float
    rounds: int
    warmup: float
    tolerance: float

    @property
    def per_round(self) -> float:
        return self.duration / self.rounds


def synthetic_inputs(sizes: list[tuple[int, int]]) -> Inputs:
    return Inputs(
        tuple(media.jpeg(w, h, seed=i) for i, (w, h) in enumerate(sizes)),
        tuple(f"{w}x{h}" for w, h in sizes),
    )


def sample_inputs(folder: pathlib.Path) -> Inputs:
    """Up to MAX_SAMPLES image files from ``folder`` (sorted, so every run uses the same set)."""
    if not folder.is_dir():
        raise measuring.MeasureError(f"--samples {folder} is not a folder")
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in SAMPLE_SUFFIXES)[:MAX_SAMPLES]
    if not files:
        raise measuring.MeasureError(f"--samples {folder} holds no {'/'.join(SAMPLE_SUFFIXES)} files")
    images = tuple(p.read_bytes() for p in files)
    for path, data in zip(files, images, strict=True):  # a sample that does not decode fails now, not mid-run
        try:
            decoding.decode_image(data, f"sample {path.name}", max_pixels=Limits().max_image_pixels)
        except errors.RequestError as exc:
            raise measuring.MeasureError(f"--samples {folder}: {exc.message}") from None
    return Inputs(images, tuple(p.name for p in files))


def measure(settings: ModelSettings, inputs: Inputs, counts: list[int], schedule: Schedule) -> calibration_report.Report:
    engines: dict[int, engine.Engine] = {}
    parts: dict[int, list[measuring.Measurement]] = {c: [] for c in counts}
    try:
        for count in counts:
            engines[count] = engine.start_engine(settings, processor_workers=count)
        facts = engines[counts[0]].facts
        # Audio or text only: bench's fixed request is representative enough.
        names = inputs.names if facts.takes_images else ()
        job = measuring.build_workload(facts, (64, 48), decode=facts.takes_images, images=inputs.images).job
        for running in engines.values():
            if schedule.warmup > 0:
                measuring.measure_pool(running, job, schedule.warmup, False)
        for _ in range(schedule.rounds):
            for count, running in engines.items():
                parts[count].append(measuring.measure_pool(running, job, schedule.per_round, False))
    finally:
        for running in engines.values():
            running.close()
    return _report(parts, counts, names, schedule, calibration_report.PROCESSOR_WORKERS)


def render_bodies(facts: loading.ProcessorFacts, inputs: Inputs) -> tuple[bytes, ...]:
    """The vLLM render API's chat bodies the general path is measured with: one per input image,
    or for a model that takes no images one WAV clip, or text alone."""
    if facts.takes_images:
        parts = [[_part("image_url", f"data:image/jpeg;base64,{base64.b64encode(image).decode()}")] for image in inputs.images]
    elif facts.takes_audio:
        clip = base64.b64encode(media.wav(5.0)).decode()
        parts = [[{"type": "input_audio", "input_audio": {"data": clip, "format": "wav"}}]]
    else:
        parts = [[]]
    return tuple(
        json.dumps(
            {"messages": [{"role": "user", "content": [*p, {"type": "text", "text": "Describe it in one sentence."}]}]}
        ).encode()
        for p in parts
    )


def _part(kind: str, url: str) -> dict[str, Any]:
    return {"type": kind, kind: {"url": url}}


def measure_render_processes(
    settings: ModelSettings,
    render: RenderSettings,
    bodies: tuple[bytes, ...],
    counts: list[int],
    schedule: Schedule,
    *,
    names: tuple[str, ...],
) -> calibration_report.Report:
    """Render process counts 1..N of the general path: N of vLLM's render processes start once,
    and n of them are loaded at a time (one request in flight each), in interleaved rounds.
    An idle process costs memory, not CPU, so the first n measure what a pod of n renders."""
    pool = worker_pool.VllmWorkerPool(settings.model, max(counts), worker_pool.vllm_options(render))
    pool.start(worker_pool.START_TIMEOUT_S)
    parts: dict[int, list[measuring.Measurement]] = {c: [] for c in counts}
    try:
        sockets = pool.socket_paths
        for count in counts:
            if schedule.warmup > 0:
                measuring.measure_sockets(sockets[:count], bodies, schedule.warmup)
        for _ in range(schedule.rounds):
            for count in counts:
                parts[count].append(measuring.measure_sockets(sockets[:count], bodies, schedule.per_round))
    finally:
        pool.close()
    return _report(parts, counts, names, schedule, calibration_report.RENDER_PROCESSES)


def _report(
    parts: dict[int, list[measuring.Measurement]],
    counts: list[int],
    names: tuple[str, ...],
    schedule: Schedule,
    dimension: calibration_report.Dimension,
) -> calibration_report.Report:
    curve = []
    for count in counts:
        summary = measuring.merge(parts[count]).summary()
        curve.append(
            calibration_report.CurvePoint(count, float(summary["req_per_s"] or 0.0), summary["p50_ms"], summary["p99_ms"])
        )
    choice = calibration_report.choose(curve, schedule.tolerance)
    return calibration_report.Report(
        curve=tuple(curve),
        chosen=choice.workers,
        best=choice.best_workers,
        tolerance=schedule.tolerance,
        usable_cpus=cpus.usable_cpus(),
        images=names,
        seconds_per_count=schedule.duration,
        dimension=dimension,
    )


def _sizes(text: str) -> list[tuple[int, int]]:
    sizes = [measuring.parse_size(part.strip()) for part in text.split(",") if part.strip()]
    if not sizes:
        raise measuring.MeasureError(f"--image must list WIDTHxHEIGHT sizes, got {text!r}")
    return sizes


def _answer(report: calibration_report.Report, termination_log: str | None) -> bool:
    text = report.to_message()
    print(text)
    return write_termination_message(termination_log, text)


def calibrate_render(
    settings: ModelSettings, render: RenderSettings, inputs: Inputs, counts: list[int], schedule: Schedule
) -> calibration_report.Report:
    """The vLLM render API's calibration: what sizes the path that serves the model. On the
    general path (vLLM's own processing) that is the render processes; on the native path, its
    clone-per-thread workers, measured as ``measure`` does."""
    running = engine.start_engine(settings, processor_workers=1)
    try:
        facts = running.facts
    finally:
        running.close()
    try:
        path = choice.choose(render.path, facts.processor_class, versions.vllm_version(), render.vllm_args)
    except choice.NoRenderPath as exc:
        raise calibration_report.CalibrationError(str(exc)) from None
    if path.primary == choice.NATIVE:
        return measure(settings, inputs, counts, schedule)
    names = inputs.names if facts.takes_images else ()
    return measure_render_processes(settings, render, render_bodies(facts, inputs), counts, schedule, names=names)


def main(args: argparse.Namespace) -> int:
    try:
        settings = model_settings_from_args(args, os.environ)
        # Only with --render-path: the pool serves the vLLM render API, whose path decides what to measure.
        render = render_settings_from_args(args, os.environ) if args.render_path else None
        if args.duration <= 0 or args.rounds < 1:
            raise measuring.MeasureError("--duration must be positive and --rounds at least 1")
        calibration_report.check_tolerance(args.tolerance)
        inputs = sample_inputs(pathlib.Path(args.samples)) if args.samples else synthetic_inputs(_sizes(args.image))
    except (SettingsError, measuring.MeasureError, calibration_report.CalibrationError) as exc:
        print(f"mmprep-runtime calibrate: {exc}", file=sys.stderr)
        _answer(calibration_report.Report(error=str(exc)), args.termination_log)
        return EXIT_USAGE
    counts = calibration_report.worker_counts(min(args.max_workers, cpus.usable_cpus()))
    schedule = Schedule(args.duration, args.rounds, args.warmup, args.tolerance)
    try:
        if render is None:
            report = measure(settings, inputs, counts, schedule)
        else:
            report = calibrate_render(settings, render, inputs, counts, schedule)
    except (
        ModelLoadError,
        calibration_report.CalibrationError,
        errors.RequestError,
        measuring.MeasureError,
        worker_pool.GeneralPathUnavailable,
    ) as exc:
        print(f"mmprep-runtime calibrate: {exc}", file=sys.stderr)
        _answer(calibration_report.Report(error=str(exc)), args.termination_log)
        return EXIT_FAILED
    noun = "render process(es)" if report.dimension == calibration_report.RENDER_PROCESSES else "worker(s)"
    for point in report.curve:
        print(
            f"{point.workers} {noun}: {point.req_per_s:.1f} req/s, p50 {point.p50_ms} ms, p99 {point.p99_ms} ms",
            file=sys.stderr,
        )
    print(f"chosen: {report.chosen} (best {report.best}, tolerance {report.tolerance:.0%})", file=sys.stderr)
    return 0 if _answer(report, args.termination_log) else EXIT_FAILED

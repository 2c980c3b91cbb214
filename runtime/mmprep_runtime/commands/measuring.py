"""Measuring a processor's throughput, latency and CPU: the loops ``bench`` and ``calibrate`` share.

Three closed loops, each keeping one job in flight per worker so that latency is service time,
not queueing: ``measure_direct`` calls the processor in one thread (the baseline),
``measure_pool`` runs jobs on an engine's pool (the completion callback submits the next job from
the worker thread itself), ``measure_served`` sends request bodies through ``Engine.serve`` (the
served path without the socket). Each returns a ``Measurement``; ``merge`` joins the rounds of
one configuration. The workload (``build_workload``) is one real request: a synthetic JPEG, a WAV
or text, whichever the processor takes.

Neighbours: ``bench`` (compares worker counts and prints the table) and ``calibrate`` (chooses a
count for the operator) call these; neither imports the other.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

from mmprep_runtime import sizing
from mmprep_runtime.backends.vllm.worker_pool import UnixHTTPConnection
from mmprep_runtime.engine import core as engine
from mmprep_runtime.engine import decoding, loading, pipeline
from mmprep_runtime.settings import Limits
from mmprep_runtime.synthetic import media

_PROGRESS_INTERVAL: Final = 0.5


class MeasureError(ValueError):
    """Bad measuring input (a flag, a sample folder): the command exits with a usage error."""


def parse_workers(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise MeasureError(f"--workers must be comma-separated integers, got {text!r}") from None
    if not counts:
        raise MeasureError(f"--workers must list worker counts, got {text!r}")
    try:
        return [sizing.check_worker_count("--workers", count) for count in counts]
    except sizing.WorkerCountError as exc:
        raise MeasureError(str(exc)) from None


def parse_size(text: str) -> tuple[int, int]:
    width, sep, height = text.lower().partition("x")
    try:
        size = (int(width), int(height))
    except ValueError:
        raise MeasureError(f"--image must be WIDTHxHEIGHT, got {text!r}") from None
    if not sep or min(size) < 1 or size[0] * size[1] > Limits().max_image_pixels:
        raise MeasureError(f"--image must be WIDTHxHEIGHT within the pixel limit, got {text!r}")
    return size


@dataclasses.dataclass(frozen=True)
class Workload:
    """What one job does: build the request (decoding or not), then run the processor.

    Decoding jobs take the encoded images in turn, each job the next one, as a pod serving a mix
    of pictures would.
    """

    facts: loading.ProcessorFacts
    request: pipeline.PreprocessRequest
    encoded: tuple[bytes, ...]
    decode: bool
    # next() on itertools.count is atomic under the GIL: worker threads share it without a lock.
    _turn: Iterator[int] = dataclasses.field(default_factory=itertools.count, compare=False, repr=False)

    def job(self, processor: Any) -> None:
        request = self.request
        if self.decode and self.encoded:
            data = self.encoded[next(self._turn) % len(self.encoded)]
            image = decoding.decode_image(data, "image", max_pixels=Limits().max_image_pixels, layout=self.facts.image_layout)
            request = dataclasses.replace(request, images=(image,))
        pipeline.process(processor, request, self.facts)


def build_workload(
    facts: loading.ProcessorFacts, size: tuple[int, int], decode: bool, images: tuple[bytes, ...] = ()
) -> Workload:
    """One request with an image (a synthetic JPEG of ``size``, or ``images`` in turn), audio or text,
    whichever the processor takes."""
    text = "Describe this picture in one sentence."
    decoded: tuple[Any, ...] = ()
    audio: tuple[Any, ...] = ()
    encoded: tuple[bytes, ...] = ()
    if facts.takes_images:
        encoded = images or (media.jpeg(*size),)
        decoded = (decoding.decode_image(encoded[0], "image", max_pixels=Limits().max_image_pixels, layout=facts.image_layout),)
        if facts.image_token:
            text = f"{text} {facts.image_token}"
    elif facts.takes_audio:
        audio = (decoding.decode_wav(media.wav(5.0), "audio", target_rate=facts.sampling_rate or 16000, max_seconds=60),)
        text = f"What is said? {facts.audio_token}" if facts.audio_token else "What is said?"
    return Workload(facts, pipeline.PreprocessRequest(text, decoded, audio), encoded, decode)


@dataclasses.dataclass
class Measurement:
    label: str
    workers: int
    intra_op_threads: int
    requests: int
    seconds: float
    latencies: list[float]
    cpu_seconds: float
    rss_bytes: int

    def summary(self) -> dict[str, Any]:
        ordered = sorted(self.latencies)

        def quantile(q: float) -> float | None:
            if not ordered:
                return None
            return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]

        p50, p99 = quantile(0.5), quantile(0.99)
        return {
            "label": self.label,
            "workers": self.workers,
            "intra_op_threads": self.intra_op_threads,
            "requests": self.requests,
            "seconds": round(self.seconds, 3),
            "req_per_s": round(self.requests / self.seconds, 3) if self.seconds else None,
            "p50_ms": round(p50 * 1000, 2) if p50 is not None else None,
            "p99_ms": round(p99 * 1000, 2) if p99 is not None else None,
            "cpu_cores": round(self.cpu_seconds / self.seconds, 3) if self.seconds else None,
            "cpu_ms_per_request": round(self.cpu_seconds * 1000 / self.requests, 2) if self.requests else None,
            "rss_mb": round(self.rss_bytes / 2**20, 1),
        }


class Progress:
    def __init__(self, enabled: bool, label: str, duration: float, done: Callable[[], int]) -> None:
        # A live line needs a terminal; elsewhere (logs, pipes) one line per finished run.
        self._enabled = enabled
        self._live = enabled and sys.stderr.isatty()
        self._label, self._duration, self._done = label, duration, done
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Progress:
        self._started = time.monotonic()
        if self._live:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._live:
            self._thread.join()
            sys.stderr.write("\r\033[K")
        if self._enabled:
            elapsed = time.monotonic() - self._started
            sys.stderr.write(f"{self._label}: {self._done()} requests in {elapsed:.1f} s\n")
            sys.stderr.flush()

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.wait(_PROGRESS_INTERVAL):
            elapsed = time.monotonic() - started
            done = self._done()
            bar = int(20 * min(1.0, elapsed / self._duration))
            sys.stderr.write(
                f"\r{self._label:<14} [{'#' * bar}{'.' * (20 - bar)}] {elapsed:5.1f}/{self._duration:g} s"
                f"  {done} done  {done / elapsed if elapsed else 0:6.1f} req/s"
            )
            sys.stderr.flush()


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def _rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def measure_direct(processor: Any, workload: Workload, duration: float, progress: bool) -> Measurement:
    latencies: list[float] = []
    with Progress(progress, "direct", duration, lambda: len(latencies)):
        cpu0, started = _cpu_seconds(), time.perf_counter()
        while time.perf_counter() - started < duration:
            t0 = time.perf_counter()
            workload.job(processor)
            latencies.append(time.perf_counter() - t0)
        seconds, cpu = time.perf_counter() - started, _cpu_seconds() - cpu0
    return Measurement("direct", 1, 1, len(latencies), seconds, latencies, cpu, _rss_bytes())


def measure_pool(running: engine.Engine, job: Callable[[Any], object], duration: float, progress: bool) -> Measurement:
    """Closed loop, one ``job(processor)`` in flight per worker, for ``duration`` seconds.

    Each finished job submits the next from its done callback, on the worker that ran it: the
    worker never sleeps between jobs, as in a pool with a queue of waiting requests.
    """
    pool = running.pool
    lock = threading.Lock()
    latencies: list[float] = []
    outstanding = [0]
    finished = threading.Event()
    stop_at = [math.inf]

    def submit() -> None:
        submitted = time.perf_counter()
        future = pool.submit(job)
        future.add_done_callback(lambda f: completed(f, submitted))

    def completed(future: Any, submitted: float) -> None:
        now = time.perf_counter()
        future.result()  # a failing job should stop the benchmark loudly, not skew it
        with lock:
            if submitted >= started_at[0]:
                latencies.append(now - submitted)
            if now < stop_at[0]:
                resubmit = True
            else:
                resubmit = False
                outstanding[0] -= 1
                if outstanding[0] == 0:
                    finished.set()
        if resubmit:
            submit()

    started_at = [time.perf_counter()]
    with Progress(progress, f"{pool.workers} worker(s)", duration, lambda: len(latencies)):
        cpu0 = _cpu_seconds()
        started_at[0] = time.perf_counter()
        stop_at[0] = started_at[0] + duration
        outstanding[0] = pool.workers
        for _ in range(pool.workers):
            submit()
        if not finished.wait(duration + 120):
            raise RuntimeError("the benchmark jobs did not finish")
        seconds = time.perf_counter() - started_at[0]
        cpu = _cpu_seconds() - cpu0
    return _engine_measurement("pool", running, latencies, seconds, cpu)


def request_body(api: str, size: tuple[int, int], *, seed: int = 0) -> bytes:
    """One request of ``api`` with one synthetic JPEG, the body a client would send."""
    import base64

    from mmprep_runtime.synthetic import models

    image = base64.b64encode(media.jpeg(*size, seed=seed)).decode()
    if api == "preprocess":
        return json.dumps({"text": f"Describe this picture. {models.QWEN_IMAGE_PLACEHOLDER}", "images": [image]}).encode()
    return json.dumps(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{image}"}},
                        {"type": "text", "text": "Describe this picture in one sentence."},
                    ],
                }
            ],
            "max_tokens": 64,
        }
    ).encode()


def served_api(running: engine.Engine, api: str, fetcher: Any = None) -> Any:
    from mmprep_runtime.backends import model_facts
    from mmprep_runtime.backends.native import stages
    from mmprep_runtime.settings import RenderSettings

    if api == "preprocess":
        return pipeline.PreprocessApi(running.facts, Limits())
    model = model_facts.model_facts(running.processor, running.facts, RenderSettings())
    return stages.RenderApi(running.facts, model, Limits(), fetcher, chat=True)


def measure_served(running: engine.Engine, api: Any, body: bytes, duration: float, progress: bool) -> Measurement:
    """Closed loop through ``Engine.serve``: one request in flight per worker, on an event loop."""
    import asyncio

    latencies: list[float] = []

    async def client(stop_at: float) -> None:
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            await running.serve(api, body)
            latencies.append(time.perf_counter() - started)

    async def load() -> float:
        started = time.perf_counter()
        await asyncio.gather(*(client(started + duration) for _ in range(running.pool.workers)))
        return time.perf_counter() - started

    with Progress(progress, f"served {running.pool.workers}", duration, lambda: len(latencies)):
        cpu0 = _cpu_seconds()
        seconds = asyncio.run(load())
        cpu = _cpu_seconds() - cpu0
    return _engine_measurement("served", running, latencies, seconds, cpu)


def _engine_measurement(kind: str, running: engine.Engine, latencies: list[float], seconds: float, cpu: float) -> Measurement:
    """A run through ``running``'s pool, labelled ``kind-<workers>``."""
    workers = running.pool.workers
    return Measurement(
        f"{kind}-{workers}", workers, running.intra_op_threads, len(latencies), seconds, latencies, cpu, _rss_bytes()
    )


def _nothing(_processor: Any) -> None:
    return None


def measure_dispatch(running: engine.Engine, duration: float) -> dict[str, float]:
    """What the pool itself costs per job: the same closed loop with jobs that do nothing.

    This is the executor's whole per-job work (queue, future, accounting, the callback that
    submits the next job) without the processor: the overhead against a direct call, measured
    without the noise of two 15 ms workloads compared across slices.
    """
    measured = measure_pool(running, _nothing, duration, False)
    return {
        "jobs": measured.requests,
        "us_per_job": round(measured.seconds / max(1, measured.requests) * 1e6, 1),
        "cpu_us_per_job": round(measured.cpu_seconds / max(1, measured.requests) * 1e6, 1),
    }


def merge(parts: list[Measurement]) -> Measurement:
    first = parts[0]
    return Measurement(
        first.label,
        first.workers,
        first.intra_op_threads,
        sum(p.requests for p in parts),
        sum(p.seconds for p in parts),
        [latency for p in parts for latency in p.latencies],
        sum(p.cpu_seconds for p in parts),
        max(p.rss_bytes for p in parts),
    )


def measure_sockets(
    socket_paths: tuple[str, ...], bodies: tuple[bytes, ...], duration: float, path: str = "/v1/chat/completions/render"
) -> Measurement:
    """Closed loop over vLLM render processes, one request in flight per process, for ``duration``.

    One thread per process posts ``bodies`` in turn to that process's socket, directly (not
    through mmprep's front): n sockets measure what n processes render. A non-200 answer stops
    the measurement with vLLM's words: a calibration must not choose from refused requests.
    """
    lock = threading.Lock()
    latencies: list[float] = []
    failures: list[str] = []
    started = time.perf_counter()
    stop_at = started + duration

    def load(socket_path: str, first: int) -> None:
        turn = first
        while time.perf_counter() < stop_at and not failures:
            body = bodies[turn % len(bodies)]
            turn += 1
            t0 = time.perf_counter()
            connection = UnixHTTPConnection(socket_path, timeout=max(60.0, duration * 4))
            try:
                connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
                response = connection.getresponse()
                answer = response.read()
            except OSError as exc:
                failures.append(f"render process on {socket_path}: {exc}")
                return
            finally:
                connection.close()
            if response.status != 200:
                failures.append(f"vLLM answered {response.status}: {answer[:300].decode(errors='replace')}")
                return
            with lock:
                latencies.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=load, args=(p, i), daemon=True) for i, p in enumerate(socket_paths)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise MeasureError(failures[0])
    seconds = time.perf_counter() - started
    return Measurement("processes", len(socket_paths), 1, len(latencies), seconds, latencies, 0.0, _rss_bytes())

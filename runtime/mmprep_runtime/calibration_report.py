"""Calibration: choosing a worker count from a measured curve, and the report that carries it.

A calibration run (``mmprep-runtime calibrate``, in a Job on one node of a pool) measures
throughput at processor worker counts 1..N on that node (or, for the vLLM render API's general
path, at vLLM render process counts 1..N: the report's ``dimension``) and picks a count with ``choose``. The
report travels to the operator as the Job's termination message; both halves parse it with
``Report.from_message`` here, so its format is defined once.

Import-light like ``sizing``: the operator imports this module and carries no torch.

Why "the smallest count within a tolerance of the best": a worker costs a processor copy (memory)
and, on the GPU path, contention for the device the model runs on. A count that measures 2% above
a smaller one on a noisy machine has not earned its cost, so the smaller count wins unless the
larger one is clearly (more than ``tolerance``) better.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from mmprep_runtime.contract import ContractError, json_object
from mmprep_runtime.exits import TERMINATION_MESSAGE_MAX_BYTES
from mmprep_runtime.sizing import MAX_WORKERS, MIN_WORKERS, is_worker_count

DEFAULT_TOLERANCE: Final = 0.05
MAX_REPORT_BYTES: Final = TERMINATION_MESSAGE_MAX_BYTES
#: What a curve's counts are: processor worker threads (the native processing) or, for the vLLM
#: render API's general path, vLLM render processes (one thread each: vLLM's processing holds the GIL).
Dimension = Literal["processorWorkers", "renderProcesses"]
PROCESSOR_WORKERS: Final[Dimension] = "processorWorkers"
RENDER_PROCESSES: Final[Dimension] = "renderProcesses"
DIMENSIONS: Final[tuple[Dimension, ...]] = (PROCESSOR_WORKERS, RENDER_PROCESSES)
_NOUNS: Final = {PROCESSOR_WORKERS: "worker(s)", RENDER_PROCESSES: "render process(es)"}


class CalibrationError(ValueError):
    """A curve no choice can be made from, or a report that cannot be read."""


@dataclasses.dataclass(frozen=True)
class CurvePoint:
    workers: int
    req_per_s: float
    p50_ms: float | None = None
    p99_ms: float | None = None


@dataclasses.dataclass(frozen=True)
class Choice:
    workers: int
    best_workers: int
    best_req_per_s: float
    tolerance: float
    dimension: Dimension = PROCESSOR_WORKERS

    def explanation(self) -> str:
        noun = _NOUNS[self.dimension]
        if self.workers == self.best_workers:
            return f"{self.workers} {noun} measured fastest ({self.best_req_per_s:g} req/s)"
        return (
            f"{self.workers} {noun}: the fewest within {self.tolerance:.0%} of the best "
            f"({self.best_workers} {noun}, {self.best_req_per_s:g} req/s)"
        )


def check_tolerance(tolerance: float) -> None:
    """A tolerance is a fraction of the best throughput: 0 (only the best) up to, not including, 1."""
    if not 0 <= tolerance < 1:
        raise CalibrationError(f"tolerance must be in [0, 1), got {tolerance}")


def choose(curve: Sequence[CurvePoint], tolerance: float = DEFAULT_TOLERANCE) -> Choice:
    """The smallest worker count whose throughput is within ``tolerance`` of the best one.

    Ties go to fewer workers by construction. Raises ``CalibrationError`` for a curve that
    cannot be judged (empty, repeated counts, no positive throughput).
    """
    check_tolerance(tolerance)
    if not curve:
        raise CalibrationError("the curve has no points")
    counts = [p.workers for p in curve]
    if len(set(counts)) != len(counts):
        raise CalibrationError(f"the curve measures a worker count twice: {sorted(counts)}")
    if not all(is_worker_count(c) for c in counts):
        raise CalibrationError(f"worker counts must be between {MIN_WORKERS} and {MAX_WORKERS}: {sorted(counts)}")
    usable = [p for p in curve if math.isfinite(p.req_per_s) and p.req_per_s > 0]
    if not usable:
        raise CalibrationError("no worker count completed a request")
    best = max(usable, key=lambda p: (p.req_per_s, -p.workers))
    floor = best.req_per_s * (1 - tolerance)
    chosen = min((p for p in usable if p.req_per_s >= floor), key=lambda p: p.workers)
    return Choice(chosen.workers, best.workers, best.req_per_s, tolerance)


def worker_counts(max_workers: int) -> list[int]:
    """1..max_workers, bounded by the decision's limits."""
    top = max(MIN_WORKERS, min(MAX_WORKERS, max_workers))
    return list(range(MIN_WORKERS, top + 1))


@dataclasses.dataclass(frozen=True)
class Report:
    """What a calibration run answers; ``error`` set means it could not measure."""

    curve: tuple[CurvePoint, ...] = ()
    chosen: int | None = None
    best: int | None = None
    tolerance: float = DEFAULT_TOLERANCE
    usable_cpus: int | None = None
    images: tuple[str, ...] = ()
    seconds_per_count: float | None = None
    error: str | None = None
    #: What the counts are (``DIMENSIONS``); a report without it measured processor workers.
    dimension: Dimension = PROCESSOR_WORKERS

    def to_message(self) -> str:
        """The report as the calibration Job's termination message: compact JSON within its bound."""
        data: dict[str, Any] = {
            "curve": [{"workers": p.workers, "reqPerS": p.req_per_s, "p50Ms": p.p50_ms, "p99Ms": p.p99_ms} for p in self.curve],
            "chosen": self.chosen,
            "best": self.best,
            "tolerance": self.tolerance,
            "usableCpus": self.usable_cpus,
            "images": list(self.images),
            "secondsPerCount": self.seconds_per_count,
            "error": self.error,
            "dimension": self.dimension,
        }
        text = json.dumps(data, separators=(",", ":"), sort_keys=True)
        if len(text.encode()) > MAX_REPORT_BYTES:
            # Only a very long error or image list gets here; the curve (<= 64 short points) fits.
            data["images"] = data["images"][:4]
            data["error"] = None if self.error is None else self.error[:500]
            text = json.dumps(data, separators=(",", ":"), sort_keys=True)
        return text

    @classmethod
    def from_message(cls, text: str) -> Report:
        """The report as the runtime wrote it; raises ``CalibrationError`` naming what is wrong."""
        try:
            data = json_object(text, "calibration output")
        except ContractError as exc:
            raise CalibrationError(str(exc)) from None
        raw_curve = data.get("curve") or []
        if not isinstance(raw_curve, list):
            raise CalibrationError("calibration curve is not a list")
        curve = []
        for raw in raw_curve:
            if not isinstance(raw, Mapping) or not isinstance(raw.get("workers"), int):
                raise CalibrationError(f"calibration curve point is malformed: {raw!r}")
            curve.append(
                CurvePoint(
                    workers=int(raw["workers"]),
                    req_per_s=_number(raw.get("reqPerS"), "reqPerS") or 0.0,
                    p50_ms=_number(raw.get("p50Ms"), "p50Ms"),
                    p99_ms=_number(raw.get("p99Ms"), "p99Ms"),
                )
            )
        chosen = data.get("chosen")
        if chosen is not None and not is_worker_count(chosen):
            raise CalibrationError(f"calibration chose an impossible worker count: {chosen!r}")
        dimension = next((d for d in DIMENSIONS if d == data.get("dimension", PROCESSOR_WORKERS)), None)
        if dimension is None:
            raise CalibrationError(f"calibration measured an unknown dimension: {data.get('dimension')!r}")
        error = data.get("error")
        if error is None and chosen is None:
            raise CalibrationError("calibration output has neither a chosen count nor an error")
        return cls(
            curve=tuple(curve),
            chosen=chosen,
            best=data.get("best") if isinstance(data.get("best"), int) else None,
            tolerance=_number(data.get("tolerance"), "tolerance") or DEFAULT_TOLERANCE,
            usable_cpus=data.get("usableCpus") if isinstance(data.get("usableCpus"), int) else None,
            images=tuple(str(i) for i in data.get("images") or ()),
            seconds_per_count=_number(data.get("secondsPerCount"), "secondsPerCount"),
            error=None if error is None else str(error),
            dimension=dimension,
        )


def _number(value: Any, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CalibrationError(f"{what} must be a number, got {value!r}")
    return float(value)

"""Choosing a worker count from a measured curve, and the report both halves read."""

from __future__ import annotations

import json

import pytest

from mmprep_runtime.calibration_report import (
    MAX_REPORT_BYTES,
    PROCESSOR_WORKERS,
    RENDER_PROCESSES,
    CalibrationError,
    Choice,
    CurvePoint,
    Report,
    choose,
    worker_counts,
)
from mmprep_runtime.sizing import ComputePath, WorkerReason, decide_workers


def curve(*rates: float) -> list[CurvePoint]:
    return [CurvePoint(workers, rate) for workers, rate in enumerate(rates, start=1)]


def test_a_clear_gain_picks_the_faster_count() -> None:
    assert choose(curve(60.0, 118.0)).workers == 2


def test_noise_within_the_tolerance_keeps_fewer_workers() -> None:
    # 3 and 4 workers measure 3% and 1% above 2 on a noisy node: not worth their cost.
    choice = choose(curve(60.0, 117.0, 120.5, 118.2))
    assert (choice.workers, choice.best_workers) == (2, 3)
    assert "within 5%" in choice.explanation()


def test_a_tie_goes_to_fewer_workers() -> None:
    assert choose(curve(50.0, 80.0, 80.0)).workers == 2
    assert choose(curve(50.0, 80.0, 80.0), tolerance=0.0).workers == 2


def test_a_curve_that_falls_after_two_picks_two() -> None:
    # The GPU-path lesson the other way round: more workers make it slower past a point.
    choice = choose(curve(40.0, 70.0, 52.0, 31.0))
    assert (choice.workers, choice.best_workers) == (2, 2)
    assert "measured fastest" in choice.explanation()


def test_a_falling_curve_from_the_start_picks_one() -> None:
    # GB300's GPU path: 9.30 -> 4.02 req/s with a second worker.
    assert choose(curve(9.30, 4.02)).workers == 1


def test_a_flat_curve_picks_one() -> None:
    assert choose(curve(30.0, 30.6, 29.8, 30.9)).workers == 1


def test_a_larger_tolerance_trades_throughput_for_fewer_workers() -> None:
    rates = curve(60.0, 100.0, 110.0)
    assert choose(rates, tolerance=0.05).workers == 3
    assert choose(rates, tolerance=0.10).workers == 2


def test_counts_that_completed_nothing_are_ignored() -> None:
    assert choose([CurvePoint(1, 0.0), CurvePoint(2, 12.0)]).workers == 2


@pytest.mark.parametrize(
    ("points", "tolerance", "message"),
    [
        ([], 0.05, "no points"),
        ([CurvePoint(1, 10.0), CurvePoint(1, 11.0)], 0.05, "twice"),
        ([CurvePoint(1, 0.0), CurvePoint(2, float("nan"))], 0.05, "completed a request"),
        ([CurvePoint(0, 1.0)], 0.05, "between"),
        ([CurvePoint(1, 1.0)], 1.0, "tolerance"),
    ],
)
def test_curves_no_choice_can_be_made_from(points: list[CurvePoint], tolerance: float, message: str) -> None:
    with pytest.raises(CalibrationError, match=message):
        choose(points, tolerance)


def test_worker_counts_stay_within_the_decision_bounds() -> None:
    assert worker_counts(4) == [1, 2, 3, 4]
    assert worker_counts(0) == [1]
    assert worker_counts(500)[-1] == 64


def test_a_measurement_ranks_below_explicit_and_override_and_above_the_path_rules() -> None:
    assert decide_workers(path=ComputePath.GPU, cloneable=True, measured=2).reason is WorkerReason.MEASURED
    assert decide_workers(path=ComputePath.GPU, cloneable=True, measured=2).processor_workers == 2  # beats GPUPathCap
    assert decide_workers(path=ComputePath.CPU, cloneable=True, declared=4, measured=3).processor_workers == 3
    assert decide_workers(path=ComputePath.CPU, cloneable=True, explicit=5, measured=3).reason is WorkerReason.EXPLICIT
    assert decide_workers(path=ComputePath.CPU, cloneable=True, override=6, measured=3).reason is WorkerReason.OVERRIDE
    assert decide_workers(path=ComputePath.CPU, cloneable=False, measured=3).processor_workers == 1
    with pytest.raises(ValueError, match="measured processor workers"):
        decide_workers(path=ComputePath.CPU, cloneable=True, measured=0)


def test_a_report_survives_the_trip_through_a_termination_message() -> None:
    report = Report(curve=tuple(curve(60.0, 118.5)), chosen=2, best=2, tolerance=0.05, usable_cpus=2, images=("1280x960",))
    assert Report.from_message(report.to_message()) == Report(
        curve=tuple(curve(60.0, 118.5)), chosen=2, best=2, tolerance=0.05, usable_cpus=2, images=("1280x960",)
    )


def test_a_report_with_a_huge_error_still_fits_in_a_termination_message() -> None:
    text = Report(error="x" * 10_000, images=tuple(f"img{i}.jpg" for i in range(500))).to_message()
    assert len(text.encode()) <= MAX_REPORT_BYTES
    assert Report.from_message(text).error == "x" * 500


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not JSON"),
        ("[]", "not a JSON object"),
        ('{"curve": 3, "chosen": 1}', "not a list"),
        ('{"curve": [{"workers": "two"}], "chosen": 1}', "malformed"),
        ('{"curve": [{"workers": 1, "reqPerS": "fast"}], "chosen": 1}', "reqPerS must be a number"),
        ('{"curve": [], "chosen": 99}', "impossible worker count"),
        ('{"curve": []}', "neither a chosen count nor an error"),
        ('{"curve": [], "chosen": 1, "dimension": "gpus"}', "unknown dimension"),
    ],
)
def test_unreadable_reports_name_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(CalibrationError, match=message):
        Report.from_message(text)


def test_the_report_is_compact_json() -> None:
    data = json.loads(Report(curve=tuple(curve(1.0)), chosen=1).to_message())
    assert data["curve"] == [{"workers": 1, "reqPerS": 1.0, "p50Ms": None, "p99Ms": None}]


def test_a_processor_declared_not_thread_safe_gets_one_worker_even_when_more_are_asked_for() -> None:
    plain = decide_workers(path=ComputePath.CPU, cloneable=True, thread_safe=False)
    assert (plain.processor_workers, plain.reason) == (1, WorkerReason.NOT_THREAD_SAFE)
    asked = decide_workers(path=ComputePath.CPU, cloneable=True, thread_safe=False, explicit=4, measured=3)
    assert (asked.processor_workers, asked.reason, asked.explicit_not_honoured) == (1, WorkerReason.NOT_THREAD_SAFE, 4)
    # Cloneability is the older, stronger fact: it names the reason when both hold.
    assert decide_workers(path=ComputePath.CPU, cloneable=False, thread_safe=False).reason is WorkerReason.NOT_CLONEABLE


def test_io_workers_come_from_the_explicit_count_then_the_models_declaration_then_the_default() -> None:
    assert decide_workers(path=ComputePath.CPU, cloneable=True).io_workers == 4
    assert decide_workers(path=ComputePath.CPU, cloneable=True, declared_io=6).io_workers == 6
    assert decide_workers(path=ComputePath.CPU, cloneable=True, declared_io=6, explicit_io=2).io_workers == 2


def test_a_report_says_what_it_measured_and_an_older_one_measured_workers() -> None:
    processes = Report(curve=tuple(curve(40.0, 79.0)), chosen=2, best=2, dimension=RENDER_PROCESSES)
    assert Report.from_message(processes.to_message()).dimension == RENDER_PROCESSES
    older = json.dumps({"curve": [{"workers": 1, "reqPerS": 1.0}], "chosen": 1})
    assert Report.from_message(older).dimension == PROCESSOR_WORKERS


def test_the_explanation_names_what_was_counted() -> None:
    assert Choice(2, 2, 79.0, 0.05, RENDER_PROCESSES).explanation() == "2 render process(es) measured fastest (79 req/s)"
    assert Choice(1, 2, 80.0, 0.05).explanation().startswith("1 worker(s): the fewest within 5%")

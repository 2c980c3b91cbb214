"""`mmprep-operator run` without flags and a Controller built without arguments run alike."""

from __future__ import annotations

import pathlib

import yaml

from mmprep_operator import cli
from mmprep_operator.api import policy
from mmprep_operator.api.policy import OperatorPolicy, load_policy
from mmprep_operator.control.controller import Controller
from mmprep_operator.control.metrics import Metrics


def test_the_run_command_and_a_bare_controller_use_the_same_worker_counts() -> None:
    args = cli.build_parser().parse_args(["run"])
    controller = Controller(metrics=Metrics())
    assert (args.workers, args.urgent_workers) == (controller.workers, controller.urgent_workers)
    assert (args.workers, args.urgent_workers) == (policy.DEFAULT_WORKERS, policy.DEFAULT_URGENT_WORKERS)


def test_a_bare_controller_resyncs_as_often_as_the_default_policy_says() -> None:
    # cmd_run hands the policy's period to the Controller; without a policy file it is this one.
    assert Controller(metrics=Metrics()).resync_seconds == OperatorPolicy().resync_seconds == load_policy(None).resync_seconds


def test_the_run_command_says_the_defaults_it_uses() -> None:
    args = cli.build_parser().parse_args(["run"])
    assert (args.metrics_port, args.liveness_port) == (policy.DEFAULT_METRICS_PORT, policy.DEFAULT_LIVENESS_PORT)
    run_help = next(
        action.choices["run"].format_help() for action in cli.build_parser()._actions if getattr(action, "choices", None)
    )
    for flag, value in (
        ("--workers", args.workers),
        ("--urgent-workers", args.urgent_workers),
        ("--metrics-port", args.metrics_port),
    ):
        assert flag in run_help and f"(default {value})" in run_help


def test_the_charts_defaults_are_the_operators() -> None:
    """The chart passes these explicitly; an install without values runs as the CLI would."""
    chart = pathlib.Path(__file__).resolve().parents[3] / "charts" / "mmprep" / "values.yaml"
    values = yaml.safe_load(chart.read_text())
    operator = values["operator"]
    assert (operator["workers"], operator["urgentWorkers"]) == (policy.DEFAULT_WORKERS, policy.DEFAULT_URGENT_WORKERS)
    assert (operator["metricsPort"], operator["livenessPort"]) == (policy.DEFAULT_METRICS_PORT, policy.DEFAULT_LIVENESS_PORT)
    assert values["policy"]["resyncSeconds"] == policy.DEFAULT_RESYNC_SECONDS
    assert values["policy"]["engineCheckSeconds"] == policy.DEFAULT_ENGINE_CHECK_SECONDS

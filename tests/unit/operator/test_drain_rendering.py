"""``spec.drain`` on the runtime pods: the grace period Kubernetes gives them, and the drain env the
runtime reads back as its window and shutdown timeout, which together fit in that grace period."""

from __future__ import annotations

import argparse
import signal
from typing import Any

from conftest import make_node

from mmprep_operator import api
from mmprep_operator.api.policy import OperatorPolicy
from mmprep_operator.logic import identity, pod_parts
from mmprep_operator.logic.plan import make_plan
from mmprep_runtime import cli
from mmprep_runtime.commands import serve
from mmprep_runtime.contract import ENV_DRAIN_SECONDS, ENV_SHUTDOWN_TIMEOUT_SECONDS, SHUTDOWN_STOP_SECONDS
from mmprep_runtime.settings import serve_settings_from_args

OWNER = identity.Owner("m", "ns", "uid-m")


def _deployment(spec: dict[str, Any]) -> dict[str, Any]:
    parsed = api.MultimodalPreprocessorSpec.model_validate({"model": {"path": "/models/m"}, **spec})
    plan = make_plan(OWNER, parsed, [make_node("cpu-a", {})], api.ProbeResult(cloneable=True), OperatorPolicy())
    (deployment,) = [o for o in plan.objects if o["kind"] == "Deployment"]
    return deployment


def _runtime(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["name"] == pod_parts.CONTAINER_NAME
    return container


def _env(container: dict[str, Any]) -> dict[str, str]:
    # Later entries win in Kubernetes, as in this dict.
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def _runtime_load(container: dict[str, Any]):
    args: argparse.Namespace = cli.build_parser().parse_args(container["command"][1:])
    return serve_settings_from_args(args, _env(container)).load


def test_by_default_pods_get_a_10_s_window_and_30_s_for_requests_in_flight_within_45_s() -> None:
    deployment = _deployment({})
    container = _runtime(deployment)
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 45
    assert (_env(container)[ENV_DRAIN_SECONDS], _env(container)[ENV_SHUTDOWN_TIMEOUT_SECONDS]) == ("10", "30")
    # The preStop hook begins the runtime's drain (the signal its serve command handles), then waits
    # out the window; the kubelet's SIGTERM comes after it.
    assert container["lifecycle"] == {"preStop": {"exec": {"command": ["/bin/sh", "-c", "kill -USR1 1; sleep 10"]}}}
    load = _runtime_load(container)
    assert (load.drain_s, load.shutdown_grace_s) == (10.0, 30.0)


def test_without_a_window_there_is_no_prestop_hook_and_sigterm_alone_stops_the_pod() -> None:
    container = _runtime(_deployment({"drain": {"seconds": 0, "gracePeriodSeconds": 6}}))
    assert "lifecycle" not in container


def test_the_hooks_signal_is_the_one_the_runtime_begins_its_drain_on() -> None:
    (script,) = _runtime(_deployment({}))["lifecycle"]["preStop"]["exec"]["command"][2:]
    sent = script.split()[1].lstrip("-")
    assert signal.Signals[f"SIG{sent}"] == serve.DRAIN_SIGNAL


def test_the_runtime_reads_back_a_drain_that_fits_in_the_grace_period_it_is_given() -> None:
    for drain in (
        {"seconds": 0, "gracePeriodSeconds": 6},
        {"seconds": 20, "gracePeriodSeconds": 120},
        {"seconds": 600, "gracePeriodSeconds": 3600},
    ):
        deployment = _deployment({"drain": drain})
        load = _runtime_load(_runtime(deployment))
        grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace == drain["gracePeriodSeconds"]
        assert load.drain_s == drain["seconds"] and load.shutdown_grace_s >= 1
        assert load.drain_s + load.shutdown_grace_s + SHUTDOWN_STOP_SECONDS == grace


def test_the_operators_drain_env_wins_over_the_users_and_the_decision_comes_last() -> None:
    container = _runtime(_deployment({"env": [{"name": ENV_DRAIN_SECONDS, "value": "999"}]}))
    names = [e["name"] for e in container["env"]]
    users, operators = [i for i, name in enumerate(names) if name == ENV_DRAIN_SECONDS]
    assert users < operators and container["env"][operators]["value"] == "10" == _env(container)[ENV_DRAIN_SECONDS]
    assert names[-1] == "MMPREP_DECISION_REASON"


def test_a_drain_change_rolls_the_pods_through_their_template() -> None:
    before = _deployment({})["spec"]["template"]
    after = _deployment({"drain": {"seconds": 15}})["spec"]["template"]
    assert before != after and after["spec"]["terminationGracePeriodSeconds"] == 45

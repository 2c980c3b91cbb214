"""Calibration for real: a pool on the test agent's node measures its worker count with a real
bench run (real processor, real threads, a real curve), while a KWOK pool, whose nodes run
nothing, falls back to the rule and says why."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.kube import AGENT_LABEL, AGENT_NODE, AGENT_TOLERATION, Kube, condition_is, container_env, pools, wait_for
from support.operator_process import OperatorProcess
from support.specs import make_spec

from mmprep_runtime.calibration_report import Report

# A probe and a real calibration run (3 processor loads, 2 measured counts) on a shared two-core
# machine: about a minute alone, several while other builds share the cores.
TIMEOUT = 600
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(TIMEOUT + 120)]


def _either(*terms: tuple[str, str]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": k, "operator": "In", "values": [v]}]} for k, v in terms]
            }
        }
    }


def test_the_agent_pool_is_measured_and_the_kwok_pool_falls_back_visibly(
    kube: Kube, operator: OperatorProcess, namespace: str, model_dir: Callable[..., Path]
) -> None:
    spec = make_spec(
        model_dir("qwen2-vl"),
        replicas=2,
        workers={"calibrate": True},
        # Two pools: the agent's node (it really runs pods) and KWOK's simulated H200 nodes.
        affinity=_either((AGENT_LABEL, "true"), ("mmprep.dev/simulated-pool", "h200")),
        tolerations=[dict(AGENT_TOLERATION)],
        resources={"requests": {"cpu": "250m"}, "limits": {"cpu": "2", "memory": "4Gi"}},
    )
    kube.create_mmp(namespace, "calib", spec)

    def settled() -> dict[str, Any] | None:
        obj = kube.get_mmp(namespace, "calib")
        found = {p["name"]: p for p in pools(obj)}
        states = [(p.get("calibration") or {}).get("state") for p in found.values()]
        return obj if len(found) == 2 and all(s in ("Succeeded", "Failed") for s in states) else None

    obj = wait_for(
        settled,
        TIMEOUT,
        what="both pools' calibrations settled",
        describe=lambda: f"{json.dumps(kube.get_mmp(namespace, 'calib').get('status'), indent=1)}\n{operator.tail(30)}",
    )
    by_name = {p["name"]: p for p in pools(obj)}
    agent = by_name["cpu"]
    kwok = next(p for name, p in by_name.items() if name != "cpu")

    # The agent's pool: a real curve, measured on the agent's node, and the decision follows it.
    cal = agent["calibration"]
    assert (cal["state"], cal["reason"], cal["node"]) == ("Succeeded", "Measured", AGENT_NODE), cal
    assert [p["workers"] for p in cal["curve"]] == [1, 2]
    assert all(p["reqPerS"] > 0 and p["p99Ms"] >= p["p50Ms"] > 0 for p in cal["curve"])
    best = max(cal["curve"], key=lambda p: p["reqPerS"])
    chosen = next(p for p in cal["curve"] if p["workers"] == cal["chosenWorkers"])
    assert chosen["reqPerS"] >= best["reqPerS"] * (1 - cal["tolerance"])
    assert (agent["reason"], agent["processorWorkers"]) == ("Measured", cal["chosenWorkers"])
    # The report came from the Job's pod, through the kubelet's termination message.
    [pod] = kube.pods(namespace, f"job-name={cal['job']}")
    assert pod.spec.node_name == AGENT_NODE
    report = Report.from_message(pod.status.container_statuses[0].state.terminated.message)
    assert report.chosen == cal["chosenWorkers"]

    # The KWOK pool: its Job "succeeds" without running anything, so there is no report.
    kcal = kwok["calibration"]
    assert (kcal["state"], kcal["reason"]) == ("Failed", "CalibrationFailed"), kcal
    assert "no report" in kcal["message"]
    # ... and the pool keeps what the rules decide (the model's declared count, else the default).
    declared = obj["status"]["probe"]["result"].get("declaredWorkers")
    rule = ("ModelDeclared", declared) if declared else ("CPUPathDefault", 2)
    assert (kwok["reason"], kwok["processorWorkers"]) == rule

    assert obj["status"]["calibrationSummary"] == f"cpu=measured,{kwok.get('gpuModel') or kwok['name']}=failed"

    def deployment_follows() -> bool:
        dep = kube.apps.read_namespaced_deployment(agent["deployment"], namespace)
        return container_env(dep).get("MMPREP_PROCESSOR_WORKERS") == str(cal["chosenWorkers"])

    wait_for(deployment_follows, 60, what="the agent pool's Deployment carrying the measured count")
    reasons = {e.reason for e in kube.core.list_namespaced_event(namespace).items}
    assert {"Calibrated", "CalibrationFailed"} <= reasons
    assert condition_is(kube.get_mmp(namespace, "calib"), "Probed", "True")


def test_a_vllm_render_pool_on_the_general_path_measures_render_processes(
    kube: Kube, operator: OperatorProcess, namespace: str, model_dir: Callable[..., Path]
) -> None:
    """The vLLM image's calibration, for real: the resource asks for the general path (the probe, in
    the vLLM image, finds Qwen2-Audio's native one), so the Job measures vLLM render processes on
    the agent's node and the pool's Deployment gets the chosen count. No runtime pod runs (replicas 0): the measurement is
    what is under test, and two of vLLM's processes are what this machine can run at once."""
    spec = make_spec(
        model_dir("qwen2-audio"),
        api="vllm-render",
        image="mmprep-runtime-vllm:test",
        replicas=0,
        workers={"calibrate": True},
        serving={"vllmArgs": ["--mm-processor-cache-gb", "0"], "renderPath": "general"},
        affinity=_either((AGENT_LABEL, "true")),
        tolerations=[dict(AGENT_TOLERATION)],
        resources={"requests": {"cpu": "250m"}, "limits": {"cpu": "2", "memory": "8Gi"}},
    )
    kube.create_mmp(namespace, "general", spec)

    def settled() -> dict[str, Any] | None:
        obj = kube.get_mmp(namespace, "general")
        cal = next(iter((p.get("calibration") or {}) for p in pools(obj)), {})
        return obj if cal.get("state") in ("Succeeded", "Failed") else None

    obj = wait_for(
        settled,
        TIMEOUT,
        what="the general path's calibration settled",
        describe=lambda: f"{json.dumps(kube.get_mmp(namespace, 'general').get('status'), indent=1)}\n{operator.tail(30)}",
    )
    assert obj["status"]["probe"]["result"]["renderPath"] == "native", obj["status"]["probe"]
    (pool,) = pools(obj)
    cal = pool["calibration"]
    assert (cal["state"], cal["measures"], cal["node"]) == ("Succeeded", "renderProcesses", AGENT_NODE), cal
    assert [p["workers"] for p in cal["curve"]] == [1, 2] and all(p["reqPerS"] > 0 for p in cal["curve"])
    assert cal["message"].startswith(f"{cal['chosenRenderProcesses']} render process(es)")
    assert pool["renderProcesses"] == cal["chosenRenderProcesses"]
    # The count reaches the pods as env; the worker threads keep their rule. The operator reports
    # a changed decision before it applies the Deployment (``report_first``): wait for the apply.
    env = wait_for(
        lambda: (
            (e := container_env(kube.apps.read_namespaced_deployment(pool["deployment"], namespace))).get(
                "MMPREP_RENDER_PROCESSES"
            )
            and e
        ),
        60,
        what="the chosen render process count in the Deployment's env",
    )
    assert env["MMPREP_RENDER_PROCESSES"] == str(cal["chosenRenderProcesses"])
    assert pool["reason"] != "Measured"

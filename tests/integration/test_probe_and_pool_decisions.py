"""The operator probes for real and decides workers per pool, end to end on the local cluster.

The probe Job runs ``mmprep-runtime probe`` as a real process on the agent's node; the runtime
Deployments land on KWOK's simulated H200 / GB300 / CPU nodes from hack/nodes.yaml.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.kube import (
    AGENT_NODE,
    Kube,
    condition,
    condition_is,
    container_env,
    pool_for,
    pools,
    wait_for,
)
from support.operator_process import OperatorProcess
from support.specs import CPU_POOL, GB300_POOL, GPU_LIMIT, H200, make_spec

pytestmark = pytest.mark.cluster

PROBE_TIMEOUT = 180  # a real processor load per probe on a shared two-core machine


def wait_decided(kube: Kube, operator: OperatorProcess, namespace: str, name: str, n_pools: int = 1) -> dict[str, Any]:
    """The resource once probed and with ``n_pools`` pools in its status."""

    def decided() -> dict[str, Any] | None:
        obj = kube.get_mmp(namespace, name)
        probed = condition(obj, "Probed") or {}
        if probed.get("status") == "False" and probed.get("reason") not in ("ProbePending", "ProbeRunning"):
            raise AssertionError(f"probe failed: {probed}")
        return obj if condition_is(obj, "Probed", "True") and len(pools(obj)) == n_pools else None

    return wait_for(
        decided,
        PROBE_TIMEOUT,
        what=f"{namespace}/{name} probed with {n_pools} pool(s)",
        describe=lambda: f"{kube.get_mmp(namespace, name).get('status')}\noperator log:\n{operator.tail(30)}",
    )


def deployment_of(kube: Kube, namespace: str, pool: dict[str, Any]):
    return wait_for(
        lambda: kube.apps.read_namespaced_deployment(pool["deployment"], namespace),
        30,
        what=f"Deployment {pool['deployment']}",
    )


def test_h200_pool_runs_the_real_probe_and_takes_the_gpu_path_with_one_worker(
    kube: Kube, operator: OperatorProcess, namespace: str, model_dir: Callable[..., Path]
) -> None:
    model = model_dir("qwen2-vl")
    kube.create_mmp(namespace, "qwen", make_spec(model, nodeSelector=H200, resources=GPU_LIMIT, replicas=2))
    obj = wait_decided(kube, operator, namespace, "qwen")

    # The probe's own answer, from a real processor load on the agent's node.
    result = obj["status"]["probe"]["result"]
    assert result["cloneable"] is True
    assert result["processorClass"] == "Qwen2VLProcessor"
    assert result["fastImageProcessor"] is True
    job = kube.batch.read_namespaced_job(obj["status"]["probe"]["job"], namespace)
    assert job.status.succeeded == 1
    probe_pods = kube.pods(namespace, f"job-name={job.metadata.name}")
    assert [p.spec.node_name for p in probe_pods] == [AGENT_NODE]
    message = probe_pods[0].status.container_statuses[0].state.terminated.message
    assert json.loads(message)["processor_class"] == "Qwen2VLProcessor"

    assert condition_is(obj, "Probed", "True")
    assert condition_is(obj, "Cloneable", "True")
    [pool] = pools(obj)
    assert pool["gpuProduct"] == "NVIDIA-H200"
    assert pool["nodes"] == 2
    assert (pool["path"], pool["processorWorkers"], pool["reason"]) == ("gpu", 1, "GPUPathCap")
    assert pool["ioWorkers"] == 4
    assert "declares 2" in pool["message"], pool["message"]  # Qwen2-VL's built-in declaration, capped

    deployment = deployment_of(kube, namespace, pool)
    env = container_env(deployment)
    assert env["MMPREP_PROCESSOR_WORKERS"] == "1"
    assert env["MMPREP_IO_WORKERS"] == "4"
    assert env["MMPREP_DEVICE"] == "cuda"
    assert deployment.spec.template.spec.node_selector["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert deployment.spec.replicas == 2
    assert any(o.uid == obj["metadata"]["uid"] for o in deployment.metadata.owner_references)

    # KWOK runs the pods on the simulated H200 nodes; Ready follows the Deployment.
    ready = kube.wait_mmp(namespace, "qwen", lambda o: condition_is(o, "Ready", "True"), 60, what="Ready=True")
    assert pool_for(ready, "NVIDIA-H200")["readyReplicas"] == 2
    assert {p.spec.node_name for p in kube.pods(namespace, "mmprep.dev/pool")} <= {"kwok-h200-0", "kwok-h200-1"}


def test_cpu_pool_default_declared_explicit_and_policy_override(
    kube: Kube, operator: OperatorProcess, namespace: str, model_dir: Callable[..., Path]
) -> None:
    llava = model_dir("llava")
    declares_3 = model_dir("qwen2-vl", declared_workers=3)
    cases = {
        # name: (spec, pool, expected (path, workers, reason))
        "cpu-default": (make_spec(llava, nodeSelector=CPU_POOL), "cpu", ("cpu", 2, "CPUPathDefault")),
        "cpu-declared": (make_spec(declares_3, nodeSelector=CPU_POOL), "cpu", ("cpu", 3, "ModelDeclared")),
        "gpu-declared": (make_spec(declares_3, nodeSelector=H200, resources=GPU_LIMIT), "NVIDIA-H200", ("gpu", 1, "GPUPathCap")),
        "gpu-explicit": (
            make_spec(declares_3, nodeSelector=H200, resources=GPU_LIMIT, workers={"processor": 5}),
            "NVIDIA-H200",
            ("gpu", 5, "Explicit"),
        ),
        # The operator's policy (tests/conftest.py) says: GB300 on the GPU path gets 3.
        "gb300-policy-gpu": (
            make_spec(declares_3, nodeSelector=GB300_POOL, resources=GPU_LIMIT),
            "NVIDIA-GB300",
            ("gpu", 3, "Override"),
        ),
        "spec-override-wins": (
            make_spec(
                declares_3,
                nodeSelector=GB300_POOL,
                resources=GPU_LIMIT,
                workers={"overrides": [{"gpuFamily": "blackwell", "processor": 6}]},
            ),
            "NVIDIA-GB300",
            ("gpu", 6, "Override"),
        ),
    }
    for name, (spec, _, _) in cases.items():
        kube.create_mmp(namespace, name, spec)
    for name, (_, pool_name, expected) in cases.items():
        obj = wait_decided(kube, operator, namespace, name)
        pool = pool_for(obj, pool_name)
        assert pool is not None, pools(obj)
        assert (pool["path"], pool["processorWorkers"], pool["reason"]) == expected, (name, pool)
        env = container_env(deployment_of(kube, namespace, pool))
        assert env["MMPREP_PROCESSOR_WORKERS"] == str(expected[1]), name
        assert env["MMPREP_DEVICE"] == ("cuda" if expected[0] == "gpu" else "cpu"), name
    assert "policy" in pool_for(kube.get_mmp(namespace, "gb300-policy-gpu"), "NVIDIA-GB300")["overrideSource"]
    assert "spec" in pool_for(kube.get_mmp(namespace, "spec-override-wins"), "NVIDIA-GB300")["overrideSource"]
    # Two models in one namespace: two probes, however many resources share them.
    assert len([j for j in kube.jobs(namespace) if j.metadata.name.startswith("mmprep-probe-")]) == 2


def test_a_processor_that_cannot_be_deep_copied_gets_one_worker_a_condition_and_an_event(
    kube: Kube, operator: OperatorProcess, namespace: str, model_dir: Callable[..., Path]
) -> None:
    model = model_dir("uncloneable")
    # Its processor class ships with the model folder, so loading it is remote code to allow.
    spec = make_spec(model, nodeSelector=CPU_POOL, workers={"processor": 4})
    spec["model"]["trustRemoteCode"] = True
    kube.create_mmp(namespace, "stuck", spec)
    obj = wait_decided(kube, operator, namespace, "stuck")

    error = obj["status"]["probe"]["result"]["error"]
    assert obj["status"]["probe"]["result"]["cloneable"] is False and error
    cloneable = condition(obj, "Cloneable")
    assert cloneable["status"] == "False" and cloneable["reason"] == "NotCloneable"
    assert error[:40] in cloneable["message"], (error, cloneable["message"])
    [pool] = pools(obj)
    assert (pool["processorWorkers"], pool["reason"]) == (1, "NotCloneable")
    assert pool["explicitNotHonoured"] == 4
    assert container_env(deployment_of(kube, namespace, pool))["MMPREP_PROCESSOR_WORKERS"] == "1"
    events = wait_for(
        lambda: [e for e in kube.events(namespace, "stuck") if e.reason == "NotCloneable"],
        30,
        what="a NotCloneable Event",
        describe=lambda: [(e.reason, e.message) for e in kube.events(namespace, "stuck")],
    )
    assert events[0].type == "Warning"
    assert "deep-copied" in events[0].message

"""Per-pool availability and a status that says why, on the real API server: a disruption budget per
pool that the disruption controller really counts and that goes with its pool, a Service name
taken by someone else stopping the whole apply, the scheduler's verdict on pods that fit no node,
and a runtime that refuses to start reported with its own words."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes import client
from support.kube import AGENT_SELECTOR, AGENT_TOLERATION, Kube, condition, condition_is, pools, wait_for
from support.operator_process import OperatorProcess
from support.specs import CPU_POOL, GPU_LIMIT, H200, make_spec

pytestmark = pytest.mark.cluster


def budgets(kube: Kube, namespace: str) -> list[client.V1PodDisruptionBudget]:
    return list(client.PolicyV1Api(kube.api).list_namespaced_pod_disruption_budget(namespace).items)


def test_each_pool_has_an_owned_disruption_budget_that_counts_its_pods_and_goes_with_the_pool(
    kube: Kube, operator: OperatorProcess, namespace: str, model_dir: Callable[..., Path]
) -> None:
    # No selector: the H200 and GB300 pools (2 nodes each), one pod each.
    kube.create_mmp(namespace, "spread", make_spec(model_dir("qwen2-vl"), resources=GPU_LIMIT, replicas=2))
    obj = kube.wait_mmp(namespace, "spread", lambda o: condition_is(o, "Ready", "True"), 180, what="Ready")
    uid = obj["metadata"]["uid"]
    by_pool = {p["name"]: p for p in pools(obj)}
    # The GB300 pool is pinned to arm64, and its pod still found its (arm64) node.
    gb300 = next(p for p in by_pool.values() if p.get("gpuModel") == "GB300")
    assert gb300["arch"] == "arm64" and gb300["readyReplicas"] == 1

    deployments = {d.metadata.name: d for d in kube.deployments(namespace)}
    found = {b.metadata.name: b for b in budgets(kube, namespace)}
    assert sorted(found) == sorted(deployments)
    for name, budget in found.items():
        assert budget.metadata.owner_references[0].uid == uid
        assert budget.spec.max_unavailable == 1
        assert budget.spec.selector.match_labels == deployments[name].spec.selector.match_labels
    # The disruption controller counts each pool's running pod against its budget.
    wait_for(
        lambda: all(
            (b.status and b.status.expected_pods == 1 and b.status.current_healthy == 1) for b in budgets(kube, namespace)
        ),
        60,
        what="each budget counting its pool's pod",
        describe=lambda: [(b.metadata.name, b.status) for b in budgets(kube, namespace)],
    )

    kube.patch_mmp(namespace, "spread", {"spec": {"nodeSelector": H200}})
    wait_for(
        lambda: [b.metadata.name for b in budgets(kube, namespace)] == [n for n in deployments if "h200" in n] or None,
        60,
        what="the GB300 pool's budget pruned with its pool",
        describe=lambda: [b.metadata.name for b in budgets(kube, namespace)],
    )


def test_a_service_name_taken_by_someone_else_stops_the_whole_apply_until_it_is_freed(
    kube: Kube, operator: OperatorProcess, namespace: str, model_dir: Callable[..., Path]
) -> None:
    kube.core.create_namespaced_service(
        namespace,
        client.V1Service(
            metadata=client.V1ObjectMeta(name="taken"),
            spec=client.V1ServiceSpec(selector={"app": "someone-else"}, ports=[client.V1ServicePort(port=80)]),
        ),
    )
    kube.create_mmp(namespace, "taken", make_spec(model_dir("llava"), nodeSelector=CPU_POOL, replicas=2))
    obj = kube.wait_mmp(
        namespace, "taken", lambda o: (condition(o, "Degraded") or {}).get("reason") == "NameConflict", 180, what="NameConflict"
    )
    message = condition(obj, "Degraded")["message"]
    assert "Service" in message and "nothing of this resource is applied until it is resolved" in message
    assert condition(obj, "Ready")["status"] == "False"
    # The probe ran (the decision is in status), yet nothing that would consume capacity exists.
    assert pools(obj) and kube.deployments(namespace) == [] and budgets(kube, namespace) == []
    assert kube.core.read_namespaced_service("taken", namespace).spec.selector == {"app": "someone-else"}

    kube.core.delete_namespaced_service("taken", namespace)
    obj = kube.wait_mmp(namespace, "taken", lambda o: condition_is(o, "Ready", "True"), 120, what="Ready once the name is free")
    assert condition(obj, "Degraded")["reason"] == "AsExpected"
    assert len(kube.deployments(namespace)) == 1 and len(budgets(kube, namespace)) == 1


def test_pods_that_fit_no_node_report_the_schedulers_reason_per_pool(
    kube: Kube, operator: OperatorProcess, namespace: str, model_dir: Callable[..., Path]
) -> None:
    # The CPU pool's nodes have 64 cores each: a pod asking for 1000 fits none of them.
    spec = make_spec(model_dir("llava"), nodeSelector=CPU_POOL, replicas=1, resources={"requests": {"cpu": "1000"}})
    kube.create_mmp(namespace, "huge", spec)
    obj = kube.wait_mmp(
        namespace, "huge", lambda o: (condition(o, "Ready") or {}).get("reason") == "Unschedulable", 180, what="Unschedulable"
    )
    ready = condition(obj, "Ready")
    assert ready["status"] == "False" and "0/1 pods ready" in ready["message"]
    assert "Insufficient cpu" in ready["message"], ready["message"]
    [pool] = pools(obj)
    assert pool["problem"]["reason"] == "Unschedulable" and pool["problem"]["pods"] == 1
    assert pool["problem"]["message"].startswith("0/") and "Insufficient cpu" in pool["problem"]["message"]

    # Asking for what fits clears it: the scheduler's verdict is not left behind in status.
    kube.patch_mmp(namespace, "huge", {"spec": {"resources": {"requests": {"cpu": "1"}}}})
    obj = kube.wait_mmp(namespace, "huge", lambda o: condition_is(o, "Ready", "True"), 120, what="Ready after resizing")
    assert "problem" not in pools(obj)[0]


def test_a_runtime_that_refuses_to_start_is_reported_with_its_termination_message(
    kube: Kube, operator: OperatorProcess, namespace: str, model_dir: Callable[..., Path]
) -> None:
    # A real runtime process on the agent's node, given a device index that is not one.
    spec = make_spec(
        model_dir("qwen2-vl"),
        nodeSelector=dict(AGENT_SELECTOR),
        tolerations=[dict(AGENT_TOLERATION)],
        replicas=1,
        env=[{"name": "MMPREP_CUDA_DEVICE", "value": "gpu0"}],
    )
    kube.create_mmp(namespace, "refuses", spec)
    obj = kube.wait_mmp(
        namespace, "refuses", lambda o: (condition(o, "Ready") or {}).get("reason") == "DeviceFailed", 240, what="DeviceFailed"
    )
    [pool] = pools(obj)
    assert pool["problem"]["reason"] == "DeviceFailed"
    assert pool["problem"]["message"] == (
        "container runtime exited with code 3: MMPREP_CUDA_DEVICE must be a device index (0, 1, ...), got 'gpu0'"
    )
    assert "MMPREP_CUDA_DEVICE must be a device index" in condition(obj, "Ready")["message"]

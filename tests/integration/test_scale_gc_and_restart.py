"""Scale subresource, garbage collection, and an operator killed mid-reconcile converging cleanly."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from support.kube import Cluster, Kube, condition_is, pools, wait_for
from support.operator_process import OperatorProcess
from support.specs import CPU_POOL, GPU_LIMIT, H200, make_spec

pytestmark = pytest.mark.cluster

RESOURCE_LABEL = "mmprep.dev/resource"


def test_kubectl_scale_works_and_deleting_the_resource_collects_its_children(
    cluster: Cluster, kube: Kube, operator: OperatorProcess, namespace: str, model_dir: Callable[..., Path]
) -> None:
    # A GPU resource with no selector spans the shared H200 and GB300 pools (2 nodes each).
    kube.create_mmp(namespace, "scaled", make_spec(model_dir("qwen2-vl"), resources=GPU_LIMIT, replicas=2))
    kube.wait_mmp(namespace, "scaled", lambda o: condition_is(o, "Ready", "True"), 180, what="Ready")

    cluster.kubectl("scale", "-n", namespace, "mmp/scaled", "--replicas", "6")
    obj = kube.wait_mmp(
        namespace,
        "scaled",
        lambda o: o["status"].get("replicas") == 6 and o["status"].get("readyReplicas") == 6,
        60,
        what="6 ready replicas",
    )
    assert sum(p["replicas"] for p in pools(obj)) == 6
    assert sum(d.spec.replicas for d in kube.deployments(namespace)) == 6
    scale = kube.custom.get_namespaced_custom_object_scale(
        "mmprep.dev", "v1alpha1", namespace, "multimodalpreprocessors", "scaled"
    )
    assert scale["spec"]["replicas"] == 6 and scale["status"]["replicas"] == 6
    assert "mmprep.dev/resource=scaled" in scale["status"]["selector"]
    wide = cluster.kubectl("get", "mmp", "scaled", "-n", namespace, "-o", "wide").stdout
    assert "scaled" in wide and "gpu" in wide, wide

    children = {
        "deployments": lambda: kube.deployments(namespace),
        "services": lambda: list(kube.core.list_namespaced_service(namespace).items),
        "jobs": lambda: kube.jobs(namespace),
        "pods": lambda: kube.pods(namespace),
    }
    assert all(get() for get in children.values())
    cluster.kubectl("delete", "-n", namespace, "mmp/scaled", "--wait=true")
    for kind, get in children.items():
        wait_for(
            lambda get=get: not get(),
            60,
            what=f"{kind} garbage-collected",
            describe=lambda get=get: [o.metadata.name for o in get()],
        )


def test_an_operator_killed_mid_reconcile_converges_after_restart_without_duplicates(
    kube: Kube, operator: OperatorProcess, namespace: str, model_dir: Callable[..., Path]
) -> None:
    qwen, llava = model_dir("qwen2-vl"), model_dir("llava")
    names = [f"r{i}" for i in range(6)]
    for i, name in enumerate(names):
        spec = make_spec(qwen, nodeSelector=H200, resources=GPU_LIMIT) if i % 2 else make_spec(llava, nodeSelector=CPU_POOL)
        kube.create_mmp(namespace, name, spec)
    # Kill it as soon as it has started applying children: probes done, Deployments half made.
    wait_for(lambda: kube.deployments(namespace), 180, what="the first Deployment", describe=operator.tail)
    operator.kill()
    made_before = len(kube.deployments(namespace))
    print(f"deployments made before the kill: {made_before} of {len(names)}")

    operator.start()
    for name in names:
        kube.wait_mmp(namespace, name, lambda o: condition_is(o, "Ready", "True"), 120, what="Ready after restart")

    deployments = kube.deployments(namespace)
    assert len(deployments) == len(names) >= made_before, [d.metadata.name for d in deployments]
    owners = Counter(d.metadata.labels[RESOURCE_LABEL] for d in deployments)
    assert owners == Counter(names), owners
    # One ReplicaSet per Deployment: the restarted operator rendered identical pod templates.
    replica_sets = kube.apps.list_namespaced_replica_set(namespace).items
    assert Counter(rs.metadata.owner_references[0].name for rs in replica_sets) == Counter(d.metadata.name for d in deployments)
    # One probe Job per model, shared by the resources serving it.
    jobs = [j for j in kube.jobs(namespace) if j.metadata.name.startswith("mmprep-probe-")]
    assert len(jobs) == 2, [j.metadata.name for j in jobs]
    assert len(kube.core.list_namespaced_service(namespace).items) == len(names)
    for name in names:
        obj = kube.get_mmp(namespace, name)
        assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
        [pool] = pools(obj)
        assert pool["readyReplicas"] == 1

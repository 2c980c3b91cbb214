"""Node label changes move pools: labeling new GB300 nodes creates that pool, removing them deletes it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.kube import Kube, pool_for, pools, wait_for
from support.operator_process import OperatorProcess
from support.specs import GPU_LIMIT, make_spec

pytestmark = pytest.mark.cluster

GFD = {
    "NVIDIA-H200": {"nvidia.com/gpu.family": "hopper", "nvidia.com/gpu.count": "8", "nvidia.com/gpu.compute.major": "9"},
    "NVIDIA-GB300": {"nvidia.com/gpu.family": "blackwell", "nvidia.com/gpu.count": "4", "nvidia.com/gpu.compute.major": "10"},
}


class SimulatedNodes:
    """KWOK nodes a test creates, deleted afterwards even when the test fails."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.names: list[str] = []

    def create(self, name: str, product: str, labels: dict[str, str]) -> None:
        gpus = GFD[product]["nvidia.com/gpu.count"]
        resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": gpus}
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {
                    "type": "kwok",
                    "kubernetes.io/hostname": name,
                    "nvidia.com/gpu.product": product,
                    **GFD[product],
                    **labels,
                },
            },
            # Capacity as the device plugin would report it (the API server takes status on create).
            "status": {"capacity": resources, "allocatable": resources},
        }
        self.kube.core.create_node(node)
        self.names.append(name)

    def label(self, name: str, labels: dict[str, str | None]) -> None:
        self.kube.core.patch_node(name, {"metadata": {"labels": labels}})

    def delete(self, name: str) -> None:
        self.kube.core.delete_node(name)
        self.names.remove(name)

    def cleanup(self) -> None:
        for name in list(self.names):
            try:
                self.kube.core.delete_node(name, body=client.V1DeleteOptions(grace_period_seconds=0))
            except ApiException as exc:
                if exc.status != 404:
                    raise


@pytest.fixture
def nodes(kube: Kube) -> Iterator[SimulatedNodes]:
    made = SimulatedNodes(kube)
    yield made
    made.cleanup()


def test_labeling_new_gb300_nodes_creates_their_pool_and_removing_them_deletes_it(
    kube: Kube, operator: OperatorProcess, namespace: str, nodes: SimulatedNodes, model_dir: Callable[..., Path]
) -> None:
    # Only nodes carrying this test's own label are eligible, so the shared nodes do not interfere.
    mine = {"mmprep.dev/test-nodes": namespace}
    for i in range(2):
        nodes.create(f"{namespace}-h200-{i}", "NVIDIA-H200", mine)
    kube.create_mmp(namespace, "mover", make_spec(model_dir("qwen2-vl"), nodeSelector=mine, resources=GPU_LIMIT, replicas=4))
    obj = kube.wait_mmp(
        namespace, "mover", lambda o: [p.get("gpuProduct") for p in pools(o)] == ["NVIDIA-H200"], 180, what="one H200 pool"
    )
    assert pool_for(obj, "NVIDIA-H200")["replicas"] == 4

    # New GB300 trays join the cluster, then get labeled into this resource's scope.
    gb300 = [f"{namespace}-gb300-{i}" for i in range(2)]
    for name in gb300:
        nodes.create(name, "NVIDIA-GB300", {})
    for name in gb300:
        nodes.label(name, mine)
    # The pool may first appear with one node (the labels land one by one); wait for both.
    obj = kube.wait_mmp(
        namespace, "mover", lambda o: (pool_for(o, "NVIDIA-GB300") or {}).get("nodes") == 2, 30, what="a GB300 pool of 2"
    )
    gb = pool_for(obj, "NVIDIA-GB300")
    # The operator's policy (tests/conftest.py) encodes a GB300 GPU-path measurement: 3 workers.
    assert (gb["path"], gb["processorWorkers"], gb["reason"]) == ("gpu", 3, "Override")
    deployment = wait_for(lambda: kube.apps.read_namespaced_deployment(gb["deployment"], namespace), 30, what="GB300 Deployment")
    assert deployment.spec.template.spec.node_selector["nvidia.com/gpu.product"] == "NVIDIA-GB300"
    # Replicas follow the nodes: 4 pods over two pools of two nodes each.
    obj = kube.wait_mmp(
        namespace, "mover", lambda o: sorted(p["replicas"] for p in pools(o)) == [2, 2], 30, what="2 + 2 replicas"
    )

    # Removing one label shrinks the pool; removing the nodes deletes it and its Deployment.
    nodes.label(gb300[0], {"mmprep.dev/test-nodes": None})
    kube.wait_mmp(
        namespace, "mover", lambda o: (pool_for(o, "NVIDIA-GB300") or {}).get("nodes") == 1, 30, what="GB300 pool of 1 node"
    )
    nodes.delete(gb300[1])
    obj = kube.wait_mmp(namespace, "mover", lambda o: pool_for(o, "NVIDIA-GB300") is None, 30, what="GB300 pool gone")
    assert pool_for(obj, "NVIDIA-H200")["replicas"] == 4

    def deployment_gone() -> bool:
        try:
            kube.apps.read_namespaced_deployment(gb["deployment"], namespace)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(deployment_gone, 30, what="the GB300 Deployment deleted")
    wait_for(
        lambda: any(e.reason == "PoolRemoved" for e in kube.events(namespace, "mover")),
        30,
        what="a PoolRemoved Event",
    )

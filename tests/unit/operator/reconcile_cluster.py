"""The reconcile tests' cluster: the in-memory API fake, three GPU nodes, one Reconciler over them.

Shared by ``test_reconcile`` (passes that read the resource) and ``test_reconcile_from_the_watch``
(passes that start from the watch's copy).
"""

from __future__ import annotations

import datetime as dt
import json

from conftest import GB300, H200, make_node
from fake_kube import FakeKubeApi

from mmprep_operator.api.policy import OperatorPolicy
from mmprep_operator.control.metrics import Metrics
from mmprep_operator.control.reconcile import Reconciler

PROBE_OK = json.dumps({"cloneable": True, "fast_image_processor": True, "declared_workers": 2, "processor_class": "P"})
GPU_SPEC = {"model": {"path": "/models/m"}, "replicas": 3, "resources": {"limits": {"nvidia.com/gpu": 1}}}


class Cluster:
    def __init__(self) -> None:
        self.api = FakeKubeApi()
        self.nodes = [make_node("h200-a", H200, gpus=8), make_node("h200-b", H200, gpus=8), make_node("gb300-a", GB300, gpus=4)]
        self.metrics = Metrics()
        self.now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        self.reconciler = Reconciler(
            kube=self.api, policy=OperatorPolicy(), nodes=lambda: self.nodes, metrics=self.metrics, clock=lambda: self.now
        )

    async def reconcile(self, name: str = "m"):
        return await self.reconciler.reconcile("ns", name)

    def status(self, name: str = "m") -> dict:
        return self.api.resources[("ns", name)]["status"]

    def condition(self, type_: str, name: str = "m") -> tuple[str, str]:
        c = next(c for c in self.status(name)["conditions"] if c["type"] == type_)
        return c["status"], c["reason"]

    def job_name(self) -> str:
        (name,) = self.api.kinds("Job")
        return name


def watch_shows(cluster: Cluster) -> None:
    """Play the watch: feed the store every child as the API now holds it (with markers)."""
    for (kind, _namespace, _name), obj in cluster.api.objects.items():
        if kind in ("Deployment", "Service", "PodDisruptionBudget"):
            cluster.reconciler.children.observe(kind, "MODIFIED", obj)

"""Builders for the operator's unit tests: nodes with real GFD label sets, specs, probe answers."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import yaml

from mmprep_operator import api, yamlio
from mmprep_operator.api.policy import OperatorPolicy
from mmprep_operator.logic import identity
from mmprep_operator.logic.nodes import NodeFacts, node_facts
from mmprep_operator.logic.plan import make_plan

DATA = pathlib.Path(__file__).parent / "data"


def plan_objects(policy: OperatorPolicy | None = None, **spec_fields: Any) -> dict[str, dict[str, Any]]:
    """The objects the plan renders for ``data/cr.yaml`` (with ``spec_fields`` over its spec) on
    ``data/nodes.yaml``'s nodes, by kind."""
    body = yaml.safe_load((DATA / "cr.yaml").read_text())
    spec = api.MultimodalPreprocessorSpec.model_validate({**body["spec"], **spec_fields})
    nodes = [node_facts(n) for n in yamlio.load_objects((DATA / "nodes.yaml").read_text())]
    result = api.ProbeResult(cloneable=True, fast_image_processor=True, declared_workers=None)
    meta = body["metadata"]
    plan = make_plan(
        identity.Owner(meta["name"], meta["namespace"], meta["uid"]), spec, nodes, result, policy or OperatorPolicy()
    )
    return {obj["kind"]: obj for obj in plan.objects}


def gpu_labels(
    product: str | None, family: str | None = None, major: str | None = None, minor: str | None = None
) -> dict[str, str]:
    labels = {}
    if product is not None:
        labels["nvidia.com/gpu.product"] = product
    if family is not None:
        labels["nvidia.com/gpu.family"] = family
    if major is not None:
        labels["nvidia.com/gpu.compute.major"] = major
        labels["nvidia.com/gpu.compute.minor"] = minor or "0"
    return labels


def make_node(
    name: str,
    labels: dict[str, str] | None = None,
    *,
    gpus: int = 0,
    resource: str = "nvidia.com/gpu",
    taints: list[dict[str, str]] | None = None,
    unschedulable: bool = False,
) -> NodeFacts:
    allocatable: dict[str, Any] = {"cpu": "32", "memory": "128Gi"}
    if gpus:
        allocatable[resource] = str(gpus)
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"taints": taints or [], "unschedulable": unschedulable},
        "status": {"allocatable": allocatable, "capacity": allocatable},
    }
    return node_facts(body)


# GFD label sets as they appear on real nodes (see shared/reference/kubernetes-notes.md).
H100 = gpu_labels("NVIDIA-H100-80GB-HBM3", "hopper", "9", "0")
H200 = gpu_labels("NVIDIA-H200-141GB-HBM3e", "hopper", "9", "0")
B200 = gpu_labels("NVIDIA-B200", "blackwell", "10", "0")
GB200 = gpu_labels("NVIDIA-GB200", "blackwell", "10", "0")
GB300 = gpu_labels("NVIDIA-GB300", "blackwell", "10", "3")
H100_MIG = gpu_labels("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", "hopper", "9", "0")
H100_SHARED = gpu_labels("NVIDIA-H100-80GB-HBM3-SHARED", "hopper", "9", "0")
NO_PRODUCT_BLACKWELL_OLD_GFD = gpu_labels(None, "undefined", "10", "0")


def make_spec(**fields: Any) -> api.MultimodalPreprocessorSpec:
    raw: dict[str, Any] = {"model": {"path": "/models/m"}}
    raw.update(fields)
    return api.MultimodalPreprocessorSpec.model_validate(raw)


def gpu_spec(**fields: Any) -> api.MultimodalPreprocessorSpec:
    fields.setdefault("resources", {"limits": {"nvidia.com/gpu": 1}})
    return make_spec(**fields)


def probe_result(**fields: Any) -> api.ProbeResult:
    raw: dict[str, Any] = {"cloneable": True, "fast_image_processor": True}
    raw.update(fields)
    return api.ProbeResult.model_validate(raw)


@pytest.fixture
def data_dir() -> pathlib.Path:
    return DATA

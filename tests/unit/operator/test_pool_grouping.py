"""Eligible nodes are grouped into pools by GPU product, on realistic GFD label sets."""

from __future__ import annotations

import pytest
from conftest import (
    B200,
    GB200,
    GB300,
    H100,
    H100_MIG,
    H100_SHARED,
    H200,
    NO_PRODUCT_BLACKWELL_OLD_GFD,
    gpu_labels,
    gpu_spec,
    make_node,
    make_spec,
)

from mmprep_operator.logic import gpus, pools


@pytest.mark.parametrize(
    ("labels", "model", "family", "mig", "shared"),
    [
        (H100, "H100", "hopper", None, False),
        (H200, "H200", "hopper", None, False),
        (gpu_labels("NVIDIA-H200"), "H200", "hopper", None, False),  # short product, no family label
        (gpu_labels("NVIDIA-H20"), "H20", "hopper", None, False),  # not H200
        (B200, "B200", "blackwell", None, False),
        (GB200, "GB200", "blackwell", None, False),  # GB200 is not read as B200
        (GB300, "GB300", "blackwell", None, False),
        (gpu_labels("NVIDIA-B300-SXM6-AC"), "B300", "blackwell", None, False),
        (H100_MIG, "H100", "hopper", "1g.10gb", False),
        (H100_SHARED, "H100", "hopper", None, True),
        (gpu_labels("NVIDIA-A100-SXM4-40GB-MIG-3g.20gb-SHARED"), "A100", "ampere", "3g.20gb", True),
        (NO_PRODUCT_BLACKWELL_OLD_GFD, None, "blackwell", None, False),  # "undefined" family: from compute 10.0
        (gpu_labels(None, None, "9", "0"), None, "hopper", None, False),
        (gpu_labels("Some-Future-GPU", None, "12", "0"), None, "blackwell", None, False),
    ],
)
def test_gpu_identity_from_labels(labels, model, family, mig, shared) -> None:
    identity = gpus.identify(labels)
    assert identity is not None
    assert (identity.model, identity.family, identity.mig_profile, identity.shared) == (model, family, mig, shared)


def test_a_node_without_gpu_labels_has_no_identity() -> None:
    assert gpus.identify({"kubernetes.io/arch": "amd64"}) is None


def mixed_cluster():
    return [
        make_node("h100-a", H100, gpus=8),
        make_node("h200-a", H200, gpus=8),
        make_node("h200-b", H200, gpus=8),
        make_node("b200-a", B200, gpus=8),
        make_node("gb200-a", GB200, gpus=4),
        make_node("gb300-a", GB300, gpus=4),
        make_node("mig-a", H100_MIG, gpus=7),
        make_node("shared-a", H100_SHARED, gpus=16),
        make_node("old-gfd-a", NO_PRODUCT_BLACKWELL_OLD_GFD, gpus=8),
        make_node("cpu-a"),
        make_node("cpu-b"),
    ]


def test_gpu_pods_get_one_pool_per_exact_product_and_no_cpu_pool() -> None:
    pooling = pools.group(mixed_cluster(), gpu_spec())
    names = {p.name: p.nodes for p in pooling.pools}
    assert names == {
        "blackwell-10-0": ("old-gfd-a",),
        "nvidia-b200": ("b200-a",),
        "nvidia-gb200": ("gb200-a",),
        "nvidia-gb300": ("gb300-a",),
        "nvidia-h100-80gb-hbm3": ("h100-a",),
        "nvidia-h100-80gb-hbm3-mig-1g-10gb": ("mig-a",),
        "nvidia-h100-80gb-hbm3-shared": ("shared-a",),
        "nvidia-h200-141gb-hbm3e": ("h200-a", "h200-b"),
    }
    assert pooling.excluded == {"no allocatable GPU": 2}
    assert all(p.has_gpu for p in pooling.pools)


def test_pools_select_their_nodes_exactly() -> None:
    pooling = pools.group(mixed_cluster(), gpu_spec())
    by_name = {p.name: p for p in pooling.pools}
    assert by_name["nvidia-gb200"].node_selector == {"nvidia.com/gpu.product": "NVIDIA-GB200"}
    assert by_name["nvidia-gb200"].match_expressions == ()
    old = by_name["blackwell-10-0"]
    assert old.node_selector == {
        "nvidia.com/gpu.family": "undefined",
        "nvidia.com/gpu.compute.major": "10",
        "nvidia.com/gpu.compute.minor": "0",
    }
    # Without the product label check, this pool's pods could land on B200 nodes of another pool.
    assert old.match_expressions == ({"key": "nvidia.com/gpu.product", "operator": "DoesNotExist"},)
    assert old.gpu is not None and old.gpu.family == "blackwell"


def test_cpu_pods_use_cpu_nodes_as_a_cpu_pool_and_gpu_nodes_by_product() -> None:
    pooling = pools.group(mixed_cluster(), make_spec())
    by_name = {p.name: p for p in pooling.pools}
    cpu = by_name["cpu"]
    assert cpu.nodes == ("cpu-a", "cpu-b") and not cpu.has_gpu
    assert {e["key"] for e in cpu.match_expressions} == set(gpus.GPU_LABELS)
    assert all(e["operator"] == "DoesNotExist" for e in cpu.match_expressions)
    assert "nvidia-h200-141gb-hbm3e" in by_name  # GPU nodes still decide per product
    assert pooling.excluded == {}


def test_cpu_only_cluster_with_cpu_pods_is_one_cpu_pool() -> None:
    pooling = pools.group([make_node("a"), make_node("b")], make_spec())
    assert [(p.name, p.nodes) for p in pooling.pools] == [("cpu", ("a", "b"))]


def test_gpu_capacity_without_gpu_labels_is_its_own_pool_for_gpu_pods() -> None:
    pooling = pools.group([make_node("bare-gpu", gpus=2), make_node("cpu-a")], gpu_spec())
    assert [(p.name, p.has_gpu) for p in pooling.pools] == [("gpu-unlabeled", True)]


def test_node_selector_taints_cordon_and_affinity_exclude_nodes() -> None:
    nodes = [
        make_node("h200-a", {**H200, "zone": "a"}, gpus=8),
        make_node("h200-b", {**H200, "zone": "b"}, gpus=8),
        make_node(
            "h200-tainted", {**H200, "zone": "a"}, gpus=8, taints=[{"key": "dedicated", "value": "llm", "effect": "NoSchedule"}]
        ),
        make_node("h200-cordoned", {**H200, "zone": "a"}, gpus=8, unschedulable=True),
        make_node(
            "h200-prefer", {**H200, "zone": "a"}, gpus=8, taints=[{"key": "x", "value": "y", "effect": "PreferNoSchedule"}]
        ),
    ]
    pooling = pools.group(nodes, gpu_spec(nodeSelector={"zone": "a"}))
    assert pooling.pools[0].nodes == ("h200-a", "h200-prefer")
    assert pooling.excluded == {"nodeSelector": 1, "taints": 1, "cordoned": 1}

    tolerated = gpu_spec(nodeSelector={"zone": "a"}, tolerations=[{"key": "dedicated", "operator": "Exists"}])
    assert pools.group(nodes, tolerated).pools[0].nodes == ("h200-a", "h200-prefer", "h200-tainted")

    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]
            }
        }
    }
    assert pools.group(nodes, gpu_spec(affinity=affinity)).pools[0].nodes == ("h200-b",)


def test_gpu_request_needs_allocatable_gpus_of_that_resource() -> None:
    nodes = [make_node("h200-zero", H200, gpus=0), make_node("mig", H100_MIG, gpus=7, resource="nvidia.com/mig-1g.10gb")]
    assert pools.group(nodes, gpu_spec()).pools == ()
    mig_spec = gpu_spec(resources={"limits": {"nvidia.com/mig-1g.10gb": 1}})
    assert [p.nodes for p in pools.group(nodes, mig_spec).pools] == [("mig",)]


def test_colliding_or_long_pool_names_get_a_hash_and_stay_distinct() -> None:
    nodes = [
        make_node("a", gpu_labels("NVIDIA-X.1"), gpus=1),
        make_node("b", gpu_labels("NVIDIA-X-1"), gpus=1),
        make_node("c", gpu_labels("NVIDIA-" + "Very-Long-Product-Name-" * 3), gpus=1),
    ]
    names = [p.name for p in pools.group(nodes, gpu_spec()).pools]
    assert len(set(names)) == 3
    assert all(len(n) <= pools.MAX_POOL_NAME for n in names)
    assert names == [p.name for p in pools.group(list(reversed(nodes)), gpu_spec()).pools]  # deterministic

"""Group a resource's eligible nodes into pools: one pool per GPU product, or CPU-only nodes.

A pool is the unit the decision is made for and the unit of one Deployment, so it carries the
node constraints that pin that Deployment's pods to exactly its nodes:

- product label present: one pool per exact ``nvidia.com/gpu.product`` value. MIG profiles and
  ``-SHARED`` products are pools of their own: a time-sliced or partitioned GPU is different
  hardware for preprocessing, and an exact-value nodeSelector is what the scheduler can match.
- no product label, but family or compute-capability labels: one pool per (family, compute)
  label values, with ``product DoesNotExist`` so it cannot take product-labelled nodes.
- no GPU labels: the ``cpu`` pool (``DoesNotExist`` on every GPU label). A node that has GPU
  capacity but no GPU labels at all joins the ``gpu-unlabeled`` pool when pods request a GPU
  (they then only land on GPU nodes) and the ``cpu`` pool otherwise.

Pools are sorted by name; names are slugs of the product, made unique with a hash on collision.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mmprep_operator.api import MultimodalPreprocessorSpec
from mmprep_operator.logic import gpus, naming
from mmprep_operator.logic.nodes import NodeFacts, eligible

CPU_POOL = "cpu"
ARCH_LABEL = "kubernetes.io/arch"
ARM64 = "arm64"
UNLABELED_GPU_POOL = "gpu-unlabeled"
# Pool names become part of Deployment names (<resource>-<pool>); keep room for the resource.
MAX_POOL_NAME = 40


@dataclasses.dataclass(frozen=True)
class Pool:
    name: str
    #: Identity used for grouping; stable across label sets with the same meaning.
    key: tuple[str, ...]
    gpu: gpus.GpuIdentity | None
    has_gpu: bool
    nodes: tuple[str, ...]
    #: Equality constraints (rendered into the pod's nodeSelector).
    node_selector: Mapping[str, str]
    #: Further constraints (rendered into required node affinity), e.g. "no product label".
    match_expressions: tuple[Mapping[str, Any], ...] = ()
    #: The kubernetes.io/arch label all the pool's nodes carry (None when absent or mixed).
    node_arch: str | None = None


@dataclasses.dataclass(frozen=True)
class Pooling:
    pools: tuple[Pool, ...]
    total_nodes: int
    #: Why nodes were left out: reason -> count.
    excluded: Mapping[str, int]

    def explain_exclusions(self) -> str:
        if not self.excluded:
            return ""
        parts = ", ".join(f"{count} {why}" for why, count in sorted(self.excluded.items()))
        return f"excluded: {parts}"


def _no_gpu_labels() -> tuple[Mapping[str, Any], ...]:
    return tuple({"key": label, "operator": "DoesNotExist"} for label in gpus.GPU_LABELS)


# The labels ``gpus.identify`` reads.
_IDENTITY_LABELS = (gpus.PRODUCT_LABEL, gpus.FAMILY_LABEL, gpus.COMPUTE_MAJOR_LABEL, gpus.COMPUTE_MINOR_LABEL)


def _identity(labels: Mapping[str, str]) -> gpus.GpuIdentity | None:
    # Nodes of one pool share their GPU labels: parsing them once per distinct set, not once per
    # node and resource, removes most of what grouping 1000 nodes costs.
    return _identify_values(tuple(labels.get(k) for k in _IDENTITY_LABELS))


@functools.lru_cache(maxsize=1024)
def _identify_values(values: tuple[str | None, ...]) -> gpus.GpuIdentity | None:
    return gpus.identify({k: v for k, v in zip(_IDENTITY_LABELS, values, strict=True) if v is not None})


def _pool_shape(
    node: NodeFacts, gpu_requested: bool
) -> tuple[tuple[str, ...], str, dict[str, str], tuple[Mapping[str, Any], ...]]:
    """(key, readable name, nodeSelector, match expressions) for the pool a node belongs to."""
    labels = node.label_map
    identity = _identity(labels)
    if identity is not None and identity.product is not None:
        return ("product", identity.product), identity.product, {gpus.PRODUCT_LABEL: identity.product}, ()
    if identity is not None:
        selector: dict[str, str] = {
            k: labels[k] for k in (gpus.FAMILY_LABEL, gpus.COMPUTE_MAJOR_LABEL, gpus.COMPUTE_MINOR_LABEL) if k in labels
        }
        readable = "-".join([identity.family or "gpu", *(identity.compute or "").split(".")]).rstrip("-")
        return (
            ("labels", *(f"{k}={v}" for k, v in sorted(selector.items()))),
            readable,
            selector,
            ({"key": gpus.PRODUCT_LABEL, "operator": "DoesNotExist"},),
        )
    if gpu_requested and node.has_gpu:
        return ("unlabeled",), UNLABELED_GPU_POOL, {}, _no_gpu_labels()
    return ("cpu",), CPU_POOL, {}, _no_gpu_labels()


def _unique_names(shapes: Mapping[tuple[str, ...], str]) -> dict[tuple[str, ...], str]:
    """Slug each readable name; where slugs collide or are too long, add a hash of the key."""
    slugs = {key: naming.slug(readable) or "pool" for key, readable in shapes.items()}
    counts = collections.Counter(slugs.values())
    out = {}
    for key, name in slugs.items():
        if counts[name] > 1 or len(name) > MAX_POOL_NAME:
            suffix = naming.short_hash("/".join(key), 6)
            name = f"{name[: MAX_POOL_NAME - len(suffix) - 1].rstrip('-')}-{suffix}"
        out[key] = name
    return out


def placement_key(spec: MultimodalPreprocessorSpec) -> str:
    """Everything of a spec that ``group`` reads: specs with the same key get the same pooling."""
    fields = [spec.node_selector, spec.tolerations, spec.affinity, sorted(spec.resources.gpu_resources())]
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)


def group(nodes: Iterable[NodeFacts], spec: MultimodalPreprocessorSpec) -> Pooling:
    """The eligible nodes of ``spec``, grouped into pools (pure)."""
    gpu_resources = spec.resources.gpu_resources()
    gpu_requested = bool(gpu_resources)
    members: dict[tuple[str, ...], list[NodeFacts]] = collections.defaultdict(list)
    shapes: dict[tuple[str, ...], tuple[str, dict[str, str], tuple[Mapping[str, Any], ...]]] = {}
    excluded: collections.Counter[str] = collections.Counter()
    total = 0
    for node in nodes:
        total += 1
        why_not = eligible(
            node,
            node_selector=spec.node_selector,
            tolerations=spec.tolerations,
            affinity=spec.affinity,
            gpu_resources=gpu_resources,
        )
        if why_not is not None:
            excluded[why_not] += 1
            continue
        key, readable, selector, expressions = _pool_shape(node, gpu_requested)
        members[key].append(node)
        shapes[key] = (readable, selector, expressions)
    names = _unique_names({k: v[0] for k, v in shapes.items()})
    pools = []
    for key, group_nodes in members.items():
        _, selector, expressions = shapes[key]
        identity = _identity(group_nodes[0].label_map)
        archs = {n.label_map.get(ARCH_LABEL) for n in group_nodes}
        pools.append(
            Pool(
                name=names[key],
                key=key,
                gpu=identity,
                has_gpu=key[0] != "cpu" and (identity is not None or any(n.has_gpu for n in group_nodes)),
                nodes=tuple(sorted(n.name for n in group_nodes)),
                node_selector=selector,
                match_expressions=expressions,
                node_arch=archs.pop() if len(archs) == 1 else None,
            )
        )
    return Pooling(tuple(sorted(pools, key=lambda p: p.name)), total, dict(excluded))


def pool_weights(pools: Sequence[Pool]) -> dict[str, int]:
    """Replica weights: eligible nodes per pool (see ``replicas.distribute``)."""
    return {p.name: len(p.nodes) for p in pools}


#: GPU models that come as Grace superchips: their nodes' CPUs are arm64, whatever the node says.
ARM64_GPU_MODELS = frozenset({"GB200", "GB300", "GH200"})


def pool_arch(pool: Pool) -> str | None:
    """The CPU architecture of the pool's nodes: arm64 when the GPU model fixes it (Grace), else
    what all its nodes' kubernetes.io/arch labels say, else None (unknown)."""
    if pool.gpu is not None and pool.gpu.model in ARM64_GPU_MODELS:
        return ARM64
    return pool.node_arch


@dataclasses.dataclass
class PoolingMemo:
    """``group`` over the current nodes, memoized per placement until any node fact changes.

    One node event requeues every resource that could use the node; they mostly share their
    placement (selector, tolerations, affinity, GPU resource), so they share one grouping
    instead of each regrouping all nodes. Comparing the node list with the one grouped last is
    cheap (identity first, then the small frozen facts) and needs no version kept in step with
    the node index. No I/O: the caller hands in the nodes.
    """

    #: Placements kept at most; beyond that the memo starts over.
    size: int = 256
    #: The nodes the memoized poolings were grouped from.
    nodes: list[NodeFacts] = dataclasses.field(default_factory=list)
    _poolings: dict[str, Pooling] = dataclasses.field(default_factory=dict)

    def pooling_for(self, nodes: list[NodeFacts], spec: MultimodalPreprocessorSpec) -> Pooling:
        if nodes != self.nodes:
            self.nodes = nodes
            self._poolings.clear()
        key = placement_key(spec)
        pooling = self._poolings.get(key)
        if pooling is None:
            if len(self._poolings) >= self.size:
                self._poolings.clear()
            pooling = self._poolings[key] = group(nodes, spec)
        return pooling

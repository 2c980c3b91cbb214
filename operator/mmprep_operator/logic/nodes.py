"""Node facts and the scheduling predicates that decide whether a node is eligible for a resource.

``NodeFacts`` is what the kopf node index keeps per node: only the fields that placement and pool
grouping read, so that its equality is the test "did anything that matters change?" (kubelet
heartbeats change a node every few seconds; those must not wake the reconciler).

The predicates mirror the scheduler's filters that a preview can evaluate from labels alone:
nodeSelector, required node affinity, NoSchedule/NoExecute taints, cordon, and the GPU resource.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mmprep_operator.api import is_gpu_resource

_BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


@dataclasses.dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclasses.dataclass(frozen=True)
class NodeFacts:
    name: str
    labels: tuple[tuple[str, str], ...]
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    #: Allocatable count of each GPU-like extended resource (nvidia.com/gpu, nvidia.com/mig-*, ...).
    gpus: tuple[tuple[str, int], ...] = ()

    # Derived once per NodeFacts (one per node event), not per access: pool grouping reads them
    # for every node and every resource. The cache lives in the instance __dict__, outside the
    # dataclass fields, so equality and hashing still compare the facts alone. Callers must not
    # mutate the returned dicts.
    @functools.cached_property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)

    @functools.cached_property
    def gpu_map(self) -> dict[str, int]:
        return dict(self.gpus)

    @property
    def has_gpu(self) -> bool:
        return any(count > 0 for _, count in self.gpus)


def _count(quantity: Any) -> int:
    """Extended resources are whole numbers; anything unparsable counts as none."""
    try:
        return int(str(quantity))
    except ValueError:
        return 0


def node_facts(body: Mapping[str, Any]) -> NodeFacts:
    """Extract the facts from a Node object (a dict as the API returns it)."""
    metadata = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    allocatable = status.get("allocatable") or status.get("capacity") or {}
    return NodeFacts(
        name=metadata.get("name", ""),
        labels=tuple(sorted((metadata.get("labels") or {}).items())),
        taints=tuple(Taint(t.get("key", ""), t.get("value", "") or "", t.get("effect", "")) for t in spec.get("taints") or ()),
        unschedulable=bool(spec.get("unschedulable")),
        gpus=tuple(sorted((k, _count(v)) for k, v in allocatable.items() if is_gpu_resource(k))),
    )


def tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Taint) -> bool:
    for tol in tolerations:
        effect = tol.get("effect") or ""
        if effect and effect != taint.effect:
            continue
        operator = tol.get("operator") or "Equal"
        key = tol.get("key") or ""
        if operator == "Exists" and (not key or key == taint.key):
            return True
        if operator == "Equal" and key == taint.key and (tol.get("value") or "") == taint.value:
            return True
    return False


def _expression_matches(expr: Mapping[str, Any], value: str | None) -> bool:
    operator = expr.get("operator")
    values = list(expr.get("values") or ())
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and values:
        try:
            left, right = int(value), int(values[0])
        except ValueError:
            return False
        return left > right if operator == "Gt" else left < right
    return False


def matches_term(term: Mapping[str, Any], node: NodeFacts) -> bool:
    """A nodeSelectorTerm: all its expressions must hold (an empty term matches nothing)."""
    labels = node.label_map
    expressions = list(term.get("matchExpressions") or ())
    fields = list(term.get("matchFields") or ())
    if not expressions and not fields:
        return False
    if not all(_expression_matches(e, labels.get(e.get("key", ""))) for e in expressions):
        return False
    return all(_expression_matches(f, node.name if f.get("key") == "metadata.name" else None) for f in fields)


def required_terms(affinity: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    node_affinity = (affinity or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return list(required.get("nodeSelectorTerms") or ())


def eligible(
    node: NodeFacts,
    *,
    node_selector: Mapping[str, str],
    tolerations: Sequence[Mapping[str, Any]],
    affinity: Mapping[str, Any] | None,
    gpu_resources: Iterable[str],
) -> str | None:
    """None when the pod could be scheduled on the node, else why not (for messages)."""
    if node.unschedulable:
        return "cordoned"
    labels = node.label_map
    if any(labels.get(k) != v for k, v in node_selector.items()):
        return "nodeSelector"
    terms = required_terms(affinity)
    if terms and not any(matches_term(t, node) for t in terms):
        return "node affinity"
    if any(t.effect in _BLOCKING_EFFECTS and not tolerates(tolerations, t) for t in node.taints):
        return "taints"
    gpus = node.gpu_map
    if any(gpus.get(r, 0) <= 0 for r in gpu_resources):
        return "no allocatable GPU"
    return None

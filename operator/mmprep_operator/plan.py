"""From (spec, nodes, probe result, policy) to everything the resource should look like.

The one pure composition of pools -> decisions -> replicas -> objects, used by the reconciler and
by ``mmprep-operator render``, so a preview shows exactly what the operator would apply.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from mmprep_operator import api, pools, render, replicas
from mmprep_operator.config import OperatorPolicy
from mmprep_operator.decide import PoolDecision, decide_pool
from mmprep_operator.nodes import NodeFacts
from mmprep_operator.status import Problem


@dataclasses.dataclass(frozen=True)
class Plan:
    pooling: pools.Pooling
    problem: Problem | None
    decisions: tuple[PoolDecision, ...]
    replicas: dict[str, int]
    deployment_names: dict[str, str]
    objects: tuple[dict[str, Any], ...]


def placement_problem(spec: api.MultimodalPreprocessorSpec, pooling: pools.Pooling) -> Problem | None:
    if pooling.pools:
        return None
    why = pooling.explain_exclusions()
    detail = f"none of {pooling.total_nodes} node(s) is eligible" + (f" ({why})" if why else "")
    if spec.requests_gpu() and pooling.excluded.get("no allocatable GPU"):
        wanted = ", ".join(spec.resources.gpu_resources())
        return Problem("NoGPUPool", f"pods request {wanted}, but no eligible node has it allocatable: {detail}")
    return Problem("NoEligibleNodes", detail)


def make_plan(
    owner: render.Owner,
    spec: api.MultimodalPreprocessorSpec,
    nodes: Iterable[NodeFacts],
    probe: api.ProbeResult,
    policy: OperatorPolicy,
    pooling: pools.Pooling | None = None,
    measured: Mapping[str, int] | None = None,
) -> Plan:
    """``pooling``: ``pools.group(nodes, spec)`` when the caller already has it (memoized).
    ``measured``: pool name -> the worker count its calibration chose (see ``calibration``)."""
    if pooling is None:
        pooling = pools.group(nodes, spec)
    measured = measured or {}
    decisions = tuple(decide_pool(spec, probe, pool, policy.overrides, measured.get(pool.name)) for pool in pooling.pools)
    counts = replicas.distribute(spec.replicas, pools.pool_weights(pooling.pools))
    objects = tuple(render.render_children(owner, spec, decisions, counts, policy))
    names = {d.pool.name: render.deployment_name(owner, d.pool.name) for d in decisions}
    return Plan(pooling, placement_problem(spec, pooling), decisions, counts, names, objects)

"""From (spec, nodes, probe result, policy) to everything the resource should look like.

The one pure composition of pools -> decisions -> replicas -> objects, used by the reconciler and
by ``mmprep-operator render``, so a preview shows exactly what the operator would apply.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from mmprep_operator import api
from mmprep_operator.api.policy import OperatorPolicy
from mmprep_operator.logic import autoscaling, identity, manifests, pod_parts, pools, replicas
from mmprep_operator.logic.conditions import Reason
from mmprep_operator.logic.decide import PoolDecision, decide_pool
from mmprep_operator.logic.nodes import NodeFacts
from mmprep_operator.logic.status import DeploymentState, Problem


@dataclasses.dataclass(frozen=True)
class Plan:
    pooling: pools.Pooling
    problem: Problem | None
    decisions: tuple[PoolDecision, ...]
    replicas: dict[str, int]
    deployment_names: dict[str, str]
    objects: tuple[dict[str, Any], ...]
    #: Pools that get no pods whatever the replicas, and why (an image not built for their arch).
    pool_problems: dict[str, api.PoolProblem] = dataclasses.field(default_factory=dict)
    #: Autoscaled (or held) pools: their Deployments are rendered without replicas, and
    #: ``replicas`` holds the count each starts at (``autoscaling.seed``).
    scaling: dict[str, autoscaling.PoolScaling] = dataclasses.field(default_factory=dict)

    def seed_of(self, deployment: str) -> int | None:
        """The starting count of an autoscaled pool's Deployment; None when its replicas are fixed."""
        return next((self.replicas[p] for p, s in self.scaling.items() if s.deployment == deployment), None)

    def pools_short_of_pods(self, deployments: Mapping[str, DeploymentState]) -> list[str]:
        """The pools whose Deployment has fewer ready pods than the pool wants."""

        def wanted(pool: str, state: DeploymentState) -> int:
            # An autoscaled pool wants what its autoscaler last set.
            return state.desired if pool in self.scaling and state.desired is not None else self.replicas.get(pool, 0)

        return [
            pool
            for pool, deployment in self.deployment_names.items()
            if (state := deployments.get(deployment, DeploymentState())).ready_replicas < wanted(pool, state)
        ]


def image_platforms(spec: api.MultimodalPreprocessorSpec, policy: OperatorPolicy) -> list[str] | None:
    """What the runtime image is built for: the spec's word, else the policy's for its default
    image; None (not checked) for any other image that does not say."""
    if spec.image_platforms is not None:
        return list(spec.image_platforms)
    return policy.image_platforms if pod_parts.image_of(spec, policy) == policy.default_image else None


def _runs_on(platforms: Iterable[str], arch: str) -> bool:
    # "linux/arm64/v8" runs on arm64 nodes too: the variant does not matter to the scheduler.
    return any(p.split("/")[:2] == ["linux", arch] for p in platforms)


def platform_problems(
    spec: api.MultimodalPreprocessorSpec, pool_list: Iterable[pools.Pool], policy: OperatorPolicy
) -> dict[str, api.PoolProblem]:
    """Pools whose nodes' architecture the image is not built for: their pods could never start."""
    platforms = image_platforms(spec, policy)
    if platforms is None:
        return {}
    out = {}
    for pool in pool_list:
        arch = pools.pool_arch(pool)
        if arch is not None and not _runs_on(platforms, arch):
            out[pool.name] = api.PoolProblem(
                reason=Reason.IMAGE_PLATFORM_MISSING,
                message=f"the runtime image is built for {', '.join(platforms)}; pool {pool.name}'s nodes are linux/{arch}, "
                "so it gets no pods (list the platform in spec.imagePlatforms once the image has it)",
            )
    return out


def _platform_problem(blocked: Mapping[str, api.PoolProblem], pool_count: int) -> Problem | None:
    if not blocked:
        return None
    names = ", ".join(sorted(blocked))
    every = len(blocked) == pool_count
    where = "every pool" if every else f"pool(s) {names}"
    # With other pools left the resource still serves (Ready follows their pods); with none it cannot.
    return Problem(
        Reason.IMAGE_PLATFORM_MISSING,
        f"the runtime image is not built for the architecture of {where}: {next(iter(blocked.values())).message}",
        blocks_ready=every,
    )


def placement_problem(spec: api.MultimodalPreprocessorSpec, pooling: pools.Pooling) -> Problem | None:
    if pooling.pools:
        return None
    why = pooling.explain_exclusions()
    detail = f"none of {pooling.total_nodes} node(s) is eligible" + (f" ({why})" if why else "")
    if spec.requests_gpu() and pooling.excluded.get("no allocatable GPU"):
        wanted = ", ".join(spec.resources.gpu_resources())
        return Problem(Reason.NO_GPU_POOL, f"pods request {wanted}, but no eligible node has it allocatable: {detail}")
    return Problem(Reason.NO_ELIGIBLE_NODES, detail)


def make_plan(
    owner: identity.Owner,
    spec: api.MultimodalPreprocessorSpec,
    nodes: Iterable[NodeFacts],
    probe: api.ProbeResult,
    policy: OperatorPolicy,
    pooling: pools.Pooling | None = None,
    measured: Mapping[str, int] | None = None,
    autoscalers: autoscaling.Autoscalers = autoscaling.ASSUMED,
    measured_render_processes: Mapping[str, int] | None = None,
) -> Plan:
    """``pooling``: ``pools.group(nodes, spec)`` when the caller already has it (memoized).
    ``measured``: pool name -> the worker count its calibration chose (see ``calibration``);
    ``measured_render_processes``: pool name -> the render process count one chose.
    ``autoscalers``: what the cluster has to autoscale with (only read with spec.autoscaling)."""
    if pooling is None:
        pooling = pools.group(nodes, spec)
    measured = measured or {}
    processes = measured_render_processes or {}
    decisions = tuple(
        decide_pool(spec, probe, pool, policy.overrides, measured.get(pool.name), processes.get(pool.name))
        for pool in pooling.pools
    )
    blocked = platform_problems(spec, pooling.pools, policy)
    # Blocked pools keep their Deployment at 0 replicas (status still shows them); the others share the total.
    weights = {name: w for name, w in pools.pool_weights(pooling.pools).items() if name not in blocked}
    counts = {p.name: 0 for p in pooling.pools} | replicas.distribute(spec.replicas, weights)
    scaling: dict[str, autoscaling.PoolScaling] = {}
    if spec.autoscaling is not None:
        # A blocked pool stays fixed at 0: no autoscaler could give it a pod that starts.
        scaling = autoscaling.pool_scaling(owner, spec.autoscaling, sorted(weights), autoscalers)
        counts |= {name: autoscaling.seed(counts[name], s) for name, s in scaling.items()}
    objects = tuple(manifests.children(owner, spec, decisions, counts, policy, scaling))
    names = {d.pool.name: identity.deployment_name(owner, d.pool.name) for d in decisions}
    problem = placement_problem(spec, pooling) or _platform_problem(blocked, len(pooling.pools))
    return Plan(pooling, problem, decisions, counts, names, objects, blocked, scaling)

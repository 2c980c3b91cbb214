"""Fold what a reconcile saw and decided into the resource's status, and the Events that tell it.

The Events are chosen here (``events``) and their bodies built here too (``event_body``), so
what an Event says is decided and tested without an API server; ``event_poster`` only
delivers them.

Pure: (previous status, observations, now) -> new status. Conditions follow Kubernetes
conventions: ``lastTransitionTime`` moves only when ``status`` changes, every condition carries
the generation it was computed for, and the four types always exist:

- ``Probed``: the probe for the current probe hash finished and its answer could be read;
- ``Cloneable``: the processor can be deep-copied (Unknown until probed);
- ``Degraded``: something keeps the resource from working as asked (its reason says what);
- ``Ready``: every desired pod of every pool is ready.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from mmprep_operator import api
from mmprep_operator.logic import identity
from mmprep_operator.logic.decide import PoolDecision, sentence
from mmprep_operator.logic.naming import short_hash
from mmprep_operator.logic.pools import pool_arch

READY, PROBED, CLONEABLE, DEGRADED = "Ready", "Probed", "Cloneable", "Degraded"
CONDITION_TYPES = (READY, PROBED, CLONEABLE, DEGRADED)
Status = Literal["True", "False", "Unknown"]


@dataclasses.dataclass(frozen=True)
class Problem:
    """Something that degrades the resource: a CamelCase reason and a sentence."""

    reason: str
    message: str
    #: False for a problem that leaves the resource serving (Ready then follows the pods).
    blocks_ready: bool = True


@dataclasses.dataclass(frozen=True)
class DeploymentState:
    replicas: int = 0
    ready_replicas: int = 0
    updated_replicas: int = 0
    #: The Deployment controller has seen the latest spec (observedGeneration >= generation).
    observed: bool = True

    def rolled_out(self, desired: int) -> bool:
        """All desired pods run the current template: ready pods of an old one do not count."""
        return self.observed and self.updated_replicas >= desired


@dataclasses.dataclass(frozen=True)
class Observation:
    """Everything one reconcile learned; the input of ``fold``."""

    generation: int | None
    selector: str
    spec_error: str | None = None
    probe: api.ProbeStatus | None = None
    #: InvalidSpec, NoEligibleNodes, NoGPUPool, ApplyFailed: the problems outside the probe.
    problem: Problem | None = None
    decisions: Sequence[PoolDecision] = ()
    deployment_names: Mapping[str, str] = dataclasses.field(default_factory=dict)  # pool -> Deployment
    replicas: Mapping[str, int] = dataclasses.field(default_factory=dict)  # pool -> desired
    deployments: Mapping[str, DeploymentState] = dataclasses.field(default_factory=dict)  # Deployment -> state
    calibrations: Mapping[str, api.PoolCalibration] = dataclasses.field(default_factory=dict)  # pool -> calibration
    #: pool -> why its pods do not run (an image not built for its arch, the scheduler, a container).
    pool_problems: Mapping[str, api.PoolProblem] = dataclasses.field(default_factory=dict)


def timestamp(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: Sequence[api.Condition],
    type_: str,
    status: Status,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime,
) -> list[api.Condition]:
    """Replace (or add) one condition, keeping lastTransitionTime when the status did not change."""
    old = next((c for c in conditions if c.type == type_), None)
    since = old.last_transition_time if old is not None and old.status == status else timestamp(now)
    new = api.Condition(
        type=type_, status=status, reason=reason, message=message, last_transition_time=since, observed_generation=generation
    )
    return [c for c in conditions if c.type != type_] + [new]


def _probe_conditions(probe: api.ProbeStatus | None) -> tuple[tuple[Status, str, str], tuple[Status, str, str]]:
    """(Probed, Cloneable) as (status, reason, message)."""
    if probe is None:
        return ("Unknown", "SpecInvalid", "the spec is invalid; nothing was probed"), ("Unknown", "NotProbed", "not probed")
    if probe.state == "Succeeded" and probe.result is not None:
        r = probe.result
        fast = "a fast image processor" if r.fast_image_processor else "no fast image processor"
        probed: tuple[Status, str, str] = (
            "True",
            "ProbeSucceeded",
            f"{r.processor_class or 'processor'} loaded with {fast} (Job {probe.job})",
        )
        if r.cloneable:
            took = f" in {r.clone_seconds:.2f}s" if r.clone_seconds is not None else ""
            return probed, ("True", "Cloneable", f"the processor deep-copies{took}: one copy per worker")
        why = f": {r.error}" if r.error else ""
        return probed, ("False", "NotCloneable", f"the processor cannot be deep-copied{why}; 1 worker per pod")
    if probe.state == "Failed":
        return ("False", probe.reason or "ProbeFailed", probe.message or "the probe failed"), (
            "Unknown",
            "NotProbed",
            "the probe did not answer",
        )
    waiting = "ProbeRunning" if probe.state == "Running" else "ProbePending"
    return ("False", waiting, f"waiting for probe Job {probe.job}"), ("Unknown", "NotProbed", "waiting for the probe")


def _pool_status(d: PoolDecision, obs: Observation) -> api.PoolStatus:
    deployment = obs.deployment_names[d.pool.name]
    state = obs.deployments.get(deployment, DeploymentState())
    w = d.decision
    gpu = d.pool.gpu
    return api.PoolStatus(
        name=d.pool.name,
        gpu_product=gpu.product if gpu else None,
        gpu_family=gpu.family if gpu else None,
        gpu_model=gpu.model if gpu else None,
        nodes=len(d.pool.nodes),
        path=w.path.value,
        processor_workers=w.processor_workers,
        io_workers=w.io_workers,
        reason=w.reason.value,
        message=sentence(d),
        override_source=d.override_source,
        explicit_not_honoured=w.explicit_not_honoured,
        deployment=deployment,
        replicas=obs.replicas.get(d.pool.name, 0),
        ready_replicas=state.ready_replicas,
        calibration=obs.calibrations.get(d.pool.name),
        arch=pool_arch(d.pool),
        problem=obs.pool_problems.get(d.pool.name),
    )


def fold(previous: api.MultimodalPreprocessorStatus | None, obs: Observation, now: datetime) -> api.MultimodalPreprocessorStatus:
    previous = previous or api.MultimodalPreprocessorStatus()
    generation = obs.generation
    planned = obs.probe is not None and obs.probe.state == "Succeeded"
    # Without a usable probe nothing was planned and the Deployments were left as they are, so
    # the pools they serve stay in the status (the conditions say why nothing moves).
    pools = [_pool_status(d, obs) for d in obs.decisions] if planned else list(previous.pools)
    desired = sum(p.replicas for p in pools)
    # Capped per pool: during a rolling update old and new pods are both ready for a moment.
    ready = sum(min(p.ready_replicas, p.replicas) for p in pools)
    current = sum(obs.deployments.get(p.deployment, DeploymentState()).replicas for p in pools)
    rolling = [p.name for p in pools if not obs.deployments.get(p.deployment, DeploymentState()).rolled_out(p.replicas)]

    probed, cloneable = _probe_conditions(obs.probe)
    probe_failed = obs.probe is not None and obs.probe.state == "Failed"
    not_honoured = [p for p in pools if p.explicit_not_honoured is not None]

    degraded: tuple[Status, str, str]
    blocking = True  # whether a Degraded=True also makes Ready False
    if obs.spec_error is not None:
        degraded = ("True", "InvalidSpec", obs.spec_error)
    elif obs.problem is not None:
        degraded = ("True", obs.problem.reason, obs.problem.message)
        blocking = obs.problem.blocks_ready
    elif probe_failed:
        degraded = ("True", probed[1], probed[2])
    elif not_honoured:
        p = not_honoured[0]
        degraded = (
            "True",
            "ExplicitWorkersNotHonoured",
            f"{p.explicit_not_honoured} processor workers were asked for, but "
            + (
                "the model declares its processor not thread-safe"
                if p.reason == "NotThreadSafe"
                else "the processor cannot be deep-copied"
            )
            + ", so every pod runs 1 worker",
        )
        blocking = False
    else:
        degraded = ("False", "AsExpected", "nothing degrades this resource")

    # Why pods are missing, pool by pool: what the scheduler or the container said.
    stuck = [p for p in pools if p.problem is not None and min(p.ready_replicas, p.replicas) < p.replicas]
    why = "".join(f"; pool {p.name}: {p.problem.reason}: {p.problem.message}" for p in stuck if p.problem is not None)
    ready_cond: tuple[Status, str, str]
    if degraded[0] == "True" and blocking:
        ready_cond = ("False", degraded[1], degraded[2])
    elif obs.probe is None or obs.probe.state != "Succeeded":
        ready_cond = ("False", probed[1], probed[2])
    elif desired == 0:
        ready_cond = ("True", "ScaledToZero", "0 replicas asked for")
    elif ready >= desired and rolling and planned:
        ready_cond = ("False", "RollingOut", f"pods of pool(s) {', '.join(rolling)} are being replaced by the current spec")
    elif ready >= desired:
        ready_cond = ("True", "AllReplicasReady", f"{ready}/{desired} pods ready in {len(pools)} pool(s)")
    else:
        reasons = {p.problem.reason for p in stuck if p.problem is not None}
        reason = reasons.pop() if len(reasons) == 1 else "ReplicasNotReady"
        ready_cond = ("False", reason, f"{ready}/{desired} pods ready in {len(pools)} pool(s){why}")

    conditions = list(previous.conditions)
    for type_, (status, reason, message) in (
        (READY, ready_cond),
        (PROBED, probed),
        (CLONEABLE, cloneable),
        (DEGRADED, degraded),
    ):
        conditions = set_condition(conditions, type_, status, reason, message, generation, now)
    conditions.sort(key=lambda c: CONDITION_TYPES.index(c.type) if c.type in CONDITION_TYPES else len(CONDITION_TYPES))

    return api.MultimodalPreprocessorStatus(
        observed_generation=generation,
        conditions=conditions,
        probe=obs.probe,
        pools=pools,
        replicas=current,
        ready_replicas=ready,
        selector=obs.selector,
        path_summary=",".join(sorted({p.path for p in pools})) or None,
        worker_summary=",".join(f"{p.gpu_model or p.name}={p.processor_workers}" for p in pools) or None,
        ready_summary=f"{ready}/{desired}" if pools else None,
        calibration_summary=_calibration_summary(pools),
    )


def _calibration_summary(pools: Sequence[api.PoolStatus]) -> str | None:
    """Which pools' counts are measured, e.g. "H200=measured,cpu=failed" (None when calibration is off)."""
    parts = [
        f"{p.gpu_model or p.name}={'measured' if p.calibration.state == 'Succeeded' else p.calibration.state.lower()}"
        for p in pools
        if p.calibration is not None
    ]
    return ",".join(parts) or None


@dataclasses.dataclass(frozen=True)
class EventSpec:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def events(previous: api.MultimodalPreprocessorStatus | None, new: api.MultimodalPreprocessorStatus) -> list[EventSpec]:
    """Events for what changed between two statuses: decisions, probe results, problems."""
    previous = previous or api.MultimodalPreprocessorStatus()
    out: list[EventSpec] = []
    old_pools = {p.name: p for p in previous.pools}
    for pool in new.pools:
        old = old_pools.get(pool.name)
        key = (pool.path, pool.processor_workers, pool.io_workers, pool.reason)
        if old is None or (old.path, old.processor_workers, old.io_workers, old.reason) != key:
            out.append(EventSpec("Normal", "Decided", pool.message))
    for pool in new.pools:
        cal, old_cal = pool.calibration, (old_pools[pool.name].calibration if pool.name in old_pools else None)
        if cal is None or (old_cal is not None and (old_cal.hash, old_cal.state) == (cal.hash, cal.state)):
            continue
        if cal.state == "Succeeded":
            curve = ", ".join(f"{p.workers}: {p.req_per_s:g} req/s" for p in cal.curve)
            out.append(EventSpec("Normal", "Calibrated", f"pool {pool.name}: {cal.message} ({curve})"))
        elif cal.state in ("Failed", "Unavailable"):
            out.append(EventSpec("Warning", cal.reason, f"pool {pool.name}: {cal.message}; the rule's count stays"))
    for name in sorted(set(old_pools) - {p.name for p in new.pools}):
        out.append(EventSpec("Normal", "PoolRemoved", f"pool {name} has no eligible nodes any more; its Deployment is deleted"))

    def changed(type_: str) -> api.Condition | None:
        cond, old = new.condition(type_), previous.condition(type_)
        if cond is None or (old is not None and (old.status, old.reason) == (cond.status, cond.reason)):
            return None
        return cond

    if (c := changed(PROBED)) is not None and c.status != "Unknown" and c.reason not in ("ProbePending", "ProbeRunning"):
        out.append(EventSpec("Normal" if c.status == "True" else "Warning", c.reason, c.message))
    if (c := changed(CLONEABLE)) is not None and c.status == "False":
        out.append(EventSpec("Warning", c.reason, c.message))
    if (c := changed(DEGRADED)) is not None and c.status == "True" and c.reason not in {e.reason for e in out}:
        out.append(EventSpec("Warning", c.reason, c.message))
    if (c := changed(READY)) is not None and c.status == "True":
        out.append(EventSpec("Normal", c.reason, c.message))
    elif c is not None and c.reason in {p.problem.reason for p in new.pools if p.problem is not None} - {e.reason for e in out}:
        # Pods that cannot run (no node fits, the runtime exits): what `kubectl describe` shows first.
        out.append(EventSpec("Warning", c.reason, c.message))
    return out


#: The API server refuses longer Event messages.
EVENT_MESSAGE_LIMIT = 1024


def event_body(
    owner: identity.Owner, event: EventSpec, *, resource_version: str | None, instance: str, now: datetime
) -> dict[str, Any]:
    """The core/v1 Event that tells ``event`` about ``owner`` (at ``resource_version``, if known).

    Its name is derived from what it says: posting the same Event again meets the existing
    object and becomes a count bump there (see ``kube.post_event``), not a new object per pass.
    ``instance`` names the operator instance that posts it (its pod name in a cluster).
    """
    stamp = timestamp(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{owner.name}.{short_hash(f'{owner.uid}/{event.reason}/{event.message}', 16)}",
            "namespace": owner.namespace,
        },
        "involvedObject": {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "name": owner.name,
            "namespace": owner.namespace,
            "uid": owner.uid,
            **({"resourceVersion": resource_version} if resource_version else {}),
        },
        "type": event.type,
        "reason": event.reason,
        "message": event.message[:EVENT_MESSAGE_LIMIT],
        "source": {"component": identity.MANAGED_BY},
        "reportingComponent": identity.MANAGED_BY,
        "reportingInstance": instance,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }

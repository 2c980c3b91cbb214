"""Fold what a reconcile saw and decided into the resource's status: conditions, pools, summaries.

Pure: (previous status, observations, now) -> new status. Conditions follow Kubernetes
conventions: ``lastTransitionTime`` moves only when ``status`` changes, every condition carries
the generation it was computed for, and the four types always exist:

- ``Probed``: the probe for the current probe hash finished and its answer could be read;
- ``Cloneable``: the processor can be deep-copied (Unknown until probed);
- ``Degraded``: something keeps the resource from working as asked (its reason says what);
- ``Ready``: every desired pod of every pool is ready;

and two only while the spec asks for what they say: ``Autoscaling`` (spec.autoscaling) and
``EngineReachable`` (spec.engine: whether the engine answered the operator's ``GET <url>/health``,
an answer the control layer gets and hands in as ``Observation.engine``).

Types and reasons come from ``conditions``; ``events`` tells the changes between two statuses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Literal

from mmprep_operator import api
from mmprep_operator.logic import autoscaling
from mmprep_operator.logic.conditions import CONDITION_TYPES, ConditionType, Reason
from mmprep_operator.logic.decide import PoolDecision, sentence
from mmprep_operator.logic.pools import pool_arch
from mmprep_runtime.sizing import WorkerReason

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
    #: Its spec.replicas: what an autoscaler last set, for an autoscaled pool (None: not known).
    desired: int | None = None
    replicas: int = 0
    ready_replicas: int = 0
    updated_replicas: int = 0
    #: The Deployment controller has seen the latest spec (observedGeneration >= generation).
    observed: bool = True

    def rolled_out(self, desired: int) -> bool:
        """All desired pods run the current template: ready pods of an old one do not count."""
        return self.observed and self.updated_replicas >= desired


@dataclasses.dataclass(frozen=True)
class EngineCheck:
    """What the operator's ``GET <url>/health`` of spec.engine got (``control.engine_checker`` asks)."""

    #: The engine's base URL (``api.Engine.base_url``).
    url: str
    #: It answered 200 within the check's timeout.
    answered: bool
    #: Otherwise what it got, in words: its HTTP status, no answer in time, the connection's error.
    error: str = ""


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
    #: pool -> who autoscales it (only with spec.autoscaling), and its HPA or ScaledObject as watched.
    scaling: Mapping[str, autoscaling.PoolScaling] = dataclasses.field(default_factory=dict)
    autoscalers: Mapping[str, Mapping[str, object] | None] = dataclasses.field(default_factory=dict)
    #: Nothing was planned or applied (``problem`` says why: a missing Secret, ...): the pools
    #: that serve stay in the status as they were, and so does the probe.
    held: bool = False
    #: spec.engine's health check in this pass (None: no spec.engine, or a spec that did not parse).
    engine: EngineCheck | None = None


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
        return ("Unknown", Reason.SPEC_INVALID, "the spec is invalid; nothing was probed"), (
            "Unknown",
            Reason.NOT_PROBED,
            "not probed",
        )
    if probe.state == "Succeeded" and probe.result is not None:
        r = probe.result
        fast = "a fast image processor" if r.fast_image_processor else "no fast image processor"
        probed: tuple[Status, str, str] = (
            "True",
            Reason.PROBE_SUCCEEDED,
            f"{r.processor_class or 'processor'} loaded with {fast} (Job {probe.job})",
        )
        if r.cloneable:
            took = f" in {r.clone_seconds:.2f}s" if r.clone_seconds is not None else ""
            return probed, ("True", Reason.CLONEABLE, f"the processor deep-copies{took}: one copy per worker")
        why = f": {r.error}" if r.error else ""
        return probed, ("False", Reason.NOT_CLONEABLE, f"the processor cannot be deep-copied{why}; 1 worker per pod")
    if probe.state == "Failed":
        return ("False", probe.reason or Reason.PROBE_FAILED, probe.message or "the probe failed"), (
            "Unknown",
            Reason.NOT_PROBED,
            "the probe did not answer",
        )
    waiting = Reason.PROBE_RUNNING if probe.state == "Running" else Reason.PROBE_PENDING
    if probe.reason:  # its pod cannot start, and says why
        waiting_for: tuple[Status, str, str] = ("False", probe.reason, probe.message or f"probe Job {probe.job} cannot start")
    else:
        waiting_for = ("False", waiting, f"waiting for probe Job {probe.job}")
    return waiting_for, ("Unknown", Reason.NOT_PROBED, "waiting for the probe")


def _pool_status(d: PoolDecision, obs: Observation) -> api.PoolStatus:
    deployment = obs.deployment_names[d.pool.name]
    state = obs.deployments.get(deployment, DeploymentState())
    replicas = obs.replicas.get(d.pool.name, 0)
    scaled: api.PoolAutoscalingStatus | None = None
    if (scaling := obs.scaling.get(d.pool.name)) is not None:
        # The autoscaler sizes the pool: its Deployment's count is the desired one.
        replicas = state.desired if state.desired is not None else replicas
        scaled = autoscaling.observed(scaling, obs.autoscalers.get(d.pool.name), state.desired)
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
        render_processes=d.render_processes,
        override_source=d.override_source,
        explicit_not_honoured=w.explicit_not_honoured,
        deployment=deployment,
        replicas=replicas,
        ready_replicas=state.ready_replicas,
        calibration=obs.calibrations.get(d.pool.name),
        arch=pool_arch(d.pool),
        problem=obs.pool_problems.get(d.pool.name),
        autoscaling=scaled,
    )


def _autoscaling_condition(scaling: Mapping[str, autoscaling.PoolScaling]) -> tuple[Status, str, str]:
    held = sorted(name for name, s in scaling.items() if s.engine == "None")
    if held:
        first = scaling[held[0]]
        return "False", first.reason, f"pool(s) {', '.join(held)}: {first.message}"
    engines = sorted({s.engine for s in scaling.values()})
    first = next(iter(scaling.values()))
    return "True", first.reason, f"{len(scaling)} pool(s) scaled by {', '.join(engines)} ({first.message})"


def _engine_condition(check: EngineCheck) -> tuple[Status, str, str]:
    if check.answered:
        return "True", Reason.ENGINE_ANSWERS, f"GET {check.url}/health answered 200"
    return (
        "False",
        Reason.ENGINE_UNREACHABLE,
        f"GET {check.url}/health: {check.error}; the pods' /v1/chat/completions and /v1/completions need the engine",
    )


def fold(previous: api.MultimodalPreprocessorStatus | None, obs: Observation, now: datetime) -> api.MultimodalPreprocessorStatus:
    previous = previous or api.MultimodalPreprocessorStatus()
    generation = obs.generation
    planned = obs.probe is not None and obs.probe.state == "Succeeded" and not obs.held
    # Without a usable probe nothing was planned and the Deployments were left as they are, so
    # the pools they serve stay in the status (the conditions say why nothing moves).
    pools = [_pool_status(d, obs) for d in obs.decisions] if planned else list(previous.pools)
    desired = sum(p.replicas for p in pools)
    # Capped per pool: during a rolling update old and new pods are both ready for a moment.
    ready = sum(min(p.ready_replicas, p.replicas) for p in pools)
    current = sum(obs.deployments.get(p.deployment, DeploymentState()).replicas for p in pools)
    rolling = [p.name for p in pools if not obs.deployments.get(p.deployment, DeploymentState()).rolled_out(p.replicas)]

    probed, cloneable = _probe_conditions(obs.probe)
    if obs.held and obs.probe is None and obs.problem is not None:
        probed = ("Unknown", Reason.NOT_PROBED, f"not probed: {obs.problem.message}")
    probe_failed = obs.probe is not None and obs.probe.state == "Failed"
    not_honoured = [p for p in pools if p.explicit_not_honoured is not None]
    autoscaling_cond = _autoscaling_condition(obs.scaling) if obs.scaling else None

    degraded: tuple[Status, str, str]
    blocking = True  # whether a Degraded=True also makes Ready False
    if obs.spec_error is not None:
        degraded = ("True", Reason.INVALID_SPEC, obs.spec_error)
    elif obs.problem is not None:
        degraded = ("True", obs.problem.reason, obs.problem.message)
        blocking = obs.problem.blocks_ready
    elif probe_failed:
        degraded = ("True", probed[1], probed[2])
    elif obs.probe is not None and obs.probe.state in ("Pending", "Running") and obs.probe.reason:
        # The probe's pod cannot start (a missing Secret): the pods that serve are left as they are.
        degraded = ("True", probed[1], probed[2])
        blocking = False
    elif not_honoured:
        p = not_honoured[0]
        degraded = (
            "True",
            Reason.EXPLICIT_WORKERS_NOT_HONOURED,
            f"{p.explicit_not_honoured} processor workers were asked for, but "
            + (
                "the model declares its processor not thread-safe"
                if p.reason == WorkerReason.NOT_THREAD_SAFE.value
                else "the processor cannot be deep-copied"
            )
            + ", so every pod runs 1 worker",
        )
        blocking = False
    elif autoscaling_cond is not None and autoscaling_cond[0] == "False":
        # Asked for and impossible here: the pools serve on at their last count.
        degraded = ("True", autoscaling_cond[1], autoscaling_cond[2])
        blocking = False
    else:
        degraded = ("False", Reason.AS_EXPECTED, "nothing degrades this resource")

    # Why pods are missing, pool by pool: what the scheduler or the container said.
    stuck = [p for p in pools if p.problem is not None and min(p.ready_replicas, p.replicas) < p.replicas]
    why = "".join(f"; pool {p.name}: {p.problem.reason}: {p.problem.message}" for p in stuck if p.problem is not None)
    ready_cond: tuple[Status, str, str]
    if degraded[0] == "True" and blocking:
        ready_cond = ("False", degraded[1], degraded[2])
    elif obs.probe is None or obs.probe.state != "Succeeded":
        ready_cond = ("False", probed[1], probed[2])
    elif desired == 0:
        ready_cond = ("True", Reason.SCALED_TO_ZERO, "0 replicas asked for")
    elif ready >= desired and rolling and planned:
        ready_cond = ("False", Reason.ROLLING_OUT, f"pods of pool(s) {', '.join(rolling)} are being replaced by the current spec")
    elif ready >= desired:
        ready_cond = ("True", Reason.ALL_REPLICAS_READY, f"{ready}/{desired} pods ready in {len(pools)} pool(s)")
    else:
        reasons = {p.problem.reason for p in stuck if p.problem is not None}
        reason = reasons.pop() if len(reasons) == 1 else Reason.REPLICAS_NOT_READY
        ready_cond = ("False", reason, f"{ready}/{desired} pods ready in {len(pools)} pool(s){why}")

    conditions = list(previous.conditions)
    for type_, (status, reason, message) in (
        (ConditionType.READY, ready_cond),
        (ConditionType.PROBED, probed),
        (ConditionType.CLONEABLE, cloneable),
        (ConditionType.DEGRADED, degraded),
    ):
        conditions = set_condition(conditions, type_, status, reason, message, generation, now)
    if autoscaling_cond is not None:
        conditions = set_condition(conditions, ConditionType.AUTOSCALING, *autoscaling_cond, generation, now)
    elif planned:
        # Fixed replicas (again): the condition is only there while autoscaling is asked for.
        conditions = [c for c in conditions if c.type != ConditionType.AUTOSCALING]
    if obs.engine is not None:
        conditions = set_condition(conditions, ConditionType.ENGINE_REACHABLE, *_engine_condition(obs.engine), generation, now)
    else:
        conditions = [c for c in conditions if c.type != ConditionType.ENGINE_REACHABLE]
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
        autoscaling_summary=autoscaling.summary(pools),
    )


def _calibration_summary(pools: Sequence[api.PoolStatus]) -> str | None:
    """Which pools' counts are measured, e.g. "H200=measured,cpu=failed" (None when calibration is off)."""
    parts = [
        f"{p.gpu_model or p.name}={'measured' if p.calibration.state == 'Succeeded' else p.calibration.state.lower()}"
        for p in pools
        if p.calibration is not None
    ]
    return ",".join(parts) or None

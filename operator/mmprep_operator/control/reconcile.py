"""Reconcile one MultimodalPreprocessor: read, plan, apply, report. Level-triggered.

Each call reads the resource, recomputes everything from (spec, nodes, probe, policy) through the
pure modules, applies the children, and writes the status only when it differs, so a reconcile
caused by its own status write ends there. When the decided pools change, the status is written
before the children are applied (see ``report_first``).

``Reconciler`` is the pass and nothing else; each collaborator owns one kind of I/O and its own
policy, and is composed here:

- ``probe_jobs``: the probe's answer (status, cache, or its Job);
- ``planner``: the plan, remade from each pool's measured worker count (``calibration_jobs``: status,
  cache, or its Job) and the pool grouping of the current nodes;
- ``applier``: server-side apply with its conflict policy, and prune of vanished pools;
- ``autoscalers``: whether the cluster has metrics-server and KEDA (cached), for spec.autoscaling;
- ``engine_checker``: whether spec.engine answers ``GET <url>/health`` (cached briefly), asked
  once per pass of a resource with an engine; such a resource is looked at again within the
  policy's ``engineCheckSeconds``, so that its EngineReachable condition follows the engine;
- ``status_writer``: the status write (maybe conditional), which hands Events to ``event_poster``.

The state kept between calls is optimisation only: the collaborators' caches (the planner's pool
grouping per placement among them), and the newest resourceVersion of each resource this
reconciler read or wrote.

Where the resource is read from: a pass that only writes status (a node change, a readiness
change) starts from the watch's copy (``watched``) instead of a GET, when that copy is the newest
version this reconciler knows of, and writes the status on the condition that the resource is
still at that version. Anything more (applying children, pruning, reading a Job), a stale copy,
or a status write that meets a newer version ends that pass with ``READ_AGAIN``, and the pass
starts over from a GET. So a stale copy never writes anything, and every apply is computed from
a freshly read spec. ``READ_AGAIN`` is a return value, not an exception: the collaborators
answer "needs a read" as None, and only real API errors raise.

Errors: a child the API server rejects (a bad volume in the spec, forbidden) becomes the
``ApplyFailed`` condition and an Event, and the caller backs off; anything else raises and the
caller backs off too (see ``controller``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Literal

from pydantic import ValidationError

from mmprep_operator import api
from mmprep_operator.api.policy import OperatorPolicy
from mmprep_operator.control.applier import ChildApplier
from mmprep_operator.control.autoscalers import AutoscalerDetector
from mmprep_operator.control.calibration_jobs import CalibrationJobs
from mmprep_operator.control.children import ChildStore
from mmprep_operator.control.engine_checker import EngineChecker
from mmprep_operator.control.event_poster import DRAIN_SECONDS, EventPoster, utcnow
from mmprep_operator.control.metrics import Metrics
from mmprep_operator.control.planner import Planned, Planner
from mmprep_operator.control.probe_jobs import ProbeJobs
from mmprep_operator.control.reference_checker import RECHECK_SECONDS, ReferenceChecker
from mmprep_operator.control.status_writer import StatusWriter
from mmprep_operator.kube import ApiError, KubeApi
from mmprep_operator.logic import identity, naming, pod_parts, podstates, probe, references, status
from mmprep_operator.logic.nodes import NodeFacts
from mmprep_operator.logic.plan import Plan

log = logging.getLogger("mmprep.operator.reconcile")

#: "decided": a changed decision was reported; the children follow in another, less urgent pass.
OutcomeKind = Literal["done", "decided", "waiting", "invalid", "gone", "error"]
# After a probe's deadline, look again even if no Job event arrived (lost watch events happen).
_PROBE_GRACE_SECONDS: Final = 30.0
#: How often a waiting probe's Job and pods are read again.
_PROBE_POLL_SECONDS: Final = 30.0


class ReadAgain(enum.Enum):
    """A pass from the watch's copy that cannot go on without reading the resource from the API."""

    READ_AGAIN = "read again"


READ_AGAIN: Final = ReadAgain.READ_AGAIN


def _no_copy(namespace: str, name: str) -> Mapping[str, Any] | None:
    return None


def _version(body: Mapping[str, Any]) -> str | None:
    version = (body.get("metadata") or {}).get("resourceVersion")
    return str(version) if version else None


@dataclasses.dataclass(frozen=True)
class Outcome:
    kind: OutcomeKind
    requeue_after: float | None = None

    def within(self, seconds: float) -> Outcome:
        """The same outcome, looked at again after ``seconds`` at the latest."""
        if self.requeue_after is not None and self.requeue_after <= seconds:
            return self
        return dataclasses.replace(self, requeue_after=seconds)


@dataclasses.dataclass(frozen=True)
class _Read:
    """The resource as one pass read it, and from where: the API (``fresh``) or the watch's copy."""

    owner: identity.Owner
    body: Mapping[str, Any]
    #: Its status as parsed (None: none yet, or another operator version's); an early report
    #: replaces it for the rest of the pass.
    previous: api.MultimodalPreprocessorStatus | None
    fresh: bool
    #: What spec.engine's health check said in this pass (None: no engine, or no parsed spec yet).
    engine: status.EngineCheck | None = None

    @property
    def generation(self) -> int | None:
        return (self.body.get("metadata") or {}).get("generation")

    @property
    def annotations(self) -> Mapping[str, str]:
        return (self.body.get("metadata") or {}).get("annotations") or {}

    @property
    def selector(self) -> str:
        return identity.selector_string(self.owner)

    def observation(self, **observed: Any) -> status.Observation:
        return status.Observation(self.generation, self.selector, engine=self.engine, **observed)


@dataclasses.dataclass
class Reconciler:
    kube: KubeApi
    policy: OperatorPolicy
    nodes: Callable[[], Iterable[NodeFacts]]
    metrics: Metrics
    clock: Callable[[], dt.datetime] = utcnow
    #: Children as the watch shows them (fed by the controller); lets unchanged applies be skipped.
    children: ChildStore = dataclasses.field(default_factory=ChildStore)
    #: Report a changed decision and leave the applies to a second, less urgent pass (the queue
    #: takes node-triggered reconciles first): after a node change every affected resource's
    #: status then shows the new pools before anyone's children are applied. The operator sets
    #: it; off, one reconcile reports first and applies at once.
    report_first: bool = False
    #: Post Events from one background task, in order, instead of within the reconcile (the
    #: operator sets it): after a node change the status writes are what is waited for, and
    #: Events are best effort. Off, a reconcile posts its Events before it returns.
    events_in_background: dataclasses.InitVar[bool] = False
    #: The watch's latest copy of a resource, when there is one (fed by the controller).
    watched: Callable[[str, str], Mapping[str, Any] | None] = _no_copy
    # The collaborators, built from the fields above (see __post_init__).
    probes: ProbeJobs = dataclasses.field(init=False)
    planner: Planner = dataclasses.field(init=False)
    applier: ChildApplier = dataclasses.field(init=False)
    autoscalers: AutoscalerDetector = dataclasses.field(init=False)
    reference_checker: ReferenceChecker = dataclasses.field(init=False)
    engines: EngineChecker = dataclasses.field(init=False)
    events: EventPoster = dataclasses.field(init=False)
    writer: StatusWriter = dataclasses.field(init=False)
    #: Per resource, the newest resourceVersion this reconciler read (a GET) or wrote (its status).
    _versions: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)

    def __post_init__(self, events_in_background: bool) -> None:
        self.probes = ProbeJobs(self.kube, self.policy, self.metrics)
        self.applier = ChildApplier(self.kube, self.children)
        self.autoscalers = AutoscalerDetector(self.kube)
        calibrations = CalibrationJobs(self.kube, self.policy, self.clock)
        self.planner = Planner(self.policy, self.nodes, calibrations, self.autoscalers)
        self.reference_checker = ReferenceChecker(self.kube)
        # An answer outlives a burst of passes but not the interval: the pass that comes back
        # for the check (``_finish``) always asks the engine anew.
        self.engines = EngineChecker(ttl_seconds=self.policy.engine_check_seconds / 3)
        self.events = EventPoster(self.kube, self.clock, background=events_in_background)
        self.writer = StatusWriter(self.kube, self.metrics, self.events, self.clock)

    async def reconcile(self, namespace: str, name: str) -> Outcome:
        try:
            return await self._reconcile(namespace, name)
        except ApiError as e:
            gone = e.status == 404 and await self.kube.get_resource(namespace, name) is None
            # Deleted while we worked on it, or its namespace is going away with everything in it:
            # nothing to report, and nowhere to report it.
            if gone or e.namespace_terminating:
                self._forget((namespace, name))
                return Outcome("gone")
            raise

    async def close(self, timeout: float = DRAIN_SECONDS) -> None:
        """Post the Events still waiting (for at most ``timeout`` seconds), then stop posting;
        close the engine checks' session."""
        await self.events.close(timeout)
        await self.engines.close()

    async def _reconcile(self, namespace: str, name: str) -> Outcome:
        key = (namespace, name)
        copy = self.watched(namespace, name)
        version = _version(copy) if copy is not None else None
        # The copy must be the newest version known here: one older than our own last status
        # write would fold the status from an outdated previous one.
        if copy is not None and version is not None and self._versions.get(key, version) == version:
            outcome = await self._pass(namespace, name, copy, fresh=False)
            if outcome is not READ_AGAIN:
                self.metrics.reads.labels("watch").inc()
                return outcome
        body = await self.kube.get_resource(namespace, name)
        self.metrics.reads.labels("api").inc()
        if body is None:
            self._forget(key)
            return Outcome("gone")
        if (version := _version(body)) is not None:
            self._versions[key] = version
        outcome = await self._pass(namespace, name, body, fresh=True)
        assert outcome is not READ_AGAIN  # a pass from a GET reads Jobs and writes unconditionally
        return outcome

    def _forget(self, key: tuple[str, str]) -> None:
        self.metrics.set_conditions(key, None)
        self.applier.forget(key)
        self._versions.pop(key, None)

    async def _pass(self, namespace: str, name: str, body: Mapping[str, Any], *, fresh: bool) -> Outcome | ReadAgain:
        """One reconcile from ``body``: read from the API (``fresh``) or the watch's copy.

        From the copy, whatever needs more than a conditional status write answers ``READ_AGAIN``.
        """
        meta = body.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            # Being deleted (foreground cascading, or its namespace terminating): the garbage
            # collector is removing the children, and re-applying them would fight it.
            self._forget((namespace, name))
            return Outcome("gone")
        owner = identity.Owner(name=name, namespace=namespace, uid=meta.get("uid"))
        read = _Read(owner, body, _parse_status(body.get("status")), fresh)
        try:
            spec = api.MultimodalPreprocessorSpec.model_validate(body.get("spec") or {})
        except ValidationError as e:
            # Only reachable when the CRD in the cluster is older/laxer than this operator.
            obs = read.observation(spec_error=api.describe_validation_error(e))
            return await self._finish(read, obs, Outcome("invalid"))
        if spec.engine is not None:
            read = dataclasses.replace(read, engine=await self.engines.check(spec.engine.base_url(namespace)))

        missing = await self.reference_checker.missing(namespace, spec)
        if missing:
            return await self._finish(read, self._held(read, missing), Outcome("waiting", requeue_after=RECHECK_SECONDS))

        hash_ = probe.probe_hash(spec, self.policy, read.annotations.get(probe.ANNOTATION_REPROBE))
        probe_status = self.probes.known(owner, hash_, read.previous)
        if probe_status is None:
            if not fresh:
                return READ_AGAIN  # the Job is read (and maybe created) only for a freshly read spec
            probe_status = await self.probes.read(owner, spec, hash_)
        if probe_status.state != "Succeeded" or probe_status.result is None:
            return await self._finish(read, read.observation(probe=probe_status), self._probe_wait(spec, probe_status))

        planned = await self.planner.plan(owner, spec, probe_status, read.previous, read.annotations, read_jobs=fresh)
        if planned is None:
            return READ_AGAIN  # the Jobs are read (and maybe created) only for a freshly read spec
        return await self._apply(read, planned)

    def _held(self, read: _Read, missing: Sequence[references.Reference]) -> status.Observation:
        """A resource whose references are missing: no probe, no apply, no prune; the status keeps
        the pools that serve."""
        previous, namespace = read.previous, read.owner.namespace
        kept = previous.pools if previous is not None else []
        return read.observation(
            probe=previous.probe if previous is not None else None,
            problem=references.problem(missing, namespace),
            held=True,
            deployments={
                p.deployment: self.children.deployment_state(namespace, p.deployment) or status.DeploymentState() for p in kept
            },
        )

    def _probe_wait(self, spec: api.MultimodalPreprocessorSpec, probe_status: api.ProbeStatus) -> Outcome:
        if probe_status.state == "Failed":
            return Outcome("waiting")
        deadline = spec.probe.timeout_seconds or self.policy.probe.timeout_seconds
        # Probe pods are not watched: a pod that cannot start (a missing Secret, which the
        # operator may not read) changes no Job status, so look at it again soon.
        return Outcome("waiting", requeue_after=min(deadline + _PROBE_GRACE_SECONDS, _PROBE_POLL_SECONDS))

    def _observation(
        self,
        read: _Read,
        planned: Planned,
        deployments: Mapping[str, status.DeploymentState],
        problem: status.Problem | None,
        pod_problems: Mapping[str, api.PoolProblem] | None = None,
    ) -> status.Observation:
        namespace = read.owner.namespace
        autoscalers = {
            pool: self.children.autoscaler(s.kind, namespace, s.deployment) if s.kind is not None else None
            for pool, s in planned.plan.scaling.items()
        }
        return planned.observation(read.generation, read.selector, deployments, problem, autoscalers, pod_problems, read.engine)

    async def _apply(self, read: _Read, planned: Planned) -> Outcome | ReadAgain:
        """Apply the plan's children and report what came of it."""
        owner, plan, previous = read.owner, planned.plan, read.previous
        if previous is not None and previous.pools and not self.applier.children_unchanged(plan):
            # Children must change. When the decided pools changed too (a node change, a spec
            # edit), report the decision before the applies: a node change makes every resource
            # that could use the node apply Deployments, and reporting after the applies would
            # delay each status by everyone's applies. Deployment states are the watch's for now;
            # the report after the applies refreshes them. Readiness is left out of the
            # comparison, so a second pass (``report_first``) goes straight to the applies.
            watched = {
                name: self.children.deployment_state(owner.namespace, name) or status.DeploymentState()
                for name in plan.deployment_names.values()
            }
            early = self._observation(read, planned, watched, plan.problem)
            if _decided(status.fold(previous, early, self.clock()).pools) != _decided(previous.pools):
                reported = await self._report(read, early)
                if reported is READ_AGAIN:
                    return READ_AGAIN
                read = dataclasses.replace(read, previous=reported)
                if self.report_first:
                    return Outcome("decided", requeue_after=0.0)
        if not read.fresh and not self.applier.up_to_date(owner, plan):
            return READ_AGAIN  # children to apply or prune: only from a freshly read spec
        applied = await self.applier.apply_plan(owner, plan)
        if applied.problem is not None:
            return await self._finish(
                read, self._observation(read, planned, applied.deployments, applied.problem), Outcome("error")
            )
        pod_problems = self._pod_problems(owner, plan, applied.deployments)
        obs = self._observation(read, planned, applied.deployments, plan.problem, pod_problems)
        if planned.calibrating:
            # The Job's own events bring the result; this is the net under a lost watch event.
            return await self._finish(
                read, obs, Outcome("done", requeue_after=self.policy.calibration.timeout_seconds + _PROBE_GRACE_SECONDS)
            )
        if any(s.engine == "None" for s in plan.scaling.values()):
            # Held pools: no event says that metrics-server or KEDA arrived; look again once
            # the detection's answer may have changed.
            return await self._finish(read, obs, Outcome("done", requeue_after=self.autoscalers.ttl_seconds))
        return await self._finish(read, obs, Outcome("done"))

    async def _finish(self, read: _Read, obs: status.Observation, outcome: Outcome) -> Outcome | ReadAgain:
        """Report the pass's last observation; then ``outcome``, or ``READ_AGAIN`` if it was not written.

        A resource with an engine comes back within ``engineCheckSeconds`` whatever else it waits
        for: no event tells that an engine went away or came back, so that pass is its check.
        """
        if await self._report(read, obs) is READ_AGAIN:
            return READ_AGAIN
        return outcome.within(self.policy.engine_check_seconds) if obs.engine is not None else outcome

    def _pod_problems(
        self, owner: identity.Owner, plan: Plan, deployments: Mapping[str, status.DeploymentState]
    ) -> dict[str, api.PoolProblem]:
        """Why pods are missing, per pool, read from the pods as the watch last showed them."""
        short = plan.pools_short_of_pods(deployments)
        if not short:
            return {}
        pods = self.children.pods(owner.namespace, identity.selector_labels(owner))
        by_label = {naming.label_value(name): name for name in short}
        return podstates.pool_problems(pods, by_label, identity.LABEL_POOL, pod_parts.CONTAINER_NAME)

    async def _report(self, read: _Read, obs: status.Observation) -> api.MultimodalPreprocessorStatus | ReadAgain:
        """Write the status folded from ``obs`` (when it changed) and its Events; return it.

        From the watch's copy (not ``fresh``) the write is conditional on the copy's version, or
        this pass's own write since (an early report); ``READ_AGAIN`` when the resource moved on.
        """
        key = (read.owner.namespace, read.owner.name)
        if_version = None if read.fresh else self._versions.get(key, _version(read.body))
        written = await self.writer.write(read.owner, read.body, read.previous, obs, if_version=if_version)
        if written is None:
            return READ_AGAIN
        if written.version is not None:
            self._versions[key] = written.version
        return written.status


def _decided(pools: Iterable[api.PoolStatus]) -> list[dict[str, Any]]:
    """The pools as decided: everything in their status but what is observed of their pods."""
    # An autoscaler's word changes with the load, not with a decision.
    return [p.model_dump(exclude={"ready_replicas", "problem", "autoscaling"}) for p in pools]


def _parse_status(raw: Any) -> api.MultimodalPreprocessorStatus | None:
    if not isinstance(raw, dict) or not raw:
        return None
    try:
        return api.MultimodalPreprocessorStatus.model_validate(raw)
    except ValidationError:
        # A status from another version of the operator: start over rather than crash.
        return None

"""Reconcile one MultimodalPreprocessor: probe, decide, apply, report. Level-triggered.

Each call reads the resource, recomputes everything from (spec, nodes, probe, policy) through the
pure modules, applies the children, and writes the status only when it differs, so a reconcile
caused by its own status write ends there. When the decided pools change, the status is written
before the children are applied (see ``report_first``). The state kept between calls is
optimisation only: a cache of probe answers per (namespace, probe hash) (the answer is also in
each resource's status and in the probe Job), the pool grouping of the current nodes per
placement, so resources that share a placement group the nodes once per change, and the newest
resourceVersion of each resource this reconciler read or wrote.

Where the resource is read from: a pass that only writes status (a node change, a readiness
change) starts from the watch's copy (``watched``) instead of a GET, when that copy is the newest
version this reconciler knows of, and writes the status on the condition that the resource is
still at that version. Anything more (applying children, pruning, probing through the API), a
stale copy, or a status write that meets a newer version starts the pass over from a GET. So a
stale copy never writes anything, and every apply is computed from a freshly read spec.

Errors: a child the API server rejects (a bad volume in the spec, forbidden) becomes the
``ApplyFailed`` condition and an Event, and the caller backs off; anything else raises and the
caller backs off too (see ``controller``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import socket
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from pydantic import ValidationError

from mmprep_operator import api, calibration, children, jobs, naming, podstates, pools, probe, render, status
from mmprep_operator.children import ChildStore
from mmprep_operator.config import OperatorPolicy
from mmprep_operator.kube import ApiError, Conflict, ForeignObject, KubeApi
from mmprep_operator.metrics import Metrics
from mmprep_operator.naming import short_hash
from mmprep_operator.nodes import NodeFacts
from mmprep_operator.plan import Plan, make_plan

log = logging.getLogger("mmprep.operator.reconcile")

#: "decided": a changed decision was reported; the children follow in another, less urgent pass.
OutcomeKind = Literal["done", "decided", "waiting", "invalid", "gone", "error"]
# After a probe's deadline, look again even if no Job event arrived (lost watch events happen).
_PROBE_GRACE_SECONDS = 30.0
_APPLY_ATTEMPTS = 3
_PROBE_CACHE_SIZE = 1024
_POOLING_MEMO_SIZE = 256
#: The children made per pool (kind -> apiVersion), pruned when their pool goes.
_POOL_KINDS = {"Deployment": "apps/v1", "PodDisruptionBudget": "policy/v1"}


class _Stale(Exception):
    """This pass cannot go on from the watch's copy of the resource: read it from the API."""


def _no_copy(namespace: str, name: str) -> Mapping[str, Any] | None:
    return None


def _version(body: Mapping[str, Any]) -> str | None:
    version = (body.get("metadata") or {}).get("resourceVersion")
    return str(version) if version else None


@dataclasses.dataclass(frozen=True)
class Outcome:
    kind: OutcomeKind
    requeue_after: float | None = None


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def describe_validation_error(error: ValidationError) -> str:
    parts = []
    for e in error.errors()[:5]:
        where = ".".join(str(p) for p in e["loc"]) or "spec"
        parts.append(f"spec.{where}: {e['msg']}" if where != "spec" else e["msg"])
    return "; ".join(parts)


@dataclasses.dataclass
class Reconciler:
    api: KubeApi
    policy: OperatorPolicy
    nodes: Callable[[], Iterable[NodeFacts]]
    metrics: Metrics
    clock: Callable[[], dt.datetime] = utcnow
    probe_cache: dict[tuple[str, str], api.ProbeResult] = dataclasses.field(default_factory=dict)
    #: Settled calibrations per (namespace, calibration hash); also kept in each resource's status.
    calibration_cache: dict[tuple[str, str], api.PoolCalibration] = dataclasses.field(default_factory=dict)
    #: Names this operator instance in the Events it posts (the pod name in a cluster).
    instance: str = dataclasses.field(default_factory=socket.gethostname)
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
    events_in_background: bool = False
    #: The watch's latest copy of a resource, when there is one (fed by the controller).
    watched: Callable[[str, str], Mapping[str, Any] | None] = _no_copy
    #: Per resource, the (kind, name) of its pool children at its last successful prune.
    _desired: dict[tuple[str, str], frozenset[tuple[str, str]]] = dataclasses.field(default_factory=dict)
    #: The nodes the memoized poolings were grouped from, and those poolings by placement key.
    _node_snapshot: list[NodeFacts] = dataclasses.field(default_factory=list)
    _poolings: dict[str, pools.Pooling] = dataclasses.field(default_factory=dict)
    #: Per resource, the newest resourceVersion this reconciler read (a GET) or wrote (its status).
    _versions: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    _event_backlog: asyncio.Queue[tuple[render.Owner, Mapping[str, Any], status.EventSpec]] | None = None
    _event_poster: asyncio.Task[None] | None = None

    def _pooling(self, spec: api.MultimodalPreprocessorSpec) -> pools.Pooling:
        """``pools.group`` over the current nodes, memoized until any node fact changes.

        One node event requeues every resource that could use the node; they mostly share their
        placement (selector, tolerations, affinity, GPU resource), so they share one grouping
        instead of each regrouping all nodes. Comparing the node list with the snapshot is cheap
        (identity first, then the small frozen facts) and needs no version kept in step with
        the index.
        """
        nodes = list(self.nodes())
        if nodes != self._node_snapshot:
            self._node_snapshot = nodes
            self._poolings.clear()
        key = pools.placement_key(spec)
        pooling = self._poolings.get(key)
        if pooling is None:
            if len(self._poolings) >= _POOLING_MEMO_SIZE:
                self._poolings.clear()
            pooling = self._poolings[key] = pools.group(nodes, spec)
        return pooling

    def _remember(self, key: tuple[str, str], result: api.ProbeResult) -> None:
        # Bounded: one entry per distinct model and namespace; the oldest goes first.
        self.probe_cache.pop(key, None)
        self.probe_cache[key] = result
        while len(self.probe_cache) > _PROBE_CACHE_SIZE:
            self.probe_cache.pop(next(iter(self.probe_cache)))

    async def reconcile(self, namespace: str, name: str) -> Outcome:
        try:
            return await self._reconcile(namespace, name)
        except ApiError as e:
            gone = e.status == 404 and await self.api.get_resource(namespace, name) is None
            # Deleted while we worked on it, or its namespace is going away with everything in it:
            # nothing to report, and nowhere to report it.
            if gone or _namespace_terminating(e):
                self._forget((namespace, name))
                return Outcome("gone")
            raise

    async def _reconcile(self, namespace: str, name: str) -> Outcome:
        key = (namespace, name)
        copy = self.watched(namespace, name)
        version = _version(copy) if copy is not None else None
        # The copy must be the newest version known here: one older than our own last status
        # write would fold the status from an outdated previous one.
        if copy is not None and version is not None and self._versions.get(key, version) == version:
            try:
                outcome = await self._pass(namespace, name, copy, fresh=False)
            except _Stale:
                pass  # read it from the API below
            else:
                self.metrics.reads.labels("watch").inc()
                return outcome
        body = await self.api.get_resource(namespace, name)
        self.metrics.reads.labels("api").inc()
        if body is None:
            self._forget(key)
            return Outcome("gone")
        if (version := _version(body)) is not None:
            self._versions[key] = version
        return await self._pass(namespace, name, body, fresh=True)

    def _forget(self, key: tuple[str, str]) -> None:
        self.metrics.set_conditions(key, None)
        self._desired.pop(key, None)
        self._versions.pop(key, None)

    async def _pass(self, namespace: str, name: str, body: Mapping[str, Any], *, fresh: bool) -> Outcome:
        """One reconcile from ``body``: read from the API (``fresh``) or the watch's copy.

        From the copy, whatever needs more than a conditional status write raises ``_Stale``.
        """
        meta = body.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            # Being deleted (foreground cascading, or its namespace terminating): the garbage
            # collector is removing the children, and re-applying them would fight it.
            self._forget((namespace, name))
            return Outcome("gone")
        owner = render.Owner(name=name, namespace=namespace, uid=meta.get("uid"))
        generation = meta.get("generation")
        previous = _parse_status(body.get("status"))
        selector = render.selector_string(owner)

        try:
            spec = api.MultimodalPreprocessorSpec.model_validate(body.get("spec") or {})
        except ValidationError as e:
            # Only reachable when the CRD in the cluster is older/laxer than this operator.
            obs = status.Observation(generation, selector, spec_error=describe_validation_error(e))
            await self._report(owner, body, previous, obs, fresh=fresh)
            return Outcome("invalid")

        reprobe = (meta.get("annotations") or {}).get(probe.ANNOTATION_REPROBE)
        probe_status = await self._probe(owner, spec, probe.probe_hash(spec, self.policy, reprobe), previous, fresh=fresh)
        if probe_status.state != "Succeeded" or probe_status.result is None:
            await self._report(owner, body, previous, status.Observation(generation, selector, probe=probe_status), fresh=fresh)
            if probe_status.state == "Failed":
                return Outcome("waiting")
            deadline = spec.probe.timeout_seconds or self.policy.probe.timeout_seconds
            return Outcome("waiting", requeue_after=deadline + _PROBE_GRACE_SECONDS)

        pooling = self._pooling(spec)
        plan = make_plan(owner, spec, self._node_snapshot, probe_status.result, self.policy, pooling=pooling)
        calibrations: dict[str, api.PoolCalibration] = {}
        calibrating = False
        if calibration.wanted(spec, self.policy):
            recalibrate = (meta.get("annotations") or {}).get(calibration.ANNOTATION_RECALIBRATE)
            calibrations = await self._calibrate(owner, spec, plan, previous, recalibrate, fresh=fresh)
            measured = {
                pool: c.chosen_workers for pool, c in calibrations.items() if c.state == "Succeeded" and c.chosen_workers
            }
            calibrating = any(not calibration.settled(c.state) for c in calibrations.values())
            if measured:
                plan = make_plan(
                    owner, spec, self._node_snapshot, probe_status.result, self.policy, pooling=pooling, measured=measured
                )
        problem = plan.problem

        def observed(
            deployments: dict[str, status.DeploymentState],
            problem: status.Problem | None,
            pod_problems: Mapping[str, api.PoolProblem] | None = None,
        ) -> status.Observation:
            return status.Observation(
                generation,
                selector,
                probe=probe_status,
                problem=problem,
                decisions=plan.decisions,
                deployment_names=plan.deployment_names,
                replicas=plan.replicas,
                deployments=deployments,
                calibrations=calibrations,
                # The plan's (an image that cannot run there) wins over what the pods say.
                pool_problems={**(pod_problems or {}), **plan.pool_problems},
            )

        if previous is not None and previous.pools and not all(self.children.unchanged_since_apply(obj) for obj in plan.objects):
            # Children must change. When the decided pools changed too (a node change, a spec
            # edit), report the decision before the applies: a node change makes every resource
            # that could use the node apply Deployments, and reporting after the applies would
            # delay each status by everyone's applies. Deployment states are the watch's for now;
            # the report after the applies refreshes them. Readiness is left out of the
            # comparison, so a second pass (``report_first``) goes straight to the applies.
            early = observed(
                {
                    name: self.children.deployment_state(namespace, name) or status.DeploymentState()
                    for name in plan.deployment_names.values()
                },
                problem,
            )
            if _decided(status.fold(previous, early, self.clock()).pools) != _decided(previous.pools):
                previous = await self._report(owner, body, previous, early, fresh=fresh)
                if self.report_first:
                    return Outcome("decided", requeue_after=0.0)
        desired = frozenset((obj["kind"], obj["metadata"]["name"]) for obj in plan.objects if obj["kind"] in _POOL_KINDS)
        if not fresh and (
            self._desired.get((namespace, name)) != desired or not all(self.children.unchanged_since_apply(obj) for obj in plan.objects)
        ):
            raise _Stale  # children to apply or prune: only from a freshly read spec
        deployments: dict[str, status.DeploymentState] = {}
        failed = False
        try:
            for obj in plan.objects:
                child = obj["metadata"]["name"]
                if self.children.unchanged_since_apply(obj):
                    # Applied before and untouched since (the watch says so): no call needed.
                    state = self.children.deployment_state(namespace, child) if obj["kind"] == "Deployment" else None
                else:
                    applied = await self._apply(owner, obj)
                    self.children.record_apply(obj, applied)
                    state = children.deployment_state(applied) if obj["kind"] == "Deployment" else None
                if obj["kind"] == "Deployment":
                    deployments[child] = state or status.DeploymentState()
            if self._desired.get((namespace, name)) != desired:
                # Listing and pruning is needed only when the set of pools changed (or is unknown,
                # after a restart): a pool's Deployment can only be left over then.
                await self._prune(owner, desired)
                self._desired[(namespace, name)] = desired
        except ApiError as e:
            if not e.permanent or _namespace_terminating(e):
                raise
            failed = True
            if isinstance(e, ForeignObject):
                # The Service is applied first (see render.render_children): a conflict on it
                # stops the apply before any Deployment exists whose pods nothing could reach.
                problem = status.Problem("NameConflict", f"{e.message}; nothing of this resource is applied until it is resolved")
            else:
                problem = status.Problem("ApplyFailed", f"the API server rejected a child object: {e.message}")
        pod_problems = await self._pod_problems(owner, plan, deployments) if not failed else {}
        await self._report(owner, body, previous, observed(deployments, problem, pod_problems), fresh=fresh)
        if failed:
            return Outcome("error")
        if calibrating:
            # The Job's own events bring the result; this is the net under a lost watch event.
            return Outcome("done", requeue_after=self.policy.calibration.timeout_seconds + _PROBE_GRACE_SECONDS)
        return Outcome("done")

    # ---------------------------------------------------------------------------------- probe

    async def _probe(
        self,
        owner: render.Owner,
        spec: api.MultimodalPreprocessorSpec,
        hash_: str,
        previous: api.MultimodalPreprocessorStatus | None,
        *,
        fresh: bool = True,
    ) -> api.ProbeStatus:
        job_name = probe.job_name(hash_)
        if previous is not None and previous.probe is not None and previous.probe.hash == hash_:
            if previous.probe.state == "Succeeded" and previous.probe.result is not None:
                self._remember((owner.namespace, hash_), previous.probe.result)
                return previous.probe
            if previous.probe.state == "Failed":
                # A failed probe stays failed until something it depends on changes (or the user
                # sets the mmprep.dev/reprobe annotation): no retry storm on a broken model.
                return previous.probe
        cached = self.probe_cache.get((owner.namespace, hash_))
        if cached is not None:
            return api.ProbeStatus(hash=hash_, job=job_name, state="Succeeded", result=cached)
        if not fresh:
            raise _Stale  # the Job is read (and maybe created) only for a freshly read spec

        job = await self.api.get_job(owner.namespace, job_name)
        created = False
        if job is None:
            # create_job answers with the existing Job when another resource won the race.
            job = await self.api.create_job(probe.render_job(owner, spec, self.policy, hash_))
            created = any(r.get("uid") == owner.uid for r in (job.get("metadata") or {}).get("ownerReferences") or ())
        if created:
            self.metrics.probe_jobs.inc()
            log.info("probe job created", extra={"namespace": owner.namespace, "resource": owner.name, "job": job_name})
        else:
            # Created by another resource with the same probe hash: share it (a no-op if we own it).
            await self._share_job(owner, job)
        finished = any(
            c.get("status") == "True" and c.get("type") in ("Complete", "Failed", "SuccessCriteriaMet", "FailureTarget")
            for c in (job.get("status") or {}).get("conditions") or ()
        )
        pods = await self.api.list_pods(owner.namespace, f"job-name={job_name}") if finished else []
        outcome = probe.read_outcome(job, pods)
        if outcome.state == "Succeeded" and outcome.result is not None:
            self._remember((owner.namespace, hash_), outcome.result)
        return api.ProbeStatus(
            hash=hash_, job=job_name, state=outcome.state, reason=outcome.reason, message=outcome.message, result=outcome.result
        )

    # ---------------------------------------------------------------------------- calibration

    async def _calibrate(
        self,
        owner: render.Owner,
        spec: api.MultimodalPreprocessorSpec,
        rule_plan: Plan,
        previous: api.MultimodalPreprocessorStatus | None,
        recalibrate: str | None,
        *,
        fresh: bool,
    ) -> dict[str, api.PoolCalibration]:
        """Each pool's calibration: settled ones from status or memory, the others from their Job.

        ``rule_plan`` is the plan without measurements: a pool whose count a rule above
        ``Measured`` decides (cloneability, an explicit count, an override) is not measured.
        """
        before = {p.name: p.calibration for p in (previous.pools if previous is not None else ()) if p.calibration}
        out: dict[str, api.PoolCalibration] = {}
        for d in rule_plan.decisions:
            pool = d.pool
            hash_ = calibration.calibration_hash(spec, self.policy, pool, recalibrate)
            skip = calibration.not_needed_reason(d.decision)
            unavailable = calibration.unavailable_reason(spec, self.policy, pool)
            if skip is not None:
                out[pool.name] = api.PoolCalibration(hash=hash_, state="NotNeeded", reason=calibration.NOT_NEEDED, message=skip)
            elif unavailable is not None:
                out[pool.name] = api.PoolCalibration(
                    hash=hash_, state="Unavailable", reason=calibration.UNAVAILABLE, message=unavailable
                )
            else:
                out[pool.name] = await self._calibration_of(owner, spec, pool, hash_, before.get(pool.name), fresh=fresh)
        return out

    async def _calibration_of(
        self,
        owner: render.Owner,
        spec: api.MultimodalPreprocessorSpec,
        pool: pools.Pool,
        hash_: str,
        previous: api.PoolCalibration | None,
        *,
        fresh: bool,
    ) -> api.PoolCalibration:
        key = (owner.namespace, hash_)
        if previous is not None and previous.hash == hash_ and calibration.settled(previous.state):
            self.calibration_cache.setdefault(key, previous)
            return previous
        if (cached := self.calibration_cache.get(key)) is not None:
            return cached
        if not fresh:
            raise _Stale  # the Job is read (and maybe created) only for a freshly read spec
        name = calibration.job_name(hash_)
        job = await self.api.get_job(owner.namespace, name)
        if job is None:
            node = calibration.node_for(pool)
            assert node is not None  # unavailable_reason() rules out a pool without nodes
            job = await self.api.create_job(calibration.render_job(owner, spec, self.policy, pool, node, hash_))
            if any(r.get("uid") == owner.uid for r in (job.get("metadata") or {}).get("ownerReferences") or ()):
                log.info("calibration job created", extra={"namespace": owner.namespace, "resource": owner.name, "job": name})
        else:
            await self._share_job(owner, job)
        selector = ((((job.get("spec") or {}).get("template") or {}).get("spec") or {}).get("nodeSelector") or {})
        pods = await self.api.list_pods(owner.namespace, f"job-name={name}") if jobs.finished(job) else []
        outcome = calibration.read_outcome(job, pods)
        result = calibration.pool_calibration(
            hash_, outcome, job=name, node=selector.get(calibration.HOSTNAME_LABEL), measured_at=status.timestamp(self.clock())
        )
        if calibration.settled(result.state):
            self.calibration_cache[key] = result
            while len(self.calibration_cache) > _PROBE_CACHE_SIZE:
                self.calibration_cache.pop(next(iter(self.calibration_cache)))
        return result

    async def _share_job(self, owner: render.Owner, job: Mapping[str, Any]) -> None:
        """Add the resource as an owner of a probe Job another resource created (GC needs all owners gone)."""
        meta = job.get("metadata") or {}
        owners = list(meta.get("ownerReferences") or ())
        if not owner.uid or any(o.get("uid") == owner.uid for o in owners):
            return
        try:
            await self.api.set_job_owners(
                owner.namespace, meta["name"], [*owners, owner.reference(controller=False)], str(meta.get("resourceVersion", ""))
            )
        except Conflict:
            # Someone else changed the Job meanwhile; the next reconcile adds us. Sharing is only
            # about garbage collection, so it is not worth failing this reconcile for.
            log.info("probe job changed while sharing it; will retry", extra={"job": meta.get("name")})

    # ------------------------------------------------------------------------------- children

    async def _apply(self, owner: render.Owner, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply that never takes over someone else's object.

        Unforced first: for our own, unchanged objects that is all. A 409 means another field
        manager owns a field we set: if our resource controls the object (someone scaled or edited
        our Deployment), force it back; if not (a user's Service with the same name), refuse
        with ``ForeignObject`` and leave it alone. An object that vanishes or changes in between is
        retried at once a few times before the caller's backoff takes over.
        """
        meta = obj["metadata"]
        for attempt in range(_APPLY_ATTEMPTS):
            try:
                return await self.api.apply(obj, force=False)
            except Conflict:
                existing = await self.api.get_object(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
                if existing is None:
                    continue  # deleted meanwhile: apply creates it on the next attempt
                refs = (existing.get("metadata") or {}).get("ownerReferences") or ()
                if not any(r.get("uid") == owner.uid and r.get("controller") for r in refs):
                    raise ForeignObject(obj["kind"], meta["namespace"], meta["name"]) from None
                try:
                    return await self.api.apply(obj, force=True)
                except Conflict:
                    if attempt == _APPLY_ATTEMPTS - 1:
                        raise
                    log.info("conflict on apply; retrying", extra={"kind": obj["kind"], "name": meta["name"]})
        raise Conflict(409, "Conflict", f"{obj['kind']} {meta['namespace']}/{meta['name']} kept changing during apply")

    async def _prune(self, owner: render.Owner, keep: frozenset[tuple[str, str]]) -> None:
        """Delete this resource's Deployments and PodDisruptionBudgets of pools that no longer exist."""
        selector = ",".join(f"{k}={v}" for k, v in sorted(render.selector_labels(owner).items()))
        for kind, api_version in _POOL_KINDS.items():
            for obj in await self.api.list_objects(api_version, kind, owner.namespace, selector):
                meta = obj.get("metadata") or {}
                owned = any(o.get("uid") == owner.uid for o in meta.get("ownerReferences") or ())
                if owned and (kind, meta.get("name")) not in keep:
                    await self.api.delete_object(api_version, kind, owner.namespace, meta["name"])
                    log.info("child of a vanished pool deleted", extra={"namespace": owner.namespace, "kind": kind, "name": meta["name"]})

    async def _pod_problems(
        self, owner: render.Owner, plan: Plan, deployments: Mapping[str, status.DeploymentState]
    ) -> dict[str, api.PoolProblem]:
        """Why pods are missing, per pool, read from the pods; no call while every pool is ready."""
        short = [
            name for name, deployment in plan.deployment_names.items()
            if deployments.get(deployment, status.DeploymentState()).ready_replicas < plan.replicas.get(name, 0)
        ]
        if not short:
            return {}
        pods = await self.api.list_pods(owner.namespace, render.selector_string(owner))
        by_label = {naming.label_value(name): name for name in short}
        return podstates.pool_problems(pods, by_label, render.LABEL_POOL, render.CONTAINER_NAME)

    # --------------------------------------------------------------------------------- status

    async def _report(
        self,
        owner: render.Owner,
        body: Mapping[str, Any],
        previous: api.MultimodalPreprocessorStatus | None,
        obs: status.Observation,
        *,
        fresh: bool = True,
    ) -> api.MultimodalPreprocessorStatus:
        """Write the status folded from ``obs`` (when it changed) and its Events; return it.

        From the watch's copy (not ``fresh``) the write is conditional on the copy's version.
        """
        new = status.fold(previous, obs, self.clock())
        wire = new.wire()
        if previous is None or previous.wire() != wire:
            key = (owner.namespace, owner.name)
            try:
                version = await self.api.replace_resource_status(
                    # The copy's version, or this pass's own write since (an early report).
                    owner.namespace, owner.name, wire, resource_version=None if fresh else self._versions.get(key, _version(body))
                )
            except Conflict:
                if fresh:
                    raise
                raise _Stale from None  # the resource changed since the copy
            if version is not None:
                self._versions[key] = version
        self.metrics.set_conditions((owner.namespace, owner.name), {c.type: c.status for c in new.conditions})
        for event in status.events(previous, new):
            if self.events_in_background:
                self._post_later(owner, body, event)
            else:
                await self._post_event(owner, body, event)
        return new

    def _post_later(self, owner: render.Owner, body: Mapping[str, Any], event: status.EventSpec) -> None:
        if self._event_backlog is None:
            self._event_backlog = asyncio.Queue()
        if self._event_poster is None or self._event_poster.done():
            self._event_poster = asyncio.create_task(self._post_backlog(self._event_backlog), name="mmprep-events")
        self._event_backlog.put_nowait((owner, body, event))

    async def _post_backlog(self, backlog: asyncio.Queue[tuple[render.Owner, Mapping[str, Any], status.EventSpec]]) -> None:
        while True:
            owner, body, event = await backlog.get()
            try:
                await self._post_event(owner, body, event)
            except Exception:  # noqa: BLE001 - one Event must not stop the others
                log.exception("could not post event", extra={"reason": event.reason})
            finally:
                backlog.task_done()

    async def close(self, timeout: float = 5.0) -> None:
        """Post the Events still waiting (for at most ``timeout`` seconds), then stop posting."""
        if self._event_poster is None:
            return
        if self._event_backlog is not None:
            try:
                await asyncio.wait_for(self._event_backlog.join(), timeout)
            except TimeoutError:
                log.warning("events left unposted at shutdown", extra={"count": self._event_backlog.qsize()})
        self._event_poster.cancel()
        try:
            await self._event_poster
        except asyncio.CancelledError:
            pass
        self._event_poster = None

    async def _post_event(self, owner: render.Owner, body: Mapping[str, Any], event: status.EventSpec) -> None:
        now = status.timestamp(self.clock())
        meta = body.get("metadata") or {}
        ev = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                # Deterministic: the same event again becomes a count bump, not a new object.
                "name": f"{owner.name}.{short_hash(f'{owner.uid}/{event.reason}/{event.message}', 16)}",
                "namespace": owner.namespace,
            },
            "involvedObject": {
                "apiVersion": api.API_VERSION,
                "kind": api.KIND,
                "name": owner.name,
                "namespace": owner.namespace,
                "uid": owner.uid,
                **({"resourceVersion": meta["resourceVersion"]} if meta.get("resourceVersion") else {}),
            },
            "type": event.type,
            "reason": event.reason,
            "message": event.message[:1024],
            "source": {"component": render.MANAGED_BY},
            "reportingComponent": render.MANAGED_BY,
            "reportingInstance": self.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.api.post_event(ev)
        except ApiError as e:
            # Events are best effort: never fail a reconcile for one.
            log.warning("could not post event", extra={"reason": event.reason, "error": str(e)})
        log.info(event.message, extra={"namespace": owner.namespace, "resource": owner.name, "event": event.reason})


def _decided(pools: Iterable[api.PoolStatus]) -> list[dict[str, Any]]:
    """The pools as decided: everything in their status but what is observed of their pods."""
    return [p.model_dump(exclude={"ready_replicas", "problem"}) for p in pools]


def _namespace_terminating(error: ApiError) -> bool:
    # The API server's NamespaceLifecycle admission answers 403 with this wording; there is no
    # separate reason code for it.
    return error.status == 403 and "because it is being terminated" in error.message


def _parse_status(raw: Any) -> api.MultimodalPreprocessorStatus | None:
    if not isinstance(raw, dict) or not raw:
        return None
    try:
        return api.MultimodalPreprocessorStatus.model_validate(raw)
    except ValidationError:
        # A status from another version of the operator: start over rather than crash.
        return None


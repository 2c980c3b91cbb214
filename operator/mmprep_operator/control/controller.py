"""Turn watch events into queued reconciles, and run the workers that process them.

The kopf handlers (``handlers``) call into one ``Controller`` kept in kopf's memo. Each event
only decides *which* resources to look at again, and only when something that matters changed:

- a resource: its generation or its reprobe annotation changed (its own status writes are not);
  every event's copy of the resource is kept for the reconciler (``watched``), which starts
  status-only passes from it instead of a GET;
- a node: the facts pools depend on changed (labels, taints, cordon, allocatable GPUs), which
  re-queues the resources that could place pods on it before or after the change, ahead of
  everything else in the queue (a node change must show in their status within seconds);
- a child Deployment, PodDisruptionBudget or Service: someone changed it, its replica counts
  changed, or it was deleted, which re-queues its owner (see ``children``);
- a runtime pod: it was (un)scheduled or its container exited, which re-queues its resource, so
  the status says why pods are missing;
- a probe Job: its state changed, which re-queues the resources of its namespace.

A periodic resync is the safety net under all of this.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from mmprep_operator import api
from mmprep_operator.api.policy import DEFAULT_RESYNC_SECONDS, DEFAULT_URGENT_WORKERS, DEFAULT_WORKERS
from mmprep_operator.control.children import ChildStore
from mmprep_operator.control.metrics import Metrics
from mmprep_operator.control.reconcile import Outcome, Reconciler
from mmprep_operator.control.workqueue import URGENT, Backoff, WorkQueue
from mmprep_operator.kube import ApiError
from mmprep_operator.logic import identity, naming, probe
from mmprep_operator.logic.nodes import NodeFacts, eligible, node_facts

log = logging.getLogger("mmprep.operator.controller")

Key = tuple[str, str]  # (namespace, name)


@dataclasses.dataclass
class _Watched:
    """What the controller keeps of one resource between events: one entry, forgotten at once."""

    #: What a change must move to be worth a reconcile (generation, reprobe annotation, uid).
    fingerprint: tuple[Any, ...]
    #: The parsed spec (None: invalid), to tell which resources a node change can affect.
    spec: api.MultimodalPreprocessorSpec | None
    #: The latest copy the watch delivered (read-only; see ``Controller.watched``).
    body: Mapping[str, Any]


@dataclasses.dataclass
class Controller:
    metrics: Metrics
    resync_seconds: float = DEFAULT_RESYNC_SECONDS
    workers: int = DEFAULT_WORKERS
    #: More workers that take urgent (node-triggered) keys only. Those passes are mostly one
    #: status write each (``Reconciler.report_first``), so more of them in flight shortens the
    #: reaction to a node change without running more applies at once.
    urgent_workers: int = DEFAULT_URGENT_WORKERS
    queue: WorkQueue[Key] = dataclasses.field(default_factory=WorkQueue)
    backoff: Backoff[Key] = dataclasses.field(default_factory=Backoff)
    reconciler: Reconciler | None = None
    # Last seen facts, to tell changes that matter from heartbeats.
    _watched: dict[Key, _Watched] = dataclasses.field(default_factory=dict)
    _nodes: dict[str, NodeFacts] = dataclasses.field(default_factory=dict)
    #: Shared with the reconciler: what the watch shows of the children.
    children: ChildStore = dataclasses.field(default_factory=ChildStore)
    _tasks: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)

    # ------------------------------------------------------------------------------- events

    def resource_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if event_type == "DELETED":
            self._forget(key)
            self.queue.forget(key)
            self.metrics.set_conditions(key, None)
            return
        copy = dict(body)  # a shallow copy: each event brings a new object
        fingerprint = (meta.get("generation"), (meta.get("annotations") or {}).get(probe.ANNOTATION_REPROBE), meta.get("uid"))
        known = self._watched.get(key)
        if known is not None and known.fingerprint == fingerprint:
            known.body = copy
            return
        try:
            spec: api.MultimodalPreprocessorSpec | None = api.MultimodalPreprocessorSpec.model_validate(body.get("spec") or {})
        except ValidationError:
            spec = None  # the reconciler reports it; here it means "always look"
        self._watched[key] = _Watched(fingerprint, spec, copy)
        self.queue.add(key)

    def _forget(self, key: Key) -> None:
        """Drop all that is kept for a resource that is gone (deleted, or a pass found it missing)."""
        self._watched.pop(key, None)
        self.backoff.reset(key)

    def watched(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The watch's latest copy of a resource (it may lag behind the API: check its version)."""
        known = self._watched.get((namespace, name))
        return known.body if known is not None else None

    def node_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        facts = node_facts(body)
        old = self._nodes.get(facts.name)
        new = None if event_type == "DELETED" else facts
        if old == new:
            return  # a heartbeat: nothing pools depend on changed
        if new is None:
            self._nodes.pop(facts.name, None)
        else:
            self._nodes[facts.name] = new
        for key, known in list(self._watched.items()):
            spec = known.spec
            # Only resources that could place pods on the node, before or after, can see a change.
            # (The count of excluded nodes in a NoEligibleNodes message refreshes at the next resync.)
            if spec is None or _could_use(spec, old) or _could_use(spec, new):
                self.queue.add(key, URGENT)

    def child_event(self, kind: str, event_type: str | None, body: Mapping[str, Any]) -> None:
        if not self.children.observe(kind, event_type, body):
            return
        meta = body.get("metadata") or {}
        namespace = meta.get("namespace", "")
        if kind == "Job":
            # A probe Job may serve several resources of its namespace (one per model).
            for key in self._watched:
                if key[0] == namespace:
                    self.queue.add(key)
            return
        if kind == "Pod":
            # A runtime pod is owned by a ReplicaSet; its resource label names the resource.
            resource = (meta.get("labels") or {}).get(identity.LABEL_RESOURCE)
            for key in self._watched:
                if key[0] == namespace and naming.label_value(key[1]) == resource:
                    self.queue.add(key)
            return
        for ref in meta.get("ownerReferences") or ():
            if ref.get("kind") == api.KIND and ref.get("apiVersion", "").startswith(api.GROUP + "/"):
                self.queue.add((namespace, ref.get("name", "")))

    def requeue_all(self) -> None:
        for key in list(self._watched):
            self.queue.add(key)

    # ------------------------------------------------------------------------------ workers

    def start(self, reconciler: Reconciler) -> None:
        self.reconciler = reconciler
        self._tasks = [asyncio.create_task(self._work(), name=f"mmprep-worker-{i}") for i in range(self.workers)]
        if self.urgent_workers:
            self.queue.serve_urgent_only()
            self._tasks += [
                asyncio.create_task(self._work(urgent_only=True), name=f"mmprep-urgent-worker-{i}")
                for i in range(self.urgent_workers)
            ]
        self._tasks.append(asyncio.create_task(self._resync(), name="mmprep-resync"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.queue.close()
        if self.reconciler is not None:
            await self.reconciler.close()

    def healthy(self) -> bool:
        return bool(self._tasks) and not any(t.done() for t in self._tasks)

    async def _work(self, *, urgent_only: bool = False) -> None:
        assert self.reconciler is not None
        while True:
            key = await self.queue.get(urgent_only=urgent_only)
            self.metrics.queue_depth.set(len(self.queue))
            started = time.monotonic()
            try:
                outcome = await self.reconciler.reconcile(*key)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - one resource's failure must not stop the worker
                delay = self.backoff.next(key)
                log.warning(
                    "reconcile failed; retrying later",
                    extra={"namespace": key[0], "resource": key[1], "error": repr(e), "retry_in": delay},
                    # An API error says all there is in its message; anything else is a bug: show where.
                    exc_info=not isinstance(e, (ApiError, OSError)),
                )
                self.metrics.reconciles.labels("error").inc()
                self.queue.add_after(key, delay)
            else:
                self._settle(key, outcome)
            finally:
                self.metrics.duration.observe(time.monotonic() - started)
                self.queue.done(key)

    def _settle(self, key: Key, outcome: Outcome) -> None:
        self.metrics.reconciles.labels(outcome.kind).inc()
        log.info("reconciled", extra={"namespace": key[0], "resource": key[1], "outcome": outcome.kind})
        if outcome.kind == "gone":
            self._forget(key)
            return
        if outcome.kind == "error":
            self.queue.add_after(key, self.backoff.next(key))
            return
        self.backoff.reset(key)
        if outcome.requeue_after is not None:
            self.queue.add_after(key, outcome.requeue_after)

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.resync_seconds)
            self.requeue_all()


def _could_use(spec: api.MultimodalPreprocessorSpec, node: NodeFacts | None) -> bool:
    if node is None:
        return False
    return (
        eligible(
            node,
            node_selector=spec.node_selector,
            tolerations=spec.tolerations,
            affinity=spec.affinity,
            gpu_resources=spec.resources.gpu_resources(),
        )
        is None
    )


def nodes_from_index(index: Any) -> Callable[[], Iterable[NodeFacts]]:
    """Read all NodeFacts from the kopf index (node name -> store of one NodeFacts)."""

    def read() -> list[NodeFacts]:
        return [facts for store in index.values() for facts in store]

    return read

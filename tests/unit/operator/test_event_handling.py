"""Watch events become queued reconciles only when something that matters changed."""

from __future__ import annotations

import asyncio

import pytest
from conftest import H200

from mmprep_operator.control.controller import Controller
from mmprep_operator.control.metrics import Metrics
from mmprep_operator.control.reconcile import Outcome
from mmprep_operator.control.workqueue import URGENT, Backoff, WorkQueue


def node(labels: dict, heartbeat: str = "t0", gpus: str = "8") -> dict:
    return {
        "metadata": {"name": "n1", "labels": labels},
        "spec": {},
        "status": {"allocatable": {"nvidia.com/gpu": gpus}, "conditions": [{"type": "Ready", "lastHeartbeatTime": heartbeat}]},
    }


def resource(name: str = "m", generation: int = 1, annotations: dict | None = None) -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "uid": "u", "generation": generation, "annotations": annotations or {}}}


def queued(controller: Controller) -> list:
    out = []
    while len(controller.queue):
        key = controller.queue.get_nowait()
        controller.queue.done(key)
        out.append(key)
    return out


async def test_resource_events_queue_on_generation_and_reprobe_not_on_status() -> None:
    c = Controller(metrics=Metrics())
    c.resource_event(None, resource())
    assert queued(c) == [("ns", "m")]
    c.resource_event("MODIFIED", resource())  # our own status write: same generation
    assert queued(c) == []
    c.resource_event("MODIFIED", resource(generation=2))
    c.resource_event("MODIFIED", resource(generation=2, annotations={"mmprep.dev/reprobe": "1"}))
    assert queued(c) == [("ns", "m")]  # de-duplicated
    c.resource_event("DELETED", resource(generation=2))
    c.requeue_all()
    assert queued(c) == []


async def test_every_resource_event_keeps_the_latest_copy_for_the_reconciler() -> None:
    c = Controller(metrics=Metrics())
    assert c.watched("ns", "m") is None
    c.resource_event(None, resource())
    first = c.watched("ns", "m")
    assert first is not None and first["metadata"]["generation"] == 1
    status_write = {**resource(), "status": {"observedGeneration": 1}}
    c.resource_event("MODIFIED", status_write)  # queues nothing, but the copy is the newest
    assert queued(c) == [("ns", "m")]  # only the first event's
    assert c.watched("ns", "m") == status_write
    c.resource_event("DELETED", status_write)
    assert c.watched("ns", "m") is None


async def test_node_heartbeats_are_ignored_label_and_capacity_changes_requeue_everything() -> None:
    c = Controller(metrics=Metrics())
    c.resource_event(None, resource("a"))
    c.resource_event(None, resource("b"))
    queued(c)
    c.node_event(None, node(H200))
    assert sorted(queued(c)) == [("ns", "a"), ("ns", "b")]
    c.node_event("MODIFIED", node(H200, heartbeat="t1"))
    assert queued(c) == []
    c.node_event("MODIFIED", node({**H200, "nvidia.com/gpu.product": "NVIDIA-B200"}, heartbeat="t2"))
    assert len(queued(c)) == 2
    c.node_event("MODIFIED", node({**H200, "nvidia.com/gpu.product": "NVIDIA-B200"}, gpus="0"))
    assert len(queued(c)) == 2
    c.node_event("DELETED", node({}))
    assert len(queued(c)) == 2


async def test_child_events_wake_the_owner_when_readiness_changes() -> None:
    c = Controller(metrics=Metrics())
    c.resource_event(None, resource("m"))
    queued(c)
    owner = [{"apiVersion": "mmprep.dev/v1alpha1", "kind": "MultimodalPreprocessor", "name": "m"}]
    dep = {
        "metadata": {"name": "d", "namespace": "ns", "ownerReferences": owner},
        "spec": {"replicas": 2},
        "status": {"readyReplicas": 1},
    }
    c.child_event("Deployment", None, dep)
    assert queued(c) == [("ns", "m")]
    c.child_event("Deployment", "MODIFIED", dep)
    assert queued(c) == []
    c.child_event("Deployment", "MODIFIED", {**dep, "status": {"readyReplicas": 2}})
    assert queued(c) == [("ns", "m")]
    c.child_event("Deployment", "DELETED", dep)
    assert queued(c) == [("ns", "m")]
    job = {"metadata": {"name": "mmprep-probe-x", "namespace": "ns"}, "status": {"active": 1}}
    c.child_event("Job", None, job)
    assert queued(c) == [("ns", "m")]


async def test_queue_parks_a_key_added_while_it_is_processed() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("k")
    assert await q.get() == "k"
    q.add("k")  # an event during the reconcile
    assert len(q) == 0
    q.done("k")
    assert len(q) == 1 and await q.get() == "k"


async def test_queue_takes_urgent_keys_first_and_holds_each_key_once() -> None:
    q: WorkQueue[str] = WorkQueue()
    for key in ("a", "b", "c"):
        q.add(key)
    q.add("c", URGENT)  # moves forward; its normal entry must not make it come twice
    q.add("b")
    q.add("d", URGENT)
    assert len(q) == 4
    taken = [q.get_nowait() for _ in range(4)]
    assert taken == ["c", "d", "a", "b"]
    for key in taken:
        q.done(key)
    assert len(q) == 0
    with pytest.raises(asyncio.QueueEmpty):
        q.get_nowait()


async def test_urgent_only_takers_take_urgent_keys_and_no_key_is_taken_twice() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.serve_urgent_only()
    q.add("n")
    q.add("u", URGENT)
    q.add("v", URGENT)
    assert await q.get(urgent_only=True) == "u"
    assert q.get_nowait() == "v"  # the other takers see urgent keys first too
    q.add("w", URGENT)
    assert await asyncio.wait_for(q.get(urgent_only=True), 5) == "w"  # v's entry was skipped
    assert q.get_nowait() == "n"  # u, v and w were taken: their entries here are skipped
    with pytest.raises(asyncio.QueueEmpty):
        q.get_nowait()
    for key in "uvwn":
        q.done(key)
    q.add("m")  # normal: never for an urgent-only taker
    q.add("m", URGENT)  # ... until it becomes urgent
    assert await asyncio.wait_for(q.get(urgent_only=True), 5) == "m"
    assert len(q) == 0


async def test_urgent_workers_react_while_the_others_are_busy() -> None:
    release = asyncio.Event()
    started: dict[str, asyncio.Event] = {"slow": asyncio.Event(), "fast": asyncio.Event()}

    class Blocking:
        async def reconcile(self, namespace: str, name: str) -> Outcome:
            started[name].set()
            if name == "slow":
                await release.wait()
            return Outcome("done")

        async def close(self) -> None:
            pass

    c = Controller(metrics=Metrics(), workers=1, urgent_workers=1)
    c.start(Blocking())  # type: ignore[arg-type]
    try:
        c.resource_event(None, resource("slow"))
        await asyncio.wait_for(started["slow"].wait(), 5)  # the one normal worker is busy now
        c.resource_event(None, resource("fast"))
        c.node_event(None, node({"nvidia.com/gpu.product": "NVIDIA-H200"}))  # urgent for both
        await asyncio.wait_for(started["fast"].wait(), 5)  # taken by the urgent worker
        assert not release.is_set()
    finally:
        release.set()
        await c.stop()


async def test_a_key_added_urgently_while_processed_comes_back_urgent() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("k")
    assert await q.get() == "k"
    q.add("other")
    q.add("k", URGENT)
    q.done("k")
    assert [q.get_nowait(), q.get_nowait()] == ["k", "other"]


async def test_delayed_add_keeps_the_earliest_timer() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add_after("k", 30)
    q.add_after("k", 0.01)
    q.add_after("k", 60)
    assert await asyncio.wait_for(q.get(), timeout=5) == "k"
    q.close()


def test_backoff_grows_to_a_cap_and_resets() -> None:
    b: Backoff[str] = Backoff(base=1, cap=10)
    assert [b.next("k") for _ in range(6)] == [1, 2, 4, 8, 10, 10]
    b.reset("k")
    assert b.next("k") == 1


class ScriptedReconciler:
    """Fails the first reconcile of a key, then succeeds; records calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.done = asyncio.Event()
        self.closed = False

    async def reconcile(self, namespace: str, name: str) -> Outcome:
        self.calls.append((namespace, name))
        if len(self.calls) == 1:
            raise RuntimeError("boom")
        self.done.set()
        return Outcome("done")

    async def close(self) -> None:
        self.closed = True


async def test_a_failing_reconcile_is_retried_with_backoff_and_counted() -> None:
    metrics = Metrics()
    c = Controller(metrics=metrics, workers=1, backoff=Backoff(base=0.01, cap=0.05))
    scripted = ScriptedReconciler()
    c.start(scripted)  # type: ignore[arg-type]
    try:
        c.resource_event(None, resource())
        await asyncio.wait_for(scripted.done.wait(), timeout=5)
        assert scripted.calls == [("ns", "m"), ("ns", "m")]
        assert c.healthy()
        assert metrics.reconciles.labels("error")._value.get() == 1
        assert metrics.reconciles.labels("done")._value.get() == 1
    finally:
        await c.stop()
    assert not c.healthy() and scripted.closed


async def test_service_changes_by_anyone_wake_the_owner_once() -> None:
    c = Controller(metrics=Metrics())
    c.resource_event(None, resource("m"))
    queued(c)
    owner = [{"apiVersion": "mmprep.dev/v1alpha1", "kind": "MultimodalPreprocessor", "name": "m"}]
    svc = {"metadata": {"name": "m", "namespace": "ns", "ownerReferences": owner, "resourceVersion": "7"}, "spec": {}}
    c.child_event("Service", None, svc)
    assert queued(c) == [("ns", "m")]
    c.child_event("Service", "MODIFIED", svc)
    assert queued(c) == []
    c.child_event("Service", "MODIFIED", {**svc, "metadata": {**svc["metadata"], "resourceVersion": "8"}})
    assert queued(c) == [("ns", "m")]


async def test_job_status_writes_that_change_nothing_do_not_wake_anyone() -> None:
    c = Controller(metrics=Metrics())
    c.resource_event(None, resource("m"))
    queued(c)
    job = {"metadata": {"name": "mmprep-probe-x", "namespace": "ns", "resourceVersion": "1"}, "status": {"active": 1}}
    c.child_event("Job", None, job)
    assert queued(c) == [("ns", "m")]
    c.child_event("Job", "MODIFIED", {**job, "metadata": {**job["metadata"], "resourceVersion": "2"}})
    assert queued(c) == []


async def test_a_node_change_wakes_only_resources_that_could_use_the_node() -> None:
    c = Controller(metrics=Metrics())

    def mmp(name: str, zone: str) -> dict:
        return {**resource(name), "spec": {"model": {"path": "/m"}, "nodeSelector": {"zone": zone}}}

    c.resource_event(None, mmp("in-a", "a"))
    c.resource_event(None, mmp("in-b", "b"))
    c.resource_event(None, {**resource("broken"), "spec": {"model": {}}})  # unparsable: always looks
    queued(c)
    c.node_event(None, node({**H200, "zone": "a"}))
    assert sorted(queued(c)) == [("ns", "broken"), ("ns", "in-a")]
    c.node_event("MODIFIED", node({**H200, "zone": "a", "nvidia.com/gpu.product": "NVIDIA-B200"}))
    assert sorted(queued(c)) == [("ns", "broken"), ("ns", "in-a")]
    c.node_event("MODIFIED", node({**H200, "zone": "b"}))  # leaves a's pools, joins b's
    assert sorted(queued(c)) == [("ns", "broken"), ("ns", "in-a"), ("ns", "in-b")]
    c.node_event("DELETED", node({**H200, "zone": "b"}))
    assert sorted(queued(c)) == [("ns", "broken"), ("ns", "in-b")]


def test_condition_gauges_count_resources_by_status() -> None:
    metrics = Metrics()

    def count(status: str) -> float:
        return metrics.resources.labels("Ready", status)._value.get()

    metrics.set_conditions(("ns", "a"), {"Ready": "True"})
    metrics.set_conditions(("ns", "b"), {"Ready": "False"})
    assert (count("True"), count("False")) == (1, 1)
    metrics.set_conditions(("ns", "b"), {"Ready": "True"})
    metrics.set_conditions(("ns", "b"), {"Ready": "True"})  # the same again counts once
    assert (count("True"), count("False")) == (2, 0)
    metrics.set_conditions(("ns", "a"), None)
    metrics.set_conditions(("ns", "gone"), None)
    assert (count("True"), count("False")) == (1, 0)

"""Passes that start from the watch's copy of the resource instead of a GET: what they may do
(report a node change, readiness) and what they must leave to a pass that reads (applying
children, starting a probe, overwriting a spec edit the watch has not delivered)."""

from __future__ import annotations

import asyncio
import copy

import pytest
from conftest import GB300, H200, make_node
from reconcile_cluster import GPU_SPEC, PROBE_OK, Cluster, watch_shows


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()


class Watch:
    """Plays the controller's copies of the resources: what the watch last delivered."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.copies: dict[tuple[str, str], dict] = {}
        cluster.reconciler.watched = lambda namespace, name: self.copies.get((namespace, name))

    def deliver(self, name: str = "m") -> dict:
        """The watch catches up: its copy is the resource as the API holds it now."""
        self.copies[("ns", name)] = copy.deepcopy(self.cluster.api.resources[("ns", name)])
        return self.copies[("ns", name)]

    def reads(self, source: str) -> float:
        return self.cluster.metrics.reads.labels(source)._value.get()


async def converged(cluster: Cluster, watch: Watch) -> None:
    """A resource with Deployments applied and seen by the watch, its copy up to date."""
    cluster.api.stamp_markers = True
    cluster.reconciler.report_first = True
    cluster.api.add_resource("m", GPU_SPEC)
    await cluster.reconcile()
    cluster.api.finish_job(cluster.job_name(), PROBE_OK)
    assert (await cluster.reconcile()).kind == "done"
    watch_shows(cluster)
    watch.deliver()


async def test_a_node_change_is_reported_from_the_watch_copy_without_a_get(cluster: Cluster) -> None:
    watch = Watch(cluster)
    await converged(cluster, watch)
    gets, applies = cluster.api.gets, len(cluster.api.applies)
    cluster.nodes = [make_node("h200-a", H200, gpus=8), make_node("h200-b", H200, gpus=8), make_node("gb300-a", H200, gpus=4)]
    assert (await cluster.reconcile()).kind == "decided"
    assert cluster.api.gets == gets and watch.reads("watch") == 1  # no GET for the status-only pass
    assert [(p["name"], p["nodes"]) for p in cluster.status()["pools"]] == [("nvidia-h200-141gb-hbm3e", 3)]
    assert len(cluster.api.applies) == applies
    # The second pass applies: from a GET (the copy is older than the status just written anyway).
    assert (await cluster.reconcile()).kind == "done"
    assert cluster.api.gets == gets + 1 and cluster.api.deleted == ["m-nvidia-gb300", "PodDisruptionBudget/m-nvidia-gb300"]


async def test_readiness_is_reported_from_the_watch_copy(cluster: Cluster) -> None:
    watch = Watch(cluster)
    await converged(cluster, watch)
    gets = cluster.api.gets
    for name in cluster.api.kinds("Deployment"):
        cluster.api.set_ready(name, cluster.api.objects[("Deployment", "ns", name)]["spec"]["replicas"])
    watch_shows(cluster)
    assert (await cluster.reconcile()).kind == "done"
    assert cluster.api.gets == gets and cluster.condition("Ready") == ("True", "AllReplicasReady")


async def test_a_copy_older_than_our_own_status_write_is_not_used(cluster: Cluster) -> None:
    watch = Watch(cluster)
    await converged(cluster, watch)
    old_copy = copy.deepcopy(watch.copies[("ns", "m")])
    cluster.nodes = [make_node("h200-a", H200, gpus=8), make_node("h200-b", H200, gpus=8), make_node("gb300-a", H200, gpus=4)]
    assert (await cluster.reconcile()).kind == "decided"  # writes the status: a new version
    cluster.nodes = [make_node("h200-a", H200, gpus=8), make_node("h200-b", H200, gpus=8), make_node("gb300-a", GB300, gpus=4)]
    watch.copies[("ns", "m")] = old_copy  # the watch has not delivered that write yet
    gets, writes = cluster.api.gets, cluster.api.status_writes
    assert (await cluster.reconcile()).kind == "done"  # back to the children applied: status only
    assert cluster.api.gets == gets + 1 and cluster.api.stale_status_writes == 0  # read, not tried
    assert cluster.api.status_writes == writes + 1
    assert [(p["name"], p["nodes"]) for p in cluster.status()["pools"]] == [("nvidia-gb300", 1), ("nvidia-h200-141gb-hbm3e", 2)]


async def test_a_spec_edit_the_watch_has_not_delivered_is_never_overwritten(cluster: Cluster) -> None:
    watch = Watch(cluster)
    await converged(cluster, watch)
    cluster.api.edit_spec("m", {**GPU_SPEC, "replicas": 5})  # the copy still shows generation 1
    cluster.nodes = [make_node("h200-a", H200, gpus=8), make_node("h200-b", H200, gpus=8), make_node("gb300-a", H200, gpus=4)]
    gets = cluster.api.gets
    assert (await cluster.reconcile()).kind == "decided"
    # The status write from the copy was refused; the pass started over from a GET.
    assert cluster.api.stale_status_writes == 1 and cluster.api.gets == gets + 1
    st = cluster.status()
    assert st["observedGeneration"] == 2
    assert [(p["name"], p["nodes"], p["replicas"]) for p in st["pools"]] == [("nvidia-h200-141gb-hbm3e", 3, 5)]


async def test_children_are_applied_only_from_a_fresh_read(cluster: Cluster) -> None:
    watch = Watch(cluster)
    await converged(cluster, watch)
    await cluster.api.delete_object("apps/v1", "Deployment", "ns", "m-nvidia-gb300")
    cluster.reconciler.children.observe("Deployment", "DELETED", {"metadata": {"namespace": "ns", "name": "m-nvidia-gb300"}})
    gets = cluster.api.gets
    assert (await cluster.reconcile()).kind == "done"
    assert cluster.api.gets == gets + 1 and ("Deployment", "ns", "m-nvidia-gb300") in cluster.api.objects
    assert watch.reads("api") >= 1


async def test_a_probe_is_not_started_from_the_watch_copy(cluster: Cluster) -> None:
    watch = Watch(cluster)
    cluster.api.add_resource("m", GPU_SPEC)
    watch.deliver()
    assert (await cluster.reconcile()).kind == "waiting"
    assert cluster.api.gets == 1 and len(cluster.api.kinds("Job")) == 1


async def test_events_in_the_background_follow_the_status_write_in_order(cluster: Cluster) -> None:
    cluster.reconciler.events.background = True
    gate = asyncio.Event()
    real_post = cluster.api.post_event

    async def slow_post(event: dict) -> None:
        await gate.wait()
        await real_post(event)

    cluster.api.post_event = slow_post  # type: ignore[method-assign]
    cluster.api.add_resource("m", GPU_SPEC)
    await cluster.reconcile()
    cluster.api.finish_job(cluster.job_name(), PROBE_OK)
    assert (await asyncio.wait_for(cluster.reconcile(), 5)).kind == "done"  # returned while its Events wait
    assert cluster.status()["pools"] and cluster.api.events == []
    gate.set()
    await cluster.reconciler.close()
    reasons = [e["reason"] for e in cluster.api.events]
    assert reasons == ["Decided", "Decided", "ProbeSucceeded"]


async def test_closing_gives_up_on_events_that_never_get_through(cluster: Cluster) -> None:
    cluster.reconciler.events.background = True

    async def hanging_post(event: dict) -> None:
        await asyncio.Event().wait()

    cluster.api.post_event = hanging_post  # type: ignore[method-assign]
    cluster.api.add_resource("m", GPU_SPEC)
    await cluster.reconcile()
    cluster.api.finish_job(cluster.job_name(), PROBE_OK)
    await asyncio.wait_for(cluster.reconcile(), 5)
    await asyncio.wait_for(cluster.reconciler.close(timeout=0.01), 5)
    assert not cluster.reconciler.events.running

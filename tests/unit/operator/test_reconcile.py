"""One reconcile, end to end over the pure modules, against the in-memory API fake."""

from __future__ import annotations

import datetime as dt
import json
import logging

import pytest
from conftest import H200, make_node
from reconcile_cluster import GPU_SPEC, PROBE_OK, Cluster, watch_shows

from mmprep_operator.kube import ApiError, Conflict
from mmprep_operator.logic import pools


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()


async def test_first_reconcile_starts_a_probe_and_waits(cluster: Cluster) -> None:
    cluster.api.add_resource("m", GPU_SPEC)
    outcome = await cluster.reconcile()
    assert outcome.kind == "waiting" and outcome.requeue_after == 30
    job = cluster.api.objects[("Job", "ns", cluster.job_name())]
    assert job["metadata"]["ownerReferences"][0]["uid"] == "uid-m"
    assert cluster.condition("Probed") == ("False", "ProbePending")
    assert cluster.api.kinds("Deployment") == {}
    assert cluster.metrics.probe_jobs._value.get() == 1


async def test_probe_answer_leads_to_one_deployment_per_pool_and_events(cluster: Cluster) -> None:
    cluster.api.add_resource("m", GPU_SPEC)
    await cluster.reconcile()
    cluster.api.finish_job(cluster.job_name(), PROBE_OK)
    assert (await cluster.reconcile()).kind == "done"
    deployments = cluster.api.kinds("Deployment")
    assert sorted(deployments) == ["m-nvidia-gb300", "m-nvidia-h200-141gb-hbm3e"]
    assert [d["spec"]["replicas"] for _, d in sorted(deployments.items())] == [1, 2]
    assert "m" in cluster.api.kinds("Service")
    st = cluster.status()
    assert [(p["name"], p["path"], p["processorWorkers"], p["reason"]) for p in st["pools"]] == [
        ("nvidia-gb300", "gpu", 1, "GPUPathCap"),
        ("nvidia-h200-141gb-hbm3e", "gpu", 1, "GPUPathCap"),
    ]
    assert st["probe"]["result"]["declaredWorkers"] == 2
    assert cluster.condition("Probed") == ("True", "ProbeSucceeded")
    assert cluster.condition("Ready") == ("False", "ReplicasNotReady")
    reasons = [e["reason"] for e in cluster.api.events]
    assert reasons.count("Decided") == 2 and "ProbeSucceeded" in reasons
    assert all(e["involvedObject"]["uid"] == "uid-m" for e in cluster.api.events)

    for name in deployments:
        cluster.api.set_ready(name, cluster.api.objects[("Deployment", "ns", name)]["spec"]["replicas"])
    await cluster.reconcile()
    assert cluster.condition("Ready") == ("True", "AllReplicasReady")
    assert cluster.status()["readySummary"] == "3/3"


async def test_nothing_changed_means_no_status_write(cluster: Cluster) -> None:
    cluster.api.add_resource("m", GPU_SPEC)
    await cluster.reconcile()
    cluster.api.finish_job(cluster.job_name(), PROBE_OK)
    await cluster.reconcile()
    writes, events = cluster.api.status_writes, len(cluster.api.events)
    cluster.now += dt.timedelta(minutes=1)
    await cluster.reconcile()
    assert (cluster.api.status_writes, len(cluster.api.events)) == (writes, events)


async def test_a_node_label_change_moves_pools_and_deletes_the_vanished_deployment(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mmprep.operator")  # the deletion is logged, and logging must not fail
    cluster.api.add_resource("m", GPU_SPEC)
    await cluster.reconcile()
    cluster.api.finish_job(cluster.job_name(), PROBE_OK)
    await cluster.reconcile()
    cluster.nodes = [make_node("h200-a", H200, gpus=8), make_node("h200-b", H200, gpus=8), make_node("gb300-a", H200, gpus=4)]
    await cluster.reconcile()
    assert sorted(cluster.api.kinds("Deployment")) == ["m-nvidia-h200-141gb-hbm3e"]
    assert cluster.api.deleted == ["m-nvidia-gb300", "PodDisruptionBudget/m-nvidia-gb300"]
    assert cluster.api.kinds("Deployment")["m-nvidia-h200-141gb-hbm3e"]["spec"]["replicas"] == 3
    assert "PoolRemoved" in [e["reason"] for e in cluster.api.events]
    assert "child of a vanished pool deleted" in caplog.messages


async def test_a_node_change_is_reported_before_the_children_are_applied(cluster: Cluster) -> None:
    cluster.api.add_resource("m", GPU_SPEC)
    await cluster.reconcile()
    cluster.api.finish_job(cluster.job_name(), PROBE_OK)
    await cluster.reconcile()
    writes: list[tuple[int, list[tuple[str, int]]]] = []
    real_write = cluster.api.replace_resource_status

    async def recording(namespace: str, name: str, status: dict, **kwargs: object) -> str | None:
        writes.append((len(cluster.api.applies), [(p["name"], p["nodes"]) for p in status["pools"]]))
        return await real_write(namespace, name, status, **kwargs)  # type: ignore[arg-type]

    cluster.api.replace_resource_status = recording  # type: ignore[method-assign]
    applies = len(cluster.api.applies)
    cluster.nodes = [make_node("h200-a", H200, gpus=8), make_node("h200-b", H200, gpus=8), make_node("gb300-a", H200, gpus=4)]
    assert (await cluster.reconcile()).kind == "done"
    # The new pools are in the status before any child is applied, and again after.
    assert writes[0] == (applies, [("nvidia-h200-141gb-hbm3e", 3)])
    assert len(cluster.api.applies) > applies
    assert writes[-1][1] == [("nvidia-h200-141gb-hbm3e", 3)]
    assert [e["reason"] for e in cluster.api.events].count("PoolRemoved") == 1  # not once per write


async def test_report_first_reports_a_node_change_and_applies_in_a_second_pass(cluster: Cluster) -> None:
    cluster.reconciler.report_first = True
    cluster.api.add_resource("m", GPU_SPEC)
    await cluster.reconcile()
    cluster.api.finish_job(cluster.job_name(), PROBE_OK)
    assert (await cluster.reconcile()).kind == "done"  # the first pools: nothing to report early
    applies = len(cluster.api.applies)
    cluster.nodes = [make_node("h200-a", H200, gpus=8), make_node("h200-b", H200, gpus=8), make_node("gb300-a", H200, gpus=4)]
    outcome = await cluster.reconcile()
    assert (outcome.kind, outcome.requeue_after) == ("decided", 0.0)
    assert [(p["name"], p["nodes"], p["replicas"]) for p in cluster.status()["pools"]] == [("nvidia-h200-141gb-hbm3e", 3, 3)]
    assert len(cluster.api.applies) == applies and cluster.api.deleted == []
    assert (await cluster.reconcile()).kind == "done"
    assert cluster.api.kinds("Deployment")["m-nvidia-h200-141gb-hbm3e"]["spec"]["replicas"] == 3
    assert cluster.api.deleted == ["m-nvidia-gb300", "PodDisruptionBudget/m-nvidia-gb300"]


async def test_resources_with_the_same_placement_share_one_grouping_until_a_node_changes(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    groupings = []
    real_group = pools.group

    def counting(nodes, spec):  # type: ignore[no-untyped-def]
        groupings.append(spec.replicas)
        return real_group(nodes, spec)

    monkeypatch.setattr(pools, "group", counting)
    cluster.api.add_resource("a", GPU_SPEC)
    cluster.api.add_resource("b", {**GPU_SPEC, "replicas": 1})
    cluster.api.add_resource("cpu", {"model": {"path": "/models/m"}})
    await cluster.reconcile("a")
    cluster.api.finish_job(cluster.job_name(), PROBE_OK)
    for name in ("a", "b", "a", "b"):
        await cluster.reconcile(name)
    assert len(groupings) == 1  # same nodeSelector, tolerations, affinity and GPU resource
    await cluster.reconcile("cpu")
    assert len(groupings) == 2  # another placement: its own grouping
    cluster.nodes = [*cluster.nodes[:2], make_node("gb300-a", H200, gpus=4)]
    for name in ("a", "b"):
        await cluster.reconcile(name)
        assert [(p["name"], p["nodes"]) for p in cluster.status(name)["pools"]] == [("nvidia-h200-141gb-hbm3e", 3)]
    assert len(groupings) == 3
    # An equal node list (a heartbeat re-read into new objects) keeps the grouping.
    cluster.nodes = [make_node("h200-a", H200, gpus=8), make_node("h200-b", H200, gpus=8), make_node("gb300-a", H200, gpus=4)]
    await cluster.reconcile("a")
    assert len(groupings) == 3


async def test_resources_with_the_same_model_share_one_probe(cluster: Cluster) -> None:
    cluster.api.add_resource("a", GPU_SPEC)
    cluster.api.add_resource("b", {**GPU_SPEC, "replicas": 1})
    await cluster.reconcile("a")
    await cluster.reconcile("b")
    (job,) = cluster.api.kinds("Job").values()
    assert [o["uid"] for o in job["metadata"]["ownerReferences"]] == ["uid-a", "uid-b"]
    cluster.api.finish_job(cluster.job_name(), PROBE_OK)
    await cluster.reconcile("a")
    cluster.api.add_resource("c", GPU_SPEC)  # arrives after the answer: served from the cache
    await cluster.reconcile("c")
    await cluster.reconcile("b")
    assert len(cluster.api.kinds("Job")) == 1
    assert cluster.metrics.probe_jobs._value.get() == 1
    for name in "abc":
        assert cluster.condition("Probed", name) == ("True", "ProbeSucceeded")


async def test_a_model_that_does_not_load_is_reported_once_and_not_retried(cluster: Cluster) -> None:
    cluster.api.add_resource("m", GPU_SPEC)
    await cluster.reconcile()
    job = cluster.job_name()
    cluster.api.finish_job(
        job, json.dumps({"cloneable": False, "error": "OSError: no processor"}), succeeded=False, reason="BackoffLimitExceeded"
    )
    assert (await cluster.reconcile()).kind == "waiting"
    assert cluster.condition("Degraded") == ("True", "ProbeFailed")
    assert cluster.api.kinds("Deployment") == {}
    assert "OSError: no processor" in cluster.status()["probe"]["message"]
    del cluster.api.objects[("Job", "ns", job)]  # its TTL ran out
    outcome = await cluster.reconcile()
    assert outcome.kind == "waiting" and outcome.requeue_after is None
    assert cluster.api.kinds("Job") == {}  # no retry storm
    assert [e["reason"] for e in cluster.api.events].count("ProbeFailed") == 1


async def test_a_rejected_child_becomes_apply_failed(cluster: Cluster) -> None:
    cluster.api.add_resource("m", GPU_SPEC)
    await cluster.reconcile()
    cluster.api.finish_job(cluster.job_name(), PROBE_OK)
    cluster.api.reject["m-nvidia-gb300"] = ApiError(422, "Invalid", 'Deployment.apps "m-nvidia-gb300" is invalid: volume x')
    assert (await cluster.reconcile()).kind == "error"
    assert cluster.condition("Degraded") == ("True", "ApplyFailed")
    assert "volume x" in next(c["message"] for c in cluster.status()["conditions"] if c["type"] == "Degraded")


async def test_transient_api_errors_propagate_for_backoff(cluster: Cluster) -> None:
    cluster.api.add_resource("m", GPU_SPEC)
    await cluster.reconcile()
    cluster.api.finish_job(cluster.job_name(), PROBE_OK)
    cluster.api.reject["m-nvidia-gb300"] = ApiError(503, "ServiceUnavailable", "etcd is slow")
    with pytest.raises(ApiError):
        await cluster.reconcile()


async def test_no_gpu_pool_and_a_missing_resource(cluster: Cluster) -> None:
    cluster.nodes = [make_node("cpu-a"), make_node("cpu-b")]
    cluster.api.add_resource("m", GPU_SPEC)
    await cluster.reconcile()
    cluster.api.finish_job(cluster.job_name(), PROBE_OK)
    await cluster.reconcile()
    assert cluster.condition("Degraded") == ("True", "NoGPUPool")
    assert cluster.condition("Ready")[0] == "False"
    assert (await cluster.reconcile("absent")).kind == "gone"


async def test_an_invalid_spec_is_reported_not_raised(cluster: Cluster) -> None:
    cluster.api.add_resource("m", {"model": {"path": "/m", "id": "a/b"}})
    assert (await cluster.reconcile()).kind == "invalid"
    status, reason = cluster.condition("Degraded")
    assert (status, reason) == ("True", "InvalidSpec")
    assert cluster.api.kinds("Job") == {}


async def test_a_conflict_on_apply_is_retried_at_once(cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mmprep.operator")  # the retry is logged, and logging must not fail
    cluster.api.add_resource("m", GPU_SPEC)
    await cluster.reconcile()
    cluster.api.finish_job(cluster.job_name(), PROBE_OK)
    await cluster.reconcile()
    # Someone edits our Deployment (kubectl scale): unforced apply conflicts, forcing conflicts once more.
    cluster.api.foreign_fields.add(("Deployment", "ns", "m-nvidia-gb300"))
    real_apply = cluster.api.apply
    conflicts = {"left": 1}

    async def flaky_apply(obj, *, force):
        if conflicts["left"] and force:
            conflicts["left"] -= 1
            raise Conflict(409, "Conflict", "the object has been modified")
        return await real_apply(obj, force=force)

    cluster.api.apply = flaky_apply  # type: ignore[method-assign]
    assert (await cluster.reconcile()).kind == "done"
    assert len(cluster.api.kinds("Deployment")) == 2
    assert "conflict on apply; retrying" in caplog.messages


async def test_a_resource_deleted_during_its_reconcile_is_gone_not_an_error(cluster: Cluster) -> None:
    cluster.api.add_resource("m", GPU_SPEC)
    real_write = cluster.api.replace_resource_status

    async def deleted_meanwhile(namespace, name, status, **_):
        del cluster.api.resources[(namespace, name)]
        raise ApiError(404, "NotFound", f'multimodalpreprocessors.mmprep.dev "{name}" not found')

    cluster.api.replace_resource_status = deleted_meanwhile  # type: ignore[method-assign]
    assert (await cluster.reconcile()).kind == "gone"
    cluster.api.replace_resource_status = real_write  # type: ignore[method-assign]
    cluster.api.add_resource("m", GPU_SPEC)

    async def missing_child_not_resource(namespace, name, status, **_):
        raise ApiError(404, "NotFound", "something else")

    cluster.api.replace_resource_status = missing_child_not_resource  # type: ignore[method-assign]
    with pytest.raises(ApiError):
        await cluster.reconcile()


def test_the_probe_cache_is_bounded(cluster: Cluster) -> None:
    from mmprep_operator.api import ProbeResult
    from mmprep_operator.bounded import remember
    from mmprep_operator.control.shared_jobs import CACHE_SIZE

    result = ProbeResult(cloneable=True)
    probes = cluster.reconciler.probes
    for i in range(CACHE_SIZE + 5):
        remember(probes.cache, ("ns", f"h{i}"), result, size=CACHE_SIZE)
    assert len(probes.cache) == CACHE_SIZE
    assert ("ns", "h0") not in probes.cache and ("ns", f"h{CACHE_SIZE + 4}") in probes.cache


async def test_a_resource_being_deleted_is_left_to_the_garbage_collector(cluster: Cluster) -> None:
    cluster.api.add_resource("m", GPU_SPEC)
    await cluster.reconcile()
    cluster.api.finish_job(cluster.job_name(), PROBE_OK)
    await cluster.reconcile()
    # Foreground deletion: the GC deletes the children first while the resource still exists.
    cluster.api.resources[("ns", "m")]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    for name in list(cluster.api.kinds("Deployment")):
        await cluster.api.delete_object("apps/v1", "Deployment", "ns", name)
    applies, events = len(cluster.api.applies), len(cluster.api.events)
    assert (await cluster.reconcile()).kind == "gone"
    assert cluster.api.kinds("Deployment") == {}
    assert (len(cluster.api.applies), len(cluster.api.events)) == (applies, events)


async def test_a_terminating_namespace_ends_the_reconcile_quietly(cluster: Cluster) -> None:
    cluster.api.add_resource("m", GPU_SPEC)
    await cluster.reconcile()
    cluster.api.finish_job(cluster.job_name(), PROBE_OK)
    cluster.api.reject["m-nvidia-gb300"] = ApiError(
        403,
        "Forbidden",
        'deployments.apps "m-nvidia-gb300" is forbidden: unable to create new content in namespace ns '
        "because it is being terminated",
    )
    writes = cluster.api.status_writes
    assert (await cluster.reconcile()).kind == "gone"
    assert cluster.api.status_writes == writes  # no ApplyFailed reported into a namespace being deleted


async def test_a_foreign_object_with_our_name_is_never_overwritten(cluster: Cluster) -> None:
    cluster.api.add_foreign("Service", "m", {"spec": {"selector": {"app": "the-users-own"}}})
    cluster.api.add_resource("m", GPU_SPEC)
    await cluster.reconcile()
    cluster.api.finish_job(cluster.job_name(), PROBE_OK)
    assert (await cluster.reconcile()).kind == "error"
    service = cluster.api.objects[("Service", "ns", "m")]
    assert service["spec"]["selector"] == {"app": "the-users-own"} and "ownerReferences" not in service["metadata"]
    assert cluster.condition("Degraded") == ("True", "NameConflict")
    message = next(c["message"] for c in cluster.status()["conditions"] if c["type"] == "Degraded")
    assert message.startswith("Service ns/m exists and is not managed by this resource")


async def test_our_own_object_edited_by_someone_else_is_taken_back(cluster: Cluster) -> None:
    cluster.api.add_resource("m", GPU_SPEC)
    await cluster.reconcile()
    cluster.api.finish_job(cluster.job_name(), PROBE_OK)
    await cluster.reconcile()
    dep = cluster.api.objects[("Deployment", "ns", "m-nvidia-h200-141gb-hbm3e")]
    dep["spec"]["replicas"] = 9
    cluster.api.foreign_fields.add(("Deployment", "ns", "m-nvidia-h200-141gb-hbm3e"))
    assert (await cluster.reconcile()).kind == "done"
    assert cluster.api.objects[("Deployment", "ns", "m-nvidia-h200-141gb-hbm3e")]["spec"]["replicas"] == 2


async def test_unchanged_children_are_not_applied_again_until_someone_touches_them(cluster: Cluster) -> None:
    cluster.api.stamp_markers = True
    cluster.api.add_resource("m", GPU_SPEC)
    await cluster.reconcile()
    cluster.api.finish_job(cluster.job_name(), PROBE_OK)
    await cluster.reconcile()
    assert len(cluster.api.applies) == 5  # 2 Deployments, their 2 budgets, the Service
    watch_shows(cluster)
    await cluster.reconcile()
    assert len(cluster.api.applies) == 5  # nothing changed, nothing sent

    # Readiness still comes through, from the watch.
    for name in cluster.api.kinds("Deployment"):
        cluster.api.set_ready(name, cluster.api.objects[("Deployment", "ns", name)]["spec"]["replicas"])
    watch_shows(cluster)
    await cluster.reconcile()
    assert len(cluster.api.applies) == 5
    assert cluster.condition("Ready") == ("True", "AllReplicasReady")

    # Someone edits a Deployment (its generation moves): applied again. Deleted: created again.
    dep = cluster.api.objects[("Deployment", "ns", "m-nvidia-gb300")]
    dep["metadata"]["generation"] += 1
    watch_shows(cluster)
    await cluster.reconcile()
    assert cluster.api.applies[5:] == [("Deployment", "m-nvidia-gb300")]
    await cluster.api.delete_object("apps/v1", "Deployment", "ns", "m-nvidia-h200-141gb-hbm3e")
    cluster.reconciler.children.observe(
        "Deployment", "DELETED", {"metadata": {"namespace": "ns", "name": "m-nvidia-h200-141gb-hbm3e"}}
    )
    await cluster.reconcile()
    assert ("Deployment", "ns", "m-nvidia-h200-141gb-hbm3e") in cluster.api.objects

    # A new decision changes the rendered object: applied although nobody touched it.
    watch_shows(cluster)
    before = len(cluster.api.applies)
    cluster.api.resources[("ns", "m")]["spec"] = {**GPU_SPEC, "workers": {"processor": 2}}
    await cluster.reconcile()
    assert len(cluster.api.applies) == before + 2  # both Deployments, not the Service


async def test_losing_the_race_to_create_a_probe_job_shares_it_and_counts_one(cluster: Cluster) -> None:
    cluster.api.add_resource("a", GPU_SPEC)
    cluster.api.add_resource("b", GPU_SPEC)
    await cluster.reconcile("a")
    real_get_job = cluster.api.get_job

    async def stale_get_job(namespace, name):
        return None  # b looked before a's Job existed; its create then meets a 409

    cluster.api.get_job = stale_get_job  # type: ignore[method-assign]
    await cluster.reconcile("b")
    cluster.api.get_job = real_get_job  # type: ignore[method-assign]
    (job,) = cluster.api.kinds("Job").values()
    assert [o["uid"] for o in job["metadata"]["ownerReferences"]] == ["uid-a", "uid-b"]
    assert cluster.metrics.probe_jobs._value.get() == 1

"""Autoscaled pools: who scales each pool and why, the HPA or ScaledObject rendered for it, its
Deployment without replicas, and what status and Events say; over the pure modules and one
reconcile against the in-memory API fake (the real SSA handover is tested on the API server)."""

from __future__ import annotations

import copy

import pytest
from reconcile_cluster import GPU_SPEC, PROBE_OK, Cluster, watch_shows

from mmprep_operator import api
from mmprep_operator.logic import autoscaling, events, identity
from mmprep_operator.logic.conditions import Reason

OWNER = identity.Owner(name="m", namespace="ns", uid="uid-m")
CPU_SPEC = {**GPU_SPEC, "resources": {"requests": {"cpu": "2"}, "limits": {"nvidia.com/gpu": 1}}}
BOTH = autoscaling.Autoscalers(metrics_server=True, keda=True)
NEITHER = autoscaling.Autoscalers(metrics_server=False, keda=False)


def section(**fields: object) -> api.Autoscaling:
    return api.Autoscaling.model_validate({"maxReplicas": 6, **fields})


def one(a: api.Autoscaling, have: autoscaling.Autoscalers = BOTH, pool: str = "h200") -> autoscaling.PoolScaling:
    return autoscaling.pool_scaling(OWNER, a, [pool], have)[pool]


def test_a_pool_entry_overrides_the_sections_bounds_and_target_and_the_signal_gives_the_default() -> None:
    a = section(minReplicas=2, pools=[{"pool": "h200", "maxReplicas": 3, "target": 50}])
    assert a.for_pool("h200") == (2, 3, 50)
    assert a.for_pool("cpu") == (2, 6, 70)
    assert section(signal="queueWait", prometheus={"serverAddress": "http://p:9090"}).for_pool("x") == (1, 6, 250)


@pytest.mark.parametrize(
    ("signal", "have", "engine", "reason"),
    [
        ("cpu", BOTH, "HPA", Reason.AUTOSCALED_BY_HPA),
        ("cpu", autoscaling.Autoscalers(metrics_server=False, keda=True), "None", Reason.NO_METRICS_SERVER),
        ("workerBusy", BOTH, "KEDA", Reason.AUTOSCALED_BY_KEDA),
        ("inFlight", autoscaling.Autoscalers(metrics_server=True, keda=False), "None", Reason.NO_KEDA),
    ],
)
def test_the_engine_follows_the_signal_and_what_the_cluster_has(
    signal: str, have: autoscaling.Autoscalers, engine: str, reason: str
) -> None:
    a = section(signal=signal, prometheus={"serverAddress": "http://p:9090"})
    scaling = one(a, have)
    assert (scaling.engine, scaling.reason) == (engine, reason)
    assert (autoscaling.manifest(OWNER, a, scaling) is None) == (engine == "None")


def test_the_hpa_targets_the_pools_deployment_on_the_runtime_containers_cpu_with_the_behaviour() -> None:
    a = section(
        minReplicas=2,
        target=60,
        scaleUp={"stabilizationWindowSeconds": 0, "rate": {"pods": 4, "periodSeconds": 15}},
        scaleDown={"rate": {"percent": 10}},
    )
    hpa = autoscaling.hpa_manifest(OWNER, a, one(a))
    assert hpa["apiVersion"] == "autoscaling/v2" and hpa["metadata"]["name"] == "m-h200"
    assert hpa["metadata"]["ownerReferences"][0]["uid"] == "uid-m"
    assert hpa["metadata"]["labels"]["mmprep.dev/pool"] == "h200"
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "m-h200"}
    assert (spec["minReplicas"], spec["maxReplicas"]) == (2, 6)
    (metric,) = spec["metrics"]
    assert metric["containerResource"] == {
        "name": "cpu",
        "container": "runtime",
        "target": {"type": "Utilization", "averageUtilization": 60},
    }
    assert spec["behavior"] == {
        "scaleUp": {"stabilizationWindowSeconds": 0, "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15}]},
        "scaleDown": {"policies": [{"type": "Percent", "value": 10, "periodSeconds": 60}]},
    }
    assert "behavior" not in autoscaling.hpa_manifest(OWNER, section(), one(section()))["spec"]


@pytest.mark.parametrize(
    ("signal", "target", "metric_type", "threshold", "series"),
    [
        ("workerBusy", 80, "AverageValue", "0.8", "mmprep_workers_busy_fraction"),
        ("inFlight", 3, "AverageValue", "3", "mmprep_requests_in_flight"),
        ("queueWait", 500, "Value", "0.5", "mmprep_queue_wait_seconds_bucket"),
    ],
)
def test_the_scaled_object_queries_the_pools_runtime_series_with_the_target_as_threshold(
    signal: str, target: int, metric_type: str, threshold: str, series: str
) -> None:
    a = section(
        signal=signal,
        target=target,
        prometheus={"serverAddress": "http://prom:9090"},
        scaleDown={"stabilizationWindowSeconds": 600},
    )
    obj = autoscaling.scaled_object_manifest(OWNER, a, one(a))
    assert obj["apiVersion"] == "keda.sh/v1alpha1" and obj["kind"] == "ScaledObject"
    assert (obj["spec"]["minReplicaCount"], obj["spec"]["maxReplicaCount"]) == (1, 6)
    (trigger,) = obj["spec"]["triggers"]
    assert (trigger["type"], trigger["metricType"]) == ("prometheus", metric_type)
    assert trigger["metadata"]["threshold"] == threshold and trigger["metadata"]["serverAddress"] == "http://prom:9090"
    assert series in trigger["metadata"]["query"]
    assert 'namespace="ns",mmprep_dev_resource="m",mmprep_dev_pool="h200"' in trigger["metadata"]["query"]
    assert obj["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == {
        "scaleDown": {"stabilizationWindowSeconds": 600}
    }


def test_a_new_autoscaled_pool_starts_at_its_fixed_share_within_its_bounds() -> None:
    scaling = one(section(minReplicas=2, maxReplicas=4))
    assert [autoscaling.seed(n, scaling) for n in (0, 3, 9)] == [2, 3, 4]


def test_the_hpas_telling_condition_becomes_the_pools_scaling_reason() -> None:
    scaling = one(section(maxReplicas=4))
    hpa = {
        "status": {
            "currentReplicas": 3,
            "desiredReplicas": 4,
            "lastScaleTime": "2026-01-01T00:00:00Z",
            "conditions": [
                {"type": "AbleToScale", "status": "True", "reason": "SucceededRescale", "message": "ok"},
                {"type": "ScalingActive", "status": "True", "reason": "ValidMetricFound"},
                {
                    "type": "ScalingLimited",
                    "status": "True",
                    "reason": "TooManyReplicas",
                    "message": "the desired count is above max",
                },
            ],
        }
    }
    seen = autoscaling.observed(scaling, hpa, 3)
    assert (seen.engine, seen.current_replicas, seen.desired_replicas) == ("HPA", 3, 4)
    assert (seen.scaling_reason, seen.object, seen.last_scale_time) == ("TooManyReplicas", "m-h200", "2026-01-01T00:00:00Z")
    assert autoscaling.at_max(seen)
    no_metrics = {
        "status": {
            "conditions": [
                {"type": "AbleToScale", "status": "True", "reason": "SucceededGetScale"},
                {"type": "ScalingActive", "status": "False", "reason": "FailedGetContainerResourceMetric"},
            ]
        }
    }
    assert autoscaling.observed(scaling, no_metrics, 1).scaling_reason == "FailedGetContainerResourceMetric"


def _autoscaled(spec: dict, **fields: object) -> dict:
    out = copy.deepcopy(spec)
    out["autoscaling"] = {"maxReplicas": 4, **fields}
    return out


async def _settled(cluster: Cluster, spec: dict) -> None:
    cluster.api.add_resource("m", spec)
    await cluster.reconcile()
    cluster.api.finish_job(cluster.job_name(), PROBE_OK)
    assert (await cluster.reconcile()).kind == "done"


def _have(cluster: Cluster, *, metrics_server: bool = True, keda: bool = False) -> None:
    if metrics_server:
        cluster.api.cluster_objects[("APIService", autoscaling.METRICS_API_SERVICE)] = {
            "status": {"conditions": [{"type": "Available", "status": "True"}]}
        }
    if keda:
        cluster.api.cluster_objects[("CustomResourceDefinition", autoscaling.KEDA_CRD)] = {
            "status": {"conditions": [{"type": "Established", "status": "True"}]}
        }


async def test_an_autoscaled_resource_gets_an_hpa_per_pool_and_deployments_it_no_longer_sizes() -> None:
    cluster = Cluster()
    _have(cluster)
    await _settled(cluster, _autoscaled(CPU_SPEC, minReplicas=2))
    hpas = cluster.api.kinds("HorizontalPodAutoscaler")
    assert sorted(hpas) == ["m-nvidia-gb300", "m-nvidia-h200-141gb-hbm3e"]
    deployments = cluster.api.kinds("Deployment")
    # Made at the fixed share (1 and 2 of 3), raised to minReplicas 2.
    assert [d["spec"]["replicas"] for _, d in sorted(deployments.items())] == [2, 2]
    st = cluster.status()
    assert [p["autoscaling"]["engine"] for p in st["pools"]] == ["HPA", "HPA"]
    assert cluster.condition("Autoscaling") == ("True", Reason.AUTOSCALED_BY_HPA)
    assert st["autoscalingSummary"] == "GB300=HPA:?->?/4,H200=HPA:?->?/4"

    # The autoscaler scales one pool (a scale write: the Deployment's spec, a new generation);
    # the watch shows it, with the HPA's status, and the next pass reports it and leaves it alone.
    name = "m-nvidia-h200-141gb-hbm3e"
    cluster.api.objects[("Deployment", "ns", name)]["spec"]["replicas"] = 4
    cluster.api.objects[("HorizontalPodAutoscaler", "ns", name)]["status"] = {"currentReplicas": 2, "desiredReplicas": 4}
    cluster.api.stamp_markers = True
    watch_shows(cluster)
    for kind in ("HorizontalPodAutoscaler",):
        for obj in cluster.api.kinds(kind).values():
            cluster.reconciler.children.observe(kind, "MODIFIED", obj)
    await cluster.reconcile()
    assert cluster.api.objects[("Deployment", "ns", name)]["spec"]["replicas"] == 4
    pool = next(p for p in cluster.status()["pools"] if p["deployment"] == name)
    assert pool["replicas"] == 4 and pool["autoscaling"]["desiredReplicas"] == 4
    at_max = [e for e in cluster.api.events if e["reason"] == Reason.POOL_AT_MAX_REPLICAS]
    assert len(at_max) == 1 and "maxReplicas (4)" in at_max[0]["message"]


async def test_autoscaling_asked_where_the_cluster_has_no_engine_holds_the_pools_and_says_why() -> None:
    cluster = Cluster()
    await _settled(cluster, GPU_SPEC)
    before = {n: d["spec"]["replicas"] for n, d in cluster.api.kinds("Deployment").items()}
    cluster.api.edit_spec("m", _autoscaled(CPU_SPEC, minReplicas=1))
    await cluster.reconcile()
    assert cluster.api.kinds("HorizontalPodAutoscaler") == {}
    assert {n: d["spec"]["replicas"] for n, d in cluster.api.kinds("Deployment").items()} == before
    assert cluster.condition("Autoscaling") == ("False", Reason.NO_METRICS_SERVER)
    assert cluster.condition("Degraded") == ("True", Reason.NO_METRICS_SERVER)
    assert cluster.condition("Ready")[1] != Reason.NO_METRICS_SERVER  # serving goes on
    assert {p["autoscaling"]["engine"] for p in cluster.status()["pools"]} == {"None"}


async def test_turning_autoscaling_off_prunes_the_hpas_and_fixes_the_replicas_again() -> None:
    cluster = Cluster()
    _have(cluster)
    await _settled(cluster, _autoscaled(CPU_SPEC))
    assert cluster.api.kinds("HorizontalPodAutoscaler")
    cluster.api.edit_spec("m", CPU_SPEC)
    await cluster.reconcile()
    assert cluster.api.kinds("HorizontalPodAutoscaler") == {}
    assert sorted(d["spec"]["replicas"] for d in cluster.api.kinds("Deployment").values()) == [1, 2]
    assert all(c["type"] != "Autoscaling" for c in cluster.status()["conditions"])
    assert all("autoscaling" not in p for p in cluster.status()["pools"])


def test_reaching_max_is_one_event_not_one_per_pass() -> None:
    def status(desired: int) -> api.MultimodalPreprocessorStatus:
        pool = {
            "name": "h200", "nodes": 1, "path": "gpu", "processorWorkers": 1, "ioWorkers": 4, "reason": "GPUPathCap",
            "message": "m", "deployment": "m-h200", "replicas": desired,
            "autoscaling": {"engine": "HPA", "reason": "AutoscaledByHPA", "minReplicas": 1, "maxReplicas": 4, "target": 70,
                            "desiredReplicas": desired},
        }  # fmt: skip
        return api.MultimodalPreprocessorStatus.model_validate({"pools": [pool]})

    def at_max(old: int, new: int) -> int:
        return sum(e.reason == Reason.POOL_AT_MAX_REPLICAS for e in events.events(status(old), status(new)))

    assert (at_max(3, 4), at_max(4, 4), at_max(4, 3), at_max(3, 4)) == (1, 0, 0, 1)


async def test_detection_is_cached_and_looked_up_again_after_its_ttl() -> None:
    cluster = Cluster()
    detector = cluster.reconciler.autoscalers
    now = [0.0]
    detector.clock = lambda: now[0]
    assert await detector.current() == NEITHER
    _have(cluster, keda=True)
    assert await detector.current() == NEITHER  # cached
    now[0] += detector.ttl_seconds
    assert await detector.current() == BOTH

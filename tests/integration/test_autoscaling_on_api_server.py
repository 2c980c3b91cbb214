"""Autoscaled pools on the real API server, with the real kube-controller-manager's HPA controller.

metrics-server is stood in for by ``support.metrics_api`` (the real APIService, pod metrics at a
CPU usage the test sets), so the HPA that scales the pools is the real one; KEDA is its real CRD
(``hack/keda-crds.sh``), which validates the ScaledObjects the operator renders (no KEDA controller
runs). What is measured: every value a pool Deployment's spec.replicas takes over a run, from a
watch, so a write by the operator that undid the autoscaler's (a flip-flop), or a handover that
let the count fall to the default of 1, shows as a value in the sequence.

Order matters: the held-pool test runs before KEDA's CRD is installed, the KEDA test last.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from support.kube import Cluster, Kube, condition, condition_is, pools, wait_for
from support.metrics_api import API_SERVICE, SERVICE, MetricsApi
from support.operator_process import OperatorProcess
from support.specs import CPU_POOL, make_spec

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
CPU_REQUEST = {"requests": {"cpu": "1"}}
KEDA_CRD = "scaledobjects.keda.sh"


@pytest.fixture(scope="module")
def metrics_api(cluster: Cluster, kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetricsApi]:
    def pods(namespace: str, selector: str) -> list[tuple[str, list[str]]]:
        found = kube.core.list_namespaced_pod(namespace, label_selector=selector).items
        return [(p.metadata.name, [c.name for c in p.spec.containers]) for p in found]

    api = MetricsApi(pods, tmp_path_factory.mktemp("metrics-api")).start()
    for obj in api.objects():
        cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))

    def available() -> bool:
        body = json.loads(cluster.kubectl("get", "apiservice", API_SERVICE, "-o", "json").stdout)
        return any(c["type"] == "Available" and c["status"] == "True" for c in body["status"].get("conditions", ()))

    wait_for(available, 60, what="the metrics APIService Available")
    yield api
    # An APIService left without its server breaks discovery for every later client: remove it first.
    cluster.kubectl("delete", "apiservice", API_SERVICE, "--ignore-not-found")
    cluster.kubectl("delete", "service", "-n", SERVICE[0], SERVICE[1], "--ignore-not-found")
    api.stop()


class ReplicaLog:
    """Every spec.replicas value of a namespace's Deployments, in order, from a watch."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.values: dict[str, list[int]] = {}
        self._stopped = False
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, args=(kube, namespace), daemon=True)
        self._thread.start()

    def _run(self, kube: Kube, namespace: str) -> None:
        try:
            for event in self._watch.stream(kube.apps.list_namespaced_deployment, namespace, timeout_seconds=900):
                d = event["object"]
                seen = self.values.setdefault(d.metadata.name, [])
                if not seen or seen[-1] != d.spec.replicas:
                    seen.append(d.spec.replicas)
        except Exception:
            if not self._stopped:  # a connection closed by stop() is the end of the log, not an error
                raise

    def stop(self) -> None:
        self._stopped = True
        self._watch.stop()


def _deployment(kube: Kube, namespace: str) -> client.V1Deployment:
    (d,) = kube.deployments(namespace)
    return d


def _replicas_owners(kube: Kube, namespace: str) -> set[str]:
    """The field managers that own the Deployment's spec.replicas."""
    d = kube.apps.read_namespaced_deployment(_deployment(kube, namespace).metadata.name, namespace)
    return {
        f"{m.manager}/{m.operation}{'/' + m.subresource if m.subresource else ''}"
        for m in d.metadata.managed_fields or ()
        if "f:replicas" in ((m.fields_v1 or {}).get("f:spec") or {})
    }


def _scaled(obj: dict[str, Any]) -> dict[str, Any] | None:
    (pool,) = pools(obj)
    return pool.get("autoscaling")


def test_the_real_hpa_sizes_the_pool_and_the_operator_never_writes_its_replicas(
    cluster: Cluster,
    kube: Kube,
    operator: OperatorProcess,
    namespace: str,
    model_dir: Callable[..., Path],
    metrics_api: MetricsApi,
) -> None:
    log = ReplicaLog(kube, namespace)
    spec = make_spec(
        model_dir("llava"),
        nodeSelector=CPU_POOL,
        resources=CPU_REQUEST,
        replicas=2,
        autoscaling={"minReplicas": 1, "maxReplicas": 3, "target": 50, "scaleUp": {"stabilizationWindowSeconds": 0}},
    )
    kube.create_mmp(namespace, "auto", spec)
    obj = kube.wait_mmp(namespace, "auto", lambda o: condition_is(o, "Autoscaling", "True"), 180, what="Autoscaling True")
    assert condition(obj, "Autoscaling")["reason"] == "AutoscaledByHPA"
    deployment = _deployment(kube, namespace)
    hpa = kube.autoscaling.read_namespaced_horizontal_pod_autoscaler(deployment.metadata.name, namespace)
    assert hpa.spec.scale_target_ref.name == deployment.metadata.name
    assert (hpa.spec.min_replicas, hpa.spec.max_replicas) == (1, 3)
    assert hpa.metadata.owner_references[0].kind == "MultimodalPreprocessor"
    # Made at its share of spec.replicas (2), and the count handed over: the operator owns none of it.
    assert deployment.spec.replicas == 2
    assert not any(o.startswith("mmprep-operator/") for o in _replicas_owners(kube, namespace)), _replicas_owners(kube, namespace)

    # Load: twice the CPU request in every runtime container; the real HPA scales to its max.
    metrics_api.cpu_millis[namespace] = 2000
    obj = kube.wait_mmp(
        namespace,
        "auto",
        lambda o: (s := _scaled(o)) is not None and s.get("desiredReplicas") == 3 and s.get("currentReplicas") == 3,
        180,
        what="the HPA at max, in status",
    )
    assert _deployment(kube, namespace).spec.replicas == 3
    assert "kube-controller-manager/Update/scale" in _replicas_owners(kube, namespace)
    assert "HPA:3->3/3" in obj["status"]["autoscalingSummary"]
    wait_for(
        lambda: [e for e in kube.events(namespace, "auto") if e.reason == "PoolAtMaxReplicas"],
        60,
        what="the PoolAtMaxReplicas Event",
    )
    wide = cluster.kubectl("get", "mmp", "auto", "-n", namespace, "-o", "wide").stdout
    assert "HPA:3->3/3" in wide and "AutoscaledByHPA" in wide, wide

    # The rule for `kubectl scale mmp`: spec.replicas no longer sizes autoscaled pools. The
    # scale and a template change are two reconciles that re-apply the Deployment.
    cluster.kubectl("scale", "-n", namespace, "mmp/auto", "--replicas", "1")
    kube.patch_mmp(namespace, "auto", {"spec": {"env": [{"name": "MMPREP_TEST_ROLL", "value": "1"}]}})
    generation = kube.get_mmp(namespace, "auto")["metadata"]["generation"]
    obj = kube.wait_mmp(namespace, "auto", lambda o: o["status"].get("observedGeneration") == generation, 120, what="reconciled")
    wait_for(
        lambda: any(
            e.name == "MMPREP_TEST_ROLL" for e in _deployment(kube, namespace).spec.template.spec.containers[0].env or ()
        ),
        60,
        what="the template change applied",
    )
    scale = kube.custom.get_namespaced_custom_object_scale("mmprep.dev", "v1alpha1", namespace, "multimodalpreprocessors", "auto")
    assert scale["spec"]["replicas"] == 1 and _deployment(kube, namespace).spec.replicas == 3
    log.stop()
    # The whole run, as the watch saw it: made at 2, scaled once to 3 by the HPA, never back.
    assert list(log.values.values()) == [[2, 3]], log.values


def test_turning_autoscaling_on_and_off_never_drops_a_pool_to_the_default_of_one(
    cluster: Cluster,
    kube: Kube,
    operator: OperatorProcess,
    namespace: str,
    model_dir: Callable[..., Path],
    metrics_api: MetricsApi,
) -> None:
    log = ReplicaLog(kube, namespace)
    spec = make_spec(model_dir("llava"), nodeSelector=CPU_POOL, resources=CPU_REQUEST, replicas=3)
    kube.create_mmp(namespace, "flip", spec)
    wait_for(
        lambda: kube.deployments(namespace) and _deployment(kube, namespace).spec.replicas == 3, 180, what="3 fixed replicas"
    )
    assert _replicas_owners(kube, namespace) == {"mmprep-operator/Apply"}

    # Fixed -> autoscaled: the count is handed over at 3 (a long scale-down window keeps the idle
    # pool there while the test looks).
    autoscaled = {"minReplicas": 1, "maxReplicas": 5, "scaleDown": {"stabilizationWindowSeconds": 3600}}
    kube.patch_mmp(namespace, "flip", {"spec": {"autoscaling": autoscaled}})
    kube.wait_mmp(namespace, "flip", lambda o: condition_is(o, "Autoscaling", "True"), 120, what="Autoscaling True")
    wait_for(lambda: kube.autoscaling.list_namespaced_horizontal_pod_autoscaler(namespace).items, 30, what="the HPA")
    assert _replicas_owners(kube, namespace) == {"mmprep-replicas-handover/Apply"}
    assert _deployment(kube, namespace).spec.replicas == 3

    # Autoscaled -> fixed: spec.replicas sizes the pool again, the HPA is pruned.
    kube.patch_mmp(namespace, "flip", {"spec": {"autoscaling": None, "replicas": 2}})
    wait_for(lambda: _deployment(kube, namespace).spec.replicas == 2, 120, what="2 fixed replicas again")
    wait_for(lambda: not kube.autoscaling.list_namespaced_horizontal_pod_autoscaler(namespace).items, 60, what="the HPA pruned")
    obj = kube.wait_mmp(namespace, "flip", lambda o: condition(o, "Autoscaling") is None, 60, what="no Autoscaling condition")
    assert "autoscaling" not in pools(obj)[0]
    assert _replicas_owners(kube, namespace) == {"mmprep-operator/Apply"}
    log.stop()
    assert list(log.values.values()) == [[3, 2]], log.values


def test_a_runtime_signal_without_keda_holds_the_pool_at_its_count_and_says_why(
    cluster: Cluster, kube: Kube, operator: OperatorProcess, namespace: str, model_dir: Callable[..., Path]
) -> None:
    assert cluster.kubectl("get", "crd", KEDA_CRD, check=False).returncode != 0, "KEDA's CRD must not be installed yet"
    spec = make_spec(model_dir("llava"), nodeSelector=CPU_POOL, resources=CPU_REQUEST, replicas=2)
    kube.create_mmp(namespace, "held", spec)
    wait_for(lambda: kube.deployments(namespace) and _deployment(kube, namespace).spec.replicas == 2, 180, what="2 replicas")
    busy = {"maxReplicas": 4, "signal": "workerBusy", "prometheus": {"serverAddress": "http://prometheus.monitoring:9090"}}
    kube.patch_mmp(namespace, "held", {"spec": {"autoscaling": busy, "replicas": 4}})
    obj = kube.wait_mmp(namespace, "held", lambda o: condition_is(o, "Autoscaling", "False"), 120, what="Autoscaling False")
    assert condition(obj, "Autoscaling")["reason"] == "NoKEDA"
    assert condition(obj, "Degraded")["reason"] == "NoKEDA"
    assert _scaled(obj)["engine"] == "None"
    # Serving goes on at the last count: neither spec.replicas (4) nor the default of 1.
    assert _deployment(kube, namespace).spec.replicas == 2
    assert not kube.autoscaling.list_namespaced_horizontal_pod_autoscaler(namespace).items


@pytest.fixture
def keda_crd(cluster: Cluster, kube: Kube) -> Iterator[str]:
    folder = Path(
        subprocess.run([str(REPO / "hack" / "keda-crds.sh")], capture_output=True, text=True, check=True).stdout.strip()
    )
    cluster.kubectl("apply", "--server-side", "-f", str(folder / "keda.sh_scaledobjects.yaml"))

    def established() -> bool:
        obj = kube.ext.read_custom_resource_definition(KEDA_CRD)
        return any(c.type == "Established" and c.status == "True" for c in obj.status.conditions or [])

    wait_for(established, 30, what="KEDA's CRD Established")
    yield KEDA_CRD
    cluster.kubectl("delete", "crd", KEDA_CRD, "--ignore-not-found")


def test_keda_is_detected_its_crd_accepts_the_scaled_object_per_pool_and_uninstalling_keda_leaves_the_operator_working(
    cluster: Cluster, kube: Kube, operator: OperatorProcess, namespace: str, model_dir: Callable[..., Path], keda_crd: str
) -> None:
    busy = {
        "minReplicas": 1,
        "maxReplicas": 4,
        "signal": "workerBusy",
        "target": 80,
        "prometheus": {"serverAddress": "http://prometheus.monitoring:9090"},
        "scaleDown": {"stabilizationWindowSeconds": 600, "rate": {"pods": 1, "periodSeconds": 60}},
    }
    spec = make_spec(model_dir("llava"), nodeSelector=CPU_POOL, replicas=2, autoscaling=busy)
    kube.create_mmp(namespace, "keda", spec)
    # Detection is cached for a minute; a held resource is looked at again after it.
    obj = kube.wait_mmp(
        namespace,
        "keda",
        lambda o: (c := condition(o, "Autoscaling")) is not None and c["reason"] == "AutoscaledByKEDA",
        180,
        what="AutoscaledByKEDA",
    )
    assert _scaled(obj)["engine"] == "KEDA"
    (scaled,) = kube.custom.list_namespaced_custom_object("keda.sh", "v1alpha1", namespace, "scaledobjects")["items"]
    deployment = _deployment(kube, namespace)
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment.metadata.name
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and "mmprep_workers_busy_fraction" in trigger["metadata"]["query"]
    assert trigger["metadata"]["threshold"] == "0.8"
    assert deployment.spec.replicas == 2
    # The CRD is KEDA's own, with its own rules: what it refuses, it refuses here too.
    bad = {**scaled, "metadata": {"name": "bad", "namespace": namespace}, "spec": {**scaled["spec"], "minReplicaCount": 9}}
    refused = cluster.kubectl("apply", "-f", "-", input=json.dumps(bad), check=False)
    assert refused.returncode != 0 and "minReplicaCount must be less than or equal to maxReplicaCount" in refused.stderr, (
        refused.stderr
    )

    # KEDA uninstalled under the running operator: its CRD goes, the ScaledObject with it, and the
    # operator's watch of ScaledObjects hits 404s until kopf sees the deletion. The operator keeps
    # running and reconciling: turning autoscaling off sizes the pool from spec.replicas again.
    cluster.kubectl("delete", "crd", keda_crd, "--wait=true")
    wait_for(
        lambda: KEDA_CRD not in {c.metadata.name for c in kube.ext.list_custom_resource_definition().items},
        60,
        what="the CRD gone",
    )
    kube.patch_mmp(namespace, "keda", {"spec": {"autoscaling": None, "replicas": 3}})
    wait_for(lambda: _deployment(kube, namespace).spec.replicas == 3, 120, what="3 fixed replicas after KEDA is gone")
    kube.wait_mmp(namespace, "keda", lambda o: condition(o, "Autoscaling") is None, 60, what="no Autoscaling condition")
    assert operator.healthy(), operator.tail()

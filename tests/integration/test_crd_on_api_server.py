"""The CRD installs on a real API server, and the server itself rejects invalid resources."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.exceptions import ApiException
from support.kube import GROUP, PLURAL, VERSION, Cluster, Kube, wait_for

pytestmark = pytest.mark.cluster


def test_the_crd_is_established_with_its_short_name_and_printer_columns(crd: str, cluster: Cluster, kube: Kube) -> None:
    obj = kube.ext.read_custom_resource_definition(crd)
    assert obj.spec.names.kind == "MultimodalPreprocessor"
    assert "mmp" in obj.spec.names.short_names
    version = next(v for v in obj.spec.versions if v.name == "v1alpha1")
    assert version.subresources.status is not None and version.subresources.scale is not None
    columns = {c.name.lower() for c in version.additional_printer_columns or []}
    assert {"workers", "ready", "age"} <= columns and any(c.startswith("path") for c in columns), columns
    # kubectl explain reads the published OpenAPI schema (published a moment after the CRD is
    # Established): the descriptions teach the API.
    explained = wait_for(
        lambda: cluster.kubectl("explain", "mmp.spec.workers.processor", check=False).stdout,
        60,
        what="kubectl explain to know the CRD",
    )
    assert "worker" in explained.lower() and "copy" in explained.lower(), explained


def _apply(cluster: Cluster, namespace: str, spec: dict) -> tuple[int, str]:
    body = {"apiVersion": "mmprep.dev/v1alpha1", "kind": "MultimodalPreprocessor", "metadata": {"name": "bad"}, "spec": spec}
    done = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body), check=False)
    return done.returncode, done.stderr


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param(
            {"model": {"path": "/m", "id": "org/m"}}, "set exactly one of model.path and model.id", id="two-model-sources"
        ),
        pytest.param({"model": {}}, "set exactly one of model.path and model.id", id="no-model-source"),
        pytest.param({"backend": "pil"}, "spec.model: Required value", id="model-missing"),
        pytest.param(
            {"model": {"path": "/m"}, "device": "cuda"}, "device: cuda needs a GPU resource", id="cuda-without-gpu-resource"
        ),
        pytest.param(
            {"model": {"path": "/m"}, "workers": {"processor": 0}}, "should be greater than or equal to 1", id="zero-workers"
        ),
        pytest.param(
            {"model": {"path": "/m"}, "workers": {"processor": 65}}, "should be less than or equal to 64", id="too-many-workers"
        ),
        pytest.param(
            {"model": {"path": "/m"}, "backend": "opencv"}, 'supported values: "auto", "pil", "torchvision"', id="bad-backend"
        ),
        pytest.param(
            {"model": {"path": "/m"}, "workers": {"overrides": [{"processor": 2}]}},
            "an override names exactly one of gpuProduct and gpuFamily",
            id="override-without-target",
        ),
        pytest.param(
            {
                "model": {"path": "/m"},
                "resources": {"requests": {"cpu": "1"}},
                "autoscaling": {"minReplicas": 5, "maxReplicas": 2},
            },
            "autoscaling.minReplicas must not exceed maxReplicas",
            id="autoscaling-min-above-max",
        ),
        pytest.param(
            {"model": {"path": "/m"}, "resources": {"requests": {"cpu": "1"}}, "autoscaling": {"maxReplicas": 3, "target": 0}},
            "autoscaling target out of range for its signal",
            id="autoscaling-target-out-of-range",
        ),
        pytest.param(
            {
                "model": {"path": "/m"},
                "resources": {"requests": {"cpu": "1"}},
                "autoscaling": {"maxReplicas": 3, "pools": [{"pool": "h200", "minReplicas": 4}]},
            },
            "a pool's minReplicas must not exceed its maxReplicas",
            id="autoscaling-pool-min-above-section-max",
        ),
        pytest.param(
            {"model": {"path": "/m"}, "autoscaling": {"maxReplicas": 3}},
            "autoscaling on signal cpu needs a CPU request",
            id="autoscaling-cpu-without-cpu-request",
        ),
        pytest.param(
            {"model": {"path": "/m"}, "autoscaling": {"maxReplicas": 3, "signal": "queueWait", "target": 700000}},
            "autoscaling target out of range for its signal",
            id="autoscaling-queue-wait-target-out-of-range",
        ),
        pytest.param(
            {"model": {"path": "/m"}, "drain": {"seconds": 40}},
            "drain.gracePeriodSeconds must be at least drain.seconds + 6",
            id="drain-window-longer-than-the-defaulted-grace-period-allows",
        ),
    ],
)
def test_the_api_server_rejects_an_invalid_resource_with_its_message(
    crd: str, cluster: Cluster, kube: Kube, namespace: str, spec: dict, message: str
) -> None:
    code, stderr = _apply(cluster, namespace, spec)
    assert code != 0, "the API server accepted an invalid resource"
    assert message in stderr, stderr
    assert not kube.mmp_exists(namespace, "bad")


def test_a_valid_resource_is_accepted_and_defaulted(crd: str, cluster: Cluster, kube: Kube, namespace: str) -> None:
    code, stderr = _apply(cluster, namespace, {"model": {"path": "/models/qwen"}})
    assert code == 0, stderr
    spec = kube.get_mmp(namespace, "bad")["spec"]
    # Defaults come from the schema, applied by the API server.
    assert spec["backend"] == "auto" and spec["device"] == "auto" and spec["replicas"] == 1
    assert spec["model"]["trustRemoteCode"] is False


def _pool(name: str, replicas: int) -> dict[str, object]:
    return {
        "name": name,
        "nodes": 1,
        "path": "cpu",
        "processorWorkers": 2,
        "ioWorkers": 1,
        "reason": "CpuDefault",
        "message": "two workers",
        "deployment": f"keyed-{name}",
        "replicas": replicas,
    }


def test_status_pools_are_a_map_keyed_by_pool_name(crd: str, kube: Kube, namespace: str) -> None:
    """The API server itself holds ``status.pools`` to one entry per name, and server-side apply
    merges entries by name: two writers of two pools keep both, a writer of one pool changes
    only that one."""
    kube.create_mmp(namespace, "keyed", {"model": {"path": "/m"}})

    def apply_status(manager: str, pools: list[dict[str, object]]) -> dict[str, object]:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "MultimodalPreprocessor", "metadata": {"name": "keyed"}}
        body["status"] = {"pools": pools}
        # Server-side apply of the status subresource (JSON is YAML), as the operator writes it.
        return dict(
            kube.custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                "keyed",
                body,
                field_manager=manager,
                force=True,
                _content_type="application/apply-patch+yaml",
            )
        )

    # Two entries of one pool in one write are refused by the schema's list-map rule.
    with pytest.raises(ApiException) as refused:
        kube.custom.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            "keyed",
            {"status": {"pools": [_pool("cpu", 1), _pool("cpu", 2)]}},
            _content_type="application/merge-patch+json",
        )
    assert refused.value.status == 422 and "status.pools[1]: Duplicate value" in str(refused.value.body), refused.value.body

    apply_status("writer-a", [_pool("cpu", 1)])
    apply_status("writer-b", [_pool("h200", 3)])
    apply_status("writer-a", [_pool("cpu", 2)])
    pools = {p["name"]: p["replicas"] for p in kube.get_mmp(namespace, "keyed")["status"]["pools"]}
    assert pools == {"cpu": 2, "h200": 3}

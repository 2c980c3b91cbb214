"""A Secret or claim the pods name but that does not exist cannot be caught by the schema: on the
real API server, with the real operator, it is reported in status with a reason naming its kind,
nothing is rolled out meanwhile, and pods already serving keep serving. (A missing Secret is
what the probe pod's container says, here the test agent playing the kubelet; claims the
operator looks up itself.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes import client
from support.kube import Kube, condition, condition_is, pools
from support.operator_process import OperatorProcess
from support.specs import CPU_POOL, make_spec

pytestmark = pytest.mark.cluster


def _degraded_reason(obj: dict) -> str | None:
    return (condition(obj, "Degraded") or {}).get("reason")


def test_a_missing_secret_is_reported_and_the_resource_starts_once_it_exists(
    kube: Kube, operator: OperatorProcess, namespace: str, model_dir: Callable[..., Path]
) -> None:
    spec = make_spec(model_dir("llava"), nodeSelector=CPU_POOL, envFrom=[{"secretRef": {"name": "hub-token"}}])
    kube.create_mmp(namespace, "waits", spec)
    # The operator does not read Secrets: the probe pod's container waits, and says why.
    obj = kube.wait_mmp(namespace, "waits", lambda o: _degraded_reason(o) == "SecretNotFound", 90, what="SecretNotFound")
    assert 'secret "hub-token" not found' in condition(obj, "Degraded")["message"]
    assert condition(obj, "Probed")["reason"] == "SecretNotFound"
    assert condition(obj, "Ready")["status"] == "False"
    assert kube.deployments(namespace) == []

    kube.core.create_namespaced_secret(
        namespace, client.V1Secret(metadata=client.V1ObjectMeta(name="hub-token"), string_data={"HF_TOKEN": "x"})
    )
    # The waiting probe pod starts; the operator reads it again within 30 s, then rolls out.
    kube.wait_mmp(namespace, "waits", lambda o: condition_is(o, "Ready", "True"), 300, what="Ready once the Secret exists")


def test_a_missing_claim_leaves_the_pods_that_serve_as_they_are(
    kube: Kube, operator: OperatorProcess, namespace: str, model_dir: Callable[..., Path]
) -> None:
    kube.create_mmp(namespace, "serving", make_spec(model_dir("llava"), nodeSelector=CPU_POOL, replicas=2))
    obj = kube.wait_mmp(namespace, "serving", lambda o: condition_is(o, "Ready", "True"), 300, what="Ready")
    (deployment,) = kube.deployments(namespace)
    before = (deployment.metadata.generation, deployment.spec.template.spec.volumes)
    served = pools(obj)

    kube.patch_mmp(
        namespace,
        "serving",
        {
            "spec": {
                "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "models"}}],
                "volumeMounts": [{"name": "models", "mountPath": "/models"}],
            }
        },
    )
    obj = kube.wait_mmp(
        namespace,
        "serving",
        lambda o: _degraded_reason(o) == "PersistentVolumeClaimNotFound" and o["status"]["observedGeneration"] == 2,
        60,
        what="PersistentVolumeClaimNotFound",
    )
    assert (
        'PersistentVolumeClaim "models" (spec.volumes[0].persistentVolumeClaim) not found'
        in condition(obj, "Degraded")["message"]
    )
    (deployment,) = kube.deployments(namespace)
    assert (deployment.metadata.generation, deployment.spec.template.spec.volumes) == before
    assert [p["name"] for p in pools(obj)] == [p["name"] for p in served]
    assert condition_is(obj, "Ready", "True"), condition(obj, "Ready")

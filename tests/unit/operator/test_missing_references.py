"""A Secret, ConfigMap or claim the pods name but that does not exist: reported in status with a
reason naming its kind, nothing rolled out meanwhile, and pods already serving left as they are;
once it exists, the resource proceeds. Claims are looked up; Secrets and ConfigMaps are known from
what the kubelet says of the pod that names them."""

from __future__ import annotations

import pytest
from reconcile_cluster import GPU_SPEC, PROBE_OK, Cluster

from mmprep_operator import api
from mmprep_operator.logic import references


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()


def test_every_required_reference_is_listed_with_where_the_spec_names_it() -> None:
    spec = api.MultimodalPreprocessorSpec.model_validate(
        {
            "model": {"path": "/m"},
            "imagePullSecrets": [{"name": "registry"}],
            "envFrom": [{"secretRef": {"name": "token"}}, {"configMapRef": {"name": "opt", "optional": True}}],
            "env": [{"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}],
            "volumes": [
                {"name": "models", "persistentVolumeClaim": {"claimName": "models"}},
                {"name": "certs", "secret": {"secretName": "certs"}},
                {"name": "scratch", "emptyDir": {}},
            ],
        }
    )
    assert [(r.kind, r.name, r.where) for r in references.references(spec)] == [
        ("Secret", "registry", "spec.imagePullSecrets[0]"),
        ("Secret", "token", "spec.envFrom[0].secretRef"),
        ("ConfigMap", "cm", "spec.env[0].valueFrom.configMapKeyRef"),
        ("PersistentVolumeClaim", "models", "spec.volumes[0].persistentVolumeClaim"),
        ("Secret", "certs", "spec.volumes[1].secret"),
    ]


def _probe_pod_waits(cluster: Cluster, message: str) -> None:
    """Play the kubelet: the probe pod cannot start its container."""
    cluster.api.pods.append(
        {
            "metadata": {"labels": {"job-name": cluster.job_name()}, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "status": {
                "phase": "Pending",
                "containerStatuses": [
                    {
                        "name": "probe",
                        "ready": False,
                        "state": {"waiting": {"reason": "CreateContainerConfigError", "message": message}},
                    }
                ],
            },
        }
    )


async def test_a_missing_secret_is_what_the_kubelet_says_and_nothing_rolls_out(cluster: Cluster) -> None:
    # The operator never reads Secrets: the probe pod's kubelet state says which one is missing.
    cluster.api.add_resource("m", {**GPU_SPEC, "envFrom": [{"secretRef": {"name": "hub-token"}}]})
    await cluster.reconcile()
    _probe_pod_waits(cluster, 'secret "hub-token" not found')
    outcome = await cluster.reconcile()
    assert outcome.kind == "waiting"
    assert cluster.condition("Probed") == ("False", "SecretNotFound")
    assert cluster.condition("Degraded") == ("True", "SecretNotFound")
    message = next(c["message"] for c in cluster.status()["conditions"] if c["type"] == "Degraded")
    assert message == 'the probe pod cannot start: secret "hub-token" not found'
    assert cluster.api.kinds("Deployment") == {}

    cluster.api.pods.clear()  # the Secret appeared: the kubelet starts the container
    await cluster.reconcile()
    assert cluster.condition("Probed") == ("False", "ProbePending")
    assert cluster.condition("Degraded") == ("False", "AsExpected")


def test_the_operator_never_looks_up_secrets_or_config_maps() -> None:
    assert frozenset({"PersistentVolumeClaim"}) == references.LOOKED_UP


async def test_a_missing_claim_leaves_the_serving_pods_and_their_status_as_they_are(cluster: Cluster) -> None:
    cluster.api.add_resource("m", GPU_SPEC)
    await cluster.reconcile()
    cluster.api.finish_job(cluster.job_name(), PROBE_OK)
    await cluster.reconcile()
    for name, d in cluster.api.kinds("Deployment").items():
        cluster.api.set_ready(name, d["spec"]["replicas"])
    await cluster.reconcile()
    assert cluster.condition("Ready") == ("True", "AllReplicasReady")
    before = cluster.api.kinds("Deployment")
    pools_before = cluster.status()["pools"]

    edited = {
        **GPU_SPEC,
        "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "models"}}],
        "volumeMounts": [{"name": "models", "mountPath": "/models"}],
    }
    cluster.api.resources[("ns", "m")]["spec"] = edited
    cluster.api.resources[("ns", "m")]["metadata"]["generation"] = 2
    await cluster.reconcile()
    assert cluster.condition("Degraded") == ("True", "PersistentVolumeClaimNotFound")
    assert cluster.api.kinds("Deployment") == before, "a Deployment changed while its claim is missing"
    assert cluster.status()["pools"] == pools_before
    # The pods that serve still serve: Ready follows them.
    assert cluster.condition("Ready") == ("True", "AllReplicasReady")


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ('secret "hub-token" not found', "SecretNotFound"),
        ('couldn\'t find key k in ConfigMap ns/x: configmap "x" not found', "ConfigMapNotFound"),
        ("failed to sync secret cache: timed out waiting for the condition", "CreateContainerConfigError"),
    ],
)
def test_a_container_that_names_a_missing_object_gets_its_kind_as_reason(message: str, reason: str) -> None:
    from mmprep_operator.logic import podstates

    pod = {
        "status": {
            "containerStatuses": [
                {"name": "runtime", "state": {"waiting": {"reason": "CreateContainerConfigError", "message": message}}}
            ]
        }
    }
    assert podstates.pod_problem(pod) == (reason, message)


def test_a_pod_the_scheduler_cannot_place_for_a_missing_claim_says_so() -> None:
    from mmprep_operator.logic import podstates

    message = 'persistentvolumeclaim "models" not found'
    pod = {"status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]}}
    assert podstates.pod_problem(pod) == ("PersistentVolumeClaimNotFound", message)

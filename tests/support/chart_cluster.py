"""Shared bodies of the packaging tests against a real cluster (local control plane, or kind).

- ``ChartRelease``: `helm install` of charts/mmprep, and a kubeconfig holding only a TokenRequest
  token of the chart's ServiceAccount, so an operator run with it has exactly the chart's rights.
- ``full_reconcile``: a resource whose probe runs for real, reconciled until Ready; the same body
  checks an operator run as a process (RBAC proof) and one run from the operator image.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from support.kube import AGENT_SELECTOR, AGENT_TOLERATION, Cluster, Kube, condition, condition_is, pool_for, wait_for
from support.packaging_support import CHART, helm

NAME_PREFIX = "pkg"


@dataclasses.dataclass
class ChartRelease:
    cluster: Cluster
    name: str
    namespace: str
    #: What `helm install` printed after the chart's NOTES.txt was rendered.
    notes: str = ""

    @property
    def service_account(self) -> str:
        return f"{self.name}-mmprep-operator" if "mmprep" not in self.name else f"{self.name}-operator"

    @property
    def operator_name(self) -> str:
        return self.service_account

    def policy_text(self, kube: Kube) -> str:
        """The policy file the chart's operator pod would read (from the chart's ConfigMap)."""
        cm = kube.core.read_namespaced_config_map(f"{self.operator_name}-policy", self.namespace)
        return str(cm.data["policy.yaml"])

    def token_kubeconfig(self, kube: Kube, path: Path, *, server: str | None = None) -> Path:
        """A kubeconfig whose only credential is a fresh token of the chart's ServiceAccount."""
        return token_kubeconfig(self.cluster, kube, self.namespace, self.service_account, path, server=server)


def token_kubeconfig(
    cluster: Cluster, kube: Kube, namespace: str, service_account: str, path: Path, *, server: str | None = None
) -> Path:
    """A kubeconfig whose only credential is a fresh TokenRequest token of ``service_account``."""
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))
    token = kube.core.create_namespaced_service_account_token(service_account, namespace, request).status.token
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    cluster_entry = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {**cluster_entry, **({"server": server} if server else {})}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa", "namespace": namespace}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.contextmanager
def installed_chart(cluster: Cluster, namespace: str, values: dict[str, Any]) -> Iterator[ChartRelease]:
    """`helm install` the chart into ``namespace``; `helm uninstall` afterwards."""
    name = f"{NAME_PREFIX}-{uuid.uuid4().hex[:6]}"
    env = cluster.env()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(values, f)
        f.flush()
        done = helm(
            "install",
            name,
            str(CHART),
            "--namespace",
            namespace,
            "-f",
            f.name,
            "--wait",
            "--timeout",
            "120s",
            env=env,
            timeout=180,
        )
    try:
        yield ChartRelease(cluster=cluster, name=name, namespace=namespace, notes=done.stdout.partition("NOTES:")[2])
    finally:
        helm("uninstall", name, "--namespace", namespace, "--wait", env=env, timeout=180, check=False)


def wait_until_granted(kubeconfig: Path, namespace: str, *, timeout: float = 30) -> None:
    """Wait until the API server's authorizer sees the chart's fresh (Cluster)RoleBindings.

    RBAC is served from informer caches: for a moment after `helm install` the new bindings may
    not be visible yet, and an operator started in that moment logs 403s it then retries away."""
    auth = client.AuthorizationV1Api(api_for(kubeconfig).api)
    checks = [
        ("mmprep.dev", "multimodalpreprocessors", "watch", namespace),
        ("apps", "deployments", "patch", namespace),
        ("batch", "jobs", "create", namespace),
        ("", "events", "create", namespace),
        ("", "nodes", "watch", None),
    ]

    def allowed() -> bool:
        for group, resource, verb, ns in checks:
            review = client.V1SelfSubjectAccessReview(
                spec=client.V1SelfSubjectAccessReviewSpec(
                    resource_attributes=client.V1ResourceAttributes(group=group, resource=resource, verb=verb, namespace=ns)
                )
            )
            if not auth.create_self_subject_access_review(review).status.allowed:
                return False
        return True

    wait_for(allowed, timeout, what="the chart's RBAC bindings to take effect")


def make_spec(model: Path, **fields: Any) -> dict[str, Any]:
    """A resource whose probe Job runs for real on the test agent's node; runtime pods land on
    KWOK's simulated CPU nodes (which report them Ready)."""
    spec: dict[str, Any] = {
        "model": {"path": str(model)},
        "device": "cpu",
        "replicas": 1,
        "nodeSelector": {"mmprep.dev/simulated-pool": "cpu"},
        "probe": {"nodeSelector": dict(AGENT_SELECTOR), "tolerations": [dict(AGENT_TOLERATION)], "timeoutSeconds": 240},
    }
    spec.update(fields)
    return spec


def full_reconcile(kube: Kube, namespace: str, model: Path, *, name: str = "rbac-proof", timeout: float = 240) -> dict[str, Any]:
    """Create a resource and wait until the operator has probed it, decided, applied and seen it Ready."""
    kube.create_mmp(namespace, name, make_spec(model))

    def ready() -> dict[str, Any] | None:
        obj = kube.get_mmp(namespace, name)
        return obj if condition_is(obj, "Ready", "True") else None

    obj = wait_for(ready, timeout, what=f"{namespace}/{name} Ready", describe=lambda: kube.get_mmp(namespace, name).get("status"))
    assert condition_is(obj, "Probed", "True"), condition(obj, "Probed")
    assert condition_is(obj, "Cloneable", "True"), condition(obj, "Cloneable")
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
    assert obj["status"]["probe"]["result"]["cloneable"] is True
    cpu = pool_for(obj, "cpu")
    assert cpu is not None, obj["status"]["pools"]
    declared = obj["status"]["probe"]["result"].get("declaredWorkers")
    expected = (declared, "ModelDeclared") if declared else (2, "CPUPathDefault")
    assert (cpu["path"], cpu["processorWorkers"], cpu["reason"]) == ("cpu", *expected), cpu
    deployment = kube.apps.read_namespaced_deployment(cpu["deployment"], namespace)
    owners = deployment.metadata.owner_references or []
    assert [o.uid for o in owners] == [obj["metadata"]["uid"]]
    return obj


def forbidden(call: Any) -> bool:
    """True when the API server answers 403 to ``call()``."""
    try:
        call()
    except ApiException as exc:
        if exc.status == 403:
            return True
        raise AssertionError(f"expected 403 Forbidden, got {exc.status}: {exc.reason}") from exc
    return False


def foreign_deployment(name: str, labels: dict[str, str]) -> client.V1Deployment:
    """A Deployment nobody's operator owns (scaled to 0: it only has to exist)."""
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1DeploymentSpec(
            replicas=0,
            selector=client.V1LabelSelector(match_labels={"app": name}),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels={"app": name}),
                spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="example.invalid/none:1")]),
            ),
        ),
    )


def api_for(kubeconfig: Path) -> Kube:
    from kubernetes import config

    return Kube(config.new_client_from_config(config_file=str(kubeconfig)))

"""The typed pod fields on the real API server: a resource using all of them is accepted and stored
as written, each malformed one is refused at admission with a message that says where and what
(kubectl's default strict field validation turns an unknown field into an error), the schemas are
the live server's own, and the operator renders them into the pods it creates."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from kubernetes import client
from support.kube import REPO, Cluster, Kube, wait_for
from support.operator_process import OperatorProcess
from support.specs import CPU_POOL, make_spec
from support.typed_fields import FULL_SPEC_FIELDS, REJECTIONS, Rejection

pytestmark = pytest.mark.cluster


def _apply(cluster: Cluster, namespace: str, name: str, spec: dict[str, Any]) -> tuple[int, str]:
    body = {"apiVersion": "mmprep.dev/v1alpha1", "kind": "MultimodalPreprocessor", "metadata": {"name": name}, "spec": spec}
    done = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body), check=False)
    return done.returncode, done.stderr


def test_a_resource_with_every_typed_field_is_accepted_and_stored_as_written(
    crd: str, cluster: Cluster, kube: Kube, namespace: str
) -> None:
    code, stderr = _apply(cluster, namespace, "full", {"model": {"path": "/m"}, **FULL_SPEC_FIELDS})
    assert code == 0, stderr
    stored = kube.get_mmp(namespace, "full")["spec"]
    for field, value in FULL_SPEC_FIELDS.items():
        # Nothing pruned, nothing defaulted inside the upstream types.
        assert stored[field] == value, field


@pytest.mark.parametrize("case", REJECTIONS, ids=lambda r: r.id)
def test_a_malformed_pod_field_is_refused_at_admission_with_where_and_what(
    crd: str, cluster: Cluster, kube: Kube, namespace: str, case: Rejection
) -> None:
    code, stderr = _apply(cluster, namespace, "bad", {"model": {"path": "/m"}, **case.fields})
    assert code != 0, "the API server accepted a malformed pod field"
    assert case.server_says in stderr, stderr
    assert not kube.mmp_exists(namespace, "bad")


def test_kubectl_explain_knows_the_upstream_fields(crd: str, cluster: Cluster) -> None:
    explained = wait_for(
        lambda: cluster.kubectl("explain", "mmp.spec.volumes.persistentVolumeClaim", check=False).stdout or None,
        60,
        what="kubectl explain to know the typed volumes",
    )
    assert "claimName" in explained, explained


def _trim_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("corev1_schemas", REPO / "hack" / "corev1-schemas.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_core_v1_schemas_are_the_live_api_servers(cluster: Cluster) -> None:
    script = _trim_script()
    document = json.loads(cluster.kubectl("get", "--raw", "/openapi/v3/api/v1").stdout)
    live = script.trim(document, "live")
    committed = json.loads(script.OUTPUT.read_text())
    assert live["fields"] == committed["fields"], "run hack/corev1-schemas.py"
    assert live["definitions"] == committed["definitions"], "run hack/corev1-schemas.py"


def test_the_operator_renders_the_typed_fields_into_the_pods_it_creates(
    kube: Kube, operator: OperatorProcess, namespace: str, model_dir: Callable[..., Path]
) -> None:
    core = kube.core
    core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="runtime-env"), data={"LOG_LEVEL": "info"})
    )
    core.create_namespaced_secret(
        namespace, client.V1Secret(metadata=client.V1ObjectMeta(name="registry"), string_data={"token": "x"})
    )
    fields = {
        **FULL_SPEC_FIELDS,
        # emptyDir only: the probe runs on the test agent, which mounts those (the PVC case is
        # the missing-reference test's).
        "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}],
        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
        "nodeSelector": CPU_POOL,
    }
    kube.create_mmp(namespace, "typed", make_spec(model_dir("llava"), **fields))
    deployment = wait_for(
        lambda: next(iter(kube.deployments(namespace)), None),
        # The first probe of a session imports the ML stack cold on a shared machine.
        300,
        what="the runtime Deployment",
        describe=lambda: (kube.get_mmp(namespace, "typed").get("status") or {}).get("conditions"),
    )
    template = deployment.spec.template
    pod = template.spec
    container = pod.containers[0]
    assert template.metadata.labels["team"] == "vision"
    assert template.metadata.labels["app.kubernetes.io/managed-by"] == "mmprep-operator"
    assert template.metadata.annotations == {"example.com/owner": "vision-team"}
    assert [s.name for s in pod.image_pull_secrets] == ["registry"]
    assert pod.volumes[0].empty_dir.size_limit == "1Gi"
    assert [(e.config_map_ref and e.config_map_ref.name, e.secret_ref and e.secret_ref.name) for e in container.env_from] == [
        ("runtime-env", None),
        (None, "hub-token"),
    ]
    assert container.env[1].value_from.field_ref.field_path == "metadata.name"
    assert pod.security_context.supplemental_groups == [1000] and pod.security_context.run_as_non_root is True
    assert container.security_context.se_linux_options.level == "s0:c123,c456"
    assert container.security_context.read_only_root_filesystem is True
    assert container.resources.requests == {"cpu": "500m", "memory": "2Gi"}
    assert [(m.name, m.mount_path) for m in container.volume_mounts if m.name == "scratch"] == [("scratch", "/scratch")]
    assert [(t.key, t.operator, t.effect) for t in pod.tolerations or []] == [("nvidia.com/gpu", "Exists", "NoSchedule")]
    [anti] = pod.affinity.pod_anti_affinity.preferred_during_scheduling_ignored_during_execution
    assert (anti.weight, anti.pod_affinity_term.topology_key) == (10, "kubernetes.io/hostname")
    command = container.command
    flags = {
        "--served-model-name": "qwen",
        "--max-model-len": "8192",
        "--deadline": "12.5",
        "--queue-size": "8",
        "--max-images": "4",
        "--max-body-bytes": "8388608",
        "--fetch-allowed-networks": "10.0.0.0/8,fd00::/8",
    }
    assert {flag: command[command.index(flag) + 1] for flag in flags if flag in command} == flags, command

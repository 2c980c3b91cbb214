"""The local control plane is what hack/cluster-up.sh promises: real TLS, RBAC, ServiceAccount
tokens, the simulated GPU nodes of hack/nodes.yaml, and an idempotent start."""

from __future__ import annotations

import subprocess
import time

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.kube import AGENT_NODE, HACK, NODES_FILE, Cluster, Kube, wait_for

pytestmark = pytest.mark.cluster


def test_a_second_cluster_up_is_a_quick_no_op(cluster: Cluster) -> None:
    started = time.monotonic()
    done = subprocess.run([str(HACK / "cluster-up.sh")], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(cluster.kubeconfig)
    assert "already up" in done.stderr
    assert time.monotonic() - started < 10


def test_the_simulated_nodes_carry_gpu_labels_and_capacity(kube: Kube) -> None:
    wanted = {d["metadata"]["name"]: d for d in yaml.safe_load_all(NODES_FILE.read_text()) if d}
    nodes = {n.metadata.name: n for n in kube.core.list_node(label_selector="mmprep.dev/simulated=true").items}
    assert set(wanted) <= set(nodes)
    for name, doc in wanted.items():
        node = nodes[name]
        assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions), name
        assert node.metadata.labels.get("nvidia.com/gpu.product") == doc["metadata"]["labels"].get("nvidia.com/gpu.product")
        assert node.status.allocatable.get("nvidia.com/gpu") == doc["status"]["allocatable"].get("nvidia.com/gpu")
    agent = kube.core.read_node(AGENT_NODE)
    assert agent.metadata.labels["mmprep.dev/test-agent"] == "true"
    assert [(t.key, t.effect) for t in agent.spec.taints] == [("mmprep.dev/test-agent", "NoSchedule")]
    # KWOK manages only the annotated simulated nodes: the agent's node status is the agent's own.
    assert agent.status.node_info.kubelet_version.endswith("mmprep-test-agent")
    assert all(n.status.node_info.kubelet_version.endswith("kwok") for n in nodes.values())


def test_rbac_and_serviceaccount_tokens_are_enforced(cluster: Cluster, kube: Kube, namespace: str) -> None:
    kube.core.create_namespaced_service_account(namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="reader")))
    token = kube.core.create_namespaced_service_account_token(
        "reader",
        namespace,
        client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600)),
    ).status.token
    config = client.Configuration()
    config.host = kube.api.configuration.host
    config.ssl_ca_cert = kube.api.configuration.ssl_ca_cert
    config.api_key = {"authorization": f"Bearer {token}"}
    with client.ApiClient(config) as as_reader:
        core = client.CoreV1Api(as_reader)

        def status_of_listing_pods() -> int:
            try:
                core.list_namespaced_pod(namespace)
            except ApiException as exc:
                return exc.status
            return 200

        # 401 until the API server's cache knows the new ServiceAccount; then authenticated (the
        # token is real) but not authorized (RBAC): 403.
        wait_for(lambda: status_of_listing_pods() == 403, 30, what="403 for a token without a role")
        # Grant exactly "list pods here", and only that works.
        rbac = client.RbacAuthorizationV1Api(kube.api)
        rbac.create_namespaced_role(
            namespace, {"metadata": {"name": "pods"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]}
        )
        rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": "reader-pods"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods"},
                "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
            },
        )
        # RBAC's authorizer cache follows the new binding within moments.
        wait_for(lambda: status_of_listing_pods() == 200, 30, what="the role binding to take effect")
        with pytest.raises(ApiException) as still_denied:
            core.list_node()
        assert still_denied.value.status == 403


def test_the_api_server_refuses_anonymous_and_untrusted_clients(cluster: Cluster, kube: Kube) -> None:
    host = kube.api.configuration.host
    # No client certificate and no token: anonymous, which RBAC does not let list anything.
    anonymous = subprocess.run(
        ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}",
         "--cacert", kube.api.configuration.ssl_ca_cert, f"{host}/api/v1/nodes"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert anonymous.stdout in ("401", "403"), anonymous
    # Without the cluster CA the serving certificate is not trusted: TLS is real.
    untrusted = subprocess.run(["curl", "-sS", f"{host}/version"], capture_output=True, text=True, timeout=30, check=False)
    assert untrusted.returncode != 0 and "certificate" in untrusted.stderr.lower(), untrusted

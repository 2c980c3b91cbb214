"""Tenant RBAC on the real local control plane: namespace users bound to Kubernetes' built-in
`edit` and `view` roles use MultimodalPreprocessors through the chart's aggregated ClusterRoles
(charts/mmprep/templates/rbac-tenants.yaml), and only in the namespaces their bindings name.

The users are ServiceAccounts with TokenRequest tokens and RoleBindings to the built-in roles, as a
platform team would bind a tenant; the rights reach them only through the clusterrole-aggregation
controller of the real kube-controller-manager, and leave with `helm uninstall`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client
from support.chart_cluster import api_for, forbidden, installed_chart, token_kubeconfig
from support.kube import GROUP, PLURAL, VERSION, Cluster, Kube, wait_for

pytestmark = pytest.mark.cluster

SPEC = {"model": {"path": "/models/qwen2-vl"}, "replicas": 1}


def _tenant(cluster: Cluster, kube: Kube, namespace: str, role: str, path: Path) -> Kube:
    """A ServiceAccount bound to the built-in ClusterRole ``role`` in ``namespace`` only."""
    name = f"tenant-{role}"
    kube.core.create_namespaced_service_account(namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name)))
    binding = client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name=name),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=role),
        subjects=[client.RbacV1Subject(kind="ServiceAccount", name=name, namespace=namespace)],
    )
    client.RbacAuthorizationV1Api(kube.api).create_namespaced_role_binding(namespace, binding)
    return api_for(token_kubeconfig(cluster, kube, namespace, name, path))


def _allowed(user: Kube, verb: str, namespace: str, resource: str = PLURAL) -> bool:
    review = client.V1SelfSubjectAccessReview(
        spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(group=GROUP, resource=resource, verb=verb, namespace=namespace)
        )
    )
    return bool(client.AuthorizationV1Api(user.api).create_self_subject_access_review(review).status.allowed)


def _body(name: str) -> dict[str, object]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "MultimodalPreprocessor", "metadata": {"name": name}, "spec": SPEC}


def test_users_bound_to_edit_and_view_use_the_resource_through_the_charts_aggregated_roles(
    cluster: Cluster, crd: str, kube: Kube, private_namespace: str, other_namespace: str, tmp_path: Path
) -> None:
    namespace = private_namespace
    editor = _tenant(cluster, kube, namespace, "edit", tmp_path / "edit.kubeconfig")
    viewer = _tenant(cluster, kube, namespace, "view", tmp_path / "view.kubeconfig")
    # Without the chart, the built-in roles know nothing of the resource (a release of an earlier
    # test may still be leaving the aggregated roles: wait until it has).
    wait_for(lambda: not _allowed(editor, "create", namespace), 60, what="edit without mmprep's rules")
    assert forbidden(lambda: editor.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _body("before")))

    with installed_chart(cluster, namespace, {"watchNamespaces": [namespace], "replicaCount": 0}):
        wait_for(lambda: _allowed(editor, "create", namespace) and _allowed(viewer, "list", namespace), 60, what="aggregation")
        custom = editor.custom
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _body("tenant"))
        assert [
            o["metadata"]["name"] for o in custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
        ] == ["tenant"]
        patched = custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "tenant", {"spec": {"replicas": 2}})
        assert patched["spec"]["replicas"] == 2
        # `kubectl scale mmp` goes through the scale subresource.
        scaled = custom.patch_namespaced_custom_object_scale(
            GROUP, VERSION, namespace, PLURAL, "tenant", {"spec": {"replicas": 3}}
        )
        assert scaled["spec"]["replicas"] == 3
        custom.get_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "tenant")
        # Status is the operator's to write, and other namespaces are not the tenant's.
        assert forbidden(
            lambda: custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "tenant", {"status": {}})
        )
        assert forbidden(lambda: custom.create_namespaced_custom_object(GROUP, VERSION, other_namespace, PLURAL, _body("x")))
        assert forbidden(lambda: custom.list_namespaced_custom_object(GROUP, VERSION, other_namespace, PLURAL))

        # view: read, never write.
        seen = viewer.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "tenant")
        assert seen["spec"]["replicas"] == 3
        viewer.custom.get_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "tenant")
        assert forbidden(lambda: viewer.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _body("v")))
        assert forbidden(
            lambda: viewer.custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, "tenant", {"spec": {"replicas": 1}}
            )
        )
        assert forbidden(lambda: viewer.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "tenant"))

        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "tenant")

    # The rights came from the chart: they leave with it.
    wait_for(lambda: not _allowed(editor, "create", namespace) and not _allowed(viewer, "get", namespace), 60, what="roles gone")

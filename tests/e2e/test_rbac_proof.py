"""RBAC proven on the real local control plane: the chart's rights are enough, and no more.

The chart is installed with Helm (namespace-scoped: one watched namespace). The operator then
runs as a real process whose only credential is a TokenRequest token of the chart's
ServiceAccount, with the policy file from the chart's ConfigMap, exactly as the chart's pod would.
(The chart's Deployment is scaled to 0 here: this control plane runs no images; the image itself
is run with the same token in test_docker_images.py.)

What is enforced, and by what:
- by RBAC: no Secrets anywhere; nodes read-only; nothing at all on Deployments, Jobs, Services or
  pods outside the watched namespace; no RBAC objects (no escalation);
- by the operator's code, not RBAC: inside a watched namespace, RBAC cannot tell the operator's
  Deployments from others' (Kubernetes RBAC has no owner condition), so the operator only prunes
  Deployments it owns (ownerReference with its resource's uid) and does not overwrite a
  same-named one another owner controls (NameConflict). Both tested below.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.chart_cluster import api_for, forbidden, foreign_deployment, full_reconcile, installed_chart, wait_until_granted
from support.kube import Cluster, Kube, wait_for
from support.operator_process import OperatorProcess

from mmprep_operator.logic import identity

pytestmark = pytest.mark.cluster


def test_operator_with_only_the_charts_token_reconciles_fully_and_nothing_more(
    cluster: Cluster,
    crd: str,
    kube: Kube,
    private_namespace: str,
    other_namespace: str,
    model_dir: Callable[..., Path],
    tmp_path: Path,
) -> None:
    namespace = private_namespace  # watched by this test's operator only
    model = model_dir("qwen2-vl")
    with installed_chart(cluster, namespace, {"watchNamespaces": [namespace], "replicaCount": 0}) as release:
        # The install's NOTES tell the user where the operator watches and how to upgrade CRDs.
        assert f"in: {namespace}." in release.notes and "kubectl apply --server-side -f" in release.notes, release.notes
        _operator_pod_passes_the_restricted_pod_security_standard(kube, namespace, release.operator_name)
        token_config = release.token_kubeconfig(kube, tmp_path / "sa.kubeconfig")
        wait_until_granted(token_config, namespace)
        policy = tmp_path / "policy.yaml"
        policy.write_text(release.policy_text(kube))
        sa_cluster = Cluster(kubeconfig=token_config, bin_dir=cluster.bin_dir, state_dir=cluster.state_dir)
        # As the chart's pod runs it: one namespace, the chart's policy file, the SA's token, and
        # the chart's leader election (its Lease in the release namespace, under the release's name).
        election = [
            "--leader-election",
            f"--leader-election-id={release.operator_name}",
            "--leader-election-namespace",
            namespace,
        ]
        operator = OperatorProcess(
            sa_cluster,
            log_dir=tmp_path,
            namespaces=[namespace],
            policy_file=policy,
            extra_args=["--log-format", "text", *election],
        )
        operator.start()
        try:
            obj = full_reconcile(kube, namespace, model)
            _operator_leaves_what_it_does_not_own(kube, namespace, obj)
            log = operator.tail(400)
            # A whole-number 403 only: resource versions and ports contain "403" too, and so does a
            # line's own time (",403" milliseconds), which is left out of the search.
            messages = [re.sub(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", "", line) for line in log.splitlines()]
            denied = [line for line in messages if "Forbidden" in line or re.search(r"(?<![\w.])403(?![\w.])", line)]
            assert not denied, "the operator hit a permission it lacks:\n" + "\n".join(denied)
            # This process did the work (not some other operator watching the same cluster).
            assert "probe job created" in log and namespace in log, log
            assert "took the leader Lease" in log, log
        finally:
            operator.stop()

        sa = api_for(token_config)
        # Sanity: the token works, so the 403s below are RBAC answers, not a broken credential.
        assert sa.core.list_node().items
        assert sa.apps.list_namespaced_deployment(namespace).items

        node = kube.core.list_node().items[0].metadata.name
        foreign = foreign_deployment("not-ours", {"team": "someone-else"})
        kube.apps.create_namespaced_deployment(other_namespace, foreign)
        dry = "All"  # a permitted call would change nothing; a forbidden one is refused first
        refused = {
            "delete a node": lambda: sa.core.delete_node(node, dry_run=dry),
            "label a node": lambda: sa.core.patch_node(node, {"metadata": {"labels": {"x": "y"}}}, dry_run=dry),
            "list Secrets in its namespace": lambda: sa.core.list_namespaced_secret(namespace),
            "read a Secret": lambda: sa.core.read_namespaced_secret("any", namespace),
            "list Secrets cluster-wide": lambda: sa.core.list_secret_for_all_namespaces(),
            "read a Deployment elsewhere": lambda: sa.apps.read_namespaced_deployment("not-ours", other_namespace),
            "patch a Deployment elsewhere": lambda: sa.apps.patch_namespaced_deployment(
                "not-ours", other_namespace, {"spec": {"replicas": 1}}, dry_run=dry
            ),
            "delete a Deployment elsewhere": lambda: sa.apps.delete_namespaced_deployment(
                "not-ours", other_namespace, dry_run=dry
            ),
            "create a Deployment elsewhere": lambda: sa.apps.create_namespaced_deployment(
                other_namespace, foreign_deployment("new", {}), dry_run=dry
            ),
            "create a Job elsewhere": lambda: sa.batch.list_namespaced_job(other_namespace),
            "read another Lease": lambda: client.CoordinationV1Api(sa.api).read_namespaced_lease("kube-scheduler", namespace),
            "create a Lease elsewhere": lambda: client.CoordinationV1Api(sa.api).create_namespaced_lease(
                other_namespace,
                client.V1Lease(metadata=client.V1ObjectMeta(name=release.operator_name)),
                dry_run=dry,
            ),
            "create a pod": lambda: sa.core.create_namespaced_pod(
                namespace, client.V1Pod(metadata=client.V1ObjectMeta(name="p"), spec=foreign.spec.template.spec), dry_run=dry
            ),
            "grant itself a role": lambda: client.RbacAuthorizationV1Api(sa.api).create_cluster_role_binding(
                client.V1ClusterRoleBinding(
                    metadata=client.V1ObjectMeta(name="escalate"),
                    role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="cluster-admin"),
                    subjects=[client.RbacV1Subject(kind="ServiceAccount", name=release.service_account, namespace=namespace)],
                ),
                dry_run=dry,
            ),
        }
        allowed = [what for what, call in refused.items() if not forbidden(call)]
        assert not allowed, f"the chart's ServiceAccount may: {allowed}"
        # The foreign Deployment elsewhere is untouched.
        assert kube.apps.read_namespaced_deployment("not-ours", other_namespace).spec.replicas == 0


def _operator_pod_passes_the_restricted_pod_security_standard(kube: Kube, namespace: str, deployment: str) -> None:
    """The chart's operator pod, admitted by Pod Security Admission in enforce=restricted mode.

    Server-side dry run: admission runs in full, nothing is created. The negative control shows
    the namespace really enforces (the same pod allowed to escalate privileges is refused)."""
    template = kube.apps.read_namespaced_deployment(deployment, namespace).spec.template
    pod = client.V1Pod(metadata=client.V1ObjectMeta(name="pss-check", labels=template.metadata.labels), spec=template.spec)
    kube.core.create_namespaced_pod(namespace, pod, dry_run="All")
    pod.spec.containers[0].security_context.allow_privilege_escalation = True
    try:
        kube.core.create_namespaced_pod(namespace, pod, dry_run="All")
    except ApiException as exc:
        assert exc.status == 403 and "restricted" in str(exc.body), exc.body  # noqa: PT017 - the else says why no refusal fails
    else:
        raise AssertionError("the namespace does not enforce the restricted standard; the check above proves nothing")


def _operator_leaves_what_it_does_not_own(kube: Kube, namespace: str, obj: dict) -> None:
    """A Deployment carrying the resource's labels but not owned by it survives a reconcile.

    RBAC allows deleting it (same namespace); the operator's prune checks ownerReferences.
    """
    labels = dict(kube.apps.read_namespaced_deployment(obj["status"]["pools"][0]["deployment"], namespace).metadata.labels)
    kube.apps.create_namespaced_deployment(namespace, foreign_deployment("lookalike", labels))
    generation = kube.patch_mmp(namespace, obj["metadata"]["name"], {"spec": {"replicas": 2}})["metadata"]["generation"]
    wait_for(
        lambda: (kube.get_mmp(namespace, obj["metadata"]["name"]).get("status") or {}).get("observedGeneration") == generation,
        120,
        what="the operator to reconcile the new generation",
    )
    lookalike = kube.apps.read_namespaced_deployment("lookalike", namespace)
    assert lookalike.metadata.deletion_timestamp is None
    assert lookalike.spec.replicas == 0 and not lookalike.metadata.owner_references


def test_operator_leaves_a_same_named_deployment_it_does_not_own_and_says_so(
    kube: Kube, operator: object, namespace: str, model_dir: Callable[..., Path]
) -> None:
    """RBAC cannot protect a Deployment in a watched namespace from the operator; its code must:
    it does not overwrite an object another owner controls, and reports NameConflict instead."""
    from support.chart_cluster import make_spec

    name = "takeover"
    owner = identity.Owner(name=name, namespace=namespace)
    taken = identity.deployment_name(owner, "cpu")
    # Someone else's Deployment with the very name and pod selector the operator would use (so the
    # operator's apply is not refused anyway for changing an immutable selector).
    foreign = foreign_deployment(taken, {"team": "someone-else"})
    selector = {identity.LABEL_RESOURCE: identity.pool_labels(owner, "cpu")[identity.LABEL_RESOURCE], identity.LABEL_POOL: "cpu"}
    foreign.spec.selector.match_labels = selector
    foreign.spec.template.metadata.labels = selector
    kube.apps.create_namespaced_deployment(namespace, foreign)
    kube.create_mmp(namespace, name, make_spec(model_dir("qwen2-vl")))

    def conflict_reported() -> dict | None:
        conditions = (kube.get_mmp(namespace, name).get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c.get("reason") == "NameConflict"), None)

    reported = wait_for(
        conflict_reported, 120, what="a NameConflict condition", describe=lambda: kube.get_mmp(namespace, name).get("status")
    )
    assert taken in reported["message"], reported
    theirs = kube.apps.read_namespaced_deployment(taken, namespace)
    assert not theirs.metadata.owner_references, "the operator adopted a Deployment it did not create"
    assert theirs.metadata.labels == {"team": "someone-else"} and theirs.spec.replicas == 0


@pytest.mark.parametrize("scope", ["all-namespaces", "watched-namespace"])
def test_every_object_the_chart_renders_is_valid_for_the_real_api_server(
    cluster: Cluster, crd: str, private_namespace: str, scope: str
) -> None:
    """Server-side dry run of the chart's objects (schemas of the real API server, RBAC objects
    included; the monitoring kinds need the Prometheus Operator's CRDs, absent here)."""
    import yaml
    from support.packaging_support import template

    values: dict = {"policy": {"overrides": [{"gpuFamily": "blackwell", "path": "gpu", "processor": 1}]}}
    if scope == "watched-namespace":
        values["watchNamespaces"] = [private_namespace]
    rendered = template(values, namespace=private_namespace, release=f"dry-{uuid.uuid4().hex[:5]}")
    done = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(rendered))
    applied = [line for line in done.stdout.splitlines() if "(server dry run)" in line]
    assert len(applied) == len(rendered), done.stdout

"""The Helm chart, rendered and linted with the real `helm` (no cluster needed).

What the chart must keep true: the operator's RBAC is exactly the list the operator itself
declares (`mmprep-operator rbac`), the CRDs are what the models generate, the policy values are
accepted by the operator's own policy parser, the pod passes the restricted Pod Security Standard,
and the alerts use metric names the runtime really exports.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from support.packaging_support import (
    CHART,
    VERSION,
    helm,
    normalized_rules,
    objects,
    one,
    operator_cli,
    template,
    template_error,
)

from mmprep_operator.logic import identity
from mmprep_runtime import errors

ALL_FEATURES = {
    "serviceMonitor": {"enabled": True},
    "prometheusRule": {"enabled": True},
    "watchNamespaces": ["team-a", "team-b"],
    "policy": {"overrides": [{"gpuFamily": "blackwell", "path": "gpu", "processor": 1}]},
    "vllmRenderImage": {"repository": "mmprep-runtime-vllm"},
}


@pytest.mark.parametrize("values", [{}, ALL_FEATURES], ids=["defaults", "all-features"])
def test_helm_lint_passes_strictly(values: dict, tmp_path: Path) -> None:
    f = tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump(values))
    done = helm("lint", str(CHART), "--strict", "--kube-version", "1.35.4", "-f", str(f))
    assert "0 chart(s) failed" in done.stdout


def test_default_install_renders_the_operator_and_its_rights_only() -> None:
    rendered = template()
    kinds = sorted(o["kind"] for o in rendered)
    assert kinds == sorted(
        [
            "ServiceAccount",
            "ConfigMap",
            "ClusterRole",
            "ClusterRole",
            "ClusterRole",  # the tenants' roles, aggregated into edit and view (test_chart_values.py)
            "ClusterRole",
            "ClusterRoleBinding",
            "ClusterRoleBinding",
            "Service",
            "Deployment",
            # leader election: its Role and binding in the release namespace, and the replicas' budget
            "Role",
            "RoleBinding",
            "PodDisruptionBudget",
        ]
    )
    assert [b["metadata"]["name"] for b in objects(rendered, "RoleBinding")] == ["mmprep-operator-leader-election"]


def test_operator_pod_meets_the_restricted_pod_security_standard() -> None:
    deployment = one(template(), "Deployment")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert container["image"] == f"mmprep-operator:{VERSION}"
    assert container["resources"]["limits"]["memory"]
    # The writable places a read-only root filesystem leaves: /tmp, and the policy mount.
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert set(mounts) == {"/tmp", "/etc/mmprep"}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    port_names = {p["name"] for p in container["ports"]}
    assert container["livenessProbe"]["httpGet"]["port"] in port_names


def test_operator_arguments_are_accepted_by_the_operator_cli() -> None:
    """Every flag the chart passes exists in `mmprep-operator run` (a typo would crash-loop the pod)."""
    (container,) = one(template(ALL_FEATURES), "Deployment")["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[0] == "run"
    run_help = operator_cli("run", "--help")
    for flag in {a.split("=", 1)[0] for a in args[1:] if a.startswith("--")}:
        assert re.search(rf"(^|\s|,){re.escape(flag)}\b", run_help), f"`mmprep-operator run` has no {flag}"


def test_policy_values_are_accepted_by_the_operators_policy_parser(tmp_path: Path) -> None:
    from mmprep_operator.api.policy import load_policy

    values = {
        "runtimeImage": {"repository": "registry.example/mmprep-runtime", "tag": "1.2.3", "pullPolicy": "Always"},
        "vllmRenderImage": {"repository": "registry.example/mmprep-runtime-vllm", "tag": "1.2.3"},
        "policy": {
            "overrides": [
                {"gpuFamily": "blackwell", "path": "gpu", "processor": 1},
                {"gpuProduct": "NVIDIA-H200", "path": "cpu", "processor": 4},
            ],
            "probe": {"timeoutSeconds": 120, "backoffLimit": 0, "ttlSecondsAfterFinished": 60},
        },
    }
    configmap = one(template(values), "ConfigMap", "-policy")
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(configmap["data"]["policy.yaml"])
    policy = load_policy(policy_file)  # strict: an unknown key is an error
    assert policy.default_image == "registry.example/mmprep-runtime:1.2.3"
    assert policy.vllm_render_image == "registry.example/mmprep-runtime-vllm:1.2.3"
    assert policy.image_pull_policy == "Always"
    assert [(o.gpu_family, o.gpu_product, o.path, o.processor) for o in policy.overrides] == [
        ("blackwell", None, "gpu", 1),
        (None, "NVIDIA-H200", "cpu", 4),
    ]
    assert policy.probe.timeout_seconds == 120
    # The pod reads the file the ConfigMap holds, and restarts when it changes.
    deployment = one(template(values), "Deployment")
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert "--policy-file=/etc/mmprep/policy.yaml" in container["args"]
    assert (
        pod["metadata"]["annotations"]["checksum/policy"]
        != one(template(), "Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/policy"]
    )


def test_runtime_image_defaults_to_the_chart_app_version() -> None:
    from mmprep_operator.api.policy import OperatorPolicy

    configmap = one(template(), "ConfigMap", "-policy")
    data = yaml.safe_load(configmap["data"]["policy.yaml"])
    assert data["defaultImage"] == f"mmprep-runtime:{VERSION}"
    # The same image the operator uses when no policy file is given.
    assert OperatorPolicy().default_image == data["defaultImage"]


def test_chart_rbac_grants_exactly_the_operators_rules() -> None:
    declared = normalized_rules(yaml.safe_load(operator_cli("rbac"))["rules"])
    for values in ({}, ALL_FEATURES):
        rendered = template(values)
        granted = set()
        for role in objects(rendered, "ClusterRole"):
            if "-operator" in role["metadata"]["name"]:  # not the tenants' aggregated roles
                granted |= normalized_rules(role["rules"])
        assert granted == declared, f"values {values}: extra {granted - declared}, missing {declared - granted}"


def test_rbac_is_least_privilege() -> None:
    triples = normalized_rules(yaml.safe_load(operator_cli("rbac"))["rules"])
    assert not [t for t in triples if "*" in t], "wildcards in RBAC"
    assert not [t for t in triples if t[1] in {"secrets", "configmaps"}], "the operator must not read Secrets or ConfigMaps"
    for resource in ("nodes", "pods", "namespaces", "customresourcedefinitions", "apiservices"):
        verbs = {v for _, r, v in triples if r == resource}
        assert verbs <= {"get", "list", "watch"}, f"{resource} must be read-only, got {verbs}"
    # Detecting metrics-server reads its one APIService, by name.
    (apiservices,) = [r for r in yaml.safe_load(operator_cli("rbac"))["rules"] if "apiservices" in r["resources"]]
    assert apiservices["resourceNames"] == ["v1beta1.metrics.k8s.io"] and apiservices["verbs"] == ["get"]
    assert {v for _, r, v in triples if r == "events"} <= {"get", "list", "watch", "create", "patch"}


def test_watched_namespaces_confine_namespaced_rights_to_those_namespaces() -> None:
    rendered = template({"watchNamespaces": ["team-a", "team-b"]}, namespace="mmprep-system")
    namespaced_role = one(rendered, "ClusterRole", "-operator")
    cluster_role = one(rendered, "ClusterRole", "-operator-cluster")
    # Cluster-wide: only cluster-scoped resources, read-only.
    assert {r for _, r, _ in normalized_rules(cluster_role["rules"])} <= {
        "nodes",
        "namespaces",
        "customresourcedefinitions",
        "apiservices",
    }
    # The triples leave resourceNames out: the chart must keep them (the metrics APIService only).
    assert [r["resourceNames"] for r in cluster_role["rules"] if "apiservices" in r["resources"]] == [["v1beta1.metrics.k8s.io"]]
    cluster_bindings = objects(rendered, "ClusterRoleBinding")
    assert [b["roleRef"]["name"] for b in cluster_bindings] == [cluster_role["metadata"]["name"]]
    # Deployments, Jobs, Services, pods, Events, the resources: only in the watched namespaces.
    bindings = watch_bindings(rendered)
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    assert {b["roleRef"]["name"] for b in bindings} == {namespaced_role["metadata"]["name"]}
    for b in bindings:
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "mmprep-operator", "namespace": "mmprep-system"}]
    (container,) = one(rendered, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [a for a in container["args"] if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]
    assert "--all-namespaces" not in container["args"]


def test_watch_release_namespace_adds_it_once() -> None:
    rendered = template({"watchNamespaces": ["team-a"], "watchReleaseNamespace": True}, namespace="mmprep-system")
    assert sorted(b["metadata"]["namespace"] for b in watch_bindings(rendered)) == ["mmprep-system", "team-a"]


def watch_bindings(rendered: list[dict]) -> list[dict]:
    """The RoleBindings of the watched namespaces (not leader election's, in the release namespace)."""
    return [b for b in objects(rendered, "RoleBinding") if not b["metadata"]["name"].endswith("-leader-election")]


def test_all_namespaces_binds_both_roles_cluster_wide() -> None:
    rendered = template()
    roles = {r["metadata"]["name"] for r in objects(rendered, "ClusterRole") if "-operator" in r["metadata"]["name"]}
    assert {b["roleRef"]["name"] for b in objects(rendered, "ClusterRoleBinding")} == roles
    (container,) = one(rendered, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--all-namespaces" in container["args"]


def test_replicas_share_one_lease_roll_without_a_gap_and_keep_one_up_during_drains() -> None:
    rendered = template()
    deployment = one(rendered, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    (container,) = spec["template"]["spec"]["containers"]
    lease = f"--leader-election-id={deployment['metadata']['name']}"
    assert "--leader-election" in container["args"] and lease in container["args"]
    assert {e["name"] for e in container["env"]} >= {"POD_NAME", "POD_NAMESPACE"}
    (spread,) = spec["template"]["spec"]["topologySpreadConstraints"]
    assert spread["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]
    (pdb,) = objects(rendered, "PodDisruptionBudget")
    assert pdb["spec"] == {"minAvailable": 1, "selector": spec["selector"]}
    # The Lease is the operator's to renew in its own namespace only, and only under its name.
    (role,) = [r for r in objects(rendered, "Role") if r["metadata"]["name"].endswith("-leader-election")]
    assert role["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    named = [r for r in role["rules"] if "resourceNames" in r]
    assert named and all(r["resourceNames"] == [deployment["metadata"]["name"]] for r in named)
    (binding,) = [b for b in objects(rendered, "RoleBinding") if b["metadata"]["name"].endswith("-leader-election")]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]

    single = template({"replicaCount": 1, "operator": {"leaderElection": {"enabled": False}}})
    spec = one(single, "Deployment")["spec"]
    assert spec["strategy"] == {"type": "Recreate"}
    assert "--leader-election" not in spec["template"]["spec"]["containers"][0]["args"]
    assert not objects(single, "PodDisruptionBudget")


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"watchNamespace": ["typo"]}, "watchNamespace"),
        ({"policy": {"overrides": [{"gpuFamily": "hopper", "processor": 0}]}}, "processor"),
        ({"policy": {"overrides": [{"gpuFamily": "hopper", "gpuProduct": "NVIDIA-H200", "processor": 2}]}}, "oneOf"),
        ({"replicaCount": 11}, "replicaCount"),
        ({"replicaCount": 2, "operator": {"leaderElection": {"enabled": False}}}, "needs operator.leaderElection.enabled"),
        ({"watchNamespaces": ["Not_A_Namespace"]}, "watchNamespaces"),
        ({"image": {"repository": "x", "pullPolicy": "Sometimes"}}, "pullPolicy"),
    ],
    ids=[
        "unknown-key",
        "zero-workers",
        "product-and-family",
        "too-many-replicas",
        "replicas-without-lease",
        "bad-namespace",
        "bad-pull-policy",
    ],
)
def test_values_schema_rejects_bad_values_with_the_field_named(values: dict, complaint: str) -> None:
    assert complaint in template_error(values)


def test_runtime_service_monitor_selects_the_services_the_operator_renders() -> None:
    from mmprep_operator.logic import manifests

    rendered = template({"serviceMonitor": {"enabled": True}})
    monitor = one(rendered, "ServiceMonitor", "-runtime")
    service = manifests.service(identity.Owner(name="demo", namespace="ns", uid="u"))
    labels = service["metadata"]["labels"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items(), f"{selector} does not select {labels}"
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    # The pool label the alerts group by is on every runtime pod.
    deployment_labels = identity.pool_labels(identity.Owner(name="demo", namespace="ns", uid="u"), "h200")
    assert set(monitor["spec"]["podTargetLabels"]) <= set(deployment_labels)


def _exported_runtime_metric_names() -> set[str]:
    """Sample names a runtime server exports, from its real metrics registry."""
    from prometheus_client.parser import text_string_to_metric_families

    from mmprep_runtime.server.metrics import Metrics

    metrics = Metrics()
    metrics.bind_live(in_flight=lambda: 0, queue_depth=lambda: 0, busy=lambda: 0, workers=2, busy_seconds=lambda: 0.0)
    metrics.queue_wait(0.01)
    text = metrics.render().decode()
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def test_alerts_use_metric_names_the_runtime_exports() -> None:
    rule = one(template({"prometheusRule": {"enabled": True}}), "PrometheusRule")
    exprs = [r["expr"] for g in rule["spec"]["groups"] if g["name"] == "mmprep-runtime" for r in g["rules"]]
    # Label names in `by (...)` (mmprep_dev_pool, from pod labels) are not metric names.
    without_labels = [re.sub(r"by\s*\([^)]*\)", "", e) for e in exprs]
    used = {m for e in without_labels for m in re.findall(r"\bmmprep_[a-z_]+\b", e)}
    assert used, "no runtime metric in the alert rules"
    exported = _exported_runtime_metric_names()
    assert used <= exported, f"alert rules use metrics the runtime does not export: {used - exported}"
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert "MmprepWorkersSaturated" in alerts
    # The served latency reads the histogram's outcome classes, and only ones the runtime uses.
    outcomes = {o for e in exprs for o in re.findall(r'outcome="([a-z_]+)"', e)}
    assert "ok" in outcomes and outcomes <= set(errors.OUTCOME_CLASSES), outcomes


def test_monitoring_objects_are_off_by_default() -> None:
    rendered = template()
    assert not objects(rendered, "ServiceMonitor") and not objects(rendered, "PrometheusRule")


def test_policy_values_schema_offers_exactly_the_operators_policy_keys() -> None:
    """values.schema.json's `policy` matches `mmprep-operator policy-schema` key for key.

    defaultImage, imagePullPolicy and vllmRenderImage are the exceptions: the chart derives them
    from runtimeImage and vllmRenderImage.
    """
    import json

    operator_schema = json.loads(operator_cli("policy-schema"))
    chart_schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["policy"]
    derived = {"defaultImage", "imagePullPolicy", "vllmRenderImage"}
    assert set(chart_schema["properties"]) == set(operator_schema["properties"]) - derived
    probe_ref = operator_schema["properties"]["probe"]["$ref"].rsplit("/", 1)[-1]
    assert set(chart_schema["properties"]["probe"]["properties"]) == set(operator_schema["$defs"][probe_ref]["properties"])
    override_ref = operator_schema["properties"]["overrides"]["items"]["$ref"].rsplit("/", 1)[-1]
    assert set(chart_schema["properties"]["overrides"]["items"]["properties"]) == set(
        operator_schema["$defs"][override_ref]["properties"]
    )


def test_chart_app_version_is_the_projects_version() -> None:
    """Image tags default to appVersion, and `make images` tags with the project's version."""
    from mmprep_operator import __version__

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == VERSION == __version__


def test_chart_packages_with_its_crds_schema_and_rbac_file(tmp_path: Path) -> None:
    """What a chart repository would serve: the packaged chart carries everything it needs."""
    import tarfile

    helm("package", str(CHART), "--destination", str(tmp_path))
    (package,) = tmp_path.glob("mmprep-*.tgz")
    with tarfile.open(package) as tar:
        names = set(tar.getnames())
    for needed in (
        "crds/multimodalpreprocessors.mmprep.dev.yaml",
        "values.schema.json",
        "files/operator-clusterrole.yaml",
        "templates/NOTES.txt",
    ):
        assert f"mmprep/{needed}" in names, f"{needed} missing from {package.name}"
    assert "0 chart(s) failed" in helm("lint", str(package), "--kube-version", "1.35.4").stdout

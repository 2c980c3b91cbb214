"""Chart values a user sets on a real cluster: their own registry, the tenants' roles, the NOTES
sample. Rendered with the real `helm`; the NOTES sample is also checked by the real API server."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import yaml
from support.kube import GROUP, PLURAL, VERSION, Cluster, Kube
from support.packaging_support import CHART, REPO, helm, objects, one, template

TENANT_EDIT = "-tenant-edit"
TENANT_VIEW = "-tenant-view"


def _images(rendered: list[dict]) -> tuple[str, str]:
    deployment = one(rendered, "Deployment")
    policy = yaml.safe_load(one(rendered, "ConfigMap")["data"]["policy.yaml"])
    return deployment["spec"]["template"]["spec"]["containers"][0]["image"], policy["defaultImage"]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, ("mmprep-operator:0.1.0", "mmprep-runtime:0.1.0")),
        (
            {"global": {"imageRegistry": "registry.example.com/ml"}},
            ("registry.example.com/ml/mmprep-operator:0.1.0", "registry.example.com/ml/mmprep-runtime:0.1.0"),
        ),
        (
            {"global": {"imageRegistry": "registry.example.com/ml/"}},
            ("registry.example.com/ml/mmprep-operator:0.1.0", "registry.example.com/ml/mmprep-runtime:0.1.0"),
        ),
        # A repository that names its own registry keeps it; a digest replaces the tag.
        (
            {
                "global": {"imageRegistry": "r.example"},
                "image": {"repository": "quay.io/team/op"},
                "runtimeImage": {"repository": "localhost:5000/rt", "digest": "sha256:" + "a" * 64},
            },
            ("quay.io/team/op:0.1.0", "localhost:5000/rt@sha256:" + "a" * 64),
        ),
        (
            {"global": {"imageRegistry": "r.example"}, "image": {"repository": "team/op"}},
            ("r.example/team/op:0.1.0", "r.example/mmprep-runtime:0.1.0"),
        ),
    ],
    ids=["defaults", "registry", "registry-trailing-slash", "own-registries-kept", "org-path-prefixed"],
)
def test_global_image_registry_prefixes_both_images_unless_they_name_a_registry(values: dict, expected: tuple[str, str]) -> None:
    assert _images(template(values)) == expected


def test_tenant_roles_aggregate_into_the_built_in_roles_and_bind_nothing() -> None:
    rendered = template()
    edit, view = one(rendered, "ClusterRole", TENANT_EDIT), one(rendered, "ClusterRole", TENANT_VIEW)
    labels = edit["metadata"]["labels"]
    assert labels["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert labels["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    # view reads only; edit never writes status (the operator's).
    assert {verb for rule in view["rules"] for verb in rule["verbs"]} == {"get", "list", "watch"}
    status_verbs = {v for rule in edit["rules"] if f"{PLURAL}/status" in rule["resources"] for v in rule["verbs"]}
    assert status_verbs == {"get"}
    assert all(rule["apiGroups"] == [GROUP] for rule in edit["rules"] + view["rules"])
    bound = {b["roleRef"]["name"] for kind in ("ClusterRoleBinding", "RoleBinding") for b in objects(rendered, kind)}
    assert not any(TENANT_EDIT in name or TENANT_VIEW in name for name in bound)


def test_tenant_roles_can_be_left_out() -> None:
    names = [o["metadata"]["name"] for o in objects(template({"rbac": {"aggregateToDefaultRoles": False}}), "ClusterRole")]
    assert not [n for n in names if "-tenant-" in n]


def _notes_sample(cluster: Cluster) -> dict:
    """The resource the install's NOTES tell a user to apply (rendered by a server-side dry run)."""
    done = helm(
        "install", "mmprep-notes", str(CHART), "--dry-run=server", "--namespace", "mmprep-system",
        "--set", "watchNamespaces[0]=team-a", env=cluster.env(), timeout=120,
    )  # fmt: skip
    notes = done.stdout.partition("NOTES:")[2]
    body = notes.split("<<'YAML'\n", 1)[1].split("\n  YAML", 1)[0]
    return dict(yaml.safe_load(textwrap.dedent(body)))


@pytest.mark.cluster
def test_the_notes_sample_mounts_its_model_volume_and_the_real_api_server_accepts_it(
    cluster: Cluster, crd: str, kube: Kube, private_namespace: str
) -> None:
    sample = _notes_sample(cluster)
    spec = sample["spec"]
    assert sample["metadata"]["namespace"] == "team-a"
    mounts = {m["name"]: m["mountPath"] for m in spec["volumeMounts"]}
    assert {v["name"] for v in spec["volumes"]} == set(mounts)
    assert any(spec["model"]["path"].startswith(path + "/") for path in mounts.values())
    sample["metadata"]["namespace"] = private_namespace
    created = kube.custom.create_namespaced_custom_object(GROUP, VERSION, private_namespace, PLURAL, sample, dry_run="All")
    assert created["spec"]["volumeMounts"] == sample["spec"]["volumeMounts"]


def test_the_values_schema_refuses_a_misspelled_new_key() -> None:
    assert template({"global": {"imageRegistry": "r.example"}, "rbac": {"aggregateToDefaultRoles": False}})
    with pytest.raises(AssertionError, match="aggregateToDefaultRole"):
        template({"rbac": {"aggregateToDefaultRole": True}})


def test_the_chart_readme_values_table_is_values_yamls() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "hack" / "chart" / "values_table.py"), "--check"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    readme = (CHART / "README.md").read_text()
    for key in (
        "global.imageRegistry",
        "rbac.aggregateToDefaultRoles",
        "policy.calibration.mode",
        "prometheusRule.queueWait.for",
    ):
        assert f"| `{key}` |" in readme
    assert "|  |" not in readme, "a value without a description in values.yaml"


def test_helm_test_hooks_create_the_resource_in_the_watched_namespace_with_rights_there_only() -> None:
    rendered = template({"watchNamespaces": ["team-a"]}, tests=True)
    pod = one(rendered, "Pod", "-helm-test")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["TEST_NAMESPACE"] == "team-a"
    assert json.loads(env["TEST_SPEC"])["model"]["path"] == "/models/qwen2-vl"
    role = one(rendered, "Role", "-helm-test")
    assert role["metadata"]["namespace"] == "team-a"
    assert role["rules"] == [{"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["create", "get", "delete"]}]
    assert pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    # An install creates none of it: the hooks exist only while `helm test` runs.
    assert not [o for o in template({"watchNamespaces": ["team-a"]}) if o["metadata"]["name"].endswith("-helm-test")]


def test_the_helm_test_script_is_valid_python() -> None:
    compile((CHART / "files" / "helm-test.py").read_text(), "helm-test.py", "exec")


def test_the_helm_test_pod_is_never_taken_for_an_operator_pod() -> None:
    rendered = template(tests=True)
    selector = one(rendered, "Deployment")["spec"]["selector"]["matchLabels"]
    pod_labels = one(rendered, "Pod", "-helm-test")["metadata"]["labels"]
    assert not selector.items() <= pod_labels.items(), "the operator's ReplicaSet would adopt the test pod"
    assert pod_labels["app.kubernetes.io/component"] == "helm-test"

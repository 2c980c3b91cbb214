"""Operator policy file, RBAC rules, names and the run command's flags."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from mmprep_operator.api import rbac
from mmprep_operator.api.policy import PolicyError, load_policy
from mmprep_operator.cli import build_parser
from mmprep_operator.logic import naming


def test_policy_file_with_overrides_and_probe_defaults(tmp_path: pathlib.Path) -> None:
    f = tmp_path / "policy.yaml"
    f.write_text(
        "defaultImage: site/mmprep-runtime:1\n"
        "overrides:\n- {gpuFamily: blackwell, path: gpu, processor: 1}\n- {gpuProduct: H200, processor: 4}\n"
        "probe: {timeoutSeconds: 120, backoffLimit: 0}\nresyncSeconds: 60\n"
    )
    policy = load_policy(f)
    assert policy.default_image == "site/mmprep-runtime:1"
    assert [(o.gpu_family, o.gpu_product, o.path, o.processor) for o in policy.overrides] == [
        ("blackwell", None, "gpu", 1),
        (None, "H200", None, 4),
    ]
    assert (policy.probe.timeout_seconds, policy.probe.backoff_limit, policy.resync_seconds) == (120, 0, 60)
    assert load_policy(None).probe.timeout_seconds == 300


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("defaultImge: x\n", "defaultImge"),  # a typo is an error, not a silently ignored key
        ("overrides:\n- {processor: 2}\n", "exactly one of gpuProduct and gpuFamily"),
        ("overrides:\n- {gpuFamily: hopper, processor: 65}\n", "less than or equal to 64"),
        ("- a\n", "must be a mapping"),
        ("a: [\n", "not valid YAML"),
    ],
)
def test_bad_policy_files_say_what_is_wrong(tmp_path: pathlib.Path, text: str, message: str) -> None:
    f = tmp_path / "policy.yaml"
    f.write_text(text)
    with pytest.raises(PolicyError, match=message.replace("[", r"\[")):
        load_policy(f)
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path / "absent.yaml")


def rules_for(resource: str, group: str = "") -> set[str]:
    verbs: set[str] = set()
    for rule in rbac.RULES:
        if resource in rule["resources"] and group in rule["apiGroups"]:
            verbs |= set(rule["verbs"])
    return verbs


def test_rbac_grants_what_the_operator_calls_and_no_wildcards() -> None:
    assert rules_for("nodes") == {"get", "list", "watch"}
    assert rules_for("pods") == {"get", "list", "watch"}
    assert {"create", "patch", "delete", "list", "watch"} <= rules_for("deployments", "apps")
    assert {"create", "patch", "get"} <= rules_for("jobs", "batch")
    assert {"patch"} <= rules_for("multimodalpreprocessors/status", "mmprep.dev")
    assert {"update"} <= rules_for("multimodalpreprocessors/finalizers", "mmprep.dev")
    assert {"get", "patch", "update"} <= rules_for("multimodalpreprocessors/scale", "mmprep.dev")
    assert {"create", "patch"} <= rules_for("events")
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in rbac.RULES)
    doc = yaml.safe_load(rbac.cluster_role_yaml())
    assert doc["kind"] == "ClusterRole" and doc["rules"] == rbac.RULES


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        (("qwen", "nvidia-h200"), "qwen-nvidia-h200"),
        (("My.Model", "cpu"), None),  # slugged: hashed
        (("1model",), None),  # must start with a letter
        (("a" * 80, "nvidia-gb300"), None),
    ],
)
def test_dns_labels_are_valid_deterministic_and_distinct(parts: tuple[str, ...], expected: str | None) -> None:
    name = naming.dns_label(*parts)
    assert len(name) <= 63 and name[0].isalpha() and name == naming.slug(name)
    assert name == naming.dns_label(*parts)
    if expected is not None:
        assert name == expected
    assert naming.dns_label("a.b") != naming.dns_label("a-b")


def test_label_values_are_cut_with_a_hash() -> None:
    assert naming.label_value("short") == "short"
    long = naming.label_value("x" * 100)
    assert len(long) <= 63 and long != naming.label_value("x" * 101)


def test_run_flags() -> None:
    args = build_parser().parse_args(
        ["run", "--namespace", "a", "-n", "b", "--policy-file", "p.yaml", "--metrics-port", "9", "--health-port", "10"]
    )
    assert (args.namespace, args.policy_file, args.metrics_port, args.liveness_port) == (["a", "b"], "p.yaml", 9, 10)
    args = build_parser().parse_args(["run", "--all-namespaces", "--liveness-port", "11"])
    assert args.all_namespaces and args.namespace is None and args.liveness_port == 11
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--all-namespaces", "--namespace", "x"])


def test_run_without_credentials_exits_2_with_one_line(tmp_path: pathlib.Path, monkeypatch, capsys) -> None:
    from mmprep_operator.cli import main

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["run", "--metrics-port", "0", "--liveness-port", "0"]) == 2
    err = capsys.readouterr().err
    assert "no usable Kubernetes credentials" in err and "Traceback" not in err
    assert main(["run", "--policy-file", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read policy file" in capsys.readouterr().err


def test_the_charts_rbac_file_is_what_the_operator_declares() -> None:
    committed = pathlib.Path(__file__).resolve().parents[3] / "charts" / "mmprep" / "files" / "operator-clusterrole.yaml"
    assert committed.read_text() == rbac.cluster_role_yaml(), (
        "charts/mmprep/files/operator-clusterrole.yaml drifted from `mmprep-operator rbac`; run `make chart-sync`"
    )


def test_the_charts_leader_election_role_is_what_the_operator_declares() -> None:
    committed = pathlib.Path(__file__).resolve().parents[3] / "charts" / "mmprep" / "files" / "operator-leader-election-role.yaml"
    assert committed.read_text() == rbac.leader_election_role_yaml(), (
        "charts/mmprep/files/operator-leader-election-role.yaml drifted from `mmprep-operator rbac --leader-election`; "
        "run `make chart-sync`"
    )

"""The typed pod fields reach every runtime pod as written (the Deployment's, the probe's and the
calibration's), the operator's own labels and security baseline stay, and ``spec.serving`` becomes
the runtime's own flags."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from conftest import DATA
from support.typed_fields import FULL_SPEC_FIELDS

from mmprep_operator import api, yamlio
from mmprep_operator.api.policy import OperatorPolicy
from mmprep_operator.logic import calibration, identity, pod_parts, probe
from mmprep_operator.logic.nodes import node_facts
from mmprep_operator.logic.plan import make_plan
from mmprep_operator.logic.pools import group
from mmprep_runtime import cli as runtime_cli
from mmprep_runtime import settings as runtime_settings

POLICY = OperatorPolicy()


def _spec(**fields: Any) -> api.MultimodalPreprocessorSpec:
    body = yaml.safe_load((DATA / "cr.yaml").read_text())
    return api.MultimodalPreprocessorSpec.model_validate({**body["spec"], **copy.deepcopy(fields)})


def _owner() -> identity.Owner:
    meta = yaml.safe_load((DATA / "cr.yaml").read_text())["metadata"]
    return identity.Owner(meta["name"], meta["namespace"], meta["uid"])


def _deployment(spec: api.MultimodalPreprocessorSpec) -> dict[str, Any]:
    nodes = [node_facts(n) for n in yamlio.load_objects((DATA / "nodes.yaml").read_text())]
    result = api.ProbeResult(cloneable=True, fast_image_processor=True, declared_workers=None)
    plan = make_plan(_owner(), spec, nodes, result, POLICY)
    return next(o for o in plan.objects if o["kind"] == "Deployment")


def _jobs(spec: api.MultimodalPreprocessorSpec) -> list[dict[str, Any]]:
    nodes = [node_facts(n) for n in yamlio.load_objects((DATA / "nodes.yaml").read_text())]
    pool = group(nodes, spec).pools[0]
    return [
        probe.job_manifest(_owner(), spec, POLICY, "h"),
        calibration.job_manifest(_owner(), spec, POLICY, pool, "node-a", "h"),
    ]


def _templates(spec: api.MultimodalPreprocessorSpec) -> list[dict[str, Any]]:
    return [o["spec"]["template"] for o in (_deployment(spec), *_jobs(spec))]


def test_every_runtime_pod_gets_the_typed_fields_as_written() -> None:
    spec = _spec(**FULL_SPEC_FIELDS)
    for template in _templates(spec):
        pod = template["spec"]
        container = pod["containers"][0]
        assert pod["volumes"][:2] == FULL_SPEC_FIELDS["volumes"]
        assert container["volumeMounts"][0] == FULL_SPEC_FIELDS["volumeMounts"][0]
        assert container["env"][:2] == FULL_SPEC_FIELDS["env"]
        assert container["envFrom"] == FULL_SPEC_FIELDS["envFrom"]
        assert pod["imagePullSecrets"] == [{"name": "registry"}]
        assert template["metadata"]["labels"]["team"] == "vision"
        assert template["metadata"]["annotations"] == {"example.com/owner": "vision-team"}
        assert pod["securityContext"]["supplementalGroups"] == [1000]
        assert container["securityContext"]["seLinuxOptions"] == {"level": "s0:c123,c456"}
    deployment = _deployment(spec)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["tolerations"] == FULL_SPEC_FIELDS["tolerations"]
    assert pod["affinity"]["podAntiAffinity"] == FULL_SPEC_FIELDS["affinity"]["podAntiAffinity"]
    assert pod["containers"][0]["resources"] == FULL_SPEC_FIELDS["resources"]


def test_pod_labels_leave_the_operators_labels_and_selector_as_they_are() -> None:
    plain, labelled = _deployment(_spec()), _deployment(_spec(podLabels={"team": "vision"}))
    assert labelled["spec"]["selector"] == plain["spec"]["selector"]
    labels = labelled["spec"]["template"]["metadata"]["labels"]
    assert labels == {**plain["spec"]["template"]["metadata"]["labels"], "team": "vision"}
    # The Deployment's own labels are the operator's alone (what its watches select by).
    assert labelled["metadata"]["labels"] == plain["metadata"]["labels"]


def test_every_label_the_operator_puts_on_a_pod_is_one_a_pod_label_may_not_set() -> None:
    # The reserved keys are listed in the API (it cannot import logic); this keeps them in step.
    spec = _spec()
    own = set(_deployment(spec)["spec"]["template"]["metadata"]["labels"])
    for job in _jobs(spec):
        own |= set(job["spec"]["template"]["metadata"]["labels"])
    for key in own:
        with pytest.raises(ValueError, match="podLabels may not set the operator's own labels"):
            _spec(podLabels={key: "x"})


@pytest.mark.parametrize("key", ["mmprep.dev/pool", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance"])
def test_a_pod_label_that_would_replace_the_operators_is_refused(key: str) -> None:
    with pytest.raises(ValueError, match="podLabels may not set the operator's own labels"):
        _spec(podLabels={key: "x"})


def test_without_a_pod_security_context_the_pods_run_as_the_runtime_images_user() -> None:
    context = _deployment(_spec())["spec"]["template"]["spec"]["securityContext"]
    assert context == {
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "fsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
        "runAsNonRoot": True,
    }


def test_a_pod_security_context_hands_the_ids_to_the_platform_and_keeps_non_root() -> None:
    # OpenShift's restricted SCC assigns the ids itself and refuses pods that name others.
    for template in _templates(_spec(podSecurityContext={})):
        context = template["spec"]["securityContext"]
        assert context == {"seccompProfile": {"type": "RuntimeDefault"}, "runAsNonRoot": True}
    chosen = _spec(podSecurityContext={"runAsUser": 1000650000, "fsGroup": 1000650000})
    context = _deployment(chosen)["spec"]["template"]["spec"]["securityContext"]
    assert context["runAsUser"] == 1000650000 and "runAsGroup" not in context and context["runAsNonRoot"] is True


def test_a_container_security_context_adds_but_never_weakens_the_baseline() -> None:
    spec = _spec(securityContext={"capabilities": {"add": ["NET_BIND_SERVICE"]}, "runAsUser": 1001})
    context = pod_parts.container_security_context(spec)
    assert context["capabilities"] == {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]}
    assert context["runAsUser"] == 1001
    assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True
    assert context["runAsNonRoot"] is True and "privileged" not in context


def _serve_flags(spec: api.MultimodalPreprocessorSpec) -> list[str]:
    command: list[str] = _deployment(spec)["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["mmprep-runtime", "serve"]
    return command[2:]


def test_the_serving_section_becomes_the_runtimes_own_settings() -> None:
    # Parsed by the runtime's own parser: the flag names and units cannot drift apart.
    args = runtime_cli.build_parser().parse_args(["serve", *_serve_flags(_spec(api="vllm-render", **FULL_SPEC_FIELDS))])
    settings = runtime_settings.serve_settings_from_args(args, {})
    assert settings.render.served_model_name == "qwen"
    assert settings.render.max_model_len == 8192
    assert settings.load.deadline_s == 12.5
    assert settings.load.queue_size == 8
    assert settings.limits.max_images == 4
    assert settings.limits.max_body_bytes == 8388608
    assert [str(n) for n in settings.render.fetch.allowed_networks] == ["10.0.0.0/8", "fd00::/8"]


def test_unset_serving_fields_keep_the_runtimes_defaults() -> None:
    args = runtime_cli.build_parser().parse_args(["serve", *_serve_flags(_spec(serving={"queueSize": 0}))])
    settings = runtime_settings.serve_settings_from_args(args, {})
    assert settings.load.queue_size == 0
    assert settings.limits == runtime_settings.Limits() and settings.load.deadline_s == runtime_settings.Load().deadline_s
    assert settings.render == runtime_settings.RenderSettings()


def test_env_from_joins_the_probe_hash_only_when_set() -> None:
    plain = _spec()
    assert "envFrom" not in probe.probe_inputs(plain, POLICY)
    assert probe.probe_hash(plain, POLICY) != probe.probe_hash(_spec(envFrom=FULL_SPEC_FIELDS["envFrom"]), POLICY)

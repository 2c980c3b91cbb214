"""Rendering is pure and stable: the objects for fixed inputs are compared with committed goldens.

Regenerate after an intended change with ``MMPREP_UPDATE_GOLDEN=1 pytest tests/unit/operator``
and review the diff like code.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import yaml
from conftest import DATA

from mmprep_operator import api, yamlio
from mmprep_operator.api.policy import OperatorPolicy
from mmprep_operator.logic import identity, pod_parts, probe
from mmprep_operator.logic.nodes import node_facts
from mmprep_operator.logic.plan import make_plan

GOLDEN = DATA / "golden"
CASES = {
    "qwen2-vl-gpu": ("cr.yaml", "probe.json"),
    "whisper-cpu": ("cr-cpu.yaml", None),
}


def render_case(cr_file: str, probe_file: str | None) -> list[dict[str, Any]]:
    body = yaml.safe_load((DATA / cr_file).read_text())
    spec = api.MultimodalPreprocessorSpec.model_validate(body["spec"])
    nodes = [node_facts(n) for n in yamlio.load_objects((DATA / "nodes.yaml").read_text())]
    if probe_file:
        result = probe.parse_result((DATA / probe_file).read_text())
    else:
        result = api.ProbeResult(cloneable=True, fast_image_processor=False, declared_workers=None)
    meta = body["metadata"]
    owner = identity.Owner(meta["name"], meta["namespace"], meta["uid"])
    policy = OperatorPolicy()
    plan = make_plan(owner, spec, nodes, result, policy)
    return [probe.job_manifest(owner, spec, policy, probe.probe_hash(spec, policy)), *plan.objects]


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_objects_match_the_golden_files(case: str) -> None:
    text = yamlio.dump_all(render_case(*CASES[case]))
    golden = GOLDEN / f"{case}.yaml"
    if os.environ.get("MMPREP_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert golden.read_text() == text, f"rendering changed; review and regenerate {golden.name} (see module docstring)"


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_pod_meets_the_restricted_pod_security_standard(case: str) -> None:
    for obj in render_case(*CASES[case]):
        if obj["kind"] not in ("Deployment", "Job"):
            continue
        pod = obj["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["runAsNonRoot"] is True
        assert not any("hostPath" in v for v in pod.get("volumes", ()))


@pytest.mark.parametrize("case", sorted(CASES))
def test_names_labels_and_owners_follow_the_contract(case: str) -> None:
    objects = render_case(*CASES[case])
    for obj in objects:
        meta = obj["metadata"]
        assert len(meta["name"]) <= 63
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "mmprep-operator"
        assert meta["ownerReferences"][0]["kind"] == "MultimodalPreprocessor"
    for dep in (o for o in objects if o["kind"] == "Deployment"):
        labels = dep["metadata"]["labels"]
        assert labels["mmprep.dev/resource"] == dep["metadata"]["ownerReferences"][0]["name"]
        assert labels["mmprep.dev/pool"] in dep["metadata"]["name"]
        assert dep["metadata"]["ownerReferences"][0]["controller"] is True
        container = dep["spec"]["template"]["spec"]["containers"][0]
        assert container["command"][:2] == ["mmprep-runtime", "serve"]
        assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert {"MMPREP_PROCESSOR_WORKERS", "MMPREP_IO_WORKERS", "MMPREP_DEVICE"} <= {e["name"] for e in container["env"]}


def test_cpu_case_renders_cache_backend_and_merges_affinity_with_the_pool() -> None:
    objects = render_case(*CASES["whisper-cpu"])
    job = objects[0]
    assert job["spec"]["activeDeadlineSeconds"] == 120
    assert job["spec"]["template"]["spec"]["nodeSelector"] == {"mmprep.dev/agent": "true"}
    assert "affinity" not in job["spec"]["template"]["spec"]  # a probe nodeSelector override drops it
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "mmprep-runtime",
        "probe",
        "--model",
        "openai/whisper-small",
        "--revision",
        "main",
        "--trust-remote-code",
        "--backend",
        "pil",
        "--termination-log",
        "/dev/termination-log",
    ]
    deployments = [o for o in objects if o["kind"] == "Deployment"]
    cpu = next(d for d in deployments if d["metadata"]["labels"]["mmprep.dev/pool"] == "cpu")
    pod = cpu["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = [e["key"] for e in term["matchExpressions"]]
    assert keys[0] == "kubernetes.io/arch" and "nvidia.com/gpu.product" in keys  # the user's term AND the pool's
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env["HF_HOME"] == pod_parts.CACHE_MOUNT and env["HF_HUB_OFFLINE"] == "1"
    assert env["MMPREP_IO_WORKERS"] == "8" and env["MMPREP_DEVICE"] == "cpu"
    assert {"name": "hf-cache", "mountPath": pod_parts.CACHE_MOUNT} in pod["containers"][0]["volumeMounts"]


def test_decision_env_wins_over_user_env_of_the_same_name() -> None:
    body = yaml.safe_load((DATA / "cr.yaml").read_text())
    body["spec"]["env"] = [{"name": "MMPREP_PROCESSOR_WORKERS", "value": "9"}]
    spec = api.MultimodalPreprocessorSpec.model_validate(body["spec"])
    nodes = [node_facts(n) for n in yamlio.load_objects((DATA / "nodes.yaml").read_text())]
    plan = make_plan(
        identity.Owner("x", "ns", "u"), spec, nodes, probe.parse_result((DATA / "probe.json").read_text()), OperatorPolicy()
    )
    deployment = next(o for o in plan.objects if o["kind"] == "Deployment")
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    values = [e["value"] for e in env if e["name"] == "MMPREP_PROCESSOR_WORKERS"]
    assert values[-1] == "1"  # Kubernetes uses the last duplicate


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_runtime_accepts_the_rendered_commands_and_env(case: str) -> None:
    """Contract with ``mmprep-runtime``: its own parser takes every command the operator renders,
    and its settings read back the pool's decision from the env the operator sets."""
    from mmprep_runtime import cli as runtime_cli
    from mmprep_runtime import settings as runtime_settings

    parser = runtime_cli.build_parser()
    for obj in render_case(*CASES[case]):
        if obj["kind"] not in ("Deployment", "Job"):
            continue
        container = obj["spec"]["template"]["spec"]["containers"][0]
        assert container["command"][0] == "mmprep-runtime"
        args = parser.parse_args(container["command"][1:])
        assert args.command == ("serve" if obj["kind"] == "Deployment" else "probe")
        if obj["kind"] == "Deployment":
            assert args.port == 8080
            environ = {e["name"]: e["value"] for e in container["env"] if "value" in e}
            settings = runtime_settings.serve_settings_from_args(args, environ)
            decision = settings.operator_decision
            assert decision is not None, environ
            assert decision.pool == obj["metadata"]["labels"]["mmprep.dev/pool"]
            assert settings.processor_workers == decision.processor_workers
            assert settings.model.device.value == ("cuda" if decision.path.value == "gpu" else "cpu")

"""Every CEL rule of the CRD has a pydantic twin with the same message, so `render` (no API server)
rejects what the API server rejects and says it the same way."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError
from support.typed_fields import REJECTIONS

from mmprep_operator import api
from mmprep_operator.api import crd, security

CPU = {"requests": {"cpu": "1"}}


def cel_messages() -> set[str]:
    schema = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for rule in node.get("x-kubernetes-validations", ()):
                found.add(rule["message"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return found


VIOLATIONS = [
    ({"model": {"path": "/m", "id": "a/b"}}, "set exactly one of model.path and model.id"),
    ({"model": {}}, "set exactly one of model.path and model.id"),
    (
        {"model": {"path": "/m", "cacheVolume": "c"}, "volumes": [{"name": "c", "emptyDir": {}}]},
        "model.cacheVolume needs model.id",
    ),
    ({"model": {"id": "a/b", "cacheVolume": "c"}}, "model.cacheVolume must name a volume in spec.volumes"),
    ({"model": {"path": "/m"}, "device": "cuda"}, "device: cuda needs a GPU resource"),
    ({"model": {"path": "/m"}, "device": "cuda", "resources": {"requests": {"cpu": 1}}}, "device: cuda needs a GPU resource"),
    (
        {"model": {"path": "/m"}, "workers": {"overrides": [{"processor": 2}]}},
        "an override names exactly one of gpuProduct and gpuFamily",
    ),
    (
        {"model": {"path": "/m"}, "workers": {"overrides": [{"gpuProduct": "H200", "gpuFamily": "hopper", "processor": 2}]}},
        "an override names exactly one of gpuProduct and gpuFamily",
    ),
    (
        {"model": {"path": "/m"}, "disruption": {"maxUnavailable": 1, "minAvailable": "50%"}},
        "set at most one of disruption.maxUnavailable and disruption.minAvailable",
    ),
    # Autoscaling: bounds, targets per signal, what a signal needs.
    (
        {"model": {"path": "/m"}, "resources": CPU, "autoscaling": {"minReplicas": 5, "maxReplicas": 2}},
        "autoscaling.minReplicas must not exceed maxReplicas",
    ),
    (
        {"model": {"path": "/m"}, "resources": CPU, "autoscaling": {"maxReplicas": 4, "target": 150}},
        "autoscaling target out of range for its signal",
    ),
    (
        {"model": {"path": "/m"}, "resources": CPU, "autoscaling": {"maxReplicas": 4, "pools": [{"pool": "h200", "target": 0}]}},
        "autoscaling.pools: autoscaling target out of range for its signal",
    ),
    (
        {
            "model": {"path": "/m"},
            "resources": CPU,
            "autoscaling": {"maxReplicas": 4, "pools": [{"pool": "h200", "minReplicas": 6}]},
        },
        "autoscaling.pools: a pool's minReplicas must not exceed its maxReplicas",
    ),
    (
        {"model": {"path": "/m"}, "resources": CPU, "autoscaling": {"maxReplicas": 4, "pools": [{"pool": "a"}, {"pool": "a"}]}},
        "autoscaling.pools: each pool is named at most once",
    ),
    (
        {"model": {"path": "/m"}, "autoscaling": {"maxReplicas": 4, "signal": "workerBusy"}},
        "autoscaling.prometheus.serverAddress is needed",
    ),
    (
        {"model": {"path": "/m"}, "autoscaling": {"maxReplicas": 4}},
        "autoscaling on signal cpu needs a CPU request",
    ),
    (
        {
            "model": {"path": "/m"},
            "resources": CPU,
            "autoscaling": {"maxReplicas": 4, "scaleUp": {"rate": {"periodSeconds": 30}}},
        },
        "a scaling rate sets exactly one of pods and percent",
    ),
    ({"model": {"path": "/m"}, "drain": {"seconds": 30, "gracePeriodSeconds": 35}}, "drain.gracePeriodSeconds must be at least"),
    # The defaulted grace period (45) is checked too: a longer window alone is refused.
    ({"model": {"path": "/m"}, "drain": {"seconds": 40}}, "drain.gracePeriodSeconds must be at least drain.seconds + 6"),
    ({"model": {"path": "/m"}, "podLabels": {"app.kubernetes.io/name": "x"}}, "podLabels may not set the operator's own labels"),
    (
        {"model": {"path": "/m"}, "podAnnotations": {"mmprep.dev/reprobe": "1"}},
        "podAnnotations may not set the operator's own mmprep.dev/* annotations",
    ),
    ({"model": {"path": "/m"}, "podSecurityContext": {"runAsNonRoot": False}}, "podSecurityContext.runAsNonRoot cannot be false"),
    ({"model": {"path": "/m"}, "podSecurityContext": {"runAsUser": 0}}, "podSecurityContext.runAsUser cannot be 0"),
    (
        {"model": {"path": "/m"}, "podSecurityContext": {"seccompProfile": {"type": "Unconfined"}}},
        "podSecurityContext.seccompProfile cannot be Unconfined",
    ),
    ({"model": {"path": "/m"}, "securityContext": {"privileged": True}}, "securityContext.privileged cannot be true"),
    (
        {"model": {"path": "/m"}, "securityContext": {"allowPrivilegeEscalation": True}},
        "securityContext.allowPrivilegeEscalation cannot be true",
    ),
    (
        {"model": {"path": "/m"}, "securityContext": {"readOnlyRootFilesystem": False}},
        "securityContext.readOnlyRootFilesystem cannot be false",
    ),
    ({"model": {"path": "/m"}, "securityContext": {"runAsNonRoot": False}}, "securityContext.runAsNonRoot cannot be false"),
    ({"model": {"path": "/m"}, "securityContext": {"runAsUser": 0}}, "securityContext.runAsUser cannot be 0"),
    (
        {"model": {"path": "/m"}, "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}},
        "securityContext.capabilities.add may only hold NET_BIND_SERVICE",
    ),
    (
        {"model": {"path": "/m"}, "securityContext": {"seccompProfile": {"type": "Unconfined"}}},
        "securityContext.seccompProfile cannot be Unconfined",
    ),
    (
        {"model": {"path": "/m"}, "serving": {"fetchAllowedNetworks": ["10.0.0.0/33"]}},
        "serving.fetchAllowedNetworks must hold IP networks",
    ),
    (
        {"model": {"path": "/m"}, "engine": {"url": "http://e:8000", "service": {"name": "e", "port": 8000}}},
        "set exactly one of engine.url and engine.service",
    ),
    ({"model": {"path": "/m"}, "engine": {}}, "set exactly one of engine.url and engine.service"),
]


def test_every_cel_rule_is_exercised_here() -> None:
    exercised = {m for _, m in VIOLATIONS}
    for message in cel_messages():
        assert any(message.startswith(e) for e in exercised), f"no test for CEL rule: {message}"


@pytest.mark.parametrize(("spec", "message"), VIOLATIONS, ids=[m[:40] for _, m in VIOLATIONS])
def test_pydantic_rejects_what_cel_rejects_with_the_same_words(spec: dict, message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        api.MultimodalPreprocessorSpec.model_validate(spec)
    assert message in str(caught.value)
    assert any(m.startswith(message) for m in cel_messages())


@pytest.mark.parametrize("case", [r for r in REJECTIONS if r.models_say], ids=lambda r: r.id)
def test_the_models_reject_a_malformed_pod_field_as_the_api_server_does(case: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        api.MultimodalPreprocessorSpec.model_validate({"model": {"path": "/m"}, **case.fields})
    assert case.models_say in str(caught.value)


def test_the_security_rules_accept_what_the_operator_itself_renders() -> None:
    from mmprep_operator.logic import pod_parts

    spec = api.MultimodalPreprocessorSpec.model_validate({"model": {"path": "/m"}})
    assert security.broken(security.POD_RULES, pod_parts.pod_security_context(spec)) == []
    assert security.broken(security.CONTAINER_RULES, pod_parts.container_security_context(spec)) == []


@pytest.mark.parametrize(
    "spec",
    [
        {"model": {"path": "/m"}},
        {"model": {"id": "a/b", "cacheVolume": "c"}, "volumes": [{"name": "c", "emptyDir": {}}]},
        {"model": {"path": "/m"}, "device": "cuda", "resources": {"limits": {"nvidia.com/gpu": 1}}},
        {"model": {"path": "/m"}, "device": "cuda", "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}}},
        {"model": {"path": "/m"}, "device": "cuda", "resources": {"limits": {"amd.com/gpu": "1"}}},
        {"model": {"path": "/m"}, "drain": {"seconds": 0, "gracePeriodSeconds": 6}},
        {"model": {"path": "/m"}, "drain": {"seconds": 39}},
        {
            "model": {"path": "/m"},
            "workers": {"processor": 64, "io": 1, "overrides": [{"gpuFamily": "blackwell", "path": "gpu", "processor": 1}]},
        },
        {"model": {"path": "/m"}, "resources": {"limits": {"cpu": "2"}}, "autoscaling": {"maxReplicas": 1}},
        {
            "model": {"path": "/m"},
            "resources": CPU,
            "autoscaling": {
                "minReplicas": 2,
                "maxReplicas": 8,
                "target": 100,
                "scaleUp": {"stabilizationWindowSeconds": 0, "rate": {"pods": 4, "periodSeconds": 15}},
                "scaleDown": {"stabilizationWindowSeconds": 600, "rate": {"percent": 10}},
                "pools": [{"pool": "h200", "maxReplicas": 2}, {"pool": "cpu", "minReplicas": 8, "target": 1}],
            },
        },
        {
            "model": {"path": "/m"},
            "autoscaling": {
                "maxReplicas": 4,
                "signal": "queueWait",
                "target": 600000,
                "prometheus": {"serverAddress": "http://p:9090"},
            },
        },
        {"model": {"path": "/m"}, "engine": {"url": "http://vllm-engine.serving.svc:8000"}},
        {"model": {"path": "/m"}, "engine": {"service": {"name": "vllm-engine", "port": 8000}}},
    ],
)
def test_valid_specs_pass(spec: dict) -> None:
    parsed = api.MultimodalPreprocessorSpec.model_validate(spec)
    # And survive a round trip through the wire format unchanged in meaning.
    again = api.MultimodalPreprocessorSpec.model_validate(json.loads(json.dumps(parsed.wire())))
    assert again == parsed


@pytest.mark.parametrize("bad", [{"processor": 0}, {"processor": 65}, {"io": 0}])
def test_worker_bounds(bad: dict) -> None:
    with pytest.raises(ValidationError):
        api.MultimodalPreprocessorSpec.model_validate({"model": {"path": "/m"}, "workers": bad})

"""``spec.api`` selects what the runtime pods serve; the port, the probes and the Service follow."""

from __future__ import annotations

import shlex
from typing import Any

import pytest
from conftest import plan_objects
from pydantic import ValidationError

from mmprep_operator.api.policy import OperatorPolicy


def _container(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]


def test_the_default_api_is_mmprep_on_8080_with_readyz():
    objects = plan_objects()
    container = _container(objects)
    assert container["ports"][0]["containerPort"] == 8080
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert objects["Service"]["spec"]["ports"][0]["port"] == 8080
    assert "--normalized-pixels" not in container["command"]


def test_vllm_render_serves_on_vllms_port_with_its_health_probe():
    objects = plan_objects(api="vllm-render")
    container = _container(objects)
    assert container["command"][container["command"].index("--port") + 1] == "8000"
    assert container["ports"][0]["containerPort"] == 8000
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    # Alive while the processor loads: liveness and startup stay on /healthz.
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert objects["Service"]["spec"]["ports"][0] == {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}


def test_normalized_pixels_reach_the_runtime_flag():
    assert "--normalized-pixels" in _container(plan_objects(api="vllm-render", normalizedPixels=True))["command"]


def test_an_unknown_api_is_refused():
    with pytest.raises(ValidationError, match="vllm-render"):
        plan_objects(api="openai")


VLLM_POLICY = OperatorPolicy.model_validate(
    {"defaultImage": "reg/mmprep-runtime:1", "vllmRenderImage": "reg/mmprep-runtime-vllm:1"}
)


def test_vllm_render_resources_get_the_policys_vllm_image_and_others_the_default():
    assert _container(plan_objects(VLLM_POLICY, api="vllm-render", image=None))["image"] == "reg/mmprep-runtime-vllm:1"
    assert _container(plan_objects(VLLM_POLICY, image=None))["image"] == "reg/mmprep-runtime:1"
    # Without a vLLM image in the policy, the default image serves vllm-render too (native path only).
    assert _container(plan_objects(api="vllm-render", image=None))["image"] == OperatorPolicy().default_image
    # A resource's own image wins over both.
    assert _container(plan_objects(VLLM_POLICY, api="vllm-render", image="mine:2"))["image"] == "mine:2"


def test_the_render_path_and_vllms_options_reach_the_runtime_flags():
    serving = {"renderPath": "general", "renderProcesses": 3, "vllmArgs": ["--limit-mm-per-prompt", '{"image": 4}']}
    command = _container(plan_objects(api="vllm-render", serving=serving))["command"]
    assert command[command.index("--render-path") + 1] == "general"
    assert command[command.index("--render-processes") + 1] == "3"
    # One argument joined to its flag (a value starting with "--" would read as a flag), split back
    # into the same words by the runtime's settings.
    [joined] = [c for c in command if c.startswith("--vllm-args=")]
    assert shlex.split(joined.split("=", 1)[1]) == serving["vllmArgs"]


@pytest.mark.parametrize(
    ("serving", "message"),
    [
        ({"renderPath": "fast"}, "renderPath"),
        ({"renderProcesses": 0}, "renderProcesses"),
        ({"vllmArgs": [""]}, "vllmArgs"),
    ],
)
def test_a_bad_render_setting_is_refused(serving: dict[str, Any], message: str):
    with pytest.raises(ValidationError, match=message):
        plan_objects(api="vllm-render", serving=serving)

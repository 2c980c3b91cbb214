"""A runtime pod the operator rendered, run for real by the test agent, serves a preprocessing request."""

from __future__ import annotations

import base64
import io
import json
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from PIL import Image
from support.kube import (
    AGENT_NODE,
    AGENT_SELECTOR,
    AGENT_TOLERATION,
    Kube,
    agent_port,
    condition_is,
    pools,
    wait_for,
)
from support.operator_process import OperatorProcess
from support.specs import make_spec

from mmprep_runtime.synthetic.models import QWEN_IMAGE_PLACEHOLDER

pytestmark = pytest.mark.cluster


def _png(width: int = 64, height: int = 48) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 90)).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.load(resp)


def test_a_runtime_pod_run_by_the_agent_serves_a_real_preprocess_request(
    kube: Kube, operator: OperatorProcess, namespace: str, model_dir: Callable[..., Path]
) -> None:
    model = model_dir("qwen2-vl")
    # Tolerating the agent's taint and selecting its node puts the runtime pod where pods really run.
    spec = make_spec(model, nodeSelector=dict(AGENT_SELECTOR), tolerations=[dict(AGENT_TOLERATION)], replicas=1)
    kube.create_mmp(namespace, "served", spec)
    # Ready means the runtime answered its readiness probe: the processor loaded and the pool is warm.
    obj = kube.wait_mmp(namespace, "served", lambda o: condition_is(o, "Ready", "True"), 240, what="Ready=True")
    [pool] = pools(obj)
    assert (pool["path"], pool["nodes"], pool["readyReplicas"]) == ("cpu", 1, 1)

    [pod] = wait_for(
        lambda: [p for p in kube.pods(namespace, "mmprep.dev/pool") if p.status.phase == "Running"],
        30,
        what="the runtime pod",
    )
    assert pod.spec.node_name == AGENT_NODE
    port = agent_port(pod, 8080)
    assert port, pod.metadata.annotations

    # The decision the operator wrote into env is what the runtime serves with.
    info = _get_json(f"http://127.0.0.1:{port}/v1/info")
    assert info["workers"]["processor"] == pool["processorWorkers"]
    assert info["workers"]["io"] == pool["ioWorkers"]
    assert info["path"] == "cpu"
    # ... and the pod says what the status says: its pool and the rule's reason (not "Explicit").
    assert (info["pool"], info["workers"]["reason"]) == (pool["name"], pool["reason"]), info["workers"]

    body = json.dumps({"text": f"{QWEN_IMAGE_PLACEHOLDER}What is in this picture?", "images": [_png()]}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/preprocess", data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        assert resp.status == 200
        answer = json.load(resp)
    assert isinstance(answer["input_ids"], list) and answer["input_ids"]
    assert "pixel_values" in json.dumps(answer), answer.keys()

    # Deleting the resource stops the process: the agent finishes the pod's deletion.
    kube.delete_mmp(namespace, "served")
    wait_for(lambda: not kube.pods(namespace, "mmprep.dev/pool"), 60, what="the runtime pod gone")
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)

"""A runtime pod the operator rendered drains when it is deleted: the Deployment on the API server
carries the grace period and the drain env from ``spec.drain``, and the pod, run for real by the
test agent (which stops a deleted pod as a kubelet does: SIGTERM, SIGKILL after the grace period),
keeps answering a steady load through its drain window with no failed request."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from support.kube import AGENT_SELECTOR, AGENT_TOLERATION, Kube, agent_port, condition_is, container_env, wait_for
from support.load_client import FAILED, NOT_DELIVERED, OK, Load
from support.operator_process import OperatorProcess
from support.specs import make_spec

from mmprep_runtime.synthetic.media import jpeg
from mmprep_runtime.synthetic.models import QWEN_IMAGE_PLACEHOLDER

pytestmark = pytest.mark.cluster

DRAIN = {"seconds": 5, "gracePeriodSeconds": 25}


def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None  # nothing listens


def test_a_deleted_runtime_pod_drains_under_load_with_no_failed_request(
    kube: Kube, operator: OperatorProcess, namespace: str, model_dir: Callable[..., Path]
) -> None:
    spec = make_spec(
        model_dir("qwen2-vl"), nodeSelector=dict(AGENT_SELECTOR), tolerations=[dict(AGENT_TOLERATION)], replicas=1, drain=DRAIN
    )
    kube.create_mmp(namespace, "drained", spec)
    kube.wait_mmp(namespace, "drained", lambda o: condition_is(o, "Ready", "True"), 240, what="Ready=True")

    [deployment] = kube.deployments(namespace)
    template = deployment.spec.template.spec
    assert template.termination_grace_period_seconds == 25
    env = container_env(deployment)
    # The in-flight time is what the grace period leaves after the window and the runtime's stop.
    assert (env["MMPREP_DRAIN_SECONDS"], env["MMPREP_SHUTDOWN_TIMEOUT_SECONDS"]) == ("5", "15")
    # The hook begins the drain on a real kubelet (the kind tier sees it); this tier's test kubelet
    # sends SIGTERM alone, the path where no hook ran, on which the runtime begins the same window.
    assert template.containers[0].lifecycle.pre_stop._exec.command == ["/bin/sh", "-c", "kill -USR1 1; sleep 5"]

    [pod] = wait_for(
        lambda: [p for p in kube.pods(namespace, "mmprep.dev/pool") if p.status.phase == "Running"], 30, what="the pod"
    )
    port = agent_port(pod, 8080)
    base = f"http://127.0.0.1:{port}"
    body = json.dumps({"text": f"{QWEN_IMAGE_PLACEHOLDER} what is this?", "images": [_b64(jpeg(64, 48))]}).encode()
    with Load(f"{base}/v1/preprocess", body, clients=2) as steady, Load(f"{base}/v1/preprocess", body, keep_alive=False) as fresh:
        steady.wait_for(lambda attempts: sum(a.outcome == OK for a in attempts) >= 4, 60)
        deleted = time.monotonic()
        # The default grace period: the pod's own, which the Deployment set from spec.drain.
        kube.core.delete_namespaced_pod(pod.metadata.name, namespace)
        wait_for(lambda: _status(f"{base}/readyz") == 503, 30, what="readiness 503 once the pod is deleted", interval=0.05)
        assert _status(f"{base}/healthz") == 200, "liveness stays while draining"
        # Still served after SIGTERM: a keep-alive client's answers say so by closing its connection.
        steady.wait_for(lambda attempts: any(a.outcome == OK and a.closed_connection for a in attempts), 30)
        for load in (steady, fresh):
            load.wait_for(lambda attempts: any(a.outcome == NOT_DELIVERED for a in attempts), 60)
    wait_for(lambda: _status(f"{base}/healthz") is None, 30, what="the drained process gone")
    exited = time.monotonic()

    attempts = [*steady.tally.attempts, *fresh.tally.attempts]
    assert not [a for a in attempts if a.outcome == FAILED], [a for a in attempts if a.outcome == FAILED][:5]
    first_undelivered = min(a.sent for a in attempts if a.outcome == NOT_DELIVERED)
    assert first_undelivered - deleted >= DRAIN["seconds"] - 0.5, "the listener stayed open through the window"
    assert exited - deleted < DRAIN["gracePeriodSeconds"], "it exited by itself, before the grace period ran out"
    kube.delete_mmp(namespace, "drained")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()

"""The test agent (tests/support/agent.py) behaves like the kubelet parts the other tests rely on.

Test infrastructure checking test infrastructure: if the agent misreported an exit code or a
termination message, the probe tests above it would test nothing.
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.rest import ApiException
from support.kube import (
    AGENT_NODE,
    AGENT_SELECTOR,
    AGENT_TOLERATION,
    Kube,
    agent_port,
    wait_for,
)

pytestmark = pytest.mark.cluster


def pod(name: str, command: list[str], *, restart: str = "Never", **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": restart,
            "nodeSelector": dict(AGENT_SELECTOR),
            "tolerations": [dict(AGENT_TOLERATION)],
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "main", "image": "ignored-by-the-agent", "command": command, **container}],
        },
    }


def terminated(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        p = kube.core.read_namespaced_pod(name, namespace)
        if p.status.phase in ("Succeeded", "Failed"):
            return kube.api.sanitize_for_serialization(p)
        return None

    return wait_for(done, 60, what=f"pod {name} finished")


def test_a_finished_pod_reports_exit_code_and_termination_message(kube: Kube, namespace: str) -> None:
    script = "import json, os, sys; open(sys.argv[1], 'w').write(json.dumps({'pod': os.environ['POD']})); sys.exit(0)"
    env = [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    kube.core.create_namespaced_pod(namespace, pod("writes", ["python", "-c", script, "/dev/termination-log"], env=env))
    kube.core.create_namespaced_pod(
        namespace,
        pod("fails", ["python", "-c", "import sys; print('it broke', file=sys.stderr); sys.exit(3)"],
            terminationMessagePolicy="FallbackToLogsOnError"),
    )  # fmt: skip

    ok = terminated(kube, namespace, "writes")
    assert ok["status"]["phase"] == "Succeeded"
    assert ok["spec"]["nodeName"] == AGENT_NODE
    state = ok["status"]["containerStatuses"][0]["state"]["terminated"]
    assert state["exitCode"] == 0 and json.loads(state["message"]) == {"pod": "writes"}

    bad = terminated(kube, namespace, "fails")
    assert bad["status"]["phase"] == "Failed"
    state = bad["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (state["exitCode"], state["reason"]) == (3, "Error")
    assert "it broke" in state["message"]


def test_a_server_pod_gets_a_local_port_turns_ready_and_stops_when_deleted(kube: Kube, namespace: str) -> None:
    script = (
        "import http.server, os, sys\n"
        "port = int(sys.argv[sys.argv.index('--port') + 1])\n"
        "open(os.environ['PID_FILE'], 'w').write(str(os.getpid()))\n"
        "http.server.HTTPServer(('127.0.0.1', port), http.server.SimpleHTTPRequestHandler).serve_forever()\n"
    )
    pid_file = f"{os.environ.get('TMPDIR', '/tmp')}/agent-test-{namespace}.pid"
    kube.core.create_namespaced_pod(
        namespace,
        pod(
            "server",
            ["python", "-c", script],
            restart="Always",
            args=["--port", "8080"],
            env=[{"name": "PID_FILE", "value": pid_file}],
            ports=[{"name": "http", "containerPort": 8080}],
            readinessProbe={"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
        ),
    )
    ready = wait_for(
        lambda: (
            (p := kube.core.read_namespaced_pod("server", namespace)).status.conditions
            and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions)
            and p
        ),
        60,
        what="the server pod Ready",
    )
    port = agent_port(ready, 8080)
    assert port and port != 8080
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as resp:
        assert resp.status == 200
    pid = int(Path(pid_file).read_text())

    kube.core.delete_namespaced_pod("server", namespace)

    def gone() -> bool:
        try:
            kube.core.read_namespaced_pod("server", namespace)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(gone, 30, what="the pod deletion finished by the agent")
    wait_for(lambda: not os.path.exists(f"/proc/{pid}") or _zombie(pid), 10, what="the server process stopped")
    os.unlink(pid_file)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] == "Z"
    except OSError:
        return True


def test_a_crashing_container_is_restarted_under_restart_policy_always(kube: Kube, namespace: str) -> None:
    kube.core.create_namespaced_pod(namespace, pod("crashes", ["python", "-c", "raise SystemExit(1)"], restart="Always"))

    def restarted() -> bool:
        p = kube.core.read_namespaced_pod("crashes", namespace)
        statuses = p.status.container_statuses or []
        return bool(statuses) and statuses[0].restart_count >= 1 and p.status.phase == "Running"

    wait_for(restarted, 60, what="a restart")
    status = kube.core.read_namespaced_pod("crashes", namespace).status.container_statuses[0]
    assert status.last_state.terminated.exit_code == 1

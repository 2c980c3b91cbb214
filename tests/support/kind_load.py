"""Load from inside the kind cluster: benchmarks/autoscale/loadgen.py in a pod of the runtime image.

The kind autoscaling tests and the step-load benchmark drive a pool through its Service from a pod,
so requests take the path real clients take (cluster DNS, the Service's virtual IP, endpoints
that change as pods come and go). The generator's script travels in a ConfigMap; its per-second
lines and summary are the pod's log, read once it has finished.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any

from kubernetes import client
from kubernetes.stream import stream

from support.kube import REPO, Kube, wait_for

LOADGEN = REPO / "benchmarks" / "autoscale" / "loadgen.py"
CONFIGMAP = "mmprep-loadgen"
STOP_FILE = "/tmp/stop"
#: What every pod in the kind tests' namespace must meet (it enforces the restricted standard).
RESTRICTED = {
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


@dataclasses.dataclass(frozen=True)
class LoadResult:
    seconds: list[dict[str, Any]]
    summary: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class LoadPod:
    kube: Kube
    namespace: str
    name: str

    def stop(self) -> None:
        """Ask the generator to stop sending; it then reports (see ``result``)."""
        stream(
            self.kube.core.connect_get_namespaced_pod_exec,
            self.name,
            self.namespace,
            command=["python3", "-c", f"open({STOP_FILE!r}, 'w').close()"],
            stderr=True,
            stdout=True,
            stdin=False,
            tty=False,
        )

    def result(self, timeout: float) -> LoadResult:
        def finished() -> str | None:
            phase = self.kube.core.read_namespaced_pod(self.name, self.namespace).status.phase
            return phase if phase in ("Succeeded", "Failed") else None

        phase = wait_for(finished, timeout, what=f"load pod {self.name} to finish")
        log = str(self.kube.core.read_namespaced_pod_log(self.name, self.namespace))
        assert phase == "Succeeded", f"load pod {phase}:\n{log[-4000:]}"
        lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
        return LoadResult([line for line in lines if "t" in line], lines[-1]["summary"])

    def delete(self) -> None:
        self.kube.core.delete_namespaced_pod(self.name, self.namespace, grace_period_seconds=0)


def start_load(
    kube: Kube,
    namespace: str,
    *,
    image: str,
    url: str,
    schedule: str,
    duration: float,
    node: str | None = None,
    text: str,
    extra_args: tuple[str, ...] = (),
) -> LoadPod:
    """A running load pod (Running: it has started sending)."""
    configmap = client.V1ConfigMap(metadata=client.V1ObjectMeta(name=CONFIGMAP), data={"loadgen.py": LOADGEN.read_text()})
    try:
        kube.core.replace_namespaced_config_map(CONFIGMAP, namespace, configmap)
    except client.ApiException as e:
        if e.status != 404:
            raise
        kube.core.create_namespaced_config_map(namespace, configmap)
    name = f"load-{uuid.uuid4().hex[:6]}"
    args = ["--url", url, "--schedule", schedule, "--duration", str(duration), "--stop-file", STOP_FILE, "--text", text]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "mmprep-loadgen"}},
        "spec": {
            "restartPolicy": "Never",
            **({"nodeName": node} if node else {}),
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "load",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python3", "/loadgen/loadgen.py", *args, *extra_args],
                    "securityContext": {**RESTRICTED, "readOnlyRootFilesystem": True},
                    "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
                    "volumeMounts": [{"name": "loadgen", "mountPath": "/loadgen"}, {"name": "tmp", "mountPath": "/tmp"}],
                }
            ],
            "volumes": [{"name": "loadgen", "configMap": {"name": CONFIGMAP}}, {"name": "tmp", "emptyDir": {}}],
        },
    }
    kube.core.create_namespaced_pod(namespace, pod)
    wait_for(
        lambda: kube.core.read_namespaced_pod(name, namespace).status.phase in ("Running", "Succeeded"),
        180,
        what=f"load pod {name} running",
    )
    return LoadPod(kube, namespace, name)

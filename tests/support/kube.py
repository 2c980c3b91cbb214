"""Helpers for tests against the real local control plane (hack/cluster-up.sh).

Waiting is always on a condition with a deadline (``wait_for``), never a fixed sleep: the
control plane, the operator and the agent are separate processes on a busy two-core machine.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.client.rest import ApiException

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
HACK = REPO / "hack"
NODES_FILE = HACK / "nodes.yaml"
GROUP, VERSION, PLURAL = "mmprep.dev", "v1alpha1", "multimodalpreprocessors"
AGENT_NODE = "mmprep-agent"
AGENT_LABEL = "mmprep.dev/test-agent"
#: What a pod needs to run for real on the agent's (tainted) node.
AGENT_TOLERATION = {"key": AGENT_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
AGENT_SELECTOR = {AGENT_LABEL: "true"}
PORTS_ANNOTATION = "agent.mmprep.dev/ports"


class WaitTimeout(AssertionError):
    """A condition did not come true in time; the message says what was last seen."""


def wait_for(
    predicate: Callable[[], T | None],
    timeout: float,
    *,
    what: str,
    interval: float = 0.25,
    describe: Callable[[], object] | None = None,
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    ``ApiException`` (e.g. a 404 before an object exists) counts as "not yet". On timeout the
    error names ``what`` and shows ``describe()`` (the state worth seeing in a failure report).
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = predicate()
            if value:
                return value
            last = value
        except ApiException as exc:
            last = f"ApiException {exc.status}: {exc.reason}"
        if time.monotonic() >= deadline:
            detail = describe() if describe else last
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}; last seen: {detail}")
        time.sleep(interval)  # the polling interval, not a synchronization point


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The running local control plane: where its kubeconfig and binaries are."""

    kubeconfig: Path
    bin_dir: Path
    state_dir: Path

    def api_client(self) -> client.ApiClient:
        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def env(self) -> dict[str, str]:
        """Environment for processes that talk to this cluster (the operator, kubectl, helm)."""
        return {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        }


class Kube:
    """Typed-enough access to the objects the tests look at, over one API client."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.ext = client.ApiextensionsV1Api(api)
        self.autoscaling = client.AutoscalingV2Api(api)

    # --- MultimodalPreprocessor -----------------------------------------------------------------
    def create_mmp(self, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "MultimodalPreprocessor", "metadata": {"name": name}, "spec": spec}
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    def get_mmp(self, namespace: str, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)

    def patch_mmp(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, patch)

    def delete_mmp(self, namespace: str, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)

    def wait_mmp(
        self, namespace: str, name: str, predicate: Callable[[dict[str, Any]], object], timeout: float, *, what: str
    ) -> dict[str, Any]:
        """The resource, once ``predicate(resource)`` holds."""

        def check() -> dict[str, Any] | None:
            obj = self.get_mmp(namespace, name)
            return obj if predicate(obj) else None

        return wait_for(
            check, timeout, what=f"{namespace}/{name}: {what}", describe=lambda: self.get_mmp(namespace, name).get("status")
        )

    def mmp_exists(self, namespace: str, name: str) -> bool:
        try:
            self.get_mmp(namespace, name)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    # --- children -------------------------------------------------------------------------------
    def deployments(self, namespace: str) -> list[client.V1Deployment]:
        return list(self.apps.list_namespaced_deployment(namespace).items)

    def pods(self, namespace: str, label_selector: str = "") -> list[client.V1Pod]:
        return list(self.core.list_namespaced_pod(namespace, label_selector=label_selector).items)

    def jobs(self, namespace: str) -> list[client.V1Job]:
        return list(self.batch.list_namespaced_job(namespace).items)

    def events(self, namespace: str, involved_name: str) -> list[client.CoreV1Event]:
        return [
            e
            for e in self.core.list_namespaced_event(namespace).items
            if e.involved_object and e.involved_object.name == involved_name
        ]


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c
    return None


def condition_is(obj: dict[str, Any], type_: str, status: str) -> bool:
    c = condition(obj, type_)
    return bool(c and c.get("status") == status)


def pools(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return list((obj.get("status") or {}).get("pools") or [])


def pool_for(obj: dict[str, Any], product: str) -> dict[str, Any] | None:
    """The status pool whose GPU product (or pool name, e.g. ``cpu``) is ``product``."""
    for p in pools(obj):
        if p.get("gpuProduct") == product or p.get("name") == product:
            return p
    return None


def container_env(deployment: client.V1Deployment) -> dict[str, str]:
    container = deployment.spec.template.spec.containers[0]
    return {e.name: e.value for e in container.env or [] if e.value is not None}


def agent_port(pod: client.V1Pod, container_port: int) -> int | None:
    """The local port the test agent gave ``container_port`` of a pod it runs."""
    raw = (pod.metadata.annotations or {}).get(PORTS_ANNOTATION)
    return json.loads(raw).get(str(container_port)) if raw else None

"""Test agent: a tiny stand-in for a kubelet that runs pods as local processes.

TEST INFRASTRUCTURE ONLY. Production clusters run real kubelets; this exists because the local
control plane (hack/cluster-up.sh) has no container runtime, yet some pods must really run: the
operator's probe Job and a runtime pod that serves requests. The agent owns exactly one Node.

What it does, and what it deliberately does not:
- registers its Node (labels ``mmprep.dev/test-agent: "true"``, a real CPU count) and keeps it
  alive through a Lease in ``kube-node-lease``, as a kubelet does;
- watches pods bound to that node and runs each container's ``command`` + ``args`` with its
  ``env`` as a local process. The image is ignored: commands run from the repo's virtualenv
  (its ``bin`` leads PATH), so the container must name an explicit command. One exception: an
  image of the vLLM flavor (``mmprep-runtime-vllm``) runs ``mmprep-runtime`` from vLLM's own
  virtualenv, as that image would, when the agent was started with ``MMPREP_AGENT_VLLM_VENV``;
- gives every container port a free local port, rewrites ``--port N`` arguments accordingly and
  annotates the pod with the mapping (``agent.mmprep.dev/ports``: ``{"8080": 41234}``);
- points ``terminationMessagePath`` (and any argument or env value equal to it) at a temp file
  and reports its content as the termination message, like the kubelet does;
- maps hostPath volume mount paths onto the host paths and emptyDir mounts onto temp folders
  (in arguments and env values), except a mount over ``/tmp``, which only sets TMPDIR;
- an env Secret or ConfigMap that does not exist leaves the container waiting in
  ``CreateContainerConfigError`` with the kubelet's message (``secret "x" not found``), retried
  until it exists, as the kubelet does;
- reports real status through ``pods/status``: Running, Ready from the readiness probe
  (httpGet/tcpSocket/exec), Succeeded/Failed with exit code and message; restarts containers per
  ``restartPolicy``;
- on pod deletion stops the process group (SIGTERM, SIGKILL after the grace period) and finishes
  the deletion as a kubelet does.
It ignores images, resources and limits, security contexts, liveness probes and networking.

Run: ``python tests/support/agent.py --kubeconfig FILE --workdir DIR [--node-name NAME]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

try:  # run as a script (hack/cluster-up.sh does): this folder is on sys.path
    import agent_pods
except ImportError:  # imported as support.agent
    from support import agent_pods

log = logging.getLogger("mmprep-test-agent")

AGENT_LABEL = "mmprep.dev/test-agent"
LEASE_SECONDS = 40
#: How often the lease is renewed; a kubelet uses a quarter of the lease duration.
RENEW_SECONDS = 10
PASSTHROUGH_PREFIX = "MMPREP_AGENT_ENV_"
#: vLLM's virtualenv (hack/vllm/venv.sh): where containers of the vLLM image run (``agent_pods.VLLM_IMAGE``).
VLLM_VENV_ENV = "MMPREP_AGENT_VLLM_VENV"
MERGE_PATCH = agent_pods.MERGE_PATCH


class Agent:
    """Owns the Node, its Lease, and a PodRunner per pod bound to the node."""

    def __init__(self, *, node_name: str, workdir: Path, taint: bool) -> None:
        self.api = client.ApiClient()
        self.core = client.CoreV1Api(self.api)
        self.coord = client.CoordinationV1Api(self.api)
        self.node_name = node_name
        self.workdir = workdir
        self.taint = taint
        bin_dir = str(Path(sys.executable).parent)
        self.path = os.pathsep.join([bin_dir, os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")])
        # MMPREP_AGENT_ENV_X=v reaches every process as X=v: lets CI tune threads or caches.
        self.passthrough_env = {
            k.removeprefix(PASSTHROUGH_PREFIX): v for k, v in os.environ.items() if k.startswith(PASSTHROUGH_PREFIX)
        }
        # The vLLM image's stand-in: vLLM's own virtualenv, when the session that started the agent has one.
        venv = os.environ.get(VLLM_VENV_ENV, "").strip()
        self.vllm_venv: Path | None = Path(venv) if venv else None
        self.runners: dict[str, agent_pods.PodRunner] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    # --- node -----------------------------------------------------------------------------------
    def register(self) -> None:
        labels = {
            "kubernetes.io/hostname": self.node_name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine),
            AGENT_LABEL: "true",
        }
        taints = [{"key": AGENT_LABEL, "value": "true", "effect": "NoSchedule"}] if self.taint else []
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node_name, "labels": labels},
            "spec": {"taints": taints},
        }
        try:
            self.core.create_node(body)
            log.info("registered node %s", self.node_name)
        except ApiException as exc:
            if exc.status != 409:
                raise
            self.core.patch_node(self.node_name, {"metadata": {"labels": labels}, "spec": {"taints": taints}})
            log.info("node %s existed; labels and taints refreshed", self.node_name)
        self.post_node_status()

    def post_node_status(self) -> None:
        ts = agent_pods.now()
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        resources = {"cpu": str(os.cpu_count() or 1), "memory": f"{mem // 1024}Ki", "pods": "110"}
        conditions = [
            {
                "type": t,
                "status": "False",
                "reason": f"Kubelet{r}",
                "message": m,
                "lastHeartbeatTime": ts,
                "lastTransitionTime": ts,
            }
            for t, r, m in [
                ("MemoryPressure", "HasSufficientMemory", "test agent"),
                ("DiskPressure", "HasNoDiskPressure", "test agent"),
                ("PIDPressure", "HasSufficientPID", "test agent"),
            ]
        ] + [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "mmprep test agent is posting ready status",
                "lastHeartbeatTime": ts,
                "lastTransitionTime": ts,
            }
        ]
        status = {
            "capacity": resources,
            "allocatable": resources,
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": self.node_name}],
            "nodeInfo": {
                "architecture": os.uname().machine,
                "operatingSystem": "linux",
                "kubeletVersion": "v1.35.4-mmprep-test-agent",
                "containerRuntimeVersion": "local-process://",
                "kernelVersion": os.uname().release,
                "osImage": "",
                "kubeProxyVersion": "",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
            "phase": "Running",
        }
        self.core.patch_node_status(self.node_name, {"status": status}, _content_type=MERGE_PATCH)

    def renew_lease(self) -> None:
        body = {
            "metadata": {"name": self.node_name, "namespace": "kube-node-lease"},
            "spec": {
                "holderIdentity": self.node_name,
                "leaseDurationSeconds": LEASE_SECONDS,
                "renewTime": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            },
        }
        try:
            self.coord.patch_namespaced_lease(self.node_name, "kube-node-lease", body, _content_type=MERGE_PATCH)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.coord.create_namespaced_lease("kube-node-lease", body)

    def heartbeat(self) -> None:
        beats = 0
        while not self.stopping.wait(0 if beats == 0 else RENEW_SECONDS):
            try:
                self.renew_lease()
                if beats % 6 == 0:  # the Ready condition's heartbeat, every minute like a kubelet
                    self.post_node_status()
            except Exception:
                log.exception("heartbeat failed")
            beats += 1

    # --- pods -------------------------------------------------------------------------------------
    def handle(self, event_type: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        with self.lock:
            runner = self.runners.get(uid)
            if event_type == "DELETED":
                if runner:
                    runner.stop(0)
                    self.runners.pop(uid, None)
                return
            if pod["metadata"].get("deletionTimestamp"):
                grace = float(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
                if runner and runner.thread.is_alive():
                    runner.stop(min(grace, 30.0))
                else:  # never ran here, or already finished: nothing to stop
                    self.runners.pop(uid, None)
                    self._delete_now(pod["metadata"]["namespace"], pod["metadata"]["name"], uid)
                return
            if runner is None and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
                runner = agent_pods.PodRunner(self, pod)
                self.runners[uid] = runner
                runner.start()

    def finish_deletion(self, runner: agent_pods.PodRunner) -> None:
        with self.lock:
            self.runners.pop(runner.uid, None)
        self._delete_now(runner.namespace, runner.name, runner.uid)
        shutil.rmtree(runner.dir, ignore_errors=True)

    def _delete_now(self, namespace: str, name: str, uid: str) -> None:
        """What a kubelet does after stopping a pod: the final, zero-grace delete."""
        try:
            self.core.delete_namespaced_pod(
                name,
                namespace,
                body=client.V1DeleteOptions(grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid)),
            )
        except ApiException as exc:
            if exc.status not in (404, 409):
                log.warning("pod %s/%s: final delete failed: %s", namespace, name, exc.reason)

    def watch_pods(self) -> None:
        selector = f"spec.nodeName={self.node_name}"
        while not self.stopping.is_set():
            try:
                listed = self.core.list_pod_for_all_namespaces(field_selector=selector)
                for pod in listed.items:
                    self.handle("ADDED", self.api.sanitize_for_serialization(pod))
                w = watch.Watch()
                for event in w.stream(
                    self.core.list_pod_for_all_namespaces,
                    field_selector=selector,
                    resource_version=listed.metadata.resource_version,
                    timeout_seconds=300,
                ):
                    if self.stopping.is_set():
                        w.stop()
                        break
                    self.handle(event["type"], self.api.sanitize_for_serialization(event["object"]))
            except ApiException as exc:
                if exc.status != 410:  # an expired resourceVersion just means: list again
                    log.warning("pod watch failed (%s); listing again", exc.reason)
                    self.stopping.wait(1)
            except Exception:
                log.exception("pod watch failed; listing again")
                self.stopping.wait(1)

    def shutdown(self) -> None:
        self.stopping.set()
        with self.lock:
            runners = list(self.runners.values())
        for r in runners:
            r.stop(5)
        for r in runners:
            r.thread.join(timeout=10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--node-name", default="mmprep-agent")
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument(
        "--taint",
        action="store_true",
        help=f"taint the node {AGENT_LABEL}=true:NoSchedule so only pods that tolerate it run here",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s %(message)s")
    args.workdir.mkdir(parents=True, exist_ok=True)
    config.load_kube_config(config_file=args.kubeconfig)
    agent = Agent(node_name=args.node_name, workdir=args.workdir, taint=args.taint)
    agent.register()

    done = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping pods and exiting", signum)
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threading.Thread(target=agent.heartbeat, name="heartbeat", daemon=True).start()
    threading.Thread(target=agent.watch_pods, name="pod-watch", daemon=True).start()
    done.wait()
    agent.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

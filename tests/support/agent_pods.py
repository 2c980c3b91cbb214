"""Test agent, part two: running one pod's containers as local processes and reporting them.

TEST INFRASTRUCTURE ONLY (see agent.py for what the agent is and is not). ``PodRunner`` owns one
pod: it turns each container into a local command line (ports remapped, mounts and the
termination message file mapped to local paths, ``$(VAR)`` expanded), supervises the processes
per ``restartPolicy``, probes readiness, and writes the pod's status through ``pods/status``.
It talks to the rest of the agent only through ``Host``.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime as dt
import json
import logging
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Protocol

from kubernetes import client
from kubernetes.client.rest import ApiException

try:  # run under the agent script (hack/cluster-up.sh): this folder is on sys.path
    from servers import VLLM_CPU_ENV, free_port
except ImportError:  # imported as support.agent_pods
    from support.servers import VLLM_CPU_ENV, free_port

log = logging.getLogger("mmprep-test-agent")

PORTS_ANNOTATION = "agent.mmprep.dev/ports"
#: The image name (before the tag) of the runtime's vLLM flavor (the Dockerfile's runtime-vllm).
VLLM_IMAGE = "mmprep-runtime-vllm"
#: The runtime's sources, for ``python -m mmprep_runtime.cli`` in vLLM's virtualenv (it has no mmprep).
_RUNTIME_SOURCES = Path(__file__).resolve().parents[2] / "runtime"
#: The kubelet truncates termination messages to 4 KiB; so do we.
MESSAGE_LIMIT = 4096
MERGE_PATCH = "application/merge-patch+json"


class _ConfigMissing(Exception):
    """A container's env names a Secret or ConfigMap that does not exist (the kubelet's words)."""


class Host(Protocol):
    """What a PodRunner needs from the agent that owns it."""

    api: client.ApiClient
    core: client.CoreV1Api
    node_name: str
    workdir: Path
    #: PATH for the processes: the repo virtualenv's bin first.
    path: str
    #: Extra env for every process (MMPREP_AGENT_ENV_X=v on the agent becomes X=v).
    passthrough_env: dict[str, str]
    #: vLLM's virtualenv, for containers of the vLLM image; None: they run like the others.
    vllm_venv: Path | None

    def finish_deletion(self, runner: PodRunner) -> None: ...


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: known names are replaced, ``$$`` escapes, others stay."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR_REF.sub(one, value)


@dataclasses.dataclass
class Container:
    """One running (or finished) container of a pod: its process and what was rewritten for it."""

    name: str
    spec: dict[str, Any]
    argv: list[str]
    env: dict[str, str]
    cwd: str
    log_path: Path
    message_path: Path
    ports: dict[int, int]
    process: subprocess.Popen[bytes] | None = None
    started_at: str = ""
    restart_count: int = 0
    ready: bool = False
    last_state: dict[str, Any] | None = None
    terminated: dict[str, Any] | None = None
    next_start: float = 0.0


class PodRunner:
    """Runs one pod's containers and reports its status; one thread per pod."""

    def __init__(self, agent: Host, pod: dict[str, Any]) -> None:
        self.agent = agent
        self.namespace: str = pod["metadata"]["namespace"]
        self.name: str = pod["metadata"]["name"]
        self.uid: str = pod["metadata"]["uid"]
        self.pod = pod
        self.dir = Path(tempfile.mkdtemp(prefix=f"{self.namespace}_{self.name}_", dir=agent.workdir))
        self.stop_requested = threading.Event()
        self.grace_seconds = 30.0
        self.containers: list[Container] = []
        self.thread = threading.Thread(target=self._run, name=f"pod-{self.namespace}/{self.name}", daemon=True)

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def stop(self, grace_seconds: float) -> None:
        self.grace_seconds = grace_seconds
        self.stop_requested.set()

    def _run(self) -> None:
        try:
            while True:
                try:
                    self._prepare()
                    break
                except _ConfigMissing as exc:
                    # As the kubelet does: the container waits, says why, and is tried again.
                    self._report_config_error(str(exc))
                    if self.stop_requested.wait(2.0):
                        return
            self._supervise()
        except Exception as exc:
            log.exception("pod %s/%s failed in the agent", self.namespace, self.name)
            self._report_failure("AgentError", f"the test agent could not run this pod: {exc}")
        finally:
            self._kill_all(self.grace_seconds if self.stop_requested.is_set() else 0)
            if self.stop_requested.is_set():
                self.agent.finish_deletion(self)

    # --- preparing processes ------------------------------------------------------------------
    def _prepare(self) -> None:
        spec = self.pod["spec"]
        mounts = self._volume_paths(spec)
        ports: dict[str, dict[int, int]] = {}
        all_ports: dict[str, int] = {}
        for c in spec.get("containers", []):
            mapping = {int(p["containerPort"]): free_port() for p in c.get("ports") or []}
            ports[c["name"]] = mapping
            all_ports.update({str(k): v for k, v in mapping.items()})
        if all_ports:
            # Tests find the process through this annotation; the pod IP is 127.0.0.1 for all.
            self.agent.core.patch_namespaced_pod(
                self.name,
                self.namespace,
                {"metadata": {"annotations": {PORTS_ANNOTATION: json.dumps(all_ports)}}},
                _content_type=MERGE_PATCH,
            )
        if spec.get("initContainers"):
            raise RuntimeError("init containers are not supported by the test agent")
        for c in spec.get("containers", []):
            self.containers.append(self._container(c, ports[c["name"]], mounts))
        self._report()

    def _volume_paths(self, spec: dict[str, Any]) -> dict[str, str]:
        """Volume name -> local folder: hostPath as is, emptyDir as a fresh temp folder."""
        paths: dict[str, str] = {}
        for v in spec.get("volumes") or []:
            if v.get("hostPath"):
                paths[v["name"]] = v["hostPath"]["path"]
            elif "emptyDir" in v:
                d = self.dir / "volumes" / v["name"]
                d.mkdir(parents=True, exist_ok=True)
                paths[v["name"]] = str(d)
        return paths

    def _container(self, c: dict[str, Any], ports: dict[int, int], volumes: dict[str, str]) -> Container:
        command = list(c.get("command") or [])
        if not command:
            raise RuntimeError(
                f"container {c['name']!r} has no command; the test agent ignores images, so it cannot know their entrypoint"
            )
        env = self._env(c)
        argv = [expand(a, env) for a in command + list(c.get("args") or [])]
        venv = self.agent.vllm_venv
        image_name = c.get("image", "").rsplit("/", 1)[-1].split(":", 1)[0]
        if venv is not None and image_name == VLLM_IMAGE and argv[0] == "mmprep-runtime":
            # What the vLLM image runs: the runtime beside vLLM, on the CPU, offline.
            argv = [str(venv / "bin" / "python"), "-m", "mmprep_runtime.cli", *argv[1:]]
            env.update({**VLLM_CPU_ENV, "PYTHONPATH": str(_RUNTIME_SOURCES)})
        message_file = c.get("terminationMessagePath") or "/dev/termination-log"
        message_path = self.dir / f"{c['name']}.termination-log"
        # Mount paths map onto local folders; longest first so nested mounts win. A mount over
        # /tmp only becomes TMPDIR: rewriting every /tmp path would hide the test's own folders.
        mounted = [m for m in c.get("volumeMounts") or [] if m["name"] in volumes]
        prefixes = sorted(
            (
                (m["mountPath"].rstrip("/"), os.path.join(volumes[m["name"]], m.get("subPath") or "").rstrip("/"))
                for m in mounted
                if m["mountPath"].rstrip("/") != "/tmp"
            ),
            key=lambda pair: -len(pair[0]),
        )
        for m in mounted:
            if m["mountPath"].rstrip("/") == "/tmp":
                env["TMPDIR"] = volumes[m["name"]]

        def local(value: str) -> str:
            if value == message_file:
                return str(message_path)
            for mount, path in prefixes:
                if value == mount or value.startswith(mount + "/"):
                    return path + value[len(mount) :]
            return value

        argv = [local(a) for a in argv]
        argv = self._rewrite_ports(argv, ports)
        env = {k: local(v) for k, v in env.items()}
        workdir = local(c.get("workingDir") or "")
        if not workdir or not os.path.isdir(workdir):
            workdir = str(self.dir)
        return Container(
            name=c["name"],
            spec=c,
            argv=argv,
            env=env,
            cwd=workdir,
            log_path=self.dir / f"{c['name']}.log",
            message_path=message_path,
            ports=ports,
        )

    @staticmethod
    def _rewrite_ports(argv: list[str], ports: dict[int, int]) -> list[str]:
        out: list[str] = []
        for i, a in enumerate(argv):
            if i > 0 and argv[i - 1] == "--port" and a.isdigit() and int(a) in ports:
                a = str(ports[int(a)])
            elif a.startswith("--port=") and a[7:].isdigit() and int(a[7:]) in ports:
                a = f"--port={ports[int(a[7:])]}"
            out.append(a)
        return out

    def _env(self, c: dict[str, Any]) -> dict[str, str]:
        """The container's env on top of a minimal host env; ``$(VAR)`` refers to earlier ones."""
        env = {
            "PATH": self.agent.path,
            "HOME": os.environ.get("HOME", str(self.dir)),
            "LANG": "C.UTF-8",
            "TMPDIR": str(self.dir),
            "HOSTNAME": self.name,
            # No hub exists where the agent runs; fail fast instead of waiting on the network.
            "HF_HUB_OFFLINE": "1",
        }
        env.update(self.agent.passthrough_env)
        for src in c.get("envFrom") or []:
            prefix = src.get("prefix") or ""
            data = self._source_data(src.get("configMapRef"), src.get("secretRef"))
            env.update({prefix + k: v for k, v in data.items()})
        for e in c.get("env") or []:
            if "value" in e:
                env[e["name"]] = expand(e["value"] or "", env)
            elif e.get("valueFrom"):
                value = self._value_from(e["valueFrom"])
                if value is not None:
                    env[e["name"]] = value
        return env

    def _source_data(self, cm_ref: dict[str, Any] | None, secret_ref: dict[str, Any] | None) -> dict[str, str]:
        try:
            if cm_ref:
                cm = self.agent.core.read_namespaced_config_map(cm_ref["name"], self.namespace)
                return dict(cm.data or {})
            if secret_ref:
                s = self.agent.core.read_namespaced_secret(secret_ref["name"], self.namespace)
                return {k: base64.b64decode(v).decode() for k, v in (s.data or {}).items()}
        except ApiException as exc:
            optional = (cm_ref or secret_ref or {}).get("optional")
            if exc.status == 404 and optional:
                return {}
            if exc.status == 404:
                kind, ref = ("configmap", cm_ref) if cm_ref else ("secret", secret_ref)
                raise _ConfigMissing(f'{kind} "{(ref or {}).get("name")}" not found') from None
            raise
        return {}

    def _value_from(self, src: dict[str, Any]) -> str | None:
        meta = self.pod["metadata"]
        if src.get("fieldRef"):
            path = src["fieldRef"]["fieldPath"]
            m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
            if m:
                return (meta.get(m.group(1)) or {}).get(m.group(2), "")
            fields = {
                "metadata.name": meta["name"],
                "metadata.namespace": meta["namespace"],
                "metadata.uid": meta["uid"],
                "spec.nodeName": self.agent.node_name,
                "spec.serviceAccountName": self.pod["spec"].get("serviceAccountName", ""),
                "status.podIP": "127.0.0.1",
                "status.hostIP": "127.0.0.1",
            }
            return fields.get(path, "")
        if src.get("resourceFieldRef"):
            return str(os.cpu_count() or 1) if "cpu" in src["resourceFieldRef"]["resource"] else "0"
        ref = src.get("configMapKeyRef") or src.get("secretKeyRef")
        if ref:
            data = self._source_data(ref if src.get("configMapKeyRef") else None, ref if src.get("secretKeyRef") else None)
            return data.get(ref["key"])
        return None

    # --- running --------------------------------------------------------------------------------
    def _restart_policy(self) -> str:
        return str(self.pod["spec"].get("restartPolicy") or "Always")

    def _spawn(self, c: Container) -> None:
        c.message_path.write_bytes(b"")
        log_file = open(c.log_path, "ab")  # noqa: SIM115 - the child owns it from here
        try:
            c.process = subprocess.Popen(
                c.argv,
                env=c.env,
                cwd=c.cwd,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                # Own process group, so a stop reaches the children the command starts too.
                start_new_session=True,
            )
        except OSError as exc:
            c.terminated = {
                "exitCode": 128,
                "reason": "StartError",
                "message": str(exc)[:MESSAGE_LIMIT],
                "startedAt": now(),
                "finishedAt": now(),
            }
            c.process = None
            return
        finally:
            log_file.close()
        c.started_at = now()
        c.ready = False
        c.terminated = None
        log.info("pod %s/%s container %s: pid %d: %s", self.namespace, self.name, c.name, c.process.pid, c.argv)

    def _supervise(self) -> None:
        for c in self.containers:
            self._spawn(c)
        self._report()
        while not self.stop_requested.is_set():
            changed = False
            for c in self.containers:
                changed |= self._check(c)
            if changed:
                self._report()
            if all(c.terminated and not self._will_restart(c) for c in self.containers):
                return
            self.stop_requested.wait(0.5)

    def _will_restart(self, c: Container) -> bool:
        policy = self._restart_policy()
        code = (c.terminated or {}).get("exitCode", 0)
        return policy == "Always" or (policy == "OnFailure" and code != 0)

    def _check(self, c: Container) -> bool:
        """One supervision step for a container; True when its reported state changed."""
        if c.process is None:
            if c.terminated and self._will_restart(c) and time.monotonic() >= c.next_start:
                c.last_state = {"terminated": c.terminated}
                c.restart_count += 1
                self._spawn(c)
                return True
            return False
        code = c.process.poll()
        if code is not None:
            c.process = None
            c.ready = False
            c.terminated = {
                "exitCode": code,
                "reason": "Completed" if code == 0 else "Error",
                "startedAt": c.started_at,
                "finishedAt": now(),
            }
            message = self._termination_message(c, code)
            if message:
                c.terminated["message"] = message
            # Crash-loop back-off, short because tests wait on it: 1, 2, 4, ... 10 s.
            c.next_start = time.monotonic() + min(10.0, 2.0 ** min(c.restart_count, 4))
            log.info("pod %s/%s container %s exited %d", self.namespace, self.name, c.name, code)
            return True
        ready = self._probe(c)
        if ready != c.ready:
            c.ready = ready
            return True
        return False

    def _termination_message(self, c: Container, code: int) -> str:
        with contextlib.suppress(OSError):
            text = c.message_path.read_bytes()[:MESSAGE_LIMIT].decode(errors="replace")
            if text.strip():
                return text
        if code != 0 and c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            with contextlib.suppress(OSError):
                lines = c.log_path.read_bytes().decode(errors="replace").splitlines()[-80:]
                return "\n".join(lines)[-2048:]
        return ""

    def _probe(self, c: Container) -> bool:
        probe = c.spec.get("readinessProbe")
        if not probe:
            return True
        try:
            if probe.get("httpGet"):
                http = probe["httpGet"]
                port = self._resolve_port(c, http["port"])
                url = f"http://127.0.0.1:{port}{http.get('path') or '/'}"
                with urllib.request.urlopen(url, timeout=1) as resp:
                    return 200 <= resp.status < 400
            if probe.get("tcpSocket"):
                port = self._resolve_port(c, probe["tcpSocket"]["port"])
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return True
            if probe.get("exec"):
                done = subprocess.run(probe["exec"]["command"], env=c.env, cwd=c.cwd, capture_output=True, timeout=5, check=False)
                return done.returncode == 0
        except (OSError, urllib.error.URLError, subprocess.TimeoutExpired, ValueError):
            return False
        return True

    @staticmethod
    def _resolve_port(c: Container, port: int | str) -> int:
        if isinstance(port, str) and not port.isdigit():
            for p in c.spec.get("ports") or []:
                if p.get("name") == port:
                    port = p["containerPort"]
                    break
            else:
                raise ValueError(f"no container port named {port!r}")
        return c.ports.get(int(port), int(port))

    def _kill_all(self, grace_seconds: float) -> None:
        procs = [c.process for c in self.containers if c.process is not None]
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()

    # --- status ---------------------------------------------------------------------------------
    def _container_status(self, c: Container) -> dict[str, Any]:
        status: dict[str, Any] = {
            "name": c.name,
            "image": c.spec.get("image", ""),
            "imageID": "",
            "containerID": f"mmprep-agent://{self.uid}/{c.name}/{c.restart_count}",
            "restartCount": c.restart_count,
            "ready": c.ready,
            "started": c.process is not None,
        }
        if c.process is not None:
            status["state"] = {"running": {"startedAt": c.started_at}}
        elif c.terminated and self._will_restart(c):
            status["state"] = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off restarting the process"}}
            status["lastState"] = {"terminated": c.terminated}
        elif c.terminated:
            status["state"] = {"terminated": c.terminated}
        else:
            status["state"] = {"waiting": {"reason": "ContainerCreating"}}
        if c.last_state and "lastState" not in status:
            status["lastState"] = c.last_state
        return status

    def _phase(self) -> str:
        # Never a terminal phase before every container ran: controllers count Failed pods (a
        # Job's backoff limit), and a pod cannot leave a terminal phase.
        if not self.containers or any(c.process is None and c.terminated is None for c in self.containers):
            return "Pending"
        if any(c.process is not None for c in self.containers):
            return "Running"
        if any(self._will_restart(c) for c in self.containers):
            return "Running"
        codes = [(c.terminated or {}).get("exitCode", 1) for c in self.containers]
        return "Succeeded" if all(code == 0 for code in codes) else "Failed"

    def _report(self) -> None:
        ts = now()
        ready = bool(self.containers) and all(c.ready for c in self.containers)
        phase = self._phase()
        conditions = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": ts},
            {"type": "Initialized", "status": "True", "lastTransitionTime": ts},
            {"type": "ContainersReady", "status": str(ready), "lastTransitionTime": ts},
            {"type": "Ready", "status": str(ready), "lastTransitionTime": ts},
        ]
        status = {
            "phase": phase,
            "conditions": self._keep_transition_times(conditions),
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "startTime": self.pod.get("status", {}).get("startTime") or ts,
            "containerStatuses": [self._container_status(c) for c in self.containers],
        }
        self._patch_status(status)

    def _keep_transition_times(self, conditions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A condition's transition time changes only when its status does (API convention)."""
        old = {c.get("type"): c for c in (self.pod.get("status") or {}).get("conditions") or []}
        for c in conditions:
            prev = old.get(c["type"])
            if prev and prev.get("status") == c["status"] and prev.get("lastTransitionTime"):
                c["lastTransitionTime"] = prev["lastTransitionTime"]
        return conditions

    def _report_config_error(self, message: str) -> None:
        """The kubelet's CreateContainerConfigError: a container's env names a missing object."""
        containers = self.pod["spec"].get("containers") or []
        self._patch_status(
            {
                "phase": "Pending",
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now()},
                    {"type": "Ready", "status": "False", "reason": "ContainersNotReady", "lastTransitionTime": now()},
                ],
                "containerStatuses": [
                    {
                        "name": c["name"],
                        "image": c.get("image", ""),
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {"waiting": {"reason": "CreateContainerConfigError", "message": message}},
                    }
                    for c in containers
                ],
            }
        )

    def _report_failure(self, reason: str, message: str) -> None:
        self._patch_status(
            {
                "phase": "Failed",
                "reason": reason,
                "message": message[:MESSAGE_LIMIT],
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now()},
                    {"type": "Ready", "status": "False", "reason": reason, "lastTransitionTime": now()},
                ],
            }
        )

    def _patch_status(self, status: dict[str, Any]) -> None:
        try:
            pod = self.agent.core.patch_namespaced_pod_status(
                self.name, self.namespace, {"status": status}, _content_type=MERGE_PATCH
            )
            self.pod = self.agent.api.sanitize_for_serialization(pod)
        except ApiException as exc:
            if exc.status != 404:  # gone already: nothing left to report to
                log.warning("pod %s/%s: status update failed: %s", self.namespace, self.name, exc.reason)

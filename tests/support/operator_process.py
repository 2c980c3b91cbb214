"""The operator as a real subprocess (`mmprep-operator run`), as tests and the demo run it.

Killing and restarting it is part of what is tested (convergence after a crash mid-reconcile),
so the process is an object with ``start``, ``kill`` and ``stop`` rather than a bare fixture.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

from support.kube import Cluster, wait_for
from support.servers import free_port


class OperatorProcess:
    def __init__(
        self,
        cluster: Cluster,
        *,
        log_dir: Path,
        namespaces: list[str] | None = None,
        policy_file: Path | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        self.cluster = cluster
        self.log_dir = log_dir
        # Namespace globs it watches (None: all). Scoping keeps operators of the tests, the demo
        # and the benchmark from reconciling each other's resources on a shared cluster.
        self.namespaces = namespaces
        self.policy_file = policy_file
        self.extra_args = list(extra_args or [])
        self.process: subprocess.Popen[bytes] | None = None
        self.health_port = 0
        self.metrics_port = 0
        self.starts = 0
        self._log: IO[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.log_dir / "operator.log"

    def command(self) -> list[str]:
        exe = Path(sys.executable).parent / "mmprep-operator"
        return [
            str(exe),
            "run",
            *([a for ns in self.namespaces for a in ("--namespace", ns)] if self.namespaces else ["--all-namespaces"]),
            "--kubeconfig",
            str(self.cluster.kubeconfig),
            "--bind-address",
            "127.0.0.1",
            "--liveness-port",
            str(self.health_port),
            "--metrics-port",
            str(self.metrics_port),
            *(["--policy-file", str(self.policy_file)] if self.policy_file else []),
            *self.extra_args,
        ]

    def start(self, *, timeout: float = 60) -> None:
        assert self.process is None or self.process.poll() is not None, "operator already running"
        self.health_port, self.metrics_port = free_port(), free_port()
        self.starts += 1
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop/kill
        self._log.write(f"\n===== start #{self.starts}: {' '.join(self.command())}\n".encode())
        self._log.flush()
        self.process = subprocess.Popen(
            self.command(), env=self.cluster.env(), stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        wait_for(self.healthy, timeout, what="the operator's liveness endpoint", describe=self.tail)

    def healthy(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            raise AssertionError(f"the operator exited ({self.process and self.process.returncode}):\n{self.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
            return resp.read().decode()

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no operator log)"

    def kill(self) -> None:
        """SIGKILL: no cleanup, no finalizer handling, as a crashed or evicted operator."""
        if self.process and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        self._close_log()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        self._close_log()

    def _close_log(self) -> None:
        if self._log:
            self._log.close()
            self._log = None

"""The kind cluster's bring-up, started in the background when the session starts.

Creating the kind cluster and loading the 6 GB runtime image into its two workers is the longest
single step of the test suite, and most of it is waiting on disks and on kubelets. Started at
collection time (tests/e2e/conftest.py, which also moves the kind tests to the end of the session),
it overlaps with every other tier; the kind tests' fixture then waits for it. hack/docker/kind-up.sh
is idempotent and holds a lock, so a second call (a developer running only the kind tests) waits for
the first and finds the cluster ready.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from pathlib import Path

import pytest

from support.kube import HACK, REPO

# One cluster per checkout, so two checkouts on one machine never share (or delete) one.
CLUSTER = os.environ.get("KIND_CLUSTER", f"mmprep-e2e-{hashlib.sha1(str(REPO).encode()).hexdigest()[:6]}")
NAMESPACE = "mmprep-demo"
KUBECONFIG = Path(os.environ.get("MMPREP_CACHE") or Path.home() / ".cache" / "mmprep") / "kind" / f"{CLUSTER}.kubeconfig"


def kind_env() -> dict[str, str]:
    """What hack/docker/kind-up.sh and kind-down.sh are told: the cluster, its namespace, the kubeconfig."""
    return {**os.environ, "KIND_CLUSTER": CLUSTER, "KIND_NAMESPACE": NAMESPACE, "KIND_KUBECONFIG": str(KUBECONFIG)}


def kind_down() -> None:
    subprocess.run([str(HACK / "docker" / "kind-down.sh")], env=kind_env(), timeout=300, check=False)


class KindBringUp:
    """kind-up.sh running (or done); ``consumed`` once the kind tests' fixture has taken it."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.consumed = False
        self.started = time.monotonic()
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [str(HACK / "docker" / "kind-up.sh")], env=kind_env(), stdout=subprocess.PIPE, stderr=out, start_new_session=True
            )

    def wait(self, timeout: float) -> tuple[int, str, str]:
        """(exit code, kubeconfig path printed on stdout, the log) once the bring-up has ended."""
        assert self.proc.stdout is not None
        self.consumed = True
        stdout = self.proc.stdout.read().decode()
        code = self.proc.wait(timeout=timeout)
        took = time.monotonic() - self.started
        text = self.log.read_text(errors="replace")
        return code, (stdout.strip().splitlines() or [""])[-1], f"{text}\n(kind bring-up: {took:.0f} s, in the background)"

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            self.proc.wait(timeout=60)


#: Where the session keeps its bring-up (tests/e2e/conftest.py puts it, the kind fixture takes it).
BRINGUP = pytest.StashKey[KindBringUp]()

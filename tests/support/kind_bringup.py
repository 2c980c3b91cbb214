"""The kind cluster's bring-up, started in the background behind the other tiers.

Creating the kind cluster and loading the 6 GB runtime image into its two workers is the longest
single step of the test suite, and most of it is waiting on disks and on kubelets. Started as the
first test after the compatibility tier is set up (tests/e2e/conftest.py, which also moves the kind
tests to the end of the session), it overlaps with the tiers that mostly wait on an API server; the
kind tests' fixture then waits for it. hack/docker/kind-up.sh is idempotent and holds a lock, so a
second call (a developer running only the kind tests) waits for the first and finds the cluster
ready.
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
STATE = Path(os.environ.get("MMPREP_CACHE") or Path.home() / ".cache" / "mmprep") / "kind"
KUBECONFIG = STATE / f"{CLUSTER}.kubeconfig"
#: The background bring-up's output, printed by the kind tests' fixture when it takes it.
LOG = STATE / f"{CLUSTER}.up.log"


def kind_env() -> dict[str, str]:
    """What hack/docker/kind-up.sh and kind-down.sh are told: the cluster, its namespace, the kubeconfig."""
    return {**os.environ, "KIND_CLUSTER": CLUSTER, "KIND_NAMESPACE": NAMESPACE, "KIND_KUBECONFIG": str(KUBECONFIG)}


def kind_down() -> None:
    subprocess.run([str(HACK / "docker" / "kind-down.sh")], env=kind_env(), timeout=300, check=False)


class KindBringUp:
    """kind-up.sh running (or done); ``consumed`` once the kind tests' fixture has taken it."""

    def __init__(self) -> None:
        self.consumed = False
        self.started = time.monotonic()
        LOG.parent.mkdir(parents=True, exist_ok=True)
        with LOG.open("wb") as out:
            # kind-up.sh prints only the kubeconfig path on stdout, which is KUBECONFIG: not kept.
            # At the lowest CPU priority: it runs beside every other tier, whose tests wait on
            # deadlines, and it only has to be done by the time the kind tests start.
            self.proc = subprocess.Popen(
                ["nice", "-n", "19", str(HACK / "docker" / "kind-up.sh")],
                env=kind_env(),
                stdout=subprocess.DEVNULL,
                stderr=out,
                start_new_session=True,
            )

    def wait(self, timeout: float) -> tuple[int, str]:
        """(exit code, the log) once the bring-up has ended."""
        self.consumed = True
        code = self.proc.wait(timeout=timeout)
        took = time.monotonic() - self.started
        return code, f"{LOG.read_text(errors='replace')}\n(kind bring-up: {took:.0f} s, in the background)"

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            self.proc.wait(timeout=60)


#: Where the session keeps its bring-up (tests/e2e/conftest.py puts it, the kind fixture takes it).
BRINGUP = pytest.StashKey[KindBringUp]()

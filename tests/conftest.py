"""Fixtures shared by the test tiers.

Cluster section: the real local control plane (hack/cluster-up.sh: etcd, kube-apiserver,
controller-manager, scheduler, KWOK nodes from hack/nodes.yaml, and the test agent that runs pods
as local processes), the CRD, the operator as a real subprocess, throwaway namespaces and model
folders. Nothing here is mocked. The cluster is started when absent and stopped at the end of the
session only when this session started it (``MMPREP_KEEP_CLUSTER=1`` keeps it for the next run).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.kube import HACK, REPO, Cluster, Kube, wait_for
from support.operator_process import OperatorProcess
from support.tier_times import TierTimes


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TierTimes(), "mmprep-tier-times")


# ---------------------------------------------------------------------------------------- cluster


def _script(name: str, *, timeout: float, env: dict[str, str] | None = None) -> str:
    """Runs a hack/ script; its progress (stderr) goes to the terminal, its answer is stdout."""
    done = subprocess.run([str(HACK / name)], stdout=subprocess.PIPE, text=True, timeout=timeout, check=False, env=env)
    if done.returncode != 0:
        pytest.fail(f"hack/{name} failed with exit code {done.returncode}; see its output above", pytrace=False)
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def _agent_env() -> dict[str, str]:
    """The environment the test agent starts with: vLLM's virtualenv where it is installed (`make
    test` installs it first), so pods of the vLLM image run as that image would."""
    done = subprocess.run(
        [str(HACK / "vllm" / "venv.sh")],
        env={**os.environ, "MMPREP_VLLM_IF_INSTALLED": "1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        print(f"the test agent runs vLLM-image pods from this virtualenv: {done.stderr.strip()}")
        return dict(os.environ)
    return {**os.environ, "MMPREP_AGENT_VLLM_VENV": done.stdout.strip().splitlines()[-1]}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """The local control plane, started when absent (the binaries must be built: `make test` does).

    Several pytest sessions may share one cluster (a developer's, a colleague's); each registers
    itself, and the session that started the cluster stops it only when no other session is left.
    """
    if os.environ.get("MMPREP_SKIP_CLUSTER") == "1":
        pytest.skip("MMPREP_SKIP_CLUSTER=1: tests that need the local control plane are switched off")
    state = Path(os.environ.get("MMPREP_CLUSTER_DIR") or Path.home() / ".cache" / "mmprep" / "cluster")
    sessions = state.parent / f"{state.name}.sessions"
    sessions.mkdir(parents=True, exist_ok=True)
    me = sessions / str(os.getpid())
    me.touch()
    was_up = subprocess.run([str(HACK / "cluster-status.sh")], capture_output=True, check=False).returncode == 0
    try:
        kubeconfig = Path(_script("cluster-up.sh", timeout=3600, env=_agent_env()))
        bin_dir = Path(_script("build-control-plane.sh", timeout=3600))
        yield Cluster(kubeconfig=kubeconfig, bin_dir=bin_dir, state_dir=kubeconfig.parent)
    finally:
        me.unlink(missing_ok=True)
        others = []
        for p in sessions.iterdir():
            if p.name.isdigit() and _pid_alive(int(p.name)):
                others.append(p)
            else:
                p.unlink(missing_ok=True)  # left by a session that was killed
        if not was_up and not others and os.environ.get("MMPREP_KEEP_CLUSTER") != "1":
            subprocess.run([str(HACK / "cluster-down.sh")], check=False, timeout=180)


@pytest.fixture(scope="session")
def kube(cluster: Cluster) -> Iterator[Kube]:
    api = cluster.api_client()
    yield Kube(api)
    api.close()


@pytest.fixture(scope="session")
def crd(cluster: Cluster, kube: Kube) -> str:
    """The committed CRD (what users apply), installed and Established."""
    files = sorted((REPO / "crds").glob("*.yaml"))
    assert files, "no CRD under crds/ (generate it with `mmprep-operator crd`)"
    for f in files:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(f))
    name = "multimodalpreprocessors.mmprep.dev"

    def established() -> bool:
        obj = kube.ext.read_custom_resource_definition(name)
        return any(c.type == "Established" and c.status == "True" for c in obj.status.conditions or [])

    wait_for(established, 30, what=f"CRD {name} Established")
    # `kubectl api-resources` re-reads discovery (and refreshes kubectl's cache), so later
    # `kubectl get mmp` or `kubectl explain mmp` calls know the new type.
    wait_for(
        lambda: "multimodalpreprocessors" in cluster.kubectl("api-resources", "--api-group=mmprep.dev", "-o", "name").stdout,
        30,
        what="the CRD in API discovery",
    )
    # A new CRD's storage (watch cache) initializes a moment later; until then lists answer 429
    # "storage is (re)initializing", and an operator started into that can stall its watch.
    wait_for(
        lambda: cluster.kubectl("get", "mmp", "--all-namespaces", "-o", "name", check=False).returncode == 0,
        60,
        what="the CRD's storage to serve lists",
    )
    return name


#: Namespaces of tests that use the shared `operator` fixture start with this, and that operator
#: watches only those. Other tests' namespaces (``ns-...``) are left alone, so a test may run an
#: operator of its own (e.g. with the Helm chart's token) without the shared one competing, and
#: the demo's operator (watching only its namespace) can share the cluster.
TEST_NAMESPACE_PREFIX = "it-"
UNWATCHED_NAMESPACE_PREFIX = "ns-"

#: The operator policy the tests run with: an admin's per-GPU measurement (GB300, GPU path: 3),
#: short calibration runs (calibration stays off unless a resource asks for it), and a spec.engine
#: checked every 3 s (the default 15), so that a test sees an engine go away within seconds.
OPERATOR_POLICY = """\
defaultImage: mmprep-runtime:test
overrides:
- gpuProduct: NVIDIA-GB300
  path: gpu
  processor: 3
calibration:
  secondsPerCount: 2
  imageSizes: ["640x480"]
  timeoutSeconds: 240
engineCheckSeconds: 3
"""


@pytest.fixture(scope="session")
def operator(cluster: Cluster, crd: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """`mmprep-operator run` as a real subprocess with the admin kubeconfig, on the test namespaces."""
    log_dir = tmp_path_factory.mktemp("operator")
    policy = log_dir / "policy.yaml"
    policy.write_text(OPERATOR_POLICY)
    proc = OperatorProcess(cluster, log_dir=log_dir, namespaces=[f"{TEST_NAMESPACE_PREFIX}*"], policy_file=policy)
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def namespace(kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace named after the test, deleted afterwards (children go with it).

    Watched by the shared `operator` fixture only when the test uses that fixture.
    """
    stem = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:37].rstrip("-")
    prefix = TEST_NAMESPACE_PREFIX if "operator" in request.fixturenames else UNWATCHED_NAMESPACE_PREFIX
    name = f"{prefix}{stem}-{uuid.uuid4().hex[:5]}"
    kube.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"mmprep.dev/test": "true"})))
    # Pods are refused until the namespace's default ServiceAccount exists.
    wait_for(lambda: kube.core.read_namespaced_service_account("default", name), 30, what=f"ServiceAccount {name}/default")
    yield name
    with contextlib.suppress(ApiException):
        kube.core.delete_namespace(name)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Builds a real processor folder with `mmprep-runtime make-model` (no hub), once per kind."""
    cache: dict[tuple[str, str, int | None], Path] = {}
    cli = Path(sys.executable).parent / "mmprep-runtime"

    def make(kind: str, *, backend: str = "torchvision", declared_workers: int | None = None) -> Path:
        key = (kind, backend, declared_workers)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"model-{kind}-{backend}-{declared_workers or 0}") / "model"
            args = [str(cli), "make-model", "--kind", kind, "--out", str(out), "--backend", backend]
            if declared_workers is not None:
                args += ["--declared-workers", str(declared_workers)]
            done = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
            assert done.returncode == 0, f"make-model {kind} failed: {done.stderr}"
            cache[key] = Path(done.stdout.strip().splitlines()[-1])
        return cache[key]

    return make

"""kind e2e: the images and the chart on a real kind cluster, with a real request through the Service.

hack/docker/kind-up.sh builds and loads the images, fakes one H200 node (GPU Feature Discovery
labels, `nvidia.com/gpu` capacity) next to a CPU-only node, and installs the chart. The test then
applies examples/mixed-cluster.yaml, waits for Ready with the pools the local-cluster suite expects
(the same expectations, example_scenarios.py), and sends a real POST /v1/preprocess through the
Service. Runs with `make kind-e2e`; skipped, with the reason, where kind, a Docker engine or the
kind node image is missing (this project's build machines have no registry to pull it from).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from example_scenarios import expected_pools, load_example, wait_until_decided_and_ready
from packaging_support import DOCKER_HACK, HACK, docker, docker_engine
from support.kube import Kube, wait_for

# Setup builds and loads the images and creates the cluster: many minutes the first time.
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(3600)]

CLUSTER = os.environ.get("KIND_CLUSTER", "mmprep-e2e")
NAMESPACE = "mmprep-demo"
DEFAULT_NODE_IMAGE = "kindest/node:v1.35.8@sha256:07b2536e30b803ed61d1677a79df6115f798ce64c80f9e22f6ed45afd09323c0"


def _kind_binary() -> str | None:
    if os.environ.get("KIND"):
        return os.environ["KIND"]
    cached = Path(os.environ.get("MMPREP_CACHE", Path.home() / ".cache" / "mmprep")) / "bin" / "kind-v0.33.0" / "kind"
    if cached.is_file():
        return str(cached)
    if os.environ.get("MMPREP_KIND_E2E") == "1":  # `make kind-e2e`: install it
        done = subprocess.run([str(DOCKER_HACK / "install-kind.sh")], capture_output=True, text=True, timeout=900, check=False)
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
    return None


def _why_kind_cannot_run(node_image: str) -> str | None:
    kind = _kind_binary()
    if kind is None:
        return "kind is not installed (hack/docker/install-kind.sh, or `make kind-e2e`, installs it)"
    reason = docker_engine()
    if reason:
        return f"no Docker engine: {reason}"
    if docker("image", "inspect", node_image, check=False).returncode != 0:
        # Only an explicit `make kind-e2e` reaches for a registry; a plain test run stays offline.
        if os.environ.get("MMPREP_KIND_E2E") != "1":
            return (
                f"kind node image {node_image} is not in the local engine (load it with `docker load -i node.tar`, "
                "set KIND_NODE_IMAGE, or run `make kind-e2e` to pull it)"
            )
        pulled = docker("pull", node_image, check=False, timeout=180)
        if pulled.returncode != 0:
            last = (pulled.stderr.strip().splitlines() or ["no output"])[-1]
            return (
                f"kind node image {node_image} is not available: not in the local engine and `docker pull` failed "
                f"({last}). Load it (`docker load -i node.tar`) or set KIND_NODE_IMAGE"
            )
    info = json.loads(docker("info", "--format", "{{json .}}").stdout)
    version = re.search(r":v1\.(\d+)", node_image)
    if str(info.get("CgroupVersion")) == "1" and version and int(version.group(1)) >= 35:
        return f"{node_image} needs cgroup v2 and this host runs cgroup v1 (use a node image <= v1.34)"
    return None


@pytest.fixture(scope="module")
def kind_kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Kube, Path]]:
    node_image = os.environ.get("KIND_NODE_IMAGE", DEFAULT_NODE_IMAGE)
    reason = _why_kind_cannot_run(node_image)
    if reason:
        pytest.skip(f"kind e2e skipped: {reason}")
    kubeconfig = tmp_path_factory.mktemp("kind") / "kubeconfig"
    env = {**os.environ, "KIND": str(_kind_binary()), "KIND_CLUSTER": CLUSTER, "KIND_NODE_IMAGE": node_image,
           "KIND_NAMESPACE": NAMESPACE, "KIND_KUBECONFIG": str(kubeconfig)}  # fmt: skip
    up = subprocess.run([str(DOCKER_HACK / "kind-up.sh")], env=env, text=True, stdout=subprocess.PIPE, timeout=3600, check=False)
    try:
        assert up.returncode == 0, "hack/docker/kind-up.sh failed; see its output above"
        from kubernetes import config

        yield Kube(config.new_client_from_config(config_file=str(kubeconfig))), kubeconfig
    finally:
        if os.environ.get("MMPREP_KEEP_KIND") != "1":
            subprocess.run([str(DOCKER_HACK / "kind-down.sh")], env=env, timeout=300, check=False)


def _kubectl() -> str:
    from shutil import which

    found = which("kubectl")
    if found:
        return found
    done = subprocess.run([str(HACK / "build-control-plane.sh")], stdout=subprocess.PIPE, text=True, timeout=3600, check=True)
    return str(Path(done.stdout.strip().splitlines()[-1]) / "kubectl")


def test_chart_on_kind_reconciles_an_example_and_serves_through_the_service(kind_kube: tuple[Kube, Path]) -> None:
    kube, kubeconfig = kind_kube
    kubectl = [_kubectl(), "--kubeconfig", str(kubeconfig)]
    doc = load_example("mixed-cluster")
    # Sized for a laptop: one small pod per pool instead of the example's production requests.
    doc["spec"]["replicas"] = 2
    doc["spec"]["resources"] = {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}
    subprocess.run([*kubectl, "apply", "--server-side", "-n", NAMESPACE, "-f", "-"], input=yaml.safe_dump(doc), text=True, check=True, timeout=60)

    # The kind cluster has one fake H200 node and one CPU-only node: those two pools, decided as
    # on the local cluster.
    def probed() -> dict | None:
        status = kube.get_mmp(NAMESPACE, doc["metadata"]["name"]).get("status") or {}
        return (status.get("probe") or {}).get("result")

    result = wait_for(probed, 600, what="the probe Job's result")
    everywhere = expected_pools("mixed-cluster", result.get("declaredWorkers"))
    expected = {pool: everywhere[pool] for pool in ("cpu", "nvidia-h200")}
    obj = wait_until_decided_and_ready(kube, NAMESPACE, doc["metadata"]["name"], expected, timeout=600)

    service = obj["metadata"]["name"]
    forward = subprocess.Popen(
        [*kubectl, "-n", NAMESPACE, "port-forward", f"service/{service}", ":8080"], stdout=subprocess.PIPE, text=True
    )
    try:
        line = forward.stdout.readline() if forward.stdout else ""
        match = re.search(r"127\.0\.0\.1:(\d+)", line)
        assert match, f"port-forward said: {line!r}"
        body = json.dumps({"text": "describe <|image_pad|>", "images": [_png()]}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{match.group(1)}/v1/preprocess", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            answer = json.loads(resp.read())
        assert resp.status == 200 and answer["input_ids"], answer
    finally:
        forward.terminate()
        forward.wait(timeout=30)


def _png() -> str:
    import base64
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (20, 120, 200)).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()

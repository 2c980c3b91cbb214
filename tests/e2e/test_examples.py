"""examples/: each one does what its comment says, rendered offline and applied to a real API server.

Offline: `mmprep-operator render` on hack/nodes.yaml with the real probe of the model the examples
name. Online: each example applied with `kubectl apply --server-side` (schema, defaults and CEL
rules of the real API server), then reconciled by the operator to Ready with the same pools. For
the local control plane the examples' model volume becomes a hostPath and the probe goes to the
test agent's node (as `make demo` does); nothing else changes.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from support.example_scenarios import (
    example_names,
    expected_pools,
    load_example,
    pools_of_rendered,
    wait_until_decided_and_ready,
    write_models_dir,
)
from support.kube import AGENT_SELECTOR, AGENT_TOLERATION, Cluster, Kube
from support.packaging_support import EXAMPLES, HACK, venv_script


@pytest.fixture(scope="module")
def probe_result(model_dir: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The real probe's answer for the examples' model (qwen2-vl)."""
    done = subprocess.run(
        [venv_script("mmprep-runtime"), "probe", "--model", str(model_dir("qwen2-vl"))],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


@pytest.mark.parametrize("name", example_names())
def test_example_renders_the_pools_its_comment_promises(name: str, probe_result: dict, tmp_path: Path) -> None:
    probe_file = tmp_path / "probe.json"
    probe_file.write_text(json.dumps(probe_result))
    done = subprocess.run(
        [
            venv_script("mmprep-operator"), "render", "-f", str(EXAMPLES / f"{name}.yaml"),
            "--nodes", str(HACK / "nodes.yaml"), "--probe", str(probe_file),
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rendered = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert pools_of_rendered(rendered) == expected_pools(name, probe_result.get("declared_workers"))


def _localized(name: str, models: Path) -> dict:
    doc = load_example(name)
    spec = doc["spec"]
    for volume in spec.get("volumes", []):
        if volume["name"] == "models":
            volume.pop("persistentVolumeClaim")
            volume["hostPath"] = {"path": str(models), "type": "Directory"}
    spec["probe"] = {**spec.get("probe", {}), "nodeSelector": dict(AGENT_SELECTOR), "tolerations": [dict(AGENT_TOLERATION)]}
    return doc


@pytest.mark.cluster
def test_examples_as_written_are_accepted_by_the_api_server(cluster: Cluster, crd: str, kube: Kube, namespace: str) -> None:
    """Server-side dry run of every example exactly as committed: schema, defaults and CEL rules."""
    for name in example_names():
        done = cluster.kubectl(
            "apply", "--server-side", "--dry-run=server", "-n", namespace, "-f", str(EXAMPLES / f"{name}.yaml"), "-o", "json"
        )
        obj = json.loads(done.stdout)
        assert obj["spec"]["model"]["path"] == "/models/qwen2-vl"
        assert obj["spec"]["model"]["trustRemoteCode"] is False, "defaults come from the CRD"


@pytest.mark.cluster
@pytest.mark.slow
def test_examples_applied_to_the_local_cluster_reach_ready_with_their_pools(
    cluster: Cluster,
    kube: Kube,
    operator: object,
    namespace: str,
    model_dir: Callable[..., Path],
    probe_result: dict,
    tmp_path: Path,
) -> None:
    models = write_models_dir(tmp_path / "models", model_dir("qwen2-vl"))
    docs = [_localized(name, models) for name in example_names()]
    cluster.kubectl("apply", "--server-side", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(docs))
    for name, doc in zip(example_names(), docs, strict=True):
        expected = expected_pools(name, probe_result.get("declared_workers"))
        wait_until_decided_and_ready(kube, namespace, doc["metadata"]["name"], expected, timeout=240)

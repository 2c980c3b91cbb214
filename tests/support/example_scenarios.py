"""What each example in examples/ must produce, shared by every tier that runs the examples:
`mmprep-operator render` (no cluster), the local control plane, and kind.

Expectations are per pool: (path, processor workers, reason). CPU-path pools without an explicit
count or override follow the probe: the model's declared count if it declares one, else 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from support.kube import Kube, condition_is, wait_for
from support.packaging_support import EXAMPLES

Expectation = dict[str, tuple[str, int, str]]


def example_names() -> list[str]:
    names = sorted(p.stem for p in EXAMPLES.glob("*.yaml"))
    # Every loop over the examples would pass vacuously without them.
    assert names, f"no examples found in {EXAMPLES}"
    return names


def load_example(name: str) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all((EXAMPLES / f"{name}.yaml").read_text()) if d]
    return dict(doc)


def expected_pools(name: str, declared_workers: int | None) -> Expectation:
    """Pool name -> (path, processor workers, reason), on hack/nodes.yaml's nodes."""
    cpu_default = ("cpu", declared_workers, "ModelDeclared") if declared_workers else ("cpu", 2, "CPUPathDefault")
    table: dict[str, Expectation] = {
        "autoscaling": {"cpu": cpu_default},
        "cpu-pool": {"cpu": cpu_default},
        "gpu-pool": {"nvidia-h200": ("gpu", 1, "GPUPathCap")},
        "explicit-override": {"cpu": ("cpu", 3, "Explicit")},
        "openai-front": {"cpu": cpu_default},
        "mixed-cluster": {"cpu": cpu_default, "nvidia-gb300": cpu_default, "nvidia-h200": ("cpu", 4, "Override")},
        "vllm-render": {"cpu": cpu_default},
    }
    assert set(table) == set(example_names()), "every example needs an expectation here, and only examples"
    return table[name]


def pools_of_status(obj: dict[str, Any]) -> Expectation:
    return {p["name"]: (p["path"], p["processorWorkers"], p["reason"]) for p in (obj.get("status") or {}).get("pools") or []}


def pools_of_rendered(objects: list[dict[str, Any]]) -> Expectation:
    """The same view from rendered Deployments (their env carries the decision)."""
    out: Expectation = {}
    for o in objects:
        if o.get("kind") != "Deployment":
            continue
        env = {e["name"]: e.get("value") for e in o["spec"]["template"]["spec"]["containers"][0].get("env", [])}
        path = "gpu" if env["MMPREP_DEVICE"] == "cuda" else "cpu"
        out[env["MMPREP_POOL"]] = (path, int(env["MMPREP_PROCESSOR_WORKERS"]), env["MMPREP_DECISION_REASON"])
    return out


def wait_until_decided_and_ready(
    kube: Kube, namespace: str, name: str, expected: Expectation, *, timeout: float
) -> dict[str, Any]:
    """Wait for the resource to be Ready with exactly the expected pools; return it."""

    def done() -> dict[str, Any] | None:
        obj = kube.get_mmp(namespace, name)
        return obj if condition_is(obj, "Ready", "True") and pools_of_status(obj) == expected else None

    return wait_for(
        done,
        timeout,
        what=f"{namespace}/{name} Ready with pools {expected}",
        describe=lambda: kube.get_mmp(namespace, name).get("status"),
    )


def write_models_dir(root: Path, qwen2_vl: Path) -> Path:
    """A folder laid out like the examples' model volume: <root>/qwen2-vl."""
    import shutil

    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(qwen2_vl, root / "qwen2-vl")
    for p in [root, *root.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return root

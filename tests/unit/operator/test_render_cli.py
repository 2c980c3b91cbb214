"""`mmprep-operator render` prints what the operator would apply, with no cluster; bad input exits 2."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
import yaml
from conftest import DATA

from mmprep_operator.cli import main


class Result:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def render(capsys: pytest.CaptureFixture[str]):
    """Run `mmprep-operator render ...` in-process (the console script is checked once, below)."""

    def run(*args: str) -> Result:
        code = main(["render", *args])
        out = capsys.readouterr()
        return Result(code, out.out, out.err)

    return run


def test_console_script_runs_render() -> None:
    exe = pathlib.Path(sys.executable).parent / "mmprep-operator"
    out = subprocess.run(
        [str(exe), "render", "-f", str(DATA / "cr.yaml"), "--nodes", str(DATA / "nodes.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "kind: Deployment" in out.stdout


def test_render_prints_one_deployment_per_pool_and_a_service(render) -> None:
    out = render("-f", str(DATA / "cr.yaml"), "--nodes", str(DATA / "nodes.yaml"), "--probe", str(DATA / "probe.json"))
    assert out.returncode == 0, out.stderr
    objects = [o for o in yaml.safe_load_all(out.stdout) if o]
    kinds = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert kinds == [
        ("Service", "qwen2-vl"),
        ("PodDisruptionBudget", "qwen2-vl-nvidia-gb300"),
        ("Deployment", "qwen2-vl-nvidia-gb300"),
        ("PodDisruptionBudget", "qwen2-vl-nvidia-h100-80gb-hbm3"),
        ("Deployment", "qwen2-vl-nvidia-h100-80gb-hbm3"),
        ("PodDisruptionBudget", "qwen2-vl-nvidia-h200-141gb-hbm3e"),
        ("Deployment", "qwen2-vl-nvidia-h200-141gb-hbm3e"),
    ]
    assert "# pool nvidia-h200-141gb-hbm3e: gpu path, 1 worker, GPUPathCap" in out.stdout
    deployments = [o for o in objects if o["kind"] == "Deployment"]
    h200 = deployments[2]
    env = {e["name"]: e["value"] for e in h200["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["MMPREP_PROCESSOR_WORKERS"] == "1" and env["MMPREP_DEVICE"] == "cuda"
    # 4 replicas over 1 + 1 + 2 nodes.
    assert [o["spec"]["replicas"] for o in deployments] == [1, 1, 2]


def test_render_without_probe_says_what_it_assumed_and_can_show_the_probe_job(render) -> None:
    out = render("-f", str(DATA / "cr.yaml"), "--nodes", str(DATA / "nodes.yaml"), "--with-probe-job")
    assert out.returncode == 0, out.stderr
    assert "assuming a cloneable processor with a fast image processor" in out.stdout
    first = next(o for o in yaml.safe_load_all(out.stdout) if o)
    assert first["kind"] == "Job" and first["metadata"]["name"].startswith("mmprep-probe-")


def test_render_rejects_an_invalid_resource_with_the_api_servers_message(render, tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: mmprep.dev/v1alpha1\nkind: MultimodalPreprocessor\nmetadata: {name: x}\nspec: {model: {path: /m, id: a/b}}\n"
    )
    out = render("-f", str(bad), "--nodes", str(DATA / "nodes.yaml"))
    assert out.returncode == 2
    assert "set exactly one of model.path and model.id" in out.stderr
    assert "Traceback" not in out.stderr


def test_render_reports_missing_files_and_bad_probe_json(render, tmp_path: pathlib.Path) -> None:
    out = render("-f", str(tmp_path / "nope.yaml"), "--nodes", str(DATA / "nodes.yaml"))
    assert out.returncode == 2 and "cannot read" in out.stderr
    probe = tmp_path / "probe.json"
    probe.write_text("not json")
    out = render("-f", str(DATA / "cr.yaml"), "--nodes", str(DATA / "nodes.yaml"), "--probe", str(probe))
    assert out.returncode == 2 and "probe output is not JSON" in out.stderr


def test_render_says_when_no_node_is_eligible(render, tmp_path: pathlib.Path) -> None:
    cpu_only = tmp_path / "nodes.yaml"
    cpu_only.write_text("apiVersion: v1\nkind: Node\nmetadata: {name: cpu-a}\nstatus: {allocatable: {cpu: '8'}}\n")
    out = render("-f", str(DATA / "cr.yaml"), "--nodes", str(cpu_only), "--probe", str(DATA / "probe.json"))
    assert out.returncode == 0, out.stderr
    assert "# NoGPUPool: pods request nvidia.com/gpu" in out.stdout

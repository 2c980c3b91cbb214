"""Helpers of the packaging tests: the Helm binary, chart rendering, the Docker engine and images.

Everything is real: `helm` is the one built by hack/build-control-plane.sh, images are built by
hack/docker/build-images.sh (cached), containers run on a real dockerd. What cannot be had on a
machine (no Docker engine that can be started) is reported as a skip with its reason, never faked.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "mmprep"
EXAMPLES = REPO / "examples"
HACK = REPO / "hack"
DOCKER_HACK = HACK / "docker"
#: A Kubernetes version for `helm template` (the chart's kubeVersion must accept it).
KUBE_VERSION = "1.35.4"


def _project_version() -> str:
    import tomllib

    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


VERSION = _project_version()
OPERATOR_IMAGE = f"mmprep-operator:{VERSION}"
RUNTIME_IMAGE = f"mmprep-runtime:{VERSION}"


def venv_script(name: str) -> str:
    """A console script of the venv running the tests (mmprep-operator, mmprep-runtime)."""
    return str(Path(sys.executable).parent / name)


# ------------------------------------------------------------------------------------------ helm


@functools.cache
def helm_binary() -> str:
    """`helm` from the control-plane build (MMPREP_HELM overrides; built once and cached)."""
    if os.environ.get("MMPREP_HELM"):
        return os.environ["MMPREP_HELM"]
    done = subprocess.run([str(HACK / "build-control-plane.sh")], stdout=subprocess.PIPE, text=True, timeout=3600, check=False)
    if done.returncode != 0:
        pytest.fail("hack/build-control-plane.sh failed; see its output above", pytrace=False)
    helm = Path(done.stdout.strip().splitlines()[-1]) / "helm"
    assert helm.is_file(), f"{helm} was not built"
    return str(helm)


def helm(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=timeout, check=False, env=env)
    if check and done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    return done


def template(
    values: dict[str, Any] | None = None, *, namespace: str = "mmprep-system", release: str = "mmprep", tests: bool = False
) -> list[dict[str, Any]]:
    """`helm template` of the chart with these values: the rendered objects (``tests``: with the
    `helm test` hooks, which an install does not create)."""
    skip = () if tests else ("--skip-tests",)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(values or {}, f)
        f.flush()
        done = helm(
            "template", release, str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION, "-f", f.name, *skip
        )
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def template_error(values: dict[str, Any]) -> str:
    """The error of a `helm template` that must fail (an AssertionError when it does not)."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(values, f)
        f.flush()
        done = helm("template", "mmprep", str(CHART), "--kube-version", KUBE_VERSION, "-f", f.name, check=False)
    assert done.returncode != 0, f"helm template accepted {values}"
    return done.stderr


def objects(rendered: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in rendered if o.get("kind") == kind]


def one(rendered: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [o for o in objects(rendered, kind) if o["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} named *{name_suffix}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def operator_cli(*args: str) -> str:
    done = subprocess.run([venv_script("mmprep-operator"), *args], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"mmprep-operator {' '.join(args)} failed ({done.returncode}): {done.stderr}"
    return done.stdout


def normalized_rules(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """RBAC rules as (apiGroup, resource, verb) triples: equal sets grant exactly the same."""
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule.get("verbs", [])
    }


# ---------------------------------------------------------------------------------------- docker


@functools.cache
def docker_engine() -> str | None:
    """Start (or find) a Docker engine; None with the reason logged when none can be had."""
    if os.environ.get("MMPREP_SKIP_DOCKER") == "1":
        return "MMPREP_SKIP_DOCKER=1"
    if shutil.which("docker") is None and (os.geteuid() != 0 or shutil.which("apt-get") is None):
        return "no docker CLI, and installing docker.io needs root and apt-get"
    done = subprocess.run([str(DOCKER_HACK / "start-dockerd.sh")], capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        return f"no Docker engine could be started: {done.stderr.strip().splitlines()[-1:] or done.returncode}"
    return None


def require_docker() -> None:
    reason = docker_engine()
    if reason:
        pytest.skip(f"Docker tests skipped: {reason}")


def docker(*args: str, timeout: float = 300, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False, input=input)
    if check and done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args[:3])} ... failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done


def image_size_mb(image: str) -> int:
    return int(docker("image", "inspect", "--format", "{{.Size}}", image).stdout.strip()) // 1_000_000


def image_config(image: str) -> dict[str, Any]:
    return dict(json.loads(docker("image", "inspect", image).stdout)[0]["Config"])

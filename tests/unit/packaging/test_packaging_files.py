"""Static checks of the packaging files that need no Docker engine: what the Dockerfile mounts is
in the build context, nothing in it is architecture-specific or pulls a frontend, and the
requirements helper reads pyproject.toml the way pip would."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
import tomllib

import pytest
from support.packaging_support import DOCKER_HACK, REPO

from mmprep_operator.logic import pod_parts

DOCKERFILE = (REPO / "Dockerfile").read_text()


def _in_context(path: str) -> bool:
    """Whether .dockerignore (an allow-list after `*`) lets ``path`` into the build context."""
    included = False
    for line in (REPO / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/") or fnmatch.fnmatch(path, pattern.replace("**/", "*")):
            included = negate
    return included


def test_everything_the_dockerfile_mounts_from_the_context_is_in_the_context() -> None:
    sources = set(re.findall(r"--mount=type=bind,source=([^,\s]+)", DOCKERFILE))
    assert {"pyproject.toml", "runtime", "operator", "wheelhouse"} <= sources
    missing = sorted(s for s in sources if not _in_context(s) or not (REPO / s).exists())
    assert not missing, f"mounted but not in the build context: {missing}"
    # And the heavy or private things stay out.
    for path in (".venv", ".git", "tests", "charts", "runtime/mmprep_runtime/__pycache__"):
        assert not _in_context(path), f"{path} would be sent to the Docker daemon"


def test_dockerfile_pulls_no_frontend_and_has_no_architecture_specific_step() -> None:
    assert not re.search(r"^#\s*syntax=", DOCKERFILE, re.MULTILINE), "a syntax line pulls a frontend image (no registry here)"
    code = "\n".join(line for line in DOCKERFILE.splitlines() if not line.lstrip().startswith("#"))
    assert not re.search(r"amd64|x86_64|aarch64|arm64|TARGETARCH", code)


def test_final_stages_run_as_the_uid_the_operator_renders() -> None:

    users = re.findall(r"^USER (\S+)", DOCKERFILE, re.MULTILINE)
    # operator, runtime and runtime-vllm
    assert users == [f"{pod_parts.RUN_AS}:{pod_parts.RUN_AS}"] * 3


def _requirements(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DOCKER_HACK / "requirements.py"), str(REPO / "pyproject.toml"), *args],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("extra", ["operator", "runtime", "vllm"])
def test_requirements_helper_lists_the_base_and_the_extras_dependencies(extra: str) -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    done = _requirements("--extra", extra)
    assert done.returncode == 0, done.stderr
    expected = list(dict.fromkeys([*project["dependencies"], *project["optional-dependencies"][extra]]))
    assert done.stdout.splitlines() == expected


def test_the_operator_image_gets_no_torch_and_the_runtime_image_does() -> None:
    operator = _requirements("--extra", "operator").stdout
    runtime = _requirements("--extra", "runtime").stdout
    assert not re.search(r"^torch", operator, re.MULTILINE)
    assert re.search(r"^torch==", runtime, re.MULTILINE)
    # The vLLM image takes the torch vLLM pins, not the runtime extra's.
    flavor = _requirements("--extra", "vllm").stdout
    assert re.search(r"^vllm==", flavor, re.MULTILINE) and not re.search(r"^torch", flavor, re.MULTILINE)


def test_requirements_helper_refuses_an_unknown_extra() -> None:
    done = _requirements("--extra", "gpu")
    assert done.returncode != 0 and "unknown extra" in done.stderr

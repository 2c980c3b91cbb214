"""Integration tier: the real local control plane, the operator as a real process, the test agent.

Every test here is marked ``cluster``. Resources send their probe to the agent's node (through
``spec.probe``), so the probe that runs is the real ``mmprep-runtime probe`` on a real processor
folder; runtime Deployments land on KWOK's simulated GPU/CPU nodes unless a test tolerates the
agent's taint on purpose (a pod that must really serve).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from support.kube import AGENT_SELECTOR, AGENT_TOLERATION


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.cluster)


def make_spec(model: Path, **fields: Any) -> dict[str, Any]:
    """A resource spec whose probe runs for real on the agent's node."""
    spec: dict[str, Any] = {
        "model": {"path": str(model)},
        "probe": {"nodeSelector": dict(AGENT_SELECTOR), "tolerations": [dict(AGENT_TOLERATION)], "timeoutSeconds": 240},
    }
    spec.update(fields)
    return spec


GPU_LIMIT = {"limits": {"nvidia.com/gpu": 1}}
H200 = {"nvidia.com/gpu.product": "NVIDIA-H200"}
CPU_POOL = {"mmprep.dev/simulated-pool": "cpu"}
GB300_POOL = {"mmprep.dev/simulated-pool": "gb300"}

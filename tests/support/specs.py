"""Resource specs for the integration tests, the demo-like scenarios and the benchmark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support.kube import AGENT_SELECTOR, AGENT_TOLERATION

GPU_LIMIT = {"limits": {"nvidia.com/gpu": 1}}
H200 = {"nvidia.com/gpu.product": "NVIDIA-H200"}
# hack/nodes.yaml labels each simulated pool, so a test can pin a resource to one of them.
CPU_POOL = {"mmprep.dev/simulated-pool": "cpu"}
GB300_POOL = {"mmprep.dev/simulated-pool": "gb300"}


def make_spec(model: Path, **fields: Any) -> dict[str, Any]:
    """A resource spec whose probe runs for real, as a local process on the agent's node."""
    spec: dict[str, Any] = {
        "model": {"path": str(model)},
        "probe": {"nodeSelector": dict(AGENT_SELECTOR), "tolerations": [dict(AGENT_TOLERATION)], "timeoutSeconds": 240},
    }
    spec.update(fields)
    return spec

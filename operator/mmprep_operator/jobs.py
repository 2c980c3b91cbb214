"""Reading a finished Job: its state conditions and its pods' termination messages.

The probe and calibration Jobs both answer through the termination message of their one
container (the kubelet keeps up to 4 KiB of it in the pod's status), so reading them is the same.
Pure: the callers fetch the Job and its pods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

_MESSAGE_TAIL: Final = 600


def condition(job: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for c in (job.get("status") or {}).get("conditions") or ():
        if c.get("type") == type_ and c.get("status") == "True":
            return c
    return None


def succeeded(job: Mapping[str, Any]) -> bool:
    # SuccessCriteriaMet/FailureTarget come first on Kubernetes >= 1.31; Complete/Failed follow.
    return condition(job, "Complete") is not None or condition(job, "SuccessCriteriaMet") is not None


def failed(job: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return condition(job, "Failed") or condition(job, "FailureTarget")


def finished(job: Mapping[str, Any]) -> bool:
    return succeeded(job) or failed(job) is not None


def terminated_messages(pods: Sequence[Mapping[str, Any]], phase: str) -> list[str]:
    """Termination messages of the pods in ``phase``, newest pod first."""
    chosen = [p for p in pods if (p.get("status") or {}).get("phase") == phase]
    chosen.sort(key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or "", reverse=True)
    out = []
    for pod in chosen:
        for cs in (pod.get("status") or {}).get("containerStatuses") or ():
            terminated = (cs.get("state") or {}).get("terminated") or {}
            if terminated.get("message"):
                out.append(str(terminated["message"]))
    return out


def tail(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _MESSAGE_TAIL else "..." + text[-_MESSAGE_TAIL:]

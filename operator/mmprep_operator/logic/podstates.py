"""Why a pool's pods are not ready, read from the pods themselves.

A Deployment only counts ready pods; the reason a pod is not ready is on the pod: the scheduler's
``PodScheduled=False`` condition (no node has room, none matches), or a container that exited
with an error and the message it left in its termination log (a runtime that found no CUDA
device exits ``DeviceFailed``, one whose processor does not load ``LoadFailed``). Pure: pods in,
one ``PoolProblem`` per pool out; the reconciler reads the pods as the watch keeps them
(``children.ChildStore.pods``) and ``status.fold`` puts the answer into the condition message and
``pools[]``.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from mmprep_operator import api
from mmprep_operator.logic.conditions import Reason
from mmprep_runtime import exits

#: Runtime exits that say more than "it failed" (``mmprep_runtime.exits``).
_EXIT_REASONS: Final = {exits.EXIT_DEVICE_FAILED: Reason.DEVICE_FAILED, exits.EXIT_LOAD_FAILED: Reason.LOAD_FAILED}
#: Waiting reasons that will not resolve on their own (a crash loop is reported by its exit instead).
_STUCK_WAITING: Final = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
_MESSAGE_LIMIT: Final = 512
#: The kubelet's words for a container whose env names a missing object (CreateContainerConfigError:
#: ``secret "hub-token" not found``, ``configmap "x" not found``), and the scheduler's for a missing
#: claim. The operator does not read Secrets or ConfigMaps itself, so this is how it learns of one.
_MISSING_OBJECT: Final = re.compile(r'\b(secret|configmap|persistentvolumeclaim) "[^"]+" not found')
_MISSING_REASONS: Final = {
    "secret": Reason.SECRET_NOT_FOUND,
    "configmap": Reason.CONFIG_MAP_NOT_FOUND,
    "persistentvolumeclaim": Reason.PERSISTENT_VOLUME_CLAIM_NOT_FOUND,
}

#: The reasons that name a missing object: a wait that only the user can end.
MISSING_OBJECT_REASONS: Final = frozenset(_MISSING_REASONS.values())


def _named_reason(reason: str, message: str) -> str:
    """``reason``, or the missing object's kind when the message names one."""
    found = _MISSING_OBJECT.search(message)
    return _MISSING_REASONS[found.group(1)] if found else reason


def pod_problem(pod: Mapping[str, Any], runtime_container: str = "runtime") -> tuple[str, str] | None:
    """(reason, message) when the pod cannot become ready by waiting, else None. Exit codes are
    read as the runtime's only for the container named ``runtime_container``."""
    status = pod.get("status") or {}
    for condition in status.get("conditions") or ():
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            # The scheduler's own words: "0/7 nodes are available: 2 Insufficient cpu, ...".
            message = condition.get("message") or "no node fits the pod"
            return _named_reason(condition.get("reason") or Reason.UNSCHEDULABLE, message), _clip(message)
    for container in status.get("containerStatuses") or ():
        if container.get("ready"):
            continue
        state, last = container.get("state") or {}, container.get("lastState") or {}
        terminated = state.get("terminated") or last.get("terminated")
        if terminated and int(terminated.get("exitCode") or 0) != 0:
            said = (terminated.get("message") or "").strip() or terminated.get("reason") or "no termination message"
            code = int(terminated.get("exitCode") or 0)
            reason = (
                _EXIT_REASONS.get(code, Reason.RUNTIME_FAILED)
                if container.get("name") == runtime_container
                else Reason.RUNTIME_FAILED
            )
            return reason, _clip(f"container {container.get('name')} exited with code {code}: {said}")
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in _STUCK_WAITING:
            message = waiting.get("message") or waiting["reason"]
            return _named_reason(str(waiting["reason"]), message), _clip(message)
    return None


def pool_problems(
    pods: Iterable[Mapping[str, Any]], pool_of_label: Mapping[str, str], pool_label: str, runtime_container: str = "runtime"
) -> dict[str, api.PoolProblem]:
    """Per pool, the commonest problem of its pods (ties: the first seen) and how many pods have it.

    ``pool_of_label`` maps the pool label's value back to the pool name; pods of pools not in it
    (a pool that just vanished) and pods being deleted are left out.
    """
    seen: dict[str, collections.Counter[tuple[str, str]]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        pool = pool_of_label.get((meta.get("labels") or {}).get(pool_label, ""))
        if pool is None or meta.get("deletionTimestamp"):
            continue
        problem = pod_problem(pod, runtime_container)
        if problem is not None:
            seen.setdefault(pool, collections.Counter())[problem] += 1
    out = {}
    for pool, counts in seen.items():
        (reason, message), count = counts.most_common(1)[0]
        out[pool] = api.PoolProblem(reason=reason, message=message, pods=count)
    return out


def _clip(text: str) -> str:
    return text if len(text) <= _MESSAGE_LIMIT else text[: _MESSAGE_LIMIT - 3] + "..."

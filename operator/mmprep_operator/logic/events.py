"""The Events that tell what changed between two statuses, and the core/v1 Event body of each.

The Events are chosen here (``events``) and their bodies built here too (``event_body``), so
what an Event says is decided and tested without an API server; ``control.event_poster`` only
delivers them. Pure. Reasons come from ``conditions``; the statuses compared from ``status.fold``.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any, Final, Literal

from mmprep_operator import api
from mmprep_operator.logic import autoscaling, identity
from mmprep_operator.logic.conditions import ConditionType, Reason
from mmprep_operator.logic.naming import short_hash
from mmprep_operator.logic.status import timestamp


@dataclasses.dataclass(frozen=True)
class EventSpec:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def events(previous: api.MultimodalPreprocessorStatus | None, new: api.MultimodalPreprocessorStatus) -> list[EventSpec]:
    """Events for what changed between two statuses: decisions, probe results, problems."""
    previous = previous or api.MultimodalPreprocessorStatus()
    out: list[EventSpec] = []
    old_pools = {p.name: p for p in previous.pools}
    for pool in new.pools:
        old = old_pools.get(pool.name)
        key = (pool.path, pool.processor_workers, pool.io_workers, pool.reason)
        if old is None or (old.path, old.processor_workers, old.io_workers, old.reason) != key:
            out.append(EventSpec("Normal", Reason.DECIDED, pool.message))
    for pool in new.pools:
        cal, old_cal = pool.calibration, (old_pools[pool.name].calibration if pool.name in old_pools else None)
        if cal is None or (old_cal is not None and (old_cal.hash, old_cal.state) == (cal.hash, cal.state)):
            continue
        if cal.state == "Succeeded":
            curve = ", ".join(f"{p.workers}: {p.req_per_s:g} req/s" for p in cal.curve)
            out.append(EventSpec("Normal", Reason.CALIBRATED, f"pool {pool.name}: {cal.message} ({curve})"))
        elif cal.state in ("Failed", "Unavailable"):
            out.append(EventSpec("Warning", cal.reason, f"pool {pool.name}: {cal.message}; the rule's count stays"))
    for pool in new.pools:
        # Once per reaching: the pass that first sees the autoscaler ask for its max.
        old = old_pools.get(pool.name)
        if autoscaling.at_max(pool.autoscaling) and not (old is not None and autoscaling.at_max(old.autoscaling)):
            assert pool.autoscaling is not None
            out.append(
                EventSpec(
                    "Warning",
                    Reason.POOL_AT_MAX_REPLICAS,
                    f"pool {pool.name}: the autoscaler asks for {pool.autoscaling.desired_replicas} pods, its maxReplicas "
                    f"({pool.autoscaling.max_replicas}); raise it if the signal stays above target",
                )
            )
    for name in sorted(set(old_pools) - {p.name for p in new.pools}):
        out.append(
            EventSpec("Normal", Reason.POOL_REMOVED, f"pool {name} has no eligible nodes any more; its Deployment is deleted")
        )

    def changed(type_: str) -> api.Condition | None:
        cond, old = new.condition(type_), previous.condition(type_)
        if cond is None or (old is not None and (old.status, old.reason) == (cond.status, cond.reason)):
            return None
        return cond

    if (
        (c := changed(ConditionType.PROBED)) is not None
        and c.status != "Unknown"
        and c.reason not in (Reason.PROBE_PENDING, Reason.PROBE_RUNNING)
    ):
        out.append(EventSpec("Normal" if c.status == "True" else "Warning", c.reason, c.message))
    if (c := changed(ConditionType.CLONEABLE)) is not None and c.status == "False":
        out.append(EventSpec("Warning", c.reason, c.message))
    if (c := changed(ConditionType.DEGRADED)) is not None and c.status == "True" and c.reason not in {e.reason for e in out}:
        out.append(EventSpec("Warning", c.reason, c.message))
    if (c := changed(ConditionType.ENGINE_REACHABLE)) is not None:
        # Losing the engine is told each time; finding it only after it was lost (a first check
        # that answers is no news).
        if c.status == "False":
            out.append(EventSpec("Warning", c.reason, c.message))
        elif previous.condition(ConditionType.ENGINE_REACHABLE) is not None:
            out.append(EventSpec("Normal", c.reason, c.message))
    if (c := changed(ConditionType.READY)) is not None and c.status == "True":
        out.append(EventSpec("Normal", c.reason, c.message))
    elif c is not None and c.reason in {p.problem.reason for p in new.pools if p.problem is not None} - {e.reason for e in out}:
        # Pods that cannot run (no node fits, the runtime exits): what `kubectl describe` shows first.
        out.append(EventSpec("Warning", c.reason, c.message))
    return out


#: The API server refuses longer Event messages.
EVENT_MESSAGE_LIMIT: Final = 1024


def event_body(
    owner: identity.Owner, event: EventSpec, *, resource_version: str | None, instance: str, now: datetime
) -> dict[str, Any]:
    """The core/v1 Event that tells ``event`` about ``owner`` (at ``resource_version``, if known).

    Its name is derived from what it says: posting the same Event again meets the existing
    object and becomes a count bump there (see ``kube.post_event``), not a new object per pass.
    ``instance`` names the operator instance that posts it (its pod name in a cluster).
    """
    stamp = timestamp(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{owner.name}.{short_hash(f'{owner.uid}/{event.reason}/{event.message}', 16)}",
            "namespace": owner.namespace,
        },
        "involvedObject": {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "name": owner.name,
            "namespace": owner.namespace,
            "uid": owner.uid,
            **({"resourceVersion": resource_version} if resource_version else {}),
        },
        "type": event.type,
        "reason": event.reason,
        "message": event.message[:EVENT_MESSAGE_LIMIT],
        "source": {"component": identity.MANAGED_BY},
        "reportingComponent": identity.MANAGED_BY,
        "reportingInstance": instance,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }

"""What the operator knows about its children from watch events, so that a reconcile whose result
did not change costs no API calls for them.

For each child (Deployment, PodDisruptionBudget, Service) it keeps two facts and compares them:

- what the operator last applied: a digest of the rendered object and the object's *marker* in
  the apply's answer;
- what the watch last showed: the marker, a fingerprint of what should wake the owner, and (for
  Deployments) the replica counts.

The marker is what changes when anybody changes the object's spec: ``metadata.generation`` for a
Deployment (its status updates do not move it), ``metadata.resourceVersion`` for a Service (it has
no generation, and no status that changes on its own). So "same digest, and the watch still shows
the marker our apply produced" means nobody touched it since: the apply can be skipped. Any doubt
(nothing watched yet, an operator restart, an edit, a deletion) means apply again, which is safe.

Runtime pods are not applied; the store keeps what ``podstates`` reads of each (labels, deletion,
conditions, container states), so that the reason a pool's pods are not ready costs no pod LIST
per pass. Like the Deployments' replica counts, it is as fresh as the last watch event.

In memory only, no I/O: the controller feeds it events, the reconciler reads it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

from mmprep_operator.logic import autoscaling
from mmprep_operator.logic.status import DeploymentState

ChildKey = tuple[str, str, str]  # (kind, namespace, name)
#: Children whose status the resource's status repeats (an autoscaler's replicas and reason).
_AUTOSCALER_KINDS: Final = (autoscaling.HPA_KIND, autoscaling.KEDA_KIND)


def marker_of(kind: str, body: Mapping[str, Any]) -> str:
    meta = body.get("metadata") or {}
    # A PodDisruptionBudget's status moves with every pod; its generation only with its spec.
    if kind in ("Deployment", "PodDisruptionBudget", *_AUTOSCALER_KINDS):
        return f"generation={meta.get('generation')}"
    return f"resourceVersion={meta.get('resourceVersion')}"


def digest_of(obj: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def deployment_state(body: Mapping[str, Any]) -> DeploymentState:
    st = body.get("status") or {}
    generation = int((body.get("metadata") or {}).get("generation") or 0)
    spec_replicas = (body.get("spec") or {}).get("replicas")
    return DeploymentState(
        desired=int(spec_replicas) if spec_replicas is not None else None,
        replicas=int(st.get("replicas") or 0),
        ready_replicas=int(st.get("readyReplicas") or 0),
        updated_replicas=int(st.get("updatedReplicas") or 0),
        observed=int(st.get("observedGeneration") or 0) >= generation,
    )


def _wake_fingerprint(kind: str, body: Mapping[str, Any]) -> tuple[Any, ...]:
    """What, when it changes, should make the owner look again (not every status heartbeat)."""
    st = body.get("status") or {}
    return (
        # A Job's resourceVersion moves with every status write; its state fields say enough.
        marker_of(kind, body) if kind in ("Deployment", "Service", "PodDisruptionBudget", *_AUTOSCALER_KINDS) else None,
        # An autoscaler's decision (an HPA's; a ScaledObject's conditions below).
        st.get("currentReplicas"),
        st.get("desiredReplicas"),
        st.get("lastScaleTime"),
        st.get("replicas"),
        st.get("readyReplicas"),
        st.get("updatedReplicas"),
        st.get("observedGeneration"),
        st.get("active"),
        st.get("succeeded"),
        st.get("failed"),
        tuple(sorted((c.get("type"), c.get("status")) for c in st.get("conditions") or ())),
        # An autoscaler's conditions change reason without changing status (ScaleDownStabilized).
        tuple(sorted((c.get("type"), c.get("reason")) for c in st.get("conditions") or ()))
        if kind in _AUTOSCALER_KINDS
        else None,
        # A runtime pod that exits again, or says why: what status reports per pool.
        tuple(
            (c.get("name"), c.get("restartCount"), ((c.get("lastState") or {}).get("terminated") or {}).get("exitCode"))
            for c in st.get("containerStatuses") or ()
        ),
    )


def _pod_view(body: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a pod that says which pool it serves and why it is not ready."""
    meta, st = body.get("metadata") or {}, body.get("status") or {}
    return {
        "metadata": {
            "name": meta.get("name"),
            "labels": dict(meta.get("labels") or {}),
            "deletionTimestamp": meta.get("deletionTimestamp"),
        },
        "status": {"conditions": list(st.get("conditions") or ()), "containerStatuses": list(st.get("containerStatuses") or ())},
    }


@dataclasses.dataclass(frozen=True)
class _Seen:
    marker: str
    fingerprint: tuple[Any, ...]
    state: DeploymentState | None
    #: An autoscaler's status, as the watch last showed it.
    autoscaler_status: Mapping[str, Any] | None = None


class ChildStore:
    def __init__(self) -> None:
        self._seen: dict[ChildKey, _Seen] = {}
        self._applied: dict[ChildKey, tuple[str, str]] = {}  # key -> (digest, marker after our apply)
        # Per namespace, pod name -> what podstates reads of it: a pass reads one namespace's pods.
        self._pods: dict[str, dict[str, dict[str, Any]]] = {}

    def observe(self, kind: str, event_type: str | None, body: Mapping[str, Any]) -> bool:
        """Record a watch event; True when the child's owner should be reconciled again."""
        meta = body.get("metadata") or {}
        key = (kind, meta.get("namespace", ""), meta.get("name", ""))
        if kind == "Pod":
            pods = self._pods.setdefault(key[1], {})
            if event_type == "DELETED":
                pods.pop(key[2], None)
            else:
                pods[key[2]] = _pod_view(body)
        if event_type == "DELETED":
            self._seen.pop(key, None)
            self._applied.pop(key, None)
            return True
        fingerprint = _wake_fingerprint(kind, body)
        old = self._seen.get(key)
        state = deployment_state(body) if kind == "Deployment" else None
        scaler = {"status": dict(body.get("status") or {})} if kind in _AUTOSCALER_KINDS else None
        self._seen[key] = _Seen(marker_of(kind, body), fingerprint, state, scaler)
        return old is None or old.fingerprint != fingerprint

    def record_apply(self, obj: Mapping[str, Any], result: Mapping[str, Any]) -> None:
        meta = obj["metadata"]
        key = (obj["kind"], meta["namespace"], meta["name"])
        self._applied[key] = (digest_of(obj), marker_of(obj["kind"], result))

    def unchanged_since_apply(self, obj: Mapping[str, Any]) -> bool:
        """The same object was applied before, and the watch shows nobody changed it since."""
        meta = obj["metadata"]
        key = (obj["kind"], meta["namespace"], meta["name"])
        applied, seen = self._applied.get(key), self._seen.get(key)
        return applied is not None and seen is not None and applied == (digest_of(obj), seen.marker)

    def deployment_state(self, namespace: str, name: str) -> DeploymentState | None:
        seen = self._seen.get(("Deployment", namespace, name))
        return seen.state if seen is not None else None

    def autoscaler(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        """An HPA or ScaledObject as the watch last showed it (its status only)."""
        seen = self._seen.get((kind, namespace, name))
        return seen.autoscaler_status if seen is not None else None

    def pods(self, namespace: str, labels: Mapping[str, str]) -> list[Mapping[str, Any]]:
        """The watched pods of ``namespace`` that carry all of ``labels``."""
        return [
            pod
            for pod in self._pods.get(namespace, {}).values()
            if all(pod["metadata"]["labels"].get(k) == v for k, v in labels.items())
        ]

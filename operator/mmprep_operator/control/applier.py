"""Apply a plan's children to the cluster, and prune those of pools that are gone.

Server-side apply with a conflict policy of its own: the operator forces back fields someone
changed on an object its resource controls (a Deployment scaled by hand), and never takes over
an object it does not control (a user's Service of the same name): that becomes the
``NameConflict`` problem, a child the API server rejects becomes ``ApplyFailed``, and both are
returned to the pass as a ``status.Problem`` for the status to say. Transient errors (and a
namespace being deleted) raise ``ApiError`` for the caller's backoff: they are real errors, not
a way to steer the pass.

Calls are saved where the watch already tells the answer: a child applied before and unchanged
since (``children.ChildStore``) is not applied again, and the pool kinds are listed and pruned
only when the set of pools changed since the last prune (or is unknown, after a restart).

Autoscaled pools: their Deployments are rendered without replicas, and a field an apply leaves out
is a field the applier gives up; given up by its only owner, it is reset to its default (1
replica). So before the operator first applies such a Deployment without replicas while it still
owns them (a new Deployment, made at the pool's starting count, or a pool going from fixed to
autoscaled), a second field manager (``kube.HANDOVER_FIELD_MANAGER``) applies the live count alone,
on the condition that the Deployment is still at the version read: the count then keeps an owner
and its value, and the next write to it is the autoscaler's. The way back (autoscaled to fixed)
needs nothing of the kind: the operator's apply sets replicas again, forced over the previous
owner as any field of a Deployment its resource controls.

Neighbours: ``render`` builds the objects (pure); ``children`` knows what the watch shows;
``reconcile`` decides when applying is allowed (only from a freshly read spec).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any, Final

from mmprep_operator.control import children
from mmprep_operator.control.children import ChildStore
from mmprep_operator.kube import FIELD_MANAGER, HANDOVER_FIELD_MANAGER, ApiError, Conflict, ForeignObject, KubeApi
from mmprep_operator.logic import autoscaling, identity, status
from mmprep_operator.logic.conditions import Reason
from mmprep_operator.logic.plan import Plan

log = logging.getLogger("mmprep.operator.applier")

_APPLY_ATTEMPTS: Final = 3
#: The children made per pool (kind -> apiVersion), pruned when their pool goes.
POOL_KINDS: Final = {
    "Deployment": "apps/v1",
    "PodDisruptionBudget": "policy/v1",
    autoscaling.HPA_KIND: autoscaling.HPA_API_VERSION,
    autoscaling.KEDA_KIND: autoscaling.KEDA_API_VERSION,
}
#: Pool kinds a cluster may not serve (KEDA not installed): nothing of them to prune there.
_OPTIONAL_KINDS: Final = frozenset({autoscaling.KEDA_KIND})


def owns_replicas(body: Mapping[str, Any], manager: str = FIELD_MANAGER) -> bool:
    """Whether ``manager``'s applies own the Deployment's spec.replicas (its managedFields say)."""
    for entry in (body.get("metadata") or {}).get("managedFields") or ():
        ours = entry.get("manager") == manager and entry.get("operation") == "Apply" and not entry.get("subresource")
        if ours and "f:replicas" in ((entry.get("fieldsV1") or {}).get("f:spec") or {}):
            return True
    return False


Key = tuple[str, str]  # (namespace, name) of the resource


@dataclasses.dataclass(frozen=True)
class Applied:
    """What applying a plan left: each Deployment's state, and the problem that stopped it, if any."""

    deployments: dict[str, status.DeploymentState]
    problem: status.Problem | None = None


def pool_children(plan: Plan) -> frozenset[tuple[str, str]]:
    """The (kind, name) of the plan's per-pool children: what a prune keeps."""
    return frozenset((obj["kind"], obj["metadata"]["name"]) for obj in plan.objects if obj["kind"] in POOL_KINDS)


@dataclasses.dataclass
class ChildApplier:
    kube: KubeApi
    #: Children as the watch shows them (fed by the controller); lets unchanged applies be skipped.
    children: ChildStore = dataclasses.field(default_factory=ChildStore)
    #: Per resource, the (kind, name) of its pool children at its last successful prune.
    _pruned: dict[Key, frozenset[tuple[str, str]]] = dataclasses.field(default_factory=dict)

    def up_to_date(self, owner: identity.Owner, plan: Plan) -> bool:
        """Nothing to apply or prune for ``plan``: the watch shows every child as last applied."""
        return self._pruned.get((owner.namespace, owner.name)) == pool_children(plan) and self.children_unchanged(plan)

    def children_unchanged(self, plan: Plan) -> bool:
        return all(self.children.unchanged_since_apply(obj) for obj in plan.objects)

    def forget(self, key: Key) -> None:
        self._pruned.pop(key, None)

    async def apply_plan(self, owner: identity.Owner, plan: Plan) -> Applied:
        """Apply every child of ``plan`` (Service first), then prune; a refused child is a problem."""
        key = (owner.namespace, owner.name)
        keep = pool_children(plan)
        deployments: dict[str, status.DeploymentState] = {}
        try:
            for obj in plan.objects:
                child = obj["metadata"]["name"]
                if self.children.unchanged_since_apply(obj):
                    # Applied before and untouched since (the watch says so): no call needed.
                    state = self.children.deployment_state(owner.namespace, child) if obj["kind"] == "Deployment" else None
                else:
                    seed = plan.seed_of(child) if obj["kind"] == "Deployment" else None
                    if seed is not None:
                        await self.hand_over_replicas(owner, obj, seed)
                    applied = await self.apply(owner, obj)
                    self.children.record_apply(obj, applied)
                    state = children.deployment_state(applied) if obj["kind"] == "Deployment" else None
                if obj["kind"] == "Deployment":
                    deployments[child] = state or status.DeploymentState()
            if self._pruned.get(key) != keep:
                # Listing and pruning is needed only when the set of pools changed (or is unknown,
                # after a restart): a pool's Deployment can only be left over then.
                await self.prune(owner, keep)
                self._pruned[key] = keep
        except ApiError as e:
            if not e.permanent or e.namespace_terminating:
                raise
            if isinstance(e, ForeignObject):
                # The Service is applied first (see manifests.children): a conflict on it
                # stops the apply before any Deployment exists whose pods nothing could reach.
                problem = status.Problem(
                    Reason.NAME_CONFLICT, f"{e.message}; nothing of this resource is applied until it is resolved"
                )
            else:
                problem = status.Problem(Reason.APPLY_FAILED, f"the API server rejected a child object: {e.message}")
            return Applied(deployments, problem)
        return Applied(deployments)

    async def apply(self, owner: identity.Owner, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply that never takes over someone else's object.

        Unforced first: for our own, unchanged objects that is all. A 409 means another field
        manager owns a field we set: if our resource controls the object (someone scaled or edited
        our Deployment), force it back; if not (a user's Service with the same name), refuse
        with ``ForeignObject`` and leave it alone. An object that vanishes or changes in between is
        retried at once a few times before the caller's backoff takes over.
        """
        meta = obj["metadata"]
        for attempt in range(_APPLY_ATTEMPTS):
            try:
                return await self.kube.apply(obj, force=False)
            except Conflict:
                existing = await self.kube.get_object(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
                if existing is None:
                    continue  # deleted meanwhile: apply creates it on the next attempt
                refs = (existing.get("metadata") or {}).get("ownerReferences") or ()
                if not any(r.get("uid") == owner.uid and r.get("controller") for r in refs):
                    raise ForeignObject(obj["kind"], meta["namespace"], meta["name"]) from None
                try:
                    return await self.kube.apply(obj, force=True)
                except Conflict:
                    if attempt == _APPLY_ATTEMPTS - 1:
                        raise
                    log.info("conflict on apply; retrying", extra={"kind": obj["kind"], "object": meta["name"]})
        raise Conflict(409, "Conflict", f"{obj['kind']} {meta['namespace']}/{meta['name']} kept changing during apply")

    async def hand_over_replicas(self, owner: identity.Owner, obj: Mapping[str, Any], seed: int) -> None:
        """Before ``obj`` (a Deployment without replicas) is applied: make sure its replicas have
        an owner other than the operator, at the count they have (``seed`` for a new one)."""
        meta = obj["metadata"]
        for _ in range(_APPLY_ATTEMPTS):
            live = await self.kube.get_object("apps/v1", "Deployment", meta["namespace"], meta["name"])
            if live is None:
                # A new pool: made at its starting count, then handed over like any other.
                live = await self.apply(owner, {**obj, "spec": {**obj["spec"], "replicas": seed}})
            if not owns_replicas(live):
                return  # the autoscaler's (or the handover's) already
            count = int((live.get("spec") or {}).get("replicas") or 0)
            live_meta = live.get("metadata") or {}
            handover = {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                # The version read: should the autoscaler write the count meanwhile, this answers
                # 409 and is read again, rather than put the old count back.
                "metadata": {
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    "resourceVersion": live_meta.get("resourceVersion"),
                },
                "spec": {"replicas": count},
            }
            try:
                await self.kube.apply(handover, force=True, field_manager=HANDOVER_FIELD_MANAGER)
            except Conflict:
                continue
            log.info("replicas handed over to the autoscaler", extra={"object": meta["name"], "replicas": count})
            return
        raise Conflict(
            409, "Conflict", f"Deployment {meta['namespace']}/{meta['name']} kept changing during the replicas handover"
        )

    async def prune(self, owner: identity.Owner, keep: frozenset[tuple[str, str]]) -> None:
        """Delete this resource's per-pool children (Deployments, budgets, autoscalers) not in ``keep``."""
        selector = identity.selector_string(owner)
        for kind, api_version in POOL_KINDS.items():
            try:
                found = await self.kube.list_objects(api_version, kind, owner.namespace, selector)
            except ApiError as e:
                if e.status == 404 and kind in _OPTIONAL_KINDS:
                    continue  # the kind is not served here: there is none of it to prune
                raise
            for obj in found:
                meta = obj.get("metadata") or {}
                owned = any(o.get("uid") == owner.uid for o in meta.get("ownerReferences") or ())
                if owned and (kind, meta.get("name")) not in keep:
                    await self.kube.delete_object(api_version, kind, owner.namespace, meta["name"])
                    log.info(
                        "child of a vanished pool deleted",
                        extra={"namespace": owner.namespace, "kind": kind, "object": meta["name"]},
                    )

"""What the probe and calibration Job readers share: Jobs owned by several resources, bounded caches.

A probe or calibration Job is named by the hash of its inputs, so resources of one namespace
that would run the same Job run it once: the first creates it, the others add themselves as
owners (``share_job``), and the garbage collector removes it only when all of them are gone.
Their answers are kept per (namespace, hash) in a cache bounded like a small LRU
(``bounded.remember``): an answer is also kept in each resource's status and in the Job, so a lost
entry costs one read, never a wrong answer.

Neighbours: ``probe_jobs`` and ``calibration_jobs`` read their Jobs through ``read_or_create_job``; ``kube`` is
the API seam they call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Final

from mmprep_operator.kube import Conflict, KubeApi
from mmprep_operator.logic import identity

log = logging.getLogger("mmprep.operator.shared_jobs")

#: Entries per answer cache: one per distinct model (and pool) per namespace in use.
CACHE_SIZE: Final = 1024


def owned_by(job: Mapping[str, Any], owner: identity.Owner) -> bool:
    """The Job lists ``owner`` as an owner. Right after ``create_job``: whether this resource
    created it (``create_job`` answers with the existing Job when another resource won the race)."""
    return any(r.get("uid") == owner.uid for r in (job.get("metadata") or {}).get("ownerReferences") or ())


async def share_job(kube: KubeApi, owner: identity.Owner, job: Mapping[str, Any]) -> None:
    """Add the resource as an owner of a Job another resource created (GC needs all owners gone)."""
    meta = job.get("metadata") or {}
    owners = list(meta.get("ownerReferences") or ())
    if not owner.uid or owned_by(job, owner):
        return
    try:
        await kube.set_job_owners(
            owner.namespace, meta["name"], [*owners, owner.reference(controller=False)], str(meta.get("resourceVersion", ""))
        )
    except Conflict:
        # Someone else changed the Job meanwhile; the next reconcile adds us. Sharing is only
        # about garbage collection, so it is not worth failing this reconcile for.
        log.info("job changed while sharing it; will retry", extra={"job": meta.get("name")})


async def read_or_create_job(
    kube: KubeApi, owner: identity.Owner, name: str, job_manifest: Callable[[], dict[str, Any]]
) -> tuple[dict[str, Any], bool, list[dict[str, Any]]]:
    """The Job ``name`` (created from ``job_manifest()`` when missing), whether this resource created
    it, and its pods (a finished one's termination messages hold the answer; a running one's
    waiting state says why it cannot start).

    A Job that exists, or that another resource created first (``create_job`` answers with it),
    gets this resource as one more owner.
    """
    job = await kube.get_job(owner.namespace, name)
    created = False
    if job is None:
        job = await kube.create_job(job_manifest())
        created = owned_by(job, owner)
    if not created:
        await share_job(kube, owner, job)  # a no-op when the resource is an owner already
    pods = [] if created else await kube.list_pods(owner.namespace, f"job-name={name}")
    return job, created, pods

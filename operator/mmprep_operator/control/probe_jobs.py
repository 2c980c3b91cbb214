"""The probe's answer for a resource: from its status, from memory, or from its probe Job.

The probe Job (see ``probe``) loads the resource's processor once and says whether it can be
cloned; its answer depends only on the probe hash, so it is looked up in the cheapest place
first, in two steps the reconcile pass calls separately:

- ``known``: the answer the resource's status already holds for this hash (a success, or a
  failure that stays until something it depends on changes), or one in this process's cache.
  No API call, so a pass started from the watch's copy of the resource can use it;
- ``read``: the probe Job itself, created when missing and shared when another resource of the
  namespace created it. Only a pass that read the resource from the API calls it, so a Job is
  never created for a stale spec; the pass, not this module, decides that.

Neighbours: ``probe`` renders the Job and reads its outcome (pure); ``shared_jobs`` shares it and
bounds the cache; ``reconcile`` composes the steps.
"""

from __future__ import annotations

import dataclasses
import logging

from mmprep_operator import api
from mmprep_operator.api.policy import OperatorPolicy
from mmprep_operator.bounded import remember
from mmprep_operator.control.metrics import Metrics
from mmprep_operator.control.shared_jobs import CACHE_SIZE, read_or_create_job
from mmprep_operator.kube import KubeApi
from mmprep_operator.logic import identity, probe

log = logging.getLogger("mmprep.operator.probe_jobs")


@dataclasses.dataclass
class ProbeJobs:
    kube: KubeApi
    policy: OperatorPolicy
    metrics: Metrics
    #: Successful answers per (namespace, probe hash); also in each resource's status and Job.
    cache: dict[tuple[str, str], api.ProbeResult] = dataclasses.field(default_factory=dict)

    def known(
        self, owner: identity.Owner, hash_: str, previous: api.MultimodalPreprocessorStatus | None
    ) -> api.ProbeStatus | None:
        """The probe's state when it needs no API call; None: only its Job can tell."""
        if previous is not None and previous.probe is not None and previous.probe.hash == hash_:
            if previous.probe.state == "Succeeded" and previous.probe.result is not None:
                remember(self.cache, (owner.namespace, hash_), previous.probe.result, size=CACHE_SIZE)
                return previous.probe
            if previous.probe.state == "Failed":
                # A failed probe stays failed until something it depends on changes (or the user
                # sets the mmprep.dev/reprobe annotation): no retry storm on a broken model.
                return previous.probe
        cached = self.cache.get((owner.namespace, hash_))
        if cached is not None:
            return api.ProbeStatus(hash=hash_, job=probe.job_name(hash_), state="Succeeded", result=cached)
        return None

    async def read(self, owner: identity.Owner, spec: api.MultimodalPreprocessorSpec, hash_: str) -> api.ProbeStatus:
        """The probe's state from its Job, which is created (or shared) here."""
        job_name = probe.job_name(hash_)
        job, created, pods = await read_or_create_job(
            self.kube, owner, job_name, lambda: probe.job_manifest(owner, spec, self.policy, hash_)
        )
        if created:
            self.metrics.probe_jobs.inc()
            log.info("probe job created", extra={"namespace": owner.namespace, "resource": owner.name, "job": job_name})
        outcome = probe.read_outcome(job, pods)
        if outcome.state == "Succeeded" and outcome.result is not None:
            remember(self.cache, (owner.namespace, hash_), outcome.result, size=CACHE_SIZE)
        return api.ProbeStatus(
            hash=hash_, job=job_name, state=outcome.state, reason=outcome.reason, message=outcome.message, result=outcome.result
        )

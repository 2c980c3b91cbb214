"""Each pool's calibration for a resource: from its status, from memory, or from its Job.

A calibration Job (see ``calibration``) measures one pool's throughput per worker count on one
of its nodes. Like the probe's, a settled answer depends only on its hash, so it is looked up
in the cheapest place first. ``of`` works through the pools in order and answers None as soon
as a pool's answer needs its Job while the caller may not read Jobs (``read_jobs`` false: the
pass started from the watch's copy of the resource, and a Job is never created for a stale
spec). The caller then reads the resource and calls again; no exception crosses the modules.

Neighbours: ``calibration`` renders the Job, decides which pools need one and reads its outcome
(pure); ``shared_jobs`` shares it and bounds the cache; ``reconcile`` re-plans with the
measured counts.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable
from typing import Any

from mmprep_operator import api
from mmprep_operator.api.policy import OperatorPolicy
from mmprep_operator.bounded import remember
from mmprep_operator.control.shared_jobs import CACHE_SIZE, read_or_create_job
from mmprep_operator.kube import KubeApi
from mmprep_operator.logic import calibration, identity, pools, status
from mmprep_operator.logic.conditions import Reason
from mmprep_operator.logic.plan import Plan

log = logging.getLogger("mmprep.operator.calibration_jobs")


@dataclasses.dataclass
class CalibrationJobs:
    kube: KubeApi
    policy: OperatorPolicy
    clock: Callable[[], dt.datetime]
    #: Settled calibrations per (namespace, calibration hash); also kept in each resource's status.
    cache: dict[tuple[str, str], api.PoolCalibration] = dataclasses.field(default_factory=dict)

    async def of(
        self,
        owner: identity.Owner,
        spec: api.MultimodalPreprocessorSpec,
        rule_plan: Plan,
        probe: api.ProbeResult,
        previous: api.MultimodalPreprocessorStatus | None,
        recalibrate: str | None,
        *,
        read_jobs: bool,
    ) -> dict[str, api.PoolCalibration] | None:
        """Each pool's calibration; None when one needs its Job and ``read_jobs`` is false.

        ``rule_plan`` is the plan without measurements: a pool whose count a rule above
        ``Measured`` decides (cloneability, an explicit count, an override) is not measured.
        """
        before = {p.name: p.calibration for p in (previous.pools if previous is not None else ()) if p.calibration}
        out: dict[str, api.PoolCalibration] = {}
        for d in rule_plan.decisions:
            pool = d.pool
            hash_ = calibration.calibration_hash(spec, self.policy, pool, recalibrate)
            skip = calibration.not_needed_reason(d.decision, spec, probe)
            unavailable = calibration.unavailable_reason(spec, self.policy, pool)
            if skip is not None:
                out[pool.name] = api.PoolCalibration(
                    hash=hash_, state="NotNeeded", reason=Reason.CALIBRATION_NOT_NEEDED, message=skip
                )
            elif unavailable is not None:
                out[pool.name] = api.PoolCalibration(
                    hash=hash_, state="Unavailable", reason=Reason.CALIBRATION_UNAVAILABLE, message=unavailable
                )
            elif (known := self._known(owner, hash_, before.get(pool.name))) is not None:
                out[pool.name] = known
            elif read_jobs:
                out[pool.name] = await self._read(owner, spec, pool, hash_)
            else:
                return None
        return out

    def _known(self, owner: identity.Owner, hash_: str, previous: api.PoolCalibration | None) -> api.PoolCalibration | None:
        key = (owner.namespace, hash_)
        if previous is not None and previous.hash == hash_ and calibration.settled(previous.state):
            if key not in self.cache:  # what was read from a Job (the newer) wins
                remember(self.cache, key, previous, size=CACHE_SIZE)
            return previous
        return self.cache.get(key)

    async def _read(
        self, owner: identity.Owner, spec: api.MultimodalPreprocessorSpec, pool: pools.Pool, hash_: str
    ) -> api.PoolCalibration:
        name = calibration.job_name(hash_)

        def job_manifest() -> dict[str, Any]:
            node = calibration.node_for(pool)
            assert node is not None  # unavailable_reason() rules out a pool without nodes
            return calibration.job_manifest(owner, spec, self.policy, pool, node, hash_)

        job, created, pods = await read_or_create_job(self.kube, owner, name, job_manifest)
        if created:
            log.info("calibration job created", extra={"namespace": owner.namespace, "resource": owner.name, "job": name})
        selector = (((job.get("spec") or {}).get("template") or {}).get("spec") or {}).get("nodeSelector") or {}
        outcome = calibration.read_outcome(job, pods)
        result = calibration.pool_calibration(
            hash_, outcome, job=name, node=selector.get(calibration.HOSTNAME_LABEL), measured_at=status.timestamp(self.clock())
        )
        if calibration.settled(result.state):
            remember(self.cache, (owner.namespace, hash_), result, size=CACHE_SIZE)
        return result

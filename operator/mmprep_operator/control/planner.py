"""The plan of one reconcile pass: the pure plan, remade from each pool's calibration when measured.

A pass plans twice when calibration is on: the first plan names the pools, whose calibration
Jobs (``calibration_jobs``) then say how many workers (and render processes) each measured; the
plan is made again from those counts. The grouping of nodes into pools is remembered per
placement (``pools.PoolingMemo``), so resources that share a placement group the nodes once per
node change. The reconciler owns what it does with the plan (report, apply); this module only
gathers what the plan needs from the cluster.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping

from mmprep_operator import api
from mmprep_operator.api.policy import OperatorPolicy
from mmprep_operator.control.autoscalers import AutoscalerDetector
from mmprep_operator.control.calibration_jobs import CalibrationJobs
from mmprep_operator.logic import autoscaling, calibration, identity, pools, status
from mmprep_operator.logic.nodes import NodeFacts
from mmprep_operator.logic.plan import Plan, make_plan


@dataclasses.dataclass(frozen=True)
class Planned:
    """A pass's plan and what it was made from, for the observations the pass reports."""

    probe: api.ProbeStatus
    plan: Plan
    calibrations: dict[str, api.PoolCalibration]
    #: Some pool's calibration has not settled: its Job's events will bring the result.
    calibrating: bool

    def observation(
        self,
        generation: int | None,
        selector: str,
        deployments: Mapping[str, status.DeploymentState],
        problem: status.Problem | None,
        autoscalers: Mapping[str, Mapping[str, object] | None],
        pod_problems: Mapping[str, api.PoolProblem] | None = None,
        engine: status.EngineCheck | None = None,
    ) -> status.Observation:
        plan = self.plan
        return status.Observation(
            generation,
            selector,
            probe=self.probe,
            problem=problem,
            decisions=plan.decisions,
            deployment_names=plan.deployment_names,
            replicas=plan.replicas,
            deployments=deployments,
            calibrations=self.calibrations,
            # The plan's (an image that cannot run there) wins over what the pods say.
            pool_problems={**(pod_problems or {}), **plan.pool_problems},
            scaling=plan.scaling,
            autoscalers=autoscalers,
            engine=engine,
        )


@dataclasses.dataclass
class Planner:
    policy: OperatorPolicy
    nodes: Callable[[], Iterable[NodeFacts]]
    calibrations: CalibrationJobs
    autoscalers: AutoscalerDetector
    _poolings: pools.PoolingMemo = dataclasses.field(default_factory=pools.PoolingMemo)

    async def plan(
        self,
        owner: identity.Owner,
        spec: api.MultimodalPreprocessorSpec,
        probe: api.ProbeStatus,
        previous: api.MultimodalPreprocessorStatus | None,
        annotations: Mapping[str, str],
        *,
        read_jobs: bool,
    ) -> Planned | None:
        """The plan for a probe that succeeded; None when calibration Jobs must be read and
        ``read_jobs`` is off (a pass from the watch's copy reads no Job)."""
        assert probe.result is not None
        pooling = self._poolings.pooling_for(list(self.nodes()), spec)
        nodes = self._poolings.nodes
        have = await self.autoscalers.current() if spec.autoscaling is not None else autoscaling.ASSUMED

        def planned(measured: Mapping[str, int] | None = None, processes: Mapping[str, int] | None = None) -> Plan:
            assert probe.result is not None
            return make_plan(
                owner,
                spec,
                nodes,
                probe.result,
                self.policy,
                pooling=pooling,
                measured=measured,
                autoscalers=have,
                measured_render_processes=processes,
            )

        plan = planned()
        if not calibration.wanted(spec, self.policy):
            return Planned(probe, plan, {}, calibrating=False)
        recalibrate = annotations.get(calibration.ANNOTATION_RECALIBRATE)
        found = await self.calibrations.of(owner, spec, plan, probe.result, previous, recalibrate, read_jobs=read_jobs)
        if found is None:
            return None
        succeeded = {pool: c for pool, c in found.items() if c.state == "Succeeded"}
        measured = {pool: c.chosen_workers for pool, c in succeeded.items() if c.chosen_workers}
        processes = {pool: c.chosen_render_processes for pool, c in succeeded.items() if c.chosen_render_processes}
        calibrating = any(not calibration.settled(c.state) for c in found.values())
        if measured or processes:
            plan = planned(measured, processes)
        return Planned(probe, plan, found, calibrating=calibrating)

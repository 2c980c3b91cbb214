"""Status folding: conditions, their transitions and the Events that tell a user what happened."""

from __future__ import annotations

import datetime as dt

from conftest import H200, gpu_spec, make_node, probe_result

from mmprep_operator import api
from mmprep_operator.logic import decide, events, identity, pools, status

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
T1 = T0 + dt.timedelta(minutes=5)
OWNER = identity.Owner("m", "ns", "uid-1")
SELECTOR = identity.selector_string(OWNER)


def probe_status(state: str = "Succeeded", **result) -> api.ProbeStatus:
    return api.ProbeStatus(
        hash="h",
        job="mmprep-probe-h",
        state=state,
        result=probe_result(**result) if state == "Succeeded" else None,
        reason="ProbeFailed" if state == "Failed" else None,
        message="the model did not load: x" if state == "Failed" else None,
    )


def observation(
    *,
    ready: int = 0,
    updated: int = 2,
    observed: bool = True,
    probe: api.ProbeStatus | None = None,
    problem=None,
    spec=None,
    cloneable=True,
    **kw,
) -> status.Observation:
    spec = spec or gpu_spec()
    probe = probe or probe_status(cloneable=cloneable)
    (pool,) = pools.group([make_node("h200-a", H200, gpus=8)], spec).pools
    decisions = (decide.decide_pool(spec, probe.result, pool, []),) if probe.result else ()
    name = identity.deployment_name(OWNER, pool.name)
    return status.Observation(
        generation=kw.get("generation", 1),
        selector=SELECTOR,
        probe=probe,
        problem=problem,
        decisions=decisions,
        deployment_names={pool.name: name},
        replicas={pool.name: 2},
        deployments={name: status.DeploymentState(replicas=2, ready_replicas=ready, updated_replicas=updated, observed=observed)},
    )


def cond(st: api.MultimodalPreprocessorStatus, type_: str) -> tuple[str, str]:
    c = st.condition(type_)
    assert c is not None
    return c.status, c.reason


def test_probe_pending_then_pods_starting_then_ready() -> None:
    pending = status.fold(None, status.Observation(1, SELECTOR, probe=probe_status("Running")), T0)
    assert cond(pending, "Probed") == ("False", "ProbeRunning")
    assert cond(pending, "Cloneable") == ("Unknown", "NotProbed")
    assert cond(pending, "Ready") == ("False", "ProbeRunning")
    assert cond(pending, "Degraded") == ("False", "AsExpected")
    assert [c.type for c in pending.conditions] == ["Ready", "Probed", "Cloneable", "Degraded"]

    starting = status.fold(pending, observation(ready=0), T1)
    assert cond(starting, "Probed") == ("True", "ProbeSucceeded")
    assert cond(starting, "Ready") == ("False", "ReplicasNotReady")
    # Ready stayed False: its transition time did not move; Probed flipped: it did.
    assert starting.condition("Ready").last_transition_time == status.timestamp(T0)
    assert starting.condition("Probed").last_transition_time == status.timestamp(T1)

    ready = status.fold(starting, observation(ready=2), T1 + dt.timedelta(seconds=30))
    assert cond(ready, "Ready") == ("True", "AllReplicasReady")
    assert (ready.ready_summary, ready.path_summary, ready.worker_summary) == ("2/2", "gpu", "H200=1")
    assert (ready.replicas, ready.ready_replicas, ready.selector) == (2, 2, SELECTOR)
    assert ready.pools[0].deployment == "m-nvidia-h200-141gb-hbm3e" and ready.pools[0].reason == "GPUPathCap"


def test_folding_the_same_observation_twice_changes_nothing() -> None:
    first = status.fold(None, observation(ready=1), T0)
    again = status.fold(first, observation(ready=1), T1)
    assert again.wire() == first.wire()  # so the reconciler writes no status and wakes nothing


def test_failed_probe_degrades_and_not_ready() -> None:
    st = status.fold(None, status.Observation(1, SELECTOR, probe=probe_status("Failed")), T0)
    assert cond(st, "Probed") == ("False", "ProbeFailed")
    assert cond(st, "Degraded") == ("True", "ProbeFailed")
    assert cond(st, "Ready") == ("False", "ProbeFailed")


def test_not_cloneable_with_explicit_workers_is_degraded_but_can_be_ready() -> None:
    spec = gpu_spec(workers={"processor": 4})
    st = status.fold(None, observation(ready=2, spec=spec, cloneable=False), T0)
    assert cond(st, "Cloneable") == ("False", "NotCloneable")
    assert cond(st, "Degraded") == ("True", "ExplicitWorkersNotHonoured")
    assert cond(st, "Ready") == ("True", "AllReplicasReady")
    assert st.pools[0].explicit_not_honoured == 4 and st.pools[0].processor_workers == 1


def test_placement_problem_and_invalid_spec() -> None:
    st = status.fold(None, observation(problem=status.Problem("NoEligibleNodes", "none of 3 node(s) is eligible")), T0)
    assert cond(st, "Degraded") == ("True", "NoEligibleNodes")
    assert cond(st, "Ready") == ("False", "NoEligibleNodes")
    invalid = status.fold(None, status.Observation(3, SELECTOR, spec_error="spec.model: bad"), T0)
    assert cond(invalid, "Degraded") == ("True", "InvalidSpec")
    assert all(c.observed_generation == 3 for c in invalid.conditions)


def test_scaled_to_zero_is_ready() -> None:
    obs = observation()
    obs = status.Observation(**{**obs.__dict__, "replicas": dict.fromkeys(obs.replicas, 0)})
    assert cond(status.fold(None, obs, T0), "Ready") == ("True", "ScaledToZero")


def test_events_explain_decisions_and_problems_once() -> None:
    pending = status.fold(None, status.Observation(1, SELECTOR, probe=probe_status("Running")), T0)
    assert events.events(None, pending) == []
    decided = status.fold(pending, observation(ready=0), T1)
    evs = events.events(pending, decided)
    assert [(e.type, e.reason) for e in evs] == [("Normal", "Decided"), ("Normal", "ProbeSucceeded")]
    assert evs[0].message.startswith("pool nvidia-h200-141gb-hbm3e: gpu path, 1 worker, GPUPathCap")
    assert events.events(decided, status.fold(decided, observation(ready=0), T1)) == []
    ready = status.fold(decided, observation(ready=2), T1)
    assert [(e.type, e.reason) for e in events.events(decided, ready)] == [("Normal", "AllReplicasReady")]
    failed = status.fold(ready, status.Observation(2, SELECTOR, probe=probe_status("Failed")), T1)
    reasons = [(e.type, e.reason) for e in events.events(ready, failed)]
    assert reasons == [("Warning", "ProbeFailed")]  # once, though Probed, Degraded and Ready all say it
    # Nothing was planned, the Deployments were left alone: the status keeps showing them.
    assert [p.name for p in failed.pools] == [p.name for p in ready.pools]


def test_a_pool_that_vanishes_after_planning_is_announced() -> None:
    decided = status.fold(None, observation(ready=2), T0)
    gone = status.fold(
        decided, status.Observation(1, SELECTOR, probe=probe_status(), problem=status.Problem("NoEligibleNodes", "x")), T1
    )
    assert gone.pools == []
    assert ("Normal", "PoolRemoved") in [(e.type, e.reason) for e in events.events(decided, gone)]


def test_ready_waits_for_a_rollout_of_the_current_template() -> None:
    # A new decision rolled the pods: old pods are still ready, the new ones are not all there.
    rolling = status.fold(None, observation(ready=2, updated=1), T0)
    assert cond(rolling, "Ready") == ("False", "RollingOut")
    unseen = status.fold(None, observation(ready=2, observed=False), T0)
    assert cond(unseen, "Ready") == ("False", "RollingOut")
    surge = status.fold(None, observation(ready=3, updated=2), T0)
    assert cond(surge, "Ready") == ("True", "AllReplicasReady")
    assert surge.ready_summary == "2/2"  # never more ready than desired

"""Which autoscaler sizes each pool, and the object that asks it to: an ``autoscaling/v2``
HorizontalPodAutoscaler (signal cpu, through metrics-server) or a KEDA ``ScaledObject`` (the
runtime's own metrics, through Prometheus), one per pool Deployment.

Pure: (spec.autoscaling, what the cluster has, the pools) -> ``PoolScaling`` per pool and the
objects. What the cluster has (``Autoscalers``) is found by ``control.autoscalers``; the status
fold reads an autoscaler's own status back with ``observed``.

The rule the operator keeps with an autoscaler (docs/autoscaling.md): once a pool is autoscaled,
the operator never writes its Deployment's replicas. It renders the Deployment without them;
``seed`` is the count a Deployment made for an autoscaled pool starts at, and what the
applier hands over to the autoscaler (``control.applier``) so that the count never falls back to
the API server's default of 1. Where autoscaling is asked for and no engine can do it, the pool is
*held*: its replicas stay what they were, and status says why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

from mmprep_operator import api
from mmprep_operator.api.autoscaling import TARGET_RANGES, Engine
from mmprep_operator.logic import naming
from mmprep_operator.logic.conditions import Reason
from mmprep_operator.logic.identity import Owner, deployment_name, pool_labels
from mmprep_operator.logic.pod_parts import CONTAINER_NAME

HPA_API_VERSION: Final = "autoscaling/v2"
HPA_KIND: Final = "HorizontalPodAutoscaler"
KEDA_API_VERSION: Final = "keda.sh/v1alpha1"
KEDA_KIND: Final = "ScaledObject"
#: What detection looks for: the metrics API's registration, and KEDA's CRD.
METRICS_API_SERVICE: Final = "v1beta1.metrics.k8s.io"
KEDA_CRD: Final = "scaledobjects.keda.sh"
#: The window KEDA's queue-wait query rates over: long enough for a few scrapes at 30 s.
_RATE_WINDOW: Final = "2m"


@dataclasses.dataclass(frozen=True)
class Autoscalers:
    """What the cluster has to autoscale with (``control.autoscalers`` finds it)."""

    metrics_server: bool
    keda: bool


#: What ``mmprep-operator render`` assumes: a preview shows the objects the spec asks for.
ASSUMED: Final = Autoscalers(metrics_server=True, keda=True)


@dataclasses.dataclass(frozen=True)
class PoolScaling:
    """One autoscaled pool: its bounds and target, who scales it (None: held), and why."""

    pool: str
    deployment: str
    min_replicas: int
    max_replicas: int
    target: int
    engine: Engine
    reason: str
    message: str

    @property
    def kind(self) -> str | None:
        """The kind of the object that asks the engine to scale the pool (None when held)."""
        return {"HPA": HPA_KIND, "KEDA": KEDA_KIND}.get(self.engine)


def engine_for(autoscaling: api.Autoscaling, have: Autoscalers) -> tuple[Engine, str, str]:
    """(engine, reason, message): who scales pools on ``autoscaling.signal`` in this cluster."""
    if autoscaling.signal == "cpu":
        if have.metrics_server:
            return "HPA", Reason.AUTOSCALED_BY_HPA, "signal cpu: a HorizontalPodAutoscaler per pool, through metrics-server"
        return (
            "None",
            Reason.NO_METRICS_SERVER,
            f"signal cpu needs metrics-server (the APIService {METRICS_API_SERVICE} is not available); "
            "each pool keeps its last replica count",
        )
    if have.keda:
        return (
            "KEDA",
            Reason.AUTOSCALED_BY_KEDA,
            f"signal {autoscaling.signal}: a KEDA ScaledObject per pool on the runtime's metrics",
        )
    return (
        "None",
        Reason.NO_KEDA,
        f"signal {autoscaling.signal} needs KEDA (the CRD {KEDA_CRD} is not installed); each pool keeps its last replica count",
    )


def pool_scaling(owner: Owner, autoscaling: api.Autoscaling, pools: list[str], have: Autoscalers) -> dict[str, PoolScaling]:
    engine, reason, message = engine_for(autoscaling, have)
    out = {}
    for pool in pools:
        low, high, target = autoscaling.for_pool(pool)
        out[pool] = PoolScaling(pool, deployment_name(owner, pool), low, high, target, engine, reason, message)
    return out


def seed(fixed_share: int, scaling: PoolScaling) -> int:
    """The count a new autoscaled Deployment starts at: its fixed share, within the pool's bounds."""
    return min(max(fixed_share, scaling.min_replicas), scaling.max_replicas)


def _policies(behavior: api.ScalingBehavior | None) -> dict[str, Any] | None:
    if behavior is None or (behavior.stabilization_window_seconds is None and behavior.rate is None):
        return None
    out: dict[str, Any] = {}
    if behavior.stabilization_window_seconds is not None:
        out["stabilizationWindowSeconds"] = behavior.stabilization_window_seconds
    if (rate := behavior.rate) is not None:
        kind, value = ("Pods", rate.pods) if rate.pods is not None else ("Percent", rate.percent)
        out["policies"] = [{"type": kind, "value": value, "periodSeconds": rate.period_seconds}]
    return out


def behavior(autoscaling: api.Autoscaling) -> dict[str, Any] | None:
    """The HPA's ``behavior`` (KEDA passes the same to the HPA it makes)."""
    out = {
        key: rendered
        for key, rendered in (("scaleUp", _policies(autoscaling.scale_up)), ("scaleDown", _policies(autoscaling.scale_down)))
        if rendered is not None
    }
    return out or None


def _target_ref(scaling: PoolScaling) -> dict[str, str]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": scaling.deployment}


def hpa_manifest(owner: Owner, autoscaling: api.Autoscaling, scaling: PoolScaling) -> dict[str, Any]:
    """The pool's HPA on the runtime container's CPU utilization (not the pod's: a sidecar that
    idles would dilute it)."""
    spec: dict[str, Any] = {
        "scaleTargetRef": _target_ref(scaling),
        "minReplicas": scaling.min_replicas,
        "maxReplicas": scaling.max_replicas,
        "metrics": [
            {
                "type": "ContainerResource",
                "containerResource": {
                    "name": "cpu",
                    "container": CONTAINER_NAME,
                    "target": {"type": "Utilization", "averageUtilization": scaling.target},
                },
            }
        ],
    }
    if (rendered := behavior(autoscaling)) is not None:
        spec["behavior"] = rendered
    return {
        "apiVersion": HPA_API_VERSION,
        "kind": HPA_KIND,
        "metadata": owner.metadata(scaling.deployment, pool_labels(owner, scaling.pool)),
        "spec": spec,
    }


def runtime_selector(owner: Owner, pool: str) -> str:
    """PromQL label matchers for one pool's runtime series, as the chart's ServiceMonitor labels
    them (``podTargetLabels`` mmprep.dev/resource and mmprep.dev/pool)."""
    return (
        f'namespace="{owner.namespace}",mmprep_dev_resource="{naming.label_value(owner.name)}",'
        f'mmprep_dev_pool="{naming.label_value(pool)}"'
    )


def trigger(owner: Owner, autoscaling: api.Autoscaling, scaling: PoolScaling) -> dict[str, Any]:
    """The ScaledObject's Prometheus trigger for the signal.

    AverageValue divides the query's value by the pod count before comparing with the threshold,
    so the load signals are sums over the pool's pods, and the threshold is the per-pod target.
    Queue wait is a latency, not a load to share: Value compares it as it is (the HPA then scales
    in proportion to how far it is over).
    """
    sel = runtime_selector(owner, scaling.pool)
    signal = autoscaling.signal
    if signal == "workerBusy":
        query, metric_type, threshold = f"sum(mmprep_workers_busy_fraction{{{sel}}})", "AverageValue", scaling.target / 100
    elif signal == "inFlight":
        # Requests per processor worker: the pool's in-flight total over one pod's worker count.
        query = f"sum(mmprep_requests_in_flight{{{sel}}}) / avg(mmprep_processor_workers{{{sel}}})"
        metric_type, threshold = "AverageValue", float(scaling.target)
    else:
        query = f"histogram_quantile(0.9, sum by (le) (rate(mmprep_queue_wait_seconds_bucket{{{sel}}}[{_RATE_WINDOW}])))"
        metric_type, threshold = "Value", scaling.target / 1000
    assert autoscaling.prometheus is not None  # the section's CEL rule: runtime signals name Prometheus
    return {
        "type": "prometheus",
        "metricType": metric_type,
        "metadata": {"serverAddress": autoscaling.prometheus.server_address, "query": query, "threshold": f"{threshold:g}"},
    }


def scaled_object_manifest(owner: Owner, autoscaling: api.Autoscaling, scaling: PoolScaling) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "scaleTargetRef": _target_ref(scaling),
        "minReplicaCount": scaling.min_replicas,
        "maxReplicaCount": scaling.max_replicas,
        "triggers": [trigger(owner, autoscaling, scaling)],
    }
    if (rendered := behavior(autoscaling)) is not None:
        spec["advanced"] = {"horizontalPodAutoscalerConfig": {"behavior": rendered}}
    return {
        "apiVersion": KEDA_API_VERSION,
        "kind": KEDA_KIND,
        "metadata": owner.metadata(scaling.deployment, pool_labels(owner, scaling.pool)),
        "spec": spec,
    }


def manifest(owner: Owner, autoscaling: api.Autoscaling, scaling: PoolScaling) -> dict[str, Any] | None:
    """The pool's HPA or ScaledObject; None for a held pool (no engine: nothing to ask)."""
    if scaling.engine == "HPA":
        return hpa_manifest(owner, autoscaling, scaling)
    if scaling.engine == "KEDA":
        return scaled_object_manifest(owner, autoscaling, scaling)
    return None


# ------------------------------------------------------------------------- reading it back

#: Which of an HPA's conditions says most about its last decision, first match wins: a limit it
#: hit, a metric it cannot read, then whether it is able to scale (and why not).
_TELLING: Final = (("ScalingLimited", "True"), ("ScalingActive", "False"), ("AbleToScale", None), ("ScalingActive", None))


def observed(
    scaling: PoolScaling, autoscaler: Mapping[str, Any] | None, deployment_replicas: int | None
) -> api.PoolAutoscalingStatus:
    """A pool's autoscaling status: the choice, and what its HPA (or ScaledObject) last said.

    An HPA reports current and desired replicas; a ScaledObject does not (its HPA, made by KEDA,
    does), so for KEDA (and a held pool) the Deployment's replicas stand for both, and the
    ScaledObject's Ready/Active conditions for the reason.
    """
    status = dict((autoscaler or {}).get("status") or {})
    conditions = {c.get("type"): c for c in status.get("conditions") or ()}
    scaling_reason = scaling_message = None
    if scaling.engine == "HPA":
        wanted: tuple[tuple[str, str | None], ...] = _TELLING
    else:
        wanted = (("Fallback", "True"), ("Ready", "False"), ("Active", None), ("Ready", None))
    for type_, state in wanted:
        c = conditions.get(type_)
        if c is not None and (state is None or c.get("status") == state):
            scaling_reason, scaling_message = c.get("reason") or type_, c.get("message")
            break
    current, desired = status.get("currentReplicas"), status.get("desiredReplicas")
    if scaling.engine != "HPA":
        # KEDA's own HPA knows; a held pool has no autoscaler: the Deployment's count is both.
        current = desired = deployment_replicas
    return api.PoolAutoscalingStatus(
        engine=scaling.engine,
        reason=scaling.reason,
        message=scaling.message,
        object=scaling.deployment if scaling.kind is not None else None,
        min_replicas=scaling.min_replicas,
        max_replicas=scaling.max_replicas,
        target=scaling.target,
        current_replicas=current,
        desired_replicas=desired,
        last_scale_time=status.get("lastScaleTime"),
        scaling_reason=scaling_reason,
        scaling_message=scaling_message,
    )


def at_max(pool: api.PoolAutoscalingStatus | None) -> bool:
    """The pool's autoscaler asks for its max (a held pool has no autoscaler to ask)."""
    return (
        pool is not None
        and pool.engine != "None"
        and pool.desired_replicas is not None
        and pool.desired_replicas >= pool.max_replicas
    )


def summary(pools: list[api.PoolStatus]) -> str | None:
    """Per autoscaled pool "name=ENGINE:current->desired/max", for ``kubectl get -o wide``."""
    parts = []
    for p in pools:
        a = p.autoscaling
        if a is None:
            continue
        seen = "?" if a.current_replicas is None else str(a.current_replicas)
        wanted = "?" if a.desired_replicas is None else str(a.desired_replicas)
        parts.append(f"{p.gpu_model or p.name}={a.engine}:{seen}->{wanted}/{a.max_replicas}")
    return ",".join(parts) or None


def target_unit(signal: str) -> str:
    return TARGET_RANGES[signal][0]

"""The resource's autoscaling section: per-pool replica bounds, the signal and its target, and how
fast to scale up and down (``spec.autoscaling``).

Without the section a resource's replicas are fixed (``spec.replicas`` spread over the pools).
With it, each pool's Deployment is scaled by the cluster's own autoscaler: a HorizontalPodAutoscaler
on the runtime container's CPU utilization (metrics-server), or a KEDA ScaledObject on one of the
runtime's own metrics (Prometheus). Choosing and rendering them is ``logic.autoscaling``; this
module is only the API, so each range and cross-field rule is a ``CelRule`` here with the
validator that mirrors it.
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field, model_validator

from mmprep_operator.api.base import ApiModel, CelRule, cel_rules

#: What a pool is scaled on. ``cpu``: the runtime container's CPU utilization, percent of its CPU
#: request (an HPA through metrics-server). The others are the runtime's own metrics, read from
#: Prometheus by a KEDA ScaledObject: ``workerBusy`` (percent of processor workers busy),
#: ``queueWait`` (p90 wait for a processor worker, ms), ``inFlight`` (requests in flight per
#: processor worker).
Signal = Literal["cpu", "workerBusy", "queueWait", "inFlight"]
SIGNALS: Final[tuple[Signal, ...]] = ("cpu", "workerBusy", "queueWait", "inFlight")

#: Per signal: its target's unit, bounds and default. One table, read by the CEL rules, their
#: validator mirror, the renderers and the docs.
TARGET_RANGES: Final[dict[str, tuple[str, int, int, int]]] = {
    "cpu": ("CPU utilization percent of the CPU request", 1, 100, 70),
    "workerBusy": ("percent of processor workers busy", 1, 100, 70),
    "queueWait": ("milliseconds of p90 queue wait", 1, 600_000, 250),
    "inFlight": ("requests in flight per processor worker", 1, 1000, 2),
}

MAX_REPLICAS: Final = 1000


def _target_rule(subject: str, signal: str) -> str:
    """CEL: the target at ``subject`` (when set) lies in ``signal``'s range."""
    parts = []
    for name, (_, low, high, _) in TARGET_RANGES.items():
        parts.append(f"({signal} == '{name}' && {subject} >= {low} && {subject} <= {high})")
    return " || ".join(parts)


_TARGET_MESSAGE: Final = "autoscaling target out of range for its signal: " + "; ".join(
    f"{name}: {low}-{high} ({unit})" for name, (unit, low, high, _) in TARGET_RANGES.items()
)
# has() guards: defaults fill signal in, but a rule must not depend on that.
_SIGNAL: Final = "(has(self.signal) ? self.signal : 'cpu')"
_MIN: Final = "(has(self.minReplicas) ? self.minReplicas : 1)"

_RATE_ONE_OF: Final = CelRule("has(self.pods) != has(self.percent)", "a scaling rate sets exactly one of pods and percent")
_MIN_NOT_ABOVE_MAX: Final = CelRule(f"{_MIN} <= self.maxReplicas", "autoscaling.minReplicas must not exceed maxReplicas")
_TARGET_IN_RANGE: Final = CelRule(f"!has(self.target) || {_target_rule('self.target', _SIGNAL)}", _TARGET_MESSAGE)
_POOL_BOUNDS: Final = CelRule(
    "!has(self.pools) || self.pools.all(p, (has(p.minReplicas) ? p.minReplicas : "
    + _MIN
    + ") <= (has(p.maxReplicas) ? p.maxReplicas : self.maxReplicas))",
    "autoscaling.pools: a pool's minReplicas must not exceed its maxReplicas (the pool's own, else the section's)",
)
_POOL_TARGETS: Final = CelRule(
    "!has(self.pools) || self.pools.all(p, !has(p.target) || " + _target_rule("p.target", _SIGNAL) + ")",
    "autoscaling.pools: " + _TARGET_MESSAGE,
)
_POOLS_UNIQUE: Final = CelRule(
    "!has(self.pools) || self.pools.all(p, self.pools.exists_one(q, q.pool == p.pool))",
    "autoscaling.pools: each pool is named at most once",
)
_PROMETHEUS_FOR_RUNTIME_SIGNALS: Final = CelRule(
    f"{_SIGNAL} == 'cpu' || has(self.prometheus)",
    "autoscaling.prometheus.serverAddress is needed for the signals read from the runtime's metrics "
    "(workerBusy, queueWait, inFlight)",
)
#: Spec-level: the one rule that needs more than the section (``spec.resources``).
CPU_SIGNAL_NEEDS_CPU_REQUEST: Final = CelRule(
    "!has(self.autoscaling) || (has(self.autoscaling.signal) && self.autoscaling.signal != 'cpu') || "
    "(has(self.resources) && ((has(self.resources.requests) && 'cpu' in self.resources.requests) || "
    "(has(self.resources.limits) && 'cpu' in self.resources.limits)))",
    "autoscaling on signal cpu needs a CPU request for the runtime container (resources.requests.cpu): "
    "utilization is measured against it",
)


def target_error(signal: str, target: int | None) -> str | None:
    if target is None:
        return None
    _, low, high, _ = TARGET_RANGES[signal]
    return None if low <= target <= high else _TARGET_MESSAGE


class ScalingRate(ApiModel):
    """At most this much change per period: a pod count or a percentage of the current pods."""

    model_config = cel_rules(_RATE_ONE_OF)

    pods: int | None = Field(None, ge=1, le=MAX_REPLICAS, description="Pods added (or removed) per period at most.")
    percent: int | None = Field(
        None, ge=1, le=1000, description="Percent of the current pods added (or removed) per period at most."
    )
    period_seconds: int = Field(60, ge=1, le=1800, description="The period the rate is counted over, seconds.")

    @model_validator(mode="after")
    def _one_of(self) -> ScalingRate:
        if (self.pods is None) == (self.percent is None):
            raise ValueError(_RATE_ONE_OF.message)
        return self


class ScalingBehavior(ApiModel):
    """How fast one direction goes: how long the signal must agree, and how much at a time."""

    stabilization_window_seconds: int | None = Field(
        None,
        ge=0,
        le=3600,
        description="The highest (scale-down) or lowest (scale-up) recommendation over this window wins, seconds; "
        "the autoscaler's default when unset (0 up, 300 down).",
    )
    rate: ScalingRate | None = Field(None, description="The largest change per period; the autoscaler's default when unset.")


class PoolAutoscaling(ApiModel):
    """Bounds and target for one pool (by its name in status.pools), over the section's."""

    pool: str = Field(min_length=1, max_length=63, description="The pool's name, as status.pools[].name says it.")
    min_replicas: int | None = Field(None, ge=1, le=MAX_REPLICAS, description="The pool's fewest pods.")
    max_replicas: int | None = Field(None, ge=1, le=MAX_REPLICAS, description="The pool's most pods.")
    target: int | None = Field(None, description="The pool's target, in the signal's unit.")


class Prometheus(ApiModel):
    """Where KEDA reads the runtime's metrics (the Prometheus that scrapes the runtime pods)."""

    server_address: str = Field(
        min_length=1,
        max_length=2048,
        pattern=r"^https?://",
        description="Prometheus' HTTP address, e.g. http://prometheus.monitoring:9090.",
    )


class Autoscaling(ApiModel):
    """Each pool's replicas scaled by the cluster's autoscaler between min and max, on one signal.

    With this section the operator renders a HorizontalPodAutoscaler (signal cpu) or a KEDA
    ScaledObject (the runtime's own signals) per pool Deployment and stops writing the
    Deployments' replicas; spec.replicas then only sizes a pool when its Deployment is first
    made (clamped to the pool's bounds). See docs/autoscaling.md.
    """

    model_config = cel_rules(
        _MIN_NOT_ABOVE_MAX, _TARGET_IN_RANGE, _POOL_BOUNDS, _POOL_TARGETS, _POOLS_UNIQUE, _PROMETHEUS_FOR_RUNTIME_SIGNALS
    )

    min_replicas: int = Field(1, ge=1, le=MAX_REPLICAS, description="Fewest pods per pool.")
    max_replicas: int = Field(ge=1, le=MAX_REPLICAS, description="Most pods per pool.")
    signal: Signal = Field(
        "cpu",
        description="What pools scale on: cpu (runtime container CPU utilization, an HPA through metrics-server), or "
        "the runtime's own metrics through KEDA and Prometheus: workerBusy (percent of processor workers busy), "
        "queueWait (p90 queue wait, ms), inFlight (requests in flight per processor worker).",
    )
    target: int | None = Field(
        None,
        description="The signal's target per pod, in its unit: cpu 1-100 (default 70), workerBusy 1-100 (70), "
        "queueWait 1-600000 ms (250), inFlight 1-1000 (2).",
    )
    prometheus: Prometheus | None = Field(
        None, description="Where KEDA reads the runtime's metrics; needed for the runtime's signals."
    )
    scale_up: ScalingBehavior | None = Field(None, description="How fast pools grow.")
    scale_down: ScalingBehavior | None = Field(None, description="How fast pools shrink.")
    pools: list[PoolAutoscaling] = Field(default_factory=list, max_length=32, description="Per-pool bounds and targets.")

    @model_validator(mode="after")
    def _rules(self) -> Autoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError(_MIN_NOT_ABOVE_MAX.message)
        if target_error(self.signal, self.target):
            raise ValueError(_TARGET_MESSAGE)
        for p in self.pools:
            if (p.min_replicas or self.min_replicas) > (p.max_replicas or self.max_replicas):
                raise ValueError(_POOL_BOUNDS.message)
            if target_error(self.signal, p.target):
                raise ValueError(_POOL_TARGETS.message)
        if len({p.pool for p in self.pools}) != len(self.pools):
            raise ValueError(_POOLS_UNIQUE.message)
        if self.signal != "cpu" and self.prometheus is None:
            raise ValueError(_PROMETHEUS_FOR_RUNTIME_SIGNALS.message)
        return self

    def for_pool(self, pool: str) -> tuple[int, int, int]:
        """(min, max, target) of one pool: its entry's values over the section's and the signal's default."""
        entry = next((p for p in self.pools if p.pool == pool), None)
        default_target = TARGET_RANGES[self.signal][3]
        low = entry.min_replicas if entry and entry.min_replicas is not None else self.min_replicas
        high = entry.max_replicas if entry and entry.max_replicas is not None else self.max_replicas
        target = entry.target if entry and entry.target is not None else self.target
        return low, high, target if target is not None else default_target


#: Engine, in status (``pools[].autoscaling.engine``): who sizes a pool.
Engine = Literal["HPA", "KEDA", "None"]


class PoolAutoscalingStatus(ApiModel):
    """Who scales a pool and what it last said: the HPA's (or KEDA's HPA's) status, read back."""

    engine: Engine = Field(description="HPA, KEDA, or None (autoscaling asked but not possible: replicas held).")
    reason: str = Field(description="Why this engine (AutoscaledByHPA, AutoscaledByKEDA, NoMetricsServer, NoKEDA, ...).")
    message: str = Field("", description="The choice in words.")
    object: str | None = Field(None, description="Name of the HorizontalPodAutoscaler or ScaledObject.")
    min_replicas: int = Field(description="The pool's fewest pods.")
    max_replicas: int = Field(description="The pool's most pods.")
    target: int = Field(description="The signal's target, in its unit.")
    current_replicas: int | None = Field(None, description="Pods the autoscaler last saw.")
    desired_replicas: int | None = Field(None, description="Pods the autoscaler last asked for.")
    last_scale_time: str | None = Field(None, description="When the autoscaler last changed the pool's size.")
    scaling_reason: str | None = Field(
        None, description="The autoscaler's last word: its ScalingActive/ScalingLimited/AbleToScale condition reason."
    )
    scaling_message: str | None = Field(None, description="What that condition said.")

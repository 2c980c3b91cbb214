"""The condition types and reasons the operator writes: each one defined once, here.

What ``kubectl get mmp`` and ``kubectl describe`` show, what alerts and dashboards match on:
the reasons are part of the API. Modules that set a condition, a pool's problem, a probe's or a
calibration's outcome, or an Event, name them from here (``Reason.ALL_REPLICAS_READY``), never
as a literal at the call site; plain strings (not ``Enum`` members) so that they serialize as
themselves in the status and in Events. Reasons that Kubernetes gives (a pod's waiting reason,
the scheduler's) are passed through unchanged and are not listed.

Neighbours: ``status`` folds the conditions, ``events`` chooses the Events, ``plan``, ``probe``,
``calibration`` and ``podstates`` name the problems they find.
"""

from __future__ import annotations

from typing import Final


class ConditionType:
    """The conditions of a resource's status, in the order they are listed: the first four always,
    the others only while the spec asks for what they report on."""

    READY: Final = "Ready"
    PROBED: Final = "Probed"
    CLONEABLE: Final = "Cloneable"
    DEGRADED: Final = "Degraded"
    #: Only while spec.autoscaling is set: whether every pool has an autoscaler, and which.
    AUTOSCALING: Final = "Autoscaling"
    #: Only while spec.engine is set: whether the engine answered the operator's GET <url>/health.
    ENGINE_REACHABLE: Final = "EngineReachable"


CONDITION_TYPES: Final = (
    ConditionType.READY,
    ConditionType.PROBED,
    ConditionType.CLONEABLE,
    ConditionType.DEGRADED,
    ConditionType.AUTOSCALING,
    ConditionType.ENGINE_REACHABLE,
)


class Reason:
    """Every reason the operator writes, grouped by where it appears."""

    # Ready: every desired pod of every pool is ready, or why not.
    ALL_REPLICAS_READY: Final = "AllReplicasReady"
    REPLICAS_NOT_READY: Final = "ReplicasNotReady"
    ROLLING_OUT: Final = "RollingOut"
    SCALED_TO_ZERO: Final = "ScaledToZero"

    # Probed: the probe's state for the current probe hash.
    PROBE_SUCCEEDED: Final = "ProbeSucceeded"
    PROBE_PENDING: Final = "ProbePending"
    PROBE_RUNNING: Final = "ProbeRunning"
    PROBE_FAILED: Final = "ProbeFailed"
    PROBE_TIMED_OUT: Final = "ProbeTimedOut"
    PROBE_OUTPUT_UNREADABLE: Final = "ProbeOutputUnreadable"
    #: Probed=Unknown: the spec is invalid, so nothing was probed.
    SPEC_INVALID: Final = "SpecInvalid"

    # Cloneable: whether the processor can be deep-copied.
    CLONEABLE: Final = "Cloneable"
    NOT_CLONEABLE: Final = "NotCloneable"
    NOT_PROBED: Final = "NotProbed"

    # Degraded: what keeps the resource from working as asked.
    AS_EXPECTED: Final = "AsExpected"
    INVALID_SPEC: Final = "InvalidSpec"
    EXPLICIT_WORKERS_NOT_HONOURED: Final = "ExplicitWorkersNotHonoured"
    NO_ELIGIBLE_NODES: Final = "NoEligibleNodes"
    NO_GPU_POOL: Final = "NoGPUPool"
    IMAGE_PLATFORM_MISSING: Final = "ImagePlatformMissing"
    APPLY_FAILED: Final = "ApplyFailed"
    NAME_CONFLICT: Final = "NameConflict"
    #: An object the pods name is missing (``references``): the reason names its kind.
    SECRET_NOT_FOUND: Final = "SecretNotFound"
    CONFIG_MAP_NOT_FOUND: Final = "ConfigMapNotFound"
    PERSISTENT_VOLUME_CLAIM_NOT_FOUND: Final = "PersistentVolumeClaimNotFound"

    # A pool's problem (``pools[].problem``), and Ready's reason when it is the only one.
    UNSCHEDULABLE: Final = "Unschedulable"
    DEVICE_FAILED: Final = "DeviceFailed"
    LOAD_FAILED: Final = "LoadFailed"
    RUNTIME_FAILED: Final = "RuntimeFailed"

    # A pool's calibration (``pools[].calibration.reason``).
    MEASURED: Final = "Measured"
    CALIBRATION_PENDING: Final = "CalibrationPending"
    CALIBRATION_FAILED: Final = "CalibrationFailed"
    CALIBRATION_UNAVAILABLE: Final = "CalibrationUnavailable"
    CALIBRATION_NOT_NEEDED: Final = "CalibrationNotNeeded"

    # Autoscaling (and a held pool's Degraded): who scales the pools, or why nobody can.
    AUTOSCALED_BY_HPA: Final = "AutoscaledByHPA"
    AUTOSCALED_BY_KEDA: Final = "AutoscaledByKEDA"
    NO_METRICS_SERVER: Final = "NoMetricsServer"
    NO_KEDA: Final = "NoKEDA"

    # EngineReachable (and its Events): whether spec.engine's GET <url>/health answered 200.
    ENGINE_ANSWERS: Final = "EngineAnswers"
    ENGINE_UNREACHABLE: Final = "EngineUnreachable"

    # Events only: what changed between two statuses.
    DECIDED: Final = "Decided"
    CALIBRATED: Final = "Calibrated"
    POOL_REMOVED: Final = "PoolRemoved"
    POOL_AT_MAX_REPLICAS: Final = "PoolAtMaxReplicas"

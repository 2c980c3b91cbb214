"""The resource's status: what the operator observed and decided (conditions, the probe, pools).

Written only by the operator (``logic.status`` folds it, ``control.status_writer`` writes it);
the probe's answer is the runtime's ``ProbeAnswer`` under camelCase names.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import Field

from mmprep_operator.api.autoscaling import PoolAutoscalingStatus
from mmprep_operator.api.base import ApiModel
from mmprep_operator.api.spec import MultimodalPreprocessorSpec
from mmprep_runtime.calibration_report import Dimension
from mmprep_runtime.contract import ProbeAnswer

#: A condition reason as metav1.Condition has it: CamelCase, as every reason the operator writes
#: (``logic.conditions.Reason``) and every one it passes through from the kubelet or scheduler.
REASON_PATTERN: Final = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
ReasonText = Annotated[str, Field(min_length=1, max_length=1024, pattern=REASON_PATTERN)]


class Condition(ApiModel):
    """A Kubernetes-style condition."""

    type: str = Field(
        description="Condition type: Ready, Probed, Cloneable or Degraded; Autoscaling with spec.autoscaling, "
        "EngineReachable with spec.engine."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: ReasonText = Field(description="CamelCase reason (logic.conditions lists the operator's).")
    message: str = Field("", description="Human-readable explanation.")
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(None, description="The generation this condition was computed for.")


class ProbeResult(ApiModel, ProbeAnswer):
    """What the runtime probe answered: its answer's fields (``mmprep_runtime.contract``), under
    camelCase names as everything in the API."""


ProbeState = Literal["Pending", "Running", "Succeeded", "Failed"]


class ProbeStatus(ApiModel):
    """The probe for the current probe-relevant fields (image, model, volumes)."""

    hash: str = Field(description="Hash of the fields the probe depends on; a new hash means a new probe.")
    job: str = Field(description="Name of the probe Job (shared by resources with the same hash).")
    state: ProbeState = Field(description="Pending, Running, Succeeded or Failed.")
    reason: str | None = Field(
        None,
        description="Why it failed (ProbeFailed, ProbeTimedOut, ...), or why its pod cannot start while Pending "
        "(SecretNotFound, ConfigMapNotFound, Unschedulable, ...).",
    )
    message: str | None = Field(None, description="Details of a failure.")
    result: ProbeResult | None = Field(None, description="The probe's answer.")


CalibrationState = Literal["Pending", "Running", "Succeeded", "Failed", "Unavailable", "NotNeeded"]


class CalibrationPoint(ApiModel):
    """Throughput and latency measured at one count (of what: the calibration's ``measures``)."""

    workers: int = Field(description="The count measured: processor workers, or vLLM render processes (see measures).")
    req_per_s: float = Field(description="Requests per second (each decoding and processing one image).")
    p50_ms: float | None = Field(None, description="Median latency, ms.")
    p99_ms: float | None = Field(None, description="99th percentile latency, ms.")


class PoolCalibration(ApiModel):
    """The calibration run for this pool: where it ran, what it measured, what it chose and why."""

    hash: str = Field(
        description="Hash of what the measurement depends on (GPU product, image, model, backend, device, resources)."
    )
    job: str | None = Field(None, description="The calibration Job.")
    state: CalibrationState = Field(description="Pending, Running, Succeeded, Failed, Unavailable or NotNeeded.")
    reason: str = Field(
        description="Measured, CalibrationPending, CalibrationFailed, CalibrationUnavailable or CalibrationNotNeeded."
    )
    message: str = Field("", description="What was chosen and why, or why there is no measurement.")
    node: str | None = Field(None, description="The node the Job ran on.")
    measured_at: str | None = Field(None, description="When the result was read (RFC 3339).")
    measures: Dimension | None = Field(
        None,
        description="What the curve's counts are: processorWorkers (clone-per-thread workers), or renderProcesses "
        "(vLLM render processes of the general render path, for api vllm-render models it serves).",
    )
    curve: list[CalibrationPoint] = Field(default_factory=list, description="Throughput by count.")
    chosen_workers: int | None = Field(
        None, description="The processor worker count chosen: the fewest within the tolerance of the best."
    )
    chosen_render_processes: int | None = Field(
        None, description="The render process count chosen (measures renderProcesses), by the same rule."
    )
    tolerance: float | None = Field(None, description="The tolerance the choice used.")


class PoolProblem(ApiModel):
    """Why a pool's pods do not run: the scheduler's verdict, a container's last termination, or an
    image that is not built for the pool's architecture."""

    reason: ReasonText = Field(description="CamelCase reason: Unschedulable, ImagePlatformMissing, or the container's reason.")
    message: str = Field(description="What the scheduler or the container said.")
    pods: int = Field(0, description="How many of the pool's pods this applies to.")


class PoolStatus(ApiModel):
    """One node pool (nodes of one GPU product, or CPU-only nodes) and what was decided for it."""

    name: str = Field(description="Pool name (also the mmprep.dev/pool label).")
    gpu_product: str | None = Field(None, description="nvidia.com/gpu.product of the pool's nodes.")
    gpu_family: str | None = Field(None, description="GPU family (label, or inferred from product/compute capability).")
    gpu_model: str | None = Field(None, description="Short GPU model name, e.g. H200.")
    nodes: int = Field(description="Number of eligible nodes in the pool.")
    path: Literal["cpu", "gpu"] = Field(description="Preprocessing path.")
    processor_workers: int = Field(description="Processor workers per pod.")
    io_workers: int = Field(description="IO workers per pod.")
    reason: str = Field(description="The rule that decided processor workers.")
    message: str = Field(description="The decision in words.")
    render_processes: int | None = Field(
        None,
        description="api vllm-render: vLLM render processes per pod of the general render path, when set by "
        "spec.serving.renderProcesses or measured by the calibration; unset, the runtime starts one per usable CPU.",
    )
    override_source: str | None = Field(None, description="Which override applied, when reason is Override.")
    explicit_not_honoured: int | None = Field(None, description="An explicit count that could not be honoured.")
    deployment: str = Field(description="Name of the pool's Deployment.")
    replicas: int = Field(description="Desired pods in the pool (the Deployment's, when an autoscaler sizes it).")
    ready_replicas: int = Field(0, description="Ready pods in the pool.")
    calibration: PoolCalibration | None = Field(None, description="The pool's calibration, when calibration is on.")
    arch: str | None = Field(
        None, description="CPU architecture of the pool's nodes (kubernetes.io/arch) when known; arm64 pools are pinned to it."
    )
    problem: PoolProblem | None = Field(
        None, description="Why the pool's pods are not (all) running: scheduler, image or container."
    )
    autoscaling: PoolAutoscalingStatus | None = Field(
        None, description="Who scales the pool and what it last said, when spec.autoscaling is set."
    )


class MultimodalPreprocessorStatus(ApiModel):
    """What the operator observed and decided."""

    observed_generation: int | None = Field(None, description="The generation last reconciled.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, Probed, Cloneable and Degraded; Autoscaling while spec.autoscaling is set, EngineReachable "
        "while spec.engine is (whether the engine answered the operator's GET <url>/health).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    probe: ProbeStatus | None = Field(None, description="The probe and its result.")
    pools: list[PoolStatus] = Field(
        default_factory=list,
        description="Per-pool decisions and Deployments, keyed by pool name.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    replicas: int = Field(0, description="Current pods over all pools (scale subresource).")
    ready_replicas: int = Field(0, description="Ready pods over all pools.")
    selector: str | None = Field(None, description="Label selector of the runtime pods (scale subresource).")
    path_summary: str | None = Field(None, description="Paths per pool, for kubectl get.")
    worker_summary: str | None = Field(None, description="Processor workers per pool, for kubectl get.")
    ready_summary: str | None = Field(None, description="ready/desired pods, for kubectl get.")
    calibration_summary: str | None = Field(
        None, description="Calibration state per pool (measured, pending, failed, ...), for kubectl get -o wide."
    )
    autoscaling_summary: str | None = Field(
        None, description="Per pool: engine current->desired/max (e.g. H200=HPA:2->4/8), for kubectl get -o wide."
    )

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)


class MultimodalPreprocessor(ApiModel):
    """The root object, for schema generation (metadata is the API server's)."""

    spec: MultimodalPreprocessorSpec
    status: MultimodalPreprocessorStatus | None = None

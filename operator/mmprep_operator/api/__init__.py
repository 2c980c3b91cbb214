"""The MultimodalPreprocessor API: spec and status as pydantic models.

These models are the single source of the API. ``crd.py`` turns them into the CRD's OpenAPI
schema (descriptions, defaults, bounds, CEL rules), the reconciler parses resources with them, and
``render`` validates a resource file with them when no API server is there to do it. So every rule
the API server enforces with CEL is mirrored by a validator here, with the same message.

Field names are snake_case in Python and camelCase on the wire (aliases).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from mmprep_runtime.contract import ProbeAnswer
from mmprep_runtime.sizing import MAX_WORKERS, MIN_WORKERS, Backend, Device

GROUP: Final = "mmprep.dev"
VERSION: Final = "v1alpha1"
KIND: Final = "MultimodalPreprocessor"
PLURAL: Final = "multimodalpreprocessors"
SINGULAR: Final = "multimodalpreprocessor"
SHORT_NAMES: Final = ("mmp",)
CATEGORIES: Final = ("mmprep",)
API_VERSION: Final = f"{GROUP}/{VERSION}"

#: Resource names that give a pod a GPU. ``nvidia.com/mig-<profile>`` is how GFD's "mixed" MIG
#: strategy exposes slices; the others are the vendors' whole-device resources.
GPU_RESOURCE_SUFFIX: Final = "/gpu"
MIG_RESOURCE_PREFIX: Final = "nvidia.com/mig-"


def is_gpu_resource(name: str) -> bool:
    return name.endswith(GPU_RESOURCE_SUFFIX) or name.startswith(MIG_RESOURCE_PREFIX)


# CEL twin of is_gpu_resource, over the keys of a resources map.
_CEL_HAS_GPU = "{m}.exists(k, k.endsWith('/gpu') || k.startsWith('nvidia.com/mig-'))"

WorkerCount = Annotated[int, Field(ge=MIN_WORKERS, le=MAX_WORKERS)]
Quantity = int | str  # rendered as x-kubernetes-int-or-string
LabelMap = Annotated[dict[str, str], Field(max_length=64)]
# Free-form Kubernetes objects (tolerations, affinity) are passed through as they are.
FreeForm = dict[str, Any]


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        # The API server prunes unknown fields; here, ignoring them keeps older operators working
        # against resources written for newer schemas.
        extra="ignore",
        use_enum_values=False,
    )

    def wire(self) -> dict[str, Any]:
        """The object as it appears in the Kubernetes API (camelCase, no nulls)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# --------------------------------------------------------------------------------------- spec


class ModelSource(_Model):
    """Which Hugging Face processor to serve: a folder inside the image or a mounted volume, or a
    model id downloaded into a cache volume. Exactly one of path and id."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "has(self.path) != has(self.id)", "message": "set exactly one of model.path and model.id"},
                {"rule": "!has(self.cacheVolume) || has(self.id)", "message": "model.cacheVolume needs model.id"},
            ]
        }
    )

    path: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        description="Path of a processor folder inside the image or a mounted volume (see volumeMounts).",
    )
    id: str | None = Field(
        None, min_length=1, max_length=512, description="Hugging Face model id, e.g. Qwen/Qwen2-VL-2B-Instruct."
    )
    revision: str | None = Field(None, min_length=1, max_length=256, description="Model revision (branch, tag or commit).")
    trust_remote_code: bool = Field(
        False, description="Allow the processor's own Python code to run. Off unless you trust the model's repository."
    )
    cache_volume: str | None = Field(
        None,
        min_length=1,
        max_length=63,
        description="Name of a volume in spec.volumes to hold the Hugging Face cache (HF_HOME) for model.id.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelSource:
        if (self.path is None) == (self.id is None):
            raise ValueError("set exactly one of model.path and model.id")
        if self.cache_volume is not None and self.id is None:
            raise ValueError("model.cacheVolume needs model.id")
        return self


class WorkerOverride(_Model):
    """A processor worker count for one GPU product or family, optionally only on one path."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.gpuProduct) != has(self.gpuFamily)",
                    "message": "an override names exactly one of gpuProduct and gpuFamily",
                }
            ]
        }
    )

    gpu_product: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        description=(
            "GPU product: the nvidia.com/gpu.product label value (e.g. NVIDIA-H200-141GB-HBM3e), the same "
            "without its -MIG-/-SHARED suffix, or the short model name (e.g. H200, GB300). Case-insensitive."
        ),
    )
    gpu_family: str | None = Field(
        None, min_length=1, max_length=64, description="GPU family (nvidia.com/gpu.family), e.g. hopper, blackwell."
    )
    path: Literal["cpu", "gpu"] | None = Field(None, description="Apply only on this preprocessing path.")
    processor: WorkerCount = Field(description="Processor workers for pools that match.")

    @model_validator(mode="after")
    def _one_target(self) -> WorkerOverride:
        if (self.gpu_product is None) == (self.gpu_family is None):
            raise ValueError("an override names exactly one of gpuProduct and gpuFamily")
        return self


class Workers(_Model):
    """Worker counts. Unset counts are decided per pool (see the README's decision table)."""

    processor: WorkerCount | None = Field(
        None, description="Processor worker threads, each with its own processor copy. Wins over every rule but cloneability."
    )
    io: WorkerCount | None = Field(None, description="IO (fetch/decode) worker threads; default 4.")
    overrides: list[WorkerOverride] = Field(
        default_factory=list, max_length=32, description="Per-GPU-product or per-family processor worker counts."
    )
    calibrate: bool | None = Field(
        None,
        description=(
            "Measure each pool's processor worker count on one of its nodes (a calibration Job running "
            "`mmprep-runtime bench` at 1..N workers) and use the measured count. Default from the operator "
            "policy (calibration.mode: off or auto). Explicit counts and overrides still win."
        ),
    )
    calibration_samples: str | None = Field(
        None,
        min_length=2,
        max_length=4096,
        pattern=r"^/",
        description=(
            "Absolute path of a folder of sample images (jpg, png, webp) in a volume of spec.volumeMounts: "
            "calibration measures with them instead of synthetic images."
        ),
    )


class ProbeSpec(_Model):
    """The cloneability probe, a Job that loads the processor once in the runtime image."""

    timeout_seconds: int | None = Field(
        None,
        ge=10,
        le=86400,
        description="Deadline of the probe Job (activeDeadlineSeconds); default from the operator policy (300).",
    )
    node_selector: LabelMap | None = Field(None, description="Where the probe pod runs; default spec.nodeSelector.")
    tolerations: list[FreeForm] | None = Field(
        None, max_length=64, description="Probe pod tolerations; default spec.tolerations."
    )


class Resources(_Model):
    """Container resources; a GPU resource (e.g. nvidia.com/gpu) in limits gives each pod a GPU."""

    requests: Annotated[dict[str, Quantity], Field(max_length=32)] = Field(default_factory=dict, description="Resource requests.")
    limits: Annotated[dict[str, Quantity], Field(max_length=32)] = Field(default_factory=dict, description="Resource limits.")

    def gpu_resources(self) -> list[str]:
        return sorted({k for k in (*self.requests, *self.limits) if is_gpu_resource(k)})


class NamedObject(_Model):
    """A Kubernetes object passed through as it is (a Volume, VolumeMount or EnvVar); only its name is checked."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})

    name: str = Field(min_length=1, max_length=253, description="Name.")

    def wire(self) -> dict[str, Any]:
        # Extra fields arrive with their wire names already; dump them as they are.
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# ------------------------------------------------------------- availability (per pool)

#: A PodDisruptionBudget bound: a pod count or a percentage of the pool's pods.
_PDB_BOUND = r"^([0-9]+|[0-9]{1,3}%)$"
DisruptionBound = Quantity  # rendered as x-kubernetes-int-or-string


class Disruption(_Model):
    """The PodDisruptionBudget each pool gets. Set at most one of maxUnavailable and minAvailable;
    with neither, maxUnavailable is 1, so a node drain evicts a pool's pods one at a time."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!(has(self.maxUnavailable) && has(self.minAvailable))",
                    "message": "set at most one of disruption.maxUnavailable and disruption.minAvailable",
                }
            ]
        }
    )

    enabled: bool = Field(True, description="Render a PodDisruptionBudget per pool.")
    max_unavailable: DisruptionBound | None = Field(
        None, description="Pods of a pool that may be evicted at once: a count or a percentage (e.g. 25%)."
    )
    min_available: DisruptionBound | None = Field(
        None, description="Pods of a pool that must stay available during evictions: a count or a percentage."
    )

    @model_validator(mode="after")
    def _one_bound(self) -> Disruption:
        if self.max_unavailable is not None and self.min_available is not None:
            raise ValueError("set at most one of disruption.maxUnavailable and disruption.minAvailable")
        for name, bound in (("maxUnavailable", self.max_unavailable), ("minAvailable", self.min_available)):
            if isinstance(bound, int) and bound < 0:
                raise ValueError(f"disruption.{name} must be >= 0")
            if isinstance(bound, str) and not re.fullmatch(_PDB_BOUND, bound):
                raise ValueError(f"disruption.{name} must be a count or a percentage like 25%")
        return self

    def budget(self) -> dict[str, int | str]:
        """The PodDisruptionBudget spec's bound."""
        if self.min_available is not None:
            return {"minAvailable": self.min_available}
        return {"maxUnavailable": self.max_unavailable if self.max_unavailable is not None else 1}


#: An image platform as registries name it: os/arch[/variant], e.g. linux/arm64/v8.
Platform = Annotated[str, Field(pattern=r"^[a-z0-9]+/[a-z0-9_]+(/[a-z0-9]+)?$", max_length=64)]


class TopologySpread(_Model):
    """How a pool's pods spread over its nodes (a topologySpreadConstraint per pool)."""

    enabled: bool = Field(True, description="Spread each pool's pods over its nodes.")
    topology_key: str = Field(
        "kubernetes.io/hostname",
        min_length=1,
        max_length=316,
        description="Node label that names a domain (default: one per node).",
    )
    max_skew: int = Field(1, ge=1, le=1000, description="Largest allowed difference in pod count between two domains.")
    when_unsatisfiable: Literal["ScheduleAnyway", "DoNotSchedule"] = Field(
        "ScheduleAnyway",
        description="ScheduleAnyway (a preference: never leaves a pod Pending) or DoNotSchedule (a hard rule).",
    )


#: The HTTP APIs a runtime pod can serve (``spec.api``).
ServedApi = Literal["mmprep", "vllm-render"]


class MultimodalPreprocessorSpec(_Model):
    """A preprocessing service for one Hugging Face processor, sized per GPU node pool."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    # has() guards: defaults fill these in, but a rule must not depend on that.
                    "rule": "!(has(self.device) && self.device == 'cuda') || (has(self.resources) && ("
                    + "(has(self.resources.limits) && "
                    + _CEL_HAS_GPU.format(m="self.resources.limits")
                    + ") || "
                    + "(has(self.resources.requests) && "
                    + _CEL_HAS_GPU.format(m="self.resources.requests")
                    + ")))",
                    "message": "device: cuda needs a GPU resource (e.g. nvidia.com/gpu) in resources.limits",
                },
                {
                    "rule": "!has(self.model.cacheVolume) || "
                    "(has(self.volumes) && self.volumes.exists(v, v.name == self.model.cacheVolume))",
                    "message": "model.cacheVolume must name a volume in spec.volumes",
                },
            ]
        }
    )

    model: ModelSource = Field(description="The processor to serve.")
    api: ServedApi = Field(
        "mmprep",
        description="What the runtime pods serve: mmprep (POST /v1/preprocess on port 8080) or vllm-render "
        "(vLLM's GPU-less render API on port 8000: POST /v1/chat/completions/render answering the "
        "GenerateRequest that vLLM's generate server takes). The Service port and the probes follow.",
    )
    normalized_pixels: bool = Field(
        False,
        description="vllm-render: normalized pixel values in the model's dtype instead of uint8 left to the "
        "GPU to normalize (vLLM's --no-mm-device-do-normalize; set it to match a generate server started so).",
    )
    backend: Backend = Field(Backend.AUTO, description="Image processor backend: auto, pil (CPU only) or torchvision (fast).")
    device: Device = Field(
        Device.AUTO, description="Where preprocessing runs: auto (GPU path when possible), cpu, or cuda (needs a GPU resource)."
    )
    workers: Workers = Field(default_factory=Workers, description="Worker counts and per-GPU overrides.")
    replicas: int = Field(1, ge=0, le=1000, description="Total runtime pods, spread over the pools (see README).")
    image: str | None = Field(None, min_length=1, max_length=1024, description="Runtime image; default from the operator policy.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(None, description="Image pull policy.")
    resources: Resources = Field(default_factory=Resources, description="Runtime container resources.")
    node_selector: LabelMap = Field(default_factory=dict, description="Nodes the runtime may run on (labels).")
    tolerations: list[FreeForm] = Field(default_factory=list, max_length=64, description="Pod tolerations.")
    affinity: FreeForm | None = Field(None, description="Pod affinity; required node affinity also limits eligible nodes.")
    runtime_class_name: str | None = Field(
        None,
        min_length=1,
        max_length=253,
        description="RuntimeClass of the runtime pods (e.g. nvidia), which many GPU clusters require.",
    )
    priority_class_name: str | None = Field(None, min_length=1, max_length=253, description="PriorityClass of the runtime pods.")
    topology_spread: TopologySpread = Field(
        default_factory=TopologySpread, description="Spread of each pool's pods over the pool's nodes."
    )
    disruption: Disruption = Field(default_factory=Disruption, description="The PodDisruptionBudget of each pool.")
    image_platforms: list[Platform] | None = Field(
        None,
        max_length=16,
        description=(
            "Platforms the runtime image is built for (os/arch, e.g. linux/amd64, linux/arm64); default from the "
            "operator policy's imagePlatforms. A pool whose nodes' architecture is not listed gets no pods. Unset in "
            "both: not checked."
        ),
    )
    volumes: list[NamedObject] = Field(default_factory=list, max_length=64, description="Pod volumes (e.g. a model folder).")
    volume_mounts: list[NamedObject] = Field(default_factory=list, max_length=64, description="Runtime container volume mounts.")
    env: list[NamedObject] = Field(default_factory=list, max_length=64, description="Extra runtime environment variables.")
    service_account_name: str | None = Field(None, min_length=1, max_length=253, description="Pod service account.")
    probe: ProbeSpec = Field(default_factory=ProbeSpec, description="The cloneability probe Job.")

    @model_validator(mode="after")
    def _cross_field_rules(self) -> MultimodalPreprocessorSpec:
        if self.device is Device.CUDA and not self.resources.gpu_resources():
            raise ValueError("device: cuda needs a GPU resource (e.g. nvidia.com/gpu) in resources.limits")
        if self.model.cache_volume is not None and self.model.cache_volume not in {v.name for v in self.volumes}:
            raise ValueError("model.cacheVolume must name a volume in spec.volumes")
        return self

    def requests_gpu(self) -> bool:
        """Whether each pod is given a GPU (the resource request is what gives it one)."""
        return bool(self.resources.gpu_resources())


# ------------------------------------------------------------------------------------- status


class Condition(_Model):
    """A Kubernetes-style condition."""

    type: str = Field(description="Condition type: Ready, Probed, Cloneable or Degraded.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason.")
    message: str = Field("", description="Human-readable explanation.")
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(None, description="The generation this condition was computed for.")


class ProbeResult(_Model, ProbeAnswer):
    """What the runtime probe answered: its answer's fields (``mmprep_runtime.contract``), under
    camelCase names as everything in the API."""


ProbeState = Literal["Pending", "Running", "Succeeded", "Failed"]


class ProbeStatus(_Model):
    """The probe for the current probe-relevant fields (image, model, volumes)."""

    hash: str = Field(description="Hash of the fields the probe depends on; a new hash means a new probe.")
    job: str = Field(description="Name of the probe Job (shared by resources with the same hash).")
    state: ProbeState = Field(description="Pending, Running, Succeeded or Failed.")
    reason: str | None = Field(None, description="Why it failed (ProbeFailed, ProbeTimedOut, ...).")
    message: str | None = Field(None, description="Details of a failure.")
    result: ProbeResult | None = Field(None, description="The probe's answer.")


CalibrationState = Literal["Pending", "Running", "Succeeded", "Failed", "Unavailable", "NotNeeded"]


class CalibrationPoint(_Model):
    """Throughput and latency measured at one processor worker count."""

    workers: int = Field(description="Processor workers.")
    req_per_s: float = Field(description="Requests per second (each decoding and processing one image).")
    p50_ms: float | None = Field(None, description="Median latency, ms.")
    p99_ms: float | None = Field(None, description="99th percentile latency, ms.")


class PoolCalibration(_Model):
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
    curve: list[CalibrationPoint] = Field(default_factory=list, description="Throughput by worker count.")
    chosen_workers: int | None = Field(None, description="The count chosen: the fewest within the tolerance of the best.")
    tolerance: float | None = Field(None, description="The tolerance the choice used.")


class PoolProblem(_Model):
    """Why a pool's pods do not run: the scheduler's verdict, a container's last termination, or an
    image that is not built for the pool's architecture."""

    reason: str = Field(description="CamelCase reason: Unschedulable, ImagePlatformMissing, or the container's reason.")
    message: str = Field(description="What the scheduler or the container said.")
    pods: int = Field(0, description="How many of the pool's pods this applies to.")


class PoolStatus(_Model):
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
    override_source: str | None = Field(None, description="Which override applied, when reason is Override.")
    explicit_not_honoured: int | None = Field(None, description="An explicit count that could not be honoured.")
    deployment: str = Field(description="Name of the pool's Deployment.")
    replicas: int = Field(description="Desired pods in the pool.")
    ready_replicas: int = Field(0, description="Ready pods in the pool.")
    calibration: PoolCalibration | None = Field(None, description="The pool's calibration, when calibration is on.")
    arch: str | None = Field(
        None, description="CPU architecture of the pool's nodes (kubernetes.io/arch) when known; arm64 pools are pinned to it."
    )
    problem: PoolProblem | None = Field(
        None, description="Why the pool's pods are not (all) running: scheduler, image or container."
    )


class MultimodalPreprocessorStatus(_Model):
    """What the operator observed and decided."""

    observed_generation: int | None = Field(None, description="The generation last reconciled.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, Probed, Cloneable and Degraded.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    probe: ProbeStatus | None = Field(None, description="The probe and its result.")
    pools: list[PoolStatus] = Field(default_factory=list, description="Per-pool decisions and Deployments.")
    replicas: int = Field(0, description="Current pods over all pools (scale subresource).")
    ready_replicas: int = Field(0, description="Ready pods over all pools.")
    selector: str | None = Field(None, description="Label selector of the runtime pods (scale subresource).")
    path_summary: str | None = Field(None, description="Paths per pool, for kubectl get.")
    worker_summary: str | None = Field(None, description="Processor workers per pool, for kubectl get.")
    ready_summary: str | None = Field(None, description="ready/desired pods, for kubectl get.")
    calibration_summary: str | None = Field(
        None, description="Calibration state per pool (measured, pending, failed, ...), for kubectl get -o wide."
    )

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)


class MultimodalPreprocessor(_Model):
    """The root object, for schema generation (metadata is the API server's)."""

    spec: MultimodalPreprocessorSpec
    status: MultimodalPreprocessorStatus | None = None


def describe_validation_error(error: ValidationError) -> str:
    """A spec's validation errors as one line, each at its path under ``spec``; at most five.

    Next to the models because the paths it prints are theirs; the reconciler's InvalidSpec
    condition and ``mmprep-operator render`` both say it, so they say it alike.
    """
    parts = []
    for e in error.errors()[:5]:
        where = ".".join(str(p) for p in e["loc"]) or "spec"
        parts.append(f"spec.{where}: {e['msg']}" if where != "spec" else e["msg"])
    return "; ".join(parts)

"""The resource's spec: which processor to serve, how to size and place it, and what the pods get.

Field names are snake_case in Python and camelCase on the wire (aliases); descriptions, defaults
and bounds become the CRD's schema (``crd``). Each cross-field rule is a ``CelRule``, checked by
the API server and by the model's validator with the same message.
"""

from __future__ import annotations

import re
from typing import Annotated, Final, Literal

from pydantic import Field, model_validator

from mmprep_operator.api import corev1, security
from mmprep_operator.api.autoscaling import CPU_SIGNAL_NEEDS_CPU_REQUEST, Autoscaling
from mmprep_operator.api.base import (
    CEL_HAS_GPU,
    ApiModel,
    CelRule,
    IntOrString,
    LabelMap,
    WorkerCount,
    cel_rules,
    field_cel_rules,
    is_gpu_resource,
)
from mmprep_operator.api.drain import Drain
from mmprep_operator.api.engine import Engine
from mmprep_operator.api.serving import ServingSpec
from mmprep_runtime.sizing import Backend, Device

_ONE_SOURCE: Final = CelRule("has(self.path) != has(self.id)", "set exactly one of model.path and model.id")
_CACHE_NEEDS_ID: Final = CelRule("!has(self.cacheVolume) || has(self.id)", "model.cacheVolume needs model.id")
_ONE_TARGET: Final = CelRule(
    "has(self.gpuProduct) != has(self.gpuFamily)", "an override names exactly one of gpuProduct and gpuFamily"
)
_ONE_BOUND: Final = CelRule(
    "!(has(self.maxUnavailable) && has(self.minAvailable))",
    "set at most one of disruption.maxUnavailable and disruption.minAvailable",
)
_CUDA_NEEDS_GPU: Final = CelRule(
    # has() guards: defaults fill these in, but a rule must not depend on that.
    "!(has(self.device) && self.device == 'cuda') || (has(self.resources) && ("
    + "(has(self.resources.limits) && "
    + CEL_HAS_GPU.format(m="self.resources.limits")
    + ") || "
    + "(has(self.resources.requests) && "
    + CEL_HAS_GPU.format(m="self.resources.requests")
    + ")))",
    "device: cuda needs a GPU resource (e.g. nvidia.com/gpu) in resources.limits",
)
_CACHE_VOLUME_EXISTS: Final = CelRule(
    "!has(self.model.cacheVolume) || (has(self.volumes) && self.volumes.exists(v, v.name == self.model.cacheVolume))",
    "model.cacheVolume must name a volume in spec.volumes",
)
#: Label keys the operator's selectors and identity rest on (``logic.identity``): a pod label may
#: not replace them, or the Deployment would lose its own pods. Rejected rather than ignored, so
#: that what is written is what the pods get.
RESERVED_LABEL_PREFIX: Final = "mmprep.dev/"
RESERVED_LABELS: Final = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by",
)
_POD_LABELS_OWN: Final = CelRule(
    "self.all(k, !k.startsWith('mmprep.dev/') && !(k in [" + ", ".join(f"'{k}'" for k in RESERVED_LABELS) + "]))",
    "podLabels may not set the operator's own labels (mmprep.dev/*, app.kubernetes.io/name, instance, component, managed-by)",
)
_POD_ANNOTATIONS_OWN: Final = CelRule(
    "self.all(k, !k.startsWith('mmprep.dev/'))", "podAnnotations may not set the operator's own mmprep.dev/* annotations"
)


def _reserved_label(key: str) -> bool:
    return key.startswith(RESERVED_LABEL_PREFIX) or key in RESERVED_LABELS


class ModelSource(ApiModel):
    """Which Hugging Face processor to serve: a folder inside the image or a mounted volume, or a
    model id downloaded into a cache volume. Exactly one of path and id."""

    model_config = cel_rules(_ONE_SOURCE, _CACHE_NEEDS_ID)

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
            raise ValueError(_ONE_SOURCE.message)
        if self.cache_volume is not None and self.id is None:
            raise ValueError(_CACHE_NEEDS_ID.message)
        return self


class WorkerOverride(ApiModel):
    """A processor worker count for one GPU product or family, optionally only on one path."""

    model_config = cel_rules(_ONE_TARGET)

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
            raise ValueError(_ONE_TARGET.message)
        return self


class Workers(ApiModel):
    """Worker counts. Unset counts are decided per pool (the decision table in docs/operator.md)."""

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


class ProbeSpec(ApiModel):
    """The cloneability probe, a Job that loads the processor once in the runtime image."""

    timeout_seconds: int | None = Field(
        None,
        ge=10,
        le=86400,
        description="Deadline of the probe Job (activeDeadlineSeconds); default from the operator policy (300).",
    )
    node_selector: LabelMap | None = Field(None, description="Where the probe pod runs; default spec.nodeSelector.")
    tolerations: corev1.Tolerations | None = Field(None, description="Probe pod tolerations; default spec.tolerations.")


class Resources(ApiModel):
    """Container resources; a GPU resource (e.g. nvidia.com/gpu) in limits gives each pod a GPU."""

    requests: Annotated[dict[str, corev1.Quantity], Field(max_length=32)] = Field(
        default_factory=dict, description="Resource requests (quantities: 2, 500m, 4Gi)."
    )
    limits: Annotated[dict[str, corev1.Quantity], Field(max_length=32)] = Field(
        default_factory=dict, description="Resource limits (quantities: 2, 500m, 4Gi)."
    )

    def gpu_resources(self) -> list[str]:
        return sorted({k for k in (*self.requests, *self.limits) if is_gpu_resource(k)})


# ------------------------------------------------------------- availability (per pool)

#: A PodDisruptionBudget bound: a pod count or a percentage of the pool's pods.
_PDB_BOUND = r"^([0-9]+|[0-9]{1,3}%)$"
DisruptionBound = IntOrString


class Disruption(ApiModel):
    """The PodDisruptionBudget each pool gets. Set at most one of maxUnavailable and minAvailable;
    with neither, maxUnavailable is 1, so a node drain evicts a pool's pods one at a time."""

    model_config = cel_rules(_ONE_BOUND)

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
            raise ValueError(_ONE_BOUND.message)
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


class TopologySpread(ApiModel):
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


class MultimodalPreprocessorSpec(ApiModel):
    """A preprocessing service for one Hugging Face processor, sized per GPU node pool."""

    model_config = cel_rules(_CUDA_NEEDS_GPU, _CACHE_VOLUME_EXISTS, CPU_SIGNAL_NEEDS_CPU_REQUEST)

    model: ModelSource = Field(description="The processor to serve.")
    api: ServedApi = Field(
        "mmprep",
        description="What the runtime pods serve: mmprep (POST /v1/preprocess on port 8080) or vllm-render "
        "(vLLM's GPU-less render API on port 8000: POST /v1/chat/completions/render answering the "
        "GenerateRequest that vLLM's generate server takes). The Service port and the probes follow.",
    )
    engine: Engine | None = Field(
        None,
        description="The vLLM engine behind an OpenAI front: with it the pods also answer OpenAI's "
        "/v1/chat/completions and /v1/completions, rendering each request, sending the render to the engine's "
        "POST /inference/v1/generate and derendering its answer (vLLM's code: the runtime image with vLLM, the "
        "operator policy's vllmRenderImage, or spec.image). Several engine replicas go behind one Service, which "
        "balances them. The operator checks GET <url>/health (condition EngineReachable).",
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
    replicas: int = Field(
        1, ge=0, le=1000, description="Total runtime pods, spread over the pools by eligible node count (docs/operator.md)."
    )
    autoscaling: Autoscaling | None = Field(
        None,
        description="Scale each pool between bounds with the cluster's autoscaler, not fixed replicas (docs/autoscaling.md).",
    )
    image: str | None = Field(None, min_length=1, max_length=1024, description="Runtime image; default from the operator policy.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(None, description="Image pull policy.")
    resources: Resources = Field(default_factory=Resources, description="Runtime container resources.")
    node_selector: LabelMap = Field(default_factory=dict, description="Nodes the runtime may run on (labels).")
    tolerations: corev1.Tolerations = Field(default_factory=list, description="Pod tolerations (core/v1 Toleration).")
    affinity: corev1.Affinity | None = Field(
        None, description="Pod affinity (core/v1 Affinity); required node affinity also limits eligible nodes."
    )
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
    volumes: corev1.Volumes = Field(
        default_factory=list, description="Pod volumes (core/v1 Volume, keyed by name), e.g. a model folder."
    )
    volume_mounts: corev1.VolumeMounts = Field(
        default_factory=list, description="Runtime container volume mounts (core/v1 VolumeMount, keyed by mountPath)."
    )
    env: corev1.Env = Field(
        default_factory=list, description="Extra runtime environment variables (core/v1 EnvVar, keyed by name)."
    )
    env_from: corev1.EnvFrom = Field(
        default_factory=list, description="ConfigMaps and Secrets whose keys become runtime environment variables."
    )
    image_pull_secrets: corev1.ImagePullSecrets = Field(
        default_factory=list, description="Secrets (in the resource's namespace) to pull the runtime image with."
    )
    pod_labels: LabelMap = Field(
        default_factory=dict,
        description="Labels for the runtime, probe and calibration pods, beside the operator's own (which they may not set).",
        json_schema_extra=field_cel_rules(_POD_LABELS_OWN),
    )
    pod_annotations: Annotated[dict[str, str], Field(max_length=64)] = Field(
        default_factory=dict,
        description="Annotations for the runtime, probe and calibration pods (not mmprep.dev/*).",
        json_schema_extra=field_cel_rules(_POD_ANNOTATIONS_OWN),
    )
    pod_security_context: corev1.PodSecurityContext | None = Field(
        None,
        description="Pod security context additions (docs/configuration.md). Setting it, even to {}, leaves "
        "runAsUser, runAsGroup and fsGroup to it (or to a platform that assigns them, e.g. OpenShift) instead "
        "of the operator's 65532; runAsNonRoot and the RuntimeDefault seccomp profile stay.",
        json_schema_extra=field_cel_rules(*(r.cel for r in security.POD_RULES)),
    )
    security_context: corev1.SecurityContext | None = Field(
        None,
        description="Runtime container security context additions; no privilege escalation, all capabilities "
        "dropped, a read-only root and non-root stay.",
        json_schema_extra=field_cel_rules(*(r.cel for r in security.CONTAINER_RULES)),
    )
    serving: ServingSpec = Field(default_factory=ServingSpec, description="The runtime's request limits and names.")
    service_account_name: str | None = Field(None, min_length=1, max_length=253, description="Pod service account.")
    probe: ProbeSpec = Field(default_factory=ProbeSpec, description="The cloneability probe Job.")
    drain: Drain = Field(
        default_factory=Drain,
        description="How runtime pods stop on scale-down and rollouts: not ready but still serving for a window, "
        "then their requests in flight finished.",
    )

    @model_validator(mode="after")
    def _crossfield_cel_rules(self) -> MultimodalPreprocessorSpec:
        if self.device is Device.CUDA and not self.resources.gpu_resources():
            raise ValueError(_CUDA_NEEDS_GPU.message)
        if self.model.cache_volume is not None and self.model.cache_volume not in {v.get("name") for v in self.volumes}:
            raise ValueError(_CACHE_VOLUME_EXISTS.message)
        if self.autoscaling is not None and self.autoscaling.signal == "cpu" and not self.requests_cpu():
            raise ValueError(CPU_SIGNAL_NEEDS_CPU_REQUEST.message)
        if any(_reserved_label(k) for k in self.pod_labels):
            raise ValueError(_POD_LABELS_OWN.message)
        if any(k.startswith(RESERVED_LABEL_PREFIX) for k in self.pod_annotations):
            raise ValueError(_POD_ANNOTATIONS_OWN.message)
        broken = security.broken(security.POD_RULES, self.pod_security_context)
        broken += security.broken(security.CONTAINER_RULES, self.security_context)
        if broken:
            raise ValueError("; ".join(broken))
        return self

    def requests_cpu(self) -> bool:
        """Whether the runtime container has a CPU request (a CPU limit alone becomes one)."""
        return "cpu" in self.resources.requests or "cpu" in self.resources.limits

    def requests_gpu(self) -> bool:
        """Whether each pod is given a GPU (the resource request is what gives it one)."""
        return bool(self.resources.gpu_resources())

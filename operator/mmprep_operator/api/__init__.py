"""The MultimodalPreprocessor API: spec and status as pydantic models.

These models are the single source of the API. ``crd`` turns them into the CRD's OpenAPI
schema (descriptions, defaults, bounds, CEL rules), the reconciler parses resources with them, and
``render`` validates a resource file with them when no API server is there to do it. So every rule
the API server enforces with CEL is mirrored by a validator here, with the same message.

Field names are snake_case in Python and camelCase on the wire (aliases).
"""

# The resource's types are read as ``api.X`` everywhere (``api.MultimodalPreprocessorSpec``,
# ``api.KIND``), as kubebuilder's ``api/v1alpha1`` package is: one name for the API whichever of
# its modules (``base``, ``spec``, ``autoscaling``, ``drain``, ``engine``, ``status``) defines a type. So they are re-exported
# here, and only here; ``crd``, ``rbac`` and ``policy`` are imported as modules of their own.
from mmprep_operator.api.autoscaling import (
    Autoscaling,
    PoolAutoscaling,
    PoolAutoscalingStatus,
    Prometheus,
    ScalingBehavior,
    ScalingRate,
)
from mmprep_operator.api.base import (
    API_VERSION,
    CATEGORIES,
    GPU_RESOURCE_SUFFIX,
    GROUP,
    KIND,
    MIG_RESOURCE_PREFIX,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    IntOrString,
    LabelMap,
    WorkerCount,
    describe_validation_error,
    is_gpu_resource,
)
from mmprep_operator.api.corev1 import Quantity
from mmprep_operator.api.drain import Drain
from mmprep_operator.api.engine import Engine, EngineService
from mmprep_operator.api.serving import ServingSpec
from mmprep_operator.api.spec import (
    Disruption,
    DisruptionBound,
    ModelSource,
    MultimodalPreprocessorSpec,
    Platform,
    ProbeSpec,
    Resources,
    ServedApi,
    TopologySpread,
    WorkerOverride,
    Workers,
)
from mmprep_operator.api.status import (
    CalibrationPoint,
    CalibrationState,
    Condition,
    MultimodalPreprocessor,
    MultimodalPreprocessorStatus,
    PoolCalibration,
    PoolProblem,
    PoolStatus,
    ProbeResult,
    ProbeState,
    ProbeStatus,
)

__all__ = [
    "API_VERSION",
    "CATEGORIES",
    "GPU_RESOURCE_SUFFIX",
    "GROUP",
    "KIND",
    "MIG_RESOURCE_PREFIX",
    "PLURAL",
    "SHORT_NAMES",
    "SINGULAR",
    "VERSION",
    "Autoscaling",
    "CalibrationPoint",
    "CalibrationState",
    "Condition",
    "Disruption",
    "DisruptionBound",
    "Drain",
    "Engine",
    "EngineService",
    "IntOrString",
    "LabelMap",
    "ModelSource",
    "MultimodalPreprocessor",
    "MultimodalPreprocessorSpec",
    "MultimodalPreprocessorStatus",
    "Platform",
    "PoolAutoscaling",
    "PoolAutoscalingStatus",
    "PoolCalibration",
    "PoolProblem",
    "PoolStatus",
    "ProbeResult",
    "ProbeSpec",
    "ProbeState",
    "ProbeStatus",
    "Prometheus",
    "Quantity",
    "Resources",
    "ScalingBehavior",
    "ScalingRate",
    "ServedApi",
    "ServingSpec",
    "TopologySpread",
    "WorkerCount",
    "WorkerOverride",
    "Workers",
    "describe_validation_error",
    "is_gpu_resource",
]

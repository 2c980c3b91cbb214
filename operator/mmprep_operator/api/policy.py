"""Operator-wide policy: the runtime image, per-GPU worker overrides, probe defaults.

Read once at start from ``--policy-file`` (YAML); typos are errors, not silently ignored keys.
An admin encodes measurements here, e.g. "Blackwell, GPU path: 1 worker" or "H200, CPU path: 4".
A resource's own ``spec.workers.overrides`` win over these.
"""

from __future__ import annotations

import pathlib
from typing import Any, Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from mmprep_operator import __version__
from mmprep_operator.api import Platform, Quantity, WorkerOverride
from mmprep_runtime.sizing import MAX_WORKERS, MIN_WORKERS

DEFAULT_RUNTIME_IMAGE = f"mmprep-runtime:{__version__}"

# How one operator process runs. Stated once here: ``mmprep-operator run``'s flags default to
# these and so does ``controller.Controller``, so a controller built without the CLI (tests, an
# embedding) behaves like the command.
#: Concurrent reconciles. They wait on the API server, not the CPU: a few in parallel keep
#: node-change reactions fast when many resources share the changed nodes.
DEFAULT_WORKERS: Final = 4
#: More workers that take only node-triggered passes (mostly one status write each), so a node
#: change reaches every affected status quickly without running more applies at once.
DEFAULT_URGENT_WORKERS: Final = 8
#: A full resync is the safety net under event-driven reconciles (lost watch events, clock drift).
DEFAULT_RESYNC_SECONDS: Final = 300.0
#: How often a resource's spec.engine is checked (``GET <url>/health``), so that its
#: EngineReachable condition follows the engine: often enough that an engine going away shows
#: within a quarter of a minute, one small GET per engine and interval.
DEFAULT_ENGINE_CHECK_SECONDS: Final = 15.0
#: Prometheus /metrics port, and the liveness endpoint's (/healthz); 0 disables either.
DEFAULT_METRICS_PORT: Final = 8000
DEFAULT_LIVENESS_PORT: Final = 8081


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=None)


def _default_probe_resources() -> dict[str, dict[str, Quantity]]:
    return {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "4Gi"}}


class ProbeDefaults(_Strict):
    """Defaults for the probe Job; the resource's spec.probe wins where it says something."""

    timeout_seconds: int = Field(300, alias="timeoutSeconds", ge=10, le=86400)
    # One retry: a model that fails to load twice will not load on the third try either, and a
    # fast Failed state is what tells the user.
    backoff_limit: int = Field(1, alias="backoffLimit", ge=0, le=6)
    # The result is also kept in each resource's status, so the Job only needs to outlive reading it.
    ttl_seconds_after_finished: int = Field(3600, alias="ttlSecondsAfterFinished", ge=0)
    resources: dict[str, dict[str, Quantity]] = Field(default_factory=_default_probe_resources)


class CalibrationDefaults(_Strict):
    """Calibration Jobs: when they run and how long they measure (see ``calibration``).

    ``mode: off`` (the default) runs them only for resources that set ``spec.workers.calibrate:
    true``; ``auto`` runs them for every resource that does not set it to false. Off by default
    because a run occupies one node's CPUs for a minute or two per pool and model.
    """

    mode: Literal["off", "auto"] = "off"
    # Within 5% of the best throughput, fewer workers win: less memory, less device contention,
    # and a 5% difference is within what two runs on a shared node can differ by.
    tolerance: float = Field(0.05, ge=0, lt=1)
    # More workers than this are never measured, whatever the pod's CPU limit.
    max_workers: int = Field(8, alias="maxWorkers", ge=MIN_WORKERS, le=MAX_WORKERS)
    # Per worker count: 3 interleaved rounds of 4 s each measure 1..4 workers in about a minute.
    seconds_per_count: float = Field(12.0, alias="secondsPerCount", gt=0, le=600)
    image_sizes: list[str] = Field(
        default_factory=lambda: ["1280x960"],
        alias="imageSizes",
        min_length=1,
        max_length=8,
    )
    timeout_seconds: int = Field(900, alias="timeoutSeconds", ge=30, le=86400)
    ttl_seconds_after_finished: int = Field(3600, alias="ttlSecondsAfterFinished", ge=0)

    @field_validator("image_sizes")
    @classmethod
    def _sizes(cls, sizes: list[str]) -> list[str]:
        for size in sizes:
            width, sep, height = size.lower().partition("x")
            if not (sep and width.isdigit() and height.isdigit() and int(width) > 0 and int(height) > 0):
                raise ValueError(f"image size must be WIDTHxHEIGHT, got {size!r}")
        return sizes


class OperatorPolicy(_Strict):
    default_image: str = Field(DEFAULT_RUNTIME_IMAGE, alias="defaultImage", min_length=1)
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(None, alias="imagePullPolicy")
    # What the default image is built for (os/arch); unset: not checked. A resource with its own
    # image says so in spec.imagePlatforms.
    image_platforms: list[Platform] | None = Field(None, alias="imagePlatforms", max_length=16)
    # The runtime image built with the mmprep[vllm] extra (vLLM's own processing: every model the
    # engine's vLLM renders; vLLM's derender for spec.engine's OpenAI front), for `api: vllm-render`
    # and spec.engine resources that name no image; unset: those get defaultImage too (the native
    # path only: Qwen2-VL and Qwen2.5-VL images, text for the rest).
    vllm_render_image: str | None = Field(None, alias="vllmRenderImage", min_length=1)
    overrides: list[WorkerOverride] = Field(default_factory=list)
    probe: ProbeDefaults = Field(default_factory=ProbeDefaults)
    calibration: CalibrationDefaults = Field(default_factory=CalibrationDefaults)
    resync_seconds: float = Field(DEFAULT_RESYNC_SECONDS, alias="resyncSeconds", gt=0)
    engine_check_seconds: float = Field(DEFAULT_ENGINE_CHECK_SECONDS, alias="engineCheckSeconds", ge=1, le=3600)


class PolicyError(ValueError):
    """The policy file cannot be used; the message says where and why."""


def load_policy(path: str | pathlib.Path | None) -> OperatorPolicy:
    if path is None:
        return OperatorPolicy()
    file = pathlib.Path(path)
    try:
        raw: Any = yaml.safe_load(file.read_text()) or {}
    except OSError as e:
        raise PolicyError(f"cannot read policy file {file}: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise PolicyError(f"policy file {file} is not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise PolicyError(f"policy file {file} must be a mapping, got {type(raw).__name__}")
    try:
        return OperatorPolicy.model_validate(raw)
    except ValidationError as e:
        raise PolicyError(f"policy file {file} is invalid:\n{e}") from e

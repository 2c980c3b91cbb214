"""The contract between the operator and the runtime: what one half writes and the other reads.

Two things cross the boundary, and each is defined here once, imported by both halves:

- the pod's environment, in which the operator hands each runtime pod its pool's decision
  (``PoolDecisionEnv``) and settings (the ``ENV_*`` names);
- the probe's answer (``ProbeAnswer``), which the runtime writes as JSON into a Job's termination
  message and the operator reads back and keeps in the resource's status.

Import-light on purpose: the operator image carries neither torch nor transformers, so this module
needs only the standard library, pydantic and the decision's vocabulary (``sizing``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any, Final, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mmprep_runtime.exits import TERMINATION_MESSAGE_MAX_BYTES
from mmprep_runtime.sizing import ComputePath, WorkerCountError, WorkerReason, parse_worker_count

# ------------------------------------------------------------------------------------ environment

#: The processor worker count the operator decided for the pod's pool (or a person set).
ENV_PROCESSOR_WORKERS: Final = "MMPREP_PROCESSOR_WORKERS"
ENV_IO_WORKERS: Final = "MMPREP_IO_WORKERS"
#: ``cpu`` or ``cuda``: where the operator placed the pool's preprocessing.
ENV_DEVICE: Final = "MMPREP_DEVICE"
#: The pool the pod belongs to and the rule that decided its worker count (a ``WorkerReason`` value).
#: Reported back by ``/v1/info`` and the metrics, so a pod says the same as the resource's status.
ENV_POOL: Final = "MMPREP_POOL"
ENV_DECISION_REASON: Final = "MMPREP_DECISION_REASON"
ENV_FAST_PATHS: Final = "MMPREP_FAST_PATHS"
ENV_NORMALIZED_PIXELS: Final = "MMPREP_NORMALIZED_PIXELS"
ENV_FETCH_ALLOWED_NETWORKS: Final = "MMPREP_FETCH_ALLOWED_NETWORKS"
#: The vLLM render API's path (``auto``, ``native``, ``general``), the general path's process
#: count, and more options for vLLM's own render processes (one string, split like a shell).
ENV_RENDER_PATH: Final = "MMPREP_RENDER_PATH"
ENV_RENDER_PROCESSES: Final = "MMPREP_RENDER_PROCESSES"
ENV_VLLM_ARGS: Final = "MMPREP_VLLM_ARGS"
#: The vLLM engines the OpenAI front sends generate requests to (``serve --engine URL``, each given
#: once; the variable holds them separated by spaces): base URLs such as ``http://engine:8000``.
ENV_ENGINE_URLS: Final = "MMPREP_ENGINE_URLS"
#: vLLM's own name for the API key (a pod takes it from a Secret through ``spec.env``).
ENV_API_KEY: Final = "VLLM_API_KEY"
#: The drain on SIGTERM (``DrainEnv``): seconds of serving while not ready, then the most seconds
#: in-flight requests may take.
ENV_DRAIN_SECONDS: Final = "MMPREP_DRAIN_SECONDS"
#: The signal that begins the runtime's drain ahead of SIGTERM (the preStop hook sends it).
DRAIN_SIGNAL: Final = "USR1"
ENV_SHUTDOWN_TIMEOUT_SECONDS: Final = "MMPREP_SHUTDOWN_TIMEOUT_SECONDS"
#: Seconds the runtime may take to exit once its in-flight requests are done or timed out (its
#: server's and pools' own stop is bounded well below this). The operator keeps them out of the
#: drain budget: drain + shutdown timeout + this fits in the pod's terminationGracePeriodSeconds.
SHUTDOWN_STOP_SECONDS: Final = 5


class ContractError(ValueError):
    """What the other half wrote does not follow the contract; the message names the field."""


@dataclasses.dataclass(frozen=True)
class PoolDecisionEnv:
    """One pool's decision as it travels in the runtime pod's environment."""

    pool: str
    path: ComputePath
    processor_workers: int
    io_workers: int
    reason: WorkerReason

    def to_env(self) -> list[dict[str, str]]:
        """The container env entries, in a fixed order (a reordering would roll the pods)."""
        return [
            {"name": ENV_PROCESSOR_WORKERS, "value": str(self.processor_workers)},
            {"name": ENV_IO_WORKERS, "value": str(self.io_workers)},
            {"name": ENV_DEVICE, "value": "cuda" if self.path is ComputePath.GPU else "cpu"},
            {"name": ENV_POOL, "value": self.pool},
            {"name": ENV_DECISION_REASON, "value": self.reason.value},
        ]

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> PoolDecisionEnv | None:
        """The operator's decision, or None when the pod was not started by the operator (no pool
        and no reason: a person running the runtime by hand). Raises ContractError when the
        operator's variables are present but incomplete or malformed."""
        pool = environ.get(ENV_POOL, "").strip()
        reason_text = environ.get(ENV_DECISION_REASON, "").strip()
        if not pool and not reason_text:
            return None
        missing = [
            name
            for name in (ENV_POOL, ENV_DECISION_REASON, ENV_PROCESSOR_WORKERS, ENV_IO_WORKERS, ENV_DEVICE)
            if not environ.get(name, "").strip()
        ]
        if missing:
            raise ContractError(f"the operator's decision is incomplete: {', '.join(missing)} not set")
        try:
            reason = WorkerReason(reason_text)
        except ValueError:
            known = ", ".join(r.value for r in WorkerReason)
            raise ContractError(f"{ENV_DECISION_REASON} must be one of {known}; got {reason_text!r}") from None
        device = environ[ENV_DEVICE].strip().lower()
        if device not in ("cpu", "cuda"):
            raise ContractError(f"{ENV_DEVICE} must be cpu or cuda in the operator's decision; got {device!r}")
        try:
            processor_workers = parse_worker_count(ENV_PROCESSOR_WORKERS, environ[ENV_PROCESSOR_WORKERS])
            io_workers = parse_worker_count(ENV_IO_WORKERS, environ[ENV_IO_WORKERS])
        except WorkerCountError as exc:
            raise ContractError(str(exc)) from None
        path = ComputePath.GPU if device == "cuda" else ComputePath.CPU
        return cls(pool=pool, path=path, processor_workers=processor_workers, io_workers=io_workers, reason=reason)


@dataclasses.dataclass(frozen=True)
class DrainEnv:
    """How a runtime pod drains on SIGTERM, as it travels in the pod's environment.

    ``drain_seconds``: the window in which the pod is not ready but still accepts and serves (the
    time the endpoint's removal takes to reach every proxy); ``shutdown_timeout_seconds``: then the
    most the requests still in flight may take before the process exits anyway.
    """

    drain_seconds: int
    shutdown_timeout_seconds: int

    def to_env(self) -> list[dict[str, str]]:
        return [
            {"name": ENV_DRAIN_SECONDS, "value": str(self.drain_seconds)},
            {"name": ENV_SHUTDOWN_TIMEOUT_SECONDS, "value": str(self.shutdown_timeout_seconds)},
        ]

    def pre_stop(self) -> dict[str, Any] | None:
        """The container's preStop hook: it begins the runtime's drain (``DRAIN_SIGNAL``), then
        waits out the window, after which the kubelet sends SIGTERM and the runtime closes. None
        without a window. The runtime is the container's PID 1 (the image's exec-form entrypoint).

        Why a hook that signals rather than a plain sleep: during a sleep the process would not know
        it is stopping, so it would stay ready to its own probes and keep answering keep-alive
        connections without ``Connection: close``; a client holding one would go on sending to this
        pod past the sleep. Begun by the hook, the window is spent with every answer telling the
        client to reconnect, through the Service, elsewhere. Where no hook runs (``docker stop``,
        a kubelet that skips it), SIGTERM begins the same window itself.
        """
        if not self.drain_seconds:
            return None
        script = f"kill -{DRAIN_SIGNAL} 1; sleep {self.drain_seconds}"
        return {"exec": {"command": ["/bin/sh", "-c", script]}}


def parse_seconds(name: str, text: str, *, allow_zero: bool) -> float:
    """A duration in seconds from env or a flag; raises ContractError naming ``name``."""
    try:
        value = float(text)
    except ValueError:
        raise ContractError(f"{name} must be a number of seconds; got {text!r}") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ContractError(f"{name} must be {bound} seconds; got {text!r}")
    return value


# ---------------------------------------------------------------------------------- probe answer


def json_object(message: str, what: str) -> dict[str, Any]:
    """A termination message that must hold one JSON object (the probe's and the calibration's
    answers). Raises ContractError naming ``what``."""
    try:
        data = json.loads(message)
    except json.JSONDecodeError as exc:
        raise ContractError(f"{what} is not JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise ContractError(f"{what} is not a JSON object")
    return data


PROBE_ANSWER_MAX_BYTES: Final = TERMINATION_MESSAGE_MAX_BYTES


class ProbeAnswer(BaseModel):
    """What the probe found out about a processor, in the runtime image, without serving it.

    Field names are snake_case on the wire (the termination message); the operator's status keeps
    the same fields under camelCase names (``mmprep_operator.api.ProbeResult`` derives from this).
    """

    # An operator one version behind must still read a newer runtime's answer.
    model_config = ConfigDict(extra="ignore")

    model: str | None = Field(None, description="The model the probe loaded (folder or hub id).")
    cloneable: bool = Field(description="Whether the processor survives copy.deepcopy.")
    error: str | None = Field(None, description="Why it is not cloneable, or why the model did not load.")
    processor_class: str | None = Field(None, description="Processor class.")
    tokenizer_class: str | None = Field(None, description="Tokenizer class.")
    image_processor_class: str | None = Field(None, description="Image processor class.")
    fast_image_processor: bool = Field(False, description="Whether a fast (torchvision) image processor loaded.")
    backend: str | None = Field(None, description="The image processor backend that loaded (pil, torchvision).")
    feature_extractor_class: str | None = Field(None, description="Audio feature extractor class.")
    declared_workers: int | None = Field(None, description="Worker count the model declares it measured.")
    declared_io_workers: int | None = Field(None, description="IO worker count the model declares.")
    thread_safe: bool = Field(True, description="False when the model declares its processor not thread-safe.")
    clone_seconds: float | None = Field(None, description="Time one deepcopy took.")
    path_if_gpu: ComputePath | None = Field(None, description="The path the processor takes when given a GPU.")
    versions: dict[str, str] = Field(default_factory=dict, description="Library versions in the runtime image.")
    render_path: str | None = Field(
        None,
        description="vllm-render's path for this model in this image under renderPath auto: native (mmprep's fast "
        "path) or general (vLLM's own processing in worker processes).",
    )
    render_path_reason: str | None = Field(None, description="Why that path, and whether the other stands beside it.")

    def to_message(self) -> str:
        """The answer as the termination message: compact JSON that always fits its 4 KiB."""
        data = self.model_dump(mode="json")
        text = json.dumps(data, separators=(",", ":"), sort_keys=True)
        if len(text.encode()) > PROBE_ANSWER_MAX_BYTES:  # only a pathological name or error does this
            data["model"] = None if self.model is None else self.model[:200]
            data["error"] = None if self.error is None else self.error[:500]
            text = json.dumps(data, separators=(",", ":"), sort_keys=True)
        return text

    @classmethod
    def from_message(cls, message: str) -> Self:
        """Reads a termination message. Raises ContractError saying what is wrong with it."""
        data = json_object(message, "probe output")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise ContractError(f"probe output has an unexpected {where or 'value'}: {first['msg']}") from None

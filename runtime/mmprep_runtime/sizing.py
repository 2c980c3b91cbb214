"""Sizing: where preprocessing runs (the path) and how many workers a processor gets there.

(Not "policy": in this project that word is the operator's configuration, ``OperatorPolicy``.)

This is the one implementation of the rule. The operator imports it to decide per node pool; the
runtime imports it to decide for itself when no operator set ``MMPREP_PROCESSOR_WORKERS``. It must
stay importable without torch or transformers (the operator image carries neither), so it works on
plain facts: the probe's answers and the pool's hardware, never on processor objects.

Why the rule has this shape (benchmarks/gpu/README.md keeps the figures): on the CPU path a second
worker overlaps CPU-bound preprocessing (+36% on H200, +24% on GB300), while on the GPU path a
second worker contends for the device the model runs on (GB300: 9.30 -> 4.02 req/s). So the path is
decided first, and the path caps what the model declares. Only cloneability caps an explicit
request: threads cannot share one processor object.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Final, TypeGuard


class ComputePath(str, enum.Enum):
    """Where preprocessing runs: on CPU cores, or on the CUDA device the model also runs on."""

    CPU = "cpu"
    GPU = "gpu"


class WorkerReason(str, enum.Enum):
    """Why the processor worker count is what it is; the first rule that matched."""

    NOT_CLONEABLE = "NotCloneable"
    NOT_THREAD_SAFE = "NotThreadSafe"
    EXPLICIT = "Explicit"
    OVERRIDE = "Override"
    MEASURED = "Measured"
    GPU_PATH_CAP = "GPUPathCap"
    MODEL_DECLARED = "ModelDeclared"
    CPU_PATH_DEFAULT = "CPUPathDefault"


class Device(str, enum.Enum):
    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"


class Backend(str, enum.Enum):
    AUTO = "auto"
    PIL = "pil"
    TORCHVISION = "torchvision"


CPU_PATH_DEFAULT_WORKERS: Final = 2
GPU_PATH_WORKERS: Final = 1
DEFAULT_IO_WORKERS: Final = 4
MIN_WORKERS: Final = 1
MAX_WORKERS: Final = 64


def decide_path(
    *,
    gpu_available: bool,
    device: Device | str = Device.AUTO,
    backend: Backend | str = Backend.AUTO,
    fast_image_processor: bool,
) -> ComputePath:
    """The GPU path needs every condition at once; anything missing means the CPU does the work.

    ``gpu_available`` is the caller's fact about the hardware: for the operator, "the pool has GPUs
    and the pod is given one (a GPU resource, or an explicit ``device: cuda``)"; for the runtime,
    "CUDA is usable in this process". Audio-only processors have no fast image processor, so they
    land on the CPU path here without a special case.
    """
    device = Device(device)
    backend = Backend(backend)
    if gpu_available and device is not Device.CPU and backend is not Backend.PIL and fast_image_processor:
        return ComputePath.GPU
    return ComputePath.CPU


class WorkerCountError(ValueError):
    pass


def is_worker_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and MIN_WORKERS <= value <= MAX_WORKERS


def check_worker_count(name: str, value: object) -> int:
    """The one bounds check of a worker count (processor or IO), wherever it comes from: flag,
    env, the model's declaration, a calibration report, an override. Raises WorkerCountError
    naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkerCountError(f"{name} must be an integer, got {value!r}")
    if not is_worker_count(value):
        raise WorkerCountError(f"{name} must be between {MIN_WORKERS} and {MAX_WORKERS}, got {value}")
    return value


@dataclasses.dataclass(frozen=True)
class WorkerDecision:
    """The decision as fields; ``describe`` is the one place they become a sentence."""

    path: ComputePath
    processor_workers: int
    io_workers: int
    reason: WorkerReason
    #: Why this rule gave this count, without restating path or count, e.g. "the model declares 2,
    #: capped because a second worker contends for the device"; "" when the reason says it all.
    detail: str
    #: An explicit count that could not be honoured (only cloneability does that), else None.
    explicit_not_honoured: int | None = None

    def describe(self) -> str:
        """E.g. "gpu path, 1 worker, GPUPathCap: the model declares 2, capped because ..."."""
        plural = "" if self.processor_workers == 1 else "s"
        head = f"{self.path.value} path, {self.processor_workers} worker{plural}, {self.reason.value}"
        return f"{head}: {self.detail}" if self.detail else head


def parse_worker_count(name: str, text: str) -> int:
    """A worker count written as text (env, flag). Raises WorkerCountError naming ``name``."""
    try:
        value = int(text.strip())
    except ValueError:
        raise WorkerCountError(f"{name} must be an integer, got {text!r}") from None
    return check_worker_count(name, value)


def _optional_count(name: str, value: int | None) -> int | None:
    return None if value is None else check_worker_count(name, value)


def decide_workers(
    *,
    path: ComputePath | str,
    cloneable: bool,
    explicit: int | None = None,
    override: int | None = None,
    declared: int | None = None,
    explicit_io: int | None = None,
    cloneable_error: str | None = None,
    measured: int | None = None,
    thread_safe: bool = True,
    declared_io: int | None = None,
) -> WorkerDecision:
    """First match wins: NotCloneable, NotThreadSafe, Explicit, Override, Measured, GPUPathCap,
    ModelDeclared, CPUPathDefault.

    ``thread_safe=False`` is the model's own word (its ``mmprep.json``) that copies of its
    processor must not run concurrently; like cloneability it caps even an explicit count.
    IO workers: the explicit count, else what the model declares (``declared_io``), else 4.

    ``override`` is a per-GPU-product (or family) number from the spec or the operator's policy;
    ``measured`` is what a calibration run on the pool's own hardware chose: a measurement beats
    the path rules (they are defaults derived from other machines), but not what a person asked
    for. ``declared`` is what the model's own config says it measured. ``cloneable_error`` only
    enriches the NotCloneable case's detail.
    """
    path = ComputePath(path)
    explicit = _optional_count("explicit processor workers", explicit)
    override = _optional_count("override processor workers", override)
    declared = _optional_count("declared processor workers", declared)
    measured = _optional_count("measured processor workers", measured)
    io_workers = (
        _optional_count("explicit io workers", explicit_io)
        or _optional_count("declared io workers", declared_io)
        or DEFAULT_IO_WORKERS
    )

    def made(workers: int, reason: WorkerReason, detail: str, not_honoured: int | None = None) -> WorkerDecision:
        return WorkerDecision(path, workers, io_workers, reason, detail, not_honoured)

    # Both caps hold even against an explicit count: the count asked for is kept as not honoured.
    cap: tuple[WorkerReason, str, str] | None = None
    if not cloneable:
        why = f" ({cloneable_error})" if cloneable_error else ""
        cap = (WorkerReason.NOT_CLONEABLE, f"the processor cannot be deep-copied{why}", "threads cannot share one processor")
    elif not thread_safe:
        cap = (
            WorkerReason.NOT_THREAD_SAFE,
            "the model declares its processor not thread-safe",
            "its copies must not run concurrently",
        )
    if cap is not None:
        reason, what, consequence = cap
        if explicit is not None and explicit > 1:
            return made(1, reason, f"{what}; {explicit} workers were asked for, but {consequence}", explicit)
        return made(1, reason, what)
    if explicit is not None:
        return made(explicit, WorkerReason.EXPLICIT, "asked for explicitly")
    if override is not None:
        return made(override, WorkerReason.OVERRIDE, "from a per-GPU override")
    if measured is not None:
        return made(measured, WorkerReason.MEASURED, "the count a calibration run measured best on this pool's hardware")
    if path is ComputePath.GPU:
        declared_note = (
            f"the model declares {declared}, capped because a second worker contends for the device"
            if declared is not None and declared != GPU_PATH_WORKERS
            else ""
        )
        return made(GPU_PATH_WORKERS, WorkerReason.GPU_PATH_CAP, declared_note)
    if declared is not None:
        return made(declared, WorkerReason.MODEL_DECLARED, f"the model declares {declared} worker(s)")
    return made(CPU_PATH_DEFAULT_WORKERS, WorkerReason.CPU_PATH_DEFAULT, "the CPU path's default")


#: The vLLM render API's paths, in the order of ``--render-path``'s choices: ``auto`` chooses per
#: model (``backends.choice``), ``native`` is mmprep's fast path, ``general`` vLLM's own processing.
RENDER_PATHS: Final = ("auto", "native", "general")

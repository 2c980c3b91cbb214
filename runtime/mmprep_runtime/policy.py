"""The worker-count decision: how many preprocessing workers a processor gets on some hardware.

This is the one implementation of the rule. The operator imports it to decide per node pool; the
runtime imports it to decide for itself when no operator set ``MMPREP_PROCESSOR_WORKERS``. It must
stay importable without torch or transformers (the operator image carries neither), so it works on
plain facts: the probe's answers and the pool's hardware, never on processor objects.

Why the rule has this shape (see the project README, "Why path-aware"): on the CPU path a second
worker overlaps CPU-bound preprocessing (+36% on H200, +24% on GB300), while on the GPU path a
second worker contends for the device the model runs on (GB300: 9.30 -> 4.02 req/s). So the path is
decided first, and the path caps what the model declares. Only cloneability caps an explicit
request: threads cannot share one processor object.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Final


class Path(str, enum.Enum):
    """Where preprocessing runs: on CPU cores, or on the CUDA device the model also runs on."""

    CPU = "cpu"
    GPU = "gpu"


class Reason(str, enum.Enum):
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
) -> Path:
    """The GPU path needs every condition at once; anything missing means the CPU does the work.

    ``gpu_available`` is the caller's fact about the hardware: for the operator, "the pool has GPUs
    and the pod is given one (a GPU resource, or an explicit ``device: cuda``)"; for the runtime,
    "CUDA is usable in this process". Audio-only processors have no fast image processor, so they
    land on the CPU path here without a special case.
    """
    device = Device(device)
    backend = Backend(backend)
    if (
        gpu_available
        and device is not Device.CPU
        and backend is not Backend.PIL
        and fast_image_processor
    ):
        return Path.GPU
    return Path.CPU


@dataclasses.dataclass(frozen=True)
class WorkerDecision:
    path: Path
    processor_workers: int
    io_workers: int
    reason: Reason
    message: str
    #: An explicit count that could not be honoured (only cloneability does that), else None.
    explicit_not_honoured: int | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "path": self.path.value,
            "processorWorkers": self.processor_workers,
            "ioWorkers": self.io_workers,
            "reason": self.reason.value,
            "message": self.message,
            "explicitNotHonoured": self.explicit_not_honoured,
        }


def _check_count(name: str, value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if not MIN_WORKERS <= value <= MAX_WORKERS:
        raise ValueError(f"{name} must be between {MIN_WORKERS} and {MAX_WORKERS}, got {value}")
    return value


def decide_workers(
    *,
    path: Path | str,
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
    enriches the message of the NotCloneable case.
    """
    path = Path(path)
    explicit = _check_count("explicit processor workers", explicit)
    override = _check_count("override processor workers", override)
    declared = _check_count("declared processor workers", declared)
    measured = _check_count("measured processor workers", measured)
    io_workers = (
        _check_count("explicit io workers", explicit_io)
        or _check_count("declared io workers", declared_io)
        or DEFAULT_IO_WORKERS
    )

    def made(workers: int, reason: Reason, message: str, not_honoured: int | None = None) -> WorkerDecision:
        return WorkerDecision(path, workers, io_workers, reason, message, not_honoured)

    if not cloneable:
        why = f" ({cloneable_error})" if cloneable_error else ""
        if explicit is not None and explicit > 1:
            return made(
                1,
                Reason.NOT_CLONEABLE,
                f"the processor cannot be deep-copied{why}; {explicit} workers were asked for, "
                "but threads cannot share one processor, so 1 worker serves",
                explicit,
            )
        return made(1, Reason.NOT_CLONEABLE, f"the processor cannot be deep-copied{why}; 1 worker")
    if not thread_safe:
        if explicit is not None and explicit > 1:
            return made(
                1,
                Reason.NOT_THREAD_SAFE,
                f"the model declares its processor not thread-safe; {explicit} workers were asked for, "
                "but its copies must not run concurrently, so 1 worker serves",
                explicit,
            )
        return made(1, Reason.NOT_THREAD_SAFE, "the model declares its processor not thread-safe; 1 worker")
    if explicit is not None:
        return made(explicit, Reason.EXPLICIT, f"{explicit} worker(s) asked for explicitly")
    if override is not None:
        return made(override, Reason.OVERRIDE, f"{override} worker(s) from a per-GPU override")
    if measured is not None:
        return made(measured, Reason.MEASURED, f"{path.value} path: the count a calibration run measured best on this pool's hardware")
    if path is Path.GPU:
        declared_note = (
            f"; the model declares {declared}, capped because a second worker contends for the device"
            if declared is not None and declared != GPU_PATH_WORKERS
            else ""
        )
        return made(GPU_PATH_WORKERS, Reason.GPU_PATH_CAP, f"gpu path: {GPU_PATH_WORKERS} worker{declared_note}")
    if declared is not None:
        return made(declared, Reason.MODEL_DECLARED, f"cpu path: the model declares {declared} worker(s)")
    return made(
        CPU_PATH_DEFAULT_WORKERS,
        Reason.CPU_PATH_DEFAULT,
        f"cpu path: default of {CPU_PATH_DEFAULT_WORKERS} workers",
    )

"""The pod's CUDA device: chosen, started and proven before readiness, one stream per worker.

Kubernetes' device plugin makes the pod's GPU(s) the only visible ones (``NVIDIA_VISIBLE_DEVICES``
/ ``CUDA_VISIBLE_DEVICES``), so visible index 0 *is* the pod's GPU; ``MMPREP_CUDA_DEVICE`` picks
another visible index when a pod is given several. ``start`` initialises CUDA in the main thread
and touches the device, so a missing driver, a GPU taken by another process or a broken device
becomes a failed start (exit non-zero, the reason in the termination message) instead of a 500
on every request. ``warm_up`` then runs one request's image work on the device before the server
says ready: the first kernels' load and the allocator's first blocks are paid before traffic.

Each processor worker gets its own CUDA stream (``worker_init``): PyTorch's current stream is
per thread, so two workers' uploads and kernels do not serialise on the default stream. Images
are uploaded from pinned host buffers with ``non_blocking=True`` where the processor accepts
tensors (``upload_images``); the outputs still come back to the CPU (the pipeline copies them).

The caching allocator reads ``PYTORCH_CUDA_ALLOC_CONF`` once, at CUDA's initialisation: the
runtime sets ``expandable_segments:True`` unless the pod's env says otherwise (variable-size
images otherwise fragment the cache into blocks no later image fits), and reports the setting.

torch is imported inside the functions: this module is imported by the CPU path too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any, Final

from mmprep_runtime.exits import ModelLoadError

ENV_DEVICE_INDEX: Final = "MMPREP_CUDA_DEVICE"
ENV_ALLOC_CONF: Final = "PYTORCH_CUDA_ALLOC_CONF"
#: Newer PyTorch reads this name first; either one set by the user wins over our default.
ENV_ALLOC_CONF_NEW: Final = "PYTORCH_ALLOC_CONF"
DEFAULT_ALLOC_CONF: Final = "expandable_segments:True"
WARM_UP_SIZE: Final = (448, 448)


class CudaUnavailable(ModelLoadError):
    """CUDA was asked for and cannot be used: the process must not start serving."""


def device_index(environ: Mapping[str, str]) -> int:
    text = environ.get(ENV_DEVICE_INDEX, "").strip()
    if not text:
        return 0
    try:
        index = int(text)
    except ValueError:
        raise CudaUnavailable(f"{ENV_DEVICE_INDEX} must be a device index (0, 1, ...), got {text!r}") from None
    if index < 0:
        raise CudaUnavailable(f"{ENV_DEVICE_INDEX} must be >= 0, got {index}")
    return index


def configure_allocator(environ: MutableMapping[str, str]) -> str:
    """Set the caching allocator's default before CUDA starts; return the setting in force."""
    if ENV_ALLOC_CONF_NEW in environ:
        return str(environ[ENV_ALLOC_CONF_NEW])
    environ.setdefault(ENV_ALLOC_CONF, DEFAULT_ALLOC_CONF)
    return str(environ[ENV_ALLOC_CONF])


def _visible(environ: Mapping[str, str]) -> str:
    shown = [f"{k}={environ[k]}" for k in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES") if k in environ]
    return ", ".join(shown) or "no *_VISIBLE_DEVICES set"


def start(environ: Mapping[str, str] = os.environ) -> str:
    """Initialise CUDA on the pod's device and prove it works; return the device name (cuda:N)."""
    index = device_index(environ)
    if environ is os.environ:
        configure_allocator(os.environ)  # read by the allocator once, at its first CUDA allocation
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a runtime dependency
        raise CudaUnavailable(f"device cuda: torch cannot be imported: {exc}") from exc
    if torch.version.cuda is None:
        raise CudaUnavailable(f"device cuda: this torch build ({torch.__version__}) has no CUDA support")
    try:
        if not torch.cuda.is_available():
            raise CudaUnavailable(
                f"device cuda: CUDA is not available (torch {torch.__version__}, CUDA {torch.version.cuda}, "
                f"{torch.cuda.device_count()} visible device(s), {_visible(environ)}): no GPU or no driver in this container"
            )
        count = torch.cuda.device_count()
        if index >= count:
            raise CudaUnavailable(
                f"device cuda: {ENV_DEVICE_INDEX}={index}, but only {count} device(s) are visible ({_visible(environ)})"
            )
        device = f"cuda:{index}"
        torch.cuda.init()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        torch.cuda.set_device(index)
        # A real allocation and kernel: a device in a bad state (ECC, taken exclusively) fails here.
        probe = torch.ones(1024, device=device)
        if float(probe.sum().item()) != 1024.0:
            raise CudaUnavailable(f"device cuda: {device} computed a wrong sum: the device is not usable")
        torch.cuda.synchronize(device)
    except CudaUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - any CUDA error at start is a failed start
        raise CudaUnavailable(f"device cuda: initialising CUDA failed: {type(exc).__name__}: {exc}") from exc
    return device


def worker_init(device: str) -> None:
    """In a processor worker thread: its own current stream on the pod's device."""
    import torch

    torch.cuda.set_device(torch.device(device))
    torch.cuda.set_stream(torch.cuda.Stream(device=device))  # type: ignore[no-untyped-call]  # torch leaves Stream() unannotated


def upload_images(images: Sequence[Any], device: str) -> list[Any]:
    """Images as uint8 CHW tensors on ``device``, copied from pinned host memory without blocking
    the worker: the CHW tensors JPEG decoding makes for fast processors, and RGB PIL images;
    anything else is left to the processor (it converts modes, e.g. RGBA)."""
    import numpy as np
    import torch

    out = []
    on_cuda = device.startswith("cuda")
    for image in images:
        if isinstance(image, torch.Tensor) and image.device.type == "cpu" and image.dtype == torch.uint8:
            tensor = image
        elif getattr(image, "mode", None) == "RGB":
            tensor = torch.from_numpy(np.array(image)).permute(2, 0, 1).contiguous()
        else:
            out.append(image)
            continue
        if on_cuda:
            # The copy is queued on this worker's stream; the pinned buffer is kept alive by the
            # caching host allocator until the copy is done.
            tensor = tensor.pin_memory().to(device, non_blocking=True)
        out.append(tensor)
    return out


def warm_up(processor: Any, device: str) -> dict[str, Any]:
    """One request's image work on the device; raises ``CudaUnavailable`` when it did not run there."""
    import torch
    from PIL import Image

    image_processor = getattr(processor, "image_processor", None)
    if image_processor is None:
        return {"warmed": False, "why": "the processor has no image processor"}
    try:
        image = Image.new("RGB", WARM_UP_SIZE, (127, 64, 200))
        out = image_processor(images=[image], return_tensors="pt")
        tensors = [v for v in out.values() if isinstance(v, torch.Tensor)]
        on_device = [t for t in tensors if t.device.type == "cuda"]
        torch.cuda.current_stream().synchronize()
    except Exception as exc:  # noqa: BLE001 - a failed warm-up is a failed start
        raise CudaUnavailable(f"device cuda: the warm-up request failed on {device}: {type(exc).__name__}: {exc}") from exc
    if not on_device:
        raise CudaUnavailable(
            f"device cuda: the warm-up request's tensors stayed on the CPU; the image processor ignored {device}"
        )
    return {"warmed": True, "tensors_on_device": len(on_device)}


def describe(device: str) -> dict[str, Any]:
    """The device as /v1/info reports it."""
    import torch

    index = torch.device(device).index or 0
    free, total = torch.cuda.mem_get_info(index)
    return {
        "device": device,
        "name": torch.cuda.get_device_name(index),
        "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES") or os.environ.get("NVIDIA_VISIBLE_DEVICES"),
        "allocator_conf": os.environ.get(ENV_ALLOC_CONF_NEW) or os.environ.get(ENV_ALLOC_CONF),
        "memory_total_bytes": total,
        "memory_free_bytes": free,
    }

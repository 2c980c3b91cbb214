"""Loading a processor and reading the facts the decision needs from it.

``load_processor`` returns the processor (customized: backend swap, device patch) together with
``ProcessorFacts``: its classes, whether its image processor is the fast (torchvision) kind, and
the worker count the model declares. ``serve``, ``probe`` and ``bench`` all load through here, so
they agree on what a model is.

Backend: transformers chooses an image processor backend at load time (torchvision when
installed). ``--backend pil|torchvision`` reloads just the image processor with that backend; with
``auto``, a folder whose config names a ``...Pil`` class gets the PIL backend (that is what
``make-model --backend pil`` writes), anything else keeps the transformers default.

Remote code: ``trust_remote_code`` is always passed as a bool. Passing None would make
transformers ask on stdin, which in a pod hangs or fails obscurely.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
from typing import Any, Final

from mmprep_runtime import declared, sizing
from mmprep_runtime.engine import cuda, decoding, patches, stand_ins
from mmprep_runtime.exits import ModelLoadError
from mmprep_runtime.settings import ModelSettings

logger = logging.getLogger(__name__)

#: Processors whose image processor can skip rescale/normalize and hand out uint8 pixels for the
#: GPU to normalize (vLLM's ``supports_mm_device_do_normalize``). A fact of the processor, so the
#: engine's facts answer it (``ProcessorFacts.normalizes_on_device``) for every HTTP API.
DEVICE_NORMALIZE_PROCESSORS: Final = frozenset(
    {"Qwen2VLProcessor", "Qwen2_5_VLProcessor", "Qwen3VLProcessor", "Glm4vProcessor", "PixtralProcessor"}
)
#: What vLLM sets on the processor when it leaves rescale/normalize to the GPU
#: (``mm_device_do_normalize``, its default for models that support it, Qwen2-VL among them).
#: It is applied after hashing: it never joins an item's hash.
DEVICE_NORMALIZE_KWARGS: Final = {"do_normalize": False, "do_rescale": False}


@dataclasses.dataclass(frozen=True)
class ProcessorFacts:
    model: str
    processor_class: str
    tokenizer_class: str
    image_processor_class: str | None
    fast_image_processor: bool
    backend: str | None  # "torchvision", "pil", or None without an image processor
    feature_extractor_class: str | None
    sampling_rate: int | None
    image_token: str | None
    declared_workers: int | None
    #: The model's own ``mmprep.json`` says its copies must not run concurrently (1 worker).
    thread_safe: bool = True
    declared_io_workers: int | None = None
    #: The ``stand_ins`` stand-ins bound on this processor (empty when off or not applicable).
    fast_paths: tuple[str, ...] = ()
    #: The text placeholder one audio clip takes (Qwen2-Audio's ``<|AUDIO|>``); None: none (Whisper).
    audio_token: str | None = None

    def reported(self) -> dict[str, object]:
        """The facts that both the probe and ``/v1/info`` report, under the same keys."""
        return {
            "processor_class": self.processor_class,
            "tokenizer_class": self.tokenizer_class,
            "image_processor_class": self.image_processor_class,
            "fast_image_processor": self.fast_image_processor,
            "backend": self.backend,
            "feature_extractor_class": self.feature_extractor_class,
            "declared_workers": self.declared_workers,
            "declared_io_workers": self.declared_io_workers,
            "thread_safe": self.thread_safe,
        }

    def path(self, *, gpu_available: bool, device: sizing.Device | str) -> sizing.ComputePath:
        """The shared path rule applied to these facts (an unknown backend counts as ``auto``)."""
        backend = self.backend if self.backend in ("pil", "torchvision") else sizing.Backend.AUTO
        return sizing.decide_path(
            gpu_available=gpu_available,
            device=device,
            backend=backend,
            fast_image_processor=self.fast_image_processor,
        )

    @property
    def image_layout(self) -> decoding.ImageLayout:
        """How decoded images are handed to this processor's image processor."""
        if self.backend == sizing.Backend.TORCHVISION.value:
            return decoding.ImageLayout.TENSOR
        if self.backend == sizing.Backend.PIL.value:
            return decoding.ImageLayout.ARRAY
        return decoding.ImageLayout.PIL  # any other image processor: the one input all of them take

    @property
    def normalizes_on_device(self) -> bool:
        """Whether this processor can leave rescale/normalize to the GPU (uint8 pixels out)."""
        return self.processor_class in DEVICE_NORMALIZE_PROCESSORS

    @property
    def takes_images(self) -> bool:
        return self.image_processor_class is not None

    @property
    def takes_audio(self) -> bool:
        return self.feature_extractor_class is not None


def _local_folder(model: str) -> pathlib.Path | None:
    path = pathlib.Path(model)
    return path if path.is_dir() else None


def _folder_names_pil_class(folder: pathlib.Path) -> bool:
    for name in ("processor_config.json", "preprocessor_config.json"):
        try:
            config = json.loads((folder / name).read_text())
        except (OSError, json.JSONDecodeError):
            continue
        image_config = config.get("image_processor", config) if isinstance(config, dict) else {}
        kind = image_config.get("image_processor_type") if isinstance(image_config, dict) else None
        if isinstance(kind, str):
            return kind.endswith("Pil")
    return False


def _image_backend(image_processor: Any) -> str | None:
    if image_processor is None:
        return None
    from transformers.image_processing_backends import PilBackend, TorchvisionBackend

    if isinstance(image_processor, TorchvisionBackend):
        return sizing.Backend.TORCHVISION.value
    if isinstance(image_processor, PilBackend):
        return sizing.Backend.PIL.value
    return "other"


def facts_of(
    processor: Any,
    model: str,
    declaration: declared.Declaration,
    fast_paths: tuple[str, ...] = (),
) -> ProcessorFacts:
    image_processor = getattr(processor, "image_processor", None)
    feature_extractor = getattr(processor, "feature_extractor", None)
    backend = _image_backend(image_processor)
    return ProcessorFacts(
        model=model,
        processor_class=type(processor).__name__,
        tokenizer_class=type(patches.tokenizer_of(processor)).__name__,
        image_processor_class=type(image_processor).__name__ if image_processor is not None else None,
        fast_image_processor=backend == sizing.Backend.TORCHVISION.value,
        backend=backend,
        feature_extractor_class=type(feature_extractor).__name__ if feature_extractor is not None else None,
        sampling_rate=getattr(feature_extractor, "sampling_rate", None),
        image_token=getattr(processor, "image_token", None) if image_processor is not None else None,
        declared_workers=declaration.processor_workers,
        thread_safe=declaration.thread_safe,
        declared_io_workers=declaration.io_workers,
        fast_paths=fast_paths,
        audio_token=getattr(processor, "audio_token", None) if feature_extractor is not None else None,
    )


def load_processor(settings: ModelSettings) -> tuple[Any, ProcessorFacts]:
    """Load with ``AutoProcessor``; apply the backend choice. Raises ``ModelLoadError``."""
    try:
        from transformers import AutoImageProcessor, AutoProcessor
    except ImportError as exc:  # pragma: no cover - the runtime extra is missing
        raise ModelLoadError(f"transformers is not installed: {exc}") from exc

    folder = _local_folder(settings.model)
    if folder is None and settings.model.startswith(("/", "./", "../", "~")):
        # Clearly a path, not a hub id: say so now instead of asking the hub for it.
        raise ModelLoadError(f"model folder {settings.model!r} does not exist")
    common: dict[str, Any] = {"trust_remote_code": bool(settings.trust_remote_code)}
    if settings.revision is not None and folder is None:
        common["revision"] = settings.revision
    try:
        # transformers ships py.typed but leaves the Auto classes' from_pretrained unannotated.
        processor = AutoProcessor.from_pretrained(settings.model, **common)  # type: ignore[no-untyped-call]
    except Exception as exc:  # noqa: BLE001 - anything here means "cannot load", said clearly
        raise ModelLoadError(f"cannot load processor {settings.model!r}: {type(exc).__name__}: {exc}") from exc

    backend = settings.backend
    if backend is sizing.Backend.AUTO and folder is not None and _folder_names_pil_class(folder):
        backend = sizing.Backend.PIL
    image_processor = getattr(processor, "image_processor", None)
    wrong_backend = image_processor is not None and _image_backend(image_processor) != backend.value
    if backend is not sizing.Backend.AUTO and wrong_backend:
        try:
            processor.image_processor = AutoImageProcessor.from_pretrained(  # type: ignore[no-untyped-call,unused-ignore]  # as above (typed in some transformers 5 releases)
                settings.model, backend=backend.value, **common
            )
        except Exception as exc:  # noqa: BLE001
            raise ModelLoadError(
                f"cannot load the {backend.value} image processor of {settings.model!r}: {type(exc).__name__}: {exc}"
            ) from exc
    try:
        declaration = declared.declaration_of(folder, type(processor).__name__)
    except declared.DeclarationError as exc:
        raise ModelLoadError(f"{settings.model!r}: {exc}") from exc
    bound = stand_ins.apply(processor) if settings.fast_paths else ()
    return processor, facts_of(processor, settings.model, declaration, bound)


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return bool(torch.cuda.is_available())


def bind_device(processor: Any, device: str) -> None:
    """Make the fast image processor run on ``device``: a MethodType patch, so clones keep it."""
    image_processor = getattr(processor, "image_processor", None)
    if image_processor is None:
        return
    patches.bind_default_kwargs(image_processor, "preprocess", device=device)
    if device.startswith("cuda") and _image_backend(image_processor) == sizing.Backend.TORCHVISION.value:
        # Fast (torchvision) processors take tensors: upload from pinned memory without blocking.
        patches.bind_input_transform(image_processor, "preprocess", "images", cuda.upload_images, device)

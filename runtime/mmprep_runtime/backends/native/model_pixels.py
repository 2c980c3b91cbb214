"""Image patches rescaled, normalized and cast to the model's dtype one patch at a time.

A processor that cuts an image into many patches (InternVL's 13 crops of 448x448, LLaVA-OneVision's
tiles of 384x384, about 8 M values for a 1280x960 image) normalizes them in float32 and then
copies that float32 batch several times before vLLM casts it to the model's dtype: the image
processor stacks its list, the processor pads and concatenates, and each copy moves 31 MB through
memory (about 6 ms apiece on these machines). Here the image processor stops before its
rescale-and-normalize (uint8 patches, a quarter of the bytes), and each patch then goes through
the library's own ``rescale_and_normalize`` and is cast straight into its row of the answer. The
arithmetic is the library's, element by element, and the cast is the one vLLM applies: the same
bytes, with one float32 patch in cache at a time instead of the whole batch in memory, copied four
times.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

#: The image processor's steps this module runs itself, and the call arguments that skip them.
NORMALIZE_STEPS: Final = ("do_rescale", "rescale_factor", "do_normalize", "image_mean", "image_std")
SKIP_NORMALIZE: Final = {"do_rescale": False, "do_normalize": False}


def _settings(image_processor: Any, call_kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    """The rescale-and-normalize arguments a call with ``call_kwargs`` would run with: each from the
    call, else the image processor's own; lists as the tuples the library makes of them (its fused
    mean and std are cached by their arguments)."""
    values = [call_kwargs.get(name, getattr(image_processor, name, None)) for name in NORMALIZE_STEPS]
    return tuple(tuple(value) if isinstance(value, list) else value for value in values)


def normalized(image_processor: Any, patches: Sequence[Any], dtype: str | None, call_kwargs: Mapping[str, Any]) -> Any:
    """``patches`` (uint8, each channel-first) as one tensor, each rescaled and normalized as the
    image processor does with ``call_kwargs``, a floating result in ``dtype`` (None: as it comes);
    where neither step runs, the uint8 patches as they are."""
    import torch

    settings = _settings(image_processor, call_kwargs)
    first = image_processor.rescale_and_normalize(patches[0][None], *settings)[0]
    target = getattr(torch, dtype, None) if dtype is not None and first.is_floating_point() else None
    out = torch.empty((len(patches), *first.shape), dtype=target if isinstance(target, torch.dtype) else first.dtype)
    out[0] = first
    for index in range(1, len(patches)):
        out[index] = image_processor.rescale_and_normalize(patches[index][None], *settings)[0]
    return out

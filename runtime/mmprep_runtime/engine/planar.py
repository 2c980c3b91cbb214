"""Interleaved pixels copied into channel-first memory, by OpenCV's split where it is installed.

Decoders and torch's uint8 resize write pixels interleaved (height, width, channel); the model's
pixel values are channel-first. Somewhere every image pays that transposition, a copy whose source
steps three bytes at a time: torch does it one short run at a time, NumPy's copy in about 40% of
torch's time (1.5 ms for a 1536x1152 RGB image here), and OpenCV's ``split``, which deinterleaves
with vector loads and stores, in 0.2 ms. OpenCV is not a dependency of the runtime: vLLM brings it
(so the runtime image with vLLM and vLLM's virtualenv have it), and without it the copy is NumPy's.
Every route writes the same values into the same places.
"""

from __future__ import annotations

import functools
from typing import Any

#: NumPy dtypes OpenCV's ``split`` copies as they are (it has no bool, 64-bit integers or bfloat16).
_SPLIT_DTYPES = ("uint8", "int8", "uint16", "int16", "int32", "float32", "float64")
_MAX_SPLIT_CHANNELS = 4


@functools.cache
def _opencv() -> Any:
    """OpenCV's module, or None where it is not installed (or cannot load its libraries)."""
    try:
        import cv2
    except ImportError:
        return None
    return cv2


def opencv_split_available() -> bool:
    return _opencv() is not None


def channel_first(pixels: Any) -> Any:
    """``pixels.contiguous()`` for a CPU tensor of one or more channel-first images (``[..., C, H,
    W]``): interleaved memory (a permuted view, as decoders and resizes leave it) is deinterleaved by
    OpenCV or NumPy; any other tensor, and bfloat16, is torch's copy (none where already contiguous)."""
    import torch

    if pixels.is_contiguous() or not _interleaved(pixels):
        return pixels.contiguous()
    out = torch.empty(pixels.shape, dtype=pixels.dtype)
    copy_into(pixels, out.numpy())
    return out


def copy_into(pixels: Any, out: Any) -> None:
    """Writes the tensor ``pixels`` (``[..., C, H, W]``) into the NumPy array ``out`` of its shape and
    dtype, deinterleaving interleaved memory by OpenCV where it can; anything else by NumPy's copy."""
    if not _interleaved(pixels):
        out[...] = pixels.numpy()
        return
    source = pixels.movedim(-3, -1).numpy()
    images_in, images_out = source.reshape(-1, *source.shape[-3:]), out.reshape(-1, *out.shape[-3:])
    cv2 = _opencv()
    splits = cv2 is not None and source.dtype.name in _SPLIT_DTYPES and 1 < source.shape[-1] <= _MAX_SPLIT_CHANNELS
    for image, planes in zip(images_in, images_out, strict=True):
        if not splits:
            planes[...] = image.transpose(2, 0, 1)
            continue
        # Into the planes given (each contiguous), so no array of OpenCV's own; should a version
        # answer new arrays instead, their values are copied in.
        for plane, written in zip(planes, cv2.split(image, list(planes)), strict=True):
            if written.ctypes.data != plane.ctypes.data:
                plane[...] = written


def _interleaved(pixels: Any) -> bool:
    """A CPU tensor NumPy can read whose channel axis (third from last) is innermost in memory."""
    import torch

    return (
        pixels.dim() >= 3
        and pixels.device.type == "cpu"
        and not pixels.requires_grad
        and pixels.dtype != torch.bfloat16
        and pixels.movedim(-3, -1).is_contiguous()
    )

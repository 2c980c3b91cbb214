"""Interleaved pixels into channel-first memory: OpenCV's split and NumPy's copy write what torch's would."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mmprep_runtime.engine import planar


@pytest.fixture(params=["opencv", "numpy"])
def route(request, monkeypatch):
    # The test extra installs OpenCV, so both routes run here; without it only NumPy's would.
    assert planar.opencv_split_available(), "the test extra installs opencv-python-headless"
    if request.param == "numpy":
        monkeypatch.setattr(planar, "_opencv", lambda: None)
    return request.param


def _interleaved(*shape_hwc: int, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """A channel-first view of interleaved memory, as a decoder or a uint8 resize leaves it."""
    generator = torch.Generator().manual_seed(sum(shape_hwc))
    values = torch.randint(0, 256, shape_hwc, generator=generator).to(dtype)
    return values.movedim(-1, -3)


@pytest.mark.parametrize(
    "pixels",
    [
        _interleaved(481, 641, 3),  # one RGB image, odd sizes
        _interleaved(2, 64, 48, 3),  # a batch
        _interleaved(1, 3, 40, 30, 4),  # RGBA, two leading axes
        _interleaved(33, 17, 3, dtype=torch.float32),
        _interleaved(33, 17, 3, dtype=torch.float16),  # not OpenCV's: NumPy's copy
        _interleaved(20, 10, 2),
        _interleaved(20, 10, 6),  # more channels than the split takes
        _interleaved(20, 10, 1),
    ],
    ids=["rgb", "batch", "rgba", "float32", "float16", "two-channels", "six-channels", "one-channel"],
)
def test_channel_first_writes_what_torch_writes_by_either_route(route, pixels):
    ours = planar.channel_first(pixels)
    assert ours.is_contiguous() and ours.dtype == pixels.dtype and torch.equal(ours, pixels.contiguous())
    out = np.empty(tuple(pixels.shape), dtype=ours.numpy().dtype)
    planar.copy_into(pixels, out)
    assert np.array_equal(out, pixels.contiguous().numpy())


def test_what_is_not_interleaved_is_torchs_copy(route):
    contiguous = torch.arange(24, dtype=torch.uint8).view(2, 3, 4)
    assert planar.channel_first(contiguous) is contiguous  # nothing to copy
    # Channel-first memory read across (width and height swapped), bfloat16, a gradient: torch's.
    swapped = torch.arange(60, dtype=torch.uint8).view(3, 4, 5).transpose(1, 2)
    bf16 = _interleaved(8, 6, 3, dtype=torch.bfloat16)
    grad = _interleaved(8, 6, 3, dtype=torch.float32).requires_grad_()
    for pixels in (swapped, bf16, grad):
        ours = planar.channel_first(pixels)
        assert ours.is_contiguous() and torch.equal(ours, pixels.contiguous())
    out = np.empty((3, 5, 4), dtype=np.uint8)
    planar.copy_into(swapped, out)
    assert np.array_equal(out, swapped.contiguous().numpy())


def test_a_crop_of_interleaved_memory_is_torchs_copy(route):
    # A window of an interleaved image is contiguous in no order: torch reads its strides.
    window = _interleaved(100, 120, 3)[:, 10:50, 20:70]
    ours = planar.channel_first(window)
    assert ours.is_contiguous() and torch.equal(ours, window.contiguous())

"""Synthetic request media for tests, demos and the benchmark: JPEG/PNG images and PCM WAV audio."""

from __future__ import annotations

import io
import math
import wave

import numpy as np


def jpeg(width: int = 64, height: int = 48, *, seed: int = 0, quality: int = 90) -> bytes:
    """A photo-like JPEG: smooth gradients plus noise, so decode and resize costs are realistic."""
    return _encode(_photo_like(width, height, seed), "JPEG", quality=quality)


def png(width: int = 64, height: int = 48, *, seed: int = 0) -> bytes:
    return _encode(_photo_like(width, height, seed), "PNG")


def wav(seconds: float = 0.5, rate: int = 16000) -> bytes:
    """A 440 Hz tone, mono 16-bit PCM."""
    samples = (np.sin(np.linspace(0, 440 * 2 * math.pi * seconds, int(rate * seconds))) * 8000).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(samples.tobytes())
    return buffer.getvalue()


def _photo_like(width: int, height: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (width + height)], axis=-1)
    return np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)


def _encode(pixels: np.ndarray, fmt: str, **options: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, format=fmt, **options)
    return buffer.getvalue()

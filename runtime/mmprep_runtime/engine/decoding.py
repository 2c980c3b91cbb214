"""Decoding of request media: base64 -> checked image (in the layout its processor takes) or float32 waveform.

Runs on the IO pool, never on the event loop (decoding a 1280x960 JPEG holds the GIL for
milliseconds). Every failure is a typed request error naming the item: the caller answers 4xx and
the pool keeps serving.

Decompression bombs: the pixel count is read from the header and checked against the cap *before*
any pixel is decoded, so a 30000x30000 PNG of a few hundred KB costs nothing.
"""

from __future__ import annotations

import binascii
import enum
import io
import wave
from typing import Any, Final

import numpy as np
from PIL import Image, UnidentifiedImageError

from mmprep_runtime import errors

try:  # SIMD base64 when installed (the runtime extra has it): 0.2 ms instead of 0.9 ms per image
    from pybase64 import b64decode as _b64decode
except ImportError:  # pragma: no cover - same result, slower
    from base64 import b64decode as _b64decode  # type: ignore[assignment]

ALLOWED_IMAGE_FORMATS: Final = frozenset({"JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF"})


class ImageLayout(str, enum.Enum):
    """What a decoded image is handed to its processor as (``ProcessorFacts.image_layout``).

    JPEGs then decode with torchvision's libjpeg-turbo op, which releases the GIL, straight into
    the layout the image processor works in. From a PIL image, every image processor first copies
    the pixels into an array (``Image.tobytes``), holding the GIL for about 1 ms per 1280x960
    image, which serializes the worker threads. The pixels are identical to PIL's.
    """

    #: An RGB PIL image: what every image processor takes.
    PIL = "pil"
    #: A CHW uint8 torch tensor: torchvision (fast) image processors.
    TENSOR = "tensor"
    #: An HWC uint8 NumPy array: transformers' PIL-backend image processors, which turn a PIL
    #: image into exactly this array before anything else.
    ARRAY = "array"


#: Processors guess an array's channel axis from its sizes (1, 3 or 4 channels): an HWC image
#: with a side of 4 pixels or fewer stays a PIL image, whose layout is never guessed.
_MIN_ARRAY_SIDE: Final = 5


def image_size(image: Any) -> tuple[int, int]:
    """(width, height) of a decoded image in any ``ImageLayout``."""
    if isinstance(image, np.ndarray):
        return image.shape[1], image.shape[0]
    if hasattr(image, "shape"):
        return image.shape[-1], image.shape[-2]
    return image.size  # type: ignore[no-any-return]


def b64decode(item: str, what: str) -> bytes:
    # Data URLs are what browsers and OpenAI-style clients send; accept them as-is.
    if item.startswith("data:"):
        _, _, item = item.partition(",")
    try:
        return _b64decode(item, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise errors.BadMedia(f"{what} is not valid base64: {exc}") from None


def decode_image(data: bytes, what: str, *, max_pixels: int, layout: ImageLayout = ImageLayout.PIL) -> Any:
    """A checked RGB image in ``layout`` (see ``ImageLayout``)."""
    return decode_opened(open_image(data, what, max_pixels=max_pixels), data, what, layout)


def open_image(data: bytes, what: str, *, max_pixels: int) -> Image.Image:
    """The image's header, read and checked (a known format, within ``max_pixels``); no pixel is decoded yet.

    Split from the decoding so that a caller which must look at the header first (vLLM's
    orientation and transparency rules) opens the file once.
    """
    try:
        image = Image.open(io.BytesIO(data))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise errors.MediaTooLarge(f"{what} is too large: {exc}") from None
    except UnidentifiedImageError:
        raise errors.BadMedia(f"{what} is not an image (no known image format)") from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise errors.BadMedia(f"{what} is not a readable image: {exc}") from None
    if image.format not in ALLOWED_IMAGE_FORMATS:
        raise errors.BadMedia(f"{what} has unsupported image format {image.format}")
    width, height = image.size
    if width * height > max_pixels:
        raise errors.MediaTooLarge(f"{what} is {width}x{height} = {width * height} pixels, over the limit of {max_pixels}")
    return image


def decode_opened(image: Image.Image, data: bytes, what: str, layout: ImageLayout) -> Any:
    """The RGB pixels of an image ``open_image`` checked (``data`` is its file), in ``layout``."""
    width, height = image.size
    if image.format == "JPEG" and (
        layout is ImageLayout.TENSOR or (layout is ImageLayout.ARRAY and min(width, height) >= _MIN_ARRAY_SIDE)
    ):
        chw = _decode_jpeg_tensor(data, what)
        # The HWC copy is a torch op: it releases the GIL too.
        return chw if layout is ImageLayout.TENSOR else chw.permute(1, 2, 0).contiguous().numpy()
    load_pixels(image, what)
    return in_layout(image if image.mode == "RGB" else image.convert("RGB"), layout)


def load_pixels(image: Image.Image, what: str) -> None:
    """Decode an opened image's pixels; a truncated or corrupt file is the request's error."""
    try:
        image.load()
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        # Truncated files end here ("image file is truncated").
        raise errors.BadMedia(f"{what} could not be decoded: {exc}") from None


def in_layout(rgb: Image.Image, layout: ImageLayout) -> Any:
    """A decoded RGB PIL image in ``layout``.

    An ``ARRAY`` processor gets the PIL image: it makes the same array itself, and an array made
    here would cost the same GIL-held copy.
    """
    if layout is ImageLayout.TENSOR:
        import torch

        return torch.from_numpy(np.array(rgb)).permute(2, 0, 1)
    return rgb


def _decode_jpeg_tensor(data: bytes, what: str) -> Any:
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    # bytearray: torch.frombuffer needs a writable buffer (a bytes object would warn).
    encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    try:
        return decode_jpeg(encoded, mode=ImageReadMode.RGB)
    except RuntimeError as exc:
        # Truncated or corrupt data; the library's message is long, its last line says what.
        reason = str(exc).strip().splitlines()[-1].rsplit(", ", 1)[-1] if str(exc).strip() else type(exc).__name__
        raise errors.BadMedia(f"{what} could not be decoded: {reason}") from None


def decode_wav(data: bytes, what: str, *, target_rate: int, max_seconds: float) -> np.ndarray[Any, Any]:
    """A mono float32 waveform in [-1, 1] at ``target_rate`` (linear resampling when needed)."""
    try:
        with wave.open(io.BytesIO(data), "rb") as reader:
            channels = reader.getnchannels()
            width = reader.getsampwidth()
            rate = reader.getframerate()
            frames = reader.getnframes()
            if rate <= 0:
                raise errors.BadMedia(f"{what} has sampling rate {rate}")
            if frames / rate > max_seconds:
                raise errors.MediaTooLarge(f"{what} lasts {frames / rate:.1f} s, over the limit of {max_seconds:g} s")
            raw = reader.readframes(frames)
    except (wave.Error, EOFError) as exc:
        raise errors.BadMedia(f"{what} is not a PCM WAV file: {exc}") from None
    dtypes: dict[int, np.dtype[Any]] = {1: np.dtype(np.uint8), 2: np.dtype("<i2"), 4: np.dtype("<i4")}
    if width not in dtypes:
        raise errors.BadMedia(f"{what} has {8 * width}-bit samples; 8, 16 or 32-bit PCM is supported")
    samples = np.frombuffer(raw, dtype=dtypes[width])
    if samples.size < channels:
        raise errors.BadMedia(f"{what} has no samples")
    samples = samples[: samples.size - samples.size % channels].reshape(-1, channels)
    audio: np.ndarray[Any, Any]
    if width == 1:
        audio = (samples.astype(np.float32) - 128.0) / 128.0
    else:
        audio = samples.astype(np.float32) / float(2 ** (8 * width - 1))
    audio = audio.mean(axis=1)
    if rate != target_rate:
        duration = audio.size / rate
        target_size = max(1, round(duration * target_rate))
        audio = np.interp(
            np.linspace(0.0, duration, target_size, endpoint=False),
            np.arange(audio.size) / rate,
            audio,
        ).astype(np.float32)
    return audio


def audio_decode_problem(data: bytes) -> str | None:
    """Why no installed audio decoder can open ``data``: soundfile, then PyAV, the order vLLM tries
    them in. None when one can, or when neither is installed (vLLM's own answer then stands).

    Only the header and the container are read, not the samples: a clip either decoder opens is
    vLLM's to judge (its duration, its sample rate).
    """
    try:
        import soundfile
    except ImportError:
        soundfile = None
    try:
        import av
    except ImportError:
        av = None
    if soundfile is None and av is None:
        return None
    problems: list[str] = []
    if soundfile is not None:
        try:
            soundfile.info(io.BytesIO(data))
            return None
        except Exception as exc:  # noqa: BLE001 - libsndfile's errors have no common base worth naming
            problems.append(str(exc).replace("<_io.BytesIO object>", "the clip"))
    if av is not None:
        try:
            with av.open(io.BytesIO(data)) as container:
                if container.streams.audio:
                    return None
                problems.append("it holds no audio stream")
        except Exception as exc:  # noqa: BLE001 - PyAV raises FFmpeg's many error classes
            problems.append(str(exc))
    return problems[0]

"""vLLM's audio decoding without a failed torchcodec load on every clip.

vLLM decodes an audio clip with the first backend that works: torchcodec, then soundfile, then
PyAV. torchcodec needs FFmpeg's shared libraries from the system; where they are missing (the
runtime image and most Python-only installs: PyAV and soundfile bring their own), torchcodec still
imports, and each decoder it builds tries to load its six FFmpeg-versioned libraries, fails, and
formats a traceback for each. torchcodec does not remember the failure, by design, so vLLM pays it
on every clip before falling back to soundfile: 13% of a render process's CPU on Qwen2-Audio with
10 s clips (py-spy, 2 cores); vLLM's own render server spends about 8 ms more CPU per such request
than the same server with torchcodec hidden (the render benchmark's third server).

Each render process tries torchcodec once, at start, on a short silent WAV (``install``). When
that fails for want of its libraries, the process records torchcodec as unavailable the way vLLM's
own module does when torchcodec cannot be imported (``AudioDecoder`` None, the reason kept), and
vLLM's chain starts at soundfile: the backend it would have reached anyway, so every answer is the
same (the compatibility tests compare Qwen2-Audio's with vLLM's own server's). Where torchcodec
works, or vLLM's module does not have the shape this was written against, nothing changes.
"""

from __future__ import annotations

import io
import logging
import wave
from typing import Any

logger = logging.getLogger(__name__)


def _silent_wav(seconds: float = 0.1, rate: int = 16_000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(b"\0\0" * int(seconds * rate))
    return out.getvalue()


def skip_unloadable_torchcodec(audio: Any) -> bool:
    """In vLLM's audio module ``audio``: True when torchcodec could not decode for want of its
    libraries and is now recorded as unavailable; False when it works, fails otherwise, or the
    module is not the shape this expects (then it is left as it is)."""
    load = getattr(audio, "load_audio_torchcodec", None)
    if not callable(load) or getattr(audio, "AudioDecoder", None) is None or not hasattr(audio, "_torchcodec_import_exc"):
        return False
    try:
        load(io.BytesIO(_silent_wav()), sr=None)
    except ImportError as exc:  # vLLM's own sign that the backend cannot run here
        audio.AudioDecoder = None
        audio._torchcodec_import_exc = exc.__cause__ or exc
        return True
    except Exception:  # noqa: BLE001 - any other failure is vLLM's to meet per clip, as it would
        return False
    return False


def install() -> None:
    """Try torchcodec once in this render process; see the module's docstring."""
    try:
        from vllm.multimodal.media import audio
    except ImportError:
        return
    if skip_unloadable_torchcodec(audio):
        logger.info("torchcodec cannot load FFmpeg's libraries here: vLLM decodes audio with soundfile, then PyAV")

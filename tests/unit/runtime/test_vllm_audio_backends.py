"""A render process tries torchcodec once and, when it cannot load, records it as vLLM records a
torchcodec it cannot import (``backends.vllm.audio_backends``). Stand-ins for vLLM's audio module
here; the compatibility tests run the real one and compare Qwen2-Audio's answers with vLLM's."""

from __future__ import annotations

import io
import types
import wave
from typing import Any

import pytest

from mmprep_runtime.backends.vllm import audio_backends


def _audio_module(load: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(load_audio_torchcodec=load, AudioDecoder=object, _torchcodec_import_exc=None)


def test_a_torchcodec_without_its_libraries_is_recorded_unavailable_with_the_reason() -> None:
    tried: list[bytes] = []
    cause = RuntimeError("Could not load libtorchcodec")

    def load(source: io.BytesIO, *, sr: Any) -> None:
        tried.append(source.read())
        raise ImportError("torchcodec audio backend is unavailable") from cause

    audio = _audio_module(load)
    assert audio_backends.skip_unloadable_torchcodec(audio) is True
    assert audio.AudioDecoder is None and audio._torchcodec_import_exc is cause
    with wave.open(io.BytesIO(tried[0])) as clip:  # it was given a real WAV to decode
        assert clip.getnframes() > 0 and clip.getframerate() == 16_000


@pytest.mark.parametrize(
    "outcome",
    [None, ValueError("Invalid or corrupted audio data"), RuntimeError("something else")],
    ids=["it decodes", "a decode error", "another error"],
)
def test_a_torchcodec_that_loads_or_fails_otherwise_is_left_to_vllm(outcome: Exception | None) -> None:
    def load(source: io.BytesIO, *, sr: Any) -> None:
        if outcome is not None:
            raise outcome

    audio = _audio_module(load)
    assert audio_backends.skip_unloadable_torchcodec(audio) is False
    assert audio.AudioDecoder is object and audio._torchcodec_import_exc is None


def test_a_module_of_another_shape_is_left_alone() -> None:
    def load(source: io.BytesIO, *, sr: Any) -> None:
        raise AssertionError("never called")

    no_import_record = types.SimpleNamespace(load_audio_torchcodec=load, AudioDecoder=object)
    already_unavailable = _audio_module(load)
    already_unavailable.AudioDecoder = None
    for audio in (types.SimpleNamespace(), no_import_record, already_unavailable):
        assert audio_backends.skip_unloadable_torchcodec(audio) is False


def test_without_vllm_installed_nothing_happens() -> None:
    audio_backends.install()  # this virtualenv has no vLLM: no error, nothing to change

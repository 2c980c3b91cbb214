"""How a model declares the processor worker count it measured best.

Two sources, first match wins:
1. a sidecar file ``mmprep.json`` in the model folder: ``{"processor_workers": N}`` (and
   optionally ``"io_workers": M`` and ``"thread_safe": false``, see ``Declaration``). It travels
   with the model, so whoever measured the model (e.g. with ``mmprep-runtime bench``) can ship the
   figure without touching mmprep;
2. a small built-in table keyed by the processor class, for models whose number is known from
   published measurements (SGLang declares 2 for the Qwen-VL family and PaddleOCR-VL).

The declared number is only an input to ``mmprep_runtime.sizing.decide_workers``: the GPU path caps
it, an explicit count beats it. Import-light on purpose (the probe reports it; no torch needed).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Mapping
from typing import Final

from mmprep_runtime import sizing

SIDECAR_NAME: Final = "mmprep.json"
SIDECAR_KEY: Final = "processor_workers"
IO_KEY: Final = "io_workers"
THREAD_SAFE_KEY: Final = "thread_safe"
_KNOWN_KEYS: Final = frozenset({SIDECAR_KEY, IO_KEY, THREAD_SAFE_KEY})

BUILTIN_DECLARED_WORKERS: Final[Mapping[str, int]] = {
    "Qwen2VLProcessor": 2,
    "Qwen2_5_VLProcessor": 2,
    "PaddleOCRVLProcessor": 2,
}


class DeclarationError(ValueError):
    """The sidecar exists but does not say valid counts."""


@dataclasses.dataclass(frozen=True)
class Declaration:
    """What a model says about itself.

    ``thread_safe: false`` is for a processor that deep-copies fine but whose copies still share
    something that breaks under concurrency (a global cache, a native handle): like SGLang's
    ``supports_mm_processor_concurrency``, it holds the processor to one worker (``NotThreadSafe``).
    ``io_workers`` sizes the decode threads, e.g. for video models whose decoding dominates.
    """

    processor_workers: int | None = None
    io_workers: int | None = None
    thread_safe: bool = True


def _count(data: Mapping[str, object], key: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    try:
        return sizing.check_worker_count(f"{SIDECAR_NAME}: {key}", value)
    except sizing.WorkerCountError as exc:
        raise DeclarationError(str(exc)) from None


def read_sidecar(model_dir: pathlib.Path | str) -> Declaration | None:
    path = pathlib.Path(model_dir) / SIDECAR_NAME
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DeclarationError(f"{SIDECAR_NAME} is not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise DeclarationError(f"{SIDECAR_NAME} must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - _KNOWN_KEYS)
    if unknown:
        # A typo ("thread_safety") must not silently leave a processor shared between threads.
        raise DeclarationError(f"{SIDECAR_NAME}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_KNOWN_KEYS))})")
    thread_safe = data.get(THREAD_SAFE_KEY, True)
    if not isinstance(thread_safe, bool):
        raise DeclarationError(f"{SIDECAR_NAME}: {THREAD_SAFE_KEY} must be true or false, got {thread_safe!r}")
    return Declaration(_count(data, SIDECAR_KEY), _count(data, IO_KEY), thread_safe)


def write_sidecar(model_dir: pathlib.Path | str, declaration: Declaration) -> None:
    data: dict[str, object] = {}
    for key, value in ((SIDECAR_KEY, declaration.processor_workers), (IO_KEY, declaration.io_workers)):
        if value is not None:
            _count({key: value}, key)  # the same bounds the reader enforces
            data[key] = value
    if not declaration.thread_safe:
        data[THREAD_SAFE_KEY] = False
    (pathlib.Path(model_dir) / SIDECAR_NAME).write_text(json.dumps(data) + "\n")


def declaration_of(model_dir: pathlib.Path | str | None, processor_class: str) -> Declaration:
    """The sidecar's word where it says something; the built-in table for the worker count else."""
    sidecar = read_sidecar(model_dir) if model_dir is not None else None
    sidecar = sidecar or Declaration()
    workers = sidecar.processor_workers
    if workers is None:
        workers = BUILTIN_DECLARED_WORKERS.get(processor_class)
    return dataclasses.replace(sidecar, processor_workers=workers)
